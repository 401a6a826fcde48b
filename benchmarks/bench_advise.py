"""``simwar advise`` and ``hazards.detect`` as the phase table grows.

    python benchmarks/bench_advise.py [--phases 3 12 50] [--detect-steps 1000]
                                      [--before DIR] [--repeat 1] [--jobs N]
    python benchmarks/bench_advise.py --breakdown 8 [--phases 50] [--before DIR]
    python benchmarks/bench_advise.py --structures [--phases 50]

A custom algorithm of P phases (graph kinds full, eager, breakable in turn; each reads
``req_to_token``; the last declares ``post_replay``; 5 ms of body in all), fine barrier:

- **advise**: :func:`simwar.study.advise.advise` with its defaults (every candidate screened
  at 200 steps, the best and the input confirmed at the config's 2000) in a fresh process,
  and the number of candidates: with one process (``jobs=1``: CPU time, the figure
  comparable with a tree that has no ``jobs``) and with ``--jobs`` processes (default 0: one
  per core; wall-clock time, and the CPU time of the process and its workers);
- **detect**: :func:`simwar.analysis.hazards.detect` on the SimPy trace of
  ``--detect-steps`` steps of the same config, CPU time (the simulation not counted).

With ``--before DIR`` each measurement also runs on another source tree, interleaved, and
the ratios are printed: CPU time at one process, and the other tree's time against this
tree's wall-clock time with its jobs (a tree whose ``advise`` takes no ``jobs`` screens in
one process: its CPU time is its wall-clock time, but for what else runs on the machine).

``--breakdown K``: where the screen's time goes, per candidate, for every K-th candidate
of the space (the confirming runs left out): the CPU time of the screen unprofiled, split
by cProfile's cumulative times (scaled to it) into the candidate's config, the plan
(``plan_config``), the race plan (with a family's one pass over its unions,
:mod:`simwar.executors.fast.famraces`), code generation and ``compile``, the pass with its
per-step table and races (a family's lanes in lockstep too,
:mod:`simwar.executors.lockstep.family`), the union of a family's shapes
(:mod:`simwar.executors.fast.union`), the summary, ``simulate``'s own work (the executor's
choice, the checks, the result) and the rest (the search around the screen).

``--structures``: how many candidates the screen runs, how many distinct programs they are
(lockstep groups: :func:`simwar.executors.lockstep.group_key` of each screened plan), and
how many *families*: programs equal but for the forward stream's records (where read-done
is published) and what waits and syncs bind to, i.e. what sharing one program among
candidates that differ only in where read-done is published would have to run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def config(phases: int, steps: int = 2000) -> dict:
    table = []
    for i in range(phases):
        table.append({"name": f"p{i}", "graph": ("full", "eager", "breakable")[i % 3],
                      "load_batch_us": 5.0, "prep_us": 10.0, "body_us": 5000.0 / phases,
                      "host_us": 10.0, "reads": ["req_to_token"],
                      "read_ends": "post_replay" if i == phases - 1 else "unknown"})
    return {"name": f"custom-{phases}", "algorithm": "custom", "phases": table,
            "steps": steps, "policy": {"barrier": "fine"}}


ADVISE = """
import inspect, json, resource, sys, time
from simwar.study.advise import advise
cfg, jobs = json.loads(sys.argv[1]), int(sys.argv[2])
kw = {"jobs": jobs} if "jobs" in inspect.signature(advise).parameters else {}
w, t = time.perf_counter(), time.process_time()
a = advise(cfg, **kw)
wall, cpu = time.perf_counter() - w, time.process_time() - t
kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # the workers, ended and waited for
print(json.dumps({"cpu_s": cpu + kids.ru_utime + kids.ru_stime, "wall_s": wall,
                  "candidates": len(a.candidates), "jobs": kw.get("jobs", 1),
                  "best": a.best.description if a.best else None}))
"""

DETECT = """
import json, sys, time
import simwar
from simwar.analysis.hazards import detect
cfg = json.loads(sys.argv[1])
trace = simwar.simulate(cfg, engine="simpy").trace
t = time.process_time()
h = detect(trace)
print(json.dumps({"cpu_s": time.process_time() - t, "races": len(h.races)}))
"""

BREAKDOWN = """
import cProfile, json, pstats, sys, time
from simwar.study import advise as A
cfg, every = json.loads(sys.argv[1]), int(sys.argv[2])
space = A.space
A.space = lambda c: space(c)[::every]  # every K-th candidate (the input is the first)
kw = {"confirm": False}
if "jobs" in A.advise.__code__.co_varnames:
    kw["jobs"] = 1
A.advise(cfg, **kw)  # imports and first-use costs out of the way
# others, none compiled yet (and the input, which advise needs: compiled, so left uncounted)
A.space = lambda c: (lambda s: s[:1] + s[1::every])(space(c))
t = time.process_time()
n = len(A.advise(cfg, **kw).candidates) - 1
cpu = time.process_time() - t
A.space = lambda c: (lambda s: s[:1] + s[2::every])(space(c))
prof = cProfile.Profile()
prof.enable()
A.advise(cfg, **kw)
prof.disable()
stats = pstats.Stats(prof).stats
def cum(file, name):
    return sum(v[3] for (f, _, fn), v in stats.items() if f.endswith(file) and fn == name)
total = cum("study/advise.py", "advise")
parts = {"config": cum("config/load.py", "load_config")
         + cum("study/advise.py", "candidate_config"),
         "plan_config": cum("fast/plan.py", "plan_config"),
         # (a family's windows from one pass over its unions: famraces, where it has one)
         "race plan": cum("fast/races.py", "_plan_windows")
         + cum("fast/famraces.py", "family_windows"),
         "codegen + compile": cum("fast/codegen.py", "compile_block"),
         "family's union": cum("fast/union.py", "family_codes"),
         "summary": cum("fast/execute.py", "summary")
         + cum("lockstep/family.py", "_summaries")}
# (a family's members as lanes of one lockstep pass: lockstep/family.py, where it has one)
run = (cum("executors/fast/__init__.py", "run_config")
       + cum("executors/fast/__init__.py", "run_family")
       + cum("lockstep/family.py", "run_family"))
# what the screen calls: a Runner's run or run_family (none where it ran the executor
# itself, or simulate)
calls = (cum("simwar/api.py", "run") + cum("simwar/api.py", "run_family")
         or cum("simwar/api.py", "simulate"))
parts["simulate's own"] = calls - run - parts["summary"] if calls else 0.0
parts["pass, table, races"] = (run - parts["plan_config"] - parts["race plan"]
                               - parts["codegen + compile"] - parts["family's union"])
parts["the rest"] = total - sum(parts.values())
ms = {k: 1000 * cpu / n * v / total for k, v in parts.items()}
print(json.dumps({"cpu_s": cpu, "candidates": n, "ms": ms}))
"""


STRUCTURES = """
import collections, json, sys
from simwar.builder.sizes import draw_sizes
from simwar.config import load_config
from simwar.executors.fast.plan import plan_config
from simwar.executors.lockstep import group_key
from simwar.study import advise as A
cfg = load_config(json.loads(sys.argv[1]))
base = load_config(cfg, {"steps": A.SCREEN_STEPS, "warmup_steps": A.SCREEN_WARMUP})
def strip(h):  # a host op without the forward stream's records and what binds to them
    if h.kind == "record" and h.stream == "forward":
        return None
    if h.kind == "graph":
        return h._replace(nodes=tuple(n for n in h.nodes if n.kind != "r"))
    if h.kind in ("wait_event", "sync") and h.bind is not None:
        return h._replace(bind="bound")
    return h
cands = A.space(cfg)
groups, families, shapes = set(), collections.Counter(), set()
for c in cands:
    run = A.candidate_config(base, c.overrides)
    plan = plan_config(run, draw_sizes(run))
    groups.add(group_key(plan))
    shapes.update(b.shape for b in plan.blocks)
    families[tuple(tuple(x for x in map(strip, b.shape.host) if x is not None)
                   for b in plan.blocks)] += 1
print(json.dumps({"candidates": len(cands), "programs": len(groups), "shapes": len(shapes),
                  "families": sorted(families.values(), reverse=True)}))
"""


def child(tree: Path, code: str, *args) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], cwd=tree, env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"failed in {tree}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def breakdown(trees: dict, phases: list[int], every: int) -> None:
    for p in phases:
        rows = {name: child(tree, BREAKDOWN, json.dumps(config(p)), every)
                for name, tree in trees.items()}
        print(f"breakdown, {p} phases, every {every}th candidate, ms of CPU per candidate:")
        keys = list(dict.fromkeys(k for r in rows.values() for k in r["ms"]))
        print(f"  {'':30s}" + "".join(f"{name:>12s}" for name in rows))
        for k in keys:
            print(f"  {k:30s}" + "".join(f"{r['ms'].get(k, 0.0):12.2f}" for r in rows.values()))
        print(f"  {'total':30s}" + "".join(f"{1000 * r['cpu_s'] / r['candidates']:12.2f}"
                                         for r in rows.values()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", type=int, nargs="+", default=[3, 12, 50])
    ap.add_argument("--detect-steps", type=int, default=1000)
    ap.add_argument("--before", type=Path, help="another simwar source tree to measure")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=0,
                    help="advise's processes for the second measurement (0: one per "
                         "core, the command's default)")
    ap.add_argument("--breakdown", type=int, metavar="K",
                    help="only the screen's breakdown, over every K-th candidate")
    ap.add_argument("--structures", action="store_true",
                    help="only count the candidates, their programs and their families")
    args = ap.parse_args()
    if args.structures:
        for p in args.phases:
            r = child(ROOT, STRUCTURES, json.dumps(config(p)))
            fam = r["families"]
            print(f"{p} phases: {r['candidates']} candidates, {r['programs']} distinct "
                  f"programs ({r['shapes']} distinct shapes), {len(fam)} families but for "
                  f"where read-done is published (sizes {fam})")
        return 0
    trees = {"this tree": ROOT}
    if args.before:
        trees = {"before": args.before.resolve(), **trees}
    if args.breakdown:
        breakdown(trees, args.phases, args.breakdown)
        return 0
    runs = [(name, tree, 1) for name, tree in trees.items()]
    if args.jobs != 1:
        runs.append(("this tree", ROOT, args.jobs))
    for p in args.phases:
        best: dict[tuple, dict] = {}
        for _ in range(args.repeat):
            for name, tree, jobs in runs:
                r = child(tree, ADVISE, json.dumps(config(p)), jobs)
                key = (name, jobs)
                by = "cpu_s" if jobs == 1 else "wall_s"  # the figure each is compared by
                if key not in best or r[by] < best[key][by]:
                    best[key] = r
        now, many = best[("this tree", 1)], best.get(("this tree", args.jobs))
        line = f"advise {p:>3} phases, {now['candidates']} candidates: " + "; ".join(
            f"{name} {r['cpu_s']:.2f} s CPU" for (name, jobs), r in best.items() if jobs == 1)
        if many is not None:
            line += (f"; this tree with {many['jobs'] or 'one per core'} jobs: "
                     f"{many['wall_s']:.2f} s wall, {many['cpu_s']:.2f} s CPU")
        if args.before:
            before = best[("before", 1)]
            line += f" (before / now: {before['cpu_s'] / now['cpu_s']:.2f}x CPU at 1 job"
            if many is not None:
                line += f", {before['wall_s'] / many['wall_s']:.2f}x wall with the jobs"
            line += ")"
            if any(r["best"] != before["best"] for r in best.values()):
                line += " DIFFERENT ADVICE"
        print(line, flush=True)
    for p in args.phases:
        best = {}
        for _ in range(args.repeat):
            for name, tree in trees.items():
                r = child(tree, DETECT, json.dumps({**config(p, args.detect_steps),
                                                    "warmup_steps": 10}))
                if name not in best or r["cpu_s"] < best[name]["cpu_s"]:
                    best[name] = r
        line = f"detect {p:>3} phases, {args.detect_steps} steps: " + "; ".join(
            f"{name} {r['cpu_s']:.2f} s CPU" for name, r in best.items())
        if args.before:
            line += f" (before / now: {best['before']['cpu_s'] / best['this tree']['cpu_s']:.1f}x)"
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
