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

The races: the family's one race pass (:mod:`simwar.executors.fast.famraces`) gives each
pair of accesses compared and the members it is latent for; the union logs the op times any
member's race plan would, for every lane. Where each member's windows are its own segments'
(``FamilyPairs.own_windows``), the members' race counts (what the summary reads) are taken
over the lanes at once (:class:`_LaneRaces`: each pair's overlaps one difference of two
logged rows, counted in the lanes it is latent for, over the steps the summary asks), and a
member's race plan, its logs (its lane of the union's) and its races as progressions are
made only when its races are read (:class:`_LaneHazards`): each its own run's. Elsewhere
each member's race plan is made first and its logs are its lane's. Its per-step table is
made by the one-pass executor's ``_finish`` from its lane of the per-step facts, as its own
run makes it; the summaries of all of them at once
(:func:`~simwar.analysis.batched.summarize_many`, as the lockstep executor's groups take
theirs: each :func:`~simwar.analysis.metrics.summarize`'s bit for bit).

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
from simwar.executors.fast.races import FastHazards, RacePlan
from simwar.executors.fast.union import pick_in_order
from simwar.executors.lockstep.execute import NotLockstep, State, _unfit, block_chunks

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
    plans, unions, pairs = fast.family_unions(cfgs, sizes, window, family)
    if unions is not None and not summary_only and len(plans) >= LANES_MIN:
        races = None
        if pairs is not None and pairs.own_windows() and all(map(RacePlan.fits, plans)):
            # the races counted over the lanes, each member's race plan made when its races
            # are read (_LaneHazards): the unions log what any member's would
            logs = pairs.logs()
            for bi, u in enumerate(unions):
                if u is not None:
                    u.log = tuple(sorted(logs.get(bi, ())))
        else:
            races = fast.member_races(plans, unions, pairs, window)
        try:
            return _lanes(plans, unions, races, pairs, window)
        except NotLockstep:
            pass
    races = fast.member_races(plans, unions, pairs, window)
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


def _lanes(plans: list, unions: list, races: list | None, pairs=None, window: int = 2) -> list:
    """The members' runs as lanes (``races``: their race plans; None: their races counted
    over the lanes from ``pairs``, the family's race pass, see :class:`_LaneRaces`)."""
    first = plans[0]
    n = len(plans)
    meta = first.meta
    fwd = meta.get("forward_stream", "forward")
    sites = set(SITES) | first.sites
    if (any(u is None for u in unions) or not all(map(RacePlan.fits, plans))
            or any(p.negative or p.lo != first.lo or p.hi != first.hi
                   or set(SITES) | p.sites != sites
                   or p.meta.get("forward_stream", "forward") != fwd for p in plans)):
        raise NotLockstep("not a family of unions")
    if any(h.kind == "sync" and h.site not in sites for u in unions for h in u.shape.host):
        raise NotLockstep("a sync at a site a member has no column for")
    depth = first.depth
    state = State(first.lo, first.hi, sites, depth, n, marks_results(first))
    tables: dict[int, dict] = {}  # per block: the union's logs, a row per pass (lazy races)
    try:
        for r in races or ():
            r.reset()
        for bi, b in enumerate(first.blocks):
            u = unions[bi]
            consts = _consts(u, [p.blocks[bi].consts for p in plans])
            fn = compile_block(u.shape, (False,) * u.shape.nparams, fwd, False, u.log, depth,
                               target="array", union=u.guards, merged=u.merged)
            state.logs = [[] for _ in u.log]
            for _, _, ks in block_chunks(b, state.origin):
                fn(ks, consts, (), state)
            if races is not None:
                _share_logs(u, bi, state.logs, races, n)
            else:
                tables[bi] = {entry: np.array(log, dtype=np.float64).reshape(len(log), n)
                              for entry, log in zip(u.log, state.logs)}
        if state.bad:
            raise NotLockstep("forward steps issued out of order")
        if races is None:
            counted = _LaneRaces(pairs, tables, window)
            races = [_Given(_LaneHazards(counted, m)) for m in range(n)]
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


def _consts(u, consts: list[tuple], members: list[int] | None = None) -> tuple:
    """The union's ``K`` for the lanes: per parameter an array of each member's (a 0-d one
    where all are equal), per flag an array of truth values, and the picker of each lane's
    records (:func:`_picker`). ``consts``: per lane, its own block's constants; ``members``:
    per lane, the member of the union it is (default: lane m is member m)."""
    if members is None:
        members = range(len(consts))
    rows = [u.consts(m, c) for m, c in zip(members, consts)]
    k = u.shape.nparams
    params = np.array([r[:k] for r in rows], dtype=np.float64).reshape(len(rows), k)
    if _unfit(params):
        raise NotLockstep("a negative or -0.0 parameter")
    out: list = [np.array(col[0]) if (col == col[0]).all() else np.ascontiguousarray(col)
                 for col in params.T]
    flags = np.array([r[k:-1] for r in rows], dtype=bool).reshape(len(rows), len(u.guards))
    out += [np.ascontiguousarray(col) for col in flags.T]
    out.append(_picker([u.picks[m] for m in members]))
    return tuple(out)


def _picker(picks: list[list[int]]):
    """``HP`` of the lanes: from the union's records (an array per record, an element per
    lane), each lane's in its member's order (a member with fewer records has its last
    ones padded with record 0's, which none of its ops reads)."""
    n = len(picks)
    if n and all(p == picks[0] for p in picks):  # every lane's the same records: no gather
        return pick_in_order(picks[0])
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


class _Given:
    """What ``_finish`` asks of a race plan, for races already made (:class:`_LaneHazards`)."""

    windowed = True

    def __init__(self, hazards):
        self.hazards = hazards

    def finish(self, state):
        return self.hazards


class _LaneRaces:
    """The race counts of a family's lanes, every member's at once, from the family's race
    pass (``pairs``: each pair and the members it is latent for) and the union's logs
    (``tables``: per block, each logged op time a row per pass, a column per lane).

    Each member's counts are its race plan's (:meth:`FastHazards.counts` of its own run):
    its pairs are the pass's latent for it, each in the group of its later access's segment
    (a member's every window its own segment's: ``FamilyPairs.own_windows``), its overlaps
    the same differences of the same logged times (its lane's), counted over the same steps
    (``j0 .. j1`` of each pair, the same for every member); the race steps the union of the
    pairs' later steps, per member."""

    def __init__(self, pairs, tables: dict, window: int):
        self.pairs, self.tables, self.window = pairs, tables, window
        self.cache: dict = {}

    def of(self, m: int, first: int, last: int | None) -> tuple[int, int, int]:
        got = self.cache.get((first, last))
        if got is None:
            got = self.cache[(first, last)] = self._counts(first, last)
        return got[m]

    def _counts(self, first: int, last: int | None) -> list[tuple[int, int, int]]:
        fp, w = self.pairs, self.window
        blocks = fp.plans[0].blocks
        n = len(fp.plans)
        part: dict[int, tuple[int, int]] = {}  # seq segment -> (block, pass)
        c = 0
        for bi, b in enumerate(blocks):
            for i in range(min(b.n, w + 1)):
                part[c] = (bi, i)
                c += 1
        groups: dict[tuple, list] = {}  # (later segment, segments back) -> its pairs
        for i, k, latent in fp.found:
            ja, jb, ua, ub = fp.where(i, k)
            groups.setdefault((jb, jb - ja), []).append((ua, ub, latent))
        races = np.zeros(n, dtype=np.int64)
        overlaps = np.zeros(n, dtype=np.int64)
        spans: list[tuple[int, int, np.ndarray]] = []
        for (jb, back), members in groups.items():
            bi, i = part[jb]
            b = blocks[bi]
            count = 1 if i < w else b.n - w
            b_step = b.steps[0] + i
            a_step = b_step - back
            j0 = min(count, max(0, first - a_step, first - b_step))
            j1 = count if last is None else min(count, last - a_step + 1, last - b_step + 1)
            if j1 <= j0:
                continue
            if i >= w:
                abi, ap = bi, i - back
            else:
                abi, ap = _segment(blocks, b.g0 + i - back)
            latent = np.array([x[2] for x in members])
            e_log, s_log = self.tables[abi], self.tables[bi]
            positive = np.empty((len(members), n), dtype=np.int64)
            for q, (ua, ub, _) in enumerate(members):  # each pair's rows, compared in place
                # (a > b is a - b > 0 for every two doubles: a difference of two unequal
                # ones is never 0, and NaN and inf - inf compare false both ways)
                positive[q] = np.count_nonzero(
                    e_log[(ua, "e")][ap + j0:ap + j1] > s_log[(ub, "s")][i + j0:i + j1], axis=0)
            races += latent.sum(axis=0) * (j1 - j0)
            overlaps += (positive * latent).sum(axis=0)
            spans.append((b_step + j0, b_step + j1, latent.any(axis=0)))
        steps = np.zeros(n, dtype=np.int64)
        if spans:
            lo = min(x[0] for x in spans)
            covered = np.zeros((n, max(x[1] for x in spans) - lo), dtype=bool)
            for a, z, who in spans:
                covered[who, a - lo:z - lo] = True
            steps = covered.sum(axis=1)
        return [(int(r), int(o), int(s)) for r, o, s in zip(races, overlaps, steps)]


def _segment(blocks: list, g: int) -> tuple[int, int]:
    """(block, pass) of segment ``g`` (as :meth:`RacePlan._segment`)."""
    bi = max(j for j, b in enumerate(blocks) if b.g0 <= g)
    return bi, g - blocks[bi].g0


class _LaneHazards(FastHazards):
    """A member's races, counted over the lanes (:class:`_LaneRaces`); its race plan, logs
    and progressions made when its races are read (each as its own run's)."""

    def __init__(self, counted: _LaneRaces, m: int):
        plan = counted.pairs.plans[m]
        super().__init__(None, None, plan.lo, plan.hi, None)
        self._counted, self._m = counted, m
        self._made = False

    def _make(self) -> None:
        if self._made:
            return
        self._made = True
        counted, m = self._counted, self._m
        fp = counted.pairs
        races = RacePlan(fp.plans[m], counted.window, windows=fp.windows(only=m)[m])
        races.reset()
        for bi, table in counted.tables.items():
            devs = fp.unions[bi].maps[m][1]
            own = races.arrays[bi]
            for j, (dev, what) in enumerate(races.logs[bi]):
                own[j] = np.ascontiguousarray(table[(devs[dev], what)][:, m])
        made = races.finish(None)
        self._parts, self._order = made._parts, made._order

    @property
    def rows(self):
        self._make()
        return FastHazards.rows.fget(self)

    @property
    def buffer_order(self) -> dict:
        self._make()
        return FastHazards.buffer_order.fget(self)

    def _columns(self) -> tuple:
        self._make()
        return FastHazards._columns(self)

    def counts(self, first: int, last: int | None) -> tuple[int, int, int]:
        return self._counted.of(self._m, first, last)
