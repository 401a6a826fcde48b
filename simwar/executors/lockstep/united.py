"""Lockstep groups of different structures run as one pass over their blocks' unions.

A sweep's groups (:func:`~simwar.executors.lockstep.execute.group_key`: runs of one
structure) often differ in one op per step: a whole-forward stream wait in one barrier, a
wait on a published read-done event in another, the same kernels, launches and CPU work
around them. A lockstep pass costs numpy's fixed cost per call, per op and step, whatever
the number of runs (about 80 calls a step for a group of 100 runs), so two such groups cost
nearly twice what one of twice the runs costs. :func:`unite` finds the groups whose plans
have the same frame (the same blocks over the same steps, warm-up, forward stream and
backbone; the shapes and the sites synced at may differ) and whose blocks each have a union
(:func:`~simwar.executors.fast.union.family_codes` with
:data:`~simwar.executors.fast.union.PLACED_WAITS`: records, waits on events, host syncs
*and stream waits* may differ around one backbone) that costs less than the groups' passes
apart (:func:`_pays`). :func:`run_united` runs them as lanes
of one pass on the unions' code, in the code generator's array target: each guarded op's
results kept only in the lanes of the groups that have it (its host cost 0.0 in the
others), each lane on its own run's parameters, its records picked in its group's order;
so every lane's numbers are its own run's, the same operations in the same order, bit for
bit (``tests/test_lockstep.py``'s random grids of two barriers, against each run alone).

Races: each group's race plan, as its own pass would make it
(:class:`~simwar.executors.fast.races.RacePlan`); the union logs every op time any of them
logs, and after each chunk of passes each plan takes its own logs (the same arrays, every
lane's) and counts its pairs over them; a run's counts are its group's, in its lane. The
summaries are the lockstep executor's (:func:`~simwar.executors.lockstep.execute._summaries`),
a group's runs never in one chunk with another's.

Imports: the one-pass executor's plans, unions, codegen and races; this package's pass and
its family lanes' constants.
"""

from __future__ import annotations

from simwar.executors.fast.codegen import compile_block
from simwar.executors.fast.execute import marks_results
from simwar.executors.fast.plan import Plan
from simwar.executors.fast.races import RacePlan
from simwar.executors.fast.union import PLACED_WAITS, backbone_of, family_codes
from simwar.executors.lockstep.execute import (
    NotLockstep,
    State,
    _LockstepTally,
    _measured_range,
    _summaries,
    block_chunks,
    group_key,
)
from simwar.executors.lockstep.family import _consts

#: what an op a lane may lack costs in the union's pass, in ops a lane has: it runs in every
#: lane, and its results are kept by a ``where`` (or a masked sum) in those that have it
GUARD_COST = 2.0


def _frame(plan: Plan, window: int) -> tuple:
    """:func:`group_key` but for the blocks' shapes (and so their parameters) and the sites
    synced at (each a column of every run's, 0.0 where its run has no sync there, as
    :func:`~simwar.executors.lockstep.execute._summaries` gives a site no op syncs at),
    with each block's backbone: groups of one frame may unite (others have no union)."""
    blocks, lo, hi, _sites, *rest = group_key(plan, window)
    return (tuple(b[1:4] for b in blocks), lo, hi, *rest,
            tuple(tuple(backbone_of(b.shape, PLACED_WAITS)) for b in plan.blocks))


def unite(reps: list[Plan], window: int = 2) -> list[list[int]]:
    """The groups (each given by one of its plans, ``reps``) that run as one pass: lists of
    their indices, every group in one list, in the order of their first."""
    out: list[list[int]] = []
    frames: dict[tuple, list[list[int]]] = {}
    for gi, rep in enumerate(reps):
        alike = frames.setdefault(_frame(rep, window), [])
        for united in alike:
            if _pays([reps[g] for g in united] + [rep]):
                united.append(gi)
                break
        else:
            alike.append([gi])
            out.append(alike[-1])
    return out


def _pays(reps: list[Plan]) -> bool:
    """Whether the plans' blocks have unions that cost less than their passes apart.

    A lockstep pass costs about one numpy call per host op and pass (a few more for a
    kernel or a wait, the same for every group), whatever its runs: numpy's fixed cost per
    call is most of it up to a batch of runs (a call over 100 runs costs about what one
    over 1 does). So the union's cost is its host ops, an op a group lacks counted
    :data:`GUARD_COST` times, and the groups' apart the sum of theirs, each over its block's
    passes (the generated code of the benchmark's grids: 64 to 95 numpy calls a pass for a
    union of two to four barriers, against 112 to 343 for its groups apart)."""
    unions = family_codes(reps, placed=PLACED_WAITS)
    if unions is None or any(u is None for u in unions):
        return False
    blocks = reps[0].blocks
    united = sum(b.n * (len(u.shape.host) + (GUARD_COST - 1) * len(u.guards))
                 for b, u in zip(blocks, unions))
    apart = sum(b.n * len(p.blocks[bi].shape.host) for p in reps for bi, b in enumerate(blocks))
    return united < apart


def run_united(groups: list[list[Plan]], window: int = 2) -> list[dict]:
    """The summaries of the runs of ``groups`` (each a list of plans of one
    :func:`group_key`, together a list of :func:`unite`), in their order: one pass over the
    blocks' unions, a lane per run (see the module)."""
    reps = [g[0] for g in groups]
    plan = reps[0]
    fwd = plan.meta.get("forward_stream", "forward")
    unions = family_codes(reps, placed=PLACED_WAITS)
    if unions is None or any(u is None for u in unions):
        raise NotLockstep("groups without a union")
    if len({_frame(r, window) for r in reps}) > 1 or any(r.negative for r in reps):
        raise NotLockstep("groups of different frames, or negative durations")
    measured = _measured_range(plan, fwd)
    races = [RacePlan(r, window) for r in reps]
    if measured is None or any(_measured_range(r, fwd) != measured for r in reps) or \
            not all(r.windowed for r in races):
        raise NotLockstep("races compared over all accesses, or holes in the steps")
    plans = [p for g in groups for p in g]
    members = [gi for gi, g in enumerate(groups) for _ in g]
    n = len(plans)
    depth = plan.depth
    sites = set().union(*(r.sites for r in reps))
    state = State(plan.lo, plan.hi, sites, depth, n, marks_results(plan))
    tallies = [_LockstepTally(n) for _ in groups]
    for r, tally in zip(races, tallies):
        r.reset(new_log=list, tally=tally)
    first, last = measured
    try:
        for bi, b in enumerate(plan.blocks):
            u = unions[bi]
            # the union logs what any group's race plan logs; each takes its own
            own = [[(u.maps[g][1][dev], what) for dev, what in r.logs_of(bi)]
                   for g, r in enumerate(races)]
            u.log = tuple(sorted({entry for entries in own for entry in entries}))
            at = {entry: i for i, entry in enumerate(u.log)}
            fn = compile_block(u.shape, (False,) * u.shape.nparams, fwd, False, u.log, depth,
                               target="array", union=u.guards, merged=u.merged)
            consts = _consts(u, [p.blocks[bi].consts for p in plans], members)
            logs = state.logs = [[] for _ in u.log]
            for _, _, ks in block_chunks(b, state.origin):
                fn(ks, consts, (), state)
                for entries, r in zip(own, races):  # each plan's logs, then its counts
                    for mine, entry in zip(r.log_arrays(bi), entries):
                        mine.extend(logs[at[entry]])
                    r.tally(first, last)
                for log in logs:
                    log.clear()
        if state.bad:
            raise NotLockstep("forward steps issued out of order")
        totals, spans = [], []
        for g, r, tally in zip(groups, races, tallies):
            r.counted(first, last)
            spans.append((len(totals), len(totals) + len(g)))
            totals += tally.totals(slice(*spans[-1]))
        return _summaries(plans, state, totals, measured, spans)
    finally:
        state.release()
