"""Import benchmark: simwar's one-pass reader and whole import against json.load, in one run.

Writes a synthetic capture (a simulated DSPARK run, ``simwar.capture.synthetic``) of about
``--mb`` MB (default 200) into a temporary directory, then, each in a fresh process (so
each peak RSS is its own), reads the same file with:

- ``json.load`` (the baseline every ratio is against);
- ``simwar read``: :func:`simwar.capture.reader.read_capture`, the one streaming pass;
- ``simwar import``: :func:`simwar.capture.open.open_capture`, the whole import (read, map,
  bind into the Trace, size), as ``simwar import`` runs it; its answer's fingerprint (a hash
  of the Trace's columns, text decoded) is printed, so that two trees' imports are seen to
  agree;
- ``hta parse``: HolisticTraceAnalysis's own parse (when it is installed), on a second,
  smaller capture of ``--hta-mb`` MB (default 3) next to simwar's import of that same
  file: HTA 0.5.0 under pandas 3 fails past 32,767 events (it downcasts its correlation
  index to int16, then assigns larger values), and its memory, ~100 bytes per byte of
  JSON, would take a 200 MB capture past this machine's 24 GB (its process is capped at
  ``--hta-gb`` GB of address space, 12 by default);
- with ``--candidates``, the parsers the reader was chosen from: ijson's ``items`` over
  ``traceEvents`` (one pass, its ``yajl2_c`` backend), orjson and msgspec (untyped) over
  blocks cut at event boundaries, msgspec decoding into typed structs (what the reader does).

With ``--before DIR`` (another source tree, e.g. ``git archive COMMIT | tar -x -C DIR``)
simwar's read and import are also run from that tree, interleaved with this tree's and
``json.load``'s, ``--repeat`` times (2 by default with ``--before``), each the best of its
repeats: the ratios of one run.

It prints one line per reader (seconds, MB/s of uncompressed JSON, peak RSS and its ratio to
the file size, speed relative to json.load) and one JSON line with everything. Nothing is kept.

    python benchmarks/bench_import.py [--mb 200] [--gzip] [--candidates] [--hta-mb 3]
                                      [--capture PATH] [--before DIR] [--repeat N]

Wall-clock ratios move with a shared machine's load; the CPU-time ratios (each process's
own ``time.process_time``) move less.
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

ROOT = Path(__file__).resolve().parents[1]
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


def _peak_mb() -> int:
    """This process's peak resident memory (MB): VmHWM, which exec resets (ru_maxrss keeps
    the forking parent's peak, the benchmark's own simulation)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024)
    except OSError:
        pass
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def child(what: str, path: str) -> dict:
    """Read ``path`` one way in this (fresh) process; the timings as a dict."""
    import gzip

    # the modules each reader needs, imported before the clock starts
    if what.startswith("simwar"):
        import simwar.capture.open
        import simwar.capture.reader
        import simwar.capture.to_trace  # noqa: F401
    elif what == "msgspec typed":
        import simwar.capture.reader  # noqa: F401
    t0, c0 = time.perf_counter(), time.process_time()
    out: dict = {}
    imported = None
    if what == "json.load":
        with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as fh:
            out["events"] = len(json.load(fh)["traceEvents"])
    elif what == "simwar read":
        from simwar.capture.reader import read_capture

        cap = read_capture(path)
        out["events"] = sum(cap.counts.values()) + sum(cap.ignored.values())
    elif what == "simwar import":
        from simwar.capture.open import open_capture

        cap = open_capture(path, MAPPING)
        imp = cap.bound
        out["events"] = sum(imp.counts.get(k, 0) for k in ("kernel", "memcpy", "memset",
                                                           "runtime", "annotation",
                                                           "cuda_sync")) + imp.ignored_total
        imported = cap.trace
    elif what == "hta parse":
        import contextlib
        import io
        import logging
        import resource as res
        import shutil
        import warnings

        warnings.filterwarnings("ignore")
        logging.disable(logging.WARNING)
        cap = int(float(os.environ.get("BENCH_HTA_GB", "12")) * 2**30)
        res.setrlimit(res.RLIMIT_AS, (cap, cap))
        from hta.common.trace import Trace

        with tempfile.TemporaryDirectory() as d:
            dst = Path(d) / ("rank0.json.gz" if path.endswith(".gz") else "rank0.json")
            os.link(path, dst) if Path(path).stat().st_dev == Path(d).stat().st_dev \
                else shutil.copy(path, dst)
            t0, c0 = time.perf_counter(), time.process_time()  # HTA's parse, not the copy
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
    out["cpu_s"] = round(time.process_time() - c0, 3)
    out["peak_rss_mb"] = _peak_mb()
    if what == "simwar import":  # after the clock and the peak
        out["fingerprint"] = _fingerprint(imported)
    return out


def _fingerprint(trace) -> str:
    """A hash of a Trace's tables (text decoded: string codes may differ between trees): equal
    for equal imports (the meta is left out: a tree may add keys to it)."""
    import hashlib

    import numpy as np

    from simwar.core.trace import MARKER_COLUMNS, OP_COLUMNS, SPAN_COLUMNS

    h = hashlib.sha1()
    for table, schema in ((trace.spans, SPAN_COLUMNS), (trace.ops, OP_COLUMNS),
                          (trace.markers, MARKER_COLUMNS)):
        for name, _, how in schema:
            col = getattr(table, name)
            h.update(name.encode())
            if how == "str":
                h.update("\0".join(trace.strings[i] for i in col.tolist()).encode())
            else:
                h.update(np.ascontiguousarray(col).tobytes())
    return h.hexdigest()[:16]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", type=float, default=200.0, help="approximate capture size (MB)")
    ap.add_argument("--gzip", action="store_true", help="write and read .json.gz")
    ap.add_argument("--candidates", action="store_true",
                    help="also time the parsers the reader was chosen from")
    ap.add_argument("--hta-mb", type=float, default=3.0,
                    help="size of the capture HTA's parse is timed on (0: none)")
    ap.add_argument("--hta-gb", type=float, default=12.0,
                    help="address-space cap of HTA's process (GB)")
    ap.add_argument("--capture", type=Path,
                    help="read this capture (kept) instead of writing one of --mb MB")
    ap.add_argument("--before", type=Path,
                    help="another simwar source tree: its read and import, interleaved")
    ap.add_argument("--repeat", type=int, default=None,
                    help="runs of each reader, the best kept (default 1; 2 with --before)")
    ap.add_argument("--child", nargs=2, metavar=("WHAT", "CAPTURE"),
                    help=argparse.SUPPRESS)  # the fresh process that does one read
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(*args.child)))
        return 0

    readers = ["json.load", "simwar read", "simwar import"]
    if args.before:
        readers += ["simwar read (before)", "simwar import (before)"]
    repeat = args.repeat or (2 if args.before else 1)
    if args.candidates:
        readers += ["ijson items", "orjson blocks", "msgspec blocks", "msgspec typed"]
    try:
        import hta  # noqa: F401

        has_hta = args.hta_mb > 0
    except ImportError:
        has_hta = False
        print("HolisticTraceAnalysis is not installed: its parse is not timed", file=sys.stderr)
    report = {"gzip": args.gzip}
    with tempfile.TemporaryDirectory() as tmp:
        runs = [("main", args.mb, readers)]
        if has_hta:
            runs.append(("hta", args.hta_mb, ["json.load", "simwar import", "hta parse"]))
        for label, mb, names in runs:
            if label == "main" and args.capture:
                path, raw_mb = args.capture, _json_mb(args.capture)
            else:
                path, raw_mb = _capture(Path(tmp) / label, mb, args.gzip)
            results: dict = {}
            for _ in range(repeat if label == "main" else 1):
                for what in names:
                    env = dict(os.environ, BENCH_HTA_GB=str(args.hta_gb))
                    child_what = what
                    if what.endswith(" (before)"):
                        env["PYTHONPATH"] = str(args.before.resolve())
                        child_what = what[:-len(" (before)")]
                    else:
                        env["PYTHONPATH"] = str(ROOT)
                    out = subprocess.run([sys.executable, __file__, "--child", child_what,
                                          str(path)], stdout=subprocess.PIPE, text=True,
                                         env=env)
                    if out.returncode != 0:
                        results[what] = {"failed": f"exit {out.returncode}"}
                        print(f"  {what}: failed ({results[what]['failed']})", file=sys.stderr)
                        continue
                    r = json.loads(out.stdout.strip().splitlines()[-1])
                    print(f"  {what}: {r['s']} s, {r['cpu_s']} s CPU, {r['peak_rss_mb']} MB",
                          file=sys.stderr)
                    best = results.get(what)
                    if best is None or "failed" in best or r["cpu_s"] < best["cpu_s"]:
                        results[what] = r
            prints = {r.get("fingerprint") for w, r in results.items() if "fingerprint" in r}
            if len(prints) > 1:
                print(f"  the imports differ: fingerprints {sorted(prints)}", file=sys.stderr)
            _table(results, raw_mb)
            report[label] = {"file_mb": round(raw_mb, 1), "readers": results}
            if not (label == "main" and args.capture):
                path.unlink()
    print(json.dumps(report))
    return 0


def _capture(folder: Path, mb: float, gz: bool) -> tuple[Path, float]:
    import gzip

    from simwar.api import simulate
    from simwar.capture.synthetic import write_kineto

    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    sim = simulate(None, {"steps": max(50, int(mb * STEPS_PER_MB))}, engine="simpy")
    path = write_kineto(sim.trace, folder / ("capture.json.gz" if gz else "capture.json"))
    del sim
    raw_mb = (len(gzip.decompress(path.read_bytes())) if gz else path.stat().st_size) / 1e6
    print(f"wrote {path.stat().st_size / 1e6:.1f} MB ({raw_mb:.1f} MB of JSON) in "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return path, raw_mb


def _json_mb(path: Path) -> float:
    import gzip

    if str(path).endswith(".gz"):
        with gzip.open(path, "rb") as fh:
            return sum(len(b) for b in iter(lambda: fh.read(1 << 24), b"")) / 1e6
    return path.stat().st_size / 1e6


def _table(results: dict, raw_mb: float) -> None:
    base = results["json.load"].get("s")
    base_cpu = results["json.load"].get("cpu_s")
    print(f"capture of {raw_mb:.1f} MB of JSON")
    print(f"  {'reader':<16} {'s':>7} {'MB/s':>7} {'peak MB':>8} {'x size':>7} "
          f"{'vs json.load':>13} {'CPU s':>7} {'CPU vs json.load':>17}")
    for what, r in results.items():
        if "failed" in r:
            print(f"  {what:<16} failed: {r['failed']}")
            continue
        r["mb_per_s"] = round(raw_mb / r["s"], 1) if r["s"] else None
        r["peak_over_size"] = round(r["peak_rss_mb"] / raw_mb, 2)
        r["speed_vs_json_load"] = round(base / r["s"], 2) if r["s"] and base else None
        r["cpu_vs_json_load"] = round(base_cpu / r["cpu_s"], 2) if r["cpu_s"] and base_cpu \
            else None
        print(f"  {what:<16} {r['s']:>7.2f} {r['mb_per_s']:>7.1f} {r['peak_rss_mb']:>8} "
              f"{r['peak_over_size']:>7.2f} {r['speed_vs_json_load']:>12.2f}x "
              f"{r['cpu_s']:>7.2f} {r['cpu_vs_json_load']:>16.2f}x")


if __name__ == "__main__":
    sys.exit(main())
