"""Forward-stream bubbles and their causes, found by following the trace's relations.

A bubble is an idle gap on the forward stream before forward k: from the end
of the previous forward to the start of forward k (``fwd_gap_us`` of
:mod:`simwar.analysis.metrics`). Its cause is found by walking the
synchronization backwards, by ids (never by matching labels or times):

- the wait that held the forward stream: among the ops issued on that
  stream just before the forward's first kernel (back to the previous
  kernel), the wait op whose span ends when the kernel starts;
- the record that released it is the wait's ``ops.bound``; the host call
  that issued the wait is its ``ops.call`` (its call kind, label and lane
  make the text, e.g. ``forward.wait_stream(schedule)``);
- the work that record captured is the kernels issued before it on its
  stream; those that ran inside the gap delayed the record, and the wait
  that held *that* stream before them is the next link (at most three);
- with no wait, the host: nothing was enqueued, because the CPU issued the
  forward late (the host spans over the gap say whether it was blocked or
  busy).

:func:`bubbles` examines only the steps of its ``window`` (per-step
forward extents and per-lane op orders are numpy indexes built once per
trace); :func:`story` tells one bubble's cause as sentences.

Imports: numpy and simwar's trace-level modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from simwar.analysis import views
from simwar.core.trace import HOST, OpKind, Span, SpanKind, Trace

_EPS = 1e-6
_NAN = float("nan")


class Hop(NamedTuple):
    """One link of a bubble's cause: ``lane`` was held by ``span`` (a stream wait)."""

    lane: str
    span: Span
    released_by: str  # the lane of the record that released it ('' when it bound to none)
    api_label: str  # the host call that issued the wait ('' when unknown)
    released_at_us: float = _NAN  # when the releasing record fired
    wait: int = -1  # op id of the wait
    record: int = -1  # op id of the record that released it (-1: none)


@dataclass(frozen=True)
class Bubble:
    """An idle gap on the forward stream before forward ``step``, and why it happened."""

    step: int
    start_us: float
    end_us: float
    hops: tuple[Hop, ...]
    cause: str  # one-line explanation
    kernel: int = -1  # op id of the forward's first kernel, the one that started late

    @property
    def idle_us(self) -> float:
        return self.end_us - self.start_us


def bubbles(data, window: tuple[int, int] | None = None, min_us: float = 1.0) -> list[Bubble]:
    """Forward-stream gaps of at least ``min_us`` before forwards in ``window`` (default: all).

    ``data``: a Result, a Trace or a :class:`views.Window` (whose steps are then
    the default window). Only the steps of the window are examined. Each gap's
    cause is found by walking the synchronization backwards from the forward
    that started late (see the module docstring).
    """
    trace = views.trace_of(data)
    if window is None and isinstance(data, views.Window):
        window = (data.first, data.last)
    fw = views.forwards(trace)
    if window is None:
        lo, hi = 0, len(fw.steps)
    else:
        lo = int(np.searchsorted(fw.steps, window[0], side="left"))
        hi = int(np.searchsorted(fw.steps, window[1], side="right"))
    walk = BubbleWalk(trace)
    out = []
    for i in range(max(lo, 1), hi):  # the first forward has no gap
        end = float(fw.start_us[i])
        gap = end - float(fw.end_us[i - 1])
        if not np.isfinite(gap) or gap < min_us:
            continue
        start = end - gap
        step, kernel = int(fw.steps[i]), int(fw.first_op[i])
        hops = walk.hops(kernel, start, end)
        out.append(Bubble(step, start, end, tuple(hops),
                          walk.explain(step, float(fw.issue_us[i]), start, end, hops), kernel))
    return out


def story(data, b: Bubble) -> list[str]:
    """A bubble's cause as sentences, from the root wait to the forward that started late."""
    if not b.hops:
        return [b.cause]
    walk = data if isinstance(data, BubbleWalk) else BubbleWalk(views.trace_of(data))
    trace, ops = walk.trace, walk.ops
    fwd = b.hops[0].lane
    root = b.hops[-1]
    captured = -1
    if root.record >= 0:  # the work the root's record captured: the kernel issued before it
        k = views.previous_kernel(trace, root.record)
        if k >= 0 and abs(ops.end_us[k] - root.released_at_us) < _EPS:
            captured = k
    what = (f"{walk.label(captured)} of step {int(ops.step[captured])}" if captured >= 0
            else f"its {root.released_by} work")
    barrier = trace.run.barrier_effective or ""
    role = (f" (the {barrier} WAR barrier)" if barrier and root.released_by == fwd
            and root.lane != fwd else "")
    call = root.api_label or f"a wait on {root.lane}"
    lines = [f"{call}{role} holds the {root.lane} stream until {what} finishes."]
    if captured >= 0 and root.released_by != fwd:
        late = walk.late_issue(captured, b.start_us)
        if late:
            lines.append(late)
    hops = list(b.hops)
    for upstream, downstream in zip(reversed(hops), list(reversed(hops))[1:]):
        # what the upstream stream ran once released, up to the record the downstream wait bound to
        work = walk.kernels_between(upstream.wait, downstream.record)
        names = ", ".join(dict.fromkeys(walk.label(k) for k in work)) or "its work"
        lines.append(f"Only then does the {upstream.lane} stream run {names}; "
                     f"{downstream.api_label or downstream.lane + ' waits'} makes the "
                     f"{downstream.lane} stream wait for it.")
    lines.append(f"Result: {fwd} idles {b.idle_us:.0f} µs before forward {b.step}.")
    return lines


class BubbleWalk:
    """The look-ups of the cause walk, on a trace's ids and per-lane op orders."""

    def __init__(self, trace: Trace):
        self.trace = trace
        self.ops = trace.ops
        self.spans = trace.spans
        self.fwd = trace.run.forward_stream
        self.op_span = views.op_spans(trace)

    def label(self, op: int) -> str:
        return self.trace.text(int(self.ops.label[op]))

    # ---- the walk
    def held(self, x: int, t: float, gap_start: float) -> int:
        """The wait op that held ``x``'s stream until ``t``: issued on that stream before ``x``
        (back to the previous kernel), its span ending at ``t`` (or still holding then)."""
        ops, spans, op_span = self.ops, self.spans, self.op_span
        on_lane, i = views.lane_position(self.trace, x)
        best, best_end = -1, -np.inf
        while i > 0:
            i -= 1
            o = int(on_lane[i])
            kind = ops.kind[o]
            if kind == OpKind.KERNEL:
                break
            if kind != OpKind.WAIT or op_span[o] < 0:
                continue
            s = op_span[o]
            ws, we = spans.start_us[s], spans.end_us[s]
            if abs(we - t) < _EPS or (ws < t <= we + _EPS and we > gap_start):
                if we >= best_end:  # walking back: on a tie the earlier wait
                    best, best_end = o, we
        return best

    def captured(self, record: int, gap_start: float) -> list[int]:
        """Kernels issued before ``record`` on its stream that ran inside the gap, in order."""
        ops = self.ops
        on_lane, i = views.lane_position(self.trace, record)
        fired = ops.end_us[record]
        out = []
        while i > 0:
            i -= 1
            o = int(on_lane[i])
            if ops.kind[o] != OpKind.KERNEL:
                continue
            if ops.start_us[o] < gap_start - _EPS:
                break
            if ops.end_us[o] <= fired + _EPS:
                out.append(o)
        return out[::-1]

    def kernels_between(self, after: int, before: int) -> list[int]:
        """Kernel ops issued on ``after``'s stream after it and before op ``before``."""
        on_lane, i = views.lane_position(self.trace, after)
        j = int(np.searchsorted(on_lane, before))
        between = on_lane[i + 1:j]
        return between[self.ops.kind[between] == OpKind.KERNEL].tolist()

    def hops(self, kernel: int, start: float, end: float) -> list[Hop]:
        trace, ops = self.trace, self.ops
        hops: list[Hop] = []
        x, t = kernel, end
        for _ in range(3):
            wait = self.held(x, t, start)
            if wait < 0:
                break
            lane = trace.text(int(ops.lane[wait]))
            record = int(ops.bound[wait])
            src = trace.text(int(ops.lane[record])) if record >= 0 else ""
            call = int(ops.call[wait])
            fired = float(ops.end_us[record]) if record >= 0 else _NAN
            hops.append(Hop(lane, views.span_row(trace, int(self.op_span[wait])), src,
                            views.call_text(trace, call) if call >= 0 else "", fired, wait,
                            record))
            if record < 0 or src == lane:
                break
            # the record's stream ran work inside the gap before it fired: what held that
            # stream before the work is the next link
            work = self.captured(record, start)
            x = work[0] if work else record
            t = float(ops.start_us[x]) if work else fired
            if t <= start + _EPS:
                break
        return hops

    # ---- the words
    def explain(self, step: int, issued: float, start: float, end: float,
                hops: list[Hop]) -> str:
        fwd = self.fwd
        idle = f"{end - start:.0f} µs"
        if not hops:
            return self._host_cause(step, issued, start, end, idle)
        parts = [f"{fwd} idle {idle} before forward {step}"]
        for hop in hops:
            if not hop.released_by:
                parts.append(f"{hop.lane} held by "
                             f"'{views.span_text(self.trace, int(self.op_span[hop.wait]))}'")
                continue
            work = self.captured(hop.record, start)
            names = ", ".join(dict.fromkeys(self.label(k) for k in work))
            waiting = f"{hop.lane} waits for {hop.released_by}" + (f" ({names})" if names else "")
            issued_by = f" [{hop.api_label}]" if hop.api_label else ""
            parts.append(waiting + issued_by)
        return parts[0] + ": " + "; ".join(parts[1:])

    def _host_cause(self, step: int, issued: float, start: float, end: float,
                    idle: str) -> str:
        """Nothing held the forward stream: what the host was doing until it issued it."""
        fwd, spans = self.fwd, self.spans
        issued = issued if np.isfinite(issued) else end
        ids = np.sort(views.lane_spans(self.trace, HOST, start, issued))
        kinds = spans.kind[ids]
        keep = (((kinds == SpanKind.BLOCKED) | (kinds == SpanKind.CPU))
                & (spans.end_us[ids] > start) & (spans.start_us[ids] < issued))
        host = ids[keep]
        head = f"{fwd} idle {idle} before forward {step}: nothing was enqueued"
        blocked = host[spans.kind[host] == SpanKind.BLOCKED]
        if len(blocked):
            last = int(blocked[np.argmax(spans.end_us[blocked])])
            last_end = float(spans.end_us[last])
            return (f"{head}; the CPU was blocked in {views.span_text(self.trace, last)} "
                    f"({self.trace.text(int(spans.site[last]))}) until {last_end - start:.0f} "
                    f"µs into the gap, then took {issued - last_end:.0f} µs to launch the "
                    f"forward")
        if len(host):
            overlap = (np.minimum(spans.end_us[host], end)
                       - np.maximum(spans.start_us[host], start))
            worst = int(host[np.argmax(overlap)])
            return f"{head}; the CPU was busy with {views.span_text(self.trace, worst)}"
        return head

    def late_issue(self, kernel: int, gap_start: float) -> str:
        """Why the host issued ``kernel`` late, if it did: the block and the CPU work before it."""
        trace, ops, spans = self.trace, self.ops, self.spans
        issue = float(ops.issue_us[kernel])
        start = float(ops.start_us[kernel])
        # the kernel started as soon as it was issued, and that was inside the gap: the host
        # was late
        if not issue > gap_start or start - issue > 1.0 + 1e-6 * issue:
            return ""
        # the host calls of its iteration before the launch call
        step = int(ops.step[kernel])
        sl = trace.step_slice(step, step)
        ids = np.arange(sl.start, sl.stop)
        ids = ids[spans.lane[ids] == trace.code(HOST)]
        call = int(ops.call[kernel])
        ids = ids[ids < call] if call >= 0 else ids[spans.end_us[ids] <= issue + _EPS]
        text = f"The CPU issued {self.label(kernel)} only {issue - gap_start:.0f} µs into the gap"
        blocked = ids[spans.kind[ids] == SpanKind.BLOCKED]
        if not len(blocked):
            return text + "."
        last = int(blocked[np.argmax(spans.end_us[blocked])])
        last_end = float(spans.end_us[last])
        work = ids[(spans.kind[ids] == SpanKind.CPU) & (spans.start_us[ids] >= last_end - _EPS)]
        spent = ", ".join(f"{trace.text(int(spans.label[s]))} "
                          f"{spans.end_us[s] - spans.start_us[s]:.0f} µs" for s in work.tolist())
        when = (f"{gap_start - last_end:.0f} µs before the gap opened" if last_end <= gap_start
                else f"{last_end - gap_start:.0f} µs into the gap")
        return (text + f": it was blocked in {views.span_text(trace, last)} "
                f"({trace.text(int(spans.site[last]))}) until {when}, then ran "
                f"{spent or 'host calls'} before the launch.")
