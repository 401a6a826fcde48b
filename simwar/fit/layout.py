"""The overlap loop's structure in any Trace: per step, which host call is which.

A scheduler iteration of SGLang's overlap loop (and of simwar's builder) is,
on the host: CPU work, the launches of the schedule-stream writes, the
forward's phases (eager launches and graph launches on the forward stream),
the result copy on the copy stream, the barrier, and the synchronize on the
previous step's result copy followed by its processing. :func:`step_layouts`
finds those pieces in a Trace from its typed columns alone (call kinds,
``ops.call``, ``ops.bound``, lanes, phases), so the same code reads a
simulated run and an imported capture:

- the **schedule calls**: host calls before the step's first forward launch
  that issued work on the schedule (or plan) stream;
- the **units** of the forward: its launch calls grouped by phase, one CUDA
  graph per unit, the eager launches before a graph being its ``load_batch``
  and those after the unit's last graph its trailing kernels;
- the **syncs**: the result sync (bound to the copy stream's record, else the
  last synchronize after the forward launches), a barrier sync before the
  schedule calls (loop top) or between the launches and the result sync;
- host **regions** between those anchors, with the time the host spent in
  each outside synchronize calls: what :mod:`simwar.fit.samples` turns
  into the config's CPU work.

It lives in the fit, the one reader of a loop's layout (the capture's size stage needs only
:func:`simwar.analysis.views.ops_of_call`).

Imports: numpy, :mod:`simwar.analysis.views` and :mod:`simwar.core.trace`; never the
simulator.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import numpy as np

from simwar.core.trace import HOST, Call, OpKind, Trace

_SYNC, _SYNCHRONIZE, _GRAPH_LAUNCH = int(OpKind.SYNC), int(Call.SYNCHRONIZE), \
    int(Call.GRAPH_LAUNCH)


def columns(trace: Trace, table: str, *names: str) -> tuple[memoryview, ...]:
    """Columns of ``trace.ops`` or ``trace.spans`` (``table``) as memoryviews of their
    arrays (no copy), made once per trace and kept on it (a Trace is not changed once
    recorded).

    The fit's walks read a few values per op or call of every step; an element of a
    memoryview is a plain ``float`` or ``int``, read for a fraction of the cost of a numpy
    array's (which boxes a numpy scalar), and compared with an ``int`` for a fraction of the
    cost of an ``IntEnum`` member. The values are the arrays' own, so every figure is the same
    to the last bit.
    """
    cache = trace.__dict__.setdefault("_simwar_columns", {})
    out = []
    for name in names:
        col = cache.get((table, name))
        if col is None:
            arr = np.ascontiguousarray(getattr(getattr(trace, table), name))
            col = cache[(table, name)] = memoryview(arr)
        out.append(col)
    return tuple(out)


def drop_columns(trace: Trace) -> None:
    """Releases the views :func:`columns` kept on ``trace`` (the fit, when its walks are
    done: an array a view is held on cannot be resized in place)."""
    cache = trace.__dict__.pop("_simwar_columns", None)
    for view in (cache or {}).values():
        view.release()


@dataclass
class Unit:
    """One piece of a step's forward: a phase's launch calls with at most one graph."""

    phase: str
    calls: list[int]  # host span ids, in issue order
    graph: int | None = None  # the span id of its graph launch
    ops: list[int] = field(default_factory=list)  # forward kernel ops, in start order

    @property
    def kind(self) -> str:
        return "graph" if self.graph is not None else "eager"


@dataclass
class StepLayout:
    step: int
    start: float
    end: float  # the next step's start
    calls: list[int]  # host API call span ids (no CPU work spans), by start
    sched_calls: list[int]
    sched_ops: list[int]  # schedule/plan-stream work issued before the forward
    units: list[Unit]
    result_ops: list[int]  # schedule-stream work issued after the forward's first launch
    copy_ops: list[int]  # copy-stream work issued after the forward's last launch
    syncs: list[int]
    result_sync: int | None
    top_sync: int | None  # a barrier sync before the schedule calls (loop top)
    post_sync: int | None  # a barrier sync between the forward launches and the result sync

    @property
    def first_forward(self) -> int:
        return self.units[0].calls[0]

    def signature(self) -> tuple:
        """What must agree between steps (and between a capture and its model)."""
        return (bool(self.sched_calls), tuple((u.phase, u.kind) for u in self.units),
                self.top_sync is not None, self.post_sync is not None,
                self.result_sync is not None)


class Roles(dict):
    """Lane of each builder stream in a trace: ``forward``, ``schedule``, ``plan``, ``copy``."""


def step_layouts(trace: Trace, roles: Roles) -> dict[int, StepLayout]:
    """Per step with forward work (and a successor step), its :class:`StepLayout`."""
    spans, ops = trace.spans, trace.ops
    code = trace.code
    fwd = code(roles["forward"])
    sched_lanes = {code(x) for x in (roles.get("schedule"), roles.get("plan")) if x}
    sched_lane = code(roles["schedule"]) if roles.get("schedule") else -9
    copy_lane = code(roles["copy"]) if roles.get("copy") else -9
    empty_phase = code("")

    markers = trace.markers
    is_step = markers.name == code("step")
    starts = dict(zip(markers.step[is_step].tolist(), markers.time_us[is_step].tolist()))
    ends = {k: starts[k + 1] for k in starts if k + 1 in starts}

    host = (spans.lane == code(HOST)) & (spans.call != Call.CPU) & (spans.call != Call.NONE)
    host_ids = np.flatnonzero(host)
    order = np.lexsort((host_ids, spans.start_us[host_ids], spans.step[host_ids]))
    host_ids = host_ids[order]
    by_step: dict[int, list[int]] = {}
    for s, k in zip(host_ids.tolist(), spans.step[host_ids].tolist()):
        by_step.setdefault(k, []).append(s)

    kernels = np.flatnonzero((ops.kind == OpKind.KERNEL) & (ops.call >= 0))
    ops_of: dict[int, list[int]] = {}
    for o, c in zip(kernels.tolist(), ops.call[kernels].tolist()):
        ops_of.setdefault(c, []).append(o)
    lane, phase, op_start = columns(trace, "ops", "lane", "phase", "start_us")
    call_kind, start = columns(trace, "spans", "call", "start_us")

    out: dict[int, StepLayout] = {}
    for k, calls in by_step.items():
        if k not in ends:
            continue
        fcalls = [c for c in calls if any(lane[o] == fwd and phase[o] != empty_phase
                                          for o in ops_of.get(c, ()))]
        if not fcalls:
            continue
        f0, fl = start[fcalls[0]], start[fcalls[-1]]
        sched_calls = [c for c in calls if start[c] < f0
                       and any(lane[o] in sched_lanes for o in ops_of.get(c, ()))]
        sched_ops = sorted((o for c in sched_calls for o in ops_of[c] if lane[o] in sched_lanes),
                           key=op_start.__getitem__)
        result_ops = sorted((o for c in calls if start[c] >= f0 for o in ops_of.get(c, ())
                             if lane[o] == sched_lane), key=op_start.__getitem__)
        copy_ops = sorted((o for c in calls if start[c] >= fl for o in ops_of.get(c, ())
                           if lane[o] == copy_lane), key=op_start.__getitem__)
        units = _units(fcalls, ops_of, call_kind, trace, fwd, empty_phase)
        syncs = [c for c in calls if call_kind[c] == _SYNCHRONIZE]
        result_sync, top_sync, post_sync = _syncs(syncs, fl, start, trace, copy_lane, fwd,
                                                  sched_calls, f0)
        out[k] = StepLayout(k, starts[k], ends[k], calls, sched_calls, sched_ops, units,
                            result_ops, copy_ops, syncs, result_sync, top_sync, post_sync)
    return out


def _units(fcalls: list[int], ops_of: dict, call_kind, trace: Trace, fwd: int,
           empty_phase: int) -> list[Unit]:
    """Forward calls → units: runs of one phase, split so that each holds one graph launch,
    the eager launches before a graph with it (its load_batch), those after the run's last
    graph with the last unit."""
    lane, phase, op_start = columns(trace, "ops", "lane", "phase", "start_us")
    runs: list[tuple[str, list[int]]] = []
    for c in fcalls:
        fops = [o for o in ops_of[c] if lane[o] == fwd and phase[o] != empty_phase]
        name = trace.text(phase[fops[0]])
        if runs and runs[-1][0] == name:
            runs[-1][1].append(c)
        else:
            runs.append((name, [c]))
    units: list[Unit] = []
    for name, calls in runs:
        pieces: list[Unit] = []
        pending: list[int] = []
        for c in calls:
            pending.append(c)
            if call_kind[c] == _GRAPH_LAUNCH:
                pieces.append(Unit(name, pending, c))
                pending = []
        if pending:
            if pieces:
                pieces[-1].calls.extend(pending)
            else:
                pieces.append(Unit(name, pending))
        units.extend(pieces)
    for u in units:
        u.ops = sorted((o for c in u.calls for o in ops_of[c] if lane[o] == fwd),
                       key=lambda o: (op_start[o], o))
    return units


def _syncs(syncs, fl, start, trace, copy_lane, fwd, sched_calls, f0):
    """``(result, top, post)`` synchronize spans of a step (None where absent)."""
    span_op, = columns(trace, "spans", "op")
    kind, bound, lane = columns(trace, "ops", "kind", "bound", "lane")

    def record_lane(s):
        op = span_op[s]
        if op < 0 or kind[op] != _SYNC or bound[op] < 0:
            return None
        return lane[bound[op]]

    after = [s for s in syncs if start[s] > fl]
    result = next((s for s in after if record_lane(s) == copy_lane), None)
    if result is None and after:
        result = after[-1]
    first_sched = start[sched_calls[0]] if sched_calls else f0
    top = next((s for s in syncs if start[s] < first_sched and record_lane(s) in (fwd, None)),
               None)
    post = next((s for s in after if s != result and start[s] < start[result]
                 and record_lane(s) in (fwd, None)), None) if result is not None else None
    return result, top, post


# --------------------------------------------------------------------------- regions
def regions(trace: Trace, lay: StepLayout, prof=None, held=()) -> dict[str, float]:
    """Host time per region of a step, synchronize calls left out.

    Layouts whose regions are compared must share their :meth:`StepLayout.signature`.
    The regions, by their anchors: ``A`` step start → the first of (top sync, schedule calls,
    forward); ``A2`` top sync end → schedule calls (or the forward); ``host_0`` schedule calls
    → the forward; ``host_i`` unit i-1's first call → unit i's; ``tail`` the last unit's first
    call → the post sync (or the result sync, or the step's end); ``tail2`` post sync end →
    result sync; ``P`` result sync → step end. Each value is the region's length less the
    length of every synchronize call inside it (their blocking is the simulation's to
    reproduce; their own cost is the same in a capture and its model). ``prof`` (a
    :class:`simwar.fit.profiler_cost.ProfilerCost`): each value also less the profiler's own
    host cost in the region outside those syncs, never below zero. ``held``: host work
    another config key holds, ``(start, end, µs)`` (the receive ranges:
    :mod:`simwar.fit.receive`), each taken out of the region that holds its start, never below
    zero.
    """
    s0, e0 = columns(trace, "spans", "start_us", "end_us")
    marks: list[tuple[str, float]] = [("A", lay.start)]
    if lay.top_sync is not None:
        marks.append(("__sync", float(s0[lay.top_sync])))
        marks.append(("A2", float(e0[lay.top_sync])))
    if lay.sched_calls:
        marks.append(("host_0", float(s0[lay.sched_calls[0]])))
    n = len(lay.units)
    for i, u in enumerate(lay.units):
        name = f"host_{i + 1}" if i + 1 < n else "tail"
        marks.append((name, float(s0[u.calls[0]])))
    if lay.post_sync is not None:
        marks.append(("__sync", float(s0[lay.post_sync])))
        marks.append(("tail2", float(e0[lay.post_sync])))
    if lay.result_sync is not None:
        marks.append(("P", float(s0[lay.result_sync])))
    marks.append(("__end", lay.end))
    sync_iv = [(float(s0[s]), float(e0[s])) for s in lay.syncs
               if s not in (lay.top_sync, lay.post_sync)]
    out: dict[str, float] = {}
    for (name, a), (_, b) in zip(marks, marks[1:]):
        if name.startswith("__"):
            continue
        inside = sum(max(0.0, min(b, y) - max(a, x)) for x, y in sync_iv)
        value = (b - a) - inside
        if prof is not None:
            value = prof.less_outside(value, a, b, [(max(a, x), min(b, y)) for x, y in sync_iv
                                                    if y > a and x < b])
        out[name] = out.get(name, 0.0) + value
    for x, _, us in held:
        name = next((n for (n, a), (_, b) in zip(marks, marks[1:])
                     if a <= x < b and not n.startswith("__")), None)
        if name is not None:
            out[name] -= min(us, max(out[name], 0.0))
    return out


def merged(intervals, lo: float, hi: float) -> list[tuple[float, float]]:
    """``intervals`` clipped to ``[lo, hi]`` and merged where they overlap."""
    out: list[list[float]] = []
    for a, b in sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def work_us(trace: Trace, op_ids: list[int]) -> float:
    """Device time of ops on one stream: their lengths plus every gap between two of them
    where the later was already issued when the earlier ended (device-side latency, e.g.
    between a graph's own nodes); a gap the host caused (the later op issued after the
    earlier ended) is the host's to reproduce."""
    if not op_ids:
        return 0.0
    start, end, issued = columns(trace, "ops", "start_us", "end_us", "issue_us")
    total = 0.0
    prev_end = None
    for o in op_ids:
        s, e, issue = start[o], end[o], issued[o]
        total += e - s
        if prev_end is not None and issue <= prev_end and s > prev_end:
            total += s - prev_end
        prev_end = e if prev_end is None else max(prev_end, e)
    return total


def queued_gap(trace: Trace, before: int | None, after: int | None) -> float:
    """The device gap between two ops if the later was issued before the earlier ended, up
    to the next kernel of the later op's stream after the earlier (the later op, or the work
    of a unit the layout does not hold between them: a mixed step's prefill chunk between two
    decode phases, whose device time is the prefill's, not the phase's).

    "Next" is by op id: ops are in host issue order, the order a stream runs its work, so on
    the earlier op's own stream (every use in the fit) the next kernel is its successor
    there; on another stream, that stream's first kernel issued after it."""
    if before is None or after is None:
        return 0.0
    start, ends, issued = columns(trace, "ops", "start_us", "end_us", "issue_us")
    end, s, issue = ends[before], start[after], issued[after]
    if not (issue <= end and s > end):
        return 0.0
    kernels = lane_kernels(trace, int(trace.ops.lane[after]))
    i = bisect.bisect_right(kernels, before)
    return min(s, start[kernels[i]]) - end if i < len(kernels) else s - end


def lane_kernels(trace: Trace, lane: int) -> memoryview:
    """The op ids of the kernels of one lane (a stream's code), in issue order (the order
    the stream runs them); made once per trace and lane and kept with :func:`columns`'
    views."""
    cache = trace.__dict__.setdefault("_simwar_columns", {})
    col = cache.get(("lane_kernels", lane))
    if col is None:
        ops = trace.ops
        col = cache[("lane_kernels", lane)] = memoryview(np.ascontiguousarray(
            np.flatnonzero((ops.lane == lane) & (ops.kind == OpKind.KERNEL))))
    return col
