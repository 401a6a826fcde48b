"""Random valid Programs for the tests: one Hypothesis strategy, :func:`programs`.

Every executor is held to these programs: the SimPy engine, the fast executor, the
fake-backend replay of the GPU harness, the race detector and CSAN's handler. A program
draws 1-5 streams (the first named ``forward``, so the harness's timing points and the
metrics' forward are exercised) and 1-3 shared buffers, then up to ``max_ops`` operations
in ``max_steps`` steps: kernels of random duration (zero included) reading and writing up
to two buffers each, host records, CUDA graphs with kernel and in-graph record nodes
(launched several times), ``wait_event`` (also on an event never recorded: a no-op),
``wait_stream``, host synchronizes (also on never-recorded events) at the metrics' sites
and others, CPU work, ``run_batch`` markers and step markers. Host costs, a wait's
``latency_us`` and a synchronize's ``wake_us`` are random per op; ``meta`` has a random
warm-up. Values are drawn from small sets (ties are where executors disagree) or as floats.

The variants, by parameter:

- ``max_steps=1``: a single step (the step draws do nothing);
- ``graphs=False``: no graph launches, every kernel eager;
- ``irregular``: also what only a hand-made program does, which the SimPy engine and the
  fast executor must still get right: ops labelled with a neighbouring step, step
  markers skipped or off by one or more, a record before the first marker, and a graph
  name relaunched with other nodes (whose record nodes may repeat an event). The harness
  cannot replay the last (it captures a graph once, from its first launch);
- ``ordered``: no latent race at any step distance, by construction. Before each kernel
  a synchronization is inserted (a ``wait_event`` on the record that follows each earlier
  kernel, a ``wait_stream`` or a host synchronize) for every earlier conflicting access on
  another stream that is not already ordered before it; :func:`ordering_links` lists the
  inserted ``wait_event`` links. Ordered programs have 2-5 streams, mostly kernels, and
  no graphs (``graphs=False``: a graph's node labels repeat, and links name kernels).

Imports: hypothesis and ``simwar.core.program`` only.
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

STREAM_NAMES = ("forward", "schedule", "copy", "s3", "s4")
BUFFER_NAMES = ("b0", "b1", "b2")
EVENTS = ("e0", "e1", "e2", "e3")  # e3 is never host-recorded; graphs may record any
GRAPHS = ("g0", "g1")
PHASES = ("", "p1", "p2")
#: the metrics' blocked-time sites, and one they do not know
SITES = ("result_copy", "verify_done", "seq_lens", "barrier", "other")
#: the event an ordered program records after kernel ``k3`` is ``after_k3``
AFTER = "after_"

#: durations and costs: small exact values (ties, zero) or any float in a range
durations = st.one_of(st.sampled_from([0.0, 0.0, 1.0, 2.5, 4.0, 10.0, 30.0, 100.0]),
                      st.floats(0, 200, allow_nan=False, allow_infinity=False))
host_costs = st.one_of(st.sampled_from([0.0, 0.5, 1.0, 2.0, 6.0]),
                       st.floats(0, 10, allow_nan=False, allow_infinity=False))
latencies = st.one_of(st.sampled_from([0.0, 1.5, 3.0]),
                      st.floats(0, 10, allow_nan=False, allow_infinity=False))

OP_KINDS = ("launch", "launch", "launch", "graph", "record", "record", "wait", "wait",
            "wait_stream", "sync", "cpu", "step", "marker")
#: an ordered program's links come from its kernels' conflicts: mostly kernels, and fewer
#: of the waits and syncs that would order them anyway
ORDERED_KINDS = ("launch",) * 8 + ("record", "wait", "wait_stream", "sync", "cpu", "step",
                                   "marker")


def _kernel(draw, label: str, buffers: tuple[str, ...]) -> Kernel:
    sub = st.lists(st.sampled_from(buffers), max_size=min(2, len(buffers)), unique=True)
    return Kernel(label, draw(durations), tuple(draw(sub)), tuple(draw(sub)),
                  draw(st.sampled_from(PHASES)))


def _graph_nodes(draw, label: str, buffers: tuple[str, ...], repeat_events: bool) -> tuple:
    nodes = []
    events = list(EVENTS)
    for j in range(draw(st.integers(1, 3))):
        if events and draw(st.integers(0, 3)) == 0:
            ev = draw(st.sampled_from(events))
            if not repeat_events:  # one record node per event in a captured graph
                events.remove(ev)
            nodes.append(GraphRecord(ev))
        else:
            nodes.append(_kernel(draw, f"{label}.n{j}", buffers))
    return tuple(nodes)


def _marker(draw, step: int, irregular: bool) -> int:
    if irregular and draw(st.integers(0, 9)) == 0:
        return step + draw(st.sampled_from([-1, 1, 3]))
    return step


@st.composite
def programs(draw, max_ops: int = 30, max_steps: int = 4, graphs: bool = True,
             irregular: bool = False, ordered: bool = False) -> Program:
    """A valid Program of 1 to ``max_ops`` drawn operations (step markers included) in at
    most ``max_steps`` steps; the variants are in the module docstring."""
    if ordered and graphs:
        raise ValueError("ordered programs have no graphs: pass graphs=False")
    if ordered:
        kinds = ORDERED_KINDS
    else:
        kinds = OP_KINDS if graphs else tuple(k for k in OP_KINDS if k != "graph")
    streams = STREAM_NAMES[:draw(st.integers(2 if ordered else 1, len(STREAM_NAMES)))]
    buffers = BUFFER_NAMES[:draw(st.integers(1, len(BUFFER_NAMES)))]
    clocks = _Clocks(streams) if ordered else None
    captured: dict[str, tuple] = {}
    done: list[tuple] = []  # ordered: (label, lane, reads, writes, clock) of each kernel
    ops: list = []
    step = 0

    def issue(op) -> None:
        ops.append(op)
        if clocks is not None:
            clocks.issue(op)

    stream = st.sampled_from(streams)
    event = st.sampled_from(EVENTS)
    host_recorded = st.sampled_from(EVENTS[:-1])
    if irregular and draw(st.integers(0, 4)) == 0:  # a record before the first marker
        issue(Record(draw(host_recorded), draw(stream), 0))
    ops.append(StepMarker(_marker(draw, 0, irregular)))
    for i in range(draw(st.integers(1, max_ops))):
        kind = draw(st.sampled_from(kinds))
        at = step  # the step the op is labelled with
        if irregular and draw(st.integers(0, 19)) == 0:
            at = step + draw(st.sampled_from([-1, 1]))
        if kind == "launch":
            s = draw(stream)
            k = _kernel(draw, f"k{i}", buffers)
            if clocks is not None:
                _order_before(draw, clocks, done, issue, s, k, at)
            issue(Launch(s, k, at, draw(host_costs)))
            if clocks is not None:
                done.append((k.label, s, k.reads, k.writes, clocks.lane[s]))
                issue(Record(AFTER + k.label, s, at, draw(host_costs)))
        elif kind == "graph":
            g = draw(st.sampled_from(GRAPHS))
            if irregular:  # each launch its own nodes
                nodes = _graph_nodes(draw, f"{g}.{i}", buffers, repeat_events=True)
            else:
                if g not in captured:
                    captured[g] = _graph_nodes(draw, g, buffers, repeat_events=False)
                nodes = captured[g]
            issue(GraphLaunch(draw(stream), g, nodes, at, draw(st.sampled_from(PHASES)),
                              draw(host_costs)))
        elif kind == "record":
            issue(Record(draw(host_recorded), draw(stream), at, draw(host_costs)))
        elif kind == "wait":
            issue(WaitEvent(draw(stream), draw(event), at, draw(host_costs), draw(latencies)))
        elif kind == "wait_stream":
            issue(WaitStream(draw(stream), draw(stream), at, draw(host_costs), draw(latencies)))
        elif kind == "sync":
            issue(Synchronize(draw(event), at, draw(st.sampled_from(SITES)), draw(host_costs),
                              draw(latencies)))
        elif kind == "cpu":
            issue(CpuWork("cpu", draw(durations), at))
        elif kind == "step" and step + 1 < max_steps:
            step += 1
            if not (irregular and draw(st.integers(0, 14)) == 0):  # irregular: no marker
                ops.append(StepMarker(_marker(draw, step, irregular)))
        elif kind == "marker":
            issue(Marker("run_batch", at))
    meta = {"warmup_steps": draw(st.integers(0, 2)), "forward_stream": "forward",
            "accept_tokens": 2.0, "batch_size": 4, "name": "random"}
    return Program(ops, streams=streams, meta=meta)


def ordering_links(program: Program) -> list[tuple[int, str, str]]:
    """The ``wait_event`` links an ordered program got, as ``(op index, first kernel label,
    second kernel label)``: the wait at that index orders the second kernel after the first.

    A link waits on the record after the first kernel (``AFTER`` + its label) and comes
    right before the second kernel's launch (with the other synchronizations for it)."""
    links = []
    for index, op in enumerate(program.ops):
        if type(op) is WaitEvent and op.event.startswith(AFTER):
            second = next(o.kernel.label for o in program.ops[index + 1:] if type(o) is Launch)
            links.append((index, op.event.removeprefix(AFTER), second))
    return links


# --------------------------------------------------------------------------- ordered programs
def _order_before(draw, clocks: _Clocks, done: list[tuple], issue, stream: str,
                  kernel: Kernel, step: int) -> None:
    """Issue a synchronization for each earlier kernel whose accesses conflict with
    ``kernel``'s and that is not yet ordered before the next operation on ``stream``."""
    for (label, lane, reads, writes, clock) in done:
        if lane == stream:
            continue
        conflict = ((set(writes) & (set(kernel.reads) | set(kernel.writes)))
                    | (set(reads) & set(kernel.writes)))
        if not conflict or clocks.ordered(clock, lane, stream):
            continue
        how = draw(st.sampled_from(["wait_event", "wait_event", "wait_stream", "sync"]))
        if how == "wait_event":
            issue(WaitEvent(stream, AFTER + label, step, draw(host_costs), draw(latencies)))
        elif how == "wait_stream":
            issue(WaitStream(stream, lane, step, draw(host_costs), draw(latencies)))
        else:
            issue(Synchronize(AFTER + label, step, "barrier", draw(host_costs),
                              draw(latencies)))


class _Clocks:
    """Happens-before as vector clocks (one component per stream and the host), updated
    by each host operation as the CUDA rules order it (docs/design.md)."""

    def __init__(self, lanes):
        self.index = {lane: i for i, lane in enumerate(lanes)}
        self.lane = {lane: [0] * len(lanes) for lane in lanes}
        self.host = [0] * len(lanes)  # what the host has synchronized with
        self.records: dict[str, list[int]] = {}  # event -> clock of its latest record

    def _op(self, lane: str, also=None) -> list[int]:
        """A stream operation on ``lane`` (after ``also``, a record's clock, if given)."""
        v = [max(x) for x in zip(self.lane[lane], self.host, also or self.host)]
        v[self.index[lane]] += 1
        self.lane[lane] = v
        return v

    def issue(self, op) -> None:
        kind = type(op)
        if kind is Launch:
            self._op(op.stream)
        elif kind is Record:
            self.records[op.event] = self._op(op.stream)
        elif kind is WaitEvent:  # a wait on a never-recorded event is a no-op
            self._op(op.stream, self.records.get(op.event))
        elif kind is WaitStream:  # a fresh record on the other stream, then a wait
            self._op(op.stream, self._op(op.other))
        elif kind is Synchronize and op.event in self.records:
            self.host = [max(x) for x in zip(self.host, self.records[op.event])]

    def ordered(self, clock: list[int], lane_of_clock: str, lane: str) -> bool:
        """Does the operation with ``clock`` (on ``lane_of_clock``) happen before the next
        operation issued on ``lane``?"""
        i = self.index[lane_of_clock]
        return clock[i] <= max(self.lane[lane][i], self.host[i])
