"""Runs that pick their step shapes as they go (``scheduling.rule: sglang``), in lockstep.

Each run is the fast executor's realizing walk (:class:`~simwar.executors.fast.shapes.ShapeRun`):
at iteration k's step marker its workload model fixes step k's sizes and shape from its own
queue, at its own host clock, and the step runs in that run's context (its shape and the few
before it). The runs advance together, a step at a time: at each step they are grouped by
the block they run (the context's Shape, interned across the runs, and which parameters are
drawn) and each group's block runs once, in the code generator's array target
(:mod:`simwar.executors.fast.codegen`), over the runs that picked it: their host clocks,
stream tails, record history, window sums and per-step rows gathered by index, the results
put back (:class:`_Picked`). A constant parameter is an array of the runs' constants (each
context's made once), the drawn ones the runs' rows side by side. Every number is the
same rule on the same values in the same order as the fast executor's walk of each run, so
each run's per-step facts are its own, bit for bit.

Each run's realized steps are then its plan (``ShapeRun.plan``): when no race of it needs an
op's times and its forwards ran in order, its table and summary are made from its column of
the group's per-step facts, as :func:`~simwar.executors.fast.realize_shapes` makes them from
its own; otherwise the fast executor runs that plan again for them (the same second pass the
fast executor takes). Either way each summary is ``simulate(cfg).summary``, bit for bit
(``tests/test_shapes.py``).

A run's step window (``cw``, ``cl``: which step's forward last started and closed; plain
integers in the generated code) is kept per run, and runs are grouped by it too, so a block
never runs over runs whose windows differ.

Imports: numpy, :mod:`simwar.analysis.metrics`, :mod:`simwar.builder.sizes`, the fast
executor's walk, pass and races, and :mod:`simwar.executors.lockstep.execute` (its state and
refusal).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from simwar.analysis.metrics import SITES
from simwar.builder.sizes import ArrivalProcess, draw_sizes
from simwar.core.collector import gc_paused
from simwar.executors import fast
from simwar.executors.fast.execute import _finish, run_plan
from simwar.executors.fast.races import RacePlan
from simwar.executors.fast.shapes import FORWARD, ShapeRun
from simwar.executors.lockstep.execute import NotLockstep, State, _unfit


class _Picked:
    """Rows of a per-step 2-d array (a row per step, a column per run) seen through the runs
    ``idx`` of a group: ``a[r]`` reads their row-``r`` values, ``a[r] = v`` writes them."""

    __slots__ = ("a", "idx")

    def __init__(self, a: np.ndarray, idx: np.ndarray):
        self.a = a
        self.idx = idx

    def __getitem__(self, r: int) -> np.ndarray:
        return self.a[r, self.idx]

    def __setitem__(self, r: int, v) -> None:
        self.a[r, self.idx] = v


def _of(v, idx):
    """The runs ``idx`` of a value over every run (a number stays a number)."""
    return v if np.ndim(v) == 0 else v[..., idx]


def realize_shape_group(cfgs: list, window: int = 2) -> list[dict]:
    """The summaries of runs that pick their step shapes as they go, in lockstep (see the
    module docstring), in their order: each ``simulate(cfg).summary``, bit for bit. Raises
    :class:`NotLockstep` for runs of different lengths or launch-ahead, or a negative or ``-0.0``
    parameter."""
    return [run.summary for run in realize_shape_runs(cfgs, window)]


def realize_shape_runs(cfgs: list, window: int = 2) -> list:
    """:func:`realize_shape_group`'s runs, each a
    :class:`~simwar.executors.fast.execute.FastRun` (its per-step table, summary and
    races: the fast executor's ``realize`` of that config, bit for bit)."""
    for cfg in cfgs:
        fast.one_rank(cfg)
    with gc_paused():  # many small objects a step, none cyclic: as simulate runs one run
        return _realize(cfgs, window)


def _realize(cfgs: list, window: int) -> list:
    if len({(c.steps, c.policy.launch_ahead) for c in cfgs}) > 1:
        raise NotLockstep("runs of different lengths or launch-ahead")
    interned: dict = {}  # shared: one Shape object per structure across the runs
    runs = []
    for cfg in cfgs:
        sizes = draw_sizes(cfg)
        runs.append(ShapeRun(cfg, sizes, ArrivalProcess(cfg, sizes), interned))
    n = len(runs)
    steps, depth = runs[0].steps, runs[0].depth
    state = State(0, steps, set(SITES), depth, n, marks=True)
    state.w = np.zeros(n)
    state.dp = np.zeros(n)
    cw = [-1] * n  # per run: the step whose forward last started, last closed
    cl = [-1] * n
    bad = [False] * n
    consts: dict = {}  # the stacked constants of a group, by its runs' contexts
    arrays = _Constants()
    for k in range(steps + 1):
        t = state.t.tolist()
        groups: dict = {}
        for j, run in enumerate(runs):
            ctx = run.pick(k, t[j])  # each run at its own host clock
            groups.setdefault((ctx.block, cw[j], cl[j]), []).append((j, ctx, run.take(k, ctx)))
        parts = [_run_block(state, members, n, k, consts, arrays, key[1], key[2])
                 for key, members in groups.items()]
        if len(parts) > 1:  # each group's runs put back
            _merge(state, parts, n)
        for sub, idx in parts:
            for j in (range(n) if idx is None else idx.tolist()):
                cw[j], cl[j] = sub.cw, sub.cl
                bad[j] = bad[j] or sub.bad
    out = [_result(run, state, j, bad[j], window) for j, run in enumerate(runs)]
    state.release()
    return out


class _Constants(dict):
    """Per context (by id; the contexts live as long as the group's runs): its constant
    parameters as an array, made and checked once."""

    def of(self, ctx) -> np.ndarray:
        arr = self.get(id(ctx))
        if arr is None:
            arr = self[id(ctx)] = np.array(ctx.consts, dtype=np.float64)
            if _unfit(arr):
                raise NotLockstep("a negative or -0.0 parameter")
        return arr

    def stack(self, contexts: list) -> tuple:
        """A group's constant parameters: per slot, one element per run (the same number,
        for runs that have the same, adds as the number would)."""
        if len(contexts) == 1:
            return tuple(self.of(contexts[0])[:, None])
        return tuple(np.stack([self.of(c) for c in contexts], axis=1))


def _run_block(state: State, members: list, n: int, k: int, consts: dict,
               arrays: _Constants, cw: int, cl: int):
    """Run step k's block over the runs of one group (``members``: ``(run, context,
    parameters)``, their window ``cw``, ``cl``): ``(the group's state, its runs' indices, or
    None for every run)``."""
    ctx = members[0][1]
    key = tuple([id(c) for _, c, _ in members])
    kk = consts.get(key)
    if kk is None:
        if len(consts) > 4096:  # groups that keep changing: keep only the recent
            consts.clear()
        kk = consts[key] = arrays.stack([c for _, c, _ in members])
    rows = np.array([p for _, _, p in members], dtype=np.float64).reshape(len(members), -1)
    if _unfit(rows):
        raise NotLockstep("a negative or -0.0 parameter")
    cols = [(col,) for col in rows.T]  # a row per pass (one), an element per run
    if len(members) == n:  # every run: the state's own values
        idx = None
        sub = SimpleNamespace(t=state.t, tails=state.tails, hist=state.hist, fs=state.fs,
                              fe=state.fe, launch=state.launch, done=state.done,
                              blocked=state.blocked, busy=state.busy, dep=state.dep,
                              w=state.w, dp=state.dp)
    else:
        idx = np.array([j for j, _, _ in members], dtype=np.intp)
        sub = SimpleNamespace(
            t=state.t[idx], tails={lane: _of(v, idx) for lane, v in state.tails.items()},
            hist=[tuple(_of(a, idx) for a in h) if isinstance(h, tuple) else h[:, idx]
                  for h in state.hist],
            fs=_Picked(state.fs, idx), fe=_Picked(state.fe, idx),
            launch=_Picked(state.launch, idx), done=_Picked(state.done, idx),
            blocked={site: _Picked(a, idx) for site, a in state.blocked.items()},
            busy=_Picked(state.busy, idx), dep=_Picked(state.dep, idx),
            w=_of(state.w, idx), dp=_of(state.dp, idx))
    sub.cw, sub.cl, sub.bad, sub.logs = cw, cl, False, []
    ctx.array_fn(range(k, k + 1), kk, cols, sub)
    if idx is None:  # what the block rebound, kept
        state.t, state.hist, state.w, state.dp = sub.t, sub.hist, sub.w, sub.dp
    return sub, idx


def _merge(state: State, parts: list, n: int) -> None:
    """Put the groups' host clocks, stream tails, window sums and newest record times back
    into the state's arrays over every run (new arrays: a value a block kept, in a tail or a
    record, stays what it was)."""
    t = np.empty(n)
    w = np.empty(n)
    dp = np.empty(n)
    for sub, idx in parts:
        t[idx] = sub.t
        w[idx] = sub.w
        dp[idx] = sub.dp
    state.t, state.w, state.dp = t, w, dp
    lanes = {lane for sub, _ in parts for lane in sub.tails}
    tails = {}
    for lane in lanes:
        old = state.tails.get(lane, 0.0)
        arr = np.array(np.broadcast_to(old, (n,)), dtype=np.float64)
        for sub, idx in parts:
            if lane in sub.tails:
                arr[idx] = sub.tails[lane]
        tails[lane] = arr
    state.tails = tails
    # the newest record times: row i, record i of each run's step (runs of fewer records
    # leave NaN, which no binding of theirs reads); the older ones shift as the blocks did
    newest = [sub.hist[0] if sub.hist else () for sub, _ in parts]
    rows = max(len(h) for h in newest)
    h1 = np.full((rows, n), np.nan)
    for h, (_, idx) in zip(newest, parts):
        for i, v in enumerate(h):
            h1[i, idx] = v
    if state.hist:
        state.hist = [h1, *state.hist[:-1]]


def _result(run: ShapeRun, state: State, j: int, bad: bool, window: int):
    """Run ``j``'s table, summary and races: from its column of the per-step facts when no
    race of its plan needs an op's times and its forwards ran in order, else from the fast
    executor's pass over its plan (as :func:`simwar.executors.fast.realize_shapes` takes
    either way)."""
    plan = run.plan()
    if not bad:
        races = RacePlan(plan, window)
        if races.windowed and not any(races.logs):
            races.reset()
            # its own copies: the state's arrays serve the next batch
            col = SimpleNamespace(**{name: getattr(state, name)[:, j].copy() for name in
                                     ("fs", "fe", "launch", "done", "busy", "dep")},
                                  blocked={site: a[:, j].copy()
                                           for site, a in state.blocked.items()},
                                  origin=0, collect=False)
            return _finish(plan, col, races, FORWARD)
    return run_plan(plan, window)
