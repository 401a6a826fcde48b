"""A family's members as the lanes of one lockstep pass.

``advise``'s families (candidates that differ only in where read-done is published) run on
one code per block, the union of the members' shapes
(:mod:`simwar.executors.fast.union`). The one-pass executor runs each member on it in
turn; here they run side by side, a lane each, in the code generator's array target
(:mod:`simwar.executors.fast.codegen`): every op of the union runs for every lane, the ops
a member does not have kept only in the lanes of the members that have them (each guarded
op's flag an array of a truth value per lane; its host cost 0.0 in the others, so their
host clock does not move), each lane on its member's own parameters, its records picked in
its own order for the segments after. Every lane's numbers are so its member's own run's,
the same operations in the same order on the same numbers, bit for bit
(``tests/test_family_lanes.py`` against each member run alone).

Each member keeps its own race plan (:mod:`simwar.executors.fast.famraces`): the union logs
every member's op times for every lane, and a member's logs are its lane of the ones it
logs. Its per-step table, races and summary are then made by the one-pass executor's
``_finish`` from its lane of the per-step facts, as its own run makes them from its own;
the summaries of all of them at once (:func:`~simwar.analysis.batched.summarize_many`, as
the lockstep executor's groups take theirs: each :func:`~simwar.analysis.metrics.summarize`'s
bit for bit).

:func:`run_family` takes a family of :data:`LANES_MIN` members or more where it can (every
block a union of constants that are numbers at or above 0 and not -0.0, the members' race
plans windowed, the forwards in order), and otherwise runs the members one by one, as
:func:`simwar.executors.fast.run_family` does.

Imports: numpy, simwar.analysis.metrics, the one-pass executor (its family plans, codegen,
pass) and this package's state.
"""

from __future__ import annotations

import numpy as np

from simwar.analysis.batched import summarize_many
from simwar.analysis.metrics import SITES
from simwar.executors import fast
from simwar.executors.fast.codegen import compile_block
from simwar.executors.fast.execute import _finish, marks_results
from simwar.executors.lockstep.execute import CHUNK, NotLockstep, State, _unfit

#: the fewest members run as lanes: a lockstep pass costs numpy's fixed cost per call, about
#: four calls per op of the union whatever the lanes, against an op's run per member in one
#: pass; with fewer members the one-pass runs cost less (``advise`` on the benchmark's custom
#: algorithm, at one process: 3 phases, families of 9, 0.16 s as one-pass runs against 0.25 s
#: as lanes; 12 phases, families of 36, 1.06 to 1.20 s against 1.01 to 1.06 s)
LANES_MIN = 24


def run_family(cfgs: list, sizes: list, window: int = 2, summary_only: bool = False,
               family=None) -> list:
    """:func:`simwar.executors.fast.run_family`'s runs, bit for bit, the members as lanes of
    one pass where they can be (see the module) and are :data:`LANES_MIN` or more."""
    plans, unions, races = fast.family_plans(cfgs, sizes, window, family)
    if unions is not None and not summary_only and len(plans) >= LANES_MIN:
        try:
            return _lanes(plans, unions, races)
        except NotLockstep:
            pass
    return fast.run_members(plans, unions, races, window, summary_only)


class _Lane:
    """One lane's per-step facts, as the one-pass executor's state holds them (what its
    ``_finish`` reads)."""

    def __init__(self, state: State, m: int):
        self.origin = state.origin
        self.collect = False
        self.fs = np.ascontiguousarray(state.fs[:, m])
        self.fe = np.ascontiguousarray(state.fe[:, m])
        self.launch = np.ascontiguousarray(state.launch[:, m])
        self.busy = np.ascontiguousarray(state.busy[:, m])
        self.dep = np.ascontiguousarray(state.dep[:, m])
        self.done = None if state.done is None else np.ascontiguousarray(state.done[:, m])
        self.blocked = {site: np.ascontiguousarray(v[:, m]) for site, v in state.blocked.items()}


def _lanes(plans: list, unions: list, races: list) -> list:
    first = plans[0]
    n = len(plans)
    meta = first.meta
    fwd = meta.get("forward_stream", "forward")
    sites = set(SITES) | first.sites
    if (any(u is None for u in unions) or any(not r.windowed for r in races)
            or any(p.negative or p.lo != first.lo or p.hi != first.hi
                   or set(SITES) | p.sites != sites
                   or p.meta.get("forward_stream", "forward") != fwd for p in plans)):
        raise NotLockstep("not a family of unions")
    if any(h.kind == "sync" and h.site not in sites for u in unions for h in u.shape.host):
        raise NotLockstep("a sync at a site a member has no column for")
    depth = first.depth
    state = State(first.lo, first.hi, sites, depth, n, marks_results(first))
    try:
        for r in races:
            r.reset()
        for bi, b in enumerate(first.blocks):
            u = unions[bi]
            consts = _consts(u, [p.blocks[bi].consts for p in plans])
            fn = compile_block(u.shape, (False,) * u.shape.nparams, fwd, False, u.log, depth,
                               target="array", union=u.guards)
            state.logs = [[] for _ in u.log]
            for start in range(0, b.n, CHUNK):
                ks = b.steps[start:min(b.n, start + CHUNK)]
                lo = state.origin
                ks = range(ks.start - lo, ks.stop - lo) if isinstance(ks, range) else \
                    [k - lo for k in ks]
                fn(ks, consts, (), state)
            _share_logs(u, bi, state.logs, races, n)
        if state.bad:
            raise NotLockstep("forward steps issued out of order")
        runs = [_finish(p, _Lane(state, m), r, fwd) for m, (p, r) in enumerate(zip(plans,
                                                                                     races))]
    finally:
        state.release()
    _summaries(runs)
    return runs


def _summaries(runs: list) -> None:
    """Each run's summary, of every run at once where their tables have the same steps
    (:func:`~simwar.analysis.batched.summarize_many`: each :func:`summarize`'s, bit for
    bit, as the lockstep executor's groups take theirs); else each made when read."""
    first = runs[0].columns
    if any(r.columns.keys() != first.keys()
           or not np.array_equal(r.columns["step"], first["step"]) for r in runs):
        return
    columns = {k: v if k == "step" else np.stack([r.columns[k] for r in runs])
               for k, v in first.items()}
    for run, summary in zip(runs, summarize_many(columns, [r.meta for r in runs],
                                                 [r.hazards for r in runs])):
        run.set_summary(summary)


def _consts(u, consts: list[tuple]) -> tuple:
    """The union's ``K`` for the lanes: per parameter an array of each member's (a 0-d one
    where all are equal), per flag an array of truth values, and the picker of each lane's
    records (:func:`_picker`)."""
    rows = [u.consts(m, c) for m, c in enumerate(consts)]
    k = u.shape.nparams
    params = np.array([r[:k] for r in rows], dtype=np.float64).reshape(len(rows), k)
    if _unfit(params):
        raise NotLockstep("a negative or -0.0 parameter")
    out: list = [np.array(col[0]) if (col == col[0]).all() else np.ascontiguousarray(col)
                 for col in params.T]
    flags = np.array([r[k:-1] for r in rows], dtype=bool).reshape(len(rows), len(u.guards))
    out += [np.ascontiguousarray(col) for col in flags.T]
    out.append(_picker(u.picks))
    return tuple(out)


def _picker(picks: list[list[int]]):
    """``HP`` of the lanes: from the union's records (an array per record, an element per
    lane), each lane's in its member's order (a member with fewer records has its last
    ones padded with record 0's, which none of its ops reads)."""
    n = len(picks)
    most = max((len(p) for p in picks), default=0)
    idx = np.zeros((most, n), dtype=np.intp)
    for m, p in enumerate(picks):
        idx[:len(p), m] = p
    lanes = np.arange(n)

    def pick(recs: tuple) -> tuple:
        if not most:
            return ()
        return tuple(np.array(recs)[idx, lanes])

    return pick


def _share_logs(u, bi: int, logs: list, races: list, n: int) -> None:
    """Each member's logged op times of block ``bi``: its lane of the union's logs it logs,
    into its race plan's arrays."""
    # a row per lane (each member's log a row of it, contiguous, as its race plan reads it)
    table = [np.ascontiguousarray(np.array(log, dtype=np.float64).reshape(len(log), n).T)
             for log in logs]
    for m, r in enumerate(races):
        own = r.arrays[bi]
        for ui, j in enumerate(u.log_order(m, r.logs_of(bi))):
            if j >= 0:
                own[j] = table[ui][m]
