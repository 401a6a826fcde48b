"""Shapes and blocks: a program, or a config's run, cut into iteration shapes and their numbers.

- :class:`DeviceOp`, :class:`Shape`: the structure of one *segment* (the host ops from one step
  marker to the next: one scheduler iteration), hashable, with each wait's and sync's binding
  resolved as "record ``i`` of the segment ``d`` back"; ``_Shaper`` makes them from host ops,
  in program order, and ``_segments`` cuts a program at its step markers.
- :class:`Block`, :class:`Plan`: consecutive segments of one shape with their parameters
  (durations, host costs, latencies: a constant or one column per parameter slot); a plan is
  the whole run as a few blocks.
- :func:`plan_program` (any :class:`~simwar.core.program.Program`, parameters taken from its
  ops) and :func:`plan_config` (a config's run from the builder's first iterations, never
  materialized as a Program).

The package docstring (:mod:`simwar.executors.fast`) says why a run is a few blocks.

Imports: simwar.core; :mod:`simwar.builder.loop` only inside :func:`plan_config` (lazily, see
there). Must not import the executor's other parts (codegen, execute, races): they build on
this one.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simwar.builder.draws import Sum, Use
from simwar.builder.loop import plan_iterations
from simwar.core.frozen import MutableRecord
from simwar.core.kinds import Mode, OpKind
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
from simwar.core.refusals import PlanRefused
from simwar.executors.fast.records import (  # noqa: F401 (the plan's records, re-exported)
    BINDINGS,
    GRAPH_NODES,
    HOST_RECORDS,
    MARKS,
    EventBinding,
    GraphKernelNode,
    GraphRecordNode,
    HostCpu,
    HostGraph,
    HostLaunch,
    HostMark,
    HostRecord,
    HostSyncOp,
    HostWaitEvent,
    HostWaitStream,
    SyncBinding,
    host_records,
)


class RanksOnly(PlanRefused):
    """A tensor-parallel collective (a host collective, or a collective kernel of a graph):
    the fast executor's plans run one rank; its ranks run in :mod:`simwar.executors.fast.ranks`
    (the choice table refuses tensor-parallel configs before planning, so this is what a
    Program built by hand meets)."""


class Unsettled(PlanRefused):
    """A config's iterations do not settle into one shape from the third on, so its run
    cannot be planned from its first iterations: plan it from its Program instead."""


class DeviceOp(MutableRecord):
    """One device-visible op of a shape, in issue order (its op id is base + index)."""

    _fields = ("kind", "lane", "off", "label", "phase", "accesses", "bind", "bound_op", "coll")

    def __init__(self, kind: int, lane: str, off: int, label: str = "", phase: str = "",
                 accesses: tuple = (), bind: SyncBinding | None = None,
                 bound_op: int | None = None, coll: str = ""):
        self.kind = kind  # OpKind
        self.lane = lane
        self.off = off  # step offset from the segment's step
        self.label = label
        self.phase = phase
        self.accesses = accesses  # ((buffer, Mode), ...) in the engine's order: reads, writes
        self.bind = bind  # waits and syncs (None: bound to nothing)
        self.bound_op = bound_op  # a wait_stream's wait: the device op index of its record
        #: a collective's (tensor-parallel ranks): "host" (a host collective, the sync op the
        #: engine records for it) or "device" (a collective kernel); "" for every other op
        self.coll = coll


class Shape:
    """The structure of one segment, hashable; ``params`` slots are filled per segment.

    ``host`` lists the host operations as tuples (see :meth:`_Shaper.segment`); ``ops`` the
    device ops they issue; ``records`` maps a record index to its device op index.
    """

    __slots__ = ("host", "ops", "records", "nparams", "_hash")

    def __init__(self, host: tuple, ops: list[DeviceOp], records: list[int], nparams: int):
        self.host = host
        self.ops = ops
        self.records = records
        self.nparams = nparams
        self._hash = hash(host)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, Shape) and self.host == other.host


def _accesses(k) -> tuple:
    return tuple((b, Mode.READ) for b in k.reads) + tuple((b, Mode.WRITE) for b in k.writes)


class _Shaper:
    """Turns segments (lists of host ops) into shapes and parameter lists, in program order.

    Bindings are resolved across segments as the engine resolves them at the host call:
    a wait or sync binds to the most recent record of its event issued before it.

    A segment's host tuple (its structure) and parameters are read in one pass; its device
    ops are built only for a structure not seen before (shapes are kept by host tuple), so
    a program of many alike iterations costs little more than reading its ops. For the same
    reason each host op is read into a plain tuple in its record's field order
    (:data:`HOST_RECORDS`; a NamedTuple costs several times a tuple to make, per op of the
    program): equal to, and hashed as, the records a new shape is then made of
    (:func:`host_records`).
    """

    def __init__(self, symbolic: bool = False, ranks: bool = False) -> None:
        # symbolic: parameters may be draws and references to config keys (plan_template),
        # which must never be compared (a traced reference records the comparison)
        self.symbolic = symbolic
        # ranks: collectives are shaped (a lockstep over tensor-parallel ranks), not refused
        self.ranks = ranks
        self.latest: dict[str, tuple[int, int, str]] = {}  # event -> (segment, record, lane)
        self.negative = False  # a negative number was seen (the overlap shortcut needs >= 0)
        self.offsets: set[int] = set()  # step offsets of accesses
        self.shapes: dict[tuple, Shape] = {}
        self._acc: dict[tuple, tuple] = {}  # (reads, writes) -> accesses

    def _access(self, k) -> tuple:
        key = (k.reads, k.writes)
        acc = self._acc.get(key)
        if acc is None:
            acc = self._acc[key] = _accesses(k)
        return acc

    def segment(self, g: int, base: int, ops) -> tuple[Shape, list]:
        host: list[tuple] = []
        params: list = []
        latest = self.latest
        nrec = 0  # records of this segment so far
        add, num = host.append, params.append
        access = self._access
        offsets = self.offsets
        for op in ops:
            kind = type(op)
            if kind is CpuWork:
                add(("cpu",))
                num(op.duration_us)
            elif kind is Launch:
                k = op.kernel
                off = op.step - base
                acc = access(k)
                add(("launch", op.stream, off, k.label, k.phase, acc))
                num(op.host_us)
                num(k.duration_us)
                if acc:
                    offsets.add(off)
            elif kind is GraphLaunch:
                off = op.step - base
                nodes = []
                num(op.host_us)
                stream = op.stream
                for node in op.nodes:
                    if type(node) is GraphRecord:
                        nodes.append(("r",))
                        latest[node.event] = (g, nrec, stream)
                        nrec += 1
                    elif type(node) is Collective:
                        if self.ranks:  # a lockstep over ranks (executors/lockstep/ranks.py)
                            nodes.append(("c", node.label, node.phase))
                            num(node.duration_us)
                            continue
                        raise RanksOnly(f"a Collective node ({node.label}) of graph {op.graph}: "
                                        f"the fast executor's plans run one rank")
                    else:
                        acc = access(node)
                        nodes.append(("k", node.label, node.phase, acc))
                        num(node.duration_us)
                        if acc:
                            offsets.add(off)
                add(("graph", stream, off, tuple(nodes)))
            elif kind is Record:
                off = op.step - base
                add(("record", op.stream, off))
                num(op.host_us)
                latest[op.event] = (g, nrec, op.stream)
                nrec += 1
            elif kind is WaitStream:
                add(("wait_stream", op.stream, op.other, op.step - base))
                num(op.host_us)
                num(op.latency_us)
            elif kind is WaitEvent:
                b = latest.get(op.event)
                add(("wait_event", op.stream, op.step - base,
                     None if b is None else (g - b[0], b[1], b[2] == op.stream)))
                num(op.host_us)
                num(op.latency_us)
            elif kind is Synchronize:
                b = latest.get(op.event)
                add(("sync", op.step - base, op.site, None if b is None else (g - b[0], b[1])))
                num(op.host_us)
                num(op.wake_us)
            elif kind is Marker:
                if op.name in MARKS:
                    add((op.name, op.step - base))
            elif kind is StepMarker:
                pass
            elif kind is HostCollective:
                if self.ranks:  # its site: its name, as the engine records it
                    add(("hcoll", op.step - base, op.name))
                    num(op.cost_us)
                    num(op.wake_us)
                    continue
                raise RanksOnly(f"a HostCollective ({op.name}): the fast executor's plans run "
                                f"one rank")
            else:
                raise TypeError(f"unknown host op {op!r}")
        if not self.negative:
            if self.symbolic:  # only numbers count
                self.negative = any(isinstance(x, (int, float)) and x < 0 for x in params)
            else:  # a Program's: numbers only, compared in C
                self.negative = min(params, default=0) < 0
        key = tuple(host)  # equal to, and hashed as, the shape's records
        shape = self.shapes.get(key)
        if shape is None:
            named = host_records(key)
            dev, records = _devices(named, ops)
            shape = self.shapes[key] = Shape(named, dev, records, len(params))
        return shape, params


def _devices(host: tuple, ops) -> tuple[list[DeviceOp], list[int]]:
    """The device ops a segment's host ops issue (in issue order), and which are records."""
    dev: list[DeviceOp] = []
    records: list[int] = []
    it = iter(host)
    for op in ops:
        kind = type(op)
        if kind is StepMarker or (kind is Marker and op.name not in MARKS):
            continue
        h = next(it)
        if kind is Launch:
            k = op.kernel
            dev.append(DeviceOp(OpKind.KERNEL, op.stream, h.off, k.label, k.phase, h.accesses))
        elif kind is GraphLaunch:
            for node, n in zip(op.nodes, h.nodes):
                if n.kind == "r":
                    records.append(len(dev))
                    dev.append(DeviceOp(OpKind.RECORD, op.stream, h.off, node.event))
                elif n.kind == "c":  # a collective kernel: the engine's op, no accesses
                    dev.append(DeviceOp(OpKind.KERNEL, op.stream, h.off, node.label,
                                        node.phase, coll="device"))
                else:
                    dev.append(DeviceOp(OpKind.KERNEL, op.stream, h.off, node.label,
                                        node.phase, n.accesses))
        elif kind is Record:
            records.append(len(dev))
            dev.append(DeviceOp(OpKind.RECORD, op.stream, h.off, op.event))
        elif kind is WaitStream:
            # the two device ops of WaitStream's rule: the record, then the wait bound to it
            dev.append(DeviceOp(OpKind.RECORD, h.other, h.off, h.tail_event))
            dev.append(DeviceOp(OpKind.WAIT, h.stream, h.off, h.tail_event,
                                bound_op=len(dev) - 1))
        elif kind is WaitEvent:
            bind = h.bind
            dev.append(DeviceOp(OpKind.WAIT, op.stream, h.off, op.event,
                                bind=None if bind is None else SyncBinding(bind.back, bind.record)))
        elif kind is Synchronize:
            dev.append(DeviceOp(OpKind.SYNC, "cpu", h.off, op.event, bind=h.bind))
        elif kind is HostCollective:  # the engine records it as a sync op bound to nothing
            dev.append(DeviceOp(OpKind.SYNC, "cpu", h.off, op.name, coll="host"))
    return dev, records


def _segments(ops) -> list[tuple[int | None, list]]:
    """Cut host ops at step markers: ``(step or None for a prefix, ops)``."""
    out: list[tuple[int | None, list]] = []
    cur: list = []
    step = None
    for op in ops:
        if type(op) is StepMarker:
            if cur or step is not None:
                out.append((step, cur))
            cur, step = [op], op.step
        else:
            cur.append(op)
    if cur or step is not None:
        out.append((step, cur))
    return out


# =========================================================================== plans
class Block(MutableRecord):
    """Consecutive segments of one shape: ``steps`` (their marker steps), parameters."""

    _fields = ("shape", "g0", "steps", "consts", "columns", "marked", "source")

    def __init__(self, shape: Shape, g0: int, steps: range | list, consts: tuple,
                 columns: object, marked: bool = True, source: int = 0):
        self.shape = shape
        self.g0 = g0  # first segment index
        self.steps = steps  # marker step of each segment (0 for a prefix)
        self.consts = consts  # per parameter slot: a number, or None for a column
        self.columns = columns  # callable(start, stop) -> list of column lists, in slot order
        self.marked = marked  # False: a prefix before the first step marker
        #: the host ops its segments were shaped from: an index into ``Plan.skeleton`` (a
        #: config's plan: the iteration standing for every segment of the block; a Program's:
        #: the block's first segment, the others following it)
        self.source = source

    @property
    def n(self) -> int:
        return len(self.steps)


class Plan(MutableRecord):
    """A program as blocks of shapes, ready for
    :func:`simwar.executors.fast.execute.run_plan`."""

    _fields = ("blocks", "meta", "lo", "hi", "negative", "offsets", "sites", "table",
               "skeleton", "skeleton_steps", "skeleton_shapes", "sizes", "bound")

    def __init__(self, blocks: list[Block], meta: dict, lo: int, hi: int,
                 negative: bool = False, offsets: set | None = None, sites: set | None = None,
                 table: object = None, skeleton: list | None = None,
                 skeleton_steps: list | None = None, skeleton_shapes: list | None = None,
                 sizes: object = None, bound: tuple | None = None):
        self.blocks = blocks
        self.meta = meta
        self.lo = lo  # smallest step
        self.hi = hi  # largest step
        self.negative = negative
        self.offsets = set() if offsets is None else offsets
        self.sites = set() if sites is None else sites
        self.table = table  # a config's AffineTable (per-use values of varying durations)
        #: the host ops behind the shapes (names, for the trace mode): per segment for a
        #: Program's plan, per skeleton iteration for a config's (``skeleton_steps``: the step
        #: each was built at; None for a Program's, whose segments are their own)
        self.skeleton = [] if skeleton is None else skeleton
        self.skeleton_steps = skeleton_steps
        self.skeleton_shapes = skeleton_shapes  # a config's: each skeleton iteration's shape
        self.sizes = sizes  # a config's per-step sizes (graph buckets name graph launches)
        #: a plan bound with others at once (:func:`simwar.api.simulate_many`): ``(together,
        #: n)``, the plan of all of them (each constant an array of one element per run, or a
        #: number they share) and this run's element; the lockstep pass takes the arrays as
        #: they are rather than stacking each run's numbers again
        self.bound = bound

    @property
    def depth(self) -> int:
        """How many segments back a wait or sync binds at most: the segments of record times
        an executor keeps (0: every binding stays within its segment)."""
        depth = 0
        for b in self.blocks:
            for h in b.shape.host:
                if h.kind in ("wait_event", "sync") and h.bind is not None:
                    depth = max(depth, h.bind.back)
        return depth

    @property
    def segments(self) -> int:
        return sum(b.n for b in self.blocks)


def _list_columns(rows: list[list], consts: tuple):
    cols = [j for j, c in enumerate(consts) if c is None]

    def columns(start: int, stop: int) -> list[list]:
        return [[r[j] for r in rows[start:stop]] for j in cols]

    return columns


def shape_segment(skeleton: list[list]) -> tuple[Shape, list, set]:
    """The shape and parameters of the last of ``skeleton``'s segments (host ops of
    consecutive iterations, parameters symbolic), its bindings resolved against the ones
    before it, and the step offsets of its accesses."""
    shaper = _Shaper(symbolic=True)
    for g, ops in enumerate(skeleton[:-1]):
        shaper.segment(g, g, ops)
    shaper.offsets = set()
    g = len(skeleton) - 1
    shape, params = shaper.segment(g, g, skeleton[-1])
    return shape, params, shaper.offsets


def plan_segments(shapes: list[Shape], fixed: list[tuple], rows: list[list], meta: dict,
                  offsets: set) -> Plan:
    """The plan of consecutive segments at steps 0, 1, ... (the last one the drain): per
    segment its shape, its parameters that are the same in every segment of its kind
    (``fixed``: a number per slot, None where it is drawn: segments of one kind share the
    tuple itself) and the drawn ones (``rows``: numbers, in slot order). Each run of
    segments of one kind is a block."""
    blocks: list[Block] = []
    g = 0
    n = len(shapes)
    kinds: dict = {}  # id -> the kind, once per kind (a run has a few, in a block or two a step)
    while g < n:
        h = g + 1
        kind = fixed[g]
        while h < n and fixed[h] is kind:
            h += 1
        kinds[id(kind)] = kind
        part = rows[g:h]
        columns = _list_columns(part, (None,) * len(part[0]))
        blocks.append(Block(shapes[g], g, range(g, h), kind, columns, True, g))
        g = h
    negative = any(x is not None and x < 0 for kind in kinds.values() for x in kind) or \
        min((min(r) for r in rows if r), default=0) < 0
    distinct = list({id(sh): sh for sh in shapes}.values())
    return Plan(blocks, dict(meta), 0, max(0, n - 1), negative, offsets, _sites(distinct))


def plan_program(program: Program, ranks: bool = False) -> Plan:
    """Shapes and blocks of any Program (parameters taken from its ops); ``ranks``: a
    tensor-parallel rank's, its collectives shaped (for :mod:`simwar.executors.lockstep.ranks`)
    rather than refused."""
    planner = SegmentPlanner(ranks)
    for step, ops in _segments(program.ops):
        planner.add(step, ops)
    return planner.plan(program.meta)


class SegmentPlanner:
    """A Program's plan made segment by segment, as its host ops come: :meth:`add` shapes
    one segment (its bindings resolved against the segments before it, as the engine
    resolves them), :meth:`plan` groups them into blocks (:func:`plan_program` cuts a whole
    Program into them)."""

    def __init__(self, ranks: bool = False) -> None:
        self.shaper = _Shaper(ranks=ranks)
        self.segs: list[tuple[int | None, list]] = []
        self.shapes: list[Shape] = []
        self.params: list[list] = []
        self.ops = 0  # host ops seen
        self.lo: int | None = None  # smallest and largest step of any op
        self.hi: int | None = None

    def add(self, step: int | None, ops: list) -> tuple[Shape, list]:
        """Shape the segment of marker step ``step`` (None: a prefix), of host ops ``ops``."""
        sh, p = self.shaper.segment(len(self.segs), step if step is not None else 0, ops)
        self.segs.append((step, ops))
        self.shapes.append(sh)
        self.params.append(p)
        if ops:
            steps = [op.step for op in ops]
            lo, hi = min(steps), max(steps)
            self.lo = lo if self.lo is None else min(self.lo, lo)
            self.hi = hi if self.hi is None else max(self.hi, hi)
            self.ops += len(ops)
        return sh, p

    def plan(self, meta: dict) -> Plan:
        """The segments so far as blocks: consecutive segments of one shape."""
        segs, shapes, params = self.segs, self.shapes, self.params
        blocks: list[Block] = []
        g = 0
        while g < len(segs):
            h = g + 1
            marked = segs[g][0] is not None
            while h < len(segs) and shapes[h] == shapes[g] and segs[h][0] is not None \
                    and marked:
                h += 1
            rows = params[g:h]
            consts = _constants(rows)
            steps = [s if s is not None else 0 for s, _ in segs[g:h]]
            if steps == list(range(steps[0], steps[0] + len(steps))):
                steps = range(steps[0], steps[0] + len(steps))
            blocks.append(Block(shapes[g], g, steps, consts, _list_columns(rows, consts),
                                marked, g))
            g = h
        lo, hi = (self.lo, self.hi) if self.lo is not None else (0, 0)
        if hi - lo > 4 * self.ops + 4096:
            raise ValueError(f"steps {lo}..{hi} are too sparse for the fast executor (it "
                             f"keeps one row per step in that range); use the simpy engine")
        return Plan(blocks, dict(meta), lo, hi, self.shaper.negative, self.shaper.offsets,
                    _sites(shapes), skeleton=[ops for _, ops in segs])


def _constants(rows: list[list]) -> tuple:
    """Per parameter slot of a block's rows: the value when every row has it, else None.

    Equal as numbers and, for zeros, in sign (``-0.0`` and ``0.0`` add differently); a
    float slot where another row has an int of the same value stays a column, as before.
    Column by column, in C (``tuple.count``), so a block of many rows costs little.
    """
    out = []
    for col in zip(*rows):
        a = col[0]
        if a != a or col.count(a) != len(col):  # NaN equals nothing, as ``==`` says
            out.append(None)
        elif len(set(map(type, col))) > 1 or (isinstance(a, float) and a == 0.0):
            out.append(a if all(_same(x, a) for x in col) else None)
        else:
            out.append(a)
    return tuple(out)


def _same(a, b) -> bool:
    """Equal as numbers and in sign (``-0.0`` and ``0.0`` add differently)."""
    return not isinstance(a, float) or str(a) == str(b)


def _sites(shapes) -> set:
    return {h.site for sh in shapes for h in sh.host if h.kind in ("sync", "hcoll")}


def plan_config(cfg, sizes, *, fill: bool = True, family=None) -> Plan:
    """Shapes and blocks of a config's run, without building its Program.

    The builder builds the first iterations and the drain with symbolic durations
    (:func:`simwar.builder.loop.plan_iterations`); iterations from the third on must share one
    shape (checked here on the skeleton), so the run is the first iterations, the steady
    one repeated and the drain (:func:`plan_template`). Every distribution is drawn once for
    the whole run, in the same layout :func:`simwar.builder.loop.build_program` uses, so both
    give the same numbers; durations that vary with the step's batch are per-step values of
    the same layout (:class:`simwar.builder.draws.AffineTable`), never new shapes
    (:func:`bind`).

    ``sizes``: the run's per-step sizes (:func:`simwar.api.resolve_sizes`);
    ``fill=False`` leaves the affine values to be filled as the run goes (``plan.table``,
    see :func:`simwar.executors.fast.realize`). ``family``: a
    :class:`simwar.builder.moves.Family` the config belongs to, which gives its iterations
    (built once for configs that differ only in where read-done is published).
    """
    if sizes.shape is not None:
        raise Unsettled(f"scheduling.rule {cfg.scheduling.rule}: the scheduler picks each "
                        f"step's shape from its queue, so the run is planned from its Program")
    iterations = (plan_iterations(cfg, sizes) if family is None
                  else family.iterations(cfg, sizes))
    return bind(plan_template(iterations), iterations.sampler(fill=fill), sizes=sizes)


class TemplateBlock(NamedTuple):
    """One block of a :class:`Template`: consecutive segments of one shape and parameters.

    A parameter is a number, a :class:`~simwar.builder.draws.Use` (a draw), a
    :class:`~simwar.builder.template.Ref` (a duration of the config, by key) or a
    :class:`~simwar.builder.draws.Sum` of them.
    """

    shape: Shape
    first_segment: int
    first_step: int
    segments: int
    params: list
    #: per distribution: the index of the block's first draw of it
    draw_starts: dict
    #: per distribution: its draws per segment
    draws_per_segment: dict
    #: the skeleton iteration standing for every segment of the block
    skeleton_index: int


class PreparedBlock(NamedTuple):
    """A :class:`TemplateBlock` with its drawn parameters apart (the same for every run
    bound from the template, see :func:`bind`)."""

    shape: Shape
    first_segment: int
    steps: range
    fixed: list  # per parameter slot: the parameter, or None where it is drawn (a column)
    drawn: list  # the drawn parameters, in slot order
    draw_starts: dict
    draws_per_segment: dict
    skeleton_index: int


class Template(MutableRecord):
    """A config's run as blocks of shapes whose parameters are not yet numbers
    (:class:`TemplateBlock`)."""

    _fields = ("iterations", "blocks", "offsets", "sites", "steps", "shapes", "prepared")

    def __init__(self, iterations: object, blocks: list[TemplateBlock], offsets: set,
                 sites: set, steps: int, shapes: list | None = None,
                 prepared: list[PreparedBlock] | None = None):
        self.iterations = iterations  # the IterationPlan
        self.blocks = blocks
        self.offsets = offsets
        self.sites = sites
        self.steps = steps
        self.shapes = [] if shapes is None else shapes  # the shape of each skeleton iteration
        self.prepared = prepared  # made by bind, once


def plan_template(iterations, ranks: bool = False) -> Template:
    """The blocks of a run from its iteration templates (an
    :class:`~simwar.builder.loop.IterationPlan`), see :func:`plan_config`; ``ranks``: a
    tensor-parallel rank's, its collectives shaped (:mod:`simwar.executors.lockstep.ranks`)."""
    plan = iterations
    n = len(plan.ops) - 1
    shaper = _Shaper(symbolic=True, ranks=ranks)
    shapes: list[Shape] = []
    params: list[list] = []
    for i, ops in enumerate(plan.ops):
        sh, p = shaper.segment(i, i, ops)
        shapes.append(sh)
        params.append(p)
    steps_total = plan.steps
    keys = [_template(p) for p in params]  # each iteration's constants and draws, compared
    if steps_total > n and any(shapes[i] != shapes[n - 1] or keys[i] != keys[n - 1]
                               for i in range(2, n)):
        raise Unsettled("the builder's iterations do not settle into one shape")
    # the run's segments: skeleton iteration role(k) for k in 0..steps
    roles: list[tuple[int, int, int]] = []  # (skeleton index, first step, count)
    if steps_total <= n:
        roles = [(i, i, 1) for i in range(n)]
    else:
        roles = [(i, i, 1) for i in range(n - 1)] + [(n - 1, n - 1, steps_total - (n - 1))]
    roles.append((n, steps_total, 1))
    # merge consecutive roles of one shape and identical constants
    merged: list[list] = []
    for i, first, count in roles:
        if merged and shapes[merged[-1][0]] == shapes[i] and \
                keys[merged[-1][0]] == keys[i]:
            merged[-1][2] += count
        else:
            merged.append([i, first, count])
    offset = {key: 0 for uses in plan.uses for key in uses}
    blocks: list[tuple] = []
    g = 0
    for i, first, count in merged:
        # per distribution: where this block's draws start, and draws per segment
        uses = plan.uses[i]
        starts = {key: offset[key] for key in uses}
        for key, c in uses.items():
            offset[key] += c * count
        blocks.append(TemplateBlock(shapes[i], g, first, count, params[i], starts, uses, i))
        g += count
    return Template(plan, blocks, shaper.offsets, _sites(shapes), steps_total, shapes)


def _drawn(x) -> bool:
    """Whether a parameter holds a draw (a column; else a constant of the run)."""
    return isinstance(x, Use) or (isinstance(x, Sum) and (_drawn(x.a) or _drawn(x.b)))


def bind(template: Template, sampler, value=None, meta: dict | None = None,
         sizes=None) -> Plan:
    """The plan of a run from its template: the draws of ``sampler`` (its
    :class:`~simwar.builder.draws.Sampler`), ``value(key)`` a config duration a
    :class:`~simwar.builder.template.Ref` names (a template shared by runs), ``meta`` the
    run's (default: the template's), ``sizes`` its per-step sizes (the trace mode names
    graph launches by bucket)."""
    arrays = sampler.arrays
    table = getattr(sampler, "table", None)
    live = set(table.arrays) if table is not None else set()

    def const(x):
        if isinstance(x, Sum):  # a host call's cost: added as the builder adds it
            return const(x.a) + const(x.b)
        if type(x) in (int, float):
            return x
        return value(x.key)  # a Ref (or a traced duration itself)

    if template.prepared is None:  # per block: which parameters are drawn (the same per run)
        template.prepared = [
            PreparedBlock(tb.shape, tb.first_segment,
                          range(tb.first_step, tb.first_step + tb.segments),
                          [None if _drawn(x) else x for x in tb.params],
                          [x for x in tb.params if _drawn(x)], tb.draw_starts,
                          tb.draws_per_segment, tb.skeleton_index)
            for tb in template.blocks]
    blocks: list[Block] = []
    for pb in template.prepared:
        consts = tuple(x if x is None or type(x) is float else const(x) for x in pb.fixed)
        columns = _draw_columns(pb.drawn, arrays, pb.draw_starts, pb.draws_per_segment, live,
                                const)
        blocks.append(Block(pb.shape, pb.first_segment, pb.steps, consts, columns,
                            source=pb.skeleton_index))
    skeleton = template.iterations.ops
    n = len(skeleton) - 1
    out = Plan(blocks, dict(template.iterations.meta if meta is None else meta), 0,
               template.steps, False, template.offsets, template.sites, skeleton=skeleton,
               skeleton_steps=list(range(n)) + [n], skeleton_shapes=template.shapes,
               sizes=sizes)
    out.table = table
    return out


def _template(params: list) -> list:
    """A segment's parameters as compared between iterations: the same constants in the same
    slots and draws of the same distributions give equal templates."""

    def key(x):
        t = type(x)
        if t is float or t is int:  # first: most parameters are numbers
            return ("c", str(x))
        if isinstance(x, Use):
            return ("u", x.key, x.index)
        if isinstance(x, Sum):
            return ("s", key(x.a), key(x.b))
        return ("r", x.key)  # a Ref: a duration of the config

    return [key(x) for x in params]


def _draw_columns(specs: list, arrays: dict, starts: dict, uses: dict, live, const):
    """Column lists for the symbolic slots of a block, sliced from the run's draws; their
    ``row_function()``: one pass's values (see :func:`_row_function`), ``arrays``: the same
    columns as arrays. ``const``: the value of a parameter that is not drawn."""

    def values(x, start: int, stop: int):
        if isinstance(x, Use):
            per = uses[x.key]
            base = starts[x.key] + x.index
            return arrays[x.key][base + start * per: base + stop * per: per]
        if isinstance(x, Sum):
            return values(x.a, start, stop) + values(x.b, start, stop)
        return const(x)

    def columns(start: int, stop: int) -> list[list]:
        return [values(x, start, stop).tolist() for x in specs]

    def column_arrays(start: int, stop: int) -> list[np.ndarray]:
        return [np.asarray(values(x, start, stop), dtype=np.float64) for x in specs]

    def row_function():
        fn = columns.__dict__.get("_row")
        if fn is None:  # generated on first use (a run that fixes its sizes as it goes)
            fn = columns._row = _row_function(specs, arrays, starts, uses, live, const)
        return fn

    columns.row_function = row_function
    columns.arrays = column_arrays  # the same columns as arrays (runs in lockstep)
    return columns


def _row_function(specs: list, arrays: dict, starts: dict, uses: dict, live, const):
    """``row(p, L)``: the symbolic slots' values at pass ``p`` of the block, as a tuple of
    floats: the same numbers, added in the same order, as :func:`_draw_columns`' columns.
    The uses of a step-dependent duration (a key in ``live``) are read from ``L``, that
    iteration's values (:meth:`~simwar.builder.draws.AffineTable.at`), not from the arrays:
    a run whose sizes are fixed as it goes (:func:`simwar.executors.fast.realize`)."""
    names: dict[str, object] = {}

    def expr(x) -> str:
        if isinstance(x, Use) and x.key in live:
            return f"L[{x.key}][{x.index}]"
        if isinstance(x, Use):
            name = f"A{len(names)}"
            names[name] = arrays[x.key].item
            return f"{name}({starts[x.key] + x.index} + p * {uses[x.key]})"
        if isinstance(x, Sum):
            return f"({expr(x.a)} + {expr(x.b)})"
        name = f"K{len(names)}"
        names[name] = const(x)
        return name

    code = "def row(p, L):\n    return (" + "".join(f"{expr(x)}, " for x in specs) + ")\n"
    exec(compile(code, "<simwar.executors.fast.plan row>", "exec"), names)
    return names["row"]

