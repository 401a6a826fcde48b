"""The host thread: one walk over a Program's host ops, for every executor that keeps a Trace.

The SimPy engine (:mod:`simwar.executors.engine`) and the fast executor's tensor-parallel
ranks (:mod:`simwar.executors.fast.ranks`) issue the same host calls and record the same
ops in the same order; they differ only in how a device operation gets its times. So the
host side is written once, here: :func:`walk` goes through the host ops (their dispatch,
the host clock, the recorder calls that hand out op and span ids, which record a wait or a
synchronize binds to, the collectives' instance numbers) and hands each device operation
to a :class:`Device`, which times it:

- the SimPy streams (:class:`simwar.executors.engine.SimPyStreams`): queue it on a stream
  process that runs when SimPy's clock reaches it;
- the stream tails (:class:`simwar.executors.fast.ranks.StreamTails`): time it at once from
  its stream's tail and the record it binds to.

Blocking points are the device's, as SimPy's ``Store`` leaves ``_do_put``/``_do_get`` to
its subclasses: :func:`walk` is a generator, and at a synchronize, a host collective or a
device collective it delegates (``yield from``) to the device's generator, which yields
whatever its scheduler waits on (a SimPy event; ``None`` where a rank's coroutine stops
until every rank has arrived) and returns the time the walk goes on with. A device that
never blocks there returns without yielding.

The host-side rules are applied here, once: a synchronize returns by
:func:`simwar.core.rules.returns`; a host collective lets the host go at the last
arrival plus its cost, plus its wake-up when it waited. The stream rules (``begins``,
``released``) are each device's, since a device is where a stream's tail lives.

Imports: :mod:`simwar.core` only (no simpy: the ranks' fast pass runs without it).
"""

from __future__ import annotations

from typing import Callable, Generator, Iterable, Protocol

from simwar.core.program import (
    Collective,
    CpuWork,
    GraphLaunch,
    GraphRecord,
    HostCollective,
    Kernel,
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
from simwar.core.rules import host_collective_leaves, returns
from simwar.core.trace import HOST, Call, OpKind

KERNEL, RECORD, WAIT, SYNC = OpKind.KERNEL, OpKind.RECORD, OpKind.WAIT, OpKind.SYNC
NAN = float("nan")
#: the kinds of :data:`Device.collectives` entries (``meta["collectives"]["device"]``)
HOST_COLLECTIVE, DEVICE_COLLECTIVE = 0, 1


class Device(Protocol):
    """What :func:`walk` asks of a device. ``ready`` is the host time the call returned (the
    device sees the operation then); ``op_id`` the op the recorder gave it, whose start and
    end the device writes into the recorder's ``op_start``/``op_end``."""

    def kernel(self, lane: str, op_id: int, ready: float, duration_us: float) -> None:
        """Run ``duration_us`` of work on ``lane``."""

    def record(self, lane: str, op_id: int, ready: float) -> object:
        """Record an event on ``lane``: a handle that later waits and synchronizes bind to."""

    def wait(self, lane: str, op_id: int, ready: float, bound: object | None,
             latency_us: float) -> None:
        """Make ``lane`` wait for the record ``bound`` (a handle of :meth:`record`; None: a
        no-op, the event was never recorded)."""

    def fired(self, bound: object, called: float) -> Generator:
        """The host waits for ``bound`` from ``called`` (a synchronize, its call cost paid):
        returns when ``bound`` fired."""

    def host_collective(self, index: int, arrival: float) -> Generator:
        """The host joins host collective ``index`` at ``arrival``: returns the last rank's
        arrival."""

    def collective(self, lane: str, op_id: int, ready: float, duration_us: float,
                   index: int) -> Iterable:
        """A device collective kernel, instance ``index``, on ``lane``: what the walk yields
        (delegates to) before it goes on, a generator or a tuple (``()``: nothing)."""

    def end(self, t: float) -> Generator:
        """The host's last op is done at ``t``."""


def walk(program: Program, rec: Recorder, device: Device, collectives: list,
         progress: Callable[[int], None] | None = None) -> Generator:
    """Issue ``program``'s host ops to ``device``, recording them in ``rec``; a generator
    that yields what the device's blocking points yield. Appends ``(op id, host 0 | device
    1, instance)`` to ``collectives`` for every collective joined; calls ``progress`` with
    the step number as the host reaches each step."""
    host = rec.host
    new_op = rec.op
    access = rec.access
    marker = rec.marker
    device_kernel = device.kernel
    device_record = device.record
    device_wait = device.wait
    # event name -> its most recent record: (op id, the device's handle)
    latest: dict[str, tuple[int, object]] = {}
    n_host = n_device = 0  # collectives issued so far (the instance numbers)

    def kernel(lane: str, k: Kernel, step: int, ready: float, call: int) -> None:
        op_id = new_op(KERNEL, lane, step, k.label, "", -1, ready, NAN, NAN, k.phase, call)
        for b in k.reads:
            access(op_id, b, False, step, k.phase)
        for b in k.writes:
            access(op_id, b, True, step, k.phase)
        device_kernel(lane, op_id, ready, k.duration_us)

    def record(event: str, lane: str, step: int, ready: float, call: int) -> tuple:
        op_id = new_op(RECORD, lane, step, event, event, -1, ready, NAN, NAN, "", call)
        return op_id, device_record(lane, op_id, ready)

    def wait(lane: str, r: tuple | None, event: str, step: int, ready: float,
             latency_us: float, call: int) -> None:
        if r is None:
            op_id = new_op(WAIT, lane, step, event, event, -1, ready, NAN, NAN, "", call)
            device_wait(lane, op_id, ready, None, latency_us)
        else:
            op_id = new_op(WAIT, lane, step, event, event, r[0], ready, NAN, NAN, "", call)
            device_wait(lane, op_id, ready, r[1], latency_us)

    t = 0.0  # the host thread's own clock
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
            name = op.tail_event
            r = record(name, op.other, op.step, t, call)
            wait(op.stream, r, name, op.step, t, op.latency_us, call)
        elif kind is GraphLaunch:
            t0, t = t, t + op.host_us
            call = host(Call.GRAPH_LAUNCH, op.step, t0, t, op.graph, op.phase, "",
                        rec.next_op)
            lane = op.stream
            for node in op.nodes:
                node_kind = type(node)
                if node_kind is GraphRecord:
                    # the launch re-arms the node: later waits bind to this launch's record
                    latest[node.event] = record(node.event, lane, op.step, t, call)
                elif node_kind is Collective:
                    op_id = new_op(KERNEL, lane, op.step, node.label, "", -1, t, NAN, NAN,
                                   node.phase, call)
                    collectives.append((op_id, DEVICE_COLLECTIVE, n_device))
                    yield from device.collective(lane, op_id, t, node.duration_us, n_device)
                    n_device += 1
                elif node_kind is Kernel:
                    kernel(lane, node, op.step, t, call)
                else:
                    raise TypeError(f"unknown graph node {node!r}")
        elif kind is WaitEvent:
            t0, t = t, t + op.host_us
            call = host(Call.WAIT_EVENT, op.step, t0, t, op.event, "", "", rec.next_op)
            wait(op.stream, latest.get(op.event), op.event, op.step, t, op.latency_us, call)
        elif kind is Synchronize:
            t0 = t
            r = latest.get(op.event)
            fired = None
            if r is not None:
                fired = yield from device.fired(r[1], t0 + op.host_us)
            t = returns(t0, op.host_us, fired, op.wake_us)
            # recorded once it returned: no other host op is issued while the host blocks
            call = host(Call.SYNCHRONIZE, op.step, t0, t, op.event, "", op.site, rec.next_op)
            new_op(SYNC, HOST, op.step, op.event, op.event, r[0] if r is not None else -1,
                   t0, t0, t, "", call)
        elif kind is HostCollective:
            t0 = t
            index = n_host
            n_host += 1
            last = yield from device.host_collective(index, t0)
            t = host_collective_leaves(t0, last, op.cost_us, op.wake_us)
            call = host(Call.SYNCHRONIZE, op.step, t0, t, op.name, "", op.name, rec.next_op)
            op_id = new_op(SYNC, HOST, op.step, op.name, "", -1, t0, t0, t, "", call)
            collectives.append((op_id, HOST_COLLECTIVE, index))
        elif kind is StepMarker:
            marker("step", op.step, t)
            if progress is not None:
                progress(op.step)
        elif kind is Marker:
            marker(op.name, op.step, t)
        else:
            raise TypeError(f"unknown host op {op!r}")
    yield from device.end(t)
    marker("end", -1, t)


class Join:
    """One collective instance across ranks: each rank's arrival (by rank; None until it
    arrives), how many are in, and what the early ranks wait on (the device's: a SimPy
    event, or the ranks stopped). Once all are in, the instance's time is the last arrival,
    ``max(times)``: taken in rank order whatever the arrival order, the same value, since
    arrivals are never NaN nor -0.0 (sums of times from 0.0), on which alone ``max``
    depends on order. (The devices read the fields directly: a collective is on their hot
    path.)"""

    __slots__ = ("times", "arrived", "waiting")

    def __init__(self, n: int) -> None:
        self.times: list[float | None] = [None] * n
        self.arrived = 0
        self.waiting: object = None

    def missing(self) -> list[int]:
        """The ranks that have not arrived."""
        return [r for r, t in enumerate(self.times) if t is None]


def meta_collectives(collectives: list) -> dict:
    """``meta["collectives"]`` of a rank's Trace: the columns of :func:`walk`'s list."""
    ops, device, inst = zip(*collectives) if collectives else ((), (), ())
    return {"op": list(ops), "device": list(device), "instance": list(inst)}
