"""simwar's idle breakdown against HTA's on every stream of every capture at hand.

    python benchmarks/hta_agreement.py [PATH ...]

Runs HolisticTraceAnalysis 0.5.0 (the dev extra; ``HTA_DISABLE_NS_ROUNDING=1``,
``include_last_profiler_step=True``, as ``tests/test_hta_oracle.py`` runs it) and
:func:`simwar.analysis.idle.idle_breakdown` on each capture (the project's under
``tests/data`` by default; files or folders of ``*.json``/``*.json.gz`` given as arguments,
such as TraceLens's ``tests/traces`` or HTA's ``tests/data``, kept out of the repository),
imported whole as one step, and prints per stream host-wait, kernel-wait and other (simwar /
HTA) and whether they agree within the oracle's tolerance, max(1 µs, 0.5 %), by simwar's
rule and by HTA's (``rule="hta"``, the module docstring of simwar/analysis/idle.py says
where HTA is wrong). The last lines are the counts.

HTA's rule needs two facts of the file that a Trace does not keep: the start of the file's
first event (HTA's row 0, which it joins as the launch of an op whose launch is not in the
trace), put on the trace's clock by the first device op's start in the file and in the
trace; and whether the file has two or more ``ProfilerStep`` ranges (then HTA keeps only the
ops whose launch is in the trace). Captures HTA cannot read (it needs pandas < 3 for some;
files of another rank) are listed as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import os
import re
import shutil
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data"
DEFAULT = ("kineto", "probe", "threads", "server", "real")
CATS = (("host_wait_us", "host_wait"), ("kernel_wait_us", "kernel_wait"), (None, "other"))


def close(ours: float, theirs: float) -> bool:
    """tests/test_hta_oracle.py's tolerance."""
    return abs(ours - theirs) <= max(1.0, 0.005 * abs(theirs))


def captures(args: list[str]) -> list[Path]:
    roots = [Path(a) for a in args] or [DATA / d for d in DEFAULT]
    out: list[Path] = []
    for r in roots:
        out += [r] if r.is_file() else sorted(
            p for p in r.rglob("*") if p.is_file() and re.search(r"\.json(\.gz)?$", p.name)
            and "metrics" not in p.name and p.name != "server_device.json")
    return out


def hta_idle(path: Path, folder: Path):
    os.environ["HTA_DISABLE_NS_ROUNDING"] = "1"
    from hta.trace_analysis import TraceAnalysis

    folder.mkdir(parents=True)
    shutil.copy(path, folder / ("rank0.json.gz" if path.suffix == ".gz" else "rank0.json"))
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        analysis = TraceAnalysis(trace_dir=str(folder), include_last_profiler_step=True)
        idle = analysis.get_idle_time_breakdown(visualize=False)
    return idle[0] if isinstance(idle, tuple) else idle


def file_facts(path: Path) -> tuple[float, float, bool]:
    """(first event's ts, first device op's ts, two or more ProfilerStep ranges)."""
    raw = path.read_bytes()
    events = json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)["traceEvents"]
    timed = [e for e in events if "ts" in e and e.get("ph") == "X"]
    device = [float(e["ts"]) for e in timed if e.get("cat") in ("kernel", "gpu_memcpy",
                                                                  "gpu_memset")]
    steps = {e["name"] for e in timed if str(e.get("name", "")).startswith("ProfilerStep")}
    return float(timed[0]["ts"]), min(device), len(steps) >= 2


def compare(path: Path, work: Path) -> list[tuple]:
    from simwar.analysis.idle import idle_breakdown
    from simwar.capture.to_trace import import_kineto
    from simwar.core.trace import OpKind

    idle = hta_idle(path, work)
    imp = import_kineto(path, {"steps": "(?!)"})
    t = imp.trace
    lane_of = {int(v.split(":")[-1]): lane for lane, v in t.meta["lanes"].items()}
    theirs: dict[str, dict[str, float]] = {}
    for row in idle.itertuples():
        theirs.setdefault(lane_of[int(row.stream)], {})[row.idle_category] = row.idle_time
    first_ts, first_device_ts, stepped = file_facts(path)
    origin = first_device_ts - float(t.ops.start_us[t.ops.kind == OpKind.KERNEL].min())
    rules = {"simwar": idle_breakdown(t),
             "hta": idle_breakdown(t, rule="hta", no_launch_us=first_ts - origin,
                                   launched_only=stepped)}
    rows = []
    for lane in sorted(set(theirs) | set(rules["simwar"])):
        cats = theirs.get(lane, {})
        vals, ok = {}, {}
        for rule, ours in rules.items():
            mine = ours.get(lane)
            if mine is None:
                vals[rule], ok[rule] = None, False
                continue
            vals[rule] = [mine[k] if k else mine["dependency_us"] + mine["other_us"]
                          for k, _ in CATS]
            ok[rule] = lane in theirs and all(close(v, cats.get(c, 0.0)) for v, (_, c)
                                              in zip(vals[rule], CATS))
        rows.append((path.name, lane, vals, [cats.get(c, 0.0) for _, c in CATS], ok))
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*", help="captures or folders (default: tests/data/...)")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    rows, skipped = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, path in enumerate(captures(args.paths)):
            try:
                rows += compare(path, Path(tmp) / str(i))
            except Exception as e:  # noqa: BLE001 -- a capture HTA or simwar cannot read
                skipped.append(f"{path.name}: {type(e).__name__}: {str(e)[:100]}")
    print(f"{'capture':52s} {'stream':10s} simwar hta  host_wait ours/HTA   "
          "kernel_wait ours/HTA   other ours/HTA")
    for name, lane, vals, theirs, ok in rows:
        cells = " ".join(f"{v:11.1f}/{h:<11.1f}" for v, h in zip(vals["simwar"] or
                                                                   [float("nan")] * 3, theirs))
        print(f"{name[:52]:52s} {lane:10s} {'ok ' if ok['simwar'] else 'NO '}    "
              f"{'ok ' if ok['hta'] else 'NO '} {cells}")
    for line in skipped:
        print(f"skipped {line}")
    n = len(rows)
    print(f"simwar's rule: {sum(r[4]['simwar'] for r in rows)} of {n} streams within "
          f"max(1 µs, 0.5 %) of HTA")
    print(f"HTA's rule (rule='hta'): {sum(r[4]['hta'] for r in rows)} of {n} streams")
    return 0


if __name__ == "__main__":
    sys.exit(main())
