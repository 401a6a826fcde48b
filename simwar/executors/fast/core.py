"""The one-pass executor: a Program's per-step table, summary and races without SimPy.

Once durations are drawn the schedule is deterministic, and the host's issue order is a
valid evaluation order (every input of an operation was issued before it). So one pass
over the host operations, placing each device operation by :mod:`simwar.core.rules` (the
functions the SimPy engine calls: ``begins``, ``fires``, ``released``, ``returns``),
gives the engine's times exactly. Nothing is recorded per operation: the per-step facts
the metrics need (forward start and end, forward-stream busy and held time per step
window, host blocked time per site, the ``run_batch`` instant) are accumulated as the pass
goes, into one array per fact, and assembled by the same
:func:`simwar.analysis.metrics.columns_from_arrays` and :func:`~simwar.analysis.metrics.summarize`
as the engine's Trace.

**Iteration shapes.** The program is cut at its step markers into *segments* (one
scheduler iteration each). A segment's *shape* is its structure: the kinds, streams,
labels, phases and buffer accesses of its operations, step numbers relative to the
segment's step, and each wait's and sync's binding as "record ``i`` of the segment ``d``
back" (resolved once, like the engine does at the host call). Consecutive segments of one
shape form a *block*; the numbers (durations, host costs, latencies) are the block's
parameters, constant over the block or one column per parameter. Each shape is compiled
once into straight-line Python (generated source, cached per process) that runs a whole
block in a loop; a run of the builder is three or four blocks, whatever its length.

**Workloads that change every step.** A step's batch, graph bucket and accepted tokens
change numbers, never structure: a duration that scales with them is a parameter column of
the block like a drawn one (:class:`simwar.build.draws.AffineTable` lays its per-use values out as
the draws are), and a graph launch's name (which carries its bucket, ``verify.graph@32``) is
not part of a shape. So a varying run is still three or four blocks. A workload whose batches
depend on simulated time (arrivals) is realized first by :func:`realize`: the same plan, run
one segment at a time, fixing each step's batch from the host clock at its marker before the
segment's parameters are read (:mod:`simwar.build.sizes`).

**Races.** Latent races depend only on issue order, streams, records, waits and syncs.
:func:`simwar.analysis.hazards.detect` compares accesses whose steps differ by at most
``window``; when every access belongs to its segment's step and segments are consecutive
steps, the pairs whose later access is in segment ``g`` lie in segments ``g - window .. g``,
and whether one happens before the other depends only on the operations issued between
them. So the pairs and their latent flag are a function of the ``window + 1`` shapes
ending at ``g``: they are computed once per distinct window by the same
:func:`~simwar.analysis.hazards.candidate_pairs` the engine's analysis uses, and mapped
onto every segment with that window. An observed overlap needs a latent pair (an
operation that happens before another ends before it starts: every rule only adds
non-negative times), so the executor logs the times of the operations of latent pairs
only, and the overlaps come from those. A program that does not fit (steps not
consecutive, accesses labelled with another step, negative durations) is analysed over
all its accesses instead; a program whose forward steps are issued out of order gets its
step windows from the logged forward-stream intervals. Both give the engine's answers.

**Exactness.** Every number is computed by the same operations in the same order as on
the engine's path, so the per-step table, the summary and the race list are equal, not
close (``tests/test_fast.py``): the rules are the same functions; forward-stream busy
and held time per step window are added interval by interval in issue order, the order
:func:`~simwar.analysis.metrics.busy_in_windows` adds them for a Trace (issue order is
start order on a FIFO stream); host blocked time is added per step and site in issue
order, as ``np.add.at`` does.

**Long runs.** A config's run is planned from its first iterations
(:func:`plan_config`), never materialized as a Program. ``summary_only`` keeps the
per-step accumulators in a window that moves with the run and summarizes rows as they
become final (:class:`_Flusher`, :mod:`simwar.analysis.streaming`), so memory does not grow with
the number of steps.

Imports: numpy and simwar's own modules; no simpy, no pandas.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from simwar.analysis.hazards import HazardReport, Race, candidate_pairs, race_kind
from simwar.analysis.metrics import SITES, StepFacts, columns_from_arrays, summarize
from simwar.build.draws import Sum, Use
from simwar.build.loop import build_program, plan_iterations
from simwar.core import rules
from simwar.core.program import (
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
from simwar.core.trace import Mode, OpKind

#: passes of a block run per call of its compiled function (bounds the parameter lists)
CHUNK = 1 << 15
_INF = float("inf")


# =========================================================================== shapes
@dataclass
class DeviceOp:
    """One device-visible op of a shape, in issue order (its op id is base + index)."""

    kind: int  # OpKind
    lane: str
    off: int  # step offset from the segment's step
    label: str = ""
    phase: str = ""
    accesses: tuple = ()  # ((buffer, Mode), ...) in the engine's order: reads, then writes
    bind: tuple | None = None  # waits and syncs: (segments back, record index) or None
    bound_op: int | None = None  # a wait_stream's wait: the device op index of its record


class Shape:
    """The structure of one segment, hashable; ``params`` slots are filled per segment.

    ``host`` lists the host operations as tuples (see :func:`_shape_of`); ``ops`` the device
    ops they issue; ``records`` maps a record index to its device op index.
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
    """

    def __init__(self) -> None:
        self.latest: dict[str, tuple[int, int, str]] = {}  # event -> (segment, record, lane)
        self.negative = False  # a negative number was seen (the overlap shortcut needs >= 0)
        self.offsets: set[int] = set()  # step offsets of accesses

    def segment(self, g: int, base: int, ops) -> tuple[Shape, list]:
        host: list[tuple] = []
        dev: list[DeviceOp] = []
        records: list[int] = []
        params: list = []
        latest = self.latest

        def num(x):
            if isinstance(x, (int, float)) and x < 0:
                self.negative = True
            params.append(x)

        def record(event: str, lane: str, off: int) -> None:
            latest[event] = (g, len(records), lane)
            records.append(len(dev))
            dev.append(DeviceOp(OpKind.RECORD, lane, off, event))

        def binding(event: str):
            r = latest.get(event)
            return None if r is None else (g - r[0], r[1], r[2])

        for op in ops:
            kind = type(op)
            if kind is CpuWork:
                host.append(("cpu",))
                num(op.duration_us)
            elif kind is Launch:
                k = op.kernel
                off = op.step - base
                acc = _accesses(k)
                host.append(("launch", op.stream, off, k.label, k.phase, acc))
                num(op.host_us)
                num(k.duration_us)
                if acc:
                    self.offsets.add(off)
                dev.append(DeviceOp(OpKind.KERNEL, op.stream, off, k.label, k.phase, acc))
            elif kind is GraphLaunch:
                off = op.step - base
                nodes = []
                num(op.host_us)
                for node in op.nodes:
                    if type(node) is GraphRecord:
                        nodes.append(("r",))
                        record(node.event, op.stream, off)
                    else:
                        acc = _accesses(node)
                        nodes.append(("k", node.label, node.phase, acc))
                        num(node.duration_us)
                        if acc:
                            self.offsets.add(off)
                        dev.append(DeviceOp(OpKind.KERNEL, op.stream, off, node.label,
                                            node.phase, acc))
                host.append(("graph", op.stream, off, tuple(nodes)))
            elif kind is Record:
                off = op.step - base
                host.append(("record", op.stream, off))
                num(op.host_us)
                record(op.event, op.stream, off)
            elif kind is WaitStream:
                off = op.step - base
                host.append(("wait_stream", op.stream, op.other, off))
                num(op.host_us)
                num(op.latency_us)
                dev.append(DeviceOp(OpKind.RECORD, op.other, off, op.other + ".tail"))
                dev.append(DeviceOp(OpKind.WAIT, op.stream, off, op.other + ".tail",
                                    bound_op=len(dev) - 1))
            elif kind is WaitEvent:
                off = op.step - base
                b = binding(op.event)
                bind = None if b is None else (b[0], b[1], b[2] == op.stream)
                host.append(("wait_event", op.stream, off, bind))
                num(op.host_us)
                num(op.latency_us)
                dev.append(DeviceOp(OpKind.WAIT, op.stream, off, op.event,
                                    bind=None if b is None else b[:2]))
            elif kind is Synchronize:
                off = op.step - base
                b = binding(op.event)
                bind = None if b is None else b[:2]
                host.append(("sync", off, op.site, bind))
                num(op.host_us)
                num(op.wake_us)
                dev.append(DeviceOp(OpKind.SYNC, "cpu", off, op.event, bind=bind))
            elif kind is Marker:
                if op.name == "run_batch":
                    host.append(("run_batch", op.step - base))
            elif kind is StepMarker:
                pass
            else:
                raise TypeError(f"unknown host op {op!r}")
        return Shape(tuple(host), dev, records, len(params)), params


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
@dataclass
class Block:
    """Consecutive segments of one shape: ``steps`` (their marker steps), parameters."""

    shape: Shape
    g0: int  # first segment index
    steps: range | list  # marker step of each segment (0 for a prefix)
    consts: tuple  # per parameter slot: a number, or None for a column
    columns: object  # callable(start, stop) -> list of column lists, in slot order
    marked: bool = True  # False: a prefix before the first step marker

    @property
    def n(self) -> int:
        return len(self.steps)


@dataclass
class Plan:
    """A program as blocks of shapes, ready for :func:`execute`."""

    blocks: list[Block]
    meta: dict
    lo: int  # smallest step
    hi: int  # largest step
    negative: bool = False
    offsets: set = field(default_factory=set)
    sites: set = field(default_factory=set)
    table: object = None  # a config's AffineTable (per-use values of varying durations)

    @property
    def segments(self) -> int:
        return sum(b.n for b in self.blocks)


def _list_columns(rows: list[list], consts: tuple):
    cols = [j for j, c in enumerate(consts) if c is None]

    def columns(start: int, stop: int) -> list[list]:
        return [[r[j] for r in rows[start:stop]] for j in cols]

    return columns


def plan_program(program: Program) -> Plan:
    """Shapes and blocks of any Program (parameters taken from its ops)."""
    shaper = _Shaper()
    segs = _segments(program.ops)
    shapes: list[Shape] = []
    params: list[list] = []
    for g, (step, ops) in enumerate(segs):
        sh, p = shaper.segment(g, step if step is not None else 0, ops)
        shapes.append(sh)
        params.append(p)
    blocks: list[Block] = []
    g = 0
    while g < len(segs):
        h = g + 1
        marked = segs[g][0] is not None
        while h < len(segs) and shapes[h] == shapes[g] and segs[h][0] is not None and marked:
            h += 1
        rows = params[g:h]
        consts = tuple(rows[0][j] if all(r[j] == rows[0][j] and _same(r[j], rows[0][j])
                                         for r in rows) else None
                       for j in range(shapes[g].nparams))
        steps = [s if s is not None else 0 for s, _ in segs[g:h]]
        if steps == list(range(steps[0], steps[0] + len(steps))):
            steps = range(steps[0], steps[0] + len(steps))
        blocks.append(Block(shapes[g], g, steps, consts, _list_columns(rows, consts), marked))
        g = h
    all_steps = [op.step for op in program.ops]
    lo, hi = (min(all_steps), max(all_steps)) if all_steps else (0, 0)
    if hi - lo > 4 * len(all_steps) + 4096:
        raise ValueError(f"steps {lo}..{hi} are too sparse for the one-pass executor (it "
                         f"keeps one row per step in that range); use the simpy engine")
    return Plan(blocks, dict(program.meta), lo, hi, shaper.negative, shaper.offsets,
                _sites(shapes))


def _same(a, b) -> bool:
    """Equal as numbers and in sign (``-0.0`` and ``0.0`` add differently)."""
    return not isinstance(a, float) or str(a) == str(b)


def _sites(shapes) -> set:
    return {h[2] for sh in shapes for h in sh.host if h[0] == "sync"}


def plan_config(cfg, sizes, *, fill: bool = True) -> Plan:
    """Shapes and blocks of a config's run, without building its Program.

    The builder builds the first iterations and the drain with symbolic durations
    (:func:`simwar.build.loop.plan_iterations`); iterations from the third on must share one
    shape (checked here on the skeleton), so the run is the first iterations, the steady
    one repeated and the drain. Every distribution is drawn once for the whole run, in the
    same layout :func:`simwar.build.loop.build_program` uses, so both give the same numbers;
    durations that vary with the step's batch are per-step values of the same layout
    (:class:`simwar.build.draws.AffineTable`), never new shapes.

    ``sizes``: the run's per-step sizes (:func:`simwar.api.resolve_sizes`);
    ``fill=False`` leaves the affine values to be filled as the run goes (``plan.table``,
    see :func:`realize`).
    """
    plan = plan_iterations(cfg, sizes)
    n = len(plan.ops) - 1
    shaper = _Shaper()
    shapes: list[Shape] = []
    params: list[list] = []
    for i, ops in enumerate(plan.ops):
        step = i
        sh, p = shaper.segment(i, step, ops)
        shapes.append(sh)
        params.append(p)
    steps_total = cfg.steps
    if steps_total > n and any(shapes[i] != shapes[n - 1] or
                               not _same_template(params[i], params[n - 1])
                               for i in range(2, n)):
        raise RuntimeError("the builder's iterations do not settle into one shape")
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
                _same_template(params[merged[-1][0]], params[i]):
            merged[-1][2] += count
        else:
            merged.append([i, first, count])

    sampler = plan.sampler(fill=fill)
    arrays = sampler.arrays
    offset = {key: 0 for uses in plan.uses for key in uses}
    blocks: list[Block] = []
    g = 0
    for i, first, count in merged:
        p = params[i]
        consts = tuple(x if not isinstance(x, (Use, Sum)) else None for x in p)
        # per distribution: where this block's draws start, and draws per segment
        uses = plan.uses[i]
        starts = {key: offset[key] for key in uses}
        for key, c in uses.items():
            offset[key] += c * count
        specs = [x for x in p if isinstance(x, (Use, Sum))]
        blocks.append(Block(shapes[i], g, range(first, first + count), consts,
                            _draw_columns(specs, arrays, starts, uses)))
        g += count
    lo = 0
    hi = steps_total
    out = Plan(blocks, dict(plan.meta), lo, hi, False, shaper.offsets, _sites(shapes))
    out.table = getattr(sampler, "table", None)
    return out


def _same_template(a: list, b: list) -> bool:
    """Same constants in the same slots and draws of the same distributions."""
    def key(x):
        if isinstance(x, Use):
            return ("u", x.key, x.index)
        if isinstance(x, Sum):
            return ("s", key(x.a), key(x.b))
        return ("c", str(x))

    return [key(x) for x in a] == [key(x) for x in b]


def _draw_columns(specs: list, arrays: dict, starts: dict, uses: dict):
    """Column lists for the symbolic slots of a block, sliced from the run's draws."""
    def values(x, start: int, stop: int):
        if isinstance(x, Use):
            per = uses[x.key]
            base = starts[x.key] + x.index
            return arrays[x.key][base + start * per: base + stop * per: per]
        if isinstance(x, Sum):
            return values(x.a, start, stop) + values(x.b, start, stop)
        return x

    def columns(start: int, stop: int) -> list[list]:
        return [values(x, start, stop).tolist() for x in specs]

    return columns


# =========================================================================== compilation
_CODE: OrderedDict = OrderedDict()  # compiled block functions, by (shape, slot kinds, ...)
_CODE_LIMIT = 512


class _Src:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str, indent: int = 2) -> None:
        self.lines.append("    " * indent + line)


def _lanevar(lane: str, lanes: dict) -> str:
    if lane not in lanes:
        lanes[lane] = f"T{len(lanes)}"
    return lanes[lane]


def compile_block(shape: Shape, slots: tuple, fwd: str, collect: bool, log: tuple,
                  depth: int):
    """The function running a block of ``shape`` (cached).

    ``slots``: per parameter, True for a column, False for a constant; ``log``: sorted
    ``(device op index, 's' | 'e')`` whose times are appended to logs; ``depth``: segments
    of record times kept for bindings to earlier segments; ``collect``: append the forward
    stream's intervals instead of adding them up per step window.
    """
    key = (shape.host, slots, fwd, collect, log, depth)
    fn = _CODE.get(key)
    if fn is not None:
        _CODE.move_to_end(key)
        return fn
    fn = _generate(shape, slots, fwd, collect, log, depth)
    _CODE[key] = fn
    if len(_CODE) > _CODE_LIMIT:
        _CODE.popitem(last=False)
    return fn


def _generate(shape: Shape, slots: tuple, fwd: str, collect: bool, log: tuple, depth: int):
    src = _Src()
    lanes: dict[str, str] = {}
    params = [f"k{j}" if not col else f"c{j}" for j, col in enumerate(slots)]
    pi = iter(params)
    logs = {entry: f"LG{n}" for n, entry in enumerate(log)}
    nrec = len(shape.records)
    body: list[tuple[str, int]] = []
    sites = sorted({h[2] for h in shape.host if h[0] == "sync"})

    def emit(line: str, indent: int = 2) -> None:
        body.append((line, indent))

    def step_index(off: int) -> str:
        return "ki" if off == 0 else f"(ki + {off})" if off > 0 else f"(ki - {-off})"

    def fired(bind) -> str:
        d, idx = bind[0], bind[1]
        if d == 0:
            return f"r{idx}"
        return f"H{d}[{idx}]"

    def log_times(dev_index: int, s: str, e: str) -> None:
        if (dev_index, "s") in logs:
            emit(f"{logs[(dev_index, 's')]}({s})")
        if (dev_index, "e") in logs:
            emit(f"{logs[(dev_index, 'e')]}({e})")

    # step offsets whose first / last forward kernel opens the window / ends the forward
    fwd_kernels = [(i, op) for i, op in enumerate(shape.ops)
                   if op.kind == OpKind.KERNEL and op.lane == fwd and op.phase]
    first_of: dict[int, int] = {}
    last_of: dict[int, int] = {}
    for i, op in fwd_kernels:
        first_of.setdefault(op.off, i)
        last_of[op.off] = i

    def kernel(dev_index: int, lane: str, dur: str) -> None:
        op = shape.ops[dev_index]
        tv = _lanevar(lane, lanes)
        emit(f"s = begins({tv}, t)")
        emit(f"{tv} = e = s + {dur}")
        if lane == fwd:
            ks = step_index(op.off)
            if op.phase:
                if collect:
                    emit(f"if s < FS[{ks}]: FS[{ks}] = s")
                    emit(f"if e > FE[{ks}]: FE[{ks}] = e")
                else:
                    if first_of.get(op.off) == dev_index:
                        emit(f"if {ks} != cw:")
                        emit(f"if {ks} < cw: bad = True", 3)
                        emit("BU[cw] = W; DE[cw] = Dp; W = 0.0; Dp = 0.0", 3)
                        emit(f"cw = {ks}; FS[cw] = s", 3)
                    if last_of.get(op.off) == dev_index:
                        emit(f"FE[{ks}] = e")
            if collect:
                emit("KS_(s); KE_(e)")
            else:
                emit("W += e - s")
        log_times(dev_index, "s", "e")

    dev = 0  # device op index
    rec = 0  # record index
    for h in shape.host:
        kind = h[0]
        if kind == "cpu":
            emit(f"t += {next(pi)}")
        elif kind == "launch":
            emit(f"t += {next(pi)}")
            kernel(dev, h[1], next(pi))
            dev += 1
        elif kind == "graph":
            emit(f"t += {next(pi)}")
            tv = _lanevar(h[1], lanes)
            for node in h[3]:
                if node[0] == "r":
                    emit(f"r{rec} = {tv} = begins({tv}, t)")
                    log_times(dev, f"r{rec}", f"r{rec}")
                    rec += 1
                else:
                    kernel(dev, h[1], next(pi))
                dev += 1
        elif kind == "record":
            emit(f"t += {next(pi)}")
            tv = _lanevar(h[1], lanes)
            emit(f"r{rec} = {tv} = begins({tv}, t)")
            log_times(dev, f"r{rec}", f"r{rec}")
            rec += 1
            dev += 1
        elif kind == "wait_stream":
            stream, other = h[1], h[2]
            host, lat = next(pi), next(pi)
            emit(f"t += {host}")
            to, ts = _lanevar(other, lanes), _lanevar(stream, lanes)
            emit(f"x = {to} = begins({to}, t)")
            log_times(dev, "x", "x")
            emit(f"reach = begins({ts}, t)")
            emit(f"{ts} = rel = released(reach, x, {lat}, {stream == other})")
            if stream == fwd:
                emit("if rel > reach:")
                emit("WS_(reach); WE_(rel)" if collect else "Dp += rel - reach", 3)
            log_times(dev + 1, "reach", "rel")
            dev += 2
        elif kind == "wait_event":
            stream, bind = h[1], h[3]
            host, lat = next(pi), next(pi)
            emit(f"t += {host}")
            ts = _lanevar(stream, lanes)
            if bind is None:
                emit(f"{ts} = reach = rel = begins({ts}, t)")
            else:
                emit(f"reach = begins({ts}, t)")
                emit(f"{ts} = rel = released(reach, {fired(bind)}, {lat}, {bind[2]})")
                if stream == fwd:
                    emit("if rel > reach:")
                    emit("WS_(reach); WE_(rel)" if collect else "Dp += rel - reach", 3)
            log_times(dev, "reach", "rel")
            dev += 1
        elif kind == "sync":
            off, site, bind = h[1], h[2], h[3]
            host, wake = next(pi), next(pi)
            f = "None" if bind is None else fired(bind)
            emit("t0 = t")
            emit(f"t = returns(t0, {host}, {f}, {wake})")
            emit(f"B{sites.index(site)}[{step_index(off)}] += t - t0")
            dev += 1
        elif kind == "run_batch":
            emit(f"LA[{step_index(h[1])}] = t")
        else:  # pragma: no cover
            raise AssertionError(kind)
    # record times kept for later segments
    if depth:
        for d in range(depth, 1, -1):
            emit(f"H{d} = H{d - 1}")
        emit("H1 = (" + "".join(f"r{i}, " for i in range(nrec)) + ")")

    cols = [p for p in params if p.startswith("c")]
    consts = [p for p in params if p.startswith("k")]
    src("def block(KS, K, C, S):", 0)
    if consts:
        src(f"({', '.join(consts)},) = K", 1)
    src("t = S.t", 1)
    src("TL = S.tails", 1)
    for lane, var in lanes.items():
        src(f"{var} = TL.get({lane!r}, 0.0)", 1)
    for d in range(1, depth + 1):
        src(f"H{d} = S.hist[{d - 1}]", 1)
    src("FS = S.fs; FE = S.fe; LA = S.launch", 1)
    for n, site in enumerate(sites):
        src(f"B{n} = S.blocked[{site!r}]", 1)
    if collect:
        src("KS_ = S.kin.append; KE_ = S.kout.append; WS_ = S.win.append; "
            "WE_ = S.wout.append", 1)
    else:
        src("BU = S.busy; DE = S.dep; cw = S.cw; W = S.w; Dp = S.dp; bad = S.bad", 1)
    for n, var in enumerate(logs.values()):
        src(f"{var} = S.logs[{n}].append", 1)
    src("begins = _begins; released = _released; returns = _returns", 1)
    header = "for ki" + "".join(f", {c}" for c in cols) + " in " + (
        f"zip(KS, {', '.join(f'C[{i}]' for i in range(len(cols)))}):" if cols else "KS:")
    src(header, 1)
    for line, indent in body:
        src(line, indent)
    if not body:
        src("pass", 2)
    src("S.t = t", 1)
    for lane, var in lanes.items():
        src(f"TL[{lane!r}] = {var}", 1)
    if depth:
        src("S.hist = [" + "".join(f"H{d}, " for d in range(1, depth + 1)) + "]", 1)
    if not collect:
        src("S.cw = cw; S.w = W; S.dp = Dp; S.bad = bad", 1)
    code = "\n".join(src.lines) + "\n"
    namespace = {"_begins": rules.begins, "_released": rules.released,
                 "_returns": rules.returns}
    exec(compile(code, f"<simwar.executors.fast.core block {abs(shape._hash):x}>", "exec"), namespace)
    fn = namespace["block"]
    fn.source = code
    return fn


# =========================================================================== execution
class _State:
    """What carries from one block to the next (and the per-step accumulators).

    Accumulators are indexed by step minus ``origin``; ``rows`` (summary-only runs) gives
    them a fixed length, moved along the run by :class:`_Flusher`.
    """

    def __init__(self, lo: int, hi: int, sites, depth: int, collect: bool,
                 rows: int | None = None):
        n = rows if rows is not None else hi - lo + 1
        self.origin = lo
        self.t = 0.0
        self.tails: dict[str, float] = {}
        self.hist = [()] * depth
        self.fs = _filled(n, _INF)
        self.fe = _filled(n, -_INF)
        self.launch = _filled(n, float("nan"))
        self.blocked = {site: _filled(n, 0.0) for site in sites}
        self.busy = _filled(n + 1, 0.0)  # one spare slot: index -1 before the first window
        self.dep = _filled(n + 1, 0.0)
        self.cw = -1
        self.w = 0.0
        self.dp = 0.0
        self.bad = False
        self.collect = collect
        self.kin, self.kout, self.win, self.wout = (array("d") for _ in range(4))
        self.logs: list = []  # the current block's log arrays, in its log order

    def grow(self, by: int) -> None:
        for arr, value in ((self.fs, _INF), (self.fe, -_INF), (self.launch, float("nan")),
                           *((a, 0.0) for a in self.blocked.values())):
            arr.extend(_filled(by, value))
        for arr in (self.busy, self.dep):  # keep the spare slot last
            spare = arr.pop()
            arr.extend(_filled(by, 0.0))
            arr.append(spare)


def _filled(n: int, value: float) -> array:
    return array("d", [value]) * n


def execute(plan: Plan, window: int = 2, collect: bool | None = None,
            summary_only: bool = False, before_pass=None) -> FastRun:
    """Run a plan: the per-step columns, and the races (see the module docstring).

    ``summary_only``: keep no per-step table; rows are summarized as they become final
    (:class:`simwar.analysis.streaming.StreamingSummary`), in a window of per-step accumulators
    that moves with the run, so memory does not grow with its length.
    ``before_pass(step, t)``: called before each segment with its marker step and the host
    clock there; the segments then run one at a time and their parameters are read after
    the call (:func:`realize`).
    """
    meta = plan.meta
    fwd = meta.get("forward_stream", "forward")
    blocks = plan.blocks
    depth = 0
    for b in blocks:
        for h in b.shape.host:
            if h[0] in ("wait_event", "sync") and h[-1] is not None:
                depth = max(depth, h[-1][0])
    races = _RacePlan(plan, window)
    sites = set(SITES) | plan.sites
    streaming = summary_only and _monotone(blocks)
    bad = collect
    for attempt in (False, True):
        if bad is not None and attempt != bad:
            continue
        rolling = streaming and not attempt
        state = _State(plan.lo, plan.hi, sites, depth, attempt,
                       rows=min(2 * CHUNK + 64, plan.hi - plan.lo + 1) if rolling else None)
        flusher = _Flusher(state, plan, fwd) if rolling else None
        races.reset()
        for bi, b in enumerate(blocks):
            slots = tuple(c is None for c in b.consts)
            log = races.logs_of(bi)
            state.logs = races.log_arrays(bi)
            fn = compile_block(b.shape, slots, fwd, attempt, log, depth)
            consts = tuple(c for c in b.consts if c is not None)
            keys = b.steps
            for start in range(0, b.n, CHUNK if before_pass is None else 1):
                stop = min(b.n, start + (CHUNK if before_pass is None else 1))
                ks = keys[start:stop]
                if before_pass is not None:
                    before_pass(ks[0], state.t)
                if flusher is not None:
                    flusher.before(min(ks), max(ks))
                lo = state.origin
                ks = range(ks.start - lo, ks.stop - lo) if isinstance(ks, range) else \
                    [k - lo for k in ks]
                cols = b.columns(start, stop) if any(slots) else []
                fn(ks, consts, cols, state)
        if attempt or not state.bad:
            break
        bad = True  # forward steps issued out of order: windows from the intervals
    if flusher is not None and not state.collect:
        hazards = races.finish(state)
        out = FastRun(None, plan.meta, hazards, plan.segments)
        out._summary = flusher.finish(hazards)
        out.paths = ("windowed" if races.windowed else "full", "streamed")
        return out
    out = _finish(plan, state, races, fwd)
    if summary_only:
        out.columns = None  # computed (a fallback path), then dropped
    return out


def _monotone(blocks: list[Block]) -> bool:
    """Marker steps never decrease (rows become final in order)."""
    last = None
    for b in blocks:
        steps = b.steps
        first = steps[0] if isinstance(steps, range) else min(steps)
        if isinstance(steps, list) and steps != sorted(steps):
            return False
        if last is not None and first < last:
            return False
        last = steps[-1]
    return True


class _Flusher:
    """Moves the per-step accumulators along a run and summarizes the rows left behind.

    Before a chunk of passes, the rows no later op can write (below the chunk's first step
    plus the smallest step offset of any op that writes one, and below the open step
    window) are final. They are turned into table rows by ``columns_from_arrays``, with the
    last rows before them as context (the previous forward's end, the launch-ahead
    history) and the row after them (the next forward's start and launch), and fed to a
    :class:`~simwar.analysis.streaming.StreamingSummary`; the accumulators then shift down.
    """

    HISTORY = 4096  # rows kept as context for launch-ahead (forwards in flight)

    def __init__(self, state: _State, plan: Plan, fwd: str):
        from simwar.analysis.streaming import StreamingSummary

        self.state = state
        self.plan = plan
        self.sink = StreamingSummary(plan.meta)
        self.facts = StepFacts(plan.meta)
        offs = [0]
        for b in plan.blocks:
            for h in b.shape.host:
                if h[0] == "sync" or h[0] == "run_batch":
                    offs.append(h[1])
            for op in b.shape.ops:
                if op.kind == OpKind.KERNEL and op.lane == fwd and op.phase:
                    offs.append(op.off)
        self.min_off, self.max_off = min(offs), max(offs)
        self.hist: dict | None = None  # facts of the last rows summarized
        self.dropped = 0  # rows summarized before the history

    def _views(self) -> dict:
        st = self.state
        out = {"start": st.fs, "end": st.fe, "launch": st.launch, "busy": st.busy,
               "dep": st.dep}
        out.update({("blocked", site): arr for site, arr in st.blocked.items()})
        return out

    def before(self, first: int, last: int) -> None:
        st = self.state
        rows = len(st.fs)
        if last + self.max_off - st.origin < rows:
            return
        final = first + self.min_off
        if st.cw >= 0:
            final = min(final, st.origin + st.cw)
        self._emit(final - st.origin, keep_last=True)
        need = last + self.max_off - st.origin + 1
        if need > len(st.fs):
            st.grow(need - len(st.fs) + CHUNK)

    def _emit(self, upto: int, keep_last: bool) -> None:
        """Summarize the present rows below ``upto`` (all but the last, if ``keep_last``)."""
        st = self.state
        upto = max(0, min(upto, len(st.fs)))
        fs = np.frombuffer(st.fs, dtype=np.float64)
        present = np.flatnonzero(fs[:upto] < _INF)
        if keep_last:
            if len(present) == 0:
                self._shift(upto)
                return
            nxt, present = present[-1], present[:-1]
            rows = np.append(present, nxt)
        else:
            rows = present
        del fs
        facts = {key: np.frombuffer(arr, dtype=np.float64)[rows].copy()
                 for key, arr in self._views().items()}
        facts["step"] = (rows + st.origin).astype(np.int64)
        self._summarize(facts, has_next=keep_last)
        self._shift(int(rows[-1]) if keep_last else upto)

    def _summarize(self, facts: dict, has_next: bool) -> None:
        hist = self.hist
        h = 0 if hist is None else len(hist["step"])
        if hist is not None:
            facts = {k: np.concatenate([hist[k], v]) for k, v in facts.items()}
        n = len(facts["step"]) - (1 if has_next else 0)
        if n > h:
            blocked = {key[1]: v for key, v in facts.items() if isinstance(key, tuple)}
            cols = columns_from_arrays(facts["step"], facts["start"], facts["end"],
                                       facts["busy"], facts["dep"], blocked, facts["launch"],
                                       self.facts)
            ahead = cols["launch_ahead"][h:n]
            if self.dropped and np.any(ahead == np.arange(h, n)):
                raise RuntimeError("launch-ahead deeper than the streaming history")
            self.sink.add({k: v[h:n] for k, v in cols.items()})
        keep = max(0, n - self.HISTORY)
        self.dropped += keep
        self.hist = {k: v[keep:n] for k, v in facts.items()}

    def _shift(self, by: int) -> None:
        if by <= 0:
            return
        st = self.state
        for key, arr in self._views().items():
            v = np.frombuffer(arr, dtype=np.float64)
            n = len(st.fs)
            v[:n - by] = v[by:n]
            v[n - by:n] = _INF if key == "start" else -_INF if key == "end" else \
                np.nan if key == "launch" else 0.0
            del v
        st.origin += by
        if st.cw >= 0:
            st.cw -= by

    def finish(self, hazards) -> dict:
        self._emit(len(self.state.fs), keep_last=False)
        return self.sink.result(hazards)


class FastRun:
    """The result of :func:`execute`: per-step columns, summary, races."""

    def __init__(self, columns: dict, meta: dict, hazards: FastHazards, segments: int):
        self.columns = columns
        self.meta = meta
        self.hazards = hazards
        self.segments = segments
        self._summary = None

    @property
    def summary(self) -> dict:
        if self._summary is None:
            self._summary = summarize(self.columns, self.meta, self.hazards)
        return self._summary


def _finish(plan: Plan, state: _State, races: _RacePlan, fwd: str) -> FastRun:
    fs = np.frombuffer(state.fs, dtype=np.float64)
    idx = np.flatnonzero(fs < _INF)
    steps = (idx + state.origin).astype(np.int32)
    start = fs[idx]
    end = np.frombuffer(state.fe, dtype=np.float64)[idx]
    nxt = np.append(start[1:], np.nan)
    if state.collect:
        from simwar.analysis.metrics import busy_in_windows

        busy = busy_in_windows(_np(state.kin), _np(state.kout), start, nxt)
        dep = busy_in_windows(_np(state.win), _np(state.wout), start, nxt)
    else:
        busy = np.frombuffer(state.busy, dtype=np.float64)[idx]
        dep = np.frombuffer(state.dep, dtype=np.float64)[idx]
    blocked = {site: np.frombuffer(vals, dtype=np.float64)[idx]
               for site, vals in state.blocked.items()}
    launch = np.frombuffer(state.launch, dtype=np.float64)[idx]
    if len(idx) == 0:  # no forward kernels: no steps (as step_columns of such a trace)
        columns = {"step": np.zeros(0, dtype=np.int32)}
    else:
        columns = columns_from_arrays(steps, start, end, busy, dep, blocked, launch,
                                      StepFacts(plan.meta))
    hazards = races.finish(state)
    out = FastRun(columns, plan.meta, hazards, plan.segments)
    out.paths = ("windowed" if races.windowed else "full",
                 "collect" if state.collect else "stream")
    return out


def _np(a: array) -> np.ndarray:
    return np.frombuffer(a, dtype=np.float64) if len(a) else np.zeros(0)


# =========================================================================== races
@dataclass(frozen=True)
class _RaceTpl:
    """A pair of accesses of a window of shapes, relative to the later access's segment."""

    buffer: str
    kind: str
    latent: bool
    a_back: int  # segments between the earlier access's segment and the later's
    a_dev: int
    a_sub: int  # index of the access within its op (ordering ties)
    a_label: str
    a_lane: str
    a_phase: str
    b_dev: int
    b_sub: int
    b_label: str
    b_lane: str
    b_phase: str


def _pairs(shapes: list, steps: list, window: int, last_only: bool) -> list:
    """The compared access pairs of consecutive segments (``None``: a segment left out).

    ``steps``: each segment's step; ``last_only``: only latent pairs whose later access is in
    the last segment. Runs :func:`~simwar.analysis.hazards.candidate_pairs` on the segments'
    ops; returns ``(pair, earlier segment, later segment)`` in its order.
    """
    lane: list = []
    kind: list = []
    bound: list = []
    where: list[tuple[int, int]] = []  # local op -> (segment, device op)
    acc_op: list[int] = []
    acc_buf: list = []
    acc_mode: list = []
    acc_step: list = []
    acc_sub: list = []
    base: list[int | None] = []
    for j, sh in enumerate(shapes):
        if sh is None:
            base.append(None)
            continue
        b0 = len(lane)
        base.append(b0)
        for dev, op in enumerate(sh.ops):
            bnd = -1
            if op.bound_op is not None:
                bnd = b0 + op.bound_op
            elif op.bind is not None:
                jp = j - op.bind[0]
                if jp >= 0 and shapes[jp] is not None:
                    bnd = base[jp] + shapes[jp].records[op.bind[1]]
            lane.append(op.lane)
            kind.append(op.kind)
            bound.append(bnd)
            where.append((j, dev))
            for sub, (buf, mode) in enumerate(op.accesses):
                acc_op.append(b0 + dev)
                acc_buf.append(buf)
                acc_mode.append(mode)
                acc_step.append(steps[j] + op.off)
                acc_sub.append(sub)
    last = len(shapes) - 1
    out: list = []
    for i, k, latent in candidate_pairs(lane, kind, bound, acc_op, acc_buf, acc_mode, acc_step,
                                        window):
        ja, da = where[acc_op[i]]
        jb, db = where[acc_op[k]]
        if last_only and (jb != last or not latent):
            continue
        a, b = shapes[ja].ops[da], shapes[jb].ops[db]
        out.append((_RaceTpl(acc_buf[k], race_kind(acc_mode[i], acc_mode[k]), latent, jb - ja,
                             da, acc_sub[i], a.label, a.lane, a.phase, db, acc_sub[k], b.label,
                             b.lane, b.phase), ja, jb))
    return out


#: latent pairs per window of shapes (a window's pairs depend on its shapes only)
_WINDOWS: dict = {}


class _RacePlan:
    """Which pairs to check where, which op times to log, and the races once run.

    *Windowed* (the program's steps are consecutive segments and every access belongs to
    its segment's step): pairs per distinct window of ``window + 1`` shapes, mapped onto
    segments; only latent pairs are kept, and only their ops' times are logged.
    *Full* (anything else): every access op's times are logged and all pairs are compared
    over the whole program, as :func:`~simwar.analysis.hazards.detect` does on a Trace.
    """

    def __init__(self, plan: Plan, window: int):
        self.plan = plan
        self.window = window
        blocks = plan.blocks
        self.op_base: list[int] = []
        base = 0
        for b in blocks:
            self.op_base.append(base)
            base += b.n * len(b.shape.ops)
        marked = [b for b in blocks if b.marked]
        consecutive = all(isinstance(b.steps, range) for b in marked) and all(
            x.steps[-1] + 1 == y.steps[0] for x, y in zip(marked, marked[1:]))
        prefix_ok = all(b.marked or not any(op.accesses for op in b.shape.ops) for b in blocks)
        self.windowed = (not plan.negative and plan.offsets <= {0} and consecutive
                         and prefix_ok)
        self.logs: list[list[tuple[int, str]]] = [[] for _ in blocks]
        self.groups: list[tuple] = []  # (block, first pass, count, pairs)
        self.cache = _WINDOWS
        if self.windowed:
            self._plan_windows()
        else:
            for bi, b in enumerate(blocks):
                self.logs[bi] = sorted({(d, w) for d, op in enumerate(b.shape.ops)
                                        if op.accesses for w in "se"})
        self.arrays: list[list[array]] = []

    # ---- planning
    def _segment(self, g: int) -> tuple[int, int]:
        """(block, pass) of segment ``g``."""
        lo, hi = 0, len(self.plan.blocks) - 1
        blocks = self.plan.blocks
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if blocks[mid].g0 <= g:
                lo = mid
            else:
                hi = mid - 1
        return lo, g - blocks[lo].g0

    def _shape_at(self, g: int):
        if g < 0:
            return None
        bi, _ = self._segment(g)
        b = self.plan.blocks[bi]
        return b.shape if b.marked else None

    def _plan_windows(self) -> None:
        w = self.window
        need: list[set] = [set() for _ in self.plan.blocks]
        for bi, b in enumerate(self.plan.blocks):
            if not b.marked:
                continue
            parts = [(i, 1) for i in range(min(b.n, w))]
            if b.n > w:
                parts.append((w, b.n - w))
            for i, count in parts:
                g = b.g0 + i
                key = tuple(self._shape_at(g - w + j) for j in range(w + 1))
                tpls = self.cache.get((key, w))
                if tpls is None:
                    tpls = [r for r, _, _ in _pairs(list(key), list(range(w + 1)), w, True)]
                    if len(self.cache) >= _CODE_LIMIT:
                        self.cache.clear()
                    self.cache[(key, w)] = tpls
                if not tpls:
                    continue
                self.groups.append((bi, i, count, tpls))
                for r in tpls:
                    need[bi].add((r.b_dev, "s"))
                    abi, _ = self._segment(g - r.a_back) if i < w else (bi, None)
                    need[abi].add((r.a_dev, "e"))
        self.logs = [sorted(x) for x in need]

    def logs_of(self, bi: int) -> tuple:
        return tuple(self.logs[bi])

    def reset(self) -> None:
        self.arrays = [[array("d") for _ in log] for log in self.logs]

    def log_arrays(self, bi: int) -> list:
        return self.arrays[bi]

    def _log(self, bi: int, dev: int, what: str) -> np.ndarray:
        arr = self.arrays[bi][self.logs[bi].index((dev, what))]
        return np.frombuffer(arr, dtype=np.float64) if len(arr) else np.zeros(0)

    # ---- results
    def finish(self, state) -> FastHazards:
        if self.windowed:
            return self._finish_windowed()
        return self._finish_full()

    def _finish_windowed(self) -> FastHazards:
        w = self.window
        blocks = self.plan.blocks
        rows = []
        for bi, i, count, tpls in self.groups:
            b = blocks[bi]
            nops = len(b.shape.ops)
            b_step = b.steps[0] + i
            for r in tpls:
                s_b = self._log(bi, r.b_dev, "s")[i:i + count]
                if i >= w:  # the earlier access is in the same block
                    e_a = self._log(bi, r.a_dev, "e")[i - r.a_back:i - r.a_back + count]
                    a_op = self.op_base[bi] + (i - r.a_back) * nops + r.a_dev
                else:
                    abi, ap = self._segment(b.g0 + i - r.a_back)
                    e_a = self._log(abi, r.a_dev, "e")[ap:ap + 1]
                    a_op = self.op_base[abi] + ap * len(blocks[abi].shape.ops) + r.a_dev
                rows.append(_Rows(r, b_step - r.a_back, b_step, a_op,
                                  self.op_base[bi] + i * nops + r.b_dev, nops, e_a - s_b))
        return FastHazards(rows, self._buffer_order(), self.plan.lo, self.plan.hi)

    def _finish_full(self) -> FastHazards:
        blocks = self.plan.blocks
        shapes: list = []
        steps: list = []
        for b in blocks:
            shapes += [b.shape] * b.n
            steps += list(b.steps)
        seg_block = [bi for bi, b in enumerate(blocks) for _ in range(b.n)]
        seg_pass = [i for b in blocks for i in range(b.n)]
        rows = []
        for r, ga, gb in _pairs(shapes, steps, self.window, False):
            e_a = self._log(seg_block[ga], r.a_dev, "e")[seg_pass[ga]]
            s_b = self._log(seg_block[gb], r.b_dev, "s")[seg_pass[gb]]
            overlap = float(e_a - s_b)
            if not r.latent and overlap <= 0:
                continue
            a_op = self.op_base[seg_block[ga]] + seg_pass[ga] * len(shapes[ga].ops) + r.a_dev
            b_op = self.op_base[seg_block[gb]] + seg_pass[gb] * len(shapes[gb].ops) + r.b_dev
            rows.append(_Rows(r, steps[ga] + shapes[ga].ops[r.a_dev].off,
                              steps[gb] + shapes[gb].ops[r.b_dev].off, a_op, b_op, 0,
                              np.array([overlap])))
        return FastHazards(rows, self._buffer_order(), self.plan.lo, self.plan.hi)

    def _buffer_order(self) -> dict:
        """Buffer -> (op id, access index) of its first access: the engine lists races so."""
        first: dict = {}
        for bi, b in enumerate(self.plan.blocks):
            for dev, op in enumerate(b.shape.ops):
                for sub, (buf, _) in enumerate(op.accesses):
                    here = (self.op_base[bi] + dev, sub)
                    if buf not in first or here < first[buf]:
                        first[buf] = here
        return first


class _Rows:
    """Races of one pair of a window over consecutive segments, as progressions.

    Race ``j`` (``0 <= j < len(overlap)``): steps ``a_step + j`` and ``b_step + j``, ops
    ``a_op + j * stride`` and ``b_op + j * stride``, overlap ``overlap[j]`` (> 0: observed).
    """

    __slots__ = ("pair", "a_step", "b_step", "a_op", "b_op", "stride", "overlap")

    def __init__(self, pair: _RaceTpl, a_step: int, b_step: int, a_op: int, b_op: int,
                 stride: int, overlap: np.ndarray):
        self.pair = pair
        self.a_step, self.b_step = int(a_step), int(b_step)
        self.a_op, self.b_op = int(a_op), int(b_op)
        self.stride = int(stride)
        self.overlap = overlap

    def __len__(self) -> int:
        return len(self.overlap)

    def within(self, first: int, last: int | None = None) -> _Rows | None:
        """The races whose two accesses belong to steps ``first..last`` (None: no end)."""
        # both accesses' steps advance with j (a hand-made program may label the earlier
        # access with the later step)
        j0 = max(0, first - self.a_step, first - self.b_step)
        j1 = len(self.overlap)
        if last is not None:
            j1 = min(j1, last - self.a_step + 1, last - self.b_step + 1)
        if j0 >= j1:
            return None
        if j0 == 0 and j1 == len(self.overlap):
            return self
        return _Rows(self.pair, self.a_step + j0, self.b_step + j0,
                     self.a_op + j0 * self.stride, self.b_op + j0 * self.stride, self.stride,
                     self.overlap[j0:j1])

    def race(self, j: int) -> Race:
        r = self.pair
        ov = float(self.overlap[j])
        return Race(r.buffer, r.kind, self.a_step + j, r.a_phase, r.a_lane, r.a_label,
                    self.a_op + j * self.stride, self.b_step + j, r.b_phase, r.b_lane,
                    r.b_label, self.b_op + j * self.stride, r.latent, ov if ov > 0 else 0.0)

    def picks(self, which: str):
        """Indices of the races that are ``all``, ``latent`` or ``observed`` (a range or an
        array)."""
        if which == "observed":
            return np.flatnonzero(self.overlap > 0)
        if which == "latent" and not self.pair.latent:
            return range(0)
        return range(len(self.overlap))


class FastHazards:
    """Races of a one-pass run, kept as progressions; counted without building them.

    Quacks like :class:`~simwar.analysis.hazards.HazardReport`: ``races`` (the engine's
    list, in its order), ``latent`` and ``observed`` (sequences whose length, truth and
    first items cost no more than they show), ``since(step)``, ``within(steps)``,
    ``frame()``; and adds ``counts(first_step, last_step)`` for the summary.
    """

    def __init__(self, rows: list[_Rows], buffer_order: dict, lo: int, hi: int):
        self.rows = rows
        self.buffer_order = buffer_order
        self.rank = {buf: n for n, buf in enumerate(sorted(buffer_order,
                                                           key=buffer_order.get))}
        self.lo, self.hi = lo, hi
        self._races: list[Race] | None = None

    def counts(self, first: int, last: int) -> tuple[int, int, int]:
        """``(races, overlaps, race steps)`` of the races within steps ``first..last``."""
        races = overlaps = 0
        seen = np.zeros(max(0, self.hi - self.lo + 1), dtype=bool)
        for row in self.rows:
            row = row.within(first, last)
            if row is None:
                continue
            if row.pair.latent:
                races += len(row)
                seen[row.b_step - self.lo:row.b_step - self.lo + len(row)] = True
            overlaps += int(np.count_nonzero(row.overlap > 0))
        return races, overlaps, int(np.count_nonzero(seen))

    def since(self, step: int) -> FastHazards:
        """Only races whose two accesses belong to steps >= ``step`` (as HazardReport)."""
        rows = [r for r in (row.within(step) for row in self.rows) if r is not None]
        return FastHazards(rows, self.buffer_order, self.lo, self.hi)

    def within(self, steps) -> FastHazards:
        """Only races whose two accesses belong to ``steps`` (consecutive steps)."""
        steps = sorted(steps)
        if not steps:
            return FastHazards([], self.buffer_order, self.lo, self.hi)
        rows = [r for r in (row.within(steps[0], steps[-1]) for row in self.rows)
                if r is not None]
        return FastHazards(rows, self.buffer_order, self.lo, self.hi)

    def _key(self, row: _Rows, j: int) -> tuple:
        r = row.pair
        return (self.rank[r.buffer], row.b_op + j * row.stride, r.b_sub,
                -(row.a_op + j * row.stride), -r.a_sub)

    def _ordered(self, which: str):
        """Races in the engine's order (per buffer, by later op, then earlier op nearest)."""
        import heapq

        def each(row: _Rows):
            picks = row.picks(which)
            for n in range(0, len(picks), 4096):  # lazily: a long run has millions
                part = picks[n:n + 4096]
                for j in (part if isinstance(part, range) else part.tolist()):
                    yield self._key(row, j), j, row

        return (row.race(j) for _, j, row in heapq.merge(*(each(r) for r in self.rows),
                                                         key=lambda item: item[0]))

    @property
    def races(self) -> list[Race]:
        if self._races is None:
            self._races = list(self._ordered("all"))
        return self._races

    @property
    def latent(self) -> _RaceList:
        return _RaceList(self, "latent")

    @property
    def observed(self) -> _RaceList:
        return _RaceList(self, "observed")

    def report(self) -> HazardReport:
        return HazardReport(list(self.races))

    def frame(self):
        return self.report().frame()


class _RaceList:
    """The latent or observed races of a :class:`FastHazards`, built only as far as read."""

    def __init__(self, hazards: FastHazards, which: str):
        self.hazards = hazards
        self.which = which

    def __len__(self) -> int:
        return sum(len(row.picks(self.which)) for row in self.hazards.rows)

    def __bool__(self) -> bool:
        return any(len(row.picks(self.which)) for row in self.hazards.rows)

    def __iter__(self):
        return self.hazards._ordered(self.which)

    def __getitem__(self, index):
        if isinstance(index, slice) and (index.start or 0) == 0 and index.step in (None, 1) \
                and index.stop is not None and index.stop >= 0:
            import itertools

            return list(itertools.islice(iter(self), index.stop))
        return list(self)[index]

    def __eq__(self, other) -> bool:
        return list(self) == list(other)

    def __repr__(self) -> str:
        return f"<{len(self)} {self.which} races>"


# =========================================================================== entry points
def realize(cfg, sizes, model) -> None:
    """Fix a feedback workload's per-step sizes by running the config one iteration at a time.

    Before iteration ``k`` (the drain is ``steps``) the host clock at its step marker is
    read and ``model.schedule(k, t)`` fixes ``sizes`` for step k (see
    :mod:`simwar.build.sizes`); iteration k's durations are then evaluated and it runs. An
    iteration only uses the sizes of steps <= its own, so what already ran stays valid: the
    sizes realized are exactly those a run of the finished arrays reproduces.
    """
    plan = plan_config(cfg, sizes, fill=False)
    table = plan.table
    steps = cfg.steps

    def before(k: int, t: float) -> None:
        if k < steps:
            model.schedule(k, t)
        if table is not None:
            table.fill(k, k + 1)

    execute(plan, before_pass=before)
    model.finish_run()


def run_config(cfg, sizes, window: int = 2, summary_only: bool = False) -> FastRun:
    """Simulate a config in one pass at its per-step ``sizes`` (arrivals realized:
    :func:`simwar.api.resolve_sizes`); its Program is never built."""
    try:
        plan = plan_config(cfg, sizes)
    except RuntimeError:  # iterations that never settle into one shape: take the Program
        plan = plan_program(build_program(cfg, sizes))
    return execute(plan, window, summary_only=summary_only)


def run(program: Program, window: int = 2) -> FastRun:
    """Simulate any Program in one pass: the per-step columns, summary and races."""
    return execute(plan_program(program), window)
