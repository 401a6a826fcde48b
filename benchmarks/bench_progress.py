"""How long a fast run goes without a progress report: the largest gap between two calls.

Usage: ``python benchmarks/bench_progress.py [--steps 3000000]``.

For each config (the shipped DSPARK fine barrier, the bimodal workload, and a custom
60-phase eager table, the largest iteration shape) it runs ``simulate(..., engine="fast")``
with a progress callback and prints, in one run: the time before the pass (sizes, plan),
the pass and the largest gap between two of its reports, and the time from its last report
to the end (the analysis, which ``simwar run``'s bar labels "analysing"). Before the
executor reported per chunk, the whole run was one silent gap. The target: no gap above
0.5 s in the pass.
"""

from __future__ import annotations

import argparse
import os
import time

import simwar

CUSTOM = {"name": "60-phases", "algorithm": "custom", "warmup_steps": 20,
          "phases": [{"name": f"p{i}", "graph": "eager", "body_us": 10, "load_batch_us": 2,
                      "reads": ["req_to_token"]} for i in range(60)]}


def measure(cfg, overrides: dict) -> dict:
    stamps: list[tuple[float, int]] = []
    started = time.perf_counter()
    simwar.simulate(cfg, overrides, engine="fast",
                    progress=lambda step: stamps.append((time.perf_counter(), step)))
    ended = time.perf_counter()
    during = [t for t, s in stamps[:-1]]  # the reports of the pass (the last one: the end)
    gaps = [b - a for a, b in zip(during, during[1:])]
    return {"total_s": ended - started, "before_s": during[0] - started,
            "pass_s": during[-1] - during[0], "reports": len(during),
            "max_gap_s": max(gaps) if gaps else float("nan"), "after_s": ended - during[-1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3_000_000)
    args = parser.parse_args()
    root = os.path.join(os.path.dirname(__file__), "..", "configs")
    cases = [("dspark_fine", os.path.join(root, "dspark_fine.yaml"), args.steps),
             ("dspark_fine_bimodal", os.path.join(root, "dspark_fine_bimodal.yaml"), args.steps),
             ("custom 60 phases", CUSTOM, max(1000, args.steps // 20))]
    print(f"load average {os.getloadavg()[0]:.2f}")
    print(f"{'config':<20} {'steps':>9} {'run s':>6} {'before s':>9} {'pass s':>7} "
          f"{'reports':>8} {'max gap s':>10} {'after s':>8}")
    for name, cfg, steps in cases:
        m = measure(cfg, {"steps": steps})
        print(f"{name:<20} {steps:>9} {m['total_s']:>6.2f} {m['before_s']:>9.2f} "
              f"{m['pass_s']:>7.2f} {m['reports']:>8} {m['max_gap_s']:>10.3f} "
              f"{m['after_s']:>8.2f}")
    print("before s: sizes and plan, before the pass; after s: the analysis after it (simwar "
          "run's bar says 'analysing'); max gap: between two reports in the pass (target "
          "<= 0.5 s; before this executor reported per chunk, the whole run was one gap)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
