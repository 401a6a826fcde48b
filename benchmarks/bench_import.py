"""Import benchmark: simwar's one-pass reader and whole import against json.load, in one run.

Writes a synthetic capture (a simulated DSPARK run, ``simwar.capture.synthetic``) of about
``--mb`` MB (default 200) into a temporary directory, then, each in a fresh process (so
each peak RSS is its own), reads the same file with:

- ``json.load`` (the baseline every ratio is against);
- ``simwar read``: :func:`simwar.capture.reader.read_capture`, the one streaming pass;
- ``simwar import``: :func:`simwar.capture.to_trace.import_kineto`, read + Trace;
- ``hta parse``: HolisticTraceAnalysis's own parse of the file (when it is installed);
- with ``--candidates``, the parsers the reader was chosen from: ijson's ``items`` over
  ``traceEvents`` (one pass, its ``yajl2_c`` backend), orjson and msgspec (untyped) over
  blocks cut at event boundaries, msgspec decoding into typed structs (what the reader does).

It prints one line per reader (seconds, MB/s of uncompressed JSON, peak RSS and its ratio to
the file size, speed relative to json.load) and one JSON line with everything. Nothing is kept.

    python benchmarks/bench_import.py [--mb 200] [--gzip] [--candidates]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: simulated steps per MB of written capture (measured: ~11 kB of JSON per step)
STEPS_PER_MB = 90

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


MAPPING = {"streams": {7: "forward", 13: "schedule", 20: "copy"},
           "phases": {r"^draft\.": "draft", r"^verify\.": "verify", r"^sample\.": "sample"},
           "run_batch": "^run_batch$", "sites": {"^result_copy$": "result_copy"},
           "warmup_steps": 20}


def _blocks(path: str, decode, block: int = 8 << 20) -> int:
    """Events of ``path``'s traceEvents, decoded block by block, cut at the last '},'."""
    import gzip

    n = 0
    with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as fh:
        buf = fh.read(block)
        buf = buf[buf.index(b"[", buf.index(b'"traceEvents"')) + 1:]
        while True:
            more = fh.read(block)
            if not more:
                break
            buf += more
            cut = buf.rfind(b"},")
            n += len(decode(b"[" + buf[:cut + 1] + b"]"))
            buf = buf[cut + 2:]
        n += len(decode(b"[" + buf[:buf.rindex(b"]")] + b"]"))
    return n


def child(what: str, path: str) -> dict:
    """Read ``path`` one way in this (fresh) process; the timings as a dict."""
    import gzip
    import resource

    # the modules each reader needs, imported before the clock starts
    if what.startswith("simwar"):
        import simwar.capture.reader
        import simwar.capture.to_trace  # noqa: F401
    elif what == "msgspec typed":
        import simwar.capture.reader  # noqa: F401
    t0 = time.perf_counter()
    out: dict = {}
    if what == "json.load":
        with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as fh:
            out["events"] = len(json.load(fh)["traceEvents"])
    elif what == "simwar read":
        from simwar.capture.reader import read_capture

        cap = read_capture(path)
        out["events"] = sum(cap.counts.values()) + sum(cap.ignored.values())
    elif what == "simwar import":
        from simwar.capture.to_trace import import_kineto

        imp = import_kineto(path, MAPPING)
        out["events"] = sum(imp.counts.get(k, 0) for k in ("kernel", "memcpy", "memset",
                                                           "runtime", "annotation",
                                                           "cuda_sync")) + imp.ignored_total
    elif what == "hta parse":
        import contextlib
        import io
        import logging
        import shutil
        import warnings

        warnings.filterwarnings("ignore")
        logging.disable(logging.WARNING)
        from hta.common.trace import Trace

        with tempfile.TemporaryDirectory() as d:
            dst = Path(d) / ("rank0.json.gz" if path.endswith(".gz") else "rank0.json")
            os.link(path, dst) if Path(path).stat().st_dev == Path(d).stat().st_dev \
                else shutil.copy(path, dst)
            t0 = time.perf_counter()  # HTA's parse, not the copy
            with contextlib.redirect_stdout(io.StringIO()):
                t = Trace(trace_dir=d)
                t.parse_traces()
            out["events"] = int(len(t.get_trace(0)))
    elif what == "ijson items":
        import ijson

        with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as fh:
            out["events"] = sum(1 for _ in ijson.items(fh, "traceEvents.item", use_float=True))
        out["backend"] = ijson.backend
    elif what == "orjson blocks":
        import orjson

        out["events"] = _blocks(path, orjson.loads)
    elif what == "msgspec blocks":
        import msgspec

        out["events"] = _blocks(path, msgspec.json.Decoder().decode)
    elif what == "msgspec typed":
        import msgspec

        from simwar.capture.reader import RawEvent

        out["events"] = _blocks(path, msgspec.json.Decoder(list[RawEvent]).decode)
    out["s"] = round(time.perf_counter() - t0, 3)
    out["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=200.0, help="approximate capture size (MB)")
    ap.add_argument("--gzip", action="store_true", help="write and read .json.gz")
    ap.add_argument("--candidates", action="store_true",
                    help="also time the parsers the reader was chosen from")
    ap.add_argument("--child", nargs=2, metavar=("WHAT", "CAPTURE"),
                    help=argparse.SUPPRESS)  # the fresh process that does one read
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0

    from simwar.api import simulate
    from simwar.capture.synthetic import write_kineto

    readers = ["json.load", "simwar read", "simwar import"]
    try:
        import hta  # noqa: F401

        readers.append("hta parse")
    except ImportError:
        print("HolisticTraceAnalysis is not installed: its parse is not timed", file=sys.stderr)
    if args.candidates:
        readers += ["ijson items", "orjson blocks", "msgspec blocks", "msgspec typed"]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        sim = simulate(None, {"steps": max(50, int(args.mb * STEPS_PER_MB))}, engine="simpy")
        path = write_kineto(sim.trace, Path(tmp) / ("capture.json.gz" if args.gzip
                                                     else "capture.json"))
        del sim
        import gzip

        raw_mb = (len(gzip.decompress(path.read_bytes())) if args.gzip
                  else path.stat().st_size) / 1e6
        print(f"wrote {path.stat().st_size / 1e6:.1f} MB ({raw_mb:.1f} MB of JSON) in "
              f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
        results = {}
        for what in readers:
            out = subprocess.run([sys.executable, __file__, "--child", what, str(path)],
                                 check=True, stdout=subprocess.PIPE, text=True)
            results[what] = json.loads(out.stdout.strip().splitlines()[-1])
    base = results["json.load"]["s"]
    print(f"{'reader':<16} {'s':>7} {'MB/s':>7} {'peak MB':>8} {'x size':>7} {'vs json.load':>13}")
    for what, r in results.items():
        r["mb_per_s"] = round(raw_mb / r["s"], 1) if r["s"] else None
        r["peak_over_size"] = round(r["peak_rss_mb"] / raw_mb, 2)
        r["speed_vs_json_load"] = round(base / r["s"], 2) if r["s"] else None
        print(f"{what:<16} {r['s']:>7.2f} {r['mb_per_s']:>7.1f} {r['peak_rss_mb']:>8} "
              f"{r['peak_over_size']:>7.2f} {r['speed_vs_json_load']:>12.2f}x")
    print(json.dumps({"file_mb": round(raw_mb, 1), "gzip": args.gzip, "readers": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
