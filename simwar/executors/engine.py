"""The ``simpy`` executor: runs a Program on simulated CUDA streams, returns a Trace.

This is the only module that imports simpy, and the reference executor: the
``fast`` executor (:mod:`simwar.executors.fast`) is held equal to it by tests. It must
not import pandas, yaml, matplotlib or torch (a test checks ``sys.modules``).

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
from simwar.core.rules import begins, released, returns
from simwar.core.trace import HOST, Call, OpKind, Trace

_KERNEL, _RECORD, _WAIT, _COLLECTIVE = 0, 1, 2, 3
KERNEL, RECORD, WAIT, SYNC = OpKind.KERNEL, OpKind.RECORD, OpKind.WAIT, OpKind.SYNC
NAN = float("nan")


class _Rec:
    """One record instance: fires once, when its stream reaches it."""

    __slots__ = ("op_id", "lane", "time", "event")

    def __init__(self, op_id: int, lane: str):
        self.op_id = op_id
        self.lane = lane
        self.time: float | None = None
        self.event: simpy.Event | None = None


class _Stream:
    __slots__ = ("name", "queue", "wake")

    def __init__(self, name: str):
        self.name = name
        self.queue: deque = deque()
        self.wake: simpy.Event | None = None


class _Join:
    """One collective instance across ranks: each rank's arrival, and the event the early
    ranks wait on until the last arrives."""

    __slots__ = ("times", "event", "readers")

    def __init__(self) -> None:
        self.times: dict[int, float] = {}
        self.event: simpy.Event | None = None
        self.readers = 0


class Group:
    """The ranks of one tensor-parallel run: the collectives they join (the k-th host
    collective of every rank is one instance, the k-th device collective another)."""

    def __init__(self, n: int):
        self.n = n
        self.joins: dict[tuple[int, int], _Join] = {}

    def join(self, table: int, index: int) -> _Join:
        key = (table, index)
        j = self.joins.get(key)
        if j is None:
            j = self.joins[key] = _Join()
        return j

    def arrive(self, env, j: _Join, rank: int, t: float):
        """Rank ``rank`` arrives at ``j`` at ``t``; the event to wait on (None: all are in)."""
        j.times[rank] = t
        if len(j.times) == self.n:
            if j.event is not None:
                j.event.succeed()
            return None
        if j.event is None:
            j.event = env.event()
        return j.event

    def leave(self, key: tuple[int, int], j: _Join) -> float:
        """The last arrival (each rank reads it once; the instance is then forgotten)."""
        j.readers += 1
        if j.readers == self.n:
            del self.joins[key]
        return max(j.times.values())


class _CountingEnvironment(simpy.Environment):
    """An Environment that counts the events it schedules (a public hook, no private state)."""

    def __init__(self) -> None:
        super().__init__()
        self.scheduled = 0

    def schedule(self, event, priority=simpy.core.NORMAL, delay=0) -> None:
        self.scheduled += 1
        super().schedule(event, priority, delay)


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
        self.streams: dict[str, _Stream] = {}
        self.latest: dict[str, _Rec] = {}  # event name -> most recent record instance
        self.events = 0
        # tensor-parallel ranks (executors/ranks.py): the collectives this rank joins
        self.group = group
        self.rank = rank
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
            self._stream(name)
        self.env.process(self._host())

    def finish(self) -> Trace:
        """The Trace, once ``env`` has run."""
        env = self.env
        self.events = env.scheduled
        meta = dict(self.program.meta)
        if self.group is not None:
            ops, device, inst = zip(*self.collectives) if self.collectives else ((), (), ())
            meta["collectives"] = {"op": list(ops), "device": list(device),
                                   "instance": list(inst)}
        meta.setdefault("source", "sim")
        # the run's bookkeeping (a record per event name, the streams' processes) is done
        # with: free it before the recorder moves its columns into the Trace
        self.latest.clear()
        self.streams.clear()
        self.env = None
        return self.rec.finish(meta)

    # ------------------------------------------------------------------ streams
    def _stream(self, name: str) -> _Stream:
        s = self.streams.get(name)
        if s is None:
            s = self.streams[name] = _Stream(name)
            self.env.process(self._stream_loop(s))
        return s

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
                wait_all = group.arrive(env, j, rank, start)
                if wait_all is not None:
                    yield wait_all
                free = group.leave(key, j) + latency
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

    # ------------------------------------------------------------------ host
    def _host(self):
        env = self.env
        rec = self.rec
        host = rec.host
        new_op = rec.op
        access = rec.access
        marker = rec.marker
        latest = self.latest
        streams = self.streams
        progress = self.progress
        group, rank = self.group, self.rank
        collectives = self.collectives
        n_host = n_device = 0  # collectives issued so far (the instance numbers)

        def enqueue(stream: str, item: tuple) -> None:
            st = streams.get(stream) or self._stream(stream)
            st.queue.append(item)
            if st.wake is not None:
                wake, st.wake = st.wake, None
                wake.succeed()

        def kernel(stream: str, k, step: int, ready: float, call: int) -> None:
            op_id = new_op(KERNEL, stream, step, k.label, "", -1, ready, NAN, NAN, k.phase, call)
            for b in k.reads:
                access(op_id, b, False, step, k.phase)
            for b in k.writes:
                access(op_id, b, True, step, k.phase)
            enqueue(stream, (_KERNEL, ready, op_id, k.duration_us, 0.0))

        def record(event: str, stream: str, step: int, ready: float, call: int) -> _Rec:
            op_id = new_op(RECORD, stream, step, event, event, -1, ready, NAN, NAN, "", call)
            r = _Rec(op_id, stream)
            enqueue(stream, (_RECORD, ready, op_id, r, 0.0))
            return r

        def wait(stream: str, r, event: str, step: int, ready: float, latency_us: float,
                 call: int) -> None:
            op_id = new_op(WAIT, stream, step, event, event, r.op_id if r is not None else -1,
                           ready, NAN, NAN, "", call)
            enqueue(stream, (_WAIT, ready, op_id, r, latency_us))

        t = 0.0  # the host thread's own clock; env.now <= t always
        for op in self.program.ops:
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
                call = host(Call.GRAPH_LAUNCH, op.step, t0, t, op.graph, op.phase, "",
                            rec.next_op)
                for node in op.nodes:
                    if type(node) is GraphRecord:
                        # the launch re-arms the node: later waits bind to this launch's record
                        latest[node.event] = record(node.event, op.stream, op.step, t, call)
                    elif type(node) is Collective and group is not None:
                        op_id = new_op(KERNEL, op.stream, op.step, node.label, "", -1, t, NAN,
                                       NAN, node.phase, call)
                        key = (1, n_device)
                        collectives.append((op_id, 1, n_device))
                        n_device += 1
                        enqueue(op.stream, (_COLLECTIVE, t, op_id, (key, group.join(*key)),
                                            node.duration_us))
                    elif type(node) is Collective:  # a lone rank: a kernel of its length
                        op_id = new_op(KERNEL, op.stream, op.step, node.label, "", -1, t, NAN,
                                       NAN, node.phase, call)
                        enqueue(op.stream, (_KERNEL, t, op_id, node.duration_us, 0.0))
                    else:
                        kernel(op.stream, node, op.step, t, call)
            elif kind is WaitEvent:
                t0, t = t, t + op.host_us
                call = host(Call.WAIT_EVENT, op.step, t0, t, op.event, "", "", rec.next_op)
                wait(op.stream, latest.get(op.event), op.event, op.step, t, op.latency_us, call)
            elif kind is Synchronize:
                t0 = t
                r = latest.get(op.event)
                fired = None
                if r is not None:
                    t1 = t0 + op.host_us
                    if t1 > env.now:
                        yield env.timeout(t1 - env.now)
                    if r.time is None:
                        if r.event is None:
                            r.event = env.event()
                        yield r.event
                    fired = r.time
                t = returns(t0, op.host_us, fired, op.wake_us)
                # recorded once it returned: no other host op is issued while the host blocks
                call = host(Call.SYNCHRONIZE, op.step, t0, t, op.event, "", op.site, rec.next_op)
                new_op(SYNC, HOST, op.step, op.event, op.event,
                       r.op_id if r is not None else -1, t0, t0, t, "", call)
            elif kind is HostCollective:
                t0 = t
                if group is None:  # a lone rank: nobody to wait for
                    last = t0
                else:
                    key = (0, n_host)
                    n_host += 1
                    j = group.join(*key)
                    if t0 > env.now:  # arrive in time order: the others' clocks may be behind
                        yield env.timeout(t0 - env.now)
                    wait_all = group.arrive(env, j, rank, t0)
                    if wait_all is not None:
                        yield wait_all
                    last = group.leave(key, j)
                t = last + op.cost_us + (op.wake_us if last > t0 else 0.0)
                call = host(Call.SYNCHRONIZE, op.step, t0, t, op.name, "", op.name, rec.next_op)
                op_id = new_op(SYNC, HOST, op.step, op.name, "", -1, t0, t0, t, "", call)
                if group is not None:
                    collectives.append((op_id, 0, key[1]))
            elif kind is StepMarker:
                marker("step", op.step, t)
                if progress is not None:
                    progress(op.step)
            elif kind is Marker:
                marker(op.name, op.step, t)
            else:
                raise TypeError(f"unknown host op {op!r}")
        if t > env.now:
            yield env.timeout(t - env.now)
        marker("end", -1, t)


def run(program: Program) -> Trace:
    """Simulate ``program`` and return its Trace."""
    return Engine(program).run()
