"""A decoder-shaped probe of SGLang's overlap loop on real kernels, captured per barrier.

``python -m lab.probe OUT_DIR [--steps N]`` runs, on one CUDA GPU, a
scheduler loop shaped like SGLang's ``event_loop_overlap`` around a forward of
real bf16 GEMMs and elementwise kernels (random weights, nothing downloaded):

- a shared ``req_to_token``-like table (int64, positions × requests);
- per step, on the **schedule stream**: a pinned H2D copy of the step's stamp
  and a scatter of it into the table's marker row (``prepare_for_decode``);
- the **forward** on its own stream, ``forward.wait_stream(schedule)`` first:
  a **draft** CUDA graph (a small stack of SwiGLU-style layers run
  ``draft_steps`` times) and a **verify** CUDA graph (a larger stack), each
  starting with a real gather from the live table (``index_select``), the
  verify graph recording an ``Event(external=True)`` right after its gather
  (the in-graph read-done node), then an eager **sample** (vocab GEMM, argmax,
  packing the tokens and what each gather read into the result buffer);
- the result D2H copy on a **copy stream** (``copy.wait_stream(forward)``),
  then ``copy_done`` recorded;
- the **barrier** after the launch: ``fine`` (``schedule.wait_event(read_done)``),
  ``coarse`` (``schedule.wait_stream(forward)``) or ``none``;
- processing of the previous step's result: ``copy_done.synchronize()``, the
  race check (what each gather read must be its own step's stamp; a later
  stamp is a race: the next step's write overtook the read), CPU work.

Host CPU work is busy-waiting inside SGLang-named ``record_function`` ranges:
``recv_requests``, ``get_next_batch_to_run`` (holding ``prepare_for_decode``
and the schedule-stream launches), ``run_batch`` (holding ``draft``,
``verify`` and ``sample``), ``process_batch_result`` (holding the
synchronize); every iteration is inside ``step#<k>``.

Variants (``--variants``): ``fine``, ``coarse``, ``none`` and ``fine_host1000``
(fine with ``--extra-host-us``, default 1000 µs, more CPU work in
``process_batch_result``). Each variant runs un-profiled with CUDA timing
events around each forward (``--measured-steps`` steps: step time, forward
gap, launch-ahead depth, race count) and then under ``torch.profiler`` (CPU
and CUDA activities, CUDA sync events where this torch has them; ``--steps``
iterations), exported and gzipped. The graphs are captured once and replayed
by every variant, so the variants differ only in the barrier and the host
work. The layer counts are chosen once, from the measured time of one layer,
so that the draft and the verify graphs last about ``--draft-us`` and
``--verify-us``.

Writes ``OUT/probe_<variant>.kineto.json.gz`` per variant,
``OUT/probe_metrics.json`` (device, torch, shapes, host work, per variant the
un-profiled metrics and both runs' race counts) and ``OUT/probe_log.txt``.
``--dry-run`` runs the same loop on the CPU with tiny shapes and no streams
(for tests; no CUDA needed). The mapping for ``simwar import`` is
``tests/data/probe/mapping.yaml``.

Imports: torch and the standard library (the GPU machine has no simwar
dependencies).

The file is a little over 600 lines: the probe is one script the GPU machine runs alone
(the loop, its variants, the profiler's warm-up and the outputs), kept whole so that what
ran there reads in one place.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

#: variant -> (barrier, extra host µs in process_batch_result, or None: --extra-host-us)
VARIANTS = {"fine": ("fine", 0.0), "coarse": ("coarse", 0.0), "none": ("none", 0.0),
            "fine_host1000": ("fine", None)}
#: range names (SGLang's), the capture's mapping is written for them
RANGES = ("recv_requests", "get_next_batch_to_run", "prepare_for_decode", "run_batch",
          "draft", "verify", "sample", "process_batch_result")


@dataclass(frozen=True)
class Shape:
    """The probe's sizes (the layer and step counts are decided by :func:`plan_counts`)."""

    hidden: int = 4096
    draft_ffn: int = 5632
    verify_ffn: int = 14336
    draft_layers: int = 2  # the draft stack
    draft_steps: int = 8  # times the draft stack runs in the draft graph
    verify_layers: int = 6
    batch: int = 64  # requests in the batch
    vocab: int = 32000
    positions: int = 32  # columns of the table per request (rows of the table here)
    requests: int = 256  # requests the table holds
    marker: int = 0  # the table row each step's schedule write stamps

    @classmethod
    def dry(cls) -> Shape:
        return cls(hidden=32, draft_ffn=48, verify_ffn=64, draft_layers=1, draft_steps=2,
                   verify_layers=2, batch=4, vocab=50, positions=4, requests=8)


@dataclass(frozen=True)
class HostWork:
    """µs of CPU work (busy-waiting) per range; ``extra`` goes into process_batch_result."""

    ingest: float = 30.0
    schedule: float = 150.0
    prepare: float = 80.0
    process_result: float = 150.0
    extra: float = 0.0


def plan_counts(shape: Shape, draft_layer_us: float, verify_layer_us: float,
                draft_us: float, verify_us: float, max_count: int = 64) -> Shape:
    """The draft steps and verify layers that make the graphs last about ``draft_us`` and
    ``verify_us``, from one layer's measured time (at least one of each)."""
    def count(target: float, per: float) -> int:
        if not per > 0:
            return 1
        return max(1, min(max_count, round(target / per)))

    steps = count(draft_us, draft_layer_us * shape.draft_layers)
    return replace(shape, draft_steps=steps, verify_layers=count(verify_us, verify_layer_us))


def parse_variants(text: str) -> list[str]:
    names = [v.strip() for v in text.split(",") if v.strip()]
    bad = [v for v in names if v not in VARIANTS]
    if bad or not names:
        raise ValueError(f"--variants: {', '.join(bad) or 'none given'}: not a variant "
                         f"({', '.join(VARIANTS)})")
    return names


def summarize_timings(step_us: list[float], fwd_us: list[float], gap_us: list[float],
                      ahead: list[float], racy: int) -> dict:
    """The un-profiled run's figures (measured steps only; the last has no successor)."""
    def q(xs, p):
        xs = sorted(xs)
        if not xs:
            return float("nan")
        i = min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))
        return xs[i]

    return {"steps_measured": len(step_us),
            "step_us_mean": statistics.fmean(step_us) if step_us else float("nan"),
            "step_us_p50": q(step_us, 50), "step_us_p99": q(step_us, 99),
            "fwd_us_mean": statistics.fmean(fwd_us) if fwd_us else float("nan"),
            "fwd_gap_us_mean": statistics.fmean(gap_us) if gap_us else float("nan"),
            "launch_ahead_mean": statistics.fmean(ahead) if ahead else float("nan"),
            "racy_steps": racy}


def spin(us: float) -> None:
    """Busy-wait ``us`` microseconds (the scheduler's Python work)."""
    if us <= 0:
        return
    end = time.perf_counter_ns() + int(us * 1000)
    while time.perf_counter_ns() < end:
        pass


# --------------------------------------------------------------------------- device ops
class _Cuda:
    """Streams, events, graphs and pinned memory of the current CUDA device."""

    dry = False

    def __init__(self, torch):
        self.torch = torch
        self.device = "cuda"
        self.dtype = torch.bfloat16

    def stream(self):
        return self.torch.cuda.Stream()

    def use(self, stream):
        return self.torch.cuda.stream(stream)

    def event(self, timing: bool = False, external: bool = False):
        if external:
            return self.torch.cuda.Event(external=True)
        return self.torch.cuda.Event(enable_timing=timing)

    def pinned(self, n: int):
        return self.torch.empty(n, dtype=self.torch.int64, pin_memory=True)

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def capture(self, fn):
        """A CUDA graph of ``fn(capturing)``, warmed up on a side stream first (``fn(False)``:
        no in-graph event record outside the capture); returns its replay."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn(False)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(True)
        torch.cuda.synchronize()
        return graph.replay

    def time_us(self, fn, n: int = 9, reps: int = 10) -> float:
        """Median device time of one ``fn`` (µs): ``reps`` calls between two CUDA events
        (the host queues them faster than the device runs them), ``n`` times."""
        torch = self.torch
        for _ in range(3):
            fn()
        out = []
        for _ in range(n):
            a, b = self.event(True), self.event(True)
            a.record()
            for _ in range(reps):
                fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) * 1e3 / reps)
        torch.cuda.synchronize()
        return statistics.median(out)


class _DryStream:
    def wait_stream(self, other) -> None:
        return None

    def wait_event(self, event) -> None:
        return None


class _DryEvent:
    def __init__(self):
        self.t = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) * 1e3


class _Dry(_Cuda):
    """The same calls on the CPU, with no streams and graphs as plain calls (tests)."""

    dry = True

    def __init__(self, torch):
        super().__init__(torch)
        self.device = "cpu"
        self.dtype = torch.float32

    def stream(self):
        return _DryStream()

    def use(self, stream):
        return contextlib.nullcontext()

    def event(self, timing: bool = False, external: bool = False):
        return _DryEvent()

    def pinned(self, n: int):
        return self.torch.empty(n, dtype=self.torch.int64)

    def synchronize(self) -> None:
        return None

    def capture(self, fn):
        return lambda: fn(False)

    def time_us(self, fn, n: int = 3, reps: int = 1) -> float:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n * 1e6


# --------------------------------------------------------------------------- the model
class Model:
    """Weights, the shared table, the static buffers and the two captured graphs."""

    def __init__(self, ops: _Cuda, shape: Shape, seed: int = 0):
        torch = ops.torch
        self.ops, self.shape, self.torch = ops, shape, torch
        dev, dt = ops.device, ops.dtype
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)
        h = shape.hidden

        def w(*size):
            return (torch.randn(*size, device=dev, dtype=dt, generator=gen) * 0.02)

        self.draft_w = [(w(h, 2 * shape.draft_ffn), w(shape.draft_ffn, h))
                        for _ in range(shape.draft_layers)]
        self.verify_w = []
        self.emb = w(shape.vocab, h)
        self.head = w(h, shape.vocab)
        i64 = torch.int64
        self.table = torch.zeros(shape.positions, shape.requests, dtype=i64, device=dev)
        self.table[shape.marker].fill_(-1)
        self.rows = torch.arange(0, 2 * shape.batch, 2, dtype=i64, device=dev)  # the batch
        self.snap_draft = torch.zeros(shape.batch, dtype=i64, device=dev)
        self.snap_verify = torch.zeros(shape.batch, dtype=i64, device=dev)
        self.draft_out = torch.zeros(shape.batch, h, dtype=dt, device=dev)
        self.verify_out = torch.zeros(shape.batch, h, dtype=dt, device=dev)
        self.dbuf = torch.zeros(shape.batch, dtype=i64, device=dev)
        self.result = [torch.zeros(3 * shape.batch, dtype=i64, device=dev) for _ in range(2)]
        self.read_done = ops.event(external=True)
        self.draft_graph = self.verify_graph = None

    def add_verify_layers(self, n: int) -> None:
        torch, shape, ops = self.torch, self.shape, self.ops
        gen = torch.Generator(device=ops.device)
        gen.manual_seed(1)
        h = shape.hidden
        self.verify_w = [(torch.randn(h, 2 * shape.verify_ffn, device=ops.device,
                                      dtype=ops.dtype, generator=gen) * 0.02,
                          torch.randn(shape.verify_ffn, h, device=ops.device, dtype=ops.dtype,
                                      generator=gen) * 0.02) for _ in range(n)]

    @staticmethod
    def layer(torch, x, w):
        """A SwiGLU-style block: gate/up GEMM, silu, product, down GEMM + residual, tanh."""
        gu = x @ w[0]
        f = w[1].shape[0]
        a = torch.nn.functional.silu(gu[:, :f]) * gu[:, f:]
        return torch.tanh(torch.addmm(x, a, w[1]))

    def read_table(self, snap, record=None):
        """The gather from the live table, what it read at the marker, the token ids."""
        torch = self.torch
        g = torch.index_select(self.table, 1, self.rows)  # the shared read
        if record is not None:
            record.record()  # read-done: an in-graph node right after the gather
        snap.copy_(g[self.shape.marker])
        return torch.remainder(g.sum(0), self.shape.vocab)

    def draft(self, capturing: bool = False) -> None:
        torch = self.torch
        x = self.emb.index_select(0, self.read_table(self.snap_draft))
        for _ in range(self.shape.draft_steps):
            for w in self.draft_w:
                x = self.layer(torch, x, w)
        self.draft_out.copy_(x)

    def verify(self, capturing: bool = False) -> None:
        torch = self.torch
        ids = self.read_table(self.snap_verify, self.read_done if capturing else None)
        x = self.emb.index_select(0, ids) + self.draft_out
        for w in self.verify_w:
            x = self.layer(torch, x, w)
        self.verify_out.copy_(x)

    def sample(self, slot: int) -> None:
        b = self.shape.batch
        tok = (self.verify_out @ self.head).argmax(-1)
        out = self.result[slot]
        out[:b].copy_(tok)
        out[b:2 * b].copy_(self.snap_draft)
        out[2 * b:].copy_(self.snap_verify)

    def capture(self) -> None:
        self.draft_graph = self.ops.capture(self.draft)
        self.verify_graph = self.ops.capture(self.verify)

    def layer_us(self, which: str) -> float:
        torch = self.torch
        x = torch.zeros(self.shape.batch, self.shape.hidden, dtype=self.ops.dtype,
                        device=self.ops.device)
        w = self.draft_w[0] if which == "draft" else self.verify_w[0]
        return self.ops.time_us(lambda: self.layer(torch, x, w))


# --------------------------------------------------------------------------- the loop
class Loop:
    """SGLang's overlap loop around the model; one run per call of :meth:`run`."""

    def __init__(self, ops: _Cuda, model: Model, host: HostWork):
        self.ops, self.model, self.host = ops, model, host
        self.torch = ops.torch
        self.schedule, self.forward, self.copy = ops.stream(), ops.stream(), ops.stream()
        self.hbuf = [ops.pinned(model.shape.batch) for _ in range(2)]
        self.res_host = [ops.pinned(3 * model.shape.batch) for _ in range(2)]
        self.copy_done = [ops.event() for _ in range(2)]
        self.stamp = 0  # every iteration of every run writes a new stamp

    def run(self, steps: int, barrier: str, extra_us: float, warmup: int = 0,
            timing: bool = False, step_ranges: bool = False) -> dict:
        """``steps`` iterations and the drain; returns the race count and, with ``timing``,
        the forward timing events' figures over the steps after ``warmup``."""
        rf = self.torch.profiler.record_function
        ops = self.ops
        ops.synchronize()
        t0 = [ops.event(True) for _ in range(steps)] if timing else None
        t1 = [ops.event(True) for _ in range(steps)] if timing else None
        if timing:  # torch creates a CUDA event at its first record: not in the loop
            for e in t0 + t1:
                e.record()
            ops.synchronize()
        ahead: list[float] = []
        stamps: list[int] = []
        racy: list[int] = []
        step_range = None
        gc_on = gc.isenabled()
        gc.disable()
        try:
            for k in range(steps + 1):
                if step_ranges:
                    if step_range is not None:
                        step_range.__exit__(None, None, None)
                    step_range = rf(f"step#{k}")
                    step_range.__enter__()
                if k == steps:  # the drain: process the last result
                    self._process(k - 1, stamps, racy, extra_us, rf)
                    break
                stamps.append(self._iteration(k, barrier, rf, t0, t1, ahead))
                if k > 0:
                    self._process(k - 1, stamps, racy, extra_us, rf)
        finally:
            if step_range is not None:
                step_range.__exit__(None, None, None)
            if gc_on:
                gc.enable()
        ops.synchronize()
        out = {"steps": steps, "warmup": warmup,
               "racy_steps_all": len(racy), "racy_steps": sum(1 for k in racy if k >= warmup)}
        if timing:
            keep = range(warmup, steps - 1)
            step_us = [t0[k].elapsed_time(t0[k + 1]) * 1e3 for k in keep]
            fwd_us = [t0[k].elapsed_time(t1[k]) * 1e3 for k in keep]
            gap_us = [t1[k - 1].elapsed_time(t0[k]) * 1e3 for k in keep if k > 0]
            out.update(summarize_timings(step_us, fwd_us, gap_us,
                                         [ahead[k] for k in keep], out["racy_steps"]))
        return out

    def _iteration(self, k: int, barrier: str, rf, t0, t1, ahead) -> int:
        m, ops, host = self.model, self.ops, self.host
        self.stamp += 1
        stamp = self.stamp
        slot = k % 2
        with rf("recv_requests"):
            spin(host.ingest)
        with rf("get_next_batch_to_run"):
            spin(host.schedule)
            with rf("prepare_for_decode"):
                spin(host.prepare)
                self.hbuf[slot].fill_(stamp)
                with ops.use(self.schedule):
                    m.dbuf.copy_(self.hbuf[slot], non_blocking=True)  # H2D
                    m.table[m.shape.marker].index_copy_(0, m.rows, m.dbuf)  # the write
        with rf("run_batch"):
            if t1 is not None:  # forwards launched but unfinished now
                ahead.append(float(sum(1 for j in (k - 1, k - 2) if j >= 0
                                       and not t1[j].query())))
            self.forward.wait_stream(self.schedule)
            with ops.use(self.forward):
                if t0 is not None:
                    t0[k].record(self.forward)
                with rf("draft"):
                    m.draft_graph()
                with rf("verify"):
                    m.verify_graph()
                with rf("sample"):
                    m.sample(slot)
                if t1 is not None:
                    t1[k].record(self.forward)
            self.copy.wait_stream(self.forward)
            with ops.use(self.copy):
                self.res_host[slot].copy_(m.result[slot], non_blocking=True)  # D2H
                self.copy_done[slot].record(self.copy)
        if barrier == "fine":  # the schedule stream waits for verify's in-graph read-done
            self.schedule.wait_event(m.read_done)
        elif barrier == "coarse":
            self.schedule.wait_stream(self.forward)
        return stamp

    def _process(self, k: int, stamps: list[int], racy: list[int], extra_us: float,
                 rf) -> None:
        b = self.model.shape.batch
        slot = k % 2
        with rf("process_batch_result"):
            self.copy_done[slot].synchronize()
            seen = self.res_host[slot].tolist()
            if any(v != stamps[k] for v in seen[b:]):  # a gather read a later step's write
                racy.append(k)
            spin(self.host.process_result + extra_us)


# --------------------------------------------------------------------------- main
def _profile_kwargs(torch) -> tuple[dict, bool]:
    exp = getattr(getattr(torch._C, "_profiler", None), "_ExperimentalConfig", None)
    if exp is None:
        return {}, False
    try:
        return {"experimental_config": exp(enable_cuda_sync_events=True)}, True
    except TypeError:
        return {}, False


def device_info(torch, ops: _Cuda) -> dict:
    if ops.dry:
        return {"device": "cpu (dry run)", "torch": torch.__version__}
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"device": props.name, "capability": f"{props.major}.{props.minor}",
            "torch": torch.__version__, "cuda": torch.version.cuda}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.probe",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--steps", type=int, default=40,
                    help="profiled iterations per variant (default 40)")
    ap.add_argument("--measured-steps", type=int, default=200,
                    help="un-profiled iterations per variant, timed with events (default 200)")
    ap.add_argument("--warmup", type=int, default=10,
                    help="iterations left out of the un-profiled figures (default 10)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--extra-host-us", type=float, default=1000.0,
                    help="CPU work added in process_batch_result by fine_host1000")
    ap.add_argument("--draft-us", type=float, default=800.0)
    ap.add_argument("--verify-us", type=float, default=700.0)
    ap.add_argument("--cpu", type=int, help="pin the loop's thread to this core")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes on the CPU, no streams or graphs (tests)")
    args = ap.parse_args(argv)
    try:
        variants = parse_variants(args.variants)
    except ValueError as e:
        ap.error(str(e))
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device (use --dry-run on the CPU)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    log_lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        log_lines.append(text)

    t_all = time.time()
    ops = _Dry(torch) if args.dry_run else _Cuda(torch)
    if not ops.dry:
        torch.cuda.init()
        torch.zeros(1, device="cuda")
        if args.cpu is not None and hasattr(os, "sched_setaffinity"):
            os.sched_setaffinity(threading.get_native_id(), {args.cpu})
    shape = Shape.dry() if args.dry_run else Shape()
    model = Model(ops, shape)
    model.add_verify_layers(1)
    draft_layer, verify_layer = model.layer_us("draft"), model.layer_us("verify")
    if not ops.dry:
        shape = plan_counts(shape, draft_layer, verify_layer, args.draft_us, args.verify_us)
        model.shape = shape
    model.add_verify_layers(shape.verify_layers)
    model.capture()
    log(f"device {device_info(torch, ops)}; layer µs: draft {draft_layer:.1f}, verify "
        f"{verify_layer:.1f}; draft steps {shape.draft_steps} x {shape.draft_layers} layers, "
        f"verify layers {shape.verify_layers}")
    prof_kwargs, sync_events = _profile_kwargs(torch)
    metrics = {"format": "simwar.probe", "version": 1, "device": device_info(torch, ops),
               "shape": asdict(shape), "layer_us": {"draft": draft_layer, "verify": verify_layer},
               "cuda_sync_events": sync_events, "variants": {}}
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([] if ops.dry else [ProfilerActivity.CUDA])
    # one throwaway profiled run first: the profiler's first use (its buffers, CUPTI's
    # callbacks) slowed a dozen steps of the first capture on the H200 by ~200 µs each
    with profile(activities=activities, **prof_kwargs):
        Loop(ops, model, HostWork(extra=0.0)).run(min(args.steps, 20), "fine", 0.0,
                                                   step_ranges=True)
    failed = []
    for name in variants:
        t = time.time()
        try:
            metrics["variants"][name] = _variant(name, args, ops, model, profile, activities,
                                                 prof_kwargs, log)
        except Exception as e:  # noqa: BLE001 - one run on the GPU: keep the other variants
            failed.append(name)
            log(f"{name}: FAILED: {type(e).__name__}: {e}")
            ops.synchronize()
        log(f"{name}: {time.time() - t:.1f}s")
        _write(args.out, metrics, log_lines, t_all)
    log(f"total {time.time() - t_all:.0f}s" + (f"; failed: {', '.join(failed)}"
                                                if failed else ""))
    _write(args.out, metrics, log_lines, t_all)
    return 1 if failed else 0


def _write(out: Path, metrics: dict, log_lines: list[str], t_all: float) -> None:
    """Metrics and log so far (after each variant: a failure later keeps what ran)."""
    metrics["seconds"] = round(time.time() - t_all, 1)
    (out / "probe_metrics.json").write_text(json.dumps(metrics, indent=1, default=str))
    (out / "probe_log.txt").write_text("\n".join(log_lines) + "\n")


def _variant(name: str, args, ops: _Cuda, model: Model, profile, activities, prof_kwargs,
             log) -> dict:
    """One variant: the timed un-profiled run, then the profiled run and its capture."""
    barrier, extra = VARIANTS[name]
    extra = args.extra_host_us if extra is None else extra
    host = HostWork(extra=extra)
    loop = Loop(ops, model, host)
    measured = loop.run(args.measured_steps, barrier, extra, warmup=args.warmup, timing=True)
    loop.run(5, barrier, extra)  # settle after the timing events
    with profile(activities=activities, **prof_kwargs) as prof:
        profiled = loop.run(args.steps, barrier, extra, step_ranges=True)
    tmp = Path(tempfile.mkdtemp())
    prof.export_chrome_trace(str(tmp / "k.json"))
    raw = (tmp / "k.json").read_bytes()
    (tmp / "k.json").unlink()
    tmp.rmdir()
    out = args.out / f"probe_{name}.kineto.json.gz"
    out.write_bytes(gzip.compress(raw, compresslevel=9))
    log(f"{name}: step {measured.get('step_us_mean', float('nan')):.1f} µs, forward "
        f"{measured.get('fwd_us_mean', float('nan')):.1f}, gap "
        f"{measured.get('fwd_gap_us_mean', float('nan')):.1f}, launch-ahead "
        f"{measured.get('launch_ahead_mean', float('nan')):.3f}, racy steps "
        f"{measured['racy_steps']} (profiled: {profiled['racy_steps_all']}); capture "
        f"{out.stat().st_size / 1e6:.2f} MB gz ({len(raw) / 1e6:.1f} MB raw)")
    return {"barrier": barrier, "host_work_us": asdict(host), "measured": measured,
            "profiled": {"steps": args.steps, "racy_steps_all": profiled["racy_steps_all"]},
            "capture": out.name, "capture_bytes": out.stat().st_size}


if __name__ == "__main__":
    sys.exit(main())
