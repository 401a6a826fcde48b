"""Tensor-parallel ranks in lockstep: every rank's plan run as one, a lane per rank.

The ranks of a run issue the same structure (docs/design.md, "Tensor-parallel ranks": the
k-th collective of one rank is the k-th of every rank) and differ in their numbers only:
their own draws, ``ranks.per_rank`` overrides, the late work of the slow rank. So each rank
is planned as a one-rank run is (:func:`plan_rank`: its first iterations built
symbolically and coupled as its Program is, its coupling's numbers uses of its draws), and
the fast executor's code generator runs the ranks' blocks together in its *lanes* target
(:mod:`simwar.executors.fast.codegen`): the scalar text once per rank, each lane's
variables its own, the lanes met at each collective, where the rules of
:mod:`simwar.core.rules` the SimPy engine takes are applied:

- a host collective: every rank leaves at the last rank's arrival plus its own cost, plus
  its wake-up when it waited (:func:`~simwar.core.rules.host_collective_leaves`);
- a device collective kernel: it begins on each rank by the stream rules and ends at the
  last rank's begin plus the rank's own duration (:func:`~simwar.core.rules.collective_ends`);

the last arrival ``max`` over the ranks in rank order, as the engine takes it. Every other
op is each rank's own, the same operations on the same values as the engine's, so every
time is the engine's bit for bit (``tests/test_ranks_lanes.py``). Each rank's state is the
one-rank executor's (:mod:`simwar.executors.fast.execute`), so its per-step table, races
and summary are made as a one-rank run's; each collective's arrival and leaving time is
logged per rank in issue order, which with the plan names each instance (its op, step,
host or device and instance number), and gives the group's table
(:func:`simwar.analysis.ranks.group_columns`). No Trace is kept: a run that needs one takes
:mod:`simwar.executors.fast.ranks`.

Ranks whose coupling the symbolic iterations cannot express (a drawn body split around its
collectives; iterations that never settle) are planned from their Programs, built uniform
(:func:`simwar.builder.ranks.rank_programs`: the late work issued at every step, 0 where
none). Ranks whose plans still differ in structure (a per-rank override that changes the
loop), whose forward steps are issued out of order, or that have negative durations raise
:class:`RanksApart`, and the run takes the next executor.

Imports: numpy, simwar.core, simwar.analysis, simwar.builder (the ranks' iterations and
Programs), the fast executor's plan, codegen, execute and races.
"""

from __future__ import annotations

from array import array

import numpy as np

from simwar.analysis.metrics import SITES
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
from simwar.executors.fast.execute import _finish, _State
from simwar.executors.fast.plan import Plan, Unsettled, bind, plan_program, plan_template
from simwar.executors.fast.races import RacePlan
from simwar.executors.lockstep.execute import block_chunks

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
    if sizes.shape is not None:  # the scheduler picks each step's shape: no first iterations
        raise Unsettled(f"scheduling.rule {cfg.scheduling.rule}: the ranks are planned from "
                        f"their Programs")
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


def _parameters(blocks: list, start: int, stop: int) -> tuple[tuple, tuple, list]:
    """The ranks' blocks' slots (a column where any rank has one), each rank's constants
    and, passes ``start..stop-1``, every rank's columns (a rank's constant repeated where
    another has a column), rank by rank."""
    slots = tuple(any(b.consts[j] is None for b in blocks) for j in range(len(blocks[0].consts)))
    consts, cols = [], []
    for b in blocks:
        consts.append(tuple(c for c, col in zip(b.consts, slots) if not col))
        if not any(slots):
            continue
        own = iter(b.columns(start, stop)) if any(c is None for c in b.consts) else iter(())
        cols += [next(own) if c is None else [c] * (stop - start)
                 for c, col in zip(b.consts, slots) if col]
    return slots, tuple(consts), cols


def run_plans(plans: list[Plan], window: int = 2, progress=None
              ) -> tuple[list[RankRun], Collectives]:
    """:func:`run_ranks` of the ranks' plans (:func:`plan_rank`, or
    :func:`~simwar.executors.fast.plan.plan_program` of each rank's Program, collectives
    shaped): the blocks compiled in the lanes target (:mod:`simwar.executors.fast.codegen`),
    a lane per rank, each rank's state the fast executor's own."""
    _check(plans)
    plan = plans[0]
    n = len(plans)
    fwd = plan.meta.get("forward_stream", "forward")
    depth = plan.depth
    sites = set(SITES) | plan.sites
    states = [_State(p.lo, p.hi, sites, depth, False) for p in plans]
    races = [RacePlan(p, window) for p in plans]
    for st, rp in zip(states, races):
        st.colls = array("d")
        rp.reset()
    for bi, b in enumerate(plan.blocks):
        blocks = [p.blocks[bi] for p in plans]
        fn = None
        for start, stop, ks in block_chunks(b, states[0].origin, CHUNK):
            slots, consts, cols = _parameters(blocks, start, stop)
            if fn is None:
                fn = compile_block(b.shape, slots, fwd, False, races[0].logs_of(bi), depth,
                                   target="lanes", lanes=n)
                for st, rp in zip(states, races):
                    st.logs = rp.log_arrays(bi)
            fn(ks, consts, cols, states)
            if progress is not None:
                progress(b.steps[stop - 1])
    if any(st.bad for st in states):
        raise RanksApart("forward steps issued out of order")
    out = []
    for r, (p, st, rp) in enumerate(zip(plans, states, races)):
        run = _finish(p, st, rp, fwd)  # the one-rank executor's table, races and summary
        out.append(RankRun(r, run.summary, run.columns, run.hazards, dict(p.meta)))
    return out, _collectives(plan, [st.colls for st in states])


def _collectives(plan: Plan, logged: list) -> Collectives:
    """The ranks' collectives from the times each rank logged in issue order (an arrival
    and a leaving time per instance) and the plan, which names each instance."""
    n = len(logged)
    device: list[np.ndarray] = []
    name: list = []
    step: list[np.ndarray] = []
    op: list[np.ndarray] = []
    base = 0
    for b in plan.blocks:
        nops = len(b.shape.ops)
        # (device op index, device?, name, step offset), in issue order (the collectives the
        # plan's device ops name: :func:`simwar.executors.fast.plan._devices`)
        mine = [(d, int(o.coll == "device"), o.label, o.off) for d, o in enumerate(b.shape.ops)
                if o.coll]
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
    times = np.stack([np.frombuffer(log, dtype=np.float64) if len(log) else np.zeros(0)
                      for log in logged], axis=1).reshape(-1, 2, n)
    # instance numbers: the k-th host collective, the k-th device collective
    instance = np.empty(len(dev), dtype=np.int64)
    for kind in (0, 1):
        pick = dev == kind
        instance[pick] = np.arange(int(pick.sum()))
    key = list(zip(dev.tolist(), instance.tolist()))
    tables = [{"key": key, "device": dev.tolist(), "name": name, "step": stp, "op": ops,
               "arrive": times[:, 0, r], "leave": times[:, 1, r]} for r in range(n)]
    return Collectives(tables)


__all__ = ["RankRun", "RanksApart", "run_plans", "run_ranks"]
