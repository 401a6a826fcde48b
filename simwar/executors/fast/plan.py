"""Shapes and blocks: a program, or a config's run, cut into iteration shapes and their numbers.

- :class:`DeviceOp`, :class:`Shape`: the structure of one *segment* (the host ops from one step
  marker to the next: one scheduler iteration), made by :mod:`simwar.executors.fast.shaper`
  (re-exported here), with a family's members' ops read once (:class:`ShapeMemo`).
- :class:`Block`, :class:`Plan`: consecutive segments of one shape with their parameters
  (durations, host costs, latencies: a constant or one column per parameter slot); a plan is
  the whole run as a few blocks.
- :func:`plan_program` (any :class:`~simwar.core.program.Program`, parameters taken from its
  ops) and :func:`plan_config` (a config's run from the builder's first iterations, never
  materialized as a Program).

The package docstring (:mod:`simwar.executors.fast`) says why a run is a few blocks.

Imports: simwar.core, the builder's loop and draws, the shaper and the plan's records. Must
not import the executor's other parts (codegen, execute, races): they build on
this one.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simwar.builder.draws import Sum, Use
from simwar.builder.loop import plan_iterations
from simwar.core.frozen import MutableRecord
from simwar.core.program import Program
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
from simwar.executors.fast.shaper import (  # noqa: F401 (the shapes, re-exported)
    DeviceOp,
    RanksOnly,
    Shape,
    ShapeMemo,
    _devices,
    _segments,
    _Shaper,
    _template,
)


class Unsettled(PlanRefused):
    """A config's iterations do not settle into one shape from the third on, so its run
    cannot be planned from its first iterations: plan it from its Program instead."""


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
    if family is not None and family.shared:
        # the base's ops, or a member's moved from them: each read once (ShapeMemo)
        if iterations is family.base:
            family.shaping = ShapeMemo()  # a new base: what was kept was another's
        template = plan_template(iterations, memo=family.shaping,
                                 store=iterations is family.base)
    else:
        template = plan_template(iterations)
    return bind(template, iterations.sampler(fill=fill), sizes=sizes)


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


def plan_template(iterations, ranks: bool = False, memo: ShapeMemo | None = None,
                  store: bool = False) -> Template:
    """The blocks of a run from its iteration templates (an
    :class:`~simwar.builder.loop.IterationPlan`), see :func:`plan_config`; ``ranks``: a
    tensor-parallel rank's, its collectives shaped (:mod:`simwar.executors.lockstep.ranks`);
    ``memo``: a family's (:class:`ShapeMemo`), its ops read once for every member (``store``:
    these iterations' ops go into it, the family's first's)."""
    plan = iterations
    n = len(plan.ops) - 1
    shaper = _Shaper(symbolic=True, ranks=ranks, memo=memo, store=store)
    shapes: list[Shape] = []
    params: list[list] = []
    keys: list[list] = []  # each iteration's constants and draws, compared
    for i, ops in enumerate(plan.ops):
        sh, p = shaper.segment(i, i, ops)
        shapes.append(sh)
        params.append(p)
        keys.append(shaper.keys if memo is not None else _template(p))
    steps_total = plan.steps
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


def _fixed_and_drawn(params: list) -> tuple[list, list]:
    """A block's parameters with its drawn ones None, and the drawn ones (:func:`bind`)."""
    if set(map(type, params)) <= _NUMBERS:  # numbers only (their types looked at in C)
        return list(params), []
    drawn = [_drawn(x) for x in params]
    if not any(drawn):  # (numbers and the config's durations: every parameter fixed)
        return list(params), []
    return ([None if d else x for x, d in zip(params, drawn)],
            [x for x, d in zip(params, drawn) if d])


#: the types of a parameter that is a number (never drawn)
_NUMBERS = frozenset({float, int})


def _drawn(x) -> bool:
    """Whether a parameter holds a draw (a column; else a constant of the run)."""
    t = type(x)
    if t is float or t is int:  # first: most parameters are numbers
        return False
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
                          *_fixed_and_drawn(tb.params), tb.draw_starts,
                          tb.draws_per_segment, tb.skeleton_index)
            for tb in template.blocks]
    blocks: list[Block] = []
    for pb in template.prepared:
        consts = tuple([x if x is None or type(x) is float else const(x) for x in pb.fixed])
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

