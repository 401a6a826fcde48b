"""The ``simpy`` executor: runs a Program on simulated CUDA streams, returns a Trace.

This is the only module that imports simpy, and the reference executor (``engine="simpy"``):
the fast executor (:mod:`simwar.executors.fast`, one pass without SimPy) is held equal to it
by tests. It must not import pandas, yaml, matplotlib or torch (a test checks
``sys.modules``).

The host side (the walk over the host ops, the host clock, the recorder calls) is
:func:`simwar.executors.host_loop.walk`, which the fast executor's ranks share; this module
is its device on SimPy, :class:`SimPyStreams`, and the :class:`Engine` that runs the two.

The CUDA rules are written once in docs/design.md ("CUDA semantics") and computed by
:mod:`simwar.core.rules`; here they run inside SimPy processes. Reading the code needs only
where each op's figures come from: a host call costs its ``host_us``, a wait released by
another stream's record adds its ``latency_us``, a synchronize that blocked its ``wake_us``;
a wait binds at its host call to the latest record issued before it (a graph launch re-arms
its in-graph record nodes), so re-recording an event moves only later waits' binding.

Speed: the host thread never looks at device state except in a synchronize,
so it runs ahead on its own clock and hands each stream operation a
``ready_us`` (the host time its call returned); it only yields to SimPy at a
synchronize. Streams are SimPy processes that honour ``ready_us``. The
resulting timeline is identical to yielding at every host call, with far
fewer events. Times are computed by the rules from the values involved, and
SimPy's clock only orders the processes, so the figures do not depend on how
SimPy accumulates time.

Everything is recorded through :class:`simwar.core.recorder.Recorder`, which hands
out the op and span ids that tie each span to its op and each op to the host
call that issued it, and derives the device spans from the ops' times.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import simpy

from simwar.core.collector import gc_paused
from simwar.core.program import Program
from simwar.core.recorder import Recorder
from simwar.core.rules import begins, collective_ends, released
from simwar.core.trace import Trace
from simwar.executors.host_loop import Join, meta_collectives, walk

_KERNEL, _RECORD, _WAIT, _COLLECTIVE = 0, 1, 2, 3


class _Rec:
    """One record instance: fires once, when its stream reaches it."""

    __slots__ = ("lane", "time", "event")

    def __init__(self, lane: str):
        self.lane = lane
        self.time: float | None = None
        self.event: simpy.Event | None = None


class _Stream:
    __slots__ = ("name", "queue", "wake")

    def __init__(self, name: str):
        self.name = name
        self.queue: deque = deque()
        self.wake: simpy.Event | None = None


class Group:
    """The ranks of one tensor-parallel run: the collectives they join (the k-th host
    collective of every rank is one instance, the k-th device collective another)."""

    def __init__(self, n: int):
        self.n = n
        #: the instances some rank was issued or arrived at and not all ranks arrived at
        self.joins: dict[tuple[int, int], Join] = {}

    def join(self, table: int, index: int) -> Join:
        key = (table, index)
        j = self.joins.get(key)
        if j is None:
            j = self.joins[key] = Join(self.n)
        return j

    def arrive(self, env, key: tuple[int, int], j: Join, rank: int, t: float):
        """Rank ``rank`` arrives at ``j`` at ``t``; the event to wait on (None: all are in,
        and the instance is forgotten: each rank holds it until it read the last arrival)."""
        j.times[rank] = t
        j.arrived += 1
        if j.arrived == self.n:
            del self.joins[key]
            if j.waiting is not None:
                j.waiting.succeed()
            return None
        if j.waiting is None:
            j.waiting = env.event()
        return j.waiting


class _CountingEnvironment(simpy.Environment):
    """An Environment that counts the events it schedules (a public hook, no private state)."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduled = 0

    def schedule(self, event, priority=simpy.core.NORMAL, delay=0) -> None:
        self.scheduled += 1
        super().schedule(event, priority, delay)


class SimPyStreams:
    """The device of :func:`~simwar.executors.host_loop.walk` on SimPy: each stream a process
    that runs its operations in FIFO order when SimPy's clock reaches them, by the rules of
    :mod:`simwar.core.rules`; the host's blocking points wait on SimPy events.

    The host runs ahead on its own clock: a stream operation carries its ``ready`` time
    and the stream honours it, so the host yields to SimPy only where it blocks."""

    def __init__(self, env: simpy.Environment, rec: Recorder, group: Group | None = None,
                 rank: int = 0):
        self.env = env
        self.rec = rec
        self.streams: dict[str, _Stream] = {}
        # tensor-parallel ranks (executors/ranks.py): the collectives this rank joins
        self.group = group
        self.rank = rank

    # ------------------------------------------------------------------ streams
    def stream(self, name: str) -> _Stream:
        """Stream ``name``, its process started on first use."""
        s = self.streams.get(name)
        if s is None:
            s = self.streams[name] = _Stream(name)
            self.env.process(self._stream_loop(s))
        return s

    def _enqueue(self, lane: str, item: tuple) -> None:
        s = self.streams.get(lane) or self.stream(lane)
        s.queue.append(item)
        if s.wake is not None:
            wake, s.wake = s.wake, None
            wake.succeed()

    def _stream_loop(self, s: _Stream):
        env = self.env
        timeout = env.timeout
        queue = s.queue
        popleft = queue.popleft
        lane = s.name
        rec = self.rec
        op_start, op_end = rec.op_start, rec.op_end
        free = 0.0  # when the stream finished its previous operation
        group, rank = self.group, self.rank
        while True:
            while not queue:
                s.wake = env.event()
                yield s.wake
            code, ready, op_id, arg, latency = popleft()
            start = begins(free, ready)
            if start > env.now:
                yield timeout(start - env.now)
            if code == _KERNEL:
                free = start + arg
                op_start[op_id] = start
                op_end[op_id] = free
                if arg > 0:
                    yield timeout(arg)
            elif code == _COLLECTIVE:  # complete at the last rank's begin + own duration
                key, j = arg
                wait_all = group.arrive(env, key, j, rank, start)
                if wait_all is not None:
                    yield wait_all
                free = collective_ends(max(j.times), latency)
                op_start[op_id] = start
                op_end[op_id] = free
                if free > env.now:
                    yield timeout(free - env.now)
            elif code == _RECORD:
                op_start[op_id] = op_end[op_id] = free = start
                arg.time = start
                if arg.event is not None:
                    arg.event.succeed()
            else:  # wait
                free = start
                if arg is not None:
                    if arg.time is None:
                        if arg.event is None:
                            arg.event = env.event()
                        yield arg.event
                    free = released(start, arg.time, latency, arg.lane == lane)
                    if free > env.now:
                        yield timeout(free - env.now)
                op_start[op_id] = start
                op_end[op_id] = free

    # ------------------------------------------------------------------ the host's calls
    def kernel(self, lane: str, op_id: int, ready: float, duration_us: float) -> None:
        # the most frequent call: _enqueue written out
        s = self.streams.get(lane) or self.stream(lane)
        s.queue.append((_KERNEL, ready, op_id, duration_us, 0.0))
        if s.wake is not None:
            wake, s.wake = s.wake, None
            wake.succeed()

    def record(self, lane: str, op_id: int, ready: float) -> _Rec:
        r = _Rec(lane)
        self._enqueue(lane, (_RECORD, ready, op_id, r, 0.0))
        return r

    def wait(self, lane: str, op_id: int, ready: float, bound: _Rec | None,
             latency_us: float) -> None:
        self._enqueue(lane, (_WAIT, ready, op_id, bound, latency_us))

    def collective(self, lane: str, op_id: int, ready: float, duration_us: float,
                   index: int):
        group = self.group
        if group is None:  # a lone rank: a kernel of its length
            self._enqueue(lane, (_KERNEL, ready, op_id, duration_us, 0.0))
        else:  # the stream joins the instance when it reaches it; the host goes on
            key = (1, index)
            self._enqueue(lane, (_COLLECTIVE, ready, op_id, (key, group.join(*key)),
                                 duration_us))
        return
        yield  # a generator: the host never blocks at a device collective here

    def fired(self, bound: _Rec, called: float):
        env = self.env
        if called > env.now:
            yield env.timeout(called - env.now)
        if bound.time is None:
            if bound.event is None:
                bound.event = env.event()
            yield bound.event
        return bound.time

    def host_collective(self, index: int, arrival: float):
        group = self.group
        if group is None:  # a lone rank: nobody to wait for
            return arrival
        key = (0, index)
        j = group.join(*key)
        env = self.env
        if arrival > env.now:  # arrive in time order: the others' clocks may be behind
            yield env.timeout(arrival - env.now)
        wait_all = group.arrive(env, key, j, self.rank, arrival)
        if wait_all is not None:
            yield wait_all
        return max(j.times)

    def end(self, t: float):
        env = self.env
        if t > env.now:
            yield env.timeout(t - env.now)


class Engine:
    """Executes one Program. ``run()`` returns the Trace; ``events`` counts SimPy events.

    ``progress``: called with the step number as the host reaches each step (an observer;
    the engine itself never prints).
    """

    def __init__(self, program: Program, progress: Callable[[int], None] | None = None,
                 env: simpy.Environment | None = None, group: Group | None = None,
                 rank: int = 0):
        self.program = program
        self.progress = progress
        self.env = env if env is not None else _CountingEnvironment()
        self.rec = Recorder()
        self.device = SimPyStreams(self.env, self.rec, group, rank)
        self.events = 0
        self.group = group
        #: (op id, 0 host | 1 device, instance) of each collective joined
        self.collectives: list[tuple[int, int, int]] = []

    # ------------------------------------------------------------------ public
    def run(self) -> Trace:
        env = self.env
        self.start()
        with gc_paused():  # a run makes no cycles worth collecting
            env.run()
        return self.finish()

    def start(self) -> None:
        """Start the host and stream processes in ``env`` (``run`` runs them)."""
        for name in self.program.streams:
            self.device.stream(name)
        self.env.process(walk(self.program, self.rec, self.device, self.collectives,
                              self.progress))

    def finish(self) -> Trace:
        """The Trace, once ``env`` has run."""
        env = self.env
        self.events = env.scheduled
        meta = dict(self.program.meta)
        if self.group is not None:
            meta["collectives"] = meta_collectives(self.collectives)
        meta.setdefault("source", "sim")
        # the run's bookkeeping (the streams' processes, the records they fire) is done
        # with: free it before the recorder moves its columns into the Trace
        self.device = None
        self.env = None
        return self.rec.finish(meta)


def run(program: Program) -> Trace:
    """Simulate ``program`` and return its Trace."""
    return Engine(program).run()
