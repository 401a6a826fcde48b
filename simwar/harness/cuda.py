"""The PyTorch/CUDA stream backend: the only simwar module that imports torch.

What each piece of a plan becomes on the device:

- a kernel of ``d`` µs: ``fill_`` of each buffer it writes with its stamp (a
  write lands at the kernel's start), ``torch.cuda._sleep`` for the rest of
  ``d``, then a one-element copy of each buffer it reads into its snapshot
  slot (a read happens at the end). The spin length subtracts the measured
  device time of the fills and copies, so the whole kernel lasts ``d``.
  A kernel without shared accesses is the spin alone when the backend is
  *lean*; a *uniform* backend (the default) gives it one copy of a scratch
  slot instead, so that every eager kernel with at most one access is the
  same two launches and costs the host the same, as the config's one
  ``costs.launch_us`` assumes. Each stream copies its own scratch source
  into its own scratch snapshot slot (``ReplayPlan.scratch_buffer`` and
  ``scratch_slot``), so these copies are ordered by their stream alone;
- a graph: captured once (``torch.cuda.graph``) with the same kernels, a
  device launch counter that picks each write's stamp (``index_select`` from
  a per-node stamp array) and each read's snapshot slot (``index_copy_``),
  and ``torch.cuda.Event(external=True)`` records as in-graph record nodes;
- records, ``wait_event``, ``wait_stream`` and ``synchronize`` are the real
  calls on default (spinning) events; timing points are timing events.

Device times are put on the host clock (``time.perf_counter``) through two
anchors, at the start and the end of the run: a timing event recorded behind
a spin kernel while the host polls it, so the host reads its clock within a
poll of the event firing; the two anchors also correct clock drift.

Imports: torch and the standard library.
"""

from __future__ import annotations

import time

import torch

from simwar.harness.plan import GraphStep, KernelStep, ReplayPlan


def calibrate_device(samples: int = 5) -> dict:
    """Spin-kernel rate and the device time of the helper kernels, on the current device.

    Each figure is timed with the stream kept busy (a long spin is queued
    first), so it measures device time, not launch rate.
    """
    stream = torch.cuda.current_stream()
    scratch = torch.zeros(4, dtype=torch.int64, device="cuda")
    snap = torch.zeros(4, dtype=torch.int64, device="cuda")
    rate_guess = 1950.0

    def per_call(fn, n=40) -> float:
        out = []
        for _ in range(samples):
            torch.cuda._sleep(int(3000 * rate_guess))  # keep the device behind the host
            a = torch.cuda.Event(enable_timing=True)
            b = torch.cuda.Event(enable_timing=True)
            a.record(stream)
            for _ in range(n):
                fn()
            b.record(stream)
            b.synchronize()
            out.append(a.elapsed_time(b) * 1e3 / n)
        out.sort()
        return out[len(out) // 2]

    for _ in range(3):  # warm up (module load, first-launch costs)
        torch.cuda._sleep(1000)
        scratch[:1].fill_(1)
        snap[:1].copy_(scratch[:1])
    torch.cuda.synchronize()
    cycles = [0, 100_000, 400_000, 1_600_000]
    times = [per_call(lambda c=c: torch.cuda._sleep(c), n=10 if c else 40) for c in cycles]
    # least squares: time = base + cycles / rate
    n = len(cycles)
    mx, my = sum(cycles) / n, sum(times) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(cycles, times)) / \
        sum((x - mx) ** 2 for x in cycles)
    w, r = scratch[:1], snap[:1]
    return {
        "sleep_cycles_per_us": 1.0 / slope,
        "sleep_base_us": my - slope * mx,
        "fill_us": per_call(lambda: w.fill_(7)),
        "copy_us": per_call(lambda: r.copy_(w)),
        "cross_stream_us": cross_stream_latency(1.0 / slope),
    }


def cross_stream_latency(cycles_per_us: float, samples: int = 20) -> float:
    """Median device delay from a record firing to the start of a stream waiting on it (µs)."""
    s = torch.cuda.current_stream()
    other = torch.cuda.Stream()
    lat = []
    for _ in range(samples):
        torch.cuda.synchronize()
        fired = torch.cuda.Event(enable_timing=True)
        released = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(int(200 * cycles_per_us))  # both calls issued before the record fires
        fired.record(s)
        other.wait_event(fired)
        released.record(other)
        released.synchronize()
        lat.append(fired.elapsed_time(released) * 1e3)
    lat.sort()
    return lat[len(lat) // 2]


def device_info() -> dict:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    try:
        driver = torch.cuda.driver_version() if hasattr(torch.cuda, "driver_version") else None
    except Exception:  # noqa: BLE001 - older torch: the driver version is optional metadata
        driver = None
    if driver is None:
        try:
            import subprocess

            driver = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=10).stdout.strip() or None
        except (OSError, subprocess.SubprocessError):
            driver = None
    return {"device": props.name, "capability": f"{props.major}.{props.minor}",
            "driver": driver, "torch": torch.__version__, "cuda": torch.version.cuda}


class CudaBackend:
    """Replays a plan on real CUDA streams (see the module docstring)."""

    def __init__(self, calibration: dict | None = None, *, uniform: bool = True):
        torch.cuda.init()
        self.cal = calibration or calibrate_device()
        self.rate = self.cal["sleep_cycles_per_us"]
        self.uniform = uniform

    # ---- lifecycle
    def setup(self, plan: ReplayPlan) -> None:
        self.plan = plan
        dev = "cuda"
        torch.cuda.synchronize()
        self.streams = {name: torch.cuda.Stream() for name in plan.streams}
        self.current = None
        # one slot per shared buffer, then one scratch source slot per stream (for kernels
        # without accesses); snapshots: one slot per read, then one scratch slot per stream
        self.buffers = torch.zeros(plan.buffer_slots, dtype=torch.int64, device=dev)
        self.buf_views = [self.buffers[i:i + 1] for i in range(plan.buffer_slots)]
        self.snap = torch.full((plan.snap_slots,), -1, dtype=torch.int64, device=dev)
        eager_slots = {r.slot for st in plan.steps if type(st) is KernelStep for r in st.reads}
        self.snap_views = {s: self.snap[s:s + 1] for s in eager_slots}
        # stream -> (its scratch snapshot slot, its scratch source slot)
        self.scratch = {s: (self.snap[plan.scratch_slot(s):plan.scratch_slot(s) + 1],
                            self.buf_views[plan.scratch_buffer(s)]) for s in plan.streams}
        # spin lengths decided before the timed loop
        self.kernel_cycles = {}
        for st in plan.steps:
            if type(st) is KernelStep:
                plain = not (st.writes or st.reads)
                self.kernel_cycles[st.index] = self._cycles(
                    st.kernel.duration_us, len(st.writes),
                    len(st.reads) + (1 if plain and self.uniform else 0))
        self.stamp_arrays = [torch.tensor(a, dtype=torch.int64, device=dev)
                             for a in plan.stamp_arrays]
        self.points = [torch.cuda.Event(enable_timing=True) for _ in range(plan.timing_points)]
        self.events = {name: torch.cuda.Event() for name in plan.events}
        self.graph_events = {key: torch.cuda.Event(external=True) for key in plan.graph_events}
        self.counters = {}
        self.graphs = {name: self._capture(g) for name, g in plan.graphs.items()}
        # torch creates a CUDA event at its first record: do that here, not in the timed loop
        warm = torch.cuda.current_stream()
        for ev in list(self.points) + list(self.events.values()):
            ev.record(warm)
        torch.cuda.synchronize()
        self.origin_ns = time.perf_counter_ns()
        self.anchor_a = self._anchor()

    def _cycles(self, duration_us: float, fills: int, copies: int) -> int:
        c = self.cal
        spin = duration_us - c["sleep_base_us"] - fills * c["fill_us"] - copies * c["copy_us"]
        return int(spin * self.rate) if spin > 0 else 0

    def _capture(self, g) -> torch.cuda.CUDAGraph:
        counter = torch.zeros(1, dtype=torch.int64, device="cuda")
        self.counters[g.name] = counter
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for node in g.nodes:
                if node.kernel is None:
                    self.graph_events[(g.name, node.event)].record()
                    continue
                for w in node.writes:
                    torch.index_select(self.stamp_arrays[w.stamp], 0, counter,
                                       out=self.buf_views[w.buffer])
                cyc = self._cycles(node.kernel.duration_us, len(node.writes), len(node.reads))
                if cyc > 0:
                    torch.cuda._sleep(cyc)
                for r in node.reads:
                    self.snap.index_copy_(0, counter + r.slot, self.buf_views[r.buffer])
            counter.add_(1)
        return graph

    def _anchor(self) -> tuple[torch.cuda.Event, float]:
        ev = torch.cuda.Event(enable_timing=True)
        s = torch.cuda.current_stream()
        torch.cuda._sleep(int(200 * self.rate))  # the host is polling before the event fires
        ev.record(s)
        while not ev.query():
            pass
        return ev, self.clock_us()

    def finish(self) -> tuple[list[float], list[int]]:
        torch.cuda.synchronize()
        self._use(None)
        anchor_b = self._anchor()
        ea, ta = self.anchor_a
        eb, tb = anchor_b
        span = ea.elapsed_time(eb) * 1e3
        scale = (tb - ta) / span if span > 0 else 1.0  # device-to-host clock rate
        points = [ta + ea.elapsed_time(p) * 1e3 * scale for p in self.points]
        return points, self.snap.cpu().tolist()

    def info(self) -> dict:
        return dict(device_info(), **{k: round(v, 4) for k, v in self.cal.items()})

    # ---- host side
    def clock_us(self) -> float:
        return (time.perf_counter_ns() - self.origin_ns) / 1e3

    def busy_until(self, t_us: float) -> float:
        clock = self.clock_us
        t = clock()
        while t < t_us:
            t = clock()
        return t

    def _use(self, name: str | None) -> None:
        if name != self.current:
            torch.cuda.set_stream(self.streams[name] if name else torch.cuda.default_stream())
            self.current = name

    def kernel(self, step: KernelStep) -> float:
        self._use(step.stream)
        cycles = self.kernel_cycles[step.index]
        if step.writes:
            for w in step.writes:
                self.buf_views[w.buffer].fill_(w.stamp)
            first = self.clock_us()
            torch.cuda._sleep(cycles)
        else:
            torch.cuda._sleep(cycles)
            first = self.clock_us()
        for r in step.reads:
            self.snap_views[r.slot].copy_(self.buf_views[r.buffer])
        if self.uniform and not (step.writes or step.reads):
            dst, src = self.scratch[step.stream]
            dst.copy_(src)
        return first

    def graph_launch(self, step: GraphStep) -> float:
        self._use(step.stream)
        self.graphs[step.graph].replay()
        return self.clock_us()

    def record_point(self, point: int, stream: str) -> None:
        self.points[point].record(self.streams[stream])

    def record(self, event: str, stream: str) -> None:
        self.events[event].record(self.streams[stream])

    def _event(self, key: tuple):
        return self.events[key[1]] if key[0] == "host" else self.graph_events[key[1:]]

    def wait_event(self, stream: str, key: tuple | None) -> None:
        if key is not None:
            self.streams[stream].wait_event(self._event(key))

    def wait_stream(self, stream: str, other: str) -> None:
        self.streams[stream].wait_stream(self.streams[other])

    def synchronize(self, key: tuple | None) -> None:
        if key is not None:
            self._event(key).synchronize()
