"""Entry point on the GPU machine: replay serialized programs, write traces and benchmarks.

``python -m simwar.harness.gpu_main PROGRAMS OUT [--repeats N] [--bench]
[--profile DIR]`` replays every ``PROGRAMS/*.json`` (``Program.to_json``)
``N`` times, in case order within each repeat (``--lean``: kernels without
shared accesses are a bare spin, see ``cuda``), and writes one tar of
``<case>.trace.json.gz`` per repeat (``OUT/traces_r<N>.tar``: few files to
bring back). ``--bench`` writes the primitive micro-benchmarks to
``OUT/bench.json``; ``--profile DIR`` replays each program of DIR under
``torch.profiler`` (CPU and CUDA activities, CUDA sync events where this torch
has them), with each host iteration inside ``record_function("step#<k>")``,
and writes ``OUT/kineto.tar`` holding ``<case>.kineto.json.gz`` and the
harness's own ``<case>.trace.json.gz`` of the same run.

Imports: torch, numpy (through the Trace) and the standard library (no simpy, pydantic or
pandas there).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import os
import shutil
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

from simwar.core.files import atomic_file, write_text_atomic
from simwar.core.program import Program
from simwar.harness.plan import make_plan
from simwar.harness.replay import replay


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(time.time())
    tar.addfile(info, io.BytesIO(data))


def _trace_bytes(trace) -> bytes:
    return gzip.compress(json.dumps(trace.to_dict()).encode(), compresslevel=6)


class _StepRanges:
    """Wraps each host iteration in a profiler range named ``step#<k>``."""

    def __init__(self):
        import torch

        self.torch = torch
        self.current = None

    def __call__(self, step: int) -> None:
        self.close()
        self.current = self.torch.profiler.record_function(f"step#{step}")
        self.current.__enter__()

    def close(self) -> None:
        if self.current is not None:
            self.current.__exit__(None, None, None)
            self.current = None


def python_work_us(calls: int = 2000) -> float:
    """Host speed right now: µs per run of a fixed piece of pure-Python work (~15 ms)."""
    t = time.perf_counter_ns()
    for _ in range(calls):
        total = 0
        for i in range(200):
            total += i * i
    return (time.perf_counter_ns() - t) / 1e3 / calls


def step_us_mean(trace) -> float:
    """Mean step time after warm-up (the metric of ``simwar.analysis.metrics``, numpy only)."""
    import numpy as np

    ops = trace.ops
    fwd = trace.code(trace.meta.get("forward_stream", "forward"))
    kern = (ops.kind == 0) & (ops.lane == fwd) & (ops.phase != trace.code(""))  # kernel ops
    steps, first = np.unique(ops.step[kern], return_index=True)
    start = ops.start_us[kern][first]  # forward kernels are in issue order: the first starts
    warm = int(trace.meta.get("warmup_steps", 0))
    gaps = np.diff(start)[steps[:-1] >= warm]
    return float(gaps.mean()) if len(gaps) else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simwar.harness.gpu_main")
    ap.add_argument("programs", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--profile", type=Path)
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--cpu", type=int, help="pin the host thread to this CPU core")
    ap.add_argument("--lean", action="store_true",
                    help="kernels without shared accesses are a bare spin (not uniform)")
    args = ap.parse_args(argv)

    import torch

    from simwar.harness.cuda import CudaBackend, calibrate_device  # lazy: imports torch

    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    # initialise CUDA first: the driver's own threads keep every core, and only this
    # thread is pinned (one core: no migrations inside a timed loop)
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    if args.cpu is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(threading.get_native_id(), {args.cpu})
    args.out.mkdir(parents=True, exist_ok=True)
    t_all = time.time()
    if args.bench:
        from simwar.harness.bench import run_benchmarks  # lazy: imports torch

        bench = run_benchmarks()
        write_text_atomic(args.out / "bench.json", json.dumps(bench, indent=1))
        print("bench:", json.dumps(bench["primitives"]), flush=True)
    cal = calibrate_device()
    print("device calibration:", cal, flush=True)
    files = sorted(args.programs.glob("*.json"))
    if args.only:
        keep = set(args.only.split(","))
        files = [f for f in files if f.stem in keep]
    programs = [(f.stem, Program.from_json(f.read_text())) for f in files]
    if programs:  # one untimed replay first: lazy initialisation stays out of the first case
        replay(make_plan(programs[0][1]), CudaBackend(cal, uniform=not args.lean))
    for rep in range(1, args.repeats + 1):
        # each repeat starts at another case, so no case is always the first after a pause
        shift = (rep - 1) * len(programs) // max(1, args.repeats)
        with atomic_file(args.out / f"traces_r{rep}.tar") as fh, \
                tarfile.open(fileobj=fh, mode="w") as tar:
            for name, program in programs[shift:] + programs[:shift]:
                t = time.time()
                probe_us = python_work_us()
                trace = replay(make_plan(program), CudaBackend(cal, uniform=not args.lean))
                trace.meta["host_probe_us"] = {"before": probe_us, "after": python_work_us()}
                races = len([r for r in trace.meta["measured_races"]
                             if r["read_step"] >= program.meta.get("warmup_steps", 0)])
                _add(tar, f"{name}.trace.json.gz", _trace_bytes(trace))
                launch = trace.meta["host_costs"]["launch_us"].get("mean", float("nan"))
                print(f"r{rep} {name}: {time.time() - t:.1f}s, step {step_us_mean(trace):.1f} "
                      f"us, launch {launch:.1f} us, host probe {probe_us:.2f} us, "
                      f"measured races {races}", flush=True)
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        kwargs = {}
        exp = getattr(getattr(torch._C, "_profiler", None), "_ExperimentalConfig", None)
        with atomic_file(args.out / "kineto.tar") as fh, \
                tarfile.open(fileobj=fh, mode="w") as tar:
            for i, f in enumerate(sorted(args.profile.glob("*.json"))):
                program = Program.from_json(f.read_text())
                backend = CudaBackend(cal)
                kwargs = {}
                if i == 0 and exp is not None:
                    try:
                        kwargs["experimental_config"] = exp(enable_cuda_sync_events=True)
                    except TypeError:
                        kwargs = {}
                ranges = _StepRanges()
                with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                             **kwargs) as prof:
                    trace = replay(make_plan(program), backend, step_hook=ranges)
                    ranges.close()
                tmp = Path(tempfile.mkdtemp())
                prof.export_chrome_trace(str(tmp / "k.json"))
                raw = (tmp / "k.json").read_bytes()
                shutil.rmtree(tmp)
                _add(tar, f"{f.stem}.kineto.json.gz", gzip.compress(raw, compresslevel=9))
                _add(tar, f"{f.stem}.trace.json.gz", _trace_bytes(trace))
                _add(tar, f"{f.stem}.profiler.json", json.dumps(
                    {"sync_events": bool(kwargs)}).encode())
                print(f"profiled {f.stem}: {len(raw) / 1e6:.1f} MB raw", flush=True)
    print(f"total {time.time() - t_all:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
