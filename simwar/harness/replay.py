"""Replay a plan on a stream backend and assemble the measured Trace.

:func:`replay` walks a :class:`~simwar.harness.plan.ReplayPlan` and makes the
host calls, in program order, on a *backend* (the real one in
``simwar.harness.cuda``, a deterministic one in ``simwar.harness.fake``). It
keeps one host clock: every host op's span runs from the end of the previous
op to the end of its own call, so the loop's own overhead is charged to the
calls (as the simulator charges ``host_us``), and CPU work busy-waits up to an
absolute deadline. Device times come back from the backend's timing points
(the plan puts them around each step's forward only), already on that host
clock.

:func:`assemble` turns what was measured into a :class:`~simwar.core.trace.Trace`
in the simulator's schema:

- a timed launch (a step's first or last forward launch) starts at its
  start point (or the host time the launch reached the driver, if later: a
  starved stream cannot start a kernel before it is launched) and ends at its
  end point;
- an untimed launch is placed by the CUDA rules, as the simulator places it:
  it starts when its stream is free and its launch call has returned, and
  lasts its nominal duration (the spin is calibrated to it); a measured
  start that is earlier than such an estimate wins, and the estimate before
  it on that lane is clipped to it;
- nodes inside a graph are placed by interpolating the graph's span with the
  nodes' nominal durations (a captured graph cannot be timed per node from
  the host);
- records fire at their stream's tail or their issue time, whichever is
  later; a stream wait spans from reaching the wait to its bound record's
  firing, plus the device's cross-stream latency (``info["cross_stream_us"]``;
  each wait's own ``latency_us`` where ``info["latency"]`` is ``program``, as
  the fake backend's program mode reports) when the record is on another
  stream; syncs are host spans (``blocked``, with their ``site``);
- every read's snapshot is checked against the stamp it should have seen:
  a mismatch is a **measured race** (``meta.measured_races``).

Per-call host costs seen in the run are summarised in ``meta.host_costs``
for calibration (device latencies, which the run does not time, come from
the micro-benchmarks).

Imports: the standard library and simwar's recorder, rules and trace (stdlib and numpy).
"""

from __future__ import annotations

import gc
import statistics
from typing import Protocol

from simwar.core.program import (
    CpuWork,
    Kernel,
    Marker,
    Record,
    StepMarker,
    Synchronize,
    WaitEvent,
    WaitStream,
)
from simwar.core.recorder import Recorder
from simwar.core.rules import begins
from simwar.core.trace import HOST, Call, OpKind, Trace
from simwar.harness.plan import GraphStep, KernelStep, ReplayPlan

#: a sync counts towards ``sync_us`` only if its record's (estimated) firing is at least this
#: long before the call, so that no waiting hides in the figure
SYNC_FIRED_MARGIN_US = 20.0

#: host-cost kinds, named as the config's ``costs.*`` keys they calibrate
COST_KINDS = ("launch_us", "graph_launch_us", "event_record_us", "wait_event_us",
              "wait_stream_us", "sync_us")


class Backend(Protocol):
    """What the replay needs from a stream implementation.

    Event keys are ``("host", name)`` for host-recorded events and
    ``("graph", graph, name)`` for in-graph record nodes.
    """

    def setup(self, plan: ReplayPlan) -> None: ...
    def clock_us(self) -> float: ...
    def busy_until(self, t_us: float) -> float: ...
    def kernel(self, step: KernelStep) -> float: ...  # returns host time after its first call
    def graph_launch(self, step: GraphStep) -> float: ...
    def record_point(self, point: int, stream: str) -> None: ...
    def record(self, event: str, stream: str) -> None: ...
    def wait_event(self, stream: str, key: tuple | None) -> None: ...  # None: never recorded
    def wait_stream(self, stream: str, other: str) -> None: ...
    def synchronize(self, key: tuple | None) -> None: ...
    def finish(self) -> tuple[list[float], list[int]]: ...  # point times (host µs), snapshots
    def info(self) -> dict: ...


def replay(plan: ReplayPlan, backend: Backend, step_hook=None) -> Trace:
    """Run ``plan`` on ``backend``; return the measured Trace.

    ``step_hook(step)``, if given, is called at the start of each host
    iteration (e.g. to open a profiler range); its time is charged to the
    iteration's first op. The garbage collector is paused during the loop: a
    collection would be charged to whichever host call it lands in.
    """
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _replay(plan, backend, step_hook)
    finally:
        if gc_was_enabled:
            gc.enable()


def _replay(plan: ReplayPlan, backend: Backend, step_hook) -> Trace:
    backend.setup(plan)
    steps = plan.steps
    n = len(steps)
    t0 = [0.0] * n
    t1 = [0.0] * n
    first = [0.0] * n
    bound: dict[str, tuple] = {}  # event name -> key of its latest record
    bound_at_issue: list[tuple | None] = [None] * n
    clock = backend.clock_us
    t = clock()
    for i, st in enumerate(steps):
        kind = type(st)
        t0[i] = t
        if kind is CpuWork:
            t = backend.busy_until(t + st.duration_us)
        elif kind is StepMarker:
            if step_hook is not None:
                step_hook(st.step)
        elif kind is KernelStep:
            if st.start_point >= 0:
                backend.record_point(st.start_point, st.stream)
            first[i] = backend.kernel(st)
            if st.end_point >= 0:
                backend.record_point(st.end_point, st.stream)
            t = clock()
        elif kind is GraphStep:
            if st.start_point >= 0:
                backend.record_point(st.start_point, st.stream)
            first[i] = backend.graph_launch(st)
            if st.end_point >= 0:
                backend.record_point(st.end_point, st.stream)
            for node in plan.graphs[st.graph].nodes:
                if node.kernel is None:
                    bound[node.event] = ("graph", st.graph, node.event)
            t = clock()
        elif kind is Record:
            backend.record(st.event, st.stream)
            bound[st.event] = ("host", st.event)
            t = clock()
        elif kind is WaitEvent:
            key = bound.get(st.event)
            bound_at_issue[i] = key
            # key None: a never-recorded event, the wait is a no-op (as in CUDA)
            backend.wait_event(st.stream, key)
            t = clock()
        elif kind is WaitStream:
            backend.wait_stream(st.stream, st.other)
            t = clock()
        elif kind is Synchronize:
            key = bound.get(st.event)
            bound_at_issue[i] = key
            backend.synchronize(key)
            t = clock()
        t1[i] = t
    points, snapshots = backend.finish()
    return assemble(plan, t0, t1, first, bound_at_issue, points, snapshots, backend.info())


# --------------------------------------------------------------------------- assembly
def assemble(plan: ReplayPlan, t0: list[float], t1: list[float], first: list[float],
             bound_at_issue: list, points: list[float], snapshots: list[int],
             info: dict) -> Trace:
    """Build the Trace from host times, timing-point times and read snapshots."""
    rec = Recorder()
    tail = rec.lanes.tail  # per stream: when its last placed operation ends
    latest: dict[tuple, tuple[int, str, float]] = {}  # event key -> (record op, lane, firing)
    host_costs: dict[str, list[float]] = {k: [] for k in COST_KINDS}
    cross_us = float(info.get("cross_stream_us", 0.0))
    own_latency = info.get("latency") == "program"  # each wait's own latency_us
    # per lane: ops placed by estimate since the lane's last measured time, to clip when a
    # measured start turns out earlier (the recorder derives their spans from the final times)
    estimated: dict[str, list[int]] = {}

    def kernel(lane: str, k: Kernel, step: int, issue: float, start: float, end: float,
               call: int, timed: bool) -> None:
        op = rec.op(OpKind.KERNEL, lane, step, k.label, issue=issue, start=start, end=end,
                    phase=k.phase, call=call)
        for b in k.reads:
            rec.access(op, b, False, step, k.phase)
        for b in k.writes:
            rec.access(op, b, True, step, k.phase)
        if not timed:  # placed by the CUDA rules from nominal durations
            estimated.setdefault(lane, []).append(op)

    def begin(lane: str, launched: float, point: int) -> float:
        """Start of a launch on ``lane``: measured if ``point`` is timed, else by the rules."""
        if point < 0:
            return begins(tail.get(lane, launched), launched)
        start = max(points[point], launched)
        if start < tail.get(lane, start):
            clip(lane, start)
        estimated[lane] = []
        return start

    def clip(lane: str, t: float) -> None:
        for op in estimated.get(lane, ()):
            if rec.op_end[op] > t:
                rec.set_times(op, min(rec.op_start[op], t), t)

    def record(key: tuple, lane: str, step: int, label: str, issue: float, call: int) -> None:
        fire = rec.lanes.fire(lane, issue)
        op = rec.op(OpKind.RECORD, lane, step, label, event=key[-1], issue=issue, start=fire,
                    end=fire, call=call)
        latest[key] = (op, lane, fire)

    def wait(lane: str, bound, event: str, step: int, issue: float, call: int,
             latency: float) -> None:
        src, src_lane, fired = bound if bound is not None else (-1, lane, None)
        reach, release = rec.lanes.hold(lane, issue, fired, latency, src_lane == lane)
        op = rec.op(OpKind.WAIT, lane, step, event, event=event, bound=src, issue=issue,
                    start=reach, end=release, call=call)
        if release > reach:  # it held its stream
            estimated.setdefault(lane, []).append(op)

    for i, st in enumerate(plan.steps):
        kind = type(st)
        a, b = t0[i], t1[i]
        if kind is CpuWork:
            rec.host(Call.CPU, st.step, a, b, st.label)
        elif kind is KernelStep:
            host_costs["launch_us"].append(b - a)
            k = st.kernel
            call = rec.host(Call.LAUNCH, st.step, a, b, k.label, phase=k.phase, op=rec.next_op)
            start = begin(st.stream, first[i], st.start_point)
            end = start + k.duration_us
            if st.end_point >= 0:
                end = max(points[st.end_point], start)
                estimated[st.stream] = []
            kernel(st.stream, k, st.step, b, start, end, call, st.end_point >= 0)
            tail[st.stream] = end
        elif kind is GraphStep:
            host_costs["graph_launch_us"].append(b - a)
            gp = plan.graphs[st.graph]
            # the launch's own phase (the engine's), not its first node's
            call = rec.host(Call.GRAPH_LAUNCH, st.step, a, b, st.graph,
                            phase=plan.program.ops[st.index].phase, op=rec.next_op)
            nominal = sum(n.kernel.duration_us for n in gp.nodes if n.kernel is not None)
            gs = begin(st.stream, first[i], st.start_point)
            ge = gs + nominal
            timed = st.end_point >= 0
            if timed:
                ge = max(points[st.end_point], gs)
            scale = (ge - gs) / nominal if nominal > 0 else 0.0
            t = gs
            for node in gp.nodes:
                if node.kernel is None:  # an in-graph record node fires where graph work reached
                    op = rec.op(OpKind.RECORD, st.stream, st.step, node.event,
                                event=node.event, issue=b, start=t, end=t, call=call)
                    latest[("graph", st.graph, node.event)] = (op, st.stream, t)
                else:
                    end = t + node.kernel.duration_us * scale
                    kernel(st.stream, node.kernel, st.step, b, t, end, call, timed)
                    t = end
            if timed:
                estimated[st.stream] = []
            tail[st.stream] = ge
        elif kind is Record:
            host_costs["event_record_us"].append(b - a)
            call = rec.host(Call.RECORD, st.step, a, b, st.event, op=rec.next_op)
            record(("host", st.event), st.stream, st.step, st.event, b, call)
        elif kind is WaitEvent:
            host_costs["wait_event_us"].append(b - a)
            call = rec.host(Call.WAIT_EVENT, st.step, a, b, st.event, op=rec.next_op)
            key = bound_at_issue[i]
            wait(st.stream, latest.get(key) if key else None, st.event, st.step, b, call,
                 st.latency_us if own_latency else cross_us)
        elif kind is WaitStream:
            host_costs["wait_stream_us"].append(b - a)
            call = rec.host(Call.WAIT_STREAM, st.step, a, b, st.other, op=rec.next_op + 1)
            name = st.tail_event
            record(("tail", name), st.other, st.step, name, b, call)
            wait(st.stream, latest[("tail", name)], name, st.step, b, call,
                 st.latency_us if own_latency else cross_us)
        elif kind is Synchronize:
            key = bound_at_issue[i]
            bound = latest.get(key) if key else None
            if bound is None or bound[2] < a - SYNC_FIRED_MARGIN_US:
                host_costs["sync_us"].append(b - a)  # surely fired before: the call's own cost
            op = rec.next_op
            call = rec.host(Call.SYNCHRONIZE, st.step, a, b, st.event, site=st.site, op=op)
            rec.op(OpKind.SYNC, HOST, st.step, st.event, event=st.event,
                   bound=bound[0] if bound is not None else -1, issue=a, start=a, end=b,
                   call=call)
        elif kind is StepMarker:
            rec.marker("step", st.step, a)
        elif kind is Marker:
            rec.marker(st.name, st.step, a)
    rec.marker("end", -1, t1[-1] if t1 else 0.0)

    races = value_check(plan, snapshots)
    meta = dict(plan.program.meta)
    meta.update({
        "source": "harness",
        "device": info,
        "measured_races": races,
        "host_costs": {k: _stats(v) for k, v in host_costs.items()},
        "timed": "each step's forward start and end; other device times placed by the CUDA "
                 "rules from host times and nominal durations",
        "graph_nodes": "interpolated from the graph's span by nominal durations",
    })
    return rec.finish(meta)


def _stats(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    q = statistics.quantiles(values, n=10) if len(values) > 1 else [values[0]] * 9
    return {"n": len(values), "mean": statistics.fmean(values),
            "median": statistics.median(values), "p10": q[0], "p90": q[-1]}


def value_check(plan: ReplayPlan, snapshots: list[int]) -> list[dict]:
    """Reads that saw a stamp other than the latest earlier-issued write's: measured races."""
    out = []
    for r in plan.reads:
        seen = int(snapshots[r.slot])
        if seen == r.expected:
            continue
        out.append({
            "buffer": r.buffer, "read_step": r.step, "read_label": r.label,
            "expected_step": plan.stamp_steps.get(r.expected, -1),
            "seen_step": plan.stamp_steps.get(seen, -1),
            "seen_label": plan.stamp_labels.get(seen, "initial"),
            # a later-issued write landed first (WAR), or the read ran before its write (RAW)
            "kind": "WAR" if seen > r.expected else "RAW",
        })
    return out
