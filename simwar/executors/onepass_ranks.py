"""Tensor-parallel ranks without SimPy: each rank's Program in one pass, met at its collectives.

The one-pass idea (:mod:`simwar.executors.fast`): once durations are drawn the schedule is
deterministic, and a rank's host issue order is a valid evaluation order of its ops (every
input of an op was issued before it), so each device op's times follow at its issue from
the stream's tail and the records it binds to, by the rules the SimPy engine calls
(:mod:`simwar.core.rules`). Ranks add one kind of input: a collective's result needs every
rank's arrival. So each rank's host runs as a coroutine that goes as far as it can and
stops at a collective until every rank has arrived at that instance (the k-th host
collective of every rank is one instance, the k-th device collective another, as in
:class:`~simwar.executors.engine.Group`); then each rank takes the same rule as the engine:

- a host collective: the host leaves at the last arrival plus its own cost, plus its
  wake-up when it waited (``last > arrival``);
- a device collective kernel begins by the stream rules and ends at the last rank's begin
  plus its own duration.

Every time is computed by the same operations on the same values as in the engine
(``max`` over the same arrivals, in rank order rather than arrival order: the same value,
since arrivals are never NaN nor -0.0; the same additions in the same order), so the Traces are
the engine's, not close: op and span ids come from a :class:`~simwar.core.recorder.Recorder`
per rank fed in the rank's host order, as the engine's is, and ``meta["collectives"]`` is
appended in the same order (``tests/test_ranks_fast.py`` compares every column). Only the
order in which ranks are *evaluated* differs, and a value never depends on it (each is a
function of values issued before it). Ranks that issue their collectives in orders the
coroutines cannot follow (a rank stopped at a device collective while another waits at a
host collective it has not reached) raise :class:`Unfollowable`; the caller then runs the
SimPy engine, which gives the answer (or its deadlock) of the reference.

Speed: no SimPy events, no stream processes; a stream is its tail time. The Recorder is the
engine's and most of what a run costs here; the execution takes about half the engine's
time, and a whole run (build, Traces, tables, races) shares the rest with the engine's
(``python benchmarks/bench_fast.py ranks``).

Imports: :mod:`simwar.core` only (no simpy).
"""

from __future__ import annotations

from simwar.core.program import (
    Collective,
    CpuWork,
    GraphLaunch,
    GraphRecord,
    HostCollective,
    Launch,
    Marker,
    Program,
    Record,
    StepMarker,
    Synchronize,
    WaitEvent,
    WaitStream,
)
from simwar.core.recorder import Recorder
from simwar.core.refusals import PlanRefused
from simwar.core.rules import begins, released, returns
from simwar.core.trace import HOST, Call, OpKind, Trace

KERNEL, RECORD, WAIT, SYNC = OpKind.KERNEL, OpKind.RECORD, OpKind.WAIT, OpKind.SYNC
NAN = float("nan")


class Unfollowable(PlanRefused):
    """The ranks' collectives are issued in orders one pass per rank cannot follow."""


class _Join:
    """One collective instance: each rank's arrival (in rank order), how many are in, and
    the ranks stopped at it."""

    __slots__ = ("times", "n", "waiters")

    def __init__(self, n: int) -> None:
        self.times = [0.0] * n
        self.n = 0
        self.waiters: list[int] = []


def _rank(program: Program, rank: int, rec: Recorder, joins: list[dict], n: int,
          collectives: list, ready: list, progress):
    """Rank ``rank``'s host as a coroutine: stops (yields) at a collective some rank has not
    reached, resumed once all have (the last to arrive puts the others in ``ready``);
    returns when its ops are done. Mirrors :meth:`simwar.executors.engine.Engine._host`,
    with each stream operation's times computed at its issue (its stream's tail in
    ``free``)."""
    host = rec.host
    new_op = rec.op
    access = rec.access
    marker = rec.marker
    op_start, op_end = rec.op_start, rec.op_end
    free: dict[str, float] = {}  # a stream's tail: when its previous operation ended
    # event name -> its most recent record: (op id, time it fired, its lane)
    latest: dict[str, tuple[int, float, str]] = {}
    host_joins, device_joins = joins
    n_host = n_device = 0

    def kernel(lane: str, k, step: int, ready: float, call: int) -> None:
        op_id = new_op(KERNEL, lane, step, k.label, "", -1, ready, NAN, NAN, k.phase, call)
        for b in k.reads:
            access(op_id, b, False, step, k.phase)
        for b in k.writes:
            access(op_id, b, True, step, k.phase)
        start = begins(free.get(lane, 0.0), ready)
        free[lane] = end = start + k.duration_us
        op_start[op_id] = start
        op_end[op_id] = end

    def record(event: str, lane: str, step: int, ready: float, call: int) -> tuple:
        op_id = new_op(RECORD, lane, step, event, event, -1, ready, NAN, NAN, "", call)
        start = begins(free.get(lane, 0.0), ready)
        op_start[op_id] = op_end[op_id] = free[lane] = start
        return op_id, start, lane

    def wait(lane: str, r: tuple | None, event: str, step: int, ready: float,
             latency_us: float, call: int) -> None:
        op_id = new_op(WAIT, lane, step, event, event, r[0] if r is not None else -1, ready,
                       NAN, NAN, "", call)
        start = begins(free.get(lane, 0.0), ready)
        end = start
        if r is not None:
            end = released(start, r[1], latency_us, r[2] == lane)
        free[lane] = end
        op_start[op_id] = start
        op_end[op_id] = end

    def arrive(table: dict, index: int, time: float) -> _Join:
        """This rank's arrival at instance ``index`` of ``table``; the instance (complete
        when ``n`` are in: the last rank forgets it and readies the others)."""
        j = table.get(index)
        if j is None:
            j = table[index] = _Join(n)
        j.times[rank] = time
        j.n += 1
        if j.n == n:
            del table[index]
            ready.extend(j.waiters)
        else:
            j.waiters.append(rank)
        return j

    t = 0.0
    for op in program.ops:
        kind = type(op)
        if kind is Launch:
            k = op.kernel
            t0, t = t, t + op.host_us
            call = host(Call.LAUNCH, op.step, t0, t, k.label, k.phase, "", rec.next_op)
            kernel(op.stream, k, op.step, t, call)
        elif kind is CpuWork:
            host(Call.CPU, op.step, t, t + op.duration_us, op.label)
            t += op.duration_us
        elif kind is Record:
            t0, t = t, t + op.host_us
            call = host(Call.RECORD, op.step, t0, t, op.event, "", "", rec.next_op)
            latest[op.event] = record(op.event, op.stream, op.step, t, call)
        elif kind is WaitStream:
            t0, t = t, t + op.host_us
            call = host(Call.WAIT_STREAM, op.step, t0, t, op.other, "", "", rec.next_op + 1)
            name = op.other + ".tail"
            r = record(name, op.other, op.step, t, call)
            wait(op.stream, r, name, op.step, t, op.latency_us, call)
        elif kind is GraphLaunch:
            t0, t = t, t + op.host_us
            call = host(Call.GRAPH_LAUNCH, op.step, t0, t, op.graph, op.phase, "", rec.next_op)
            lane = op.stream
            for node in op.nodes:
                if type(node) is GraphRecord:
                    latest[node.event] = record(node.event, lane, op.step, t, call)
                elif type(node) is Collective:
                    op_id = new_op(KERNEL, lane, op.step, node.label, "", -1, t, NAN, NAN,
                                   node.phase, call)
                    collectives.append((op_id, 1, n_device))
                    start = begins(free.get(lane, 0.0), t)
                    j = arrive(device_joins, n_device, start)
                    if j.n < n:
                        yield
                    n_device += 1
                    free[lane] = end = max(j.times) + node.duration_us
                    op_start[op_id] = start
                    op_end[op_id] = end
                else:
                    kernel(lane, node, op.step, t, call)
        elif kind is WaitEvent:
            t0, t = t, t + op.host_us
            call = host(Call.WAIT_EVENT, op.step, t0, t, op.event, "", "", rec.next_op)
            wait(op.stream, latest.get(op.event), op.event, op.step, t, op.latency_us, call)
        elif kind is Synchronize:
            t0 = t
            r = latest.get(op.event)
            t = returns(t0, op.host_us, r[1] if r is not None else None, op.wake_us)
            call = host(Call.SYNCHRONIZE, op.step, t0, t, op.event, "", op.site, rec.next_op)
            new_op(SYNC, HOST, op.step, op.event, op.event, r[0] if r is not None else -1, t0,
                   t0, t, "", call)
        elif kind is HostCollective:
            t0 = t
            j = arrive(host_joins, n_host, t0)
            if j.n < n:
                yield
            index = n_host
            n_host += 1
            last = max(j.times)
            t = last + op.cost_us + (op.wake_us if last > t0 else 0.0)
            call = host(Call.SYNCHRONIZE, op.step, t0, t, op.name, "", op.name, rec.next_op)
            op_id = new_op(SYNC, HOST, op.step, op.name, "", -1, t0, t0, t, "", call)
            collectives.append((op_id, 0, index))
        elif kind is StepMarker:
            marker("step", op.step, t)
            if progress is not None:
                progress(op.step)
        elif kind is Marker:
            marker(op.name, op.step, t)
        else:
            raise TypeError(f"unknown host op {op!r}")
    marker("end", -1, t)


def run_ranks(programs: list[Program], progress=None) -> list[Trace]:
    """The ranks' Traces, equal to :func:`simwar.executors.ranks.run_ranks`'s (module
    docstring); :class:`Unfollowable` when the ranks' collectives cannot be met in one
    pass each (the SimPy engine then decides)."""
    n = len(programs)
    joins: list[dict] = [{}, {}]
    recs = [Recorder() for _ in programs]
    colls: list[list] = [[] for _ in programs]
    ready = list(range(n - 1, -1, -1))  # the ranks that can go on (rank 0 first)
    hosts = [_rank(p, r, recs[r], joins, n, colls[r], ready, progress if r == 0 else None)
             for r, p in enumerate(programs)]
    done = 0
    pop = ready.pop
    while ready:
        try:
            next(hosts[pop()])
        except StopIteration:
            done += 1
    if done < n:
        raise Unfollowable(f"{n - done} rank(s) stopped at a collective the others did not "
                           f"reach in one pass")
    traces = []
    for p, rec, c in zip(programs, recs, colls):
        meta = dict(p.meta)
        ops, device, inst = zip(*c) if c else ((), (), ())
        meta["collectives"] = {"op": list(ops), "device": list(device), "instance": list(inst)}
        meta.setdefault("source", "sim")
        traces.append(rec.finish(meta))
    return traces


__all__ = ["Unfollowable", "run_ranks"]
