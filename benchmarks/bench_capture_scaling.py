"""``simwar import``, ``explain`` and ``import --fit`` of captures of 2.5k, 5k and 15k steps.

    python benchmarks/bench_capture_scaling.py [--steps 2500 5000 15000] [--before DIR]
                                               [--dir DIR] [--repeat 1]

Writes a synthetic capture of ``examples/server.yaml`` per step count (the way
``examples/make_captures.py`` writes the example captures: ``simwar.capture.synthetic``) and
times, each in a fresh process, ``simwar import CAPTURE``, ``simwar explain CAPTURE --json``
and ``simwar import CAPTURE --fit -o FIT.yaml`` (CPU time, user + system: the machine may be
shared). Prints per step count the three times and the ratios explain/import and
fit/import, then each command's growth exponent (the slope of log time over log steps
between the smallest and the largest count: 1 is linear, 2 quadratic). With ``--before DIR``
the same commands of another source tree on the same captures, in the same run, and whether
its ``explain --json`` and fitted YAML are byte-identical to this tree's.

Target (issue 30): explain and fit linear in steps; at 15k steps each takes at most twice
the import of the same file.

Measured (2-core machine shared with other work; one run, ``--before`` a tree of 5229ab6
at 2.5k and 5k steps only, its 15k being minutes)::

    before:
       steps  import s  explain s    fit s  explain/import  fit/import
        2500      3.24       5.56     7.21            1.72        2.23
        5000      6.52      21.02    21.57            3.22        3.31
      growth exponent 2500->5000 steps: import 1.01, explain 1.92, fit 1.58
    this tree (7977a9f):
       steps  import s  explain s    fit s  explain/import  fit/import
        2500      4.02       3.61     6.31            0.90        1.57
        5000      7.60       6.23    10.32            0.82        1.36
       15000     16.31      16.65    36.87            1.02        2.26
      growth exponent 2500->15000 steps: import 0.78, explain 0.85, fit 0.99

The fit's cross-stream walk then scanned every op per step and every later op per wait
(quadratic: a third of the fit's time at 15k steps); it now finds each wait's next kernel by
binary search, and the fit's per-op walks read the trace's columns through memoryviews
(:func:`simwar.fit.layout.columns`: plain floats and ints, no copy). One run, ``--before`` a
tree of 7977a9f::

    before:
       steps  import s  explain s    fit s  explain/import  fit/import
        2500      3.51       2.81     5.11            0.80        1.46
        5000      6.09       5.84    10.12            0.96        1.66
       15000     16.99      16.11    39.73            0.95        2.34
      growth exponent 2500->15000 steps: import 0.88, explain 0.97, fit 1.14
    this tree:
       steps  import s  explain s    fit s  explain/import  fit/import
        2500      2.92       2.63     4.13            0.90        1.41
        5000      5.64       5.87     8.49            1.04        1.51
       15000     19.88      16.90    21.62            0.85        1.09
      growth exponent 2500->15000 steps: import 1.07, explain 1.04, fit 0.92
      2500, 5000 and 15000 steps: explain --json and fitted YAML byte-identical True

The import's code is the same in both trees: its two 15k figures (17.0 and 19.9 s) show this
machine's noise; against the lower, the fit is 1.27x the import (1.26x in an earlier run of
the same change). Explain and fit meet the target.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WRITE = """
import sys
import simwar
from simwar.capture.synthetic import Style, write_kineto
style = Style(names="sglang", batch_ranges=True, record_ids=False, copies=("result_copy",))
run = simwar.simulate(sys.argv[1], {"steps": int(sys.argv[2])}, engine="simpy")
write_kineto(run.trace, sys.argv[3], style=style)
"""


def write_capture(steps: int, path: Path) -> None:
    if path.exists():
        return
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", WRITE, str(ROOT / "examples/server.yaml"), str(steps),
                    str(path)], check=True, env=env)


def timed(tree: Path, args: list[str]) -> tuple[float, bytes]:
    """CPU seconds of ``simwar ARGS`` run from ``tree`` in a fresh process, and its stdout."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-m", "simwar", *args], cwd=tree, env=env,
                          capture_output=True, stdin=subprocess.DEVNULL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"simwar {' '.join(args)} in {tree} failed:\n"
                         f"{proc.stderr.decode()[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc.stdout


def measure(tree: Path, cap: Path, out: Path, repeat: int) -> dict:
    """Best-of-``repeat`` CPU time of the three commands, and explain's JSON and the fit."""
    best: dict[str, float] = {}
    explained = b""
    fit = out / f"{cap.stem}.fit.yaml"
    for _ in range(repeat):
        for what, args in (("import", ["import", str(cap)]),
                           ("explain", ["explain", str(cap), "--json"]),
                           ("fit", ["import", str(cap), "--fit", "-o", str(fit)])):
            t, stdout = timed(tree, args)
            best[what] = min(best.get(what, math.inf), t)
            if what == "explain":
                explained = stdout
    return {**best, "explain_json": explained, "fit_yaml": fit.read_bytes()}


def report(name: str, rows: dict[int, dict]) -> None:
    print(f"{name}:")
    print(f"  {'steps':>6} {'import s':>9} {'explain s':>10} {'fit s':>8} "
          f"{'explain/import':>15} {'fit/import':>11}")
    for n, r in rows.items():
        print(f"  {n:>6} {r['import']:>9.2f} {r['explain']:>10.2f} {r['fit']:>8.2f} "
              f"{r['explain'] / r['import']:>15.2f} {r['fit'] / r['import']:>11.2f}")
    lo, hi = min(rows), max(rows)
    if hi > lo:
        slopes = {what: math.log(rows[hi][what] / rows[lo][what]) / math.log(hi / lo)
                  for what in ("import", "explain", "fit")}
        print(f"  growth exponent {lo}->{hi} steps: "
              + ", ".join(f"{w} {s:.2f}" for w, s in slopes.items()))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, nargs="+", default=[2500, 5000, 15000])
    ap.add_argument("--before", type=Path, help="another simwar source tree to measure")
    ap.add_argument("--before-steps", type=int, nargs="+",
                    help="the step counts for --before (default: --steps; a quadratic "
                         "tree may be too slow at 15k)")
    ap.add_argument("--dir", type=Path, help="where the captures are kept (default: a "
                    "temporary folder)")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        where = (args.dir or Path(tmp)).resolve()
        where.mkdir(parents=True, exist_ok=True)
        caps = {}
        for n in sorted(set(args.steps) | set(args.before_steps or [])):
            caps[n] = where / f"capture_{n}.json.gz"
            write_capture(n, caps[n])
        trees = [("this tree", ROOT, args.steps)]
        if args.before:
            trees.insert(0, ("before", args.before.resolve(), args.before_steps or args.steps))
        results: dict[str, dict[int, dict]] = {}
        for name, tree, steps in trees:
            out = where / name.replace(" ", "_")
            out.mkdir(exist_ok=True)
            results[name] = {n: measure(tree, caps[n], out, args.repeat) for n in sorted(steps)}
        print(f"simwar import / explain / import --fit of synthetic captures of "
              f"examples/server.yaml (CPU s, best of {args.repeat}, fresh processes):")
        for name, rows in results.items():
            report(name, rows)
        if args.before:
            b, a = results["before"], results["this tree"]
            for n in sorted(set(b) & set(a)):
                same_e = b[n]["explain_json"] == a[n]["explain_json"]
                same_f = b[n]["fit_yaml"] == a[n]["fit_yaml"]
                print(f"  {n} steps: explain --json byte-identical {same_e}, "
                      f"fitted YAML byte-identical {same_f}")
                if not (same_e and same_f):
                    return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
