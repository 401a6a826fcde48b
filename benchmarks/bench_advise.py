"""``simwar advise`` and ``hazards.detect`` as the phase table grows.

    python benchmarks/bench_advise.py [--phases 3 12 50] [--detect-steps 1000]
                                      [--before DIR] [--repeat 1]

A custom algorithm of P phases (graph kinds full, eager, breakable in turn; each reads
``req_to_token``; the last declares ``post_replay``; 5 ms of body in all), fine barrier:

- **advise**: :func:`simwar.study.advise.advise` with its defaults (every candidate screened
  at 200 steps, the best and the input confirmed at the config's 2000), CPU time in a fresh
  process, and the number of candidates;
- **detect**: :func:`simwar.analysis.hazards.detect` on the SimPy trace of
  ``--detect-steps`` steps of the same config, CPU time (the simulation not counted).

With ``--before DIR`` each measurement also runs on another source tree, interleaved, and
the ratio of the CPU times is printed.
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
import json, sys, time
from simwar.study.advise import advise
cfg = json.loads(sys.argv[1])
t = time.process_time()
a = advise(cfg)
print(json.dumps({"cpu_s": time.process_time() - t, "candidates": len(a.candidates),
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


def child(tree: Path, code: str, cfg: dict) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", code, json.dumps(cfg)], cwd=tree, env=env,
                         capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"failed in {tree}:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phases", type=int, nargs="+", default=[3, 12, 50])
    ap.add_argument("--detect-steps", type=int, default=1000)
    ap.add_argument("--before", type=Path, help="another simwar source tree to measure")
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    trees = {"this tree": ROOT}
    if args.before:
        trees = {"before": args.before.resolve(), **trees}
    for what, code, make in (
            ("advise", ADVISE, lambda p: config(p)),
            ("detect", DETECT, lambda p: {**config(p, args.detect_steps), "warmup_steps": 10})):
        for p in args.phases:
            best: dict[str, dict] = {}
            for _ in range(args.repeat):
                for name, tree in trees.items():
                    r = child(tree, code, make(p))
                    if name not in best or r["cpu_s"] < best[name]["cpu_s"]:
                        best[name] = r
            extra = (f", {best['this tree']['candidates']} candidates" if what == "advise"
                     else f", {args.detect_steps} steps")
            line = f"{what:6s} {p:>3} phases{extra}: " + "; ".join(
                f"{name} {r['cpu_s']:.2f} s CPU" for name, r in best.items())
            if args.before:
                ratio = best["before"]["cpu_s"] / best["this tree"]["cpu_s"]
                line += f" (before / now: {ratio:.1f}x)"
                if what == "advise" and best["before"]["best"] != best["this tree"]["best"]:
                    line += " DIFFERENT ADVICE"
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
