"""Sweep speed: one shape, a mixed grid against a loop, simulate() after a big sweep, --jobs.

Usage::

    python benchmarks/bench_sweep.py one-shape [--runs 10000] [--steps 1000] [--before DIR]
    python benchmarks/bench_sweep.py mixed     [--runs 800] [--steps 5000] [--before DIR]
    python benchmarks/bench_sweep.py after-load [--runs 10000] [--calls 40] [--before DIR]
    python benchmarks/bench_sweep.py jobs      [--runs 200] [--steps 500] [--jobs 1 2]

- ``one-shape``: ``sweep()`` of ``--runs`` runs sharing one shape (``cpu.schedule_us`` over
  that many values) of ``--steps`` steps into an empty output directory, end to end (the
  templates, the lockstep batches, the batch tables and the results tables): run-steps per
  CPU-second of the call (target: >= 5 M at 10,000 x 1,000).
- ``mixed``: the benchmark grid (:func:`benchmark_spec`: 4 algorithms x 2 barriers x CPU
  schedule times, 800 runs x 5,000 steps, 8 shapes of 100 runs): ``sweep()``'s CPU time
  against a loop of ``simulate(run.config, engine="fast", summary_only=True)`` over the same
  runs, both in one process (target: the sweep >= 5x the loop).
- ``after-load``: CPU per ``simulate()`` call of 1,000 steps in a fresh process, then after
  ``load_sweep`` of the one-shape grid and the expansion of its runs, in the same process
  (they should cost the same).
- ``jobs``: runs/s of a small sweep for several ``--jobs`` (no target).

Each measurement runs in a fresh process of the tree measured (``--before DIR``: another
source tree, e.g. ``git archive COMMIT | tar -x -C DIR``, measured in the same run, the two
interleaved, each the best of ``--repeats``); figures are CPU time (user + system) of this
process's work, so the machine's load moves them less than wall time. Every sweep starts
from an empty output directory.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


def one_shape_spec(runs: int, steps: int) -> dict:
    """``runs`` runs of one shape: ``cpu.schedule_us`` over ``runs`` values."""
    return {"base": {"name": "one-shape", "steps": steps, "warmup_steps": min(20, steps - 3)},
            "grid": {"cpu.schedule_us": [200.0 + 0.5 * i for i in range(runs)]}}


# --------------------------------------------------------------------------- in the child
def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def child_one_shape(runs: int, steps: int) -> dict:
    from simwar.study.sweeps import sweep

    spec = one_shape_spec(runs, steps)
    with tempfile.TemporaryDirectory() as out:
        t0 = _cpu()
        frame = sweep(spec, out)
        cpu = _cpu() - t0
    assert len(frame) == runs
    return {"cpu_s": cpu, "run_steps_per_cpu_s": runs * steps / cpu,
            "step_us_mean_sum": float(frame["step_us_mean"].sum())}


def child_mixed(runs: int, steps: int) -> dict:
    import simwar
    from simwar.study.sweeps import load_sweep, sweep

    spec = benchmark_spec(runs, steps)
    configs = [run.config for run in load_sweep(spec).runs]
    t0 = _cpu()
    looped = [simwar.simulate(c, engine="fast", summary_only=True).summary for c in configs]
    loop = _cpu() - t0
    with tempfile.TemporaryDirectory() as out:
        t0 = _cpu()
        frame = sweep(spec, out)
        swept = _cpu() - t0
    assert len(frame) == runs
    return {"loop_cpu_s": loop, "sweep_cpu_s": swept, "ratio": loop / swept,
            "step_us_mean_sum": float(frame["step_us_mean"].sum()),
            "loop_step_us_mean_sum": float(sum(s["step_us_mean"] for s in looped))}


def child_after_load(runs: int, calls: int) -> dict:
    import simwar
    from simwar.study.sweeps import load_sweep

    def per_call() -> float:
        cfg = {"name": "call", "steps": 1000, "warmup_steps": 20}
        for i in range(3):  # warm: the validator built, the block compiled
            simwar.simulate({**cfg, "cpu": {"schedule_us": 300.0 + i}}, engine="fast",
                            summary_only=True)
        t0 = _cpu()
        for i in range(calls):
            simwar.simulate({**cfg, "cpu": {"schedule_us": 300.0 + i}}, engine="fast",
                            summary_only=True)
        return (_cpu() - t0) / calls * 1e3

    fresh = per_call()
    plan = load_sweep(one_shape_spec(runs, 1000))
    kept = plan.runs  # noqa: F841 (every run expanded and held, as a caller of .runs does)
    after = per_call()
    return {"fresh_ms": fresh, "after_load_ms": after, "ratio": after / fresh}


# --------------------------------------------------------------------------- the parent
def _child(tree: Path, args: list[str]) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "_child", *args],
                          cwd=tree, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{tree}: {' '.join(args)} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _measured(args, what: list[str], key: str, higher: bool) -> dict:
    """Each tree's best of ``--repeats`` (interleaved: after, before, after, before ...)."""
    trees = {"after": ROOT}
    if args.before is not None:
        trees["before"] = args.before.resolve()
    best: dict[str, dict] = {}
    for _ in range(args.repeats):
        for name, tree in trees.items():
            r = _child(tree, what)
            print(json.dumps({name: r}), file=sys.stderr)
            if name not in best or (r[key] > best[name][key]) == higher:
                best[name] = r
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("one-shape", "mixed", "after-load", "jobs", "_child"))
    parser.add_argument("child", nargs="*", help=argparse.SUPPRESS)
    parser.add_argument("--runs", type=int)
    parser.add_argument("--steps", type=int)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--before", type=Path, help="another simwar source tree to measure")
    parser.add_argument("--repeats", type=int, default=1)
    args = parser.parse_args()
    if args.what == "_child":
        mode, *rest = args.child
        numbers = [int(x) for x in rest]
        fn = {"one-shape": child_one_shape, "mixed": child_mixed,
              "after-load": child_after_load}[mode]
        print(json.dumps(fn(*numbers)))
        return 0
    print(f"python {platform.python_version()}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()}", file=sys.stderr)
    if args.what == "one-shape":
        runs, steps = args.runs or 10_000, args.steps or 1_000
        best = _measured(args, ["one-shape", str(runs), str(steps)], "run_steps_per_cpu_s",
                         True)
        out = {"runs": runs, "steps": steps, **{k: v for k, v in best.items()}}
        if "before" in best:
            out["ratio"] = best["after"]["run_steps_per_cpu_s"] / \
                best["before"]["run_steps_per_cpu_s"]
            out["same_results"] = best["after"]["step_us_mean_sum"] == \
                best["before"]["step_us_mean_sum"]
    elif args.what == "mixed":
        runs, steps = args.runs or 800, args.steps or 5_000
        out = {"runs": runs, "steps": steps,
               **_measured(args, ["mixed", str(runs), str(steps)], "ratio", True)}
    elif args.what == "after-load":
        out = _measured(args, ["after-load", str(args.runs or 10_000), str(args.calls)],
                        "ratio", False)
    else:
        return _jobs(args.runs or 200, args.steps or 500, args.jobs)
    out["load_average_after"] = os.getloadavg()
    print(json.dumps(out, indent=1))
    return 0


def _jobs(runs: int, steps: int, jobs: list[int]) -> int:
    from simwar.study.sweeps import sweep

    spec = benchmark_spec(runs, steps)
    rates = {}
    for n in jobs:
        with tempfile.TemporaryDirectory() as out:
            started = time.perf_counter()
            frame = sweep(spec, out, jobs=n)
            elapsed = time.perf_counter() - started
        assert len(frame) == runs
        rates[n] = runs / elapsed
        print(f"--jobs {n}: {runs} runs x {steps} steps in {elapsed:.1f} s = "
              f"{rates[n]:.2f} runs/s")
    for n in jobs[1:]:
        print(f"speed-up --jobs {n} vs --jobs {jobs[0]}: {rates[n] / rates[jobs[0]]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
