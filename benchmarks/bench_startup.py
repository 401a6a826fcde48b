"""Start-up: ``simwar run`` of 500 steps, where its imports go, and planning a Program.

    python benchmarks/bench_startup.py [--before DIR] [--repeat 10] [--instructions]

- **run 500**: ``simwar run --set steps=500 --quiet`` in a fresh process, CPU time (user +
  system, children's rusage), best of ``--repeat``; with ``--before`` the other tree's runs
  are interleaved with this one's (drifts of a shared machine hit both alike) and their
  ratio printed. Measured in four modes: as this environment runs Python (it sets
  ``PYTHONDONTWRITEBYTECODE``, so simwar's modules are compiled at every start), with a
  bytecode cache (``PYTHONPYCACHEPREFIX`` in a temporary directory, warmed first), both
  with the cache of validated configs empty (``SIMWAR_CACHE_DIR``, a new directory for each
  run: the first run of an install, writing its entries); *new config*: with the bytecode
  cache and a cache holding only the validator's schema that an earlier run wrote (a config
  not run before, on an install that has run one: validated, its validator built from that
  schema); and with both caches warm (a repeat run: its config read back from the cache,
  :mod:`simwar.config.cache`). A tree without these caches validates as in the first modes.
- **floor**: the same, of a process that only imports the libraries such a run loads before
  any of simwar runs (numpy, yaml, pydantic and the parts of it a validation loads; with the
  settings :mod:`simwar.cli` makes first, its garbage collector's included, and without
  ``importlib.metadata``, which it defers), in the same
  modes, interleaved with the runs: what the start-up cannot go below while it imports them
  (``run 500`` minus it is simwar's own share). A repeat run reads no YAML: its floor leaves
  yaml out.
- **imports**: ``python -X importtime`` of that run, the smallest self time of each module
  over ``--repeat`` runs, summed by package (simwar, numpy, pydantic, ...).
- **instructions** (``--instructions``, needs valgrind): the same runs and floor, once each
  under ``valgrind --tool=callgrind``, counted in instructions executed: a measure that the
  machine's load does not move (CPU time on a shared machine moves by more than a change of
  a few milliseconds), with the before / now ratio and this tree's own share in each mode.
- **plan_program**: :func:`simwar.executors.fast.plan_program` of the Program of
  ``configs/dspark_fine.yaml`` at ``--plan-steps`` steps, µs per host op, best of 3, in a
  fresh process per tree.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: the cache of validated configs (:mod:`simwar.config.cache`): empty (the first run of an
#: install), holding only the validator's schema (a config not run before, on an install that
#: has run one), or holding this run's config too (a repeat run)
COLD, SCHEMA, WARM = "empty", "the validator's schema", "warm"
RUN = ["-c", "import sys; from simwar.cli import main; sys.exit(main())", "run", "--set",
       "steps=500", "--quiet"]
#: a process importing only what ``simwar run`` imports of other packages (its floor)
#: (with the settings the command line makes before them: one OpenBLAS thread, no plugins,
#: the garbage collector off during the imports and everything frozen at the exit; with the
#: plugins off the command line defers ``importlib.metadata``, which pydantic's plugin
#: loader imports, so the floor leaves that loader out: its own code is a few lines)
FLOOR = ["-c", "import gc, os; gc.disable(); "
         "os.environ.setdefault('OPENBLAS_NUM_THREADS', '1'); "
         "os.environ.setdefault('PYDANTIC_DISABLE_PLUGINS', '__all__'); "
         "import argparse, numpy, yaml, annotated_types, pydantic, pydantic.main, "
         "pydantic.types; gc.freeze()"]
#: the floor of a repeat run (its config from the cache: no YAML read)
FLOOR_WARM = [FLOOR[0], FLOOR[1].replace(" yaml,", "")]
#: mode -> (a bytecode cache, what the cache of validated configs holds: nothing, only the
#: validator's schema that an earlier run wrote, or this run's config too)
MODES = {"no bytecode cache": (False, COLD), "bytecode cached": (True, COLD),
         "new config": (True, SCHEMA), "both caches warm": (True, WARM)}
PLAN = """
import json, sys, time
from simwar.api import build_program
from simwar.config import load_config
from simwar.executors.fast.plan import plan_program
p = build_program(load_config("configs/dspark_fine.yaml", {"steps": int(sys.argv[1])}))
best = min((lambda t: (plan_program(p), time.process_time() - t)[1])(time.process_time())
           for _ in range(3))
print(json.dumps({"host_ops": len(p.ops), "us_per_op": 1e6 * best / len(p.ops)}))
"""


#: the temporary directories of a measurement (bytecode and config caches), removed at its end
SCRATCH = Path(tempfile.mkdtemp(prefix="simwar-startup-"))


def scratch(what: str) -> str:
    """A new, empty directory under :data:`SCRATCH`."""
    return tempfile.mkdtemp(prefix=f"{what}-", dir=SCRATCH)


def with_schema(warm: str) -> str:
    """A new cache directory holding only the validator's schema of the cache ``warm`` (an
    empty one for a tree that keeps none)."""
    new = scratch("cfg")
    kept = Path(warm) / "configs" / "validator"
    if kept.exists():
        (Path(new) / "configs").mkdir(mode=0o700)
        shutil.copy2(kept, Path(new) / "configs" / "validator")
    return new


def env_for(tree: Path, pyc: str | None, configs: str | None = None) -> dict:
    """The environment of a run of ``tree``: with the bytecode cache ``pyc`` (or none) and the
    cache of validated configs in ``configs`` (or a new, empty directory)."""
    env = {**os.environ, "PYTHONPATH": str(tree),
           "SIMWAR_CACHE_DIR": configs or scratch("cfg")}
    env.pop("SIMWAR_NO_CACHE", None)
    if pyc is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pyc
    return env


def args_cwd(name: str, mode: str, trees: dict) -> tuple[list[str], Path]:
    """The command line and directory of a case: a tree's run, or the floor of a mode."""
    if name == "floor":
        return (FLOOR_WARM if MODES[mode][1] == WARM else FLOOR), ROOT
    return RUN, trees[name]


def cpu_of(args: list[str], env: dict, cwd: Path) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, *args], env=env, cwd=cwd, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def run500(trees: dict, repeat: int) -> dict:
    """Best CPU time of each (tree, mode), and of the floor per mode (tree ``floor``)."""
    pyc = scratch("pyc")
    configs = {name: scratch("cfg") for name in trees}
    cases = {(name, mode): (tree, MODES[mode]) for name, tree in {**trees, "floor": ROOT}.items()
             for mode in MODES}

    def once(k, case):
        tree, (cached, held) = case
        warm = configs.get(k[0])
        env = env_for(tree, pyc if cached else None,
                      warm if held == WARM else with_schema(warm) if held == SCHEMA and warm
                      else None)
        args, cwd = args_cwd(*k, trees)
        return cpu_of(args, env, cwd)

    for k, env in cases.items():  # warm-up: the bytecode cache, the disk cache
        once(k, env)
    best = {k: float("inf") for k in cases}
    for _ in range(repeat):
        for k, env in cases.items():
            best[k] = min(best[k], once(k, env))
    return best


def instructions(trees: dict) -> dict:
    """Instructions executed (callgrind's ``Ir``) of each (tree, mode) and of the floor."""
    pyc = scratch("pyc")
    out = {}
    for name, tree in {**trees, "floor": ROOT}.items():
        for mode, (cached, held) in MODES.items():
            env = {**env_for(tree, pyc if cached else None), "PYTHONHASHSEED": "0"}
            args, cwd = args_cwd(name, mode, trees)
            subprocess.run([sys.executable, *args], env=env, cwd=cwd, check=True,
                           stdout=subprocess.DEVNULL)  # warms the bytecode cache (and configs)
            if held == COLD:  # a first run: the cache of validated configs empty
                env["SIMWAR_CACHE_DIR"] = scratch("cfg")
            elif held == SCHEMA:  # a new config: only the validator's schema kept
                env["SIMWAR_CACHE_DIR"] = with_schema(env["SIMWAR_CACHE_DIR"])
            err = subprocess.run(["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
                                  sys.executable, *args], env=env, cwd=cwd, check=True,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                 text=True).stderr
            out[(name, mode)] = int(re.search(r"Collected : (\d+)", err).group(1))
    return out


def imports(tree: Path, repeat: int) -> dict:
    best: dict[str, int] = {}
    for _ in range(repeat):
        err = subprocess.run([sys.executable, "-X", "importtime", *RUN], cwd=tree,
                             env=env_for(tree, None), capture_output=True, text=True).stderr
        seen = collections.Counter()
        for line in err.splitlines():
            m = re.match(r"import time:\s+(\d+) \|\s+\d+ \|\s*(\S+)", line)
            if m:
                seen[m.group(2)] += int(m.group(1))
        for k, v in seen.items():
            best[k] = min(best.get(k, v), v)
    groups = collections.Counter()
    for k, v in best.items():
        top = k.split(".")[0]
        groups[top if top in ("simwar", "numpy", "pydantic", "pydantic_core", "yaml",
                              "annotated_types") else "stdlib and others"] += v
    return {k: v / 1000 for k, v in groups.most_common()}


def plan_us(tree: Path, steps: int) -> dict:
    out = subprocess.run([sys.executable, "-c", PLAN, str(steps)], cwd=tree,
                         env=env_for(tree, None), capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])



def _print_rows(figures: dict, trees: dict, before, cell, places: int, tail) -> None:
    """One line per bytecode mode: each tree's figure (``cell``), before / now where there is
    a before tree (``places`` decimals), and ``tail`` of (floor, this tree's own share, the
    before tree's own share or None)."""
    for mode in MODES:
        line = "  %-18s" % mode + "".join(f"  {name}: {cell(figures[(name, mode)])}"
                                          for name in trees)
        now, floor = figures[("this tree", mode)], figures[("floor", mode)]
        if before:
            line += f"  (before / now: {figures[('before', mode)] / now:.{places}f}x)"
        was = figures[("before", mode)] - floor if before else None
        print(line + "; " + tail((floor, now - floor, was)))

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="another simwar source tree to measure")
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--plan-steps", type=int, default=20_000)
    ap.add_argument("--instructions", action="store_true",
                    help="also count each run's instructions under valgrind (load-independent)")
    args = ap.parse_args()
    trees = {"this tree": ROOT}
    if args.before:
        trees = {"before": args.before.resolve(), **trees}
    best = run500(trees, args.repeat)
    print("simwar run --set steps=500: CPU s (best of %d)" % args.repeat)
    _print_rows(best, trees, args.before, lambda v: f"{v:.3f} s", 2,
                lambda own: f"floor (its libraries' imports) {own[0]:.3f} s, this tree's own share "
                            f"{own[1]:.3f} s")
    if args.instructions:
        print("simwar run --set steps=500: instructions executed (callgrind), millions")
        _print_rows({k: v / 1e6 for k, v in instructions(trees).items()}, trees, args.before,
                    lambda v: f"{v:.0f}", 3,
                    lambda own: f"floor {own[0]:.0f}, this tree's own share {own[1]:.0f}"
                                + (f" (before: {own[2]:.0f})" if own[2] is not None else ""))
    for name, tree in trees.items():
        groups = imports(tree, max(3, args.repeat // 2))
        parts = ", ".join(f"{k} {v:.0f}" for k, v in groups.items())
        print(f"imports of {name}, ms (self times, smallest of runs): total "
              f"{sum(groups.values()):.0f}; {parts}")
    for name, tree in trees.items():
        r = plan_us(tree, args.plan_steps)
        print(f"plan_program of {name}: {r['us_per_op']:.2f} µs per host op "
              f"({r['host_ops']} host ops)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    finally:
        shutil.rmtree(SCRATCH, ignore_errors=True)
