"""``simwar explain`` of a long run: CPU time and peak memory.

    python benchmarks/bench_explain.py [--config configs/dspark_coarse.yaml]
                                       [--steps 200000] [--before DIR] [--before-steps 20000]
                                       [--repeat 2]

``simwar explain CONFIG --set steps=N --json`` in a fresh process: CPU time (user + system),
µs per step and peak RSS. With ``--before DIR`` the same command of another source tree at
``--before-steps`` (a tree that materializes the run's Program and simulates it twice needs
~17 KiB per step), the two interleaved ``--repeat`` times, best of each, and the ratio of
their CPU time per step; their JSON is compared where the step counts agree (pass
``--before-steps`` equal to ``--steps`` for that).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CODE = ("import resource, sys\nfrom simwar.cli import main\nrc = main(sys.argv[1:])\n"
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
        "sys.exit(rc)")


def explain(tree: Path, config: str, steps: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", CODE, "explain", str(ROOT / config), "--set",
                           f"steps={steps}", "--json"], cwd=tree, env=env, capture_output=True,
                          text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"explain in {tree} failed:\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"cpu_s": cpu, "steps": steps, "json": json.loads(proc.stdout),
            "rss_mib": int(proc.stderr.strip().splitlines()[-1]) / 1024}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/dspark_coarse.yaml")
    ap.add_argument("--steps", type=int, default=200_000)
    ap.add_argument("--before", type=Path, help="another simwar source tree to measure")
    ap.add_argument("--before-steps", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    runs = [("this tree", ROOT, args.steps)]
    if args.before:
        runs.insert(0, ("before", args.before.resolve(), args.before_steps))
    best: dict[str, dict] = {}
    for _ in range(args.repeat):
        for name, tree, steps in runs:
            r = explain(tree, args.config, steps)
            if name not in best or r["cpu_s"] < best[name]["cpu_s"]:
                best[name] = r
    print(f"simwar explain {args.config} (best of {args.repeat}, fresh processes):")
    for name, r in best.items():
        print(f"  {name:9s} {r['steps']:>7} steps: {r['cpu_s']:.2f} s CPU "
              f"({1e6 * r['cpu_s'] / r['steps']:.0f} µs per step), peak RSS {r['rss_mib']:.0f} MiB")
    if args.before:
        b, a = best["before"], best["this tree"]
        ratio = (b["cpu_s"] / b["steps"]) / (a["cpu_s"] / a["steps"])
        print(f"  CPU per step, before / now: {ratio:.1f}x")
        if b["steps"] == a["steps"]:
            same = b["json"] == a["json"]
            print(f"  the same JSON: {same}")
            if not same:
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
