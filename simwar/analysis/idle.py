"""Idle time of each stream, split by cause as Holistic Trace Analysis splits it.

:func:`idle_breakdown` is HTA's idle time breakdown (``TraceAnalysis.
get_idle_time_breakdown`` of HolisticTraceAnalysis 0.5.0, run with
``HTA_DISABLE_NS_ROUNDING=1``), computed on a Trace; a test runs HTA itself
on every project capture (H200 replays, the probe's, multi-threaded ones, the server
harness's, the real SGLang and vLLM captures with CUDA graphs, synthetic multi-threaded
ones: 68 streams) and asserts equality per stream within max(1 µs, 0.5 %); where HTA is
wrong (below) it gives HTA's number under ``rule="hta"``. Definitions, each beside HTA's:

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
  negative gaps into kernel-wait (below). They differ only where ops on one stream
  overlap (a measured trace can show that: 3.5 µs on one stream of the
  project's captures).
- **host_wait**: the op's launch call *started* after that end: the host
  was not feeding the stream (HTA: ``ts_runtime > prev_end_ts``, the
  correlated runtime call's start). The launch is the runtime call with the op's
  correlation id in the same process, **whichever thread issued it** (autograd's
  backward thread, a communication thread, ...): the importer ties every kernel to
  its launch that way (``ops.call``, a span on the launching thread's lane), as HTA
  joins by correlation id over all CPU events. The kernels of a CUDA graph share their
  ``cudaGraphLaunch``'s correlation id: each has the graph launch as its launch, on both
  sides (one launch fanning out to 544 kernels in ``tests/data/real``). An op without a
  launch call in the trace is never host-wait (HTA means that with its NaN launch time,
  but joins the file's first event instead: below). Where two processes of one file reuse a
  correlation id, HTA joins them across processes; simwar keeps each
  process's ids to itself (:mod:`simwar.capture.ranks`).
- **kernel_wait**: not host-wait and the gap is shorter than
  ``kernel_wait_us`` = 30 µs. HTA's ``consecutive_kernel_delay`` defaults to
  30 and is compared with gaps in µs (its docstring says 30 ns; its code makes
  it 30 µs), so 30 µs is HTA's effective default.
- **other**: the rest. simwar refines it: the part during which the stream
  was held by a cross-stream wait (a ``wait`` span) is ``dependency_us``,
  the remainder ``other_us``; HTA's "other" is their sum.

**Where HTA is wrong, and its rule under a flag** (``rule="hta"``): on third-party
captures (TraceLens's and HTA's own test data; ``benchmarks/hta_agreement.py``) simwar's
rule and HTA's part on two points, both HTA's bugs, and a third that is scope:

- *overlapping ops on one stream* (Blackwell's programmatic dependent launch, graph
  branches): HTA's gap is the start minus the immediately previous op's end, so an overlap
  is a negative gap, summed into kernel-wait (on TraceLens's ``b200/eager_trace``,
  stream 7: 74 overlaps, -69.3 µs, HTA's kernel-wait 351.3 µs against 420.6 µs of real
  gaps). Idle time cannot be negative; simwar counts no idle time where the stream is
  busy. ``rule="hta"`` takes HTA's gaps, negative ones included.
- *ops whose launch is not in the trace* (launched before the capture window): HTA marks
  them ``index_correlation = 0`` ("linked event not shown") and then joins that 0 as a row
  index, so it takes the file's *first event* (row 0) as their launch: on TraceLens's
  ``h100/Qwen_Qwen1.5-0.5B-Chat`` seven kernels (correlations 675782 to 675860) get
  ``ProfilerStep#6``'s start as launch, after the previous op's end, and 9.1 µs of their
  gaps become host-wait. simwar: no launch in the trace, never host-wait (HTA's intent,
  its NaN). ``rule="hta"`` with ``no_launch_us`` (that first event's start on the trace's
  clock) gives HTA's number.
- *scope*: with two or more ``ProfilerStep`` ranges HTA keeps only device work whose launch
  is in the trace (before the last step's end); simwar's whole-capture import keeps the
  work launched before the window too (it ran in it). Import by steps to compare.

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


#: the idle rules: simwar's (the default) and HTA 0.5.0's as its code runs (module docstring)
RULES = ("simwar", "hta")


def idle_breakdown(trace: Trace, kernel_wait_us: float = HTA_KERNEL_WAIT_US,
                   from_step: int = 0, rule: str = "simwar",
                   no_launch_us: float = float("nan"),
                   launched_only: bool = False) -> dict[str, dict[str, float]]:
    """Per stream lane: busy and idle µs between its device ops (steps ``from_step`` on),
    idle split by cause (``host_wait_us``, ``kernel_wait_us``, ``dependency_us``,
    ``other_us``). ``rule="hta"`` gives HTA's numbers where HTA is wrong: gaps from the
    immediately previous op's end, negative ones summed, and ``no_launch_us`` as the
    launch start of ops with no launch in the trace (HTA's row-0 join). ``launched_only``
    leaves out the ops with no launch in the trace (HTA's scope on a capture with two or
    more ``ProfilerStep`` ranges)."""
    if rule not in RULES:
        raise ValueError(f"idle rule {rule!r}: expected one of {', '.join(RULES)}")
    ops, spans = trace.ops, trace.spans
    pick = np.flatnonzero((ops.kind == OpKind.KERNEL) & (ops.lane != trace.code(HOST))
                          & (ops.step >= from_step))
    if launched_only:
        pick = pick[ops.call[pick] >= 0]
    calls = ops.call[pick]
    has_call = calls >= 0
    launch_end = np.full(len(pick), np.nan)
    launch_start = np.full(len(pick), np.nan)
    launch_start[has_call] = spans.start_us[calls[has_call]]
    launch_end[has_call] = spans.end_us[calls[has_call]]
    if rule == "hta":
        launch_start[~has_call] = no_launch_us
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
                                    launch_end[mine][order].tolist(), waits, kernel_wait_us,
                                    rule == "hta")
    return out


def capture_idle(trace: Trace, rule: str = "simwar",
                 kernel_wait_us: float = HTA_KERNEL_WAIT_US,
                 from_step: int = 0) -> dict[str, dict[str, float]]:
    """:func:`idle_breakdown` by ``rule``, with what HTA's rule needs of the file read from
    the imported Trace's meta (:mod:`simwar.capture.to_trace` keeps it): the file's first
    complete event as the launch start of ops with no launch in the trace
    (``first_event_us``; NaN where the Trace has none: never host-wait), and HTA's scope, the
    launched ops only, where the file has two or more ``ProfilerStep`` ranges
    (``profiler_steps``). What ``simwar explain --idle-rule`` prints."""
    if rule != "hta":
        return idle_breakdown(trace, kernel_wait_us, from_step, rule=rule)
    meta = trace.meta
    return idle_breakdown(trace, kernel_wait_us, from_step, rule="hta",
                          no_launch_us=float(meta.get("first_event_us", float("nan"))),
                          launched_only=int(meta.get("profiler_steps", 0)) >= 2)


def _lane_breakdown(start: list[float], end: list[float], launch_start: list[float],
                    launch_end: list[float], waits: list[tuple[float, float]],
                    kernel_wait_us: float, hta_gaps: bool = False) -> dict[str, float]:
    """One stream's row. The gap before an op is measured from ``tail``, the running
    maximum of the previous ends (no idle time while any earlier op still runs); with
    ``hta_gaps`` from the immediately previous op's end, negative gaps counted (HTA)."""
    row = {"busy_us": 0.0, "idle_us": 0.0, "host_wait_us": 0.0, "kernel_wait_us": 0.0,
           "dependency_us": 0.0, "other_us": 0.0}
    wait_starts = [a for a, _ in waits]
    tail = prev = None
    for s, e, ls, le in zip(start, end, launch_start, launch_end):
        if hta_gaps and prev is not None and s <= prev:  # HTA's negative (or zero) gap
            row["idle_us"] += s - prev
            row[f"{gap_cause(s - prev, ls, le, prev, kernel_wait_us)}_us"] += s - prev
        elif tail is not None and s > (prev if hta_gaps else tail):
            base = prev if hta_gaps else tail
            gap = s - base
            row["idle_us"] += gap
            cause = gap_cause(gap, ls, le, base, kernel_wait_us)
            if cause == OTHER:
                dep = min(gap, _covered(waits, wait_starts, base, s))
                row["dependency_us"] += dep
                row["other_us"] += gap - dep
            else:
                row[f"{cause}_us"] += gap
        row["busy_us"] += max(0.0, e - (s if tail is None else max(s, tail)))
        tail = e if tail is None else max(tail, e)
        prev = e
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
