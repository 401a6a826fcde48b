"""A shape's host ops as named records, one NamedTuple per kind (the fast executor's plans).

Each record's first field is the kind's name: a shape's structure is its tuple of records,
hashed and compared as plain tuples are (so shapes, plans and templates compare and hash as
they would positionally), while every reader names the fields it reads. The shaper
(:mod:`simwar.executors.fast.plan`) builds plain tuples in each record's field order and turns
them into records only when it creates a new shape (:func:`host_records`): a NamedTuple costs
several times a tuple to make, per op of every segment.

Imports: :mod:`simwar.core.program` only.
"""

from __future__ import annotations

from typing import NamedTuple

from simwar.core.program import tail_event

#: the named markers a shape keeps, each a host instant of its step: the launch of its
#: forward (``run_batch``) and, in a run with requests, its result processed (``result_done``)
MARKS = ("run_batch", "result_done")


class HostCpu(NamedTuple):
    """CPU work of the host (its one parameter: the duration)."""

    kind: str  # "cpu"


class HostLaunch(NamedTuple):
    """A kernel launch (parameters: the host call's cost, the kernel's duration)."""

    kind: str  # "launch"
    stream: str
    off: int  # step offset from the segment's step
    label: str
    phase: str
    accesses: tuple  # ((buffer, Mode), ...): reads, then writes


class GraphRecordNode(NamedTuple):
    """A record node of a graph launch (no parameter)."""

    kind: str  # "r"


class GraphKernelNode(NamedTuple):
    """A kernel node of a graph launch (its parameter: the kernel's duration)."""

    kind: str  # "k"
    label: str
    phase: str
    accesses: tuple


class HostGraph(NamedTuple):
    """A graph launch (parameters: the host call's cost, then each kernel node's duration)."""

    kind: str  # "graph"
    stream: str
    off: int
    nodes: tuple  # GraphRecordNode | GraphKernelNode, in the graph's order


class HostRecord(NamedTuple):
    """An event record (its parameter: the host call's cost)."""

    kind: str  # "record"
    stream: str
    off: int


class HostWaitStream(NamedTuple):
    """``stream`` waits for ``other``'s tail (parameters: the host call's cost, the wait's
    latency): two device ops, as :class:`~simwar.core.program.WaitStream` says."""

    kind: str  # "wait_stream"
    stream: str
    other: str
    off: int

    @property
    def tail_event(self) -> str:
        return tail_event(self.other)

    @property
    def same_stream(self) -> bool:
        return self.stream == self.other


class SyncBinding(NamedTuple):
    """What a wait or a sync is bound to: record ``record`` (its index among the records of
    its segment) of the segment ``back`` segments before the binding op's."""

    back: int
    record: int


class EventBinding(NamedTuple):
    """A wait_event's binding (as :class:`SyncBinding`), and whether the record is on the
    wait's own stream (no cross-stream latency then)."""

    back: int
    record: int
    same_stream: bool


class HostWaitEvent(NamedTuple):
    """``stream`` waits for an event (parameters: the host call's cost, the latency)."""

    kind: str  # "wait_event"
    stream: str
    off: int
    bind: EventBinding | None  # None: an event never recorded (the wait holds nothing)


class HostSyncOp(NamedTuple):
    """The host blocks on an event (parameters: the host call's cost, the wake latency)."""

    kind: str  # "sync"
    off: int
    site: str  # where the host blocks (a blocked-time column of the summary)
    bind: SyncBinding | None  # None: an event never recorded (returns at once)


class HostCollectiveOp(NamedTuple):
    """A host collective of tensor-parallel ranks (parameters: its cost, the wake-up of a
    rank that waited): a lockstep over ranks only (:mod:`simwar.executors.lockstep.ranks`)."""

    kind: str  # "hcoll"
    off: int
    site: str  # its name, a blocked-time column of the rank's summary, as a sync's site


class GraphCollectiveNode(NamedTuple):
    """A collective kernel node of a graph launch (its parameter: the kernel's duration):
    a lockstep over ranks only."""

    kind: str  # "c"
    label: str
    phase: str


class HostMark(NamedTuple):
    """A named host instant of a step (one of :data:`MARKS`; no parameter)."""

    kind: str  # "run_batch" | "result_done"
    off: int


#: the record of each host-op kind
HOST_RECORDS = {"cpu": HostCpu, "launch": HostLaunch, "graph": HostGraph, "record": HostRecord,
                "wait_stream": HostWaitStream, "wait_event": HostWaitEvent, "sync": HostSyncOp,
                "hcoll": HostCollectiveOp, **{mark: HostMark for mark in MARKS}}
GRAPH_NODES = {"r": GraphRecordNode, "k": GraphKernelNode, "c": GraphCollectiveNode}
BINDINGS = {"wait_event": EventBinding, "sync": SyncBinding}


#: device ops and parameter slots of each host-op kind, in the generated code's order (a
#: graph's: one device op per node; its launch's host cost, then one slot per kernel or
#: collective node: :func:`device_ops`, :func:`param_slots`)
_DEVICE_OPS = {"cpu": 0, "launch": 1, "record": 1, "wait_stream": 2, "wait_event": 1,
               "sync": 1, "hcoll": 1, **{mark: 0 for mark in MARKS}}
_PARAM_SLOTS = {"cpu": 1, "launch": 2, "record": 1, "wait_stream": 2, "wait_event": 2,
                "sync": 2, "hcoll": 2, **{mark: 0 for mark in MARKS}}


def device_ops(h) -> int:
    """The device ops one host op makes (the columns it takes in a segment)."""
    return len(h.nodes) if h.kind == "graph" else _DEVICE_OPS[h.kind]


def param_slots(h) -> int:
    """The parameter slots one host op takes, in the generated code's order."""
    if h.kind == "graph":
        return 1 + sum(node.kind != "r" for node in h.nodes)
    return _PARAM_SLOTS[h.kind]


def host_records(host: tuple) -> tuple:
    """Plain host-op tuples (each in its record's field order) as records."""
    out = []
    for h in host:
        rec = HOST_RECORDS[h[0]]._make(h)
        if rec.kind == "graph":
            rec = rec._replace(nodes=tuple(GRAPH_NODES[n[0]]._make(n) for n in rec.nodes))
        elif rec.kind in BINDINGS and rec.bind is not None:
            rec = rec._replace(bind=BINDINGS[rec.kind]._make(rec.bind))
        out.append(rec)
    return tuple(out)


__all__ = ["BINDINGS", "GRAPH_NODES", "HOST_RECORDS", "MARKS", "EventBinding",
           "GraphCollectiveNode", "GraphKernelNode", "GraphRecordNode", "HostCollectiveOp",
           "HostCpu", "HostGraph", "HostLaunch", "HostMark", "HostRecord", "HostSyncOp",
           "HostWaitEvent", "HostWaitStream", "SyncBinding", "host_records"]
