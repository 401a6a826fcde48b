"""Tensor-parallel ranks in lockstep: every rank's plan run as one, a lane per rank.

The ranks of a run issue the same structure (docs/design.md, "Tensor-parallel ranks": the
k-th collective of one rank is the k-th of every rank) and differ in their numbers only:
their own draws, ``ranks.per_rank`` overrides, the late work of the slow rank. So their
plans (the fast executor's, :func:`~simwar.executors.fast.plan.plan_program` with the
collectives shaped) are one plan whose parameters are one element per rank, and the
fast executor's code generator in its array target runs them together, each array's
elements the ranks (as :mod:`simwar.executors.lockstep.execute` runs the runs of a sweep).
Two ops couple the lanes, by the rules of :mod:`simwar.core.rules` the SimPy engine takes:

- a host collective: every rank leaves at the last rank's arrival plus its own cost, plus
  its wake-up when it waited (:func:`~simwar.core.rules.host_collective_leaves_many`);
- a device collective kernel: it begins on each rank by the stream rules and ends at the
  last rank's begin plus the rank's own duration
  (:func:`~simwar.core.rules.collective_ends_many`).

Every other op is each rank's own, the same operations on the same values as the engine's,
so every time is the engine's bit for bit. What the ranks' results need comes from the
pass, as the one-rank fast executor's does: each rank's per-step table (the per-step
facts, a column per rank), its races (the race plan of its plan, the same for every rank,
its logged times the rank's column), and each collective's arrival and leaving time per
rank (logged in issue order, which with the plan names each instance: its op, step,
host or device and instance number), from which the group's table and summary are made
(:func:`simwar.analysis.ranks.group_columns`). No Trace is kept: a run that needs one
takes :mod:`simwar.executors.fast.ranks`.

The ranks' Programs are built uniform (:func:`simwar.builder.ranks.rank_programs`:
late work issued at every step, 0 where none). Ranks whose plans still differ in structure
(a per-rank override that changes the loop), whose forward steps are issued out of order,
or that have negative durations raise :class:`RanksApart`, and the run takes the next
executor.

Imports: numpy, simwar.core, simwar.analysis, simwar.builder (the ranks' Programs), the
fast executor's plan, codegen and races, and this package's state.
"""

from __future__ import annotations

import numpy as np

from simwar.analysis.metrics import SITES, StepFacts, columns_from_arrays, summarize
from simwar.analysis.ranks import Collectives
from simwar.builder.draws import Use
from simwar.builder.loop import plan_iterations
from simwar.builder.ranks import (
    Unplanned,
    coupled,
    coupling_draws,
    late_work,
    rank_config,
    rank_programs,
)
from simwar.core.refusals import PlanRefused
from simwar.executors.fast.codegen import compile_block
from simwar.executors.fast.execute import marks_results
from simwar.executors.fast.plan import Plan, Unsettled, bind, plan_program, plan_template
from simwar.executors.fast.races import RacePlan
from simwar.executors.lockstep.execute import State

#: passes of a block run per call of its compiled function
CHUNK = 4096


class RanksApart(PlanRefused):
    """The ranks' plans cannot run in lockstep (module docstring); the next executor runs
    them."""


class RankRun:
    """One rank of a lockstep run: its summary, per-step columns, races and meta."""

    __slots__ = ("rank", "summary", "columns", "hazards", "meta")

    def __init__(self, rank: int, summary: dict, columns: dict, hazards, meta: dict):
        self.rank, self.summary, self.columns = rank, summary, columns
        self.hazards, self.meta = hazards, meta


def run_ranks(cfg, sizes, window: int = 2, progress=None) -> tuple[list[RankRun], Collectives]:
    """Every rank of ``cfg`` (``parallel.tp > 1``) in one lockstep pass: each rank's
    :class:`RankRun` and the ranks' collectives, equal to what the SimPy engine's Traces
    give; :class:`RanksApart` when the ranks cannot run so. Each rank is planned from its
    first iterations (:func:`plan_rank`) or, when they do not settle into one shape or
    their coupling is not a plan's, from its Program."""
    try:
        plans = [plan_rank(cfg, r, sizes) for r in range(cfg.tp)]
    except (Unsettled, Unplanned):
        plans = [plan_program(p, ranks=True) for p in rank_programs(cfg, sizes, uniform=True)]
    return run_plans(plans, window, progress)


def plan_rank(cfg, rank: int, sizes) -> Plan:
    """Rank ``rank``'s plan without building its Program, as
    :func:`~simwar.executors.fast.plan.plan_config` plans one rank: its loop's first
    iterations and drain built symbolically (:func:`~simwar.builder.loop.plan_iterations`,
    of the rank's config), each coupled as the rank's Program is
    (:func:`~simwar.builder.ranks.coupled`, uniform) with the rank model's numbers as uses
    of its draws (:func:`~simwar.builder.ranks.coupling_draws`: one array per name, the
    uses of an iteration counted as the loop's draws are), then bound as any run's
    template is. The numbers are the Program's, in the same places."""
    rc = rank_config(cfg, rank)
    iterations = plan_iterations(rc, sizes)
    draws = coupling_draws(cfg, rc, rank)
    draws.update(late_work(draws))
    n = len(iterations.ops) - 1  # skeleton iterations; the last entry is the drain
    arrays: dict = {}
    ops, uses = [], []
    for i, its in enumerate(iterations.ops):
        k = i if i < n else None  # the drain: no coupling (its marker is the run's last)
        counts: dict = {}

        def value(name, index, k=k, counts=counts):
            key = ("rank", name)
            arrays[key] = draws[name]
            if name == "wake":  # two per step
                use, per = index - 2 * k, 2
            elif isinstance(name, tuple):  # a collective's: counted as they are taken
                use, per = index, None
                counts[key] = max(counts.get(key, 0), index + 1)
            else:
                use, per = index - k, 1
            if k is None or not 0 <= use < (per or use + 1):
                raise Unplanned("a coupling op of another step than its iteration's")
            if per is not None:
                counts[key] = per
            return Use(key, use)

        ops.append(list(coupled(its, cfg, rc, rank, True, value, draws, steps=n)))
        uses.append({**iterations.uses[i], **counts})
    iterations.ops, iterations.uses = ops, uses
    template = plan_template(iterations, ranks=True)
    sampler = iterations.sampler()
    sampler.arrays.update(arrays)
    plan = bind(template, sampler, sizes=sizes)
    plan.meta.update(rank=rank, tp=cfg.tp, name=cfg.name, rank_seed=rc.seed)
    return plan


def _check(plans: list[Plan]) -> None:
    first = plans[0]
    shape = [(b.shape, b.steps, b.marked) for b in first.blocks]
    for p in plans[1:]:
        if [(b.shape, b.steps, b.marked) for b in p.blocks] != shape or \
                (p.lo, p.hi) != (first.lo, first.hi):
            raise RanksApart("the ranks issue different structures")
    if any(p.negative for p in plans):
        raise RanksApart("negative durations")


def _parameters(plans: list[Plan], bi: int) -> tuple[tuple, tuple, list]:
    """Block ``bi``'s slots (a column where any rank has one), constants (a number where
    every rank has the same, else one per rank) and per-rank columns (lists, or a
    rank's constant)."""
    blocks = [p.blocks[bi] for p in plans]
    n = len(blocks)
    slots = tuple(any(b.consts[j] is None for b in blocks) for j in range(len(blocks[0].consts)))
    consts = []
    for j, col in enumerate(slots):
        if col:
            continue
        values = [b.consts[j] for b in blocks]
        if all(v == values[0] and str(v) == str(values[0]) for v in values):
            consts.append(float(values[0]))
        else:
            consts.append(np.array(values, dtype=np.float64))
    return slots, tuple(consts), [blocks[r] for r in range(n)]


def _columns(blocks: list, slots: tuple, start: int, stop: int) -> list[np.ndarray]:
    """The column slots' values for passes ``start..stop-1``: a row per pass, a column
    per rank."""
    n = len(blocks)
    out = [np.empty((stop - start, n)) for j in range(len(slots)) if slots[j]]
    for r, b in enumerate(blocks):
        own = iter(b.columns(start, stop)) if any(c is None for c in b.consts) else iter(())
        k = 0
        for j, col in enumerate(slots):
            if not col:
                continue
            out[k][:, r] = next(own) if b.consts[j] is None else b.consts[j]
            k += 1
    return out


def run_plans(plans: list[Plan], window: int = 2, progress=None
              ) -> tuple[list[RankRun], Collectives]:
    """:func:`run_ranks` of the ranks' plans (:func:`~simwar.executors.fast.plan.plan_program`
    of each rank's Program, collectives shaped)."""
    _check(plans)
    plan = plans[0]
    n = len(plans)
    fwd = plan.meta.get("forward_stream", "forward")
    depth = plan.depth
    marks = marks_results(plan)
    state = State(plan.lo, plan.hi, set(SITES) | plan.sites, depth, n, marks)
    state.colls = []
    races = RacePlan(plan, window)
    races.reset(new_log=list)
    for bi, b in enumerate(plan.blocks):
        slots, consts, blocks = _parameters(plans, bi)
        fn = compile_block(b.shape, slots, fwd, False, races.logs_of(bi), depth,
                           target="array")
        state.logs = races.log_arrays(bi)
        lo = state.origin
        for start in range(0, b.n, CHUNK):
            stop = min(b.n, start + CHUNK)
            ks = b.steps[start:stop]
            ks = range(ks.start - lo, ks.stop - lo) if isinstance(ks, range) else \
                [k - lo for k in ks]
            cols = _columns(blocks, slots, start, stop) if any(slots) else ()
            fn(ks, consts, cols, state)
            if progress is not None:
                progress(b.steps[stop - 1])
    if state.bad:
        state.release()
        raise RanksApart("forward steps issued out of order")
    out = [_rank(r, p, state, races, marks) for r, p in enumerate(plans)]
    collectives = _collectives(plan, state.colls, n)
    state.release()
    return out, collectives


def _rank(r: int, plan: Plan, state: State, races: RacePlan, marks: bool) -> RankRun:
    """Rank ``r``'s per-step table, races and summary from its column of the pass."""
    fs = state.fs[:, r]
    idx = np.flatnonzero(fs < np.inf)
    steps = (idx + state.origin).astype(np.int32)
    if len(idx) == 0:
        columns = {"step": np.zeros(0, dtype=np.int32)}
    else:
        def col(a):
            return np.ascontiguousarray(a[idx, r])

        columns = columns_from_arrays(
            steps, col(state.fs), col(state.fe), col(state.busy), col(state.dep),
            {site: col(v) for site, v in state.blocked.items()}, col(state.launch),
            StepFacts(plan.meta), col(state.done) if marks else None)
    logged = races.arrays
    races.arrays = [[np.ascontiguousarray(np.asarray(log)[:, r]) if len(log) else np.zeros(0)
                     for log in logs] for logs in logged]
    races.base = [0] * len(logged)
    hazards = races.finish(state)
    races.arrays = logged
    return RankRun(r, summarize(columns, plan.meta, hazards), columns, hazards,
                   dict(plan.meta))


def _collectives(plan: Plan, logged: list, n: int) -> Collectives:
    """The ranks' collectives from the times logged in issue order (an arrival and a
    leaving time per instance) and the plan, which names each instance."""
    device: list[np.ndarray] = []
    name: list = []
    step: list[np.ndarray] = []
    op: list[np.ndarray] = []
    base = 0
    for b in plan.blocks:
        nops = len(b.shape.ops)
        host, kernels = _coll_index(b.shape)
        # (device op index, device?, name, step offset), in issue order
        mine = [(d, int(d in kernels), o.label, o.off) for d, o in enumerate(b.shape.ops)
                if d in host or d in kernels]
        if mine:
            passes = np.arange(b.n)
            steps = np.asarray(b.steps, dtype=np.int64)
            for_op = np.array([m[0] for m in mine])
            offs = np.array([m[3] for m in mine])
            op.append((base + passes[:, None] * nops + for_op[None, :]).ravel())
            step.append((steps[:, None] + offs[None, :]).ravel())
            device.append(np.tile(np.array([m[1] for m in mine]), b.n))
            name += [m[2] for m in mine] * b.n
        base += b.n * nops
    dev = np.concatenate(device) if device else np.zeros(0, dtype=np.int64)
    ops = np.concatenate(op) if op else np.zeros(0, dtype=np.int64)
    stp = np.concatenate(step) if step else np.zeros(0, dtype=np.int64)
    times = np.asarray(logged, dtype=np.float64).reshape(-1, 2, n) if logged else \
        np.zeros((0, 2, n))
    # instance numbers: the k-th host collective, the k-th device collective
    instance = np.empty(len(dev), dtype=np.int64)
    for kind in (0, 1):
        pick = dev == kind
        instance[pick] = np.arange(int(pick.sum()))
    key = list(zip(dev.tolist(), instance.tolist()))
    tables = [{"key": key, "device": dev.tolist(), "name": name, "step": stp, "op": ops,
               "arrive": times[:, 0, r], "leave": times[:, 1, r]} for r in range(n)]
    return Collectives(tables)


_INDEX: dict = {}


def _coll_index(shape) -> tuple[set, set]:
    """The device op indices of a shape's host collectives and of its collective kernels
    (walking its host ops as the device ops are issued)."""
    got = _INDEX.get(shape.host)
    if got is not None:
        return got
    host, dev = set(), set()
    d = 0
    for h in shape.host:
        kind = h.kind
        if kind == "hcoll":
            host.add(d)
            d += 1
        elif kind == "graph":
            for node in h.nodes:
                if node.kind == "c":
                    dev.add(d)
                d += 1
        elif kind in ("launch", "record", "wait_event", "sync"):
            d += 1
        elif kind == "wait_stream":
            d += 2
    _INDEX[shape.host] = got = (host, dev)
    return got


__all__ = ["RankRun", "RanksApart", "run_plans", "run_ranks"]
