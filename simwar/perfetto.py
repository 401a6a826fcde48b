"""Chrome trace-event export of a Trace, for Perfetto (ui.perfetto.dev) and chrome://tracing.

The file is the JSON object form of the Trace Event Format
(``{"traceEvents": [...]}``), laid out the way torch.profiler (Kineto) lays out
its own traces so that a simulated run can be opened next to a measured one:

- one process for the host (the scheduler thread: CPU work, host API calls,
  host blocks) and one process per stream, each named by ``M`` metadata
  events and ordered host first, then the streams in ``STREAM_ORDER``;
- ``X`` (complete) slices with float µs timestamps (``ts``, ``dur``);
  slices on one track never overlap: a lane whose spans do overlap (a
  measured trace can have that) is split over extra threads of its process;
- flow events ``s``/``f`` (binding point ``e``, as Kineto writes them):
  ``launch`` flows from each host launch call to the kernel(s) it launched,
  ``record_wait`` flows from the work an event record captured to the stream
  wait (or the work) it released, ``record_sync`` flows to the host block it
  ended;
- counter tracks (``C``) on the host: ``forwards_in_flight`` (forwards
  launched and not yet finished, over time) and ``launch_ahead`` (the depth
  at each launch, the metric of ``simwar.metrics``);
- record operations as instant events (``i``) on their stream.

Also here: :func:`launch_links`, which pairs each kernel with the host API
call that launched it (the timeline plot reuses it).

Imports: the standard library, ``simwar.trace`` and ``simwar._io`` only (a trace written on
a GPU machine can be exported there).
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

from ._io import write_text_atomic
from .trace import HOST, Op, Span, Trace

#: streams in display order; others follow alphabetically
STREAM_ORDER = ("schedule", "plan", "forward", "copy", "d2h")

HOST_PID = 1
_TS_DIGITS = 3  # ns resolution: Perfetto stores integer ns


class LaunchLink(NamedTuple):
    """A kernel and the host API span that launched it (``graph``: it was a graph node)."""

    api: Span
    kernel: Span
    graph: bool


def ordered_lanes(lanes) -> list[str]:
    """``cpu`` first, then the known streams in ``STREAM_ORDER``, then the rest by name."""
    lanes = set(lanes)
    known = [s for s in STREAM_ORDER if s in lanes]
    rest = sorted(lanes - set(STREAM_ORDER) - {HOST})
    return ([HOST] if HOST in lanes else []) + known + rest


def _is_launch_call(span: Span) -> bool:
    # records, waits and syncs have fixed label shapes (engine.py); every other
    # host API span launches something
    label = span.label
    return not (label.startswith("record ") or ".wait_event(" in label
                or ".wait_stream(" in label)


def kernel_spans_by_op(trace: Trace) -> dict[int, Span]:
    """The kernel span of each kernel op, matched on lane, step, label and start."""
    spans = {(s.lane, s.step, s.label, s.start_us): s for s in trace.spans if s.kind == "kernel"}
    out = {}
    for op in trace.ops:
        if op.kind == "kernel":
            span = spans.get((op.lane, op.step, op.label, op.start_us))
            if span is not None:
                out[op.op_id] = span
    return out


def launch_links(trace: Trace) -> list[LaunchLink]:
    """Pair kernels with the host calls that launched them, per step in issue order.

    A ``Launch`` shows as an ``api`` span with the kernel's label, a
    ``GraphLaunch`` as an ``api`` span named after the graph, followed on the
    device by its node kernels; a kernel is issued when its call returns.
    Walking both in issue order, a kernel belongs to the last launch call that
    returned at or before its issue time: the call itself if the labels agree,
    otherwise the graph launch whose nodes it is.
    """
    calls: dict[int, list[Span]] = defaultdict(list)
    for s in trace.spans:
        if s.lane == HOST and s.kind == "api" and _is_launch_call(s):
            calls[s.step].append(s)
    for lst in calls.values():
        lst.sort(key=lambda s: (s.start_us, s.end_us))
    kernels = kernel_spans_by_op(trace)
    per_step: dict[int, list[Op]] = defaultdict(list)
    for op in trace.ops:
        if op.kind == "kernel" and op.op_id in kernels:
            per_step[op.step].append(op)

    links: list[LaunchLink] = []
    eps = 1e-6
    for step, ops in per_step.items():
        lst = calls.get(step, [])
        i = -1  # index of the launch call owning the previous kernel
        for op in ops:
            # advance to the last call that had returned by this kernel's issue time
            while i + 1 < len(lst) and lst[i + 1].end_us <= op.issue_us + eps:
                i += 1
                if lst[i].label == op.label:
                    break
            if i < 0:
                continue
            call = lst[i]
            links.append(LaunchLink(call, kernels[op.op_id], call.label != op.label))
    return links


# --------------------------------------------------------------------------- export
def _t(x: float) -> float:
    return float(round(x, _TS_DIGITS))


def _split_tracks(spans: list[Span]) -> list[list[tuple[float, float, Span]]]:
    """Greedy interval partitioning on rounded times: each track's slices never overlap.

    Returns tracks of ``(start, end, span)`` with the times as written to the file.
    """
    rows = sorted((_t(s.start_us), _t(s.end_us), s) for s in spans)
    tracks: list[list[tuple[float, float, Span]]] = []
    ends: list[float] = []
    for row in rows:
        for i, end in enumerate(ends):
            if row[0] >= end:
                tracks[i].append(row)
                ends[i] = row[1]
                break
        else:
            tracks.append([row])
            ends.append(row[1])
    return tracks


def _forward_ends(trace: Trace) -> dict[int, float]:
    fwd = trace.meta.get("forward_stream", "forward")
    out: dict[int, float] = {}
    for s in trace.spans:
        if s.lane == fwd and s.kind == "kernel" and s.phase:
            out[s.step] = max(out.get(s.step, s.end_us), s.end_us)
    return out


def chrome_trace(trace: Trace) -> dict:
    """The trace as a Chrome trace-event JSON object (see the module docstring)."""
    lanes = ordered_lanes({s.lane for s in trace.spans} | {op.lane for op in trace.ops})
    pid = {lane: HOST_PID + i for i, lane in enumerate(lanes)}
    events: list[dict] = []
    by_lane: dict[str, list[Span]] = defaultdict(list)
    for s in trace.spans:
        by_lane[s.lane].append(s)

    # where each span landed: (pid, tid); used to bind flows
    where: dict[Span, tuple[int, int]] = {}
    for i, lane in enumerate(lanes):
        p = pid[lane]
        pname = "host" if lane == HOST else f"stream {lane}"
        events.append({"ph": "M", "name": "process_name", "pid": p, "tid": 0,
                       "args": {"name": pname}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": p, "tid": 0,
                       "args": {"sort_index": i}})
        tracks = _split_tracks(by_lane.get(lane, [])) or [[]]
        for j, track in enumerate(tracks):
            tid = j + 1
            tname = lane if j == 0 else f"{lane} (overlapping {j})"
            events.append({"ph": "M", "name": "thread_name", "pid": p, "tid": tid,
                           "args": {"name": tname}})
            for start, end, s in track:
                where[s] = (p, tid)
                args = {"step": s.step, "kind": s.kind}
                if s.phase:
                    args["phase"] = s.phase
                if s.site:
                    args["site"] = s.site
                events.append({"ph": "X", "name": s.label, "cat": s.kind, "pid": p, "tid": tid,
                               "ts": start, "dur": _t(end - start), "args": args})

    for op in trace.ops:
        if op.kind == "record" and op.start_us >= 0:
            events.append({"ph": "i", "s": "t", "name": f"record {op.event}", "cat": "record",
                           "pid": pid[op.lane], "tid": 1, "ts": _t(op.start_us),
                           "args": {"step": op.step, "event": op.event}})

    events.extend(_counters(trace))
    events.extend(_flows(trace, where, by_lane))
    meta = {k: v for k, v in trace.meta.items() if isinstance(v, (str, int, float, bool))}
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "simwar", **meta}}


def _counters(trace: Trace) -> list[dict]:
    """forwards_in_flight (+1 at each launch, -1 at each forward end) and launch_ahead."""
    launches = {m.step: m.time_us for m in trace.markers if m.name == "run_batch"}
    ends = _forward_ends(trace)
    changes = [(t, +1) for k, t in launches.items() if k in ends]
    changes += [(t, -1) for k, t in ends.items() if k in launches]
    # at equal times a forward's end is counted before the next launch, as in metrics
    changes.sort(key=lambda c: (c[0], c[1]))
    out = []
    depth = 0
    for t, d in changes:
        depth += d
        out.append({"ph": "C", "name": "forwards_in_flight", "pid": HOST_PID, "tid": 0,
                    "ts": _t(t), "args": {"forwards": depth}})
    # forward ends are in FIFO (step) order on the forward stream, so a prefix search counts
    # the forwards before k that had finished by launch k
    steps = sorted(k for k in ends if k in launches)
    end_times = [ends[k] for k in steps]
    for k, t in sorted(launches.items()):
        before = bisect.bisect_left(steps, k)
        ahead = before - bisect.bisect_right(end_times[:before], t)
        out.append({"ph": "C", "name": "launch_ahead", "pid": HOST_PID, "tid": 0,
                    "ts": _t(t), "args": {"depth": ahead}})
    return out


def _flows(trace: Trace, where: dict, by_lane: dict[str, list[Span]]) -> list[dict]:
    out: list[dict] = []
    flow_id = 0

    def near(s: Span, end: bool) -> float:
        # a binding point 1 ns inside the slice (Perfetto binds 'e' flows to the slice
        # enclosing ts), at the end the edge leaves or enters by, so that time runs forward
        start, stop = _t(s.start_us), _t(s.end_us)
        inset = min(10 ** -_TS_DIGITS, (stop - start) / 2)
        return _t(stop - inset) if end else _t(start + inset)

    def add(cat: str, name: str, src: Span, dst: Span, args: dict) -> None:
        nonlocal flow_id
        flow_id += 1
        (sp, st), (dp, dt) = where[src], where[dst]
        out.append({"ph": "s", "id": flow_id, "cat": cat, "name": name, "pid": sp, "tid": st,
                    "ts": near(src, end=True), "bp": "e", "args": args})
        # a wait or host block is left at its end; work is entered at its start
        out.append({"ph": "f", "id": flow_id, "cat": cat, "name": name, "pid": dp, "tid": dt,
                    "ts": near(dst, end=dst.kind in ("wait", "blocked")), "bp": "e",
                    "args": args})

    for link in launch_links(trace):
        add("launch", link.api.label, link.api, link.kernel,
            {"step": link.kernel.step, "graph": link.graph})

    lanes = {lane: _LaneIndex(spans) for lane, spans in by_lane.items()}
    empty = _LaneIndex([])
    for e in trace.edges():
        src = lanes.get(e.src_lane, empty).captured_by(e.src_us)
        dst = lanes.get(e.dst_lane, empty).released(e.dst_us, e.kind)
        if src is not None and dst is not None and src in where and dst in where:
            add(e.kind, e.event, src, dst, {"step": e.step, "event": e.event})
    return out


class _LaneIndex:
    """One lane's spans, searchable by time (an edge's two ends are looked up here)."""

    _EPS = 1e-6

    def __init__(self, spans: list[Span]):
        self.kernels = sorted((s for s in spans if s.kind == "kernel"), key=lambda s: s.end_us)
        self.kernel_ends = [s.end_us for s in self.kernels]
        self.work = sorted((s for s in spans if s.kind in ("kernel", "cpu", "api")),
                           key=lambda s: s.start_us)
        self.work_starts = [s.start_us for s in self.work]
        self.held = {}  # (kind, rounded end) -> the wait or host block ending then
        for s in spans:
            if s.kind in ("wait", "blocked"):
                self.held[(s.kind, _t(s.end_us))] = s

    def captured_by(self, t: float) -> Span | None:
        """The last kernel finished by the time a record fired: the work it captured."""
        i = bisect.bisect_right(self.kernel_ends, t + self._EPS)
        return self.kernels[i - 1] if i else None

    def released(self, t: float, kind: str) -> Span | None:
        """The wait (or host block) the edge ended at ``t``, else the next work after ``t``."""
        held = self.held.get(("blocked" if kind == "record_sync" else "wait", _t(t)))
        if held is not None:
            return held
        i = bisect.bisect_left(self.work_starts, t - self._EPS)
        return self.work[i] if i < len(self.work) else None


def write_chrome_trace(trace: Trace, path: str | Path) -> Path:
    """Write :func:`chrome_trace` as JSON (``.json``; Perfetto also reads ``.json.gz``)."""
    return write_text_atomic(path, json.dumps(chrome_trace(trace), separators=(",", ":")))
