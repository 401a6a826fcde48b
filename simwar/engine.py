"""The SimPy executor: runs a Program on simulated CUDA streams, returns a Trace.

This is the only module that imports simpy. It must not import pandas, yaml,
matplotlib or torch (a test checks ``sys.modules``).

CUDA rules honoured (DESIGN.md, "CUDA semantics"):

- each stream runs its operations in FIFO order; streams run concurrently;
- ``record(E, S)`` captures the tail of S at the host call: it is a stream
  operation that fires when S reaches it. Re-recording E moves the pointer
  that later waits bind to; earlier waits keep their binding;
- ``wait_event(T, E)`` binds, at the host call, to the most recent record of E
  issued before it; an event never recorded makes it a no-op;
- ``wait_stream(T, S)`` is a fresh record on S followed by a wait on T;
- an in-graph record node is re-armed by each graph launch (the host call)
  and fires when graph execution reaches it;
- a host ``synchronize(E)`` returns at once if E already fired, else when it
  fires plus the op's wake-up latency ``wake_us``;
- every host call costs its ``host_us``; the device sees the operation when
  the call returns;
- a wait released by another stream's record adds the op's ``latency_us``.

Speed: the host thread never looks at device state except in a synchronize,
so it runs ahead on its own clock and hands each stream operation a
``ready_us`` (the host time its call returned); it only yields to SimPy at a
synchronize. Streams are SimPy processes that honour ``ready_us``. The
resulting timeline is identical to yielding at every host call, with far
fewer events.
"""

from __future__ import annotations

import gc
from collections import deque
from functools import partial
from typing import Callable

import simpy

from .program import (
    CpuWork,
    GraphLaunch,
    GraphRecord,
    Launch,
    Marker,
    Program,
    Record,
    StepMarker,
    Synchronize,
    WaitEvent,
    WaitStream,
)
from .trace import HOST, Access, Op, Span, Trace
from .trace import Marker as TraceMarker

_KERNEL, _RECORD, _WAIT = 0, 1, 2
# indices into an op row (a list, finalized into trace.Op at the end)
_START, _END = 8, 9


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


class Engine:
    """Executes one Program. ``run()`` returns the Trace; ``events`` counts SimPy events.

    ``progress``: called with the step number as the host reaches each step (an observer;
    the engine itself never prints).
    """

    def __init__(self, program: Program, progress: Callable[[int], None] | None = None):
        self.program = program
        self.progress = progress
        self.env = simpy.Environment()
        self.spans: list[Span] = []
        self.rows: list[list] = []
        self.accesses: list[Access] = []
        self.markers: list[TraceMarker] = []
        self.streams: dict[str, _Stream] = {}
        self.latest: dict[str, _Rec] = {}  # event name -> most recent record instance
        self.events = 0

    # ------------------------------------------------------------------ public
    def run(self) -> Trace:
        env = self.env
        for name in self.program.streams:
            self._stream(name)
        env.process(self._host())
        # the run allocates many small tuples and no reference cycles worth collecting:
        # pausing the cyclic collector saves a third of the time
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            env.run()
            ops = list(map(_new_op, self.rows))
        finally:
            if gc_was_enabled:
                gc.enable()
        self.events = _event_count(env)
        meta = dict(self.program.meta)
        meta.setdefault("source", "sim")
        # spans are in completion order per lane; consumers sort when they need to
        return Trace(spans=self.spans, ops=ops, accesses=self.accesses, markers=self.markers,
                     meta=meta)

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
        append_span = self.spans.append
        while True:
            while not queue:
                s.wake = env.event()
                yield s.wake
            code, ready, row, arg, latency = popleft()
            if ready > env.now:
                yield timeout(ready - env.now)
            now = env.now
            if code == _KERNEL:
                end = now + arg
                row[_START] = now
                row[_END] = end
                if arg > 0:
                    yield timeout(arg)
                append_span(_new_span((lane, row[4], "kernel", row[3], now, end, row[10], "")))
            elif code == _RECORD:
                row[_START] = row[_END] = now
                arg.time = now
                if arg.event is not None:
                    arg.event.succeed()
            else:  # wait
                row[_START] = now
                if arg is not None:
                    if arg.time is None:
                        if arg.event is None:
                            arg.event = env.event()
                        yield arg.event
                    release = arg.time + (latency if arg.lane != lane else 0.0)
                    if release > env.now:
                        yield timeout(release - env.now)
                    if env.now > now:
                        append_span(_new_span((lane, row[4], "wait", row[3], now, env.now, "",
                                               "")))
                row[_END] = env.now

    # ------------------------------------------------------------------ host
    def _host(self):
        env = self.env
        append_span = self.spans.append
        rows = self.rows
        new_row = rows.append
        accesses = self.accesses
        latest = self.latest
        streams = self.streams
        markers = self.markers
        progress = self.progress

        def enqueue(stream: str, item: tuple) -> None:
            st = streams.get(stream) or self._stream(stream)
            st.queue.append(item)
            if st.wake is not None:
                wake, st.wake = st.wake, None
                wake.succeed()

        def kernel(stream: str, k, step: int, ready: float) -> None:
            op_id = len(rows)
            row = [op_id, stream, "kernel", step, k.label, "", -1, ready, -1.0, -1.0, k.phase]
            new_row(row)
            for b in k.reads:
                accesses.append(_new_access((op_id, b, "read", step, k.phase)))
            for b in k.writes:
                accesses.append(_new_access((op_id, b, "write", step, k.phase)))
            enqueue(stream, (_KERNEL, ready, row, k.duration_us, 0.0))

        def record(event: str, stream: str, step: int, ready: float, label: str) -> _Rec:
            op_id = len(rows)
            row = [op_id, stream, "record", step, label, event, -1, ready, -1.0, -1.0, ""]
            new_row(row)
            rec = _Rec(op_id, stream)
            enqueue(stream, (_RECORD, ready, row, rec, 0.0))
            return rec

        def wait(stream: str, rec, event: str, step: int, ready: float, label: str,
                 latency_us: float) -> None:
            row = [len(rows), stream, "wait", step, label, event,
                   rec.op_id if rec is not None else -1, ready, -1.0, -1.0, ""]
            new_row(row)
            enqueue(stream, (_WAIT, ready, row, rec, latency_us))

        t = 0.0  # the host thread's own clock; env.now <= t always
        for op in self.program.ops:
            kind = type(op)
            if kind is Launch:
                k = op.kernel
                t0, t = t, t + op.host_us
                append_span(_new_span((HOST, k.label, "api", op.step, t0, t, k.phase, "")))
                kernel(op.stream, k, op.step, t)
            elif kind is CpuWork:
                append_span(_new_span((HOST, op.label, "cpu", op.step, t, t + op.duration_us,
                                       "", "")))
                t += op.duration_us
            elif kind is Record:
                t0, t = t, t + op.host_us
                append_span(_new_span((HOST, "record " + op.event, "api", op.step, t0, t, "",
                                       "")))
                latest[op.event] = record(op.event, op.stream, op.step, t, op.event)
            elif kind is WaitStream:
                t0, t = t, t + op.host_us
                append_span(_new_span((HOST, f"{op.stream}.wait_stream({op.other})", "api",
                                       op.step, t0, t, "", "")))
                name = op.other + ".tail"
                rec = record(name, op.other, op.step, t, name)
                wait(op.stream, rec, name, op.step, t, "wait " + op.other, op.latency_us)
            elif kind is GraphLaunch:
                t0, t = t, t + op.host_us
                append_span(_new_span((HOST, op.graph, "api", op.step, t0, t, op.phase, "")))
                for node in op.nodes:
                    if type(node) is GraphRecord:
                        # the launch re-arms the node: later waits bind to this launch's record
                        latest[node.event] = record(node.event, op.stream, op.step, t,
                                                    f"{op.graph}:{node.event}")
                    else:
                        kernel(op.stream, node, op.step, t)
            elif kind is WaitEvent:
                t0, t = t, t + op.host_us
                append_span(_new_span((HOST, f"{op.stream}.wait_event({op.event})", "api",
                                       op.step, t0, t, "", "")))
                wait(op.stream, latest.get(op.event), op.event, op.step, t, "wait " + op.event,
                     op.latency_us)
            elif kind is Synchronize:
                t0, t1 = t, t + op.host_us
                rec = latest.get(op.event)
                row = [len(rows), HOST, "sync", op.step, "sync " + op.event, op.event,
                       rec.op_id if rec is not None else -1, t0, t0, t0, ""]
                new_row(row)
                if rec is not None:
                    if t1 > env.now:
                        yield env.timeout(t1 - env.now)
                    if rec.time is None:
                        if rec.event is None:
                            rec.event = env.event()
                        yield rec.event
                    if rec.time > t1:  # really blocked: pay the wake-up latency
                        t1 = rec.time + op.wake_us
                row[_END] = t = t1
                append_span(_new_span((HOST, "sync " + op.event, "blocked", op.step, t0, t1,
                                       "", op.site)))
            elif kind is StepMarker:
                markers.append(TraceMarker("step", op.step, t))
                if progress is not None:
                    progress(op.step)
            elif kind is Marker:
                markers.append(TraceMarker(op.name, op.step, t))
            else:
                raise TypeError(f"unknown host op {op!r}")
        if t > env.now:
            yield env.timeout(t - env.now)
        markers.append(TraceMarker("end", -1, t))


# NamedTuple constructors without the Python-level __new__ frame (the engine makes ~50 a step)
_new_span = partial(tuple.__new__, Span)
_new_op = partial(tuple.__new__, Op)
_new_access = partial(tuple.__new__, Access)


def _event_count(env: simpy.Environment) -> int:
    # SimPy numbers every scheduled event from one counter; read it without advancing it twice.
    eid = getattr(env, "_eid", None)
    return next(eid) if eid is not None else -1


def run(program: Program) -> Trace:
    """Simulate ``program`` and return its Trace."""
    return Engine(program).run()
