"""Memory of a full trace, and the cost of a windowed timeline.

    python benchmarks/bench_trace.py [--config configs/dspark_fine.yaml] [--small 2000]
                                     [--large 42000] [--timeline-config configs/dspark_coarse.yaml]
                                     [--window-steps 2000 20000]

- **Memory per simulated step**: the peak RSS of a process that simulates the
  config with its full Trace kept (``simwar.simulate``: program, engine, trace,
  per-step table, races), at ``--small`` and ``--large`` steps, each in a fresh
  process; the difference over the difference of steps is what one more step
  costs. Also the bytes of the Trace's own columns per step.
- **Windowed timeline**: ``--timeline`` of steps 20..22 (of the coarse DSPARK config by
  default: a bubble before every forward, each explained) on runs of each
  ``--window-steps`` length: the time of the run alone and of the run plus the
  figure (process CPU time, so other load on the machine matters less), both in
  one fresh process each.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

MEMORY = """
import json, inspect, resource, sys
import simwar
ENGINE = {"engine": "simpy"} if "engine" in inspect.signature(simwar.simulate).parameters else {}
r = simwar.simulate(sys.argv[1], {"steps": int(sys.argv[2])}, **ENGINE)
t = r.trace
tables = () if isinstance(t.spans, list) else (t.spans, t.ops, t.accesses, t.markers)  # v1: lists
columns = sum(a.nbytes for tab in tables for a in tab.columns().values())
print(json.dumps({"peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "trace_column_bytes": columns, "strings": len(getattr(t, "strings", []))}))
"""

TIMELINE = """
import json, inspect, sys, time
import simwar
from simwar import plots
# the reference engine (the timeline needs its trace), where simulate() offers a choice
ENGINE = {"engine": "simpy"} if "engine" in inspect.signature(simwar.simulate).parameters else {}
t0 = time.process_time()
r = simwar.simulate(sys.argv[1], {"steps": int(sys.argv[2])}, **ENGINE)
t1 = time.process_time()
if sys.argv[3] == "1":
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    fig = plots.stall_figure(r, (20, 22))
    FigureCanvasAgg(fig)
    fig.savefig("/dev/null", format="png", dpi=110)
t2 = time.process_time()
print(json.dumps({"run_s": t1 - t0, "timeline_s": t2 - t1}))
"""


def child(code: str, *args) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/dspark_fine.yaml")
    ap.add_argument("--small", type=int, default=2000)
    ap.add_argument("--large", type=int, default=42000)
    ap.add_argument("--timeline-config", default="configs/dspark_coarse.yaml")
    ap.add_argument("--window-steps", type=int, nargs="*", default=[2000, 20000])
    args = ap.parse_args()

    small = child(MEMORY, args.config, args.small)
    large = child(MEMORY, args.config, args.large)
    per_step = (large["peak_rss_kib"] - small["peak_rss_kib"]) / (args.large - args.small)
    print(f"{args.config}: peak RSS {small['peak_rss_kib'] / 1024:.0f} MiB at {args.small} "
          f"steps, {large['peak_rss_kib'] / 1024:.0f} MiB at {args.large}: "
          f"{per_step:.2f} KiB per simulated step; the trace's columns "
          f"{large['trace_column_bytes'] / args.large / 1024:.2f} KiB per step")
    for steps in args.window_steps:
        alone = child(TIMELINE, args.timeline_config, steps, 0)
        drawn = child(TIMELINE, args.timeline_config, steps, 1)
        print(f"  {steps} steps: run {alone['run_s']:.2f} s CPU; timeline of steps 20..22 "
              f"{drawn['timeline_s']:.2f} s CPU ({drawn['timeline_s'] / alone['run_s']:.2f}x "
              f"the run)")


if __name__ == "__main__":
    main()
