"""The fast executor against the SimPy engine: speed, memory, sweeps, sketch error.

    python benchmarks/bench_fast.py ratio     [--steps 20000] [--repeat 5]
    python benchmarks/bench_fast.py ranks     [--steps 5000] [--repeat 3]
    python benchmarks/bench_fast.py shapes    [--steps 5000] [--repeat 5]
    python benchmarks/bench_fast.py rss       [--steps 10000 100000 1000000]
    python benchmarks/bench_fast.py run500
    python benchmarks/bench_fast.py sweep     [--runs 10000] [--sweep-steps 10000] [--jobs 2]
    python benchmarks/bench_fast.py quantiles [--steps 1000000]
    python benchmarks/bench_fast.py all

``--before DIR`` runs the same measurement (``ratio``, ``rss``, ``run500``, ``sweep``) on
another simwar source tree, e.g. one exported with ``git archive 9ad16a6 | tar -x -C DIR``
(its own ``simulate`` is the SimPy path); ``shapes`` measures both trees.

- ``ratio``: ``simulate()`` of ``configs/dspark_fine.yaml`` end to end (config, build,
  execution, per-step table, summary, races), fast and simpy **interleaved in one
  process**, best of ``--repeat``, process CPU time (robust to other load on a shared
  machine; wall time is printed too): steps/s of each and their ratio.
- ``ranks``: as ``ratio``, on the tensor-parallel ``configs/tp2_slow_rank.yaml`` (two
  ranks): the SimPy engine against the fast executor's ranks (``engine: fast``: the
  ranks in lockstep, :mod:`simwar.executors.lockstep.ranks`), end to end (each rank's
  table, races and summary; the ranks' table and summary).
  With it, where the fast path's time goes (``parts``, best of ``--repeat``, the steps
  ``simulate`` takes, one by one: planning the ranks, the lockstep pass with each rank's
  table and races, the ranks' table) and, for comparison, a run that keeps every rank's
  Trace (``--trace``, ``--timeline``: the one pass per rank,
  :mod:`simwar.executors.fast.ranks`), end to end.
- ``shapes``: the one-pass executor's per-step cost of a run whose scheduler picks each
  step's shape (``configs/sglang_default_prefill.yaml``, ``scheduling.rule: sglang``: prefill
  and decode steps) against the same config as a one-shape run (``scheduling.rule:
  sglang_mixed``), ``simulate()`` end to end, arrivals realized afresh each time (the sizes
  cache cleared), interleaved in one process, best of ``--repeat``, process CPU time; and the
  SimPy engine on the shape-picking run. ``ratio_cpu``: the multi-shape run's CPU time per
  step over the one-shape run's (the target is at most 1.3). (Since the mixed rules run a
  decode step when no prompt token waits, ``one_shape`` picks decode and mixed steps too:
  the one-shape figure is the ``--before`` tree's, from before that change.) With
  ``--before DIR`` both trees are measured, their child processes alternated three times, and
  ``shapes_before_over_after_cpu`` compares their multi-shape runs.
- ``rss``: ``simwar run configs/dspark_fine.yaml --set steps=N --json`` in a fresh process
  each: wall, CPU and peak RSS (``ru_maxrss``).
- ``run500``: ``simwar run --set steps=500``, best of 5: CPU time, and the import share
  (``python -X importtime``).
- ``sweep``: 4 algorithms x 4 barriers x 25 ``cpu.schedule_us`` x 25
  ``phases.sample.body_us`` (10,000 runs) of ``--sweep-steps`` steps each, with
  ``simwar sweep --jobs N``: wall and CPU time. ``--runs`` takes the first runs only
  (to extrapolate a slow executor).
- ``quantiles``: ``--summary-only``'s quantiles against the exact ones on a stochastic
  config (a lognormal schedule time and a normal verify), and on synthetic data.
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
CONFIG = "configs/dspark_fine.yaml"
RANKS_CONFIG = "configs/tp2_slow_rank.yaml"


def child(tree: Path, args: list[str]) -> str:
    """Run ``python3 ARGS`` in ``tree`` (its simwar first on the path); its stdout."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True,
                          text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)[:200]} failed in {tree}:\n{proc.stderr[-2000:]}")
    return proc.stdout


# --------------------------------------------------------------------------- ratio
RATIO_CODE = """
import gc, time
from simwar.api import simulate
from simwar.config import load_config
cfg = load_config({config!r}, {{"steps": {steps}}})
engines = {engines!r}
def once(engine):
    kw = {{}} if engine == "default" else {{"engine": engine}}
    c0, t0 = time.process_time(), time.perf_counter()
    simulate(cfg, **kw)
    return time.process_time() - c0, time.perf_counter() - t0
for e in engines:
    once(e)  # warm-up (compiles, allocators)
best = {{e: (float("inf"), float("inf")) for e in engines}}
for _ in range({repeat}):
    for e in engines:  # interleaved: drifts of the machine hit both alike
        c, w = once(e)
        best[e] = (min(best[e][0], c), min(best[e][1], w))
print(json.dumps({{e: {{"cpu_s": c, "wall_s": w, "steps_per_s": {steps} / c}}
                  for e, (c, w) in best.items()}}))
"""


def bench_ratio(tree: Path, steps: int, repeat: int, before: bool,
                config: str = CONFIG) -> dict:
    engines = ["default"] if before else ["simpy", "fast"]
    code = "import json\n" + RATIO_CODE.format(config=config, steps=steps, engines=engines,
                                               repeat=repeat)
    out = child(tree, ["-c", code])
    res = json.loads(out.strip().splitlines()[-1])
    if not before:
        res["ratio_cpu"] = res["simpy"]["cpu_s"] / res["fast"]["cpu_s"]
        res["ratio_wall"] = res["simpy"]["wall_s"] / res["fast"]["wall_s"]
    return res


RANKS_PARTS_CODE = """
import json, time
from simwar.analysis.ranks import group_columns
from simwar.api import resolve_sizes, simulate
from simwar.config import load_config
from simwar.core.collector import gc_paused
from simwar.executors.lockstep import ranks as lanes
cfg = load_config({config!r}, {{"steps": {steps}}})
best = {{}}
def part(name, f):
    c0 = time.process_time()
    out = f()
    best[name] = min(best.get(name, float("inf")), time.process_time() - c0)
    return out
for _ in range({repeat} + 1):  # the first is a warm-up, as in the ratio
    with gc_paused():
        sizes = resolve_sizes(cfg)
        plans = part("plan", lambda: [lanes.plan_rank(cfg, r, sizes) for r in range(cfg.tp)])
        runs, col = part("lockstep pass and rank tables", lambda: lanes.run_plans(plans))
        part("ranks' table", lambda: group_columns(col, [r.columns for r in runs]))
        part("Traces kept (--trace, --timeline: one pass per rank)",
             lambda: simulate(cfg, engine="fast", trace_for="a Trace"))
print(json.dumps(best))
"""


def bench_ranks(tree: Path, steps: int, repeat: int, before: bool) -> dict:
    res = bench_ratio(tree, steps, repeat, before, RANKS_CONFIG)
    if not before:
        code = "import json\n" + RANKS_PARTS_CODE.format(config=RANKS_CONFIG, steps=steps,
                                                         repeat=repeat)
        parts = json.loads(child(tree, ["-c", code]).strip().splitlines()[-1])
        res["parts_cpu_s"] = parts
    return res


# --------------------------------------------------------------------------- shapes
SHAPES_CONFIG = "configs/sglang_default_prefill.yaml"
SHAPES_CODE = """
import json, time
import simwar.api as api
from simwar.config import load_config
runs = {{"shapes": ("fast", "sglang"), "one_shape": ("fast", "sglang_mixed"),
         "shapes_simpy": ("simpy", "sglang")}}
cfgs = {{name: load_config({config!r}, {{"steps": {steps}, "scheduling.rule": rule}})
        for name, (_, rule) in runs.items()}}
def once(name):
    api._sizes_cache.clear()  # realize the arrivals afresh: that pass is the fast run
    c0, t0 = time.process_time(), time.perf_counter()
    r = api.simulate(cfgs[name], engine=runs[name][0])
    return time.process_time() - c0, time.perf_counter() - t0, r.summary
for name in runs:
    once(name)  # warm-up (compiles, allocators)
best = {{name: (float("inf"), float("inf")) for name in runs}}
shares = None
for _ in range({repeat}):
    for name in runs:  # interleaved: drifts of the machine hit both alike
        c, w, s = once(name)
        best[name] = (min(best[name][0], c), min(best[name][1], w))
        if name == "shapes":
            shares = s["shape_steps"]
print(json.dumps({{**{{name: {{"cpu_s": c, "wall_s": w, "us_per_step": c / {steps} * 1e6}}
                     for name, (c, w) in best.items()}}, "shape_steps": shares}}))
"""


def bench_shapes(tree: Path, steps: int, repeat: int, before: Path | None = None,
                 rounds: int = 3) -> dict:
    """The ``shapes`` measurement on ``tree``; with ``before``, on both trees, their child
    processes alternated ``rounds`` times (the best of each figure kept), so a drift of the
    machine hits both alike: ``{"after": ..., "before": ...}``."""
    code = SHAPES_CODE.format(config=SHAPES_CONFIG, steps=steps, repeat=repeat)
    trees = {"after": tree, **({"before": before} if before is not None else {})}
    best: dict = {}
    for _ in range(rounds if before is not None else 1):
        for name, where in trees.items():
            res = json.loads(child(where, ["-c", code]).strip().splitlines()[-1])
            old = best.get(name)
            if old is not None:
                for run in ("shapes", "one_shape", "shapes_simpy"):
                    if old[run]["cpu_s"] < res[run]["cpu_s"]:
                        res[run] = old[run]
            best[name] = res
    for res in best.values():
        res["ratio_cpu"] = res["shapes"]["cpu_s"] / res["one_shape"]["cpu_s"]
        res["simpy_over_fast_cpu"] = res["shapes_simpy"]["cpu_s"] / res["shapes"]["cpu_s"]
    if before is None:
        return best["after"]
    best["shapes_before_over_after_cpu"] = \
        best["before"]["shapes"]["cpu_s"] / best["after"]["shapes"]["cpu_s"]
    return best


# --------------------------------------------------------------------------- rss
def run_child(tree: Path, args: list[str]) -> dict:
    """``simwar run ARGS`` in a fresh process: wall, CPU, peak RSS."""
    t0 = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.Popen([sys.executable, "-m", "simwar", "run", *args], cwd=tree, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode()
    proc.stderr.close()
    if status:
        return {"error": err.strip().splitlines()[-1] if err.strip() else f"status {status}"}
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime,
            "rss_mb": usage.ru_maxrss / 1024, "executor": err.strip()}


def bench_rss(tree: Path, steps_list: list[int], before: bool, simpy_max: int) -> list:
    rows = []
    for steps in steps_list:
        cases = [("default", [])] if before else [("fast", ["--engine", "fast"]),
                                                  ("fast --summary-only",
                                                   ["--engine", "fast", "--summary-only"]),
                                                  ("simpy", ["--engine", "simpy"])]
        for name, extra in cases:
            if ("simpy" in name or before) and steps > simpy_max:
                rows.append({"steps": steps, "engine": name, "skipped":
                             f"more than --simpy-max {simpy_max} steps"})
                continue
            r = run_child(tree, [CONFIG, "--json", "--set", f"steps={steps}", *extra])
            rows.append({"steps": steps, "engine": name, **r})
            print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


# --------------------------------------------------------------------------- run500
def bench_run500(tree: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    best = float("inf")
    for _ in range(5):
        r = run_child(tree, ["--set", "steps=500"])
        best = min(best, r["cpu_s"])
    imports = []
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "simwar", "run",
                               "--set", "steps=500"], cwd=tree, env=env,
                              capture_output=True, text=True)
        total = 0
        for line in proc.stderr.splitlines():
            if line.startswith("import time:") and "|" in line:
                parts = line.split("|")
                if len(parts) == 3 and not parts[2].startswith("  ") and \
                        parts[1].strip().isdigit():
                    total += int(parts[1])
        imports.append(total / 1e6)
    return {"run_cpu_s": best, "imports_s": min(imports), "import_share": min(imports) / best}


# --------------------------------------------------------------------------- sweep
def sweep_spec(steps: int) -> dict:
    return {"base": {"name": "bench", "steps": steps, "warmup_steps": 20},
            "grid": {"algorithm": ["none", "eagle", "dflash", "dspark"],
                     "policy.barrier": ["none", "coarse", "fine", "host_sync"],
                     "cpu.schedule_us": [200.0 + 200 * i for i in range(25)],
                     "phases.sample.body_us": [100.0 + 150 * i for i in range(25)]}}


def bench_sweep(tree: Path, runs: int, steps: int, jobs: int, engine: str | None) -> dict:
    import yaml

    spec = sweep_spec(steps)
    if engine:
        spec["base"]["engine"] = engine
    if runs < 10_000:  # a smaller grid: all 16 policies x algorithms, fewer cost points
        a = min(25, -(-runs // 16))
        b = max(1, min(25, runs // (16 * a)))
        spec["grid"]["cpu.schedule_us"] = spec["grid"]["cpu.schedule_us"][:a]
        spec["grid"]["phases.sample.body_us"] = spec["grid"]["phases.sample.body_us"][:b]
    count = 1
    for values in spec["grid"].values():
        count *= len(values)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sweep.yaml"
        path.write_text(yaml.safe_dump(spec))
        t0 = time.perf_counter()
        before = os.times()
        env = {**os.environ, "PYTHONPATH": str(tree)}
        proc = subprocess.run([sys.executable, "-m", "simwar", "sweep", str(path), "--out",
                               str(Path(tmp) / "out"), "--jobs", str(jobs), "--no-progress"],
                              cwd=tree, env=env, capture_output=True, text=True)
        after = os.times()
        wall = time.perf_counter() - t0
        if proc.returncode:
            raise SystemExit(proc.stderr[-2000:])
    cpu = (after.children_user - before.children_user) + \
        (after.children_system - before.children_system)
    return {"runs": count, "steps": steps, "jobs": jobs, "wall_s": wall, "cpu_s": cpu,
            "runs_per_s": count / wall, "wall_for_10000_runs_s": wall / count * 10000}


# --------------------------------------------------------------------------- quantiles
QUANTILE_KEYS = ("step_us_p50", "step_us_p99", "fwd_gap_us_p50", "launch_lead_us_p50")
NOISY = {"cpu.schedule_us": {"dist": "lognormal", "mean": 5000, "std": 2000},
         "phases.verify.body_us": {"dist": "normal", "mean": 5100, "std": 400},
         "cpu.process_result_us": {"dist": "uniform", "low": 600, "high": 1200}}


def bench_quantiles(steps: int) -> dict:
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from simwar.analysis.streaming import QuantileSketch
    from simwar.api import resolve_sizes
    from simwar.config import load_config
    from simwar.executors import fast

    cfg = load_config(ROOT / CONFIG, {"steps": steps, **NOISY})
    sizes = resolve_sizes(cfg)
    exact = fast.run_config(cfg, sizes).summary
    sketch = fast.run_config(cfg, sizes, summary_only=True).summary
    out = {"config": {k: {"exact": exact[k], "sketch": sketch[k],
                          "rel_error": abs(sketch[k] - exact[k]) / abs(exact[k])
                          if exact[k] else abs(sketch[k])} for k in QUANTILE_KEYS}}
    means = [k for k in exact if k.endswith("_mean") and isinstance(exact[k], float)]
    out["max_mean_rel_error"] = max(abs(sketch[k] - exact[k]) / abs(exact[k])
                                    for k in means if exact[k])
    rng = np.random.default_rng(0)
    worst = 0.0
    for x in (rng.lognormal(8, 0.7, 1_000_000), rng.normal(5000, 500, 1_000_000),
              np.concatenate([rng.normal(-400, 300, 500_000), rng.normal(3000, 900, 500_000)])):
        s = QuantileSketch()
        for chunk in np.array_split(x, 31):
            s.add(chunk)
        for q in (1, 10, 50, 90, 99, 99.9):
            e = np.percentile(x, q)
            worst = max(worst, abs(s.quantile(q) - e) / abs(e))
    out["synthetic_max_rel_error"] = worst
    return out


# --------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("ratio", "ranks", "shapes", "rss", "run500", "sweep",
                                     "quantiles", "all"))
    ap.add_argument("--before", type=Path, help="another simwar source tree to measure")
    ap.add_argument("--steps", type=int, nargs="+")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--simpy-max", type=int, default=100_000,
                    help="largest run given to the SimPy path in rss (1M needs ~25 GiB)")
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--sweep-steps", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--sweep-engine", help="engine: for the sweep's base config")
    args = ap.parse_args()
    tree = (args.before or ROOT).resolve()
    before = args.before is not None
    what = ["ratio", "ranks", "shapes", "rss", "run500", "quantiles", "sweep"] \
        if args.what == "all" \
        else [args.what]
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()}, tree {tree}", file=sys.stderr)
    results = {}
    for w in what:
        if w == "ratio":
            results[w] = bench_ratio(tree, (args.steps or [20_000])[0], args.repeat, before)
        elif w == "ranks":
            results[w] = bench_ranks(tree, (args.steps or [5_000])[0], args.repeat, before)
        elif w == "shapes":
            results[w] = bench_shapes(ROOT.resolve(), (args.steps or [5_000])[0], args.repeat,
                                      args.before.resolve() if before else None)
        elif w == "rss":
            results[w] = bench_rss(tree, args.steps or [10_000, 100_000, 1_000_000], before,
                                   args.simpy_max)
        elif w == "run500":
            results[w] = bench_run500(tree)
        elif w == "sweep":
            results[w] = bench_sweep(tree, args.runs, args.sweep_steps, args.jobs,
                                     args.sweep_engine)
        elif w == "quantiles":
            results[w] = bench_quantiles((args.steps or [1_000_000])[0])
        print(json.dumps({w: results[w]}), flush=True)
    print(f"load average after {os.getloadavg()}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
