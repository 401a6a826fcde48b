"""Import benchmark: peak memory and time to import a ~100 MB Kineto capture.

Writes a synthetic capture (a simulated DSPARK run, written by
``simwar.capture.synthetic``) into a temporary directory, then imports it in
a fresh process with progress reported to stderr, and prints the file size,
event count, wall time and peak RSS as one JSON line. Nothing is kept.

    python benchmarks/bench_import.py [--mb 100] [--gzip]

The target (issue 6): a 100 MB capture imports in under 2 GB of memory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: simulated steps per MB of written capture (measured: ~10 kB of JSON per step)
STEPS_PER_MB = 100

class ProgressPrinter:
    """``progress(done, total)`` for the importer: one line per 10 %, the last one once.

    Sizes are bytes of the file on disk (compressed for ``.gz``), in MB with enough
    decimals to tell a small file's progress from zero.
    """

    def __init__(self, compressed: bool, out=sys.stderr):
        self.unit = "MB compressed" if compressed else "MB"
        self.out = out
        self.last = -100

    def __call__(self, done: int, total: int) -> None:
        pct = int(100 * done / total) if total else 100
        if pct >= self.last + 10 or (pct == 100 and self.last < 100):
            self.last = pct
            print(f"  read {pct:3d}% ({_mb(done)} / {_mb(total)} {self.unit})", file=self.out)


def _mb(n: int) -> str:
    return f"{n / 1e6:.{2 if n < 1e6 else 1 if n < 1e8 else 0}f}"


def child(path: str, mapping: dict) -> None:
    """Import ``path`` in this (fresh) process and print the timings as one JSON line."""
    import resource

    from simwar.capture.stalls import import_report
    from simwar.capture.to_trace import import_kineto

    t0 = time.perf_counter()
    imp = import_kineto(path, mapping, progress=ProgressPrinter(path.endswith(".gz")))
    t1 = time.perf_counter()
    _, report = import_report(imp)
    t2 = time.perf_counter()
    print(json.dumps({"import_s": round(t1 - t0, 2), "metrics_s": round(t2 - t1, 2),
                      "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                           / 1024),
                      "kernels": imp.counts["kernel"], "runtime_calls": imp.counts["runtime"],
                      "ignored_events": imp.ignored_total,
                      "steps_measured": report["metrics"]["steps_measured"],
                      "step_us_mean": round(report["metrics"]["step_us_mean"], 1)}))


MAPPING = {"streams": {7: "forward", 13: "schedule", 20: "copy"},
           "phases": {r"^draft\.": "draft", r"^verify\.": "verify", r"^sample\.": "sample"},
           "run_batch": "^run_batch$", "sites": {"^result_copy$": "result_copy"},
           "warmup_steps": 20}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=100.0, help="approximate capture size (MB)")
    ap.add_argument("--gzip", action="store_true", help="write and read .json.gz")
    ap.add_argument("--child", nargs=2, metavar=("CAPTURE", "MAPPING_JSON"),
                    help=argparse.SUPPRESS)  # the fresh process that does the import
    args = ap.parse_args()
    if args.child:
        child(args.child[0], json.loads(args.child[1]))
        return 0

    from simwar.api import simulate
    from simwar.capture.synthetic import write_kineto

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        sim = simulate(None, {"steps": max(50, int(args.mb * STEPS_PER_MB))})
        path = write_kineto(sim.trace, Path(tmp) / ("capture.json.gz" if args.gzip
                                                     else "capture.json"))
        size_mb = path.stat().st_size / 1e6
        print(f"wrote {size_mb:.1f} MB in {time.perf_counter() - t0:.1f} s; importing",
              file=sys.stderr)
        out = subprocess.run([sys.executable, __file__, "--child", str(path),
                              json.dumps(MAPPING)], check=True, stdout=subprocess.PIPE, text=True)
        result = json.loads(out.stdout)
        result.update(file_mb=round(size_mb, 1), sim_step_us_mean=round(
            sim.summary["step_us_mean"], 1))
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
