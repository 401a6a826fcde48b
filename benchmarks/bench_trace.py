"""Memory of a full trace, the cost of a windowed timeline, and the streaming Perfetto export.

    python benchmarks/bench_trace.py [memory|timeline|export|breakdown|all]
                                     [--config configs/dspark_fine.yaml] [--small 2000]
                                     [--large 42000] [--timeline-config configs/dspark_coarse.yaml]
                                     [--window-steps 2000 20000]
                                     [--export-steps 100000] [--before DIR] [--before-steps 10000]

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
- **Export** (``simwar run --trace``): the whole command on ``--config`` at
  ``--export-steps`` in a fresh process, as a repeat run (each tree its own cache of
  validated configs, so the first of its runs validates the config and the others read it
  back, as a user's repeat runs do): CPU time (user + system), steps per CPU-second,
  peak RSS and the file's size; with ``--before DIR`` the same command of another source
  tree at ``--before-steps`` (a tree whose export holds the whole run in memory needs
  ~60 KiB per step), the two runs interleaved ``--repeat`` times, best of each, and the
  ratio of their CPU time per step; at equal steps, whether the two files are the same bytes.
- **Breakdown** of the export at ``--export-steps`` (CPU time, best of ``--repeat``, fresh
  processes): ``simwar run`` without ``--trace`` (the imports and the summary's run), the
  trace mode's pass alone (its windows made and dropped), the run's one pass that makes its
  summary and its windows at once (what ``run --trace`` runs; in a tree before it, the run
  and then the trace mode's pass), and the pass with the writer into
  a sink that keeps nothing, the writer split into its text (the rows' bytes:
  ``simwar.plots.jsoncols.write_rows``, ``rows`` in a tree without it) and the rest
  (groups, names, tracks, flows' bindings, counters). What the whole command costs beyond
  these is the file's writing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

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


BREAKDOWN = """
import json, sys, time
from simwar.api import trace_windows
from simwar.config import load_config
from simwar.plots import perfetto
cfg = load_config(sys.argv[1], {"steps": int(sys.argv[2])})
cpu = time.process_time
out = {"pass_s": 0.0, "writer_s": 0.0, "text_s": 0.0}
if sys.argv[3] == "onepass":  # the run's pass making its summary and its windows
    from simwar.api import Runner
    runner = Runner(cfg, "fast")
    if hasattr(runner, "trace_stream"):
        t = cpu()
        runner.run(trace=(runner.trace_stream(), lambda w: None))
        out["pass_s"] = cpu() - t
    else:  # a tree before the one pass: the run, then the trace mode's own
        t = cpu()
        runner.run()
        for w in trace_windows(cfg)[0]:
            pass
        out["pass_s"] = cpu() - t
    print(json.dumps(out))
    sys.exit(0)
windows, lanes, meta = trace_windows(cfg)
if sys.argv[3] == "pass":
    t = cpu()
    for w in windows:
        pass
    out["pass_s"] = cpu() - t
else:
    # the rows' text: write_rows where the writer has it (its sink here keeps nothing), else
    # rows (a tree before write_rows: the block handed to the writer's write)
    hook = "write_rows" if hasattr(perfetto, "write_rows") else "rows"
    make = getattr(perfetto, hook)
    def timed(*parts):
        t = cpu()
        block = make(*parts)
        out["text_s"] += cpu() - t
        return block
    setattr(perfetto, hook, timed)
    class Sink:
        def write(self, data):
            pass
    writer = perfetto.ChromeTraceWriter(Sink(), lanes, meta)
    it = iter(windows)
    t = cpu()
    for w in it:
        a = cpu()
        writer.add(w)
        out["writer_s"] += cpu() - a
    writer.close()
    out["pass_s"] = cpu() - t - out["writer_s"]
print(json.dumps(out))
"""


def child(code: str, *args) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def export(tree: Path, config: str, steps: int, out: Path, cache: Path) -> dict:
    """``simwar run CONFIG --set steps=N --trace OUT --quiet`` in a fresh process, its
    validated configs cached in ``cache`` (each tree its own: the trees' entries for one
    config file would each replace the other's, every run validating afresh)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "SIMWAR_CACHE_DIR": str(cache)}
    code = ("import resource, sys\nfrom simwar.cli import main\nrc = main(sys.argv[1:])\n"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr)\n"
            "sys.exit(rc)")
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", code, "run", str(ROOT / config), "--set",
                           f"steps={steps}", "--trace", str(out), "--quiet"], cwd=tree, env=env,
                          capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode:
        raise SystemExit(f"export in {tree} failed:\n{proc.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    size = out.stat().st_size
    digest = hashlib.sha256()
    with open(out, "rb") as fh:  # what was written, to compare the trees' files
        for block in iter(lambda: fh.read(1 << 24), b""):
            digest.update(block)
    out.unlink()
    return {"cpu_s": cpu, "rss_mib": int(proc.stderr.strip().splitlines()[-1]) / 1024,
            "mb": size / 1e6, "steps": steps, "sha256": digest.hexdigest()}


def bench_export(args) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="simwar-export-"))
    runs = [("this tree", ROOT, args.export_steps)]
    if args.before:
        runs.insert(0, ("before", args.before.resolve(), args.before_steps))
    best: dict[str, dict] = {}
    for _ in range(args.repeat):
        for name, tree, steps in runs:
            r = export(tree, args.config, steps, tmp / "t.json", tmp / f"cache-{name}")
            if name not in best or r["cpu_s"] < best[name]["cpu_s"]:
                best[name] = r
    print(f"simwar run {args.config} --trace (best of {args.repeat}, fresh processes):")
    for name, r in best.items():
        print(f"  {name:9s} {r['steps']:>7} steps: {r['cpu_s']:.2f} s CPU, "
              f"{r['steps'] / r['cpu_s']:,.0f} steps/s, peak RSS {r['rss_mib']:.0f} MiB, "
              f"{r['mb']:.0f} MB written")
    if args.before:
        b, a = best["before"], best["this tree"]
        if b["steps"] == a["steps"]:
            print("  the two files: " + ("the same bytes" if b["sha256"] == a["sha256"] else
                                         "different bytes (compare their events with "
                                         "json.load at fewer steps)"))
        ratio = (b["cpu_s"] / b["steps"]) / (a["cpu_s"] / a["steps"])
        print(f"  CPU per step, before / now: {ratio:.2f}x; peak RSS {b['rss_mib']:.0f} against "
              f"{a['rss_mib']:.0f} MiB ({b['rss_mib'] / a['rss_mib']:.2f}x; at a7b4bb4 and "
              f"before, an export held the whole run)")


def plain_run(config: str, steps: int) -> float:
    """CPU time of ``simwar run CONFIG --set steps=N --quiet`` (no trace) in a fresh process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", "import sys\nfrom simwar.cli import main\n"
                    "sys.exit(main(sys.argv[1:]))", "run", str(ROOT / config), "--set",
                    f"steps={steps}", "--quiet"], cwd=ROOT, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def breakdown(args) -> None:
    steps = args.export_steps
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        parts = {"run": plain_run(args.config, steps),
                 **{f"alone_{k}": v for k, v in child(BREAKDOWN, ROOT / args.config, steps,
                                                       "pass").items()},
                 "onepass": child(BREAKDOWN, ROOT / args.config, steps, "onepass")["pass_s"],
                 **child(BREAKDOWN, ROOT / args.config, steps, "writer")}
        for k, v in parts.items():
            best[k] = min(best.get(k, v), v)
    text = best["text_s"]
    print(f"simwar run {args.config} --trace at {steps} steps, CPU s (best of {args.repeat}):")
    print(f"  simwar run without --trace (imports, the summary's run) {best['run']:.2f}")
    print(f"  the trace mode's pass alone {best['alone_pass_s']:.2f} "
          f"(beside the writer: {best['pass_s']:.2f})")
    print(f"  the run's one pass, its summary and its windows (what `run --trace` runs) "
          f"{best['onepass']:.2f}")
    print(f"  the writer {best['writer_s']:.2f}: the text (rows' bytes) {text:.2f}, the rest "
          f"(groups, names, tracks, flows, counters) {best['writer_s'] - text:.2f}")
    print("  (the whole command, `export`, adds the file's writing to these)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", nargs="?", default="all",
                    choices=("memory", "timeline", "export", "breakdown", "all"))
    ap.add_argument("--config", default="configs/dspark_fine.yaml")
    ap.add_argument("--small", type=int, default=2000)
    ap.add_argument("--large", type=int, default=42000)
    ap.add_argument("--timeline-config", default="configs/dspark_coarse.yaml")
    ap.add_argument("--window-steps", type=int, nargs="*", default=[2000, 20000])
    ap.add_argument("--export-steps", type=int, default=100_000)
    ap.add_argument("--before", type=Path, help="another simwar source tree (export)")
    ap.add_argument("--before-steps", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    if args.what in ("export", "all"):
        bench_export(args)
    if args.what == "breakdown":
        breakdown(args)
    if args.what in ("memory", "all"):
        memory(args)
    if args.what in ("timeline", "all"):
        timeline(args)


def memory(args) -> None:
    small = child(MEMORY, args.config, args.small)
    large = child(MEMORY, args.config, args.large)
    per_step = (large["peak_rss_kib"] - small["peak_rss_kib"]) / (args.large - args.small)
    print(f"{args.config}: peak RSS {small['peak_rss_kib'] / 1024:.0f} MiB at {args.small} "
          f"steps, {large['peak_rss_kib'] / 1024:.0f} MiB at {args.large}: "
          f"{per_step:.2f} KiB per simulated step; the trace's columns "
          f"{large['trace_column_bytes'] / args.large / 1024:.2f} KiB per step")


def timeline(args) -> None:
    for steps in args.window_steps:
        alone = child(TIMELINE, args.timeline_config, steps, 0)
        drawn = child(TIMELINE, args.timeline_config, steps, 1)
        print(f"  {steps} steps: run {alone['run_s']:.2f} s CPU; timeline of steps 20..22 "
              f"{drawn['timeline_s']:.2f} s CPU ({drawn['timeline_s'] / alone['run_s']:.2f}x "
              f"the run)")


if __name__ == "__main__":
    main()
