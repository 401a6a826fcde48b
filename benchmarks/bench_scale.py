"""Runs that scale: arrivals, flat summary-only runs, lockstep sweeps; against another tree.

    python benchmarks/bench_scale.py arrivals [--steps 1000000] [--before DIR --before-steps 100000]
    python benchmarks/bench_scale.py flat     [--steps 10000000] [--before DIR]
    python benchmarks/bench_scale.py sweep    [--runs 10000] [--sweep-steps 10000] [--jobs 2]
                                              [--before DIR --before-runs 480]
    python benchmarks/bench_scale.py all --before DIR

Each measurement is a fresh ``python -m simwar ...`` process of this tree (and, with
``--before DIR``, of that source tree, e.g. ``git worktree add /tmp/before <commit>``), run
from this one process: CPU time (the process and its children, user + system), wall time and
peak RSS, and the ratios before / after. The machine is shared: repeat on a quiet one.

- ``arrivals``: ``simwar run`` of the arrivals config of docs/guide-workloads.md
  (``dspark_fine_bimodal`` with Poisson arrivals at 100/s, up to 64 requests, 16..256 output
  tokens, accepted tokens 1..5) for ``--steps`` steps: µs of CPU per step (target <= 10; 1M
  steps <= 15 s). The two trees' summaries at ``--before-steps`` steps are compared: they
  must be equal.
- ``flat``: ``simwar run --summary-only`` of ``configs/dspark_none.yaml`` (a race every step)
  and ``configs/dspark_fine.yaml`` for ``--steps`` steps: peak RSS (target <= 200 MB at 10M).
- ``sweep``: ``simwar sweep --jobs N`` of 4 algorithms x 4 barriers x 25 ``cpu.schedule_us``
  x 25 ``phases.sample.body_us`` (``--runs`` of them, 10,000 in all) of ``--sweep-steps``
  steps: CPU and wall time. The before tree runs the first ``--before-runs`` (every
  algorithm and barrier, fewer cost points: a run costs the same there whatever the sweep's
  size) and its CPU per run is scaled to the whole sweep; the runs both trees ran must have
  equal summaries (every column of the results table).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARRIVALS = ["configs/dspark_fine_bimodal.yaml",
            "--set", "workload={arrivals: {rate_per_s: 100}, max_batch: 64, initial_batch: 4, "
                     "output_tokens: {dist: uniform, low: 16, high: 256}, "
                     "graph_buckets: [8, 16, 32, 64]}",
            "--set", "accept.tokens={dist: empirical, values: [1, 2, 3, 4, 5]}"]


def measure(tree: Path, args: list[str]) -> dict:
    """``python -m simwar ARGS`` in ``tree`` (its simwar first on the path): CPU of it and
    its children (user + system), wall, peak RSS (of it or its largest child: a sweep's
    worker), and its stdout."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    t0 = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([sys.executable, "-m", "simwar", *args], cwd=tree, env=env,
                                stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(proc.pid, 0)  # the child's, its waited-for children's
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)[:300]} failed in {tree}:\n{stderr[-2000:]}")
    return {"cpu_s": usage.ru_utime + usage.ru_stime, "wall_s": wall,
            "rss_mb": usage.ru_maxrss / 1024, "stdout": stdout}


def _row(name: str, r: dict, **extra) -> dict:
    out = {"case": name, **{k: round(v, 3) for k, v in r.items() if k != "stdout"}, **extra}
    print(json.dumps(out), file=sys.stderr)
    return out


# --------------------------------------------------------------------------- arrivals
def bench_arrivals(steps: int, before: Path | None, before_steps: int) -> dict:
    run = ["run", *ARRIVALS, "--quiet"]
    after = measure(ROOT, [*run, "--set", f"steps={steps}"])
    out = {"after": _row("arrivals after", after, steps=steps,
                         us_per_step=after["cpu_s"] / steps * 1e6)}
    if before is not None:
        b = measure(before, [*run, "--set", f"steps={before_steps}", "--json"])
        a = measure(ROOT, [*run, "--set", f"steps={before_steps}", "--json"])
        same = json.loads(b["stdout"]) == json.loads(a["stdout"])
        out["before"] = _row("arrivals before", b, steps=before_steps,
                             us_per_step=b["cpu_s"] / before_steps * 1e6)
        out["same_summary"] = same
        out["ratio_us_per_step"] = out["before"]["us_per_step"] / out["after"]["us_per_step"]
    return out


# --------------------------------------------------------------------------- flat
def bench_flat(steps: int, before: Path | None) -> dict:
    out = {}
    for stem in ("dspark_none", "dspark_fine"):
        args = ["run", f"configs/{stem}.yaml", "--summary-only", "--engine", "fast", "--quiet",
                "--set", f"steps={steps}"]
        out[stem] = {"after": _row(f"flat {stem} after", measure(ROOT, args), steps=steps)}
        if before is not None:
            b = _row(f"flat {stem} before", measure(before, args), steps=steps)
            out[stem]["before"] = b
            out[stem]["ratio_rss"] = b["rss_mb"] / out[stem]["after"]["rss_mb"]
    return out


# --------------------------------------------------------------------------- sweep
def sweep_spec(steps: int, runs: int) -> dict:
    """The sweep of docs/benchmarks.md (10,000 runs), or its first ``runs``: every algorithm
    and barrier, fewer cost points."""
    spec = {"base": {"name": "bench", "steps": steps, "warmup_steps": 20},
            "grid": {"algorithm": ["none", "eagle", "dflash", "dspark"],
                     "policy.barrier": ["none", "coarse", "fine", "host_sync"],
                     "cpu.schedule_us": [200.0 + 200 * i for i in range(25)],
                     "phases.sample.body_us": [100.0 + 150 * i for i in range(25)]}}
    if runs < 10_000:
        a = min(25, -(-runs // 16))
        b = max(1, min(25, runs // (16 * a)))
        spec["grid"]["cpu.schedule_us"] = spec["grid"]["cpu.schedule_us"][:a]
        spec["grid"]["phases.sample.body_us"] = spec["grid"]["phases.sample.body_us"][:b]
    return spec


def _count(spec: dict) -> int:
    n = 1
    for values in spec["grid"].values():
        n *= len(values)
    return n


def _sweep(tree: Path, spec: dict, jobs: int, tmp: Path, name: str) -> tuple[dict, object]:
    import pandas as pd
    import yaml

    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    out_dir = tmp / name
    r = measure(tree, ["sweep", str(path), "--out", str(out_dir), "--jobs", str(jobs),
                       "--no-progress"])
    return r, pd.read_parquet(out_dir / "results.parquet")


def bench_sweep(runs: int, steps: int, jobs: int, before: Path | None, before_runs: int) -> dict:
    spec = sweep_spec(steps, runs)
    n = _count(spec)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        a, table = _sweep(ROOT, spec, jobs, tmp, "after")
        out["after"] = _row("sweep after", a, runs=n, steps=steps, jobs=jobs,
                            cpu_per_run_ms=a["cpu_s"] / n * 1e3)
        if before is not None:
            bspec = sweep_spec(steps, before_runs)
            m = _count(bspec)
            b, btable = _sweep(before, bspec, jobs, tmp, "before")
            out["before"] = _row("sweep before", b, runs=m, steps=steps, jobs=jobs,
                                 cpu_per_run_ms=b["cpu_s"] / m * 1e3,
                                 cpu_for_all_runs_s=b["cpu_s"] / m * n)
            out["ratio_cpu"] = out["before"]["cpu_for_all_runs_s"] / a["cpu_s"]
            out["ratio_cpu_per_run"] = out["before"]["cpu_per_run_ms"] / \
                out["after"]["cpu_per_run_ms"]
            # the runs both ran, by run key (run ids number each sweep's own grid)
            mine = table.set_index("run_key").loc[btable["run_key"]].reset_index()
            mine = mine.drop(columns="run_id")
            out["same_rows"] = bool(mine.equals(btable[mine.columns]))
    return out


# --------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("arrivals", "flat", "sweep", "all"))
    ap.add_argument("--before", type=Path, help="another simwar source tree to measure")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--before-steps", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--before-runs", type=int, default=480)
    ap.add_argument("--sweep-steps", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args()
    before = args.before.resolve() if args.before else None
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()}", file=sys.stderr)
    what = ["arrivals", "flat", "sweep"] if args.what == "all" else [args.what]
    for w in what:
        if w == "arrivals":
            res = bench_arrivals(args.steps or 1_000_000, before, args.before_steps)
        elif w == "flat":
            res = bench_flat(args.steps or 10_000_000, before)
        else:
            res = bench_sweep(args.runs, args.sweep_steps, args.jobs, before, args.before_runs)
        print(json.dumps({w: res}), flush=True)
    print(f"load average after {os.getloadavg()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
