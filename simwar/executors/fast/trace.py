"""The fast executor's trace mode: a run as a stream of Trace windows, equal to the engine's.

A Trace costs ~2.5 KiB per step and the SimPy engine ~150 µs per step; an export or an
explanation of a long run wants neither. Here the plan's blocks run compiled in trace mode
(:func:`simwar.executors.fast.codegen.compile_block` with ``trace=True``: the same rules,
each segment appending every time it computes), a chunk of segments at a time, and each
chunk becomes a :class:`~simwar.core.trace.TraceWindow`: the ops, spans, accesses and
markers of those segments, as the SimPy engine records them (the same
:func:`simwar.core.recorder.assemble` orders them), after ``margin`` earlier segments of
context. Memory is one chunk, whatever the run's length.

**Names.** A shape is a segment's structure without its names: a record's event, a graph
launch's name, CPU work's label and step. Those come from the host ops the shape was made
from (``Plan.skeleton``): a Program's segments name themselves; a config's plan repeats a
skeleton iteration for many steps, so its names must be templates of the step
(:class:`simwar.core.program.StepName`, which the builder and the barrier policies use).
A plain name that changes between alike skeleton iterations (a barrier registered outside
simwar that formats its own step numbers) is refused with :class:`TraceUnsupported`, as is
a named marker other than ``run_batch`` and ``result_done`` (shapes keep no other);
callers then take the SimPy engine.

:func:`join` puts a run's windows back together into one Trace, which
``tests/test_trace_stream.py`` holds equal, column by column, to the SimPy engine's on
every shipped config, stochastic and varying workloads and random programs.

Imports: numpy, simwar.core and the executor's plan and codegen.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from simwar.core.program import (
    CpuWork,
    GraphLaunch,
    GraphRecord,
    Marker,
    Record,
    StepName,
    Synchronize,
    WaitEvent,
)
from simwar.core.refusals import PlanRefused
from simwar.core.trace import HOST, TraceWindow
from simwar.executors.fast.codegen import compile_block
from simwar.executors.fast.plan import MARKS, Plan
from simwar.executors.fast.tracecols import Named, _Layout, _Piece, _window, join

__all__ = ["TraceUnsupported", "Stream", "windows", "join", "lanes", "meta", "CHUNK"]

#: segments per window (a window of dspark_fine is ~10 MiB of columns)
CHUNK = 2048
_INF = float("inf")


class TraceUnsupported(PlanRefused):
    """The plan cannot be traced in one pass (see the module docstring): use the engine."""


def lanes(plan: Plan) -> list[str]:
    """Every lane the plan's run records anything on (the host's first)."""
    out = {HOST: None}
    for b in plan.blocks:
        for op in b.shape.ops:
            out.setdefault(op.lane)
    return list(out)


def meta(plan: Plan) -> dict:
    """The run facts its Trace (and each window) carries."""
    out = dict(plan.meta)
    out.setdefault("source", "sim")
    return out


# --------------------------------------------------------------------------- names
def _facts(ops) -> list:
    """What a segment's shape leaves out, in host-op order: per CPU work its label and step,
    per graph launch its name, phase and record-node events, per record, wait_event and
    synchronize its event."""
    out: list = []
    for op in ops:
        kind = type(op)
        if kind is CpuWork:
            out.append(op.label)
            out.append(op.step)
        elif kind is GraphLaunch:
            out.append(op.graph)
            out.append(op.phase)
            out.extend(n.event for n in op.nodes if type(n) is GraphRecord)
        elif kind is Record or kind is WaitEvent or kind is Synchronize:
            out.append(op.event)
        elif kind is Marker and op.name not in MARKS:
            raise TraceUnsupported(f"marker '{op.name}': the fast executor's shapes keep "
                                   f"{' and '.join(MARKS)} markers only")
    return out


class _Names:
    """The facts of a block's segments: per slot a constant, or a template of the step."""

    def __init__(self, plan: Plan, bi: int):
        b = plan.blocks[bi]
        self.per_segment = plan.skeleton_steps is None  # a Program: every segment its own
        self.plan, self.block = plan, b
        self._step_offsets: dict[str, tuple[int, int]] | None = None
        if self.per_segment:
            for ops in plan.skeleton[b.source:b.source + b.n]:
                for op in ops:
                    if type(op) is Marker and op.name not in MARKS:
                        raise TraceUnsupported(f"marker '{op.name}': the fast executor's "
                                               f"shapes keep {' and '.join(MARKS)} markers "
                                               f"only")
            return
        base = plan.skeleton_steps[b.source]
        facts = _facts(plan.skeleton[b.source])
        self.slots = [self._slot(x, base) for x in facts]
        # per template of the step, the lowest and highest offset its slots name (None: no
        # template of the step), and its names' parts (see _numbered)
        offsets: dict[str, tuple[int, int]] = {}
        self._parts: dict[str, tuple | None] = {}
        for slot in self.slots:
            if slot[0] == "name" and slot[2] == "step":
                lo, hi = offsets.get(slot[1], (slot[3], slot[3]))
                offsets[slot[1]] = (min(lo, slot[3]), max(hi, slot[3]))
                self._parts[slot[1]] = _parts(slot[1])
        self._step_offsets = offsets or None
        # the skeleton iterations of this shape must all follow the templates
        for i, ops in enumerate(plan.skeleton):
            if i == b.source or plan.skeleton_shapes[i] != b.shape:
                continue
            got = _facts(ops)
            want = self._at(plan.skeleton_steps[i])
            if got != want or any(type(x) is int and type(y) is not int
                                  for x, y in zip(got, want)):
                raise TraceUnsupported("a name changes with the step without a template "
                                       "(simwar.core.program.StepName)")

    def lowest_cpu_step(self, slots: list[int], steps: np.ndarray) -> np.ndarray:
        """Per pass, the lowest step of its CPU work (``slots``: the CPU steps' fact slots)."""
        if not self.per_segment:
            return steps + min(self.slots[j][1] for j in slots)
        g = self.block.source
        rows = [_facts(ops) for ops in self.plan.skeleton[g:g + self.block.n]]
        return np.asarray([min(r[j] for j in slots) for r in rows], dtype=np.float64)

    def _slot(self, x, base: int):
        if isinstance(x, StepName):
            return ("name", x.template, x.key, x.step - base)
        if type(x) is int:  # a CPU work's step
            return ("step", x - base)
        return ("const", x)

    def _at(self, step: int) -> list:
        bucket = getattr(self.plan.sizes, "bucket", None)
        out = []
        for slot in self.slots:
            if slot[0] == "const":
                out.append(slot[1])
            elif slot[0] == "step":
                out.append(step + slot[1])
            else:
                k = step + slot[3]
                out.append(slot[1].format(k if slot[2] == "step" else int(bucket[k])))
        return out

    def columns(self, i0: int, n: int, steps: np.ndarray) -> list:
        """Per slot, the values of passes ``i0 .. i0+n`` (a constant, or a list)."""
        if self.per_segment:
            g = self.block.source + i0
            rows = [_facts(ops) for ops in self.plan.skeleton[g:g + n]]
            return [list(col) for col in zip(*rows)] if rows and rows[0] else []
        bucket = getattr(self.plan.sizes, "bucket", None)
        out = []
        ks = steps.tolist()
        by_step = self._by_step(steps, ks)
        for slot in self.slots:
            if slot[0] == "const":
                out.append(slot[1])
            elif slot[0] == "step":
                out.append(steps + slot[1])
            else:
                fmt, off = slot[1].format, slot[3]
                if slot[2] == "step" and by_step is not None:
                    names, lo = by_step[slot[1]]
                    names = names[off - lo:off - lo + n]
                    parts = self._parts[slot[1]]
                    if parts is not None and ks[0] + off >= 0:  # coded by their steps
                        names = Named(names, parts[0], parts[2], ks[0] + off)
                    out.append(names)
                elif slot[2] == "step":  # mapped at C speed: a name per pass
                    out.append(list(map(fmt, (steps + off).tolist())))
                else:
                    out.append([fmt(int(bucket[k + off])) for k in ks])
        return out

    def _by_step(self, steps: np.ndarray, ks: list[int]) -> dict | None:
        """Per template of the step, its names over the passes' steps, each step once:
        ``(names, lowest offset)``, the name of step ``ks[0] + lowest offset + j`` at ``j``.
        Slots of one template a step apart (``copy_done[k]`` and ``copy_done[k-1]``) share
        the names, made once (and coded at once: the same objects). None where the passes'
        steps are not consecutive (each slot formats its own)."""
        if self._step_offsets is None or not ks or not bool(np.all(np.diff(steps) == 1)):
            return None
        first, last = ks[0], ks[-1]
        return {template: (_numbered(template, self._parts[template], first + lo, last + hi),
                           lo) for template, (lo, hi) in self._step_offsets.items()}


def _parts(template: str) -> tuple | None:
    """A template's names as parts (:func:`_numbered`): its text before its one plain field,
    per two last digits of a number those digits and its text after the field, and its text
    after the field; None where ``template.format(k)`` is not that text around ``str(k)``
    (another field, a format spec, an escaped brace)."""
    parts = template.split("{}")
    if len(parts) != 2 or any("{" in p or "}" in p for p in parts):
        return None
    return parts[0], [f"{r:02d}{parts[1]}" for r in range(100)], parts[1]


def _numbered(template: str, parts: tuple | None, lo: int, hi: int) -> list[str]:
    """``template.format(k)`` for the steps ``k`` from ``lo`` to ``hi``, the same texts made
    by one concatenation each: a hundred consecutive numbers of 3 digits or more share
    their text but the last two digits (``str`` of an int, as ``format`` writes it, costs
    a formatting per name)."""
    if parts is None or lo < 100:
        return list(map(template.format, range(lo, hi + 1)))
    head, tails, _ = parts
    h0 = lo // 100
    base = h0 * 100
    heads = [head + str(h) for h in range(h0, hi // 100 + 1)]
    return [h + t for h in heads for t in tails][lo - base:hi + 1 - base]


def windows(plan: Plan, *, chunk: int = CHUNK, margin: int = 0,
            steps: tuple[int, int] | None = None) -> Iterator[TraceWindow]:
    """The plan's run as Trace windows of ``chunk`` segments, each after ``margin`` earlier
    segments of context, at least as many as a wait or sync binds back (see
    :class:`~simwar.core.trace.TraceWindow`).

    ``steps`` (A, B): only the windows whose core holds spans or ops of steps A..B (the run
    goes on only as far as it must). Raises :class:`TraceUnsupported` for a plan whose names
    are not templates.
    """
    fns = _trace_fns(plan)
    return Stream(plan, fns, chunk=chunk, margin=margin, steps=steps).alone(fns)


def stream(plan: Plan, *, chunk: int = CHUNK, margin: int = 0,
           steps: tuple[int, int] | None = None) -> Stream:
    """The :class:`Stream` of the windows :func:`windows` makes, for a run's own pass to
    make them (:func:`simwar.executors.fast.execute.run_plan`'s ``trace``)."""
    return Stream(plan, _trace_fns(plan), chunk=chunk, margin=margin, steps=steps)


def _trace_fns(plan: Plan) -> list:
    """Each block's function in the trace mode alone (rows only)."""
    fwd = plan.meta.get("forward_stream", "forward")
    return [compile_block(b.shape, tuple(c is None for c in b.consts), fwd, False, (),
                          plan.depth, trace=True) for b in plan.blocks]


class Stream:
    """The windows of a run, made a chunk of ``chunk`` segments at a time as its pass runs
    them (each segment writing its row of times into ``state.trace``: :meth:`rows`), each
    after ``margin`` earlier segments of context (see :func:`windows`).

    Two passes drive it: its own (:meth:`alone`, the trace mode's functions, nothing else
    kept: :func:`windows`), or a run's (:func:`simwar.executors.fast.execute.run_plan`'s
    ``trace``: functions compiled with the trace mode's rows *and* the run's sums, so that
    one pass makes the run's summary and its trace). Either calls :meth:`rows` before a
    chunk of a block's passes and :meth:`piece` after it, in order, on the same ``state``
    (:meth:`attach`). ``fns``: each block's compiled function, for its rows' layout (the
    same in both kinds).
    """

    def __init__(self, plan: Plan, fns: list, *, chunk: int = CHUNK, margin: int = 0,
                 steps: tuple[int, int] | None = None):
        blocks = plan.blocks
        self.plan, self.chunk, self.steps = plan, chunk, steps
        # a core op's bound record is always in its window
        self.margin = max(margin, plan.depth)
        self.layouts = [_Layout(b.shape, fn.layout) for b, fn in zip(blocks, fns)]
        # the values a row leaves out (codegen's ``fn.derived``), added after each chunk
        self.derived = [fn.derived for fn in fns]
        self.consts = [tuple(c for c in b.consts if c is not None) for b in blocks]
        self.names = [_Names(plan, bi) for bi in range(len(blocks))]
        run = {"plan": plan, "layouts": self.layouts}
        op_base = []
        base = 0
        for b, lay in zip(blocks, self.layouts):
            op_base.append(base)
            base += b.n * lay.ndev
        self.op_base = op_base
        self.lows = _lowest_steps(plan, self.layouts, self.names)
        run.update(op_base=op_base, g0s=[b.g0 for b in blocks], meta=meta(plan),
                   # alike windows' columns made once (tracecols._Reuse): where every name
                   # is a template of the step (a Program's segments name themselves)
                   reuse=[] if plan.skeleton_steps is not None else None)
        self.run = run
        self.kept: list[_Piece] = []  # the margin: the last pieces' last segments
        self.finished = False  # past the steps asked for: no more windows
        self.attach(_TraceState(plan.depth))

    @property
    def lanes(self) -> list[str]:
        """Every lane the run records anything on (:func:`lanes`)."""
        return lanes(self.plan)

    @property
    def meta(self) -> dict:
        """The run's facts (:func:`meta`)."""
        return meta(self.plan)

    def attach(self, state) -> None:
        """The state the pass runs on (the host clock, the tails and the rows)."""
        self.state = self.run["state"] = state

    def rows(self, bi: int, n: int) -> None:
        """Before a chunk of ``n`` passes of block ``bi``: the rows its segments write."""
        self.state.trace = np.empty((n, self.layouts[bi].nvalues))

    def piece(self, bi: int, start: int, stop: int, cols: list) -> TraceWindow | None:
        """After passes ``start..stop`` of block ``bi`` ran (``cols``: their parameter
        columns): the window whose core they are, where one is wanted (None else)."""
        if self.finished:
            return None
        plan, steps, lows = self.plan, self.steps, self.lows
        b, lay, names = plan.blocks[bi], self.layouts[bi], self.names[bi]
        _derive(self.state.trace, self.derived[bi], self.consts[bi], cols)
        last_block = len(plan.blocks) - 1
        n = stop - start
        ks = b.steps[start:stop]
        # (numpy reads a range a number at a time: its arange is the same array)
        seg_steps = (np.arange(ks.start, ks.stop, ks.step, dtype=np.int64)
                     if isinstance(ks, range) else np.asarray(list(ks), dtype=np.int64))
        if not b.marked:
            seg_steps = np.zeros(n, dtype=np.int64)
        is_last = bi == last_block and stop == b.n
        below = lows[bi][stop] if stop < b.n else (lows[bi + 1][0] if bi < last_block
                                                   else _INF)
        lo_here = lows[bi][start]
        wanted = steps is None or (lo_here <= steps[1]
                                   and _highest(b, lay, names, start, stop) >= steps[0])
        piece = _Piece(bi, start, n, self.state.trace, names.columns(start, n, seg_steps),
                       self.op_base[bi] + start * lay.ndev, seg_steps,
                       _idle(plan, b, lay, cols))
        window = _window(self.run, self.kept, piece, self.state.t, below, is_last) \
            if wanted or is_last else None
        self.kept = _keep(self.kept + [piece], self.margin, self.layouts)
        if steps is not None and below > steps[1]:
            self.finished = True
        return window

    def alone(self, fns: list) -> Iterator[TraceWindow]:
        """The trace mode's own pass (``fns``: its functions, rows only): the windows as it
        makes them, as far as the steps asked for."""
        state = self.state
        for bi, b in enumerate(self.plan.blocks):
            fn, consts = fns[bi], self.consts[bi]
            any_col = any(c is None for c in b.consts)
            for start in range(0, b.n, self.chunk):
                stop = min(b.n, start + self.chunk)
                cols = b.columns(start, stop) if any_col else []
                self.rows(bi, stop - start)
                fn(range(stop - start), consts, cols, state)
                window = self.piece(bi, start, stop, cols)
                if window is not None:
                    yield window
                if self.finished:
                    return


def _derive(vals: np.ndarray, derived: tuple, consts: tuple, cols: list) -> None:
    """The values the block's rows leave out (codegen's ``fn.derived``: a host clock, the
    clock it follows plus the costs added since; a kernel's end, its start plus its
    duration), each added in order (float64 additions, as the block's own)."""
    add = np.add
    for j, base, costs in derived:
        v, out = vals[:, base], vals[:, j]
        for kind, i in costs:  # into the column itself: no array made per addition
            add(v, consts[i] if kind == "k" else np.asarray(cols[i], dtype=np.float64), out=out)
            v = out


def _idle(plan: Plan, b, lay: _Layout, cols: list) -> dict:
    """CPU work of a config's block whose drawn duration is not positive, per pass."""
    if plan.skeleton_steps is None or not lay.cpu_params:
        return {}
    where = {j: i for i, j in enumerate(j for j, c in enumerate(b.consts) if c is None)}
    return {span: np.asarray(cols[where[j]]) <= 0 for span, j in lay.cpu_params.items()
            if j in where}


def _keep(pieces: list[_Piece], margin: int, layouts) -> list[_Piece]:
    out: list[_Piece] = []
    need = margin
    for p in reversed(pieces):
        if need <= 0:
            break
        take = min(need, p.n)
        out.append(p if take == p.n else p.tail(take, layouts[p.bi].ndev))
        need -= take
    return out[::-1]


class _TraceState:
    """What the trace-mode block functions read and write (codegen's ``S``)."""

    def __init__(self, depth: int):
        self.t = 0.0
        self.tails: dict[str, float] = {}
        self.hist = [()] * depth
        # the rows the block writes (codegen's trace mode): a new array per chunk (a window
        # keeps its margin's rows)
        self.trace = np.empty((0, 0))


def _lowest_steps(plan: Plan, layouts, names) -> list:
    """Per block, per pass (and one past the end): the lowest step any segment from that
    pass on issues a span or op of (so the steps below it are complete)."""
    out = []
    later = _INF
    for bi in range(len(plan.blocks) - 1, -1, -1):
        b, lay = plan.blocks[bi], layouts[bi]
        offs = [h[6] for h in lay.hs if not isinstance(h[6], tuple)] + [o[2] for o in lay.ops]
        offs += [m[0] for m in lay.marks]
        steps = np.asarray(list(b.steps) if b.marked else [0] * b.n, dtype=np.float64)
        low = steps + min(offs, default=0)
        cpu = [h[6][1] for h in lay.hs if isinstance(h[6], tuple)]
        if cpu:  # CPU work names its own step (a fact)
            low = np.minimum(low, names[bi].lowest_cpu_step(cpu, steps))
        suffix = np.minimum.accumulate(low[::-1])[::-1] if len(low) else low
        suffix = np.minimum(suffix, later)
        out.append(np.append(suffix, later))
        later = float(suffix[0]) if len(suffix) else later
    return out[::-1]


def _highest(b, lay: _Layout, names: _Names, start: int, stop: int) -> float:
    """The highest step passes ``start..stop`` of block ``b`` issue anything of."""
    offs = [h[6] for h in lay.hs if not isinstance(h[6], tuple)] + [o[2] for o in lay.ops]
    cpu = [h[6][1] for h in lay.hs if isinstance(h[6], tuple)]
    if cpu:
        if names.per_segment:
            return _INF
        offs += [names.slots[j][1] for j in cpu]
    steps = b.steps[start:stop] if b.marked else [0]
    return max(steps) + max(offs, default=0)
