"""What torch.profiler costs the host, per recorded event: profiled and unprofiled twins.

``python -m lab.profiler_cost OUT [--dry-run] [--repeats R] [--iters M]`` runs, on one CUDA
GPU, host-time micro-benchmarks each unprofiled and profiled the way servers profile
(``torch.profiler.profile`` with CPU and CUDA activities, ``record_function`` ranges on,
``with_stack`` off and on: SGLang profiles with ``with_stack=True`` by default), counts the
events each profiled run recorded in its exported trace, and writes what one event of each
kind costs the host. ``simwar/data/profiler_cost.yaml`` ships the result and the fit
subtracts it from the host durations of a capture (``docs/profiler-cost.md``).

**The benchmarks** (one iteration each; the host time of an iteration is ``perf_counter``
around its body, the device synchronized between iterations, outside the timed window):

- ``null``: an empty body. Its profiled-minus-unprofiled time and events (the timer's own
  Python calls under ``with_stack``) are subtracted from every other benchmark's;
- ``launch``: N eager kernel launches (``x.add_(1)``: ``aten::add_``, ``cudaLaunchKernel``,
  a kernel);
- ``annotate``: N ``record_function`` ranges with nothing inside (``user_annotation``);
- ``event``: N × (event record, stream ``wait_event``, event ``synchronize``);
- ``graph_small`` / ``graph_large``: N ``cudaGraphLaunch`` of a graph of 4 and of 64 kernels
  (two sizes: the per-kernel part of a graph launch's cost apart from the launch's own);
- ``copy``: N small H2D and D2H copies (``non_blocking``, pinned: ``cudaMemcpyAsync``);
- ``pyfunc``: N calls of a small Python function (``python_function`` under ``with_stack``);
- ``twin``: a realistic step: an eager "prefill" of a few hundred launches in a few
  ``record_function`` ranges, a graph "decode" step, an event, a D2H copy and its wait.

**Per-event costs.** For each profiler setting (``with_stack`` off, on) and each benchmark b:
Δ_b = (profiled - unprofiled host µs per iteration) - the same for ``null``, and the events
per iteration n_b,k of each kind k (the trace's ``cat``: ``cuda_runtime``, ``cpu_op``,
``user_annotation``, ``python_function``, ``kernel``, ``gpu_memcpy``, ...) less ``null``'s.
Two figures per kind: the benchmark's own quotient Δ_b / (host events per iteration), and
the joint fit Δ_b = Σ_k n_b,k × c_k over the micro-benchmarks (non-negative least squares,
the twin left out), which is what the fit subtracts. **Validation**: the twin's profiled host
time predicted as unprofiled + Σ_k n_twin,k × c_k, against the measured one.

**Host speed.** The GPU machine's host ran up to 1.5× faster or slower between runs: every
repeat times a fixed pure-Python loop (``host_speed_us``), and the benchmarks of a repeat are
interleaved: each repeat runs every benchmark unprofiled, profiled, unprofiled, profiled with
stacks, unprofiled (the two settings swapped every other repeat), and a profiled run is
compared with the mean of the unprofiled runs on either side of it, so a slow spell of
seconds hits both twins. Each run's figure is the
median over its iterations (the profiler's ~3 ms buffer requests stall a few), and each
figure reported is the median over the repeats with its min and max.

``python -m lab.profiler_cost OUT/profiler_cost.json --to-yaml`` prints what
``simwar/data/profiler_cost.yaml`` holds (the joint fit's medians, min and max, and where
they came from).

**Files**: ``OUT/profiler_cost.json`` (the costs, per-benchmark figures, counts, host speed,
device and torch), ``OUT/profiler_cost_log.txt`` (the printed table). ``--dry-run`` runs the
CPU-only benchmarks with small counts on a CPU build of torch (CPU activity only): a check of
the script, not a measurement.

Imports: torch (inside :func:`main`), numpy and the standard library.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

#: trace categories that are host-side events (a host thread records each one)
HOST_KINDS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "cuda_driver")
#: device-side activities CUPTI hands the host in buffers (costs the host when processed)
DEVICE_KINDS = ("kernel", "gpu_memcpy", "gpu_memset", "cuda_sync")
KINDS = HOST_KINDS + DEVICE_KINDS
#: profiler settings measured: name -> with_stack
SETTINGS = {"profiled": False, "profiled_stack": True}


def host_speed_us(n: int = 200_000) -> float:
    """µs for a fixed pure-Python loop: the host's speed at this moment."""
    t = time.perf_counter()
    s = 0
    for i in range(n):
        s += i & 7
    return (time.perf_counter() - t) * 1e6


def _small(x):
    """The Python function ``pyfunc`` calls (one ``python_function`` event each)."""
    return x


class Benches:
    """The benchmarks' bodies and what they need (tensors, streams, events, graphs)."""

    def __init__(self, torch, dry: bool, n: int):
        self.torch, self.dry, self.n = torch, dry, n
        dev = "cpu" if dry else "cuda"
        self.dev = dev
        self.x = torch.zeros(1024, device=dev)
        hidden = 64 if dry else 2048
        self.h = torch.randn(128, hidden, device=dev)
        self.w = [torch.randn(hidden, hidden, device=dev) / hidden ** 0.5 for _ in range(4)]
        self.bodies = {"null": lambda: None, "launch": self.launch, "annotate": self.annotate,
                       "pyfunc": self.pyfunc, "twin": self.twin}
        if not dry:
            self.s1, self.s2 = torch.cuda.Stream(), torch.cuda.Stream()
            self.ev = torch.cuda.Event()
            self.pin = torch.zeros(256, pin_memory=True)
            self.dbuf = torch.zeros(256, device=dev)
            self.out_pin = torch.zeros(8, hidden, pin_memory=True)
            self.g_small = self._graph(4)
            self.g_large = self._graph(64)
            self.g_decode = self._graph(96, matmul=True)
            self.bodies.update({"event": self.event, "graph_small": self.graph_small,
                                "graph_large": self.graph_large, "copy": self.copy})

    def _graph(self, kernels: int, matmul: bool = False):
        torch = self.torch
        x = torch.zeros(1024, device="cuda") if not matmul else self.h[:8].clone()
        w = self.w[0]
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):  # warm the ops outside capture (cuBLAS handles, plans)
            for _ in range(3):
                self._graph_body(x, w, kernels, matmul)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            self._graph_body(x, w, kernels, matmul)
        torch.cuda.synchronize()
        g.replay()
        torch.cuda.synchronize()
        return g

    @staticmethod
    def _graph_body(x, w, kernels: int, matmul: bool) -> None:
        if not matmul:
            for _ in range(kernels):
                x.add_(1.0)
            return
        for _ in range(kernels // 3):  # a decode layer's shape: GEMM, activation, residual
            y = x @ w
            y = y.relu_()
            x.add_(y)

    # --- the bodies: one iteration each
    def launch(self) -> None:
        x = self.x
        for _ in range(self.n):
            x.add_(1.0)

    def annotate(self) -> None:
        rf = self.torch.profiler.record_function
        for _ in range(self.n):
            with rf("range"):
                pass

    def event(self) -> None:
        ev, s1, s2 = self.ev, self.s1, self.s2
        for _ in range(self.n):
            ev.record(s1)
            s2.wait_event(ev)
            ev.synchronize()

    def graph_small(self) -> None:
        for _ in range(self.n):
            self.g_small.replay()

    def graph_large(self) -> None:
        for _ in range(max(1, self.n // 4)):  # 64 kernels each: keep the device ahead
            self.g_large.replay()

    def copy(self) -> None:
        pin, dbuf = self.pin, self.dbuf
        for _ in range(self.n // 2):
            dbuf.copy_(pin, non_blocking=True)
            pin.copy_(dbuf, non_blocking=True)

    def pyfunc(self) -> None:
        f = _small
        for i in range(self.n):
            f(i)

    def twin(self) -> None:
        """An eager prefill (4 layers of ~75 launches, a range per layer) and a decode step
        (graph, event, D2H copy, wait): the shape of a server's mixed step."""
        torch = self.torch
        rf = torch.profiler.record_function
        h = self.h
        with rf("prefill"):
            for layer in range(4):
                with rf(f"layer {layer}"):
                    w = self.w[layer]
                    y = h
                    for _ in range(25):
                        y = torch.nn.functional.gelu(y @ w)
                        y = y * 0.5
                    h = h + y * 1e-3
        if self.dry:
            return
        with rf("decode"):
            self.g_decode.replay()
            self.ev.record()
            self.out_pin.copy_(h[:8], non_blocking=True)
            self.ev.synchronize()


def count_trace(path: Path) -> dict[str, dict[str, int]]:
    """Events of each ``cat`` in an exported chrome trace, by name (complete events only)."""
    data = json.loads(path.read_text())
    out: dict[str, dict[str, int]] = {}
    for e in data.get("traceEvents", []):
        if e.get("ph") != "X":
            continue
        cat = e.get("cat", "")
        names = out.setdefault(cat, {})
        names[e.get("name", "")] = names.get(e.get("name", ""), 0) + 1
    return out


def profile_kwargs(torch) -> dict:
    """CUDA sync events where this torch has them, as the mini-server's captures record them
    (``lab.server.profile_kwargs``): the committed captures' setting."""
    exp = getattr(getattr(torch._C, "_profiler", None), "_ExperimentalConfig", None)
    try:
        return {"experimental_config": exp(enable_cuda_sync_events=True)} if exp else {}
    except TypeError:
        return {}


def run_one(torch, bench: Benches, name: str, iters: int, with_stack: bool | None,
            activities) -> tuple[float, dict | None]:
    """Median host µs per iteration of one benchmark, and the profiled run's event counts
    (by cat, then name; None unprofiled). ``with_stack`` None: unprofiled."""
    body = bench.bodies[name]
    sync = (lambda: None) if bench.dry else torch.cuda.synchronize
    times = []

    def loop():
        for _ in range(iters):
            sync()
            t = time.perf_counter()
            body()
            times.append(time.perf_counter() - t)
        sync()

    gc.disable()
    try:
        if with_stack is None:
            loop()
            return statistics.median(times) * 1e6, None
        with torch.profiler.profile(activities=activities, with_stack=with_stack,
                                    record_shapes=False, **profile_kwargs(torch)) as prof:
            loop()
    finally:
        gc.enable()
    tmp = Path(tempfile.mkdtemp())
    try:
        prof.export_chrome_trace(str(tmp / "t.json"))
        counts = count_trace(tmp / "t.json")
    finally:
        for p in tmp.iterdir():
            p.unlink()
        tmp.rmdir()
    return statistics.median(times) * 1e6, counts


def per_iteration(counts: dict, iters: int) -> dict[str, float]:
    """Events per iteration of each kind (the trace's cat)."""
    return {cat: sum(names.values()) / iters for cat, names in counts.items() if cat in KINDS}


def nnls(a: np.ndarray, b: np.ndarray, iters: int = 200) -> np.ndarray:
    """Non-negative least squares (Lawson-Hanson active set, small problems)."""
    m, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    for _ in range(iters):
        w = a.T @ (b - a @ x)
        if passive.all() or (w[~passive] <= 1e-12).all():
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg] + 1e-300))
            x = x + alpha * (z - x)
            passive &= x > 1e-12
    return x


def fit_costs(deltas: dict[str, float], counts: dict[str, dict[str, float]],
              benches: list[str]) -> dict[str, float]:
    """Per-kind µs per event: Δ_b = Σ_k n_b,k c_k over ``benches`` (non-negative)."""
    kinds = [k for k in KINDS if any(counts[b].get(k, 0) > 0.5 for b in benches)]
    if not kinds:
        return {}
    a = np.array([[max(0.0, counts[b].get(k, 0.0)) for k in kinds] for b in benches])
    y = np.array([deltas[b] for b in benches])
    # relative weights: every benchmark's Δ counts alike whatever its size
    w = 1.0 / np.maximum(np.abs(y), 1.0)
    c = nnls(a * w[:, None], y * w)
    return {k: float(v) for k, v in zip(kinds, c)}


def summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "n": len(values)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.profiler_cost",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path, help="output folder (with --to-yaml: the run's "
                                           "profiler_cost.json)")
    ap.add_argument("--to-yaml", action="store_true",
                    help="print simwar/data/profiler_cost.yaml's text from a run's JSON "
                         "(no torch needed)")
    ap.add_argument("--dry-run", action="store_true", help="CPU only, small counts (a check)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--iters", type=int, help="iterations per run (default 40, dry 5)")
    ap.add_argument("--n", type=int, help="operations per iteration (default 200, dry 20)")
    args = ap.parse_args(argv)
    if args.to_yaml:
        print(to_yaml(json.loads(args.out.read_text())), end="")
        return 0
    import torch  # lazy: --help needs no torch

    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device (use --dry-run on the CPU)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    iters = args.iters or (5 if args.dry_run else 40)
    n = args.n or (20 if args.dry_run else 200)
    lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    t_all = time.time()
    if not args.dry_run:
        torch.cuda.init()
        torch.zeros(1, device="cuda")
    else:  # tiny CPU ops run faster without the thread pool on a busy CPU
        torch.set_num_threads(1)
    bench = Benches(torch, args.dry_run, n)
    act = torch.profiler.ProfilerActivity
    activities = [act.CPU] + ([] if args.dry_run else [act.CUDA])
    names = list(bench.bodies)
    modes = ["unprofiled", *SETTINGS]
    # warm-up: every body unprofiled, and the profiler's first start (seconds) in each setting
    for name in names:
        run_one(torch, bench, name, 2, None, activities)
    for ws in SETTINGS.values():
        for name in names:
            run_one(torch, bench, name, 2, ws, activities)
    log(f"warm-up {time.time() - t_all:.1f}s")
    times = {m: {b: [] for b in names} for m in modes}
    # the unprofiled time each profiled run is compared with: the mean of the unprofiled
    # runs just before and just after it (a sandwich: the host's speed drifts in seconds)
    base = {m: {b: [] for b in names} for m in SETTINGS}
    counts = {m: {b: [] for b in names} for m in SETTINGS}
    speed = []
    for r in range(args.repeats):
        speed.append(host_speed_us())
        profiled = list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]
        for name in names:
            unp = [run_one(torch, bench, name, iters, None, activities)[0]]
            for m in profiled:
                us, c = run_one(torch, bench, name, iters, SETTINGS[m], activities)
                unp.append(run_one(torch, bench, name, iters, None, activities)[0])
                times[m][name].append(us)
                base[m][name].append((unp[-2] + unp[-1]) / 2)
                counts[m][name].append(c)
            times["unprofiled"][name].append(statistics.median(unp))
        log(f"repeat {r}: host speed {speed[-1] / 1e3:.1f} ms per loop, "
            f"{time.time() - t_all:.0f}s")
    result = {"format": "simwar.profiler_cost", "version": 1, "dry_run": args.dry_run,
              "torch": torch.__version__, "repeats": args.repeats, "iters": iters, "n": n,
              "host_speed_us": summary(speed), "host_speed_us_all": speed, "settings": {}}
    if not args.dry_run:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        result.update(device=props.name, cuda=torch.version.cuda)
    else:
        result["device"] = "cpu (dry run)"
    micro = [b for b in names if b not in ("null", "twin")]
    for m, ws in SETTINGS.items():
        # per repeat: Δ and counts net of null; costs fitted per repeat (their spread)
        per_rep = []
        for r in range(args.repeats):
            null_d = times[m]["null"][r] - base[m]["null"][r]
            null_c = per_iteration(counts[m]["null"][r], iters)
            d, c = {}, {}
            for b in names:
                d[b] = times[m][b][r] - base[m][b][r] - null_d
                cb = per_iteration(counts[m][b][r], iters)
                c[b] = {k: cb.get(k, 0.0) - null_c.get(k, 0.0) for k in KINDS
                        if cb.get(k, 0.0) - null_c.get(k, 0.0) > 1e-9}
            per_rep.append((d, c, fit_costs(d, c, micro)))
        kinds = sorted({k for _, _, cost in per_rep for k in cost}, key=KINDS.index)
        costs = {k: summary([cost.get(k, 0.0) for _, _, cost in per_rep]) for k in kinds}
        med = {k: v["median"] for k, v in costs.items()}
        benches = {}
        for b in names:
            unp = summary(times["unprofiled"][b])
            prof = summary(times[m][b])
            cnt = {k: statistics.median(c[b].get(k, 0.0) for _, c, _ in per_rep)
                   for k in KINDS if any(c[b].get(k, 0.0) for _, c, _ in per_rep)}
            host_events = sum(v for k, v in cnt.items() if k in HOST_KINDS)
            deltas = [d[b] for d, _, _ in per_rep]
            row = {"unprofiled_us": unp, "profiled_us": prof, "delta_us": summary(deltas),
                   "events_per_iter": cnt}
            if host_events > 0:
                row["us_per_host_event"] = summary([x / host_events for x in deltas])
            # cuda_driver calls (cuLaunchKernelEx) at the runtime calls' cost: no benchmark
            # of their own
            rate = dict(med, cuda_driver=med.get("cuda_driver", med.get("cuda_runtime", 0.0)))
            pred = unp["median"] + sum(cnt.get(k, 0.0) * rate.get(k, 0.0) for k in cnt)
            row["predicted_profiled_us"] = pred
            row["predicted_over_measured"] = pred / prof["median"] if prof["median"] else None
            benches[b] = row
        result["settings"][m] = {"with_stack": ws, "cost_us_per_event": costs,
                                 "benches": benches}
    (args.out / "profiler_cost.json").write_text(json.dumps(result, indent=1))
    log(table(result))
    log(f"total {time.time() - t_all:.0f}s")
    (args.out / "profiler_cost_log.txt").write_text("\n".join(lines) + "\n")
    return 0


#: the JSON's settings under the YAML's names (what simwar.fit.profiler_cost reads)
YAML_SETTINGS = {"profiled": "without_stack", "profiled_stack": "with_stack"}


def to_yaml(result: dict, date: str | None = None) -> str:
    """The text of ``simwar/data/profiler_cost.yaml`` from a run's ``profiler_cost.json``:
    per setting and kind, the joint fit's median µs per event with its min and max over
    the repeats, and where the figures came from."""
    hs = result["host_speed_us"]
    date = date or time.strftime("%Y-%m-%d", time.gmtime())
    out = ["# torch.profiler's host cost per recorded event (µs), by the trace's event kind",
           "# (cat). Written by `python -m lab.profiler_cost JSON --to-yaml` from the run's",
           "# profiler_cost.json; read by simwar/fit/profiler_cost.py; docs/profiler-cost.md.",
           "source:",
           f"  command: python -m lab.profiler_cost OUT --repeats {result['repeats']}",
           f"  gpu: {result['device']}",
           f"  torch: {result['torch']}",
           f"  cuda: '{result.get('cuda', '')}'",
           f"  date: '{date}'",
           f"  repeats: {result['repeats']}",
           f"  iterations: {result['iters']}",
           "  # µs of lab.profiler_cost.host_speed_us's pure-Python loop, per repeat: the host's",
           "  # speed while it measured (larger: slower)",
           f"  host_speed_us: {{median: {hs['median']:.0f}, min: {hs['min']:.0f}, "
           f"max: {hs['max']:.0f}}}",
           "settings:"]
    for m, name in YAML_SETTINGS.items():
        s = result["settings"][m]
        out.append(f"  {name}:  # torch.profiler with_stack={s['with_stack']}")
        for k, v in s["cost_us_per_event"].items():
            out.append(f"    {k}: {{us: {v['median']:.3f}, min: {v['min']:.3f}, "
                       f"max: {v['max']:.3f}}}")
    return "\n".join(out) + "\n"


def table(result: dict) -> str:
    """The printed tables: per setting, per-kind costs and per-benchmark figures."""
    hs = result["host_speed_us"]
    out = [f"{result['device']}, torch {result['torch']}, {result['repeats']} repeats x "
           f"{result['iters']} iterations; host speed {hs['median'] / 1e3:.1f} ms per loop "
           f"(min {hs['min'] / 1e3:.1f}, max {hs['max'] / 1e3:.1f})"]
    for m, s in result["settings"].items():
        out.append(f"\n{m} (with_stack={s['with_stack']}): µs per event, joint fit "
                   f"(median [min, max] over repeats)")
        for k, v in s["cost_us_per_event"].items():
            out.append(f"  {k:16s} {v['median']:7.3f} [{v['min']:.3f}, {v['max']:.3f}]")
        out.append(f"  {'bench':12s} {'unprof µs':>10s} {'prof µs':>10s} {'Δ µs':>9s} "
                   f"{'µs/host ev':>10s} {'pred/meas':>9s}  events per iteration")
        for b, row in s["benches"].items():
            per = row.get("us_per_host_event", {}).get("median")
            ratio = row["predicted_over_measured"]
            ev = ", ".join(f"{k} {v:.1f}" for k, v in row["events_per_iter"].items())
            out.append(f"  {b:12s} {row['unprofiled_us']['median']:10.1f} "
                       f"{row['profiled_us']['median']:10.1f} {row['delta_us']['median']:9.1f} "
                       f"{'-' if per is None else f'{per:.3f}':>10s} "
                       f"{'-' if ratio is None else f'{ratio:.3f}':>9s}  {ev}")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
