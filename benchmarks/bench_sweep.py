"""Sweep throughput: runs/s of a 200-run x 500-step sweep for several ``--jobs`` values.

Usage: ``python benchmarks/bench_sweep.py [--runs 200] [--steps 500] [--jobs 1 2]``.
Each measurement starts from an empty output directory (nothing is resumed) and
includes writing every run file and the tables, as ``simwar sweep`` does. The
machine's load average is printed before and after: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time

from simwar.study.sweeps import load_sweep, sweep

ALGORITHMS = ["none", "eagle", "dflash", "dspark"]
ACCEPT = [1.0, 3.2, 3.5, 3.2]


def benchmark_spec(runs: int, steps: int) -> dict:
    """``runs`` distinct runs: algorithms x barriers x CPU schedule times, advanced together.

    Run i takes algorithm i mod 4, barrier (i // 4) mod 2 and the (i // 8)-th of the CPU
    schedule times (200 to 5200 µs), so any positive ``runs`` works; a multiple of 8
    covers every algorithm and barrier at each schedule time.
    """
    if runs < 1:
        raise ValueError(f"runs: expected a positive number, got {runs}")
    if steps < 3:
        raise ValueError(f"steps: expected at least 3 (two measured steps), got {steps}")
    points = math.ceil(runs / 8)
    schedule_us = [200 + 5000 * p / max(1, points - 1) for p in range(points)]
    index = range(runs)
    return {"base": {"name": "bench", "steps": steps, "warmup_steps": min(20, steps - 3)},
            "zip": {"algorithm": [ALGORITHMS[i % 4] for i in index],
                    "accept.tokens": [ACCEPT[i % 4] for i in index],
                    "policy.barrier": [("coarse", "fine")[i // 4 % 2] for i in index],
                    "cpu.schedule_us": [schedule_us[i // 8] for i in index]}}


def _positive(minimum: int):
    def parse(text: str) -> int:
        value = int(text)
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value
    return parse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=_positive(1), default=200)
    parser.add_argument("--steps", type=_positive(3), default=500)
    parser.add_argument("--jobs", type=_positive(0), nargs="+", default=[1, 2])
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
