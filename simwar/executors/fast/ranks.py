"""The fast executor's tensor-parallel ranks: each rank's Program in one pass, met at its
collectives (``engine="fast"`` with ``parallel.tp > 1``; no SimPy).

The fast executor's idea (:mod:`simwar.executors.fast`): once durations are drawn the
schedule is deterministic, and a rank's host issue order is a valid evaluation order of its
ops (every input of an op was issued before it), so each device op's times follow at its
issue from the stream's tail and the records it binds to, by the rules the SimPy engine
calls (:mod:`simwar.core.rules`). Ranks add one kind of input: a collective's result needs
every rank's arrival. So each rank's host, the walk of :mod:`simwar.executors.host_loop`
that the SimPy engine runs too, goes as far as it can on :class:`StreamTails` and stops at
a collective until every rank has arrived at that instance (the k-th host collective of
every rank is one instance, the k-th device collective another, as in
:class:`~simwar.executors.engine.Group`); then each rank takes the same rule as the engine:

- a host collective: the host leaves at the last arrival plus its own cost, plus its
  wake-up when it waited (``last > arrival``);
- a device collective kernel begins by the stream rules and ends at the last rank's begin
  plus its own duration.

Every time is computed by the same operations on the same values as in the engine (``max``
over the same arrivals, :class:`~simwar.executors.host_loop.Join`; the same additions
in the same order), so the Traces are the engine's, not close: op and span ids come from a
:class:`~simwar.core.recorder.Recorder` per rank fed in the rank's host order by the same
walk, and ``meta["collectives"]`` is appended in the same order
(``tests/test_ranks_fast.py`` compares every column). Only the order in which ranks are
*evaluated* differs, and a value never depends on it (each is a
function of values issued before it). Ranks that issue their collectives in orders the
coroutines cannot follow (a rank stopped at a device collective while another waits at a
host collective it has not reached) raise :class:`Unfollowable`; the caller then runs the
SimPy engine, which gives the answer (or its deadlock) of the reference.

Speed: no SimPy events, no stream processes; a stream is its tail time, and a device
collective is completed for every rank by the last to arrive (no generator per
collective). The Recorder is the engine's and most of what the pass costs. A whole run
keeping every rank's Trace is about 1.5x the SimPy engine; a run that needs no Trace
takes the ranks in lockstep instead (:mod:`simwar.executors.lockstep.ranks`, about 25x;
``python benchmarks/bench_fast.py ranks``), and this pass is what ``--trace`` and
``--timeline`` run.

Imports: :mod:`simwar.core` and :mod:`simwar.executors.host_loop` (no simpy).
"""

from __future__ import annotations

from simwar.core.program import Program
from simwar.core.recorder import Recorder
from simwar.core.refusals import PlanRefused
from simwar.core.rules import begins, collective_ends, released
from simwar.core.trace import Trace
from simwar.executors.host_loop import Join, meta_collectives, walk


class Unfollowable(PlanRefused):
    """The ranks' collectives are issued in orders one pass per rank cannot follow."""


#: what a rank's walk yields at a device collective some rank has not reached: it stops
STOP = (None,)


class StreamTails:
    """The device of :func:`~simwar.executors.host_loop.walk` in one pass: a stream is its
    tail (when its previous operation ended), and each operation is timed at its issue by
    the rules of :mod:`simwar.core.rules`. At a collective some rank has not reached, the
    rank's walk stops (yields None), resumed once all have: the last to arrive puts the
    others in ``ready``."""

    __slots__ = ("rank", "n", "op_start", "op_end", "free", "host_joins", "device_joins",
                 "ready")

    def __init__(self, rank: int, n: int, rec: Recorder, joins: list[dict], ready: list):
        self.rank = rank
        self.n = n
        self.op_start, self.op_end = rec.op_start, rec.op_end
        self.free: dict[str, float] = {}  # a stream's tail: when its previous op ended
        self.host_joins, self.device_joins = joins  # instance -> Join, shared by the ranks
        self.ready = ready

    def kernel(self, lane: str, op_id: int, ready: float, duration_us: float) -> None:
        free = self.free
        start = begins(free.get(lane, 0.0), ready)
        free[lane] = end = start + duration_us
        self.op_start[op_id] = start
        self.op_end[op_id] = end

    def record(self, lane: str, op_id: int, ready: float) -> tuple[float, str]:
        """The handle: (when it fired, its lane)."""
        start = begins(self.free.get(lane, 0.0), ready)
        self.op_start[op_id] = self.op_end[op_id] = self.free[lane] = start
        return start, lane

    def wait(self, lane: str, op_id: int, ready: float, bound: tuple | None,
             latency_us: float) -> None:
        free = self.free
        start = begins(free.get(lane, 0.0), ready)
        end = start
        if bound is not None:
            end = released(start, bound[0], latency_us, bound[1] == lane)
        free[lane] = end
        self.op_start[op_id] = start
        self.op_end[op_id] = end

    def fired(self, bound: tuple, called: float):
        return bound[0]
        yield  # a generator: a record's time is known at its issue

    def _join(self, table: dict, index: int, time: float) -> Join:
        """Instance ``index`` of ``table`` (made at the first rank's arrival), with this rank's
        arrival at ``time`` counted in."""
        j = table.get(index)
        if j is None:
            j = table[index] = Join(self.n)
            j.waiting = []
        j.times[self.rank] = time
        j.arrived += 1
        return j

    def _arrive(self, table: dict, index: int, time: float) -> Join:
        """This rank's arrival at instance ``index`` of ``table``; the instance (complete
        when all are in: the last rank forgets it and readies the others)."""
        j = self._join(table, index, time)
        if j.arrived == self.n:
            del table[index]
            self.ready.extend(j.waiting)
        else:
            j.waiting.append(self.rank)
        return j

    def host_collective(self, index: int, arrival: float):
        j = self._arrive(self.host_joins, index, arrival)
        if j.arrived < self.n:
            yield
        return max(j.times)

    def collective(self, lane: str, op_id: int, ready: float, duration_us: float,
                   index: int) -> tuple:
        """Not a generator (a collective is on the hot path: tens per step and rank): the
        rank's arrival, and ``()`` when it completes the instance, which it then does for
        every rank (each one's end, ``max(j.times)`` plus its own duration, and its stream's
        tail), else :data:`STOP`, the rank resumed once the last has arrived."""
        start = begins(self.free.get(lane, 0.0), ready)
        self.op_start[op_id] = start
        table = self.device_joins
        j = self._join(table, index, start)
        if j.arrived < self.n:
            j.waiting.append((self, lane, op_id, duration_us))
            return STOP
        del table[index]
        last = max(j.times)
        for device, lane_, op_, duration in j.waiting:
            device.free[lane_] = device.op_end[op_] = collective_ends(last, duration)
            self.ready.append(device.rank)
        self.free[lane] = self.op_end[op_id] = collective_ends(last, duration_us)
        return ()

    def end(self, t: float):
        return
        yield  # a generator: nothing waits for the host's last op


def run_ranks(programs: list[Program], progress=None) -> list[Trace]:
    """The ranks' Traces, equal to :func:`simwar.executors.ranks.run_ranks`'s (module
    docstring); :class:`Unfollowable` when the ranks' collectives cannot be met in one
    pass each (the SimPy engine then decides)."""
    n = len(programs)
    joins: list[dict] = [{}, {}]
    recs = [Recorder() for _ in programs]
    colls: list[list] = [[] for _ in programs]
    ready = list(range(n - 1, -1, -1))  # the ranks that can go on (rank 0 first)
    hosts = [walk(p, recs[r], StreamTails(r, n, recs[r], joins, ready), colls[r],
                  progress if r == 0 else None)
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
        meta["collectives"] = meta_collectives(c)
        meta.setdefault("source", "sim")
        traces.append(rec.finish(meta))
    return traces


__all__ = ["Unfollowable", "run_ranks"]
