"""Idle time of each stream, split by cause as Holistic Trace Analysis splits it.

:func:`idle_breakdown` is HTA's idle time breakdown (``TraceAnalysis.
get_idle_time_breakdown`` of HolisticTraceAnalysis 0.5.0, run with
``HTA_DISABLE_NS_ROUNDING=1``), computed on a Trace; a test runs HTA itself
on every project capture (H200 replays, the probe's, multi-threaded ones, synthetic
multi-threaded ones) and asserts equality per stream within max(1 µs, 0.5 %).
Definitions, each beside HTA's:

- **ops**: every device op of a stream (kernels, memcpys, memsets; in-graph
  kernels included), in start order. HTA: the same categories, sorted by
  ``ts``. HTA also counts MTIA's ``mtia_ccp_events``; simwar does not model MTIA
  (the importer says so in one line) and a Trace has none.
- **which ops**: a capture with ``ProfilerStep`` ranges is filtered by HTA to the
  device work whose launch is in the capture and started before the last step
  ended (its default, ``include_last_profiler_step=False``, also drops the last
  step); simwar's import keeps the device work of its steps (``from_step`` drops
  the warm-up). The oracle runs HTA with ``include_last_profiler_step=True`` and
  imports the whole capture as one step, so both see the same ops.
- **gap**: an op's start minus the end of the work before it. simwar uses
  the running maximum of the previous ends and ignores overlaps (a gap <= 0
  is no idle time); HTA uses the immediately previous op's end and sums
  negative gaps into kernel-wait. They differ only where ops on one stream
  overlap (a measured trace can show that: 3.5 µs on one stream of the
  project's captures).
- **host_wait**: the op's launch call *started* after that end: the host
  was not feeding the stream (HTA: ``ts_runtime > prev_end_ts``, the
  correlated runtime call's start). The launch is the runtime call with the op's
  correlation id in the same process, **whichever thread issued it** (autograd's
  backward thread, a communication thread, ...): the importer ties every kernel to
  its launch that way (``ops.call``, a span on the launching thread's lane), as HTA
  joins by correlation id over all CPU events. An op without a launch call in the
  trace is never host-wait (HTA: a NaN launch time). Where two processes of one
  file reuse a correlation id, HTA joins them across processes; simwar keeps each
  process's ids to itself (:mod:`simwar.capture.ranks`).
- **kernel_wait**: not host-wait and the gap is shorter than
  ``kernel_wait_us`` = 30 µs. HTA's ``consecutive_kernel_delay`` defaults to
  30 and is compared with gaps in µs (its docstring says 30 ns; its code makes
  it 30 µs), so 30 µs is HTA's effective default.
- **other**: the rest. simwar refines it: the part during which the stream
  was held by a cross-stream wait (a ``wait`` span) is ``dependency_us``,
  the remainder ``other_us``; HTA's "other" is their sum.

:func:`temporal_breakdown` is HTA's temporal breakdown: over the device ops
of all streams pooled, the device span (first start to last end), its idle
part (not covered by any op), compute (covered by compute ops) and
non-compute (covered only by memory or communication ops: HTA classifies by
kernel name, ``Memcpy``/``Memset``/``dma``/``nccl*Kernel``/``*Sync``, and so
does this function, since that is HTA's definition), as µs and as shares of
the span. **Where it differs from HTA, by decision:** HTA pools every event that
carries a stream, which besides device work takes in (1) CUPTI's ``cuda_sync``
markers (``Stream Wait Event``, ``Stream Sync``: the host call's interval drawn on
the stream's row, not device activity) and (2) ``cpu_op`` events with an
``args.stream`` (Inductor/Triton launchers write one: a host op). Both stretch the
span and fill idle time with host time (on ``tests/data/threads/all``, HTA's span is
28,072 µs, 27,891 µs of device work, the rest stream-wait markers), so simwar keeps
device work only; on a capture without those events HTA gives simwar's numbers, which
the oracle test checks.

Imports: numpy.
"""

from __future__ import annotations

import bisect
import re

import numpy as np

from simwar.core.trace import HOST, OpKind, SpanKind, Trace

#: HTA's default consecutive_kernel_delay, as its code applies it: 30, compared with µs gaps
HTA_KERNEL_WAIT_US = 30.0
#: HTA's non-compute kernels (hta/utils/utils.py: memory, communication and sync kernels)
_NON_COMPUTE = re.compile(r"(^nccl.*Kernel)|(^Memcpy)|(^Memset)|(^dma)|(.*(Memcpy)|(Memset))|"
                          r"(.*Sync)")

HOST_WAIT, KERNEL_WAIT, OTHER = "host_wait", "kernel_wait", "other"


def gap_cause(gap_us: float, launch_start: float, launch_end: float, prev_end: float,
              kernel_wait_us: float = HTA_KERNEL_WAIT_US) -> str:
    """The cause of a ``gap_us`` idle gap before an op launched by a call over
    ``[launch_start, launch_end]``, after work that ended at ``prev_end``."""
    if launch_start > prev_end:  # NaN (no launch call in the trace): never host-wait
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
    launch_end = np.full(len(pick), np.nan)
    launch_start = np.full(len(pick), np.nan)
    launch_start[has_call] = spans.start_us[calls[has_call]]
    launch_end[has_call] = spans.end_us[calls[has_call]]
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


def temporal_breakdown(trace: Trace, from_step: int = 0) -> dict[str, float]:
    """HTA's temporal breakdown of the device (see the module docstring)."""
    ops = trace.ops
    pick = np.flatnonzero((ops.kind == OpKind.KERNEL) & (ops.lane != trace.code(HOST))
                          & (ops.step >= from_step))
    out = {"span_us": 0.0, "idle_us": 0.0, "compute_us": 0.0, "non_compute_us": 0.0,
           "idle_share": 0.0, "compute_share": 0.0, "non_compute_share": 0.0}
    if len(pick) == 0:
        return out
    start, end = ops.start_us[pick], ops.end_us[pick]
    origin = start.min()  # sums of absolute µs lose precision: measure from the first start
    start, end = start - origin, end - origin
    names = ops.label[pick]
    compute_code = np.array([_NON_COMPUTE.match(trace.text(c)) is None
                             for c in range(len(trace.strings))], dtype=bool)
    compute = compute_code[names]
    span = float(end.max() - start.min())
    busy = _union_length(start, end)
    comp = _union_length(start[compute], end[compute])
    out.update(span_us=span, idle_us=span - busy, compute_us=comp,
               non_compute_us=span - comp - (span - busy))
    if span > 0:
        for key in ("idle", "compute", "non_compute"):
            out[f"{key}_share"] = out[f"{key}_us"] / span
    return out


def _union_length(start: np.ndarray, end: np.ndarray) -> float:
    """Length of the union of intervals [start, end) (HTA's merge of kernel intervals)."""
    if len(start) == 0:
        return 0.0
    order = np.argsort(start, kind="stable")
    s, e = start[order], end[order]
    reach = np.maximum.accumulate(e)
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > reach[:-1]
    group = np.cumsum(new) - 1
    lo = s[new]
    hi = np.full(group[-1] + 1, -np.inf)
    np.maximum.at(hi, group, e)
    return float((hi - lo).sum())
