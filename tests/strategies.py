"""Hypothesis strategies for random valid Programs (import as ``from strategies import ...``).

:func:`programs` draws any valid Program: 1-5 streams (the first named ``forward``, so
the harness's timing points are exercised), kernels of random duration (zero included)
reading and writing 1-3 shared buffers, host records, CUDA graphs with kernel and
in-graph record nodes (a graph name always has the same nodes, and graphs are launched
several times), ``wait_event`` (also on events never recorded: a no-op), ``wait_stream``,
host synchronizes (also on never-recorded events), CPU work and markers, grouped into steps
by :class:`~simwar.core.program.StepMarker`. Host costs are random per op; the device latencies
(a wait's ``latency_us``, a synchronize's ``wake_us``) are random per op too.

:func:`ordered_programs` builds programs constructively: it draws kernels with shared
accesses, and before each one inserts a synchronization (a ``wait_event`` on the record
that follows each earlier kernel, a ``wait_stream`` or a host synchronize) for every
earlier conflicting access on another stream that is not already ordered before it, so
the program has no latent race. It returns the inserted ``wait_event`` links with the
access pair each was inserted for.

Values are drawn from small sets (ties are where executors disagree) or as floats.
"""

from __future__ import annotations

from hypothesis import strategies as st

from simwar.core.program import (
    CpuWork,
    GraphLaunch,
    GraphRecord,
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

STREAM_NAMES = ("forward", "s1", "s2", "s3", "s4")
BUFFER_NAMES = ("b0", "b1", "b2")
EVENTS = ("e0", "e1", "e2", "e3")  # e3 is never host-recorded; graphs may record any
GRAPHS = ("g0", "g1")
PHASES = ("", "", "p")

#: durations and costs: small exact values (ties, zero) or any float in a range
durations = st.one_of(st.sampled_from([0.0, 0.0, 1.0, 2.5, 4.0, 10.0, 30.0]),
                      st.floats(0, 60, allow_nan=False, allow_infinity=False))
host_costs = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0, 6.0]),
                       st.floats(0, 8, allow_nan=False, allow_infinity=False))
latencies = st.one_of(st.sampled_from([0.0, 1.5, 3.0]),
                      st.floats(0, 5, allow_nan=False, allow_infinity=False))

OP_KINDS = ("launch", "launch", "launch", "graph", "record", "record", "wait", "wait",
            "wait_stream", "sync", "cpu", "step", "marker")


def _accesses(draw, buffers):
    sub = st.lists(st.sampled_from(buffers), max_size=min(2, len(buffers)), unique=True)
    return tuple(draw(sub)), tuple(draw(sub))


def _graph_nodes(draw, name, buffers):
    nodes = []
    events = list(EVENTS)
    for j in range(draw(st.integers(1, 3))):
        if events and draw(st.integers(0, 3)) == 0:
            ev = draw(st.sampled_from(events))
            events.remove(ev)  # one record node per event in a graph
            nodes.append(GraphRecord(ev))
        else:
            reads, writes = _accesses(draw, buffers)
            nodes.append(Kernel(f"{name}.n{j}", draw(durations), reads, writes,
                                draw(st.sampled_from(PHASES))))
    return tuple(nodes)


@st.composite
def programs(draw, max_ops: int = 30, max_steps: int = 4, graphs: bool = True):
    """Any valid Program (``graphs=False``: no graph launches, all kernels eager)."""
    kinds = OP_KINDS if graphs else tuple(k for k in OP_KINDS if k != "graph")
    streams = STREAM_NAMES[:draw(st.integers(1, len(STREAM_NAMES)))]
    buffers = BUFFER_NAMES[:draw(st.integers(1, len(BUFFER_NAMES)))]
    captured: dict[str, tuple] = {}
    step = 0
    ops: list = [StepMarker(0)]
    for i in range(draw(st.integers(1, max_ops))):
        kind = draw(st.sampled_from(kinds))
        s = draw(st.sampled_from(streams))
        if kind == "launch":
            reads, writes = _accesses(draw, buffers)
            k = Kernel(f"k{i}", draw(durations), reads, writes, draw(st.sampled_from(PHASES)))
            ops.append(Launch(s, k, step, draw(host_costs)))
        elif kind == "graph":
            g = draw(st.sampled_from(GRAPHS))
            if g not in captured:
                captured[g] = _graph_nodes(draw, g, buffers)
            ops.append(GraphLaunch(s, g, captured[g], step, draw(st.sampled_from(PHASES)),
                                   draw(host_costs)))
        elif kind == "record":
            ops.append(Record(draw(st.sampled_from(EVENTS[:-1])), s, step, draw(host_costs)))
        elif kind == "wait":
            ops.append(WaitEvent(s, draw(st.sampled_from(EVENTS)), step, draw(host_costs),
                                 draw(latencies)))
        elif kind == "wait_stream":
            ops.append(WaitStream(s, draw(st.sampled_from(streams)), step, draw(host_costs),
                                  draw(latencies)))
        elif kind == "sync":
            ops.append(Synchronize(draw(st.sampled_from(EVENTS)), step, "site",
                                   draw(host_costs), draw(latencies)))
        elif kind == "cpu":
            ops.append(CpuWork(f"cpu{i}", draw(durations), step))
        elif kind == "step" and step + 1 < max_steps:
            step += 1
            ops.append(StepMarker(step))
        elif kind == "marker":
            ops.append(Marker("run_batch", step))
    return Program(ops, streams=streams, meta={"warmup_steps": 0})


# --------------------------------------------------------------------------- ordered programs
class _Clocks:
    """Happens-before as vector clocks (one component per stream and the host)."""

    def __init__(self, lanes):
        self.index = {lane: i for i, lane in enumerate(lanes)}
        self.n = len(lanes)
        self.lane = {lane: [0] * self.n for lane in lanes}
        self.host = [0] * self.n  # what the host has synchronized with
        self.records: dict[str, list[int]] = {}

    @staticmethod
    def _join(*vs):
        return [max(x) for x in zip(*vs)]

    def op(self, lane: str, also=None) -> list[int]:
        """A stream operation on ``lane`` (joined with ``also``, a record's clock)."""
        v = self._join(self.lane[lane], self.host, *([also] if also else []))
        v[self.index[lane]] += 1
        self.lane[lane] = v
        return v

    def record(self, event: str, lane: str) -> None:
        self.records[event] = self.op(lane)

    def sync(self, event: str) -> None:
        self.host = self._join(self.host, self.records[event])

    def ordered(self, clock: list[int], lane_of_clock: str, lane: str) -> bool:
        """Does the operation with ``clock`` (on ``lane_of_clock``) happen before the next
        operation issued on ``lane``?"""
        i = self.index[lane_of_clock]
        return clock[i] <= max(self.lane[lane][i], self.host[i])


@st.composite
def ordered_programs(draw, max_kernels: int = 10, max_steps: int = 3):
    """(program, links): a program with no latent race, and its inserted ``wait_event``
    links as ``(op index, (buffer, first kernel label, second kernel label))``."""
    streams = STREAM_NAMES[:draw(st.integers(2, len(STREAM_NAMES)))]
    buffers = BUFFER_NAMES[:draw(st.integers(1, len(BUFFER_NAMES)))]
    clocks = _Clocks(streams)
    ops: list = [StepMarker(0)]
    step = 0
    done: list[tuple] = []  # (label, lane, reads, writes, clock, event)
    links: list[tuple[int, tuple[str, str, str]]] = []
    for i in range(draw(st.integers(2, max_kernels))):
        if step + 1 < max_steps and draw(st.integers(0, 3)) == 0:
            step += 1
            ops.append(StepMarker(step))
        if draw(st.integers(0, 3)) == 0:
            ops.append(CpuWork(f"cpu{i}", draw(durations), step))
        s = draw(st.sampled_from(streams))
        reads, writes = _accesses(draw, buffers)
        label = f"k{i}"
        for (j_label, j_lane, j_reads, j_writes, j_clock, j_event) in done:
            if j_lane == s:
                continue
            conflict = sorted((set(j_writes) & (set(reads) | set(writes)))
                              | (set(j_reads) & set(writes)))
            if not conflict or clocks.ordered(j_clock, j_lane, s):
                continue
            how = draw(st.sampled_from(["wait_event", "wait_event", "wait_stream", "sync"]))
            if how == "wait_event":
                links.append((len(ops), (conflict[0], j_label, label)))
                ops.append(WaitEvent(s, j_event, step, draw(host_costs), draw(latencies)))
                clocks.op(s, clocks.records[j_event])
            elif how == "wait_stream":
                ops.append(WaitStream(s, j_lane, step, draw(host_costs), draw(latencies)))
                tail = clocks.op(j_lane)
                clocks.op(s, tail)
            else:
                ops.append(Synchronize(j_event, step, "site", draw(host_costs),
                                       draw(latencies)))
                clocks.sync(j_event)
        ops.append(Launch(s, Kernel(label, draw(durations), reads, writes), step,
                          draw(host_costs)))
        clock = clocks.op(s)
        event = f"after_{label}"
        ops.append(Record(event, s, step, draw(host_costs)))
        clocks.record(event, s)
        done.append((label, s, reads, writes, clock, event))
    return Program(ops, streams=streams, meta={"warmup_steps": 0}), links
