"""Views of a Trace: windows of steps, lanes, launch links and the look-ups plots need.

Each view is a function of a Trace that reads its columns and its explicit
relations (op ids, ``ops.call``, ``ops.bound``, ``spans.op``, the typed call
kinds); none parses a label or joins by time. Plots and the Chrome-trace
exporter draw and export what these return.

- :func:`window`: steps ``first..last`` as a :class:`Window` of ids into the
  trace (span ids stay the trace's own, so races and edges still point at
  them). It costs O(window) Python work: spans are a slice
  (``trace.step_slice``), ops are found with ``np.searchsorted`` on
  ``ops.step`` (a mask when a trace's op steps are not sorted).
- :func:`lanes`, :func:`ordered_lanes`: the lanes in display order.
- :func:`launch_links`: each kernel with the host call that issued it, from
  ``ops.call`` and the call's kind (a graph launch makes it a graph node);
  :func:`ops_of_call`: the ops one host call issued.
- :func:`op_spans`, :func:`lane_ops`, :func:`lane_spans`: the span of an op,
  the ops of a lane in issue order, the spans of a lane in a time range;
  :func:`previous_kernel` / :func:`next_kernel` on a lane (the work a record
  captured, the work a wait released); :func:`forwards`: each step's forward
  (first kernel, extent); :func:`span_row`: one named span in O(1).
- :func:`call_text`, :func:`span_text`: display text of host calls and
  spans, composed from the call kind, the label and the op's lane (e.g.
  ``schedule.wait_stream(forward)``, ``forward.wait_event(read_done[5])``).

Whole-trace indexes (per-lane orders, the op → span index) are numpy passes
over the columns, built once per Trace and cached (Traces are read-only).

Imports: numpy and ``simwar.core.trace`` only (a trace written on a GPU machine
can be exported there).
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import numpy as np

from simwar.core.trace import CALLS, HOST, SPAN_KINDS, Call, Edge, OpKind, Span, SpanKind, Trace

#: streams in display order; others follow alphabetically
STREAM_ORDER = ("schedule", "plan", "forward", "copy", "d2h")

_CACHE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cached(trace: Trace, key: str, build):
    """``build()`` once per trace (indexes over read-only columns)."""
    store = _CACHE.get(trace)
    if store is None:
        store = _CACHE[trace] = {}
    if key not in store:
        store[key] = build()
    return store[key]


def trace_of(data) -> Trace:
    """The Trace of a Trace, a Window or a Result."""
    trace = getattr(data, "trace", data)
    if not isinstance(trace, Trace):
        raise TypeError(f"expected a Trace, a Window or a Result, got {type(data).__name__}")
    return trace


# --------------------------------------------------------------------------- lanes
def ordered_lanes(lanes) -> list[str]:
    """``cpu`` first, then the known streams in ``STREAM_ORDER``, then the rest by name."""
    lanes = set(lanes)
    known = [s for s in STREAM_ORDER if s in lanes]
    rest = sorted(lanes - set(STREAM_ORDER) - {HOST})
    return ([HOST] if HOST in lanes else []) + known + rest


def lanes(trace: Trace, ops: bool = True) -> list[str]:
    """The trace's lanes in display order: ``cpu``, then those with spans (and ops)."""
    codes = np.unique(trace.spans.lane)
    if ops:
        codes = np.union1d(codes, np.unique(trace.ops.lane))
    return ordered_lanes({HOST} | {trace.text(int(c)) for c in codes})


# --------------------------------------------------------------------------- windows
def ops_of_steps(trace: Trace, first: int, last: int) -> np.ndarray:
    """Op ids of steps ``first..last``, in issue order."""
    steps = trace.ops.step
    if _cached(trace, "ops_sorted", lambda: bool(np.all(steps[1:] >= steps[:-1]))):
        lo = int(np.searchsorted(steps, first, side="left"))
        hi = int(np.searchsorted(steps, last, side="right"))
        return np.arange(lo, hi)
    return np.flatnonzero((steps >= first) & (steps <= last))


class Window:
    """Steps ``first..last`` (inclusive) of a trace, as ids into it.

    - ``spans``: span ids of those steps (a slice of the trace, as an array),
      plus the host calls that issued their ops when those lie outside it;
    - ``ops``: op ids of those steps, in issue order; ``bound_ops``: the
      records they bound to that belong to other steps;
    - ``markers``: marker ids of those steps.

    Lookups by op (:meth:`span_of`) use the window's own spans only.
    """

    def __init__(self, trace: Trace, first: int, last: int):
        self.trace, self.first, self.last = trace, int(first), int(last)
        self.span_slice = trace.step_slice(first, last)
        own = np.arange(self.span_slice.start, self.span_slice.stop)
        self.ops = ops_of_steps(trace, first, last)
        calls = trace.ops.call[self.ops]
        calls = calls[(calls >= 0) & ((calls < self.span_slice.start)
                                      | (calls >= self.span_slice.stop))]
        self.spans = np.union1d(own, calls) if len(calls) else own
        bound = trace.ops.bound[self.ops]
        self.bound_ops = np.setdiff1d(bound[bound >= 0], self.ops)
        m = trace.markers.step
        self.markers = np.flatnonzero((m >= first) & (m <= last))
        # op -> span over the window's spans: device spans (kernel, wait) and host blocks
        kinds = trace.spans.kind[own]
        op_of = trace.spans.op[own]
        pick = (op_of >= 0) & ((kinds == SpanKind.KERNEL) | (kinds == SpanKind.WAIT)
                               | (kinds == SpanKind.BLOCKED))
        order = np.argsort(op_of[pick], kind="stable")
        self._span_ops = op_of[pick][order]
        self._span_ids = own[pick][order]

    def span_of(self, op_ids) -> np.ndarray:
        """The span of each op (kernel, wait or host block; -1: none in this window)."""
        op_ids = np.asarray(op_ids, dtype=np.int64)
        if not len(self._span_ops):
            return np.full(len(op_ids), -1, dtype=np.int64)
        i = np.minimum(np.searchsorted(self._span_ops, op_ids), len(self._span_ops) - 1)
        hit = self._span_ops[i] == op_ids
        return np.where(hit, self._span_ids[i], -1)

    def __len__(self) -> int:
        return len(self.spans)

    def __repr__(self) -> str:
        return (f"Window(steps {self.first}..{self.last}: {len(self.spans)} spans, "
                f"{len(self.ops)} ops)")


def window(trace: Trace, first: int, last: int) -> Window:
    """Steps ``first..last`` (inclusive) of ``trace``: O(window) Python work."""
    return Window(trace_of(trace), first, last)


# --------------------------------------------------------------------------- indexes
def ops_of_call(trace: Trace, call: int) -> list[int]:
    """The ops host call span ``call`` issued (``ops.call == call``), in op order.

    The index is built on first use and cached (a Trace is not changed once recorded), so
    that asking for every call of a trace stays linear.
    """
    def build():
        index: dict[int, list[int]] = {}
        for o, c in enumerate(trace.ops.call.tolist()):
            if c >= 0:
                index.setdefault(c, []).append(o)
        return index

    return _cached(trace, "ops_of_call", build).get(call, [])


def op_spans(trace: Trace) -> np.ndarray:
    """Per op, the span id of its device span (kernel, wait) or host block (-1: none)."""
    def build():
        spans = trace.spans
        kinds = spans.kind
        ids = np.flatnonzero((spans.op >= 0) & ((kinds == SpanKind.KERNEL)
                                                | (kinds == SpanKind.WAIT)
                                                | (kinds == SpanKind.BLOCKED)))
        out = np.full(len(trace.ops), -1, dtype=np.int64)
        out[spans.op[ids][::-1]] = ids[::-1]  # the first span of an op wins
        out.flags.writeable = False
        return out

    return _cached(trace, "op_spans", build)


def _lane_index(trace: Trace):
    """Op ids grouped by lane, each group in issue order, and the group bounds by lane code."""
    def build():
        lane = trace.ops.lane
        order = np.argsort(lane, kind="stable")
        codes, starts = np.unique(lane[order], return_index=True)
        ends = np.append(starts[1:], len(order))
        return order, {int(c): (int(a), int(b)) for c, a, b in zip(codes, starts, ends)}

    return _cached(trace, "lane_ops", build)


def lane_ops(trace: Trace, lane: str | int) -> np.ndarray:
    """Op ids issued on ``lane`` (a name or a string code), in issue order."""
    code = trace.code(lane) if isinstance(lane, str) else int(lane)
    order, bounds = _lane_index(trace)
    a, b = bounds.get(code, (0, 0))
    return order[a:b]


def lane_position(trace: Trace, op: int) -> tuple[np.ndarray, int]:
    """``(ops of op's lane in issue order, op's index among them)``."""
    on_lane = lane_ops(trace, int(trace.ops.lane[op]))
    return on_lane, int(np.searchsorted(on_lane, op))


def _kernel_neighbours(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """Per op: the last kernel op issued on its lane before it, and the first after (-1)."""
    def build():
        order, bounds = _lane_index(trace)
        n = len(order)
        pos = np.arange(n)
        group = np.zeros(n, dtype=np.int64)  # where each position's lane group starts
        group_end = np.full(n, n, dtype=np.int64)
        for a, b in bounds.values():
            group[a:b] = a
            group_end[a:b] = b
        is_kernel = trace.ops.kind[order] == OpKind.KERNEL
        at_or_before = np.maximum.accumulate(np.where(is_kernel, pos, -1))
        before = np.append(-1, at_or_before[:-1])
        before = np.where(before >= group, before, -1)
        at_or_after = np.minimum.accumulate(np.where(is_kernel, pos, n)[::-1])[::-1]
        after = np.append(at_or_after[1:], n)
        after = np.where(after < group_end, after, n)
        prev = np.full(n, -1, dtype=np.int64)
        nxt = np.full(n, -1, dtype=np.int64)
        prev[order] = np.where(before >= 0, order[np.maximum(before, 0)], -1)
        nxt[order] = np.where(after < n, order[np.minimum(after, n - 1)], -1)
        prev.flags.writeable = False
        nxt.flags.writeable = False
        return prev, nxt

    return _cached(trace, "kernel_neighbours", build)


def previous_kernel(trace: Trace, op):
    """The last kernel op issued on ``op``'s lane before it (-1: none); ops: an array works."""
    prev = _kernel_neighbours(trace)[0][op]
    return int(prev) if np.ndim(prev) == 0 else prev


def next_kernel(trace: Trace, op):
    """The first kernel op issued on ``op``'s lane after it (-1: none); ops: an array works."""
    nxt = _kernel_neighbours(trace)[1][op]
    return int(nxt) if np.ndim(nxt) == 0 else nxt


def _lane_span_index(trace: Trace):
    """Spans grouped by lane, each group by start time, with the running maximum of ends."""
    def build():
        spans = trace.spans
        order = np.lexsort((spans.start_us, spans.lane))
        lane_sorted = spans.lane[order]
        codes, starts = np.unique(lane_sorted, return_index=True)
        ends = np.append(starts[1:], len(order))
        out = {}
        for c, a, b in zip(codes.tolist(), starts.tolist(), ends.tolist()):
            ids = order[a:b]
            out[c] = (ids, spans.start_us[ids], np.maximum.accumulate(spans.end_us[ids]))
        return out

    return _cached(trace, "lane_spans", build)


def lane_spans(trace: Trace, lane: str | int, t0: float, t1: float) -> np.ndarray:
    """Span ids on ``lane`` that overlap ``[t0, t1]``, by start time."""
    code = trace.code(lane) if isinstance(lane, str) else int(lane)
    entry = _lane_span_index(trace).get(code)
    if entry is None:
        return np.zeros(0, dtype=np.int64)
    ids, starts, reach = entry
    lo = int(np.searchsorted(reach, t0, side="left"))  # first span whose lane reached t0
    hi = int(np.searchsorted(starts, t1, side="right"))
    cand = ids[lo:hi]
    return cand[trace.spans.end_us[cand] >= t0]


def spans_between(trace: Trace, t0: float, t1: float) -> np.ndarray:
    """Span ids of every lane that overlap ``[t0, t1]``, ascending."""
    parts = [lane_spans(trace, c, t0, t1) for c in _lane_span_index(trace)]
    return np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def forward_kernels(trace: Trace) -> np.ndarray:
    """Op ids of the forward's kernels: phased kernel ops on the forward stream."""
    def build():
        ops = trace.ops
        fwd = trace.code(trace.run.forward_stream)
        out = np.flatnonzero((ops.kind == OpKind.KERNEL) & (ops.lane == fwd)
                             & (ops.phase != trace.code("")))
        out.flags.writeable = False
        return out

    return _cached(trace, "forward_kernels", build)


class Forwards(NamedTuple):
    """Per step with forward kernels: its first kernel op and the forward's extent."""

    steps: np.ndarray
    first_op: np.ndarray  # the forward's earliest-starting kernel
    start_us: np.ndarray
    end_us: np.ndarray
    issue_us: np.ndarray  # when the host issued the forward's first-issued kernel


def forwards(trace: Trace) -> Forwards:
    """The forward of every step (the same extents as ``analysis.metrics.step_frame``)."""
    def build():
        ops = trace.ops
        kern = forward_kernels(trace)
        steps, inv = np.unique(ops.step[kern], return_inverse=True)
        start = np.full(len(steps), np.inf)
        end = np.full(len(steps), -np.inf)
        issue = np.full(len(steps), np.inf)
        np.minimum.at(start, inv, ops.start_us[kern])
        np.maximum.at(end, inv, ops.end_us[kern])
        np.minimum.at(issue, inv, ops.issue_us[kern])
        order = np.lexsort((kern, ops.start_us[kern], inv))  # per step: earliest start
        first = np.full(len(steps), -1, dtype=np.int64)
        first[inv[order][::-1]] = kern[order][::-1]
        for arr in (steps, first, start, end, issue):
            arr.flags.writeable = False
        return Forwards(steps, first, start, end, issue)

    return _cached(trace, "forwards", build)


# --------------------------------------------------------------------------- relations
class LaunchLink(NamedTuple):
    """A kernel and the host call that issued it, by id (``graph``: a CUDA-graph node)."""

    call: int  # span id of the host call
    op: int  # the kernel's op id
    span: int  # the kernel's span id (-1: not in the trace)
    graph: bool


def launch_links(data) -> list[LaunchLink]:
    """Each kernel op with the host call that issued it (``ops.call``), for a Trace or Window.

    ``graph`` is the issuing call's kind (a graph launch); the kernel's span is
    the span whose ``op`` is the kernel. Kernels whose call is unknown (-1: a
    capture without the launch) have no link.
    """
    trace = trace_of(data)
    ops = trace.ops
    ids = data.ops if isinstance(data, Window) else np.arange(len(ops))
    kern = ids[(ops.kind[ids] == OpKind.KERNEL) & (ops.call[ids] >= 0)]
    calls = ops.call[kern]
    graph = trace.spans.call[calls] == Call.GRAPH_LAUNCH
    span = data.span_of(kern) if isinstance(data, Window) else op_spans(trace)[kern]
    return [LaunchLink(c, o, s, g) for c, o, s, g in
            zip(calls.tolist(), kern.tolist(), span.tolist(), graph.tolist())]


def graph_node(data, op_ids=None) -> np.ndarray:
    """Per op of ``op_ids`` (default: the window's or trace's ops): issued by a graph launch."""
    trace = trace_of(data)
    if op_ids is None:
        if not isinstance(data, Window):
            return trace.graph_node()
        op_ids = data.ops
    op_ids = np.asarray(op_ids, dtype=np.int64)
    calls = trace.ops.call[op_ids]
    out = np.zeros(len(op_ids), dtype=bool)
    has = calls >= 0
    out[has] = trace.spans.call[calls[has]] == Call.GRAPH_LAUNCH
    return out


def edges(data) -> list[Edge]:
    """:meth:`Trace.edges` of a Trace, or of a Window's ops (edges into them)."""
    if not isinstance(data, Window):
        return trace_of(data).edges()
    ops = data.trace.ops
    ids = data.ops
    kind, call, bound = ops.kind[ids], ops.call[ids], ops.bound[ids]
    out: list[Edge] = []
    k = (kind == OpKind.KERNEL) & (call >= 0)
    out += [Edge("launch", s, d) for s, d in zip(call[k].tolist(), ids[k].tolist())]
    for op_kind, name in ((OpKind.WAIT, "record_wait"), (OpKind.SYNC, "record_sync")):
        k = (kind == op_kind) & (bound >= 0)
        out += [Edge(name, s, d) for s, d in zip(bound[k].tolist(), ids[k].tolist())]
    return out


def span_row(trace: Trace, span: int) -> Span:
    """One span as a named row with text decoded (O(1), unlike ``Table.rows``)."""
    spans, text = trace.spans, trace.text
    return Span(text(int(spans.lane[span])), text(int(spans.label[span])),
                SPAN_KINDS[int(spans.kind[span])], int(spans.step[span]),
                float(spans.start_us[span]), float(spans.end_us[span]),
                text(int(spans.phase[span])), text(int(spans.site[span])), int(spans.op[span]),
                CALLS[int(spans.call[span])], int(span))


# --------------------------------------------------------------------------- display text
def call_text(trace: Trace, span: int) -> str:
    """A host call as shown: its call kind, label and the lane of the op it issued.

    ``schedule.wait_stream(forward)``, ``forward.wait_event(read_done[5])``,
    ``record copy_done[5]``, ``sync copy_done[4]``; launches and CPU work show
    their label.
    """
    spans, ops = trace.spans, trace.ops
    call = int(spans.call[span])
    label = trace.text(int(spans.label[span]))
    op = int(spans.op[span])
    if call in (Call.WAIT_EVENT, Call.WAIT_STREAM, Call.RECORD, Call.SYNCHRONIZE):
        event = trace.text(int(ops.event[op])) if op >= 0 else ""
        if call == Call.WAIT_STREAM:
            return f"{trace.text(int(ops.lane[op])) if op >= 0 else '?'}.wait_stream({label})"
        if call == Call.WAIT_EVENT:
            lane = trace.text(int(ops.lane[op])) if op >= 0 else "?"
            return f"{lane}.wait_event({event or label})"
        return f"{'record' if call == Call.RECORD else 'sync'} {event or label}"
    return label


def wait_text(trace: Trace, op: int) -> str:
    """What a stream wait waits for: the other stream (wait_stream) or the event."""
    ops, spans = trace.ops, trace.spans
    call = int(ops.call[op])
    if call >= 0 and spans.call[call] == Call.WAIT_STREAM:
        return trace.text(int(spans.label[call]))
    return trace.text(int(ops.event[op])) or trace.text(int(ops.label[op]))


def span_text(trace: Trace, span: int) -> str:
    """A span as shown: host calls by :func:`call_text`, waits as ``wait for X``."""
    spans = trace.spans
    if spans.call[span] != Call.NONE:
        return call_text(trace, span)
    if spans.kind[span] == SpanKind.WAIT and spans.op[span] >= 0:
        return f"wait for {wait_text(trace, int(spans.op[span]))}"
    return trace.text(int(spans.label[span]))
