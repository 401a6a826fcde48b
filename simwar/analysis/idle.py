"""Idle time of each stream, split by cause in the manner of Holistic Trace Analysis.

:func:`idle_breakdown` walks each stream's device ops in start order and
files every gap between one op's start and the end of the work before it
(the stream's running tail) under one cause; :func:`gap_cause` decides it
from the gap, the call that launched the op and the previous op's end:

- ``host_wait``: the op's launch call returned after the previous op ended:
  the host was not feeding the stream fast enough;
- ``kernel_wait``: the gap is shorter than ``kernel_wait_us`` (HTA's
  ``consecutive_kernel_delay``, 30 ns): back-to-back launch overhead;
- ``other``: the rest, of which the part during which the stream was held by
  a cross-stream wait (a ``wait`` span) is reported as ``dependency`` (HTA
  files it under "other"; :mod:`simwar.analysis.metrics` calls it
  kernel-wait/dependency idle).

The launch call of an op is ``ops.call`` (its span's start and end); an op
with no call in the trace uses its ``issue_us`` for both.

Imports: numpy.
"""

from __future__ import annotations

import bisect

import numpy as np

from ..trace import HOST, OpKind, SpanKind, Trace

#: HTA's default consecutive_kernel_delay (30 ns)
HTA_KERNEL_WAIT_US = 0.03

HOST_WAIT, KERNEL_WAIT, OTHER = "host_wait", "kernel_wait", "other"


def gap_cause(gap_us: float, launch_start: float, launch_end: float, prev_end: float,
              kernel_wait_us: float = HTA_KERNEL_WAIT_US) -> str:
    """The cause of a ``gap_us`` idle gap before an op launched by a call over
    ``[launch_start, launch_end]``, after work that ended at ``prev_end``."""
    if launch_end > prev_end:
        return HOST_WAIT
    if gap_us < kernel_wait_us:
        return KERNEL_WAIT
    return OTHER


def idle_breakdown(trace: Trace, kernel_wait_us: float = HTA_KERNEL_WAIT_US,
                   from_step: int = 0) -> dict[str, dict[str, float]]:
    """Per stream lane: busy and idle µs between its device ops (steps ``from_step`` on),
    idle split by cause (``host_wait_us``, ``kernel_wait_us``, ``dependency_us``,
    ``other_us``)."""
    ops, spans = trace.ops, trace.spans
    pick = np.flatnonzero((ops.kind == OpKind.KERNEL) & (ops.lane != trace.code(HOST))
                          & (ops.step >= from_step))
    calls = ops.call[pick]
    has_call = calls >= 0
    launch_end = ops.issue_us[pick]
    launch_start = launch_end.copy()
    launch_start[has_call] = spans.start_us[calls[has_call]]
    lane_codes = ops.lane[pick]
    held = spans.kind == SpanKind.WAIT
    out: dict[str, dict[str, float]] = {}
    for lane in sorted(trace.text(c) for c in np.unique(lane_codes)):
        mine = lane_codes == trace.code(lane)
        start, end = ops.start_us[pick][mine], ops.end_us[pick][mine]
        order = np.lexsort((end, start))
        on_lane = held & (spans.lane == trace.code(lane))
        waits = sorted(zip(spans.start_us[on_lane].tolist(), spans.end_us[on_lane].tolist()))
        out[lane] = _lane_breakdown(start[order].tolist(), end[order].tolist(),
                                    launch_start[mine][order].tolist(),
                                    launch_end[mine][order].tolist(), waits, kernel_wait_us)
    return out


def _lane_breakdown(start: list[float], end: list[float], launch_start: list[float],
                    launch_end: list[float], waits: list[tuple[float, float]],
                    kernel_wait_us: float) -> dict[str, float]:
    row = {"busy_us": 0.0, "idle_us": 0.0, "host_wait_us": 0.0, "kernel_wait_us": 0.0,
           "dependency_us": 0.0, "other_us": 0.0}
    wait_starts = [a for a, _ in waits]
    tail = None
    for s, e, ls, le in zip(start, end, launch_start, launch_end):
        if tail is not None and s > tail:
            gap = s - tail
            row["idle_us"] += gap
            cause = gap_cause(gap, ls, le, tail, kernel_wait_us)
            if cause == OTHER:
                dep = min(gap, _covered(waits, wait_starts, tail, s))
                row["dependency_us"] += dep
                row["other_us"] += gap - dep
            else:
                row[f"{cause}_us"] += gap
        row["busy_us"] += max(0.0, e - (s if tail is None else max(s, tail)))
        tail = e if tail is None else max(tail, e)
    return row


def _covered(spans: list[tuple[float, float]], starts: list[float], lo: float,
             hi: float) -> float:
    """Length of [lo, hi) covered by ``spans`` (sorted by start)."""
    total = 0.0
    i = max(0, bisect.bisect_right(starts, lo) - 1)
    while i < len(spans) and spans[i][0] < hi:
        a, b = spans[i]
        total += max(0.0, min(b, hi) - max(a, lo))
        i += 1
    return total
