"""Sweep throughput: runs/s of a 200-run x 500-step sweep for several ``--jobs`` values.

Usage: ``python benchmarks/bench_sweep.py [--runs 200] [--steps 500] [--jobs 1 2]``.
Each measurement starts from an empty output directory (nothing is resumed) and
includes writing every run file and the tables, as ``simwar sweep`` does. The
machine's load average is printed before and after: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time

from simwar.sweeps import load_sweep, sweep

ALGORITHMS = ["none", "eagle", "dflash", "dspark"]
ACCEPT = [1.0, 3.2, 3.5, 3.2]


def benchmark_spec(runs: int, steps: int) -> dict:
    """Algorithms x barriers x CPU schedule times, sized to ``runs`` (a multiple of 8)."""
    if runs % 8:
        raise SystemExit("--runs must be a multiple of 8 (4 algorithms x 2 barriers)")
    schedule_us = [200 + 5000 * i / max(1, runs // 8 - 1) for i in range(runs // 8)]
    return {"base": {"name": "bench", "steps": steps, "warmup_steps": min(20, steps - 1)},
            "grid": {"policy.barrier": ["coarse", "fine"], "cpu.schedule_us": schedule_us},
            "zip": {"algorithm": ALGORITHMS, "accept.tokens": ACCEPT}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    spec = benchmark_spec(args.runs, args.steps)
    assert len(load_sweep(spec).runs) == args.runs
    print(f"python {platform.python_version()}, {os.cpu_count()} cores, "
          f"load average before {os.getloadavg()}")
    rates = {}
    for jobs in args.jobs:
        with tempfile.TemporaryDirectory() as out:
            started = time.perf_counter()
            frame = sweep(spec, out, jobs=jobs)
            elapsed = time.perf_counter() - started
        assert len(frame) == args.runs
        rates[jobs] = args.runs / elapsed
        print(f"--jobs {jobs}: {args.runs} runs x {args.steps} steps in {elapsed:.1f} s = "
              f"{rates[jobs]:.2f} runs/s")
    base = rates[args.jobs[0]]
    for jobs in args.jobs[1:]:
        print(f"speed-up --jobs {jobs} vs --jobs {args.jobs[0]}: {rates[jobs] / base:.2f}x")
    print(f"load average after {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
