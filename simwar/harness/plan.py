"""Program → replay plan: graph grouping, timing points, buffer and stamp layout.

The plan is everything the replay needs decided before the first host call,
so that the timed loop does no bookkeeping beyond the calls themselves:

- **buffers and stamps**: every shared buffer is one integer slot on the
  device. Every write access gets a unique stamp (1, 2, ...; 0 is the
  initial value) that the kernel writes at its start. Every read access gets
  a snapshot slot that the kernel fills at its end (after its spin) with the
  stamp it saw, and an *expected* stamp: that of the latest write to the
  buffer issued before it. A read that saw any other stamp is a measured race.
- **graph grouping**: launches sharing a ``graph`` name share one captured
  graph. A graph's kernels cannot be stamped from the host per launch, so each
  graph keeps a launch counter on the device: write nodes pick their stamp
  from a per-node array indexed by it, read nodes snapshot into a contiguous
  slot range indexed by it.
- **timing points**: timing events only where the metrics need a device
  time: before the first and after the last forward-phase launch of each step
  (a kernel or graph launch on the forward stream with a phase), which give
  the forward's start and end (``simwar.analysis.metrics``: step time, forward gap,
  launch lead and launch-ahead). Every other device time is placed by the
  CUDA rules from measured host times and nominal durations
  (``replay.assemble``), so the replay adds little host time of its own: on a
  host-paced step every host call is time the device waits for. Points are
  never shared between neighbours (each is its own event record).
- **scratch**: a kernel without shared accesses may still copy one element
  (the backend's *uniform* mode, so that every eager kernel is the same two
  launches). Each stream has its own scratch source slot (after the shared
  buffers' slots) and its own scratch snapshot slot (after the read
  snapshots): kernels on different streams never touch the same scratch
  memory, so the harness adds no unordered accesses of its own (PyTorch's
  CUDA sanitizer checks this, ``simwar.harness.csan``).

Imports: the standard library and ``simwar.core.program`` only (the plan is made
on the GPU machine, which has torch but no simpy, pydantic or pandas).
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass(frozen=True, slots=True)
class ReadSite:
    """A read access: ``slot`` in the snapshot array (first slot of a graph node's range)."""

    buffer: int
    slot: int


@dataclass(frozen=True, slots=True)
class WriteSite:
    """A write access: the stamp for an eager kernel, or a stamp-array id for a graph node."""

    buffer: int
    stamp: int


@dataclass(frozen=True, slots=True)
class KernelStep:
    """One eager kernel: op ``index`` of the program, with its stamps and timing points."""

    index: int
    stream: str
    kernel: Kernel
    step: int
    writes: tuple[WriteSite, ...]
    reads: tuple[ReadSite, ...]
    start_point: int  # -1: untimed
    end_point: int  # -1: untimed


@dataclass(frozen=True, slots=True)
class GraphNodePlan:
    """A node of a captured graph: a kernel (with per-launch stamp arrays) or a record."""

    kernel: Kernel | None
    event: str = ""
    writes: tuple[WriteSite, ...] = ()  # stamp = id of a stamp array (one entry per launch)
    reads: tuple[ReadSite, ...] = ()  # slot = first slot of a range (one slot per launch)


@dataclass(slots=True)
class GraphPlan:
    name: str
    stream: str
    nodes: tuple[GraphNodePlan, ...]
    launches: int = 0


@dataclass(frozen=True, slots=True)
class GraphStep:
    index: int
    stream: str
    graph: str
    launch: int  # 0-based launch number of this graph
    step: int
    start_point: int  # -1: untimed
    end_point: int  # -1: untimed


@dataclass(slots=True)
class ReadCheck:
    """What one read should see, for the value check after the run."""

    slot: int
    op_index: int
    node: int  # node number inside a graph, -1 for eager
    buffer: str
    step: int
    label: str
    expected: int  # stamp of the latest earlier-issued write (0: none)


@dataclass(slots=True)
class ReplayPlan:
    program: Program
    steps: list  # one entry per program op: KernelStep | GraphStep | the op itself
    graphs: dict[str, GraphPlan]
    buffers: tuple[str, ...]
    stamp_arrays: list[list[int]]  # graph write nodes: stamp per launch
    stamp_steps: dict[int, int]  # stamp -> step of the write that carries it
    stamp_labels: dict[int, str]
    reads: list[ReadCheck]
    snapshot_slots: int
    timing_points: int
    events: tuple[str, ...]  # host-recorded event names (one device event each)
    graph_events: tuple[tuple[str, str], ...]  # (graph, event) in-graph record nodes
    streams: tuple[str, ...] = field(default_factory=tuple)

    # ---- per-stream scratch layout (see the module docstring)
    def scratch_buffer(self, stream: str) -> int:
        """Index of ``stream``'s scratch source slot in the backend's buffer array."""
        return len(self.buffers) + self.streams.index(stream)

    def scratch_slot(self, stream: str) -> int:
        """Index of ``stream``'s scratch snapshot slot in the backend's snapshot array."""
        return self.snapshot_slots + self.streams.index(stream)

    @property
    def buffer_slots(self) -> int:
        """Length of the backend's buffer array: shared buffers, then one scratch per stream."""
        return len(self.buffers) + len(self.streams)

    @property
    def snap_slots(self) -> int:
        """Length of the backend's snapshot array: read snapshots, then one scratch per stream."""
        return self.snapshot_slots + len(self.streams)


def make_plan(program: Program) -> ReplayPlan:
    """Decide stamps, snapshot slots, graph grouping and timing points for ``program``."""
    buffers = tuple(sorted(program.buffers()))
    buf_index = {b: i for i, b in enumerate(buffers)}
    # launches per graph first: graph read ranges need the count
    launch_count: dict[str, int] = {}
    for op in program.ops:
        if type(op) is GraphLaunch:
            launch_count[op.graph] = launch_count.get(op.graph, 0) + 1

    next_stamp = 1
    next_slot = 0
    next_point = 0
    latest_stamp: dict[str, int] = {}
    stamp_steps: dict[int, int] = {}
    stamp_labels: dict[int, str] = {}
    stamp_arrays: list[list[int]] = []
    reads: list[ReadCheck] = []
    graphs: dict[str, GraphPlan] = {}
    events: dict[str, None] = {}
    graph_events: dict[tuple[str, str], None] = {}
    streams: dict[str, None] = {s: None for s in program.streams}
    steps: list = []

    first_fwd, last_fwd = forward_bounds(program)

    def new_point(timed: bool) -> int:
        nonlocal next_point
        if not timed:
            return -1
        next_point += 1
        return next_point - 1

    for index, op in enumerate(program.ops):
        kind = type(op)
        if kind is Launch:
            k = op.kernel
            streams.setdefault(op.stream, None)
            writes = []
            for b in k.writes:  # a kernel writes at its start
                stamp_steps[next_stamp] = op.step
                stamp_labels[next_stamp] = k.label
                latest_stamp[b] = next_stamp
                writes.append(WriteSite(buf_index[b], next_stamp))
                next_stamp += 1
            rs = []
            for b in k.reads:  # ... and reads at its end
                reads.append(ReadCheck(next_slot, index, -1, b, op.step, k.label,
                                       latest_stamp.get(b, 0)))
                rs.append(ReadSite(buf_index[b], next_slot))
                next_slot += 1
            start = new_point(index in first_fwd)
            steps.append(KernelStep(index, op.stream, k, op.step, tuple(writes), tuple(rs),
                                    start, new_point(index in last_fwd)))
        elif kind is GraphLaunch:
            streams.setdefault(op.stream, None)
            gp = graphs.get(op.graph)
            if gp is None:
                gp = graphs[op.graph] = _graph_plan(op, buf_index, launch_count[op.graph],
                                                     stamp_arrays, next_slot)
                next_slot += sum(len(n.reads) for n in gp.nodes) * launch_count[op.graph]
                for n in gp.nodes:
                    if n.kernel is None:
                        graph_events[(op.graph, n.event)] = None
            launch = gp.launches
            gp.launches += 1
            for node_no, node in enumerate(gp.nodes):
                if node.kernel is None:
                    continue
                for w in node.writes:
                    stamp_steps[next_stamp] = op.step
                    stamp_labels[next_stamp] = node.kernel.label
                    stamp_arrays[w.stamp][launch] = next_stamp
                    latest_stamp[buffers[w.buffer]] = next_stamp
                    next_stamp += 1
                for r in node.reads:
                    buf = buffers[r.buffer]
                    reads.append(ReadCheck(r.slot + launch, index, node_no, buf, op.step,
                                           node.kernel.label, latest_stamp.get(buf, 0)))
            start = new_point(index in first_fwd)
            steps.append(GraphStep(index, op.stream, op.graph, launch, op.step, start,
                                   new_point(index in last_fwd)))
        elif kind is Record:
            events.setdefault(op.event, None)
            steps.append(op)
        elif kind in (WaitEvent, WaitStream):
            if kind is WaitStream:
                streams.setdefault(op.other, None)
            steps.append(op)
        elif kind in (CpuWork, Synchronize, StepMarker, Marker):
            steps.append(op)
        else:
            raise TypeError(f"unknown host op {op!r}")
    return ReplayPlan(program=program, steps=steps, graphs=graphs, buffers=buffers,
                      stamp_arrays=stamp_arrays, stamp_steps=stamp_steps,
                      stamp_labels=stamp_labels, reads=reads, snapshot_slots=next_slot,
                      timing_points=next_point, events=tuple(events),
                      graph_events=tuple(graph_events), streams=tuple(streams))


def forward_bounds(program: Program) -> tuple[set[int], set[int]]:
    """Op indexes of the first and of the last forward-phase launch of each step.

    A forward-phase launch is what ``simwar.analysis.metrics`` counts as the forward: a
    kernel with a phase (or a graph with a phased node) on the forward stream.
    """
    fwd = program.meta.get("forward_stream", "forward")
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for index, op in enumerate(program.ops):
        kind = type(op)
        if kind is Launch:
            phased = bool(op.kernel.phase)
        elif kind is GraphLaunch:
            phased = any(type(n) is Kernel and n.phase for n in op.nodes)
        else:
            continue
        if op.stream == fwd and phased:
            first.setdefault(op.step, index)
            last[op.step] = index
    return set(first.values()), set(last.values())


def _graph_plan(op: GraphLaunch, buf_index: dict[str, int], launches: int,
                stamp_arrays: list[list[int]], first_slot: int) -> GraphPlan:
    nodes = []
    slot = first_slot
    for node in op.nodes:
        if type(node) is GraphRecord:
            nodes.append(GraphNodePlan(None, node.event))
            continue
        writes = []
        for b in node.writes:
            stamp_arrays.append([0] * launches)
            writes.append(WriteSite(buf_index[b], len(stamp_arrays) - 1))
        reads = []
        for b in node.reads:
            reads.append(ReadSite(buf_index[b], slot))
            slot += launches
        nodes.append(GraphNodePlan(node, "", tuple(writes), tuple(reads)))
    return GraphPlan(op.graph, op.stream, tuple(nodes))
