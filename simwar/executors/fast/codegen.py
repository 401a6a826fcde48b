"""Compiling a shape into the straight-line Python function that runs a block of it.

:func:`compile_block` generates the source of ``block(KS, K, C, S)`` for a
:class:`~simwar.executors.fast.plan.Shape` and compiles it once (cached per process, by
the shape and the way it is run): one loop over the block's segments whose body is the
shape's host ops in order, each device op placed by :mod:`simwar.core.rules` (``begins``,
``released``, ``returns``: the functions the SimPy engine calls) on local variables, with
no per-op objects. The scalar targets carry those rules written out rather than calls
(:mod:`simwar.executors.fast.inline` derives the text from their definitions: the same
operations, the call's cost saved a few times per op). ``KS`` are the segments' step
indices (relative to the state's origin), ``K`` the block's constant parameters, ``C`` its
parameter columns, in slot order.

**Two targets**, one text. The *scalar* target (the fast executor) runs one run: each
variable (the host clock, a stream's tail, an op's start) is a float. The *array* target
(:mod:`simwar.executors.lockstep`) runs many runs at once: each of those variables is an
array of one element per run, each rule its form over arrays (``begins_many``,
``released_many``, ``returns_many``), the same operations in the same order, element by
element, so every run's numbers are the scalar target's, bit for bit. What is structure
(the step window being summed, which step a fact goes to) is the same for every run of a
group, so it stays plain Python on integers in both. The targets differ only where
:class:`Target` says: the rules bound, how a held wait adds to the window, how a pass reads
its parameter columns (the array target: one 2-d array per column, a row per pass); the
array target has no ``collect`` and no trace mode. Its *picked* form is the same text where
the per-step arrays' rows are read and written back rather than views (the runs of a group
picked out of the state's: :mod:`simwar.executors.lockstep.shapes`).

A third, the *lanes* target (:mod:`simwar.executors.lockstep.ranks`: tensor-parallel
ranks), is the scalar text once per lane, each lane's names its own (``t_0``, ``t_1``),
every lane's state the scalar target's (:func:`_unrolled`). Collectives (a shape's host
collective, a graph's collective kernel) are ops of the ranks only, so of the lanes target
only: each is its rule of :mod:`simwar.core.rules` applied at the last rank's arrival;
their arrival and leaving times are appended to each lane's ``S.colls``.

``S`` is the run's state (:mod:`simwar.executors.fast.execute` makes it; the array target's:
:class:`simwar.executors.lockstep.execute.State`); the function reads and writes back its
attributes: the host clock ``t``, the stream tails ``tails``, the record times of earlier
segments ``hist``, the per-step accumulators ``fs``, ``fe``, ``launch``, ``done``,
``blocked`` and either ``busy``, ``dep``, ``cw``, ``cl``, ``w``, ``dp``, ``bad`` (step
windows, from one forward's end to the next's, summed as it goes) or ``kin``, ``kout``,
``win``, ``wout`` (forward-stream intervals collected), and appends the logged op times to
``logs``. In the array target every value an op gives is a new array (a value appended to a
log or kept in a tail stays what it was); only the host clock and the window's sums, which
nothing else holds, are added to in place (numpy's ``add`` with its output given: the sums
the rows of one array of the block's own, zeroed in one call as a window closes, each
difference made in a scratch row; where a segment closes one window, at its own step, after
every sum it adds to, the sums are added in the rows of ``busy`` and ``dep`` that the window
closes, with nothing to copy or zero; a sync's blocked time in its row likewise), and an
op's ``begins`` on a tail set since the host
clock last moved (so at or after it) is that tail, with no call: numpy's calls, a few
hundred ns each whatever a group's size, are what a lockstep step costs.

**Trace mode** (``trace=True``, :mod:`simwar.executors.fast.trace`): the same rules on the
same locals, no accumulators and no logs; each segment writes every time it computes into
``S.trace`` (a C-contiguous float64 array of a row per segment, the rows packed in order,
by ``struct``: a call per row, half the cost of a list extended and made an array), in the
order ``fn.layout`` names:
``("h", i)`` the host clock after host op ``i`` (``("h", -1)``: at the segment's start),
``("s", d)``/``("e", d)`` a kernel's or a wait's start and end (a wait: reached, released),
``("r", d)`` a record's firing. A value that is one kept plus parameters (a host clock: an
earlier one plus the host costs added since; a kernel's end: its start plus its duration)
is not packed: it comes last in ``fn.layout``, and ``fn.derived`` says, per such value, its
column, the column it adds to and the parameters (``("k", i)``: ``K[i]``, ``("c", i)``:
``C[i]`` per pass), which the caller adds with numpy after the call (the same additions).

Imports: simwar.core, the plan's types and the inliner; must not import races or execute (the
pass calls this).
"""

from __future__ import annotations

import keyword
import re
import struct
from collections import OrderedDict

import numpy as np

from simwar.core import rules
from simwar.core.frozen import Frozen, set_field
from simwar.core.kinds import OpKind
from simwar.executors.fast.inline import NotInlinable, inline
from simwar.executors.fast.plan import MARKS, Shape

_CODE: OrderedDict = OrderedDict()  # compiled block functions, by (shape, slot kinds, ...)
_CODE_LIMIT = 512


class Target(Frozen):
    """What a compiled block's variables are, and the few lines that differ with it."""

    __slots__ = ("name", "rules", "held_if_positive", "zipped_columns", "rows_in_place",
                 "inlined")

    # rules: the rules' names in the generated code -> the functions bound to them.
    # held_if_positive: a wait on the forward stream adds what it held to the step window
    # only when it held something (scalar), or always (array: it adds 0.0 where the wait
    # held nothing, the same sum, and no run's branch is taken for another's).
    # zipped_columns: the parameter columns are lists zipped with the steps (scalar), or one
    # 2-d array per column, a row per pass (array).
    # rows_in_place: the array target's per-step arrays are numpy arrays, whose row
    # ``S.busy[k]`` is a view: a sum is added in the row itself (False: rows read and
    # written back, as for a group's runs picked out of the state's,
    # :mod:`simwar.executors.lockstep.shapes`)
    # inlined: ``begins``, ``released`` and ``returns`` written out in the text, derived from
    # their definitions (:mod:`simwar.executors.fast.inline`: on floats, a call costs more
    # than the rule), or called (numpy's forms over arrays)
    def __init__(self, name: str, rules: dict, held_if_positive: bool, zipped_columns: bool,
                 rows_in_place: bool = False, inlined: bool = False):
        set_field(self, "name", name)
        set_field(self, "rules", rules)
        set_field(self, "held_if_positive", held_if_positive)
        set_field(self, "zipped_columns", zipped_columns)
        set_field(self, "rows_in_place", rows_in_place)
        set_field(self, "inlined", inlined)


#: the fast executor's: floats
SCALAR = Target("scalar", {"_begins": rules.begins, "_released": rules.released,
                           "_returns": rules.returns}, True, True, inlined=True)
#: the lockstep executor's: arrays of one element per run
def _per_lane(values: tuple, which: np.ndarray, lanes: np.ndarray) -> np.ndarray:
    """Element ``j`` of ``values[which[j]]``, for each lane ``j`` (a union's merged wait or
    sync)."""
    return np.array(values)[which, lanes]


_MANY = {"_begins": rules.begins_many, "_released": rules.released_many,
         "_returns": rules.returns_many, "_add": np.add, "_sub": np.subtract, "_empty": np.empty,
         "_any": np.any, "_where": np.where, "_multiply": np.multiply, "_zeros": np.zeros,
         "_arange": np.arange, "_argmax": np.argmax, "_or": np.logical_or, "_per_lane": _per_lane}
ARRAY = Target("array", _MANY, False, False, True)
#: the same over per-step arrays whose rows are copies read and written back (runs picked
#: out of a group's, :mod:`simwar.executors.lockstep.shapes`)
PICKED = Target("picked", _MANY, False, False)
#: tensor-parallel ranks in lockstep (:mod:`simwar.executors.lockstep.ranks`): the scalar
#: target's text once per rank (a lane), each lane's variables its own, the lanes met at
#: each collective (:func:`_unrolled`)
LANES = Target("lanes", {"_begins": rules.begins, "_released": rules.released,
                         "_returns": rules.returns, "collective_ends": rules.collective_ends,
                         "host_collective_leaves": rules.host_collective_leaves}, True, True,
                inlined=True)
TARGETS = {t.name: t for t in (SCALAR, ARRAY, PICKED, LANES)}


class _Src:
    """The generated source, one line at a time, indented by levels of four spaces."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str, indent: int = 2) -> None:
        self.lines.append("    " * indent + line)


def _lanevar(lane: str, lanes: dict) -> str:
    """The local variable holding ``lane``'s tail (``T0``, ``T1``, ... in order of use)."""
    if lane not in lanes:
        lanes[lane] = f"T{len(lanes)}"
    return lanes[lane]


def compile_block(shape: Shape, slots: tuple, fwd: str, collect: bool, log: tuple,
                  depth: int, trace: bool = False, feed: bool = False,
                  target: str = "scalar", lanes: int = 0, union: tuple | None = None,
                  nonneg: bool = False, merged: tuple = (), sums: bool = False):
    """The function running a block of ``shape`` (cached).

    ``slots``: per parameter, True for a column, False for a constant; ``log``: sorted
    ``(device op index, 's' | 'e')`` whose times are appended to logs; ``depth``: segments
    of record times kept for bindings to earlier segments; ``collect``: append the forward
    stream's intervals instead of adding them up per step window; ``trace``: the trace
    mode of the module docstring; ``feed``: ``C`` is a callable ``C(ki, t)`` called at the
    top of each pass with its step index and the host clock, returning the pass's column
    values (a workload fixed as the run goes: :func:`simwar.executors.fast.realize`);
    ``target``: ``"scalar"``, ``"array"``, ``"picked"`` or ``"lanes"`` (:class:`Target`; all
    but the scalar take neither ``collect`` nor ``trace``); ``lanes``: the lanes target's
    number of lanes (:func:`_unrolled` says what its function takes); ``union``: the shape
    is a family's union (:mod:`simwar.executors.fast.union`) and these its guarded ops,
    ``(host op index, graph node index or -1)`` in the order of their flags: ``K`` ends
    with one flag per guarded op (the op runs where it is true) and ``HP``, which picks
    the run's own records, in its order, from the tuple of the union's (the scalar target,
    or the array target with the runs a family's members, each flag an array of a truth
    value per run: :mod:`simwar.executors.lockstep.family`; no collect, trace or feed).
    ``nonneg``: every parameter the block is run with
    is a number at or above 0 and not -0.0 (the scalar target's caller checks them; the
    array target's runs hold them, :mod:`simwar.executors.lockstep`): a tail set since the
    host clock last moved is at or after it, and ``begins`` of it is the tail itself, with no
    call (as the array target takes it). ``merged``: a union's waits, and its host syncs, run
    as one in the array target (:attr:`~simwar.executors.fast.union.Union.merged`: ``(host op
    index, count)``, each run has one of the ``count`` at most, so one wait or sync on each
    run's own host cost, latency or wake-up and record, kept where it has one, is what its
    own runs).
    ``sums`` (with ``trace``): the trace mode's rows *and* the accumulators and logs of a
    run's pass, from the same lines (one pass makes a run's summary and its trace:
    :func:`simwar.executors.fast.execute.run_plan`'s ``trace``).
    """
    key = (shape.host, slots, fwd, collect, log, depth, trace, feed, target, lanes, union,
           nonneg, merged, sums)
    fn = _CODE.get(key)
    if fn is not None:
        _CODE.move_to_end(key)
        return fn
    tgt = TARGETS[target]
    if tgt is not SCALAR and (collect or trace):
        raise ValueError(f"the {target} target has no collect or trace mode")
    if sums and (not trace or collect):
        raise ValueError("sums are the trace mode's, with no collect")
    if union is not None and (tgt not in (SCALAR, ARRAY) or collect or trace or feed):
        raise ValueError("a union's code is the scalar or the array target's, with no collect, "
                         "trace or feed")
    fn = _generate(shape, slots, fwd, collect, log, depth, trace, feed, tgt, lanes, union,
                   nonneg, merged, sums)
    _CODE[key] = fn
    if len(_CODE) > _CODE_LIMIT:
        _CODE.popitem(last=False)
    return fn


def _generate(shape: Shape, slots: tuple, fwd: str, collect: bool, log: tuple, depth: int,
              trace: bool, feed: bool, target: Target, width: int = 0,
              union: tuple | None = None, nonneg: bool = False, merged: tuple = (),
              sums: bool = False):
    """Write and compile the block function of :func:`compile_block` (its ``.source``: the
    generated text; in trace mode its ``.layout``)."""
    # the trace mode's rows only, no accumulator or log (``sums``: both, one pass)
    rows_only = trace and not sums
    src = _Src()
    lanes: dict[str, str] = {}
    params = [f"k{j}" if not col else f"c{j}" for j, col in enumerate(slots)]
    pi = iter(params)
    logs = {entry: f"LG{n}" for n, entry in enumerate(log)}
    nrec = len(shape.records)
    body: list[tuple[str, int]] = []
    sites = sorted({h.site for h in shape.host if h.kind in ("sync", "hcoll")})
    colls = any(h.kind == "hcoll" or (h.kind == "graph" and any(n.kind == "c" for n in h.nodes))
                for h in shape.host)
    unrolled = target is LANES
    if colls and not unrolled:
        raise ValueError("a shape with collectives runs on the lanes target only (its lanes "
                         "the ranks)")
    if unrolled and (trace or collect or feed or width < 1):
        raise ValueError("the lanes target takes a number of lanes, and no collect, trace "
                         "or feed")

    def emit(line: str, indent: int = 2) -> None:
        body.append((line, indent))

    # a union's guarded ops: each op's lines run under its flag (the op's own, as a member
    # that has it runs them). The array target's runs are members side by side: there a
    # guarded op runs for every run, and what it sets is kept only where its flag (an array
    # of a truth value per run) is true (``_where``): a tail, the host clock after a sync,
    # and what a wait adds to the window (times 0 elsewhere: adding a zero leaves a sum as
    # it was); its host cost is 0.0 for a run without it (:meth:`Union.consts`), and
    # ``t + 0.0`` is ``t``; its records and logged times are read only by the runs that
    # have it
    flag = {at: f"G{i}" for i, at in enumerate(union or ())}
    masked = union is not None and target is ARRAY

    def guarded(start: int, at: tuple[int, int], known: set) -> None:
        """The op's lines from ``start`` under its flag; ``known``: the tails and records at
        or after the host clock before the op (what stays so whether it runs or not)."""
        if at in flag:
            if not masked:
                body[start:] = [(f"if {flag[at]}:", 2)] + [(x, i + 1) for x, i in body[start:]]
            above.intersection_update(known)

    # the array target's fewer numpy calls and arrays: the tails known to be at or after the
    # host clock since it last moved (``begins`` of one is the tail itself: a maximum of
    # two numbers is the larger, and a run's times are neither NaN nor -0.0); the host clock
    # and the window sums are arrays of the block's own, added to in place by numpy's
    # ``add`` with its output given (``WD``: the two sums as the rows of one array, both
    # zeroed at once as a window closes), a difference added to one made in a scratch row
    # (``Z_``); every value kept (a tail, a record, a logged time) is a new array
    arr = target in (ARRAY, PICKED)
    skip = arr or nonneg  # the tails above the host clock are known (see begun)
    above: set[str] = set()
    sums: list[tuple] = []  # the array target: where in ``body`` a window sum is added to
    closes: list[tuple[int, str]] = []  # ... and where a window closes, at which step

    def advance(step: str) -> None:
        """The host clock moves on by ``step``."""
        above.clear()
        if clock[0] is not None:
            clock[0][1].append(step)
        emit(f"_add(t, {step}, t)" if arr else f"t += {step}")

    def blocked(h) -> None:
        """A sync's blocked time (the host clock's move, ``t - t0``) added to its site's."""
        if target.rows_in_place:  # added in the row (``row += Z_`` writes it back too)
            emit(f"_sub(t, t0, Z_); BR_ = B{sites.index(h.site)}[{step_index(h.off)}]; "
                 "_add(BR_, Z_, BR_)")
        elif arr:
            emit(f"_sub(t, t0, Z_); B{sites.index(h.site)}[{step_index(h.off)}] += Z_")
        elif not rows_only:
            emit(f"B{sites.index(h.site)}[{step_index(h.off)}] += t - t0")

    def rule(name: str, *args: str) -> str:
        """The expression of rule ``name`` of :mod:`simwar.core.rules` on ``args``: a call,
        or the rule written out (the lines it needs first emitted: call it before emitting
        the line that uses it)."""
        if target.inlined:  # not numpy's forms
            try:
                lines, expr = inline(target.rules["_" + name], args, f"{name}_")
            except NotInlinable:  # simwar without its sources: the call
                pass
            else:
                for line in lines:
                    emit(line)
                return expr
        return f"{name}({', '.join(args)})"

    def begun(tv: str) -> str:
        """``begins(tv, t)``, or the tail ``tv`` where it is known to be at or after t."""
        return tv if skip and tv in above else rule("begins", tv, "t")

    def summed(acc: str, a: str, b: str) -> None:
        """``acc += a - b`` (a window sum)."""
        if arr:
            sums.append((len(body), acc, a, b))
            emit(f"_sub({a}, {b}, Z_); _add({acc}, Z_, {acc})")
        else:
            emit(f"{acc} += {a} - {b}")

    def step_index(off: int) -> str:
        return "ki" if off == 0 else f"(ki + {off})" if off > 0 else f"(ki - {-off})"

    def fired(bind) -> str:
        if bind.back == 0:
            return f"r{bind.record}"
        return f"H{bind.back}[{bind.record}]"

    layout: list[tuple[str, int]] = []  # trace mode: what each recorded value is
    # trace mode: the values the rows leave out, each a kept value plus parameters (a host
    # clock: a kept clock plus the host costs added since; a kernel's end: its start plus its
    # duration), which numpy adds after the block, the same additions of the same floats
    # (``fn.derived``): (what it is, what it adds to, the parameters); a row's values cost
    # its packing ~13 ns each
    derived: list[tuple] = []
    clock: list = [None]  # the kept clock the host clock is, and the costs since (or None)
    packed: list[str] = []  # what the row packs: a copy, or a name the pass sets once
    # trace mode: an op's values in names of its own (set once a pass: packed as they are,
    # with no copy, ~4 ns each)
    own = (lambda name, d: f"{name}{d}") if trace else (lambda name, d: name)

    def keep(what: str, index: int, value: str) -> None:
        if what == "h" and clock[0] is not None and clock[0][1]:
            derived.append(((what, index), *clock[0]))
        else:
            if value == "t":  # the host clock moves on: a copy
                emit(f"q{len(layout)} = {value}")
                value = f"q{len(layout)}"
            packed.append(value)
            layout.append((what, index))
        if what == "h" and trace and union is None:
            clock[0] = ((what, index), [])

    def log_times(dev_index: int, s: str, e: str) -> None:
        if trace:
            if s == e:  # a record: fires once
                keep("r", dev_index, s)
            else:
                keep("s", dev_index, s)
                keep("e", dev_index, e)
            if rows_only:
                return
        logged(dev_index, s, e)

    def logged(dev_index: int, s: str, e: str) -> None:
        """The op's times appended to the logs that take them (the races')."""
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

    def kernel(dev_index: int, lane: str, dur: str, collective: bool = False) -> None:
        op = shape.ops[dev_index]
        tv = _lanevar(lane, lanes)
        if trace and not collective:  # its end: its start plus its duration (fn.derived)
            s = own("s", dev_index)
            emit(f"{s} = {begun(tv)}")
            if rows_only:
                emit(f"{tv} = {s} + {dur}")
            else:  # (the sums read the end: the same addition, kept in a name of its own)
                e = own("e", dev_index)
                emit(f"{tv} = {e} = {s} + {dur}")
            keep("s", dev_index, s)
            derived.append((("e", dev_index), ("s", dev_index), [dur]))
            above.add(tv)
            if not rows_only:
                kernel_sums(op, dev_index, lane, s, e)
                logged(dev_index, s, e)
            return
        emit(f"s = {begun(tv)}")
        if collective:
            # a device collective (lanes: the ranks): it ends on every rank at the last
            # rank's begin plus its own duration (core.rules.collective_ends); its
            # arrival (the begin) and its end are logged. "@": a line of every lane's at
            # once (_unrolled)
            emit("@M_ = max((s@,))")
            emit(f"{tv} = e = collective_ends(M_, {dur})")
            emit("CL(s); CL(e)")
        else:
            emit(f"{tv} = e = s + {dur}")
            above.add(tv)  # s at or after t, a duration >= 0 (a plan with none below 0)
        if not rows_only:
            kernel_sums(op, dev_index, lane, "s", "e")
        log_times(dev_index, "s", "e")

    def kernel_sums(op, dev_index: int, lane: str, s: str, e: str) -> None:
        """A forward kernel's part of the per-step sums (its start ``s``, its end ``e``)."""
        if lane == fwd:
            ks = step_index(op.off)
            if op.phase:
                if collect:
                    emit(f"if {s} < FS[{ks}]: FS[{ks}] = {s}")
                    emit(f"if {e} > FE[{ks}]: FE[{ks}] = {e}")
                else:
                    if first_of.get(op.off) == dev_index:
                        emit(f"if {ks} != cw:")
                        emit(f"if {ks} < cw: bad = True", 3)
                        emit(f"cw = {ks}; FS[cw] = {s}", 3)
                    if last_of.get(op.off) == dev_index:
                        emit(f"FE[{ks}] = {e}")
            if collect:
                emit(f"KS_({s}); KE_({e})")
            else:
                summed("W", e, s)
                if op.phase and last_of.get(op.off) == dev_index:
                    # the window of step k ends with forward k: [end of k-1, end of k); a
                    # step closed twice (its forward in two segments) takes the collect path
                    # (the array target: its batch runs one by one)
                    emit(f"if {ks} <= cl: bad = True")
                    if arr:
                        closes.append((len(body), ks))
                    emit(f"BU[{ks}] = W; DE[{ks}] = Dp; " + ("WD.fill(0.0)" if arr else
                                                             "W = 0.0; Dp = 0.0") + f"; cl = {ks}")

    def record(var: str, lane: str, dev_index: int, mask: str | None = None) -> None:
        """A record on ``lane`` (an event's, or a wait_stream's of the lane's tail): it fires
        when the lane reaches it, into ``var`` (``mask``: the runs it is kept for, above)."""
        tv = _lanevar(lane, lanes)
        if mask is not None:
            fires = begun(tv)
            # (a tail at or after the host clock: the record fires at it, which it keeps)
            emit(f"{var} = {tv}" if fires == tv else
                 f"{var} = {fires}; {tv} = _where({mask}, {var}, {tv})")
        else:
            emit(f"{var} = {tv} = {begun(tv)}")
        above.update((tv, var))
        log_times(dev_index, var, var)

    def wait(stream: str, fired_at: str | None, lat: str, same_stream: bool,
             dev_index: int, mask: str | None = None) -> None:
        """A wait on ``stream`` bound to a record fired at ``fired_at`` (None: bound to
        nothing, a no-op); ``mask``: the runs it is kept for (above)."""
        ts = _lanevar(stream, lanes)
        # (the trace mode: in names of the op's own, which its row packs)
        reach, rel = own("reach", dev_index), own("rel", dev_index)
        if mask is not None:
            emit(f"reach = {begun(ts)}")
            emit("rel = reach" if fired_at is None else
                 f"rel = {rule('released', 'reach', fired_at, lat, str(same_stream))}")
            emit(f"{ts} = _where({mask}, rel, {ts})")
            if stream == fwd and fired_at is not None:
                sums.append((len(body), "Dp", None, None))  # (an add, never the first's)
                emit(f"_sub(rel, reach, Z_); _multiply(Z_, {mask}, Z_); _add(Dp, Z_, Dp)")
        elif fired_at is None:
            emit(f"{ts} = {reach} = {rel} = {begun(ts)}")
        elif arr and fired_at in above and stream != fwd and (dev_index, "s") not in logs:
            # fired at or after the host clock, so its release (fired, plus a latency >= 0)
            # is too: the larger of it and the tail is the larger of it, the tail and the
            # clock, with no reach to compute (nothing sums or logs it)
            emit(f"{ts} = rel = {rule('released', ts, fired_at, lat, str(same_stream))}")
        else:
            emit(f"{reach} = {begun(ts)}")
            emit(f"{ts} = {rel} = {rule('released', reach, fired_at, lat, str(same_stream))}")
            if stream == fwd and not rows_only:
                if collect:
                    emit(f"if {rel} > {reach}:")
                    emit(f"WS_({reach}); WE_({rel})", 3)
                elif target.held_if_positive:
                    emit(f"if {rel} > {reach}:")
                    emit(f"Dp += {rel} - {reach}", 3)
                else:
                    summed("Dp", rel, reach)
        above.add(ts)  # released no earlier than reached
        log_times(dev_index, reach, rel)

    dev = 0  # device op index
    rec = 0  # record index
    # a union's waits and syncs run as one (the array target's lanes; none logged): first
    # host op -> how many, and the lines before the loop that make their one op's numbers
    merge_at = dict(merged) if masked else {}
    ahead: list[str] = []
    skipped: set[int] = set()
    if trace:
        keep("h", -1, "t")
    for hi, h in enumerate(shape.host):
        if hi in skipped:  # (a merged wait's or sync's, run with its first)
            continue
        kind = h.kind
        start, known = len(body), set(above)
        mask = flag.get((hi, -1)) if masked else None
        if hi in merge_at and not any(
                (d, w) in logs for d in range(dev, dev + merge_at[hi]) for w in "se"):
            group = shape.host[hi:hi + merge_at[hi]]
            skipped.update(range(hi + 1, hi + len(group)))
            # each variant's host cost and latency (a wait's) or wake-up (a sync's)
            names = [(next(pi), next(pi)) for _ in group]
            flags = ", ".join(flag[(hi + q, -1)] for q in range(len(group)))
            g = f"MW{len(ahead)}_"
            # each run's own numbers: the others' are 0.0, and x + 0.0 is x
            ahead += [f"{g}H = " + " + ".join(x for x, _ in names),
                      f"{g}L = " + " + ".join(x for _, x in names),
                      f"{g}G = _or.reduce(({flags},))", f"{g}I = _argmax(({flags},), axis=0)"]
            fired_at = f"_per_lane(({''.join(fired(v.bind) + ', ' for v in group)}), {g}I, LN_)"
            if kind == "sync":  # the sync's lines, as one run's (below) on its own numbers
                clock[0] = None
                above.clear()
                emit("t0 = t")
                emit(f"F_ = {fired_at}")
                emit(f"t = _where({g}G, {rule('returns', 't0', f'{g}H', 'F_', f'{g}L')}, t0)")
                blocked(h)
                dev += len(group)
                continue
            advance(f"{g}H")
            ts = _lanevar(h.stream, lanes)
            emit(f"reach = {begun(ts)}")
            emit(f"F_ = {fired_at}")
            emit(f"rel = {rule('released', 'reach', 'F_', f'{g}L', str(h.bind.same_stream))}")
            emit(f"{ts} = _where({g}G, rel, {ts})")
            if h.stream == fwd:
                sums.append((len(body), "Dp", None, None))  # (as a guarded wait's)
                emit(f"_sub(rel, reach, Z_); _multiply(Z_, {g}G, Z_); _add(Dp, Z_, Dp)")
            above.add(ts)
            above.intersection_update(known)  # (as a guarded op's: see guarded)
            dev += len(group)
            continue
        if kind == "cpu":
            advance(next(pi))
        elif kind == "launch":
            advance(next(pi))
            kernel(dev, h.stream, next(pi))
            dev += 1
        elif kind == "graph":
            advance(next(pi))
            _lanevar(h.stream, lanes)  # the graph's lane, even for a graph of no nodes
            for ni, node in enumerate(h.nodes):
                if node.kind == "r":
                    at, before = len(body), set(above)
                    record(f"r{rec}", h.stream, dev,
                           flag.get((hi, ni)) if masked else None)
                    guarded(at, (hi, ni), before)
                    rec += 1
                elif node.kind == "c":
                    kernel(dev, h.stream, next(pi), collective=True)
                else:
                    kernel(dev, h.stream, next(pi))
                dev += 1
        elif kind == "record":
            advance(next(pi))
            record(f"r{rec}", h.stream, dev, mask)
            rec += 1
            dev += 1
        elif kind == "wait_stream":  # WaitStream's rule: other's tail recorded, then waited
            host, lat = next(pi), next(pi)
            advance(host)
            x = own("x", dev)
            # (a union's guarded stream wait, PLACED_WAITS: both parts kept only where its
            # flag is true, as a record's and a wait's on their own)
            record(x, h.other, dev, mask)
            wait(h.stream, x, lat, h.same_stream, dev + 1, mask)
            dev += 2
        elif kind == "wait_event":
            host, lat = next(pi), next(pi)
            advance(host)
            bind = h.bind
            wait(h.stream, None if bind is None else fired(bind), lat,
                 bind is not None and bind.same_stream, dev, mask)
            dev += 1
        elif kind == "sync":
            host, wake = next(pi), next(pi)
            clock[0] = None  # (the host clock set by the rule, not a cost added)
            f = "None" if h.bind is None else fired(h.bind)
            above.clear()
            emit("t0 = t")
            back = rule('returns', 't0', host, f, wake)
            emit(f"t = _where({mask}, {back}, t0)" if mask is not None else f"t = {back}")
            blocked(h)
            dev += 1
        elif kind == "hcoll":  # a host collective (lanes: the ranks)
            cost, wake = next(pi), next(pi)
            clock[0] = None
            above.clear()
            emit("t0 = t")
            emit("@M_ = max((t@,))")
            emit(f"t = host_collective_leaves(t0, M_, {cost}, {wake})")
            emit(f"B{sites.index(h.site)}[{step_index(h.off)}] += t - t0")
            emit("CL(t0); CL(t)")
            dev += 1
        elif kind == "run_batch":
            if not rows_only:
                emit(f"LA[{step_index(h.off)}] = t")
        elif kind == "result_done":  # the host instant a result has been processed
            if not rows_only:
                emit(f"RD[{step_index(h.off)}] = t")
        else:  # pragma: no cover
            raise AssertionError(kind)
        guarded(start, (hi, -1), known)
        if trace and kind not in MARKS:
            keep("h", hi, "t")  # the host clock after this host op
    if trace:  # the segment's row, its floats packed into the buffer at once
        emit("TR(BUF, TO, " + "".join(f"{v}, " for v in packed) + f"); "
             f"TO += {8 * (len(layout) + len(derived))}")
    # record times kept for later segments
    if depth:
        for d in range(depth, 1, -1):
            emit(f"H{d} = H{d - 1}")
        if union is not None:  # the run's own records, in its order
            emit("H1 = HP((" + "".join(f"r{i}, " for i in range(nrec)) + "))")
        else:
            emit("H1 = (" + "".join(f"r{i}, " for i in range(nrec)) + ")")
    # the array target, where a segment closes one window, at its own step, after every sum
    # it adds to (so none carries to the next segment): the sums are added in the rows of
    # ``BU`` and ``DE`` themselves, the first of each written there (a row is 0.0 until
    # closed, and 0.0 plus a difference >= 0 is that difference), with no copy into them and
    # no zeroing as the window closes. A window carried from the block before (``S.w``,
    # ``S.dp`` not 0) is the picked form's to run, for one pass (the function refuses it:
    # :func:`simwar.executors.lockstep.execute.run_passes`). A union's lanes (``masked``, no
    # picked form) add every sum to its row, the first too, so a window carried in is added
    # to the first pass's row before them: the same sums in the same order as kept apart
    direct = bool(target.rows_in_place and len(closes) == 1
                  and closes[0][1] == "ki"
                  and all(i < closes[0][0] for i, *_ in sums))
    if direct:
        at, indent = closes[0][0], body[closes[0][0]][1]
        body[at] = ("cl = ki", indent)
        for acc in () if masked else ("W", "Dp"):
            first = next((x for x in sums if x[1] == acc), None)
            if first is not None:
                i, _, a, b = first
                body[i] = (f"_sub({a}, {b}, {acc})", body[i][1])
        body.insert(0, ("W = BU[ki]; Dp = DE[ki]", 2))

    cols = [p for p in params if p.startswith("c")]
    consts = [p for p in params if p.startswith("k")]
    if union is not None:
        consts += [*flag.values(), "HP"]
    src("def block(KS, K, C, S):", 0)
    if consts:
        src(f"({', '.join(consts)},) = K", 1)
    if ahead:  # the merged waits' and syncs' numbers (see the loop), once a call
        src("LN_ = _arange(len(S.t))", 1)
        for line in ahead:
            src(line, 1)
    if union is not None and depth and nrec:  # a record a run does not fire is picked by none
        src(" = ".join(f"r{i}" for i in range(nrec))
            + (" = _zeros(len(S.t))" if masked else " = 0.0"), 1)
    src("t = S.t", 1)
    src("TL = S.tails", 1)
    for lane, var in lanes.items():
        src(f"{var} = TL.get({lane!r}, 0.0)", 1)
    for d in range(1, depth + 1):
        src(f"H{d} = S.hist[{d - 1}]", 1)
    if trace:
        src("TR = _PACK; BUF = S.trace; TO = 0", 1)
    if not rows_only:
        src("FS = S.fs; FE = S.fe; LA = S.launch; RD = S.done", 1)
        for n, site in enumerate(sites):
            src(f"B{n} = S.blocked[{site!r}]", 1)
    if rows_only:
        pass
    elif collect:
        src("KS_ = S.kin.append; KE_ = S.kout.append; WS_ = S.win.append; "
            "WE_ = S.wout.append", 1)
    else:
        src("BU = S.busy; DE = S.dep; cw = S.cw; cl = S.cl; W = S.w; Dp = S.dp; bad = S.bad", 1)
        if direct and masked:  # the sums in the rows closed, a window carried in first
            src("Z_ = _empty(len(t))", 1)
            src("if len(KS) and (_any(W) or _any(Dp)):", 1)
            src("BU[KS[0]] += W; DE[KS[0]] += Dp", 2)
            src("W_ = Dp_ = 0.0", 1)
        elif direct:  # the sums in the rows closed (see above), a scratch row
            src("Z_ = _empty(len(t))", 1)
            src("if len(KS) and (_any(W) or _any(Dp)):", 1)
            src("raise ValueError('a window carried into a block that sums its windows in "
                "their rows: its first pass runs in the picked form')", 2)
            src("W_ = W; Dp_ = Dp", 1)
        elif arr:  # the sums' arrays of the block's own, and a scratch row (see _generate)
            src("WD = _empty((3, len(t))); WD[0] = W; WD[1] = Dp; W, Dp, Z_ = WD; WD = WD[:2]",
                1)
    if logs:  # one statement for all: a block may log a hundred times, and each statement
        # of the generated source costs its share of ``compile``
        src(f"({', '.join(logs.values())},) = [L.append for L in S.logs[:{len(logs)}]]", 1)
    if colls:
        src("CL = S.colls.append", 1)
    src("begins = _begins; released = _released; returns = _returns", 1)
    if feed:
        src("for ki in KS:", 1)
        src((f"({', '.join(cols)},) = " if cols else "") + "C(ki, t)", 2)
    elif target.zipped_columns:
        header = "for ki" + "".join(f", {c}" for c in cols) + " in " + (
            f"zip(KS, {', '.join(f'C[{i}]' for i in range(len(cols)))}):" if cols else "KS:")
        src(header, 1)
    elif cols:
        src(f"({', '.join(f'C{i}' for i in range(len(cols)))},) = C", 1)
        src("for pi, ki in enumerate(KS):", 1)
        src("".join(f"{c} = C{i}[pi]; " for i, c in enumerate(cols)), 2)
    else:
        src("for ki in KS:", 1)
    for line, indent in body:
        src(line, indent)
    if not body:
        src("pass", 2)
    src("S.t = t", 1)
    for lane, var in lanes.items():
        src(f"TL[{lane!r}] = {var}", 1)
    if depth:
        src("S.hist = [" + "".join(f"H{d}, " for d in range(1, depth + 1)) + "]", 1)
    if direct:  # every sum in a row closed: nothing carries to the next block
        src("S.cw = cw; S.cl = cl; S.w = W_; S.dp = Dp_; S.bad = bad", 1)
    elif not collect and not rows_only:
        src("S.cw = cw; S.cl = cl; S.w = W; S.dp = Dp; S.bad = bad", 1)
    if unrolled:
        src.lines = _unrolled(src.lines, body, cols, width)
    code = "\n".join(src.lines) + "\n"
    namespace = dict(target.rules)
    if trace:
        namespace["_PACK"] = struct.Struct(f"@{len(layout)}d").pack_into
    filename = f"<simwar.executors.fast.codegen {target.name} block {abs(hash(shape)):x}>"
    exec(compile(code, filename, "exec"), namespace)
    fn = namespace["block"]
    fn.source = code
    # the rows' values first (each row packed from its start), the derived after them
    fn.layout = tuple(layout) + tuple(key for key, _, _ in derived)
    place = {key: i for i, key in enumerate(fn.layout)}
    fn.derived = tuple((place[key], place[base], tuple(("k", consts.index(p)) if p[0] == "k" else
                                                 ("c", cols.index(p)) for p in costs))
                       for key, base, costs in derived)
    # takes no window carried from the block before (see above; a union's lanes add it)
    fn.sums_in_rows = direct and not masked
    return fn


#: names every lane shares in an unrolled block: the step, the rules, what Python names
_SHARED = frozenset({"ki", "KS", "C", "M_", "begins", "released", "returns", "collective_ends",
                     "host_collective_leaves", "_begins", "_released", "_returns", "max",
                     "zip", *keyword.kwlist})
#: a string literal (kept), or a name not after a dot (an attribute is kept)
_NAME = re.compile(r"('[^']*'|\"[^\"]*\")|(?<![\w.])([A-Za-z_]\w*)")
_EVERY = re.compile(r"(\w+)@")


def _lane(line: str, r: int) -> str:
    """``line`` of lane ``r``: each of its names ``name_r`` but the shared ones."""
    return _NAME.sub(lambda m: m.group(1) or (m.group(2) if m.group(2) in _SHARED
                                              else f"{m.group(2)}_{r}"), line)


def _unrolled(lines: list[str], body: list, cols: list, width: int) -> list[str]:
    """The lanes target's source from the scalar text's ``lines`` (its body ``body``):
    ``block(KS, K, C, S)`` with ``K`` and ``S`` one entry per lane (its constants, its
    state: :mod:`simwar.executors.fast.execute`'s), ``C`` every lane's columns, lane by lane.
    Each lane runs the scalar text on names of its own (``t_0``, ``t_1``, ...); between two
    lines of every lane (``@``: a collective's last arrival, ``max`` over the lanes in
    rank order, as the engine takes it), each lane's lines run in turn, which changes no
    value (a lane's lines read no other lane's names)."""
    i = next(j for j, line in enumerate(lines) if line.startswith("    for ki"))
    n_body = len(body) if body else 1
    head, loop, tail = lines[1:i], lines[i + 1:i + 1 + n_body], lines[i + 1 + n_body:]
    out = [lines[0]]
    for r in range(width):
        out.append(f"    S_{r} = S[{r}]; K_{r} = K[{r}]")
        out += [_lane(line, r) for line in head if not line.startswith("    begins =")]
    out += [line for line in head if line.startswith("    begins =")]
    names = ", ".join(f"{c}_{r}" for r in range(width) for c in cols)
    out.append(f"    for ki, {names} in zip(KS, *C):" if cols else "    for ki in KS:")
    run: list[str] = []

    def flush() -> None:
        for r in range(width):
            out.extend(_lane(line, r) for line in run)
        run.clear()

    for line in loop:
        stripped = line.lstrip()
        if stripped.startswith("@"):
            flush()
            indent = line[:len(line) - len(stripped)]
            out.append(indent + _EVERY.sub(
                lambda m: ", ".join(f"{m.group(1)}_{r}" for r in range(width)), stripped[1:]))
        else:
            run.append(line)
    flush()
    for r in range(width):  # S_r still lane r's state (no lane rebinds it)
        out += [_lane(line, r) for line in tail]
    return out
