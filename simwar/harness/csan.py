"""Replay programs under PyTorch's CUDA sanitizer (CSAN) and set its reports beside simwar's.

CSAN (``torch.cuda._sanitizer``) is a happens-before race detector for CUDA
streams, built like ``simwar.analysis.hazards``: vector clocks over stream order,
event record → wait edges and host synchronizations. It sees every PyTorch
operator the harness launches (each kernel's ``fill_`` of the buffers it
writes and ``copy_`` of the buffers it reads) and every event record, wait
and synchronize, so replaying a Program on :class:`~simwar.harness.cuda.CudaBackend`
under CSAN checks simwar's latent-race verdict against an independent
implementation on the real CUDA calls. Captured graphs are not seen when
replayed (CSAN intercepts operators, and a graph replay runs none), so only
programs whose phases are all eager are meaningful here.

- :class:`CsanCollector` wraps one sanitizer dispatch mode so that every
  reported unsynchronized access is appended to a list (with the host
  iteration it was issued in) instead of raising at the first one;
- :class:`PointerMap` and :func:`harness_regions` classify each report by the
  tensor it touched: a shared buffer's slot (by buffer name) or one of the
  harness's own tensors (read snapshots, per-stream scratch source and
  snapshot slots, graph stamp arrays, graph launch counters);
- :func:`sanitize` replays one program and returns its reports, tallied;
- ``python -m simwar.harness.csan PROGRAMS_DIR OUT_JSON`` replays every
  ``*.json`` Program of a directory (``Program.to_json``; written by
  ``simwar harness --csan -o DIR``, whose programs carry simwar's own
  ``latent_races`` in their meta), prints a table
  ``case | simwar latent races | CSAN shared | CSAN internal | agree`` and
  writes the per-case results as JSON. It exits 1 if a case disagrees.

A case agrees when CSAN reports an unsynchronized access on a shared buffer
(in a host iteration at or after warm-up, as simwar counts its latent races)
if and only if simwar found latent races, and reports nothing on any of the
harness's own tensors.

Imports: the standard library and simwar's stdlib-only modules; torch only
inside the functions that run on the GPU (the classification is tested on
the CPU without torch).
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import time
from pathlib import Path
from typing import NamedTuple

from simwar.core.files import write_text_atomic
from simwar.core.program import GraphLaunch, Program
from simwar.harness.plan import ReplayPlan, make_plan
from simwar.harness.replay import replay

ELEMENT_BYTES = 8  # the harness's device arrays are int64

SHARED, INTERNAL, UNKNOWN = "shared", "internal", "unknown"


# --------------------------------------------------------------------------- classification
class Region(NamedTuple):
    """``nbytes`` of device memory from ``start`` that belong to one named tensor."""

    start: int
    nbytes: int
    kind: str  # shared | internal
    name: str


class PointerMap:
    """Maps a data pointer to the region that holds it (``unknown`` outside every region)."""

    def __init__(self, regions):
        self.regions = sorted(regions)
        for a, b in zip(self.regions, self.regions[1:]):
            if b.start < a.start + a.nbytes:
                raise ValueError(f"regions overlap: {a.name} and {b.name}")
        self.starts = [r.start for r in self.regions]

    def classify(self, ptr: int) -> tuple[str, str]:
        i = bisect.bisect_right(self.starts, ptr) - 1
        if i >= 0:
            r = self.regions[i]
            if ptr < r.start + r.nbytes:
                return r.kind, r.name
        return UNKNOWN, hex(ptr)


def harness_regions(plan: ReplayPlan, buffers_ptr: int, snap_ptr: int,
                    stamp_ptrs=(), counter_ptrs: dict | None = None,
                    element: int = ELEMENT_BYTES) -> list[Region]:
    """The regions of the harness's device tensors for ``plan``, from their base pointers.

    ``buffers_ptr``: the buffer array (one slot per shared buffer, then one
    scratch source slot per stream); ``snap_ptr``: the snapshot array (one
    slot per read, then one scratch snapshot slot per stream);
    ``stamp_ptrs``: each graph write node's stamp array (one entry per
    launch); ``counter_ptrs``: graph name → its launch counter.
    """
    out = [Region(buffers_ptr + i * element, element, SHARED, b)
           for i, b in enumerate(plan.buffers)]
    for s in plan.streams:
        out.append(Region(buffers_ptr + plan.scratch_buffer(s) * element, element, INTERNAL,
                          f"scratch[{s}]"))
        out.append(Region(snap_ptr + plan.scratch_slot(s) * element, element, INTERNAL,
                          f"scratch_snap[{s}]"))
    for r in plan.reads:
        out.append(Region(snap_ptr + r.slot * element, element, INTERNAL,
                          f"snapshot[{r.buffer}]"))
    for i, ptr in enumerate(stamp_ptrs):
        out.append(Region(ptr, len(plan.stamp_arrays[i]) * element, INTERNAL, f"stamps[{i}]"))
    for g, ptr in (counter_ptrs or {}).items():
        out.append(Region(ptr, element, INTERNAL, f"counter[{g}]"))
    return out


def tally(reports: list[dict], warmup: int = 0) -> dict:
    """Counts of reports by kind and tensor name, over all iterations and from ``warmup`` on."""
    out: dict = {"all": {SHARED: {}, INTERNAL: {}, UNKNOWN: {}},
                 "after_warmup": {SHARED: {}, INTERNAL: {}, UNKNOWN: {}}}
    for r in reports:
        for part in ("all", "after_warmup"):
            if part == "after_warmup" and r["step"] < warmup:
                continue
            names = out[part][r["kind"]]
            names[r["name"]] = names.get(r["name"], 0) + 1
    return out


def verdict(latent_races, counts: dict, graph_launches: int = 0) -> dict:
    """Agreement of one case: CSAN's shared reports (after warm-up) iff simwar's latent races,
    and no report on the harness's own tensors (``agree`` is None where it cannot be judged:
    no ``latent_races`` in the program's meta, or graphs CSAN does not see)."""
    shared = sum(counts["after_warmup"][SHARED].values())
    internal = sum(counts["all"][INTERNAL].values()) + sum(counts["all"][UNKNOWN].values())
    if latent_races is None or graph_launches:
        agree = None
    else:
        agree = (shared > 0) == (latent_races > 0) and internal == 0
    return {"csan_shared": shared, "csan_internal": internal, "agree": agree}


# --------------------------------------------------------------------------- the sanitizer
class CsanCollector:
    """One CSAN dispatch mode for the process, collecting reports instead of raising.

    The sanitizer's dispatch mode hands every launch to its event handler's
    ``_handle_kernel_launch``, which returns the launch's unsynchronized
    accesses, and raises ``CUDASanitizerErrors`` if there are any. The
    collector replaces that method on its handler with one that appends the
    errors (tagged with the current host iteration) to ``raw`` and returns
    none. The mode registers its handler's callbacks for events, streams and
    allocations once, for the life of the process, so one collector serves
    every case: :meth:`begin` resets the handler's state and enters the mode,
    :meth:`end` leaves it.
    """

    def __init__(self):
        from torch.cuda import _sanitizer

        self.mode = _sanitizer.CUDASanitizerDispatchMode()
        self.handler = self.mode.event_handler
        launch = getattr(self.handler, "_handle_kernel_launch", None)
        if launch is None:
            raise RuntimeError("this torch's CUDA sanitizer has no "
                               "EventHandler._handle_kernel_launch to collect from")
        self.raw: list = []
        self.step = -1
        self.active = False
        self.entered = False

        def collect(*args, **kwargs):
            errors = launch(*args, **kwargs)
            if self.active and errors:
                self.raw.extend((self.step, e) for e in errors)
            return []

        self.handler._handle_kernel_launch = collect

    def set_step(self, step: int) -> None:
        self.step = step

    def begin(self, enter_mode: bool = True) -> None:
        """Forget everything seen so far (call after a device synchronize) and start checking.

        ``enter_mode=False`` collects from the handler without intercepting operators (for
        a caller that feeds the handler itself)."""
        # the handler's callbacks are bound to this object: reset its state in place
        type(self.handler).__init__(self.handler)
        self.raw = []
        self.step = -1
        self.active = True
        self.entered = enter_mode
        if enter_mode:
            self.mode.__enter__()

    def end(self) -> None:
        if self.active:
            self.active = False
            if self.entered:
                self.entered = False
                self.mode.__exit__(None, None, None)


def _access(a, stream_names: dict) -> dict:
    op = a.operator
    name = getattr(op, "name", None) or str(op).split("(")[0]
    overload = getattr(op, "overload_name", "")
    kind = getattr(a.type, "name", str(a.type)).lower()
    return {"stream": stream_names.get(a.stream, str(a.stream)),
            "op": f"{name}.{overload}" if overload else name, "access": kind}


def describe(step: int, err, pmap: PointerMap, stream_names: dict) -> dict:
    """One collected error as a plain mapping (tensor kind and name, both accesses)."""
    ptr = getattr(err, "data_ptr", None)
    kind, name = pmap.classify(ptr) if ptr is not None else (UNKNOWN, type(err).__name__)
    out = {"step": step, "kind": kind, "name": name, "ptr": ptr}
    cur = getattr(err, "current_access", None)
    prev = getattr(err, "previous_access", None)
    if cur is not None:
        out["current"] = _access(cur, stream_names)
    if prev is not None:
        out["previous"] = _access(prev, stream_names)
    return out


_BACKEND_CLASS = None


def _sanitized_backend_class():
    """CudaBackend that checks only the replay loop: CSAN starts after setup (which ends
    with a device synchronize) and stops before the final read-back."""
    global _BACKEND_CLASS
    if _BACKEND_CLASS is not None:
        return _BACKEND_CLASS
    # lazy: simwar.harness.cuda imports torch, which the CPU tests of this module lack
    from simwar.harness.cuda import CudaBackend

    class SanitizedBackend(CudaBackend):
        def __init__(self, calibration, collector: CsanCollector, *, uniform: bool = True):
            super().__init__(calibration, uniform=uniform)
            self.collector = collector

        def setup(self, plan: ReplayPlan) -> None:
            super().setup(plan)
            self.pointer_map = PointerMap(harness_regions(
                plan, self.buffers.data_ptr(), self.snap.data_ptr(),
                [t.data_ptr() for t in self.stamp_arrays],
                {g: c.data_ptr() for g, c in self.counters.items()}))
            self.stream_names = {s.cuda_stream: name for name, s in self.streams.items()}
            self.stream_names.setdefault(0, "default")
            self.collector.begin()

        def finish(self):
            self.collector.end()
            return super().finish()

    _BACKEND_CLASS = SanitizedBackend
    return SanitizedBackend


def sanitize(program: Program, calibration: dict | None, collector: CsanCollector, *,
             uniform: bool = True, examples: int = 20, backend=None) -> dict:
    """Replay ``program`` on CUDA under CSAN; its reports, tallied, with simwar's verdict.

    ``backend``: another backend that starts ``collector`` in its setup and has a
    ``pointer_map`` and ``stream_names`` (the CPU tests drive CSAN's handler from one).
    """
    plan = make_plan(program)
    if backend is None:
        backend = _sanitized_backend_class()(calibration, collector, uniform=uniform)
    try:
        trace = replay(plan, backend, step_hook=collector.set_step)
    finally:
        collector.end()
    reports = [describe(step, e, backend.pointer_map, backend.stream_names)
               for step, e in collector.raw]
    meta = program.meta
    warmup = int(meta.get("warmup_steps", 0))
    counts = tally(reports, warmup)
    graphs = sum(1 for op in program.ops if type(op) is GraphLaunch)
    latent = meta.get("latent_races")
    return dict({
        "latent_races": latent,
        "latent_race_buffers": meta.get("latent_race_buffers"),
        "warmup_steps": warmup,
        "steps": program.steps(),
        "graph_launches": graphs,
        "csan": counts,
        "measured_races": len(trace.meta.get("measured_races", ())),
        "examples": reports[:examples],
    }, **verdict(latent, counts, graphs))


# --------------------------------------------------------------------------- entry point
def format_table(results: dict) -> str:
    rows = [("case", "simwar latent races", "CSAN shared", "CSAN internal", "agree")]
    for name, r in results.items():
        latent = "?" if r["latent_races"] is None else str(r["latent_races"])
        if r["agree"] is None:
            agree = "n/a (graphs)" if r["graph_launches"] else "n/a"
        else:
            agree = "yes" if r["agree"] else "NO"
        rows.append((name, latent, str(r["csan_shared"]), str(r["csan_internal"]), agree))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = [" | ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simwar.harness.csan",
                                 description="Replay programs under PyTorch's CUDA sanitizer.")
    ap.add_argument("programs", type=Path, help="directory of *.json programs")
    ap.add_argument("out", type=Path, help="JSON file to write")
    ap.add_argument("--only", help="comma-separated case names")
    ap.add_argument("--lean", action="store_true",
                    help="kernels without shared accesses are a bare spin (not uniform)")
    args = ap.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device", file=sys.stderr)
        return 2
    from simwar.harness.cuda import calibrate_device, device_info  # lazy: imports torch

    files = sorted(args.programs.glob("*.json"))
    if args.only:
        keep = set(args.only.split(","))
        files = [f for f in files if f.stem in keep]
    if not files:
        print(f"no programs in {args.programs}", file=sys.stderr)
        return 2
    t_all = time.time()
    cal = calibrate_device()
    collector = CsanCollector()
    results: dict = {}
    for f in files:
        t = time.time()
        results[f.stem] = r = sanitize(Program.from_json(f.read_text()), cal, collector,
                                       uniform=not args.lean)
        print(f"{f.stem}: {time.time() - t:.1f}s, simwar latent {r['latent_races']}, CSAN "
              f"shared {r['csan_shared']}, internal {r['csan_internal']}", flush=True)
    table = format_table(results)
    print(table)
    judged = [r["agree"] for r in results.values() if r["agree"] is not None]
    print(f"{sum(judged)}/{len(judged)} cases agree; total {time.time() - t_all:.0f}s")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps({
        "format": "simwar.csan", "version": 1, "device": device_info(),
        "uniform": not args.lean, "cases": results}, indent=1))
    return 0 if all(judged) else 1


if __name__ == "__main__":
    sys.exit(main())
