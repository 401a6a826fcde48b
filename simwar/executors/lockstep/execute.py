"""The pass of a group of runs in lockstep, and each run's summary.

:func:`run_group` takes the fast executor's plans of runs that share their structure
(:func:`group_key`: the same blocks of the same shapes over the same steps) and runs the
blocks once for all of them (the fast executor's code generator,
:mod:`simwar.executors.fast.codegen`, in its array target), each parameter a number when
every run has the same, else an array with one element per run. The per-step
facts are rows of 2-d arrays (a row per step, a column per run, the arrays reused batch
after batch); a chunk of runs at a time (:func:`summary_runs`, sized for the caches) is turned
to a row per run, tile by tile, and its per-step table assembled and summarized over all
its runs at once by the functions the fast executor's own runs use
(:func:`~simwar.analysis.metrics.columns_from_arrays`,
:func:`~simwar.analysis.batched.summarize_many`, or
:func:`~simwar.analysis.metrics.summarize` run by run for a varying workload), so each
summary is that run's, bit for bit. Races are the fast executor's race plan
(:class:`~simwar.executors.fast.races.RacePlan`, the same for every run of a group): counted
per run as the chunks go (:meth:`~simwar.executors.fast.races.RacePlan.tally`), the logged
times of all runs side by side.

:func:`realize_group` runs configs whose batches depend on their own times (arrivals: runs
with requests, each processed result marked): each pass first asks every run's workload
model for that run's sizes at its own host clock, as the fast executor's
:func:`~simwar.executors.fast.realize` does for one run.

A plan that cannot run so (forward steps issued out of order, races that need all accesses
compared, a negative or ``-0.0`` parameter: :func:`_unfit`) raises
:class:`NotLockstep`; its runs then go through the fast executor one by one.

Imports: numpy, simwar.core, simwar.analysis and simwar.builder.sizes (the workload models),
the fast executor (its entry points, plan, codegen and races).
"""

from __future__ import annotations

import mmap

import numpy as np

from simwar.analysis.batched import summarize_many
from simwar.analysis.metrics import SITES, StepFacts, columns_from_arrays, summarize
from simwar.builder.sizes import ArrivalProcess, draw_sizes
from simwar.core.refusals import PlanRefused
from simwar.core.trace import OpKind
from simwar.executors import fast
from simwar.executors.fast.codegen import compile_block
from simwar.executors.fast.execute import marks_results
from simwar.executors.fast.plan import Plan, plan_config
from simwar.executors.fast.races import RacePlan, _Intervals

#: passes of a block run per call of its compiled function
CHUNK = 256


class NotLockstep(PlanRefused):
    """A plan (or a group) the lockstep pass cannot take exactly; run it one by one."""


def group_key(plan: Plan, window: int = 2) -> tuple:
    """Plans with the same key run in lockstep: the same blocks (shapes, steps, which
    parameters are columns), the same steps and sites, and what the summary needs alike."""
    meta = plan.meta
    return (tuple((b.shape, b.g0, b.steps, b.marked, tuple(c is None for c in b.consts))
                  for b in plan.blocks),
            plan.lo, plan.hi, frozenset(plan.sites), frozenset(plan.offsets), plan.negative,
            window, meta.get("forward_stream", "forward"), int(meta.get("warmup_steps", 0)))


#: the per-step arrays of the last batch (flat), kept for the next one of that size or less
#: (a batch's arrays are large: allocating them anew costs the system a page fault per page)
_SPARE: list[np.ndarray] = []


def _array(shape: tuple, value: float) -> np.ndarray:
    """A ``shape`` array filled with ``value``: the smallest spare one large enough, else
    fresh pages of anonymous memory (:func:`_fresh`)."""
    size = shape[0] * shape[1]
    fits = [i for i, arr in enumerate(_SPARE) if arr.size >= size]
    if fits:
        flat = _SPARE.pop(min(fits, key=lambda i: _SPARE[i].size))
    else:
        flat = _fresh(size)
    arr = flat[:size].reshape(shape)
    arr.fill(value)
    return arr


def _fresh(size: int) -> np.ndarray:
    """``size`` float64 in memory mapped here rather than by numpy's allocator, which asks
    the kernel for huge pages for arrays this large (``madvise``): where the kernel then
    compacts memory to find them, as it does here, the first touch of a batch's arrays took
    about four times as long (0.47 against 0.12 CPU-s for 10,000 runs x 1,000 steps)."""
    if size * 8 < mmap.PAGESIZE:
        return np.empty(size)
    # private: Python's anonymous map is shared by default, so a sweep's worker processes,
    # forked after a batch left its arrays spare, would all write the parent's pages
    private = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    return np.frombuffer(mmap.mmap(-1, size * 8, flags=private), dtype=np.float64)


class State:
    """What carries from one block to the next, for ``n`` runs (see the codegen module)."""

    def __init__(self, lo: int, hi: int, sites, depth: int, n: int, marks: bool = False):
        rows = hi - lo + 1
        self.origin = lo
        self.t = np.zeros(n)  # an array from the start: every time derived is one too
        self.tails: dict = {}
        self.hist = [()] * depth
        self.fs = _array((rows, n), np.inf)
        self.fe = _array((rows, n), -np.inf)
        self.launch = _array((rows, n), np.nan)
        # result processed (runs with requests only: the others' batches stay as large)
        self.done = _array((rows, n), np.nan) if marks else None
        self.blocked = {site: _array((rows, n), 0.0) for site in sites}  # the sites synced at
        self.busy = _array((rows + 1, n), 0.0)  # the spare last row: index -1, no window yet
        self.dep = _array((rows + 1, n), 0.0)
        self.cw = -1  # the step whose forward last started
        self.cl = -1  # the step whose window (ending with its forward) last closed
        self.w = 0.0
        self.dp = 0.0
        self.bad = False
        self.logs: list = []

    def release(self) -> None:
        """Keep the arrays for the next batch (one of the same size or smaller takes them)."""
        mine = [self.fs, self.fe, self.launch, self.busy, self.dep, *self.blocked.values()]
        if self.done is not None:
            mine.append(self.done)
        _SPARE[:] = [_flat(arr) for arr in mine]


def _flat(arr: np.ndarray) -> np.ndarray:
    """The whole flat array ``arr`` (made by :func:`_array`) is the front of."""
    while arr.base is not None and isinstance(arr.base, np.ndarray):
        arr = arr.base
    return arr


def _unfit(x) -> bool:
    """Whether parameters ``x`` hold a number the pass cannot take: -0.0, on which ``max``
    and a comparison part, or one below 0 (the generated code takes a tail set since the host
    clock last moved as at or after it: :mod:`simwar.executors.fast.codegen`)."""
    return bool(np.signbit(np.asarray(x, dtype=np.float64)).any())


def _stack_consts(plans: list[Plan], bi: int) -> tuple:
    """Block ``bi``'s constant parameters: an array of one element per run, or a 0-d array
    where every run has the same number (numpy takes a 0-d array as an operand about twice
    as fast as a Python float, which it converts at every operation: the same sums)."""
    slots = [j for j, c in enumerate(plans[0].blocks[bi].consts) if c is not None]
    if not slots:
        return ()
    together = plans[0].bound[0] if plans[0].bound is not None else None
    if together is not None and all(p.bound is not None and p.bound[0] is together
                                    for p in plans):
        # bound at once: each constant's array (or number) of all of them, taken as it is
        mine = np.array([p.bound[1] for p in plans])
        shared = together.blocks[bi].consts
        columns = [np.asarray(shared[j][mine], dtype=np.float64)
                   if isinstance(shared[j], np.ndarray)
                   else np.full(len(plans), shared[j], dtype=np.float64) for j in slots]
    else:
        table = np.array([[p.blocks[bi].consts[j] for j in slots] for p in plans],
                         dtype=np.float64)
        columns = list(table.T)
    out = []
    for col in columns:
        if _unfit(col):
            raise NotLockstep("a negative or -0.0 parameter")
        out.append(np.array(col[0]) if (col == col[0]).all() else np.ascontiguousarray(col))
    return tuple(out)


def _stack_columns(plans: list[Plan], bi: int, start: int, stop: int) -> list[np.ndarray]:
    """Block ``bi``'s parameter columns for passes ``start..stop-1``: a row per pass, a
    column per run."""
    per_run = [p.blocks[bi].columns.arrays(start, stop) for p in plans]
    out = []
    for i in range(len(per_run[0])):
        col = np.stack([cols[i] for cols in per_run], axis=1)
        if _unfit(col):
            raise NotLockstep("a negative or -0.0 parameter")
        out.append(col)
    return out


def _fed_columns(passes: list):
    """``C(ki, t)`` of a block fed per pass (the array target's ``feed``): each run's
    ``next_pass(ki, t)`` called with its own host clock, in the runs' order; a column per
    parameter, an element per run."""

    def columns(ki: int, t: np.ndarray) -> tuple:
        rows = [next_pass(ki, tj) for next_pass, tj in zip(passes, t.tolist())]
        if not rows[0]:
            return ()
        cols = np.array(rows, dtype=np.float64).T
        if _unfit(cols):
            raise NotLockstep("a negative or -0.0 parameter")
        return tuple(cols)

    return columns


def _measured_range(plan: Plan, fwd: str) -> tuple[int, int] | None:
    """The measured steps of every run of the plan (they have the same rows: the steps
    with forward kernels), or None when they are not one run of steps."""
    steps: set[int] = set()
    for b in plan.blocks:
        offs = {op.off for op in b.shape.ops
                if op.kind == OpKind.KERNEL and op.lane == fwd and op.phase}
        if isinstance(b.steps, range):  # each offset a shifted range: no loop over steps
            for o in offs:
                steps.update(range(b.steps.start + o, b.steps.stop + o, b.steps.step))
            continue
        for s in b.steps:
            steps.update(s + o for o in offs)
    rows = sorted(steps)
    warm = int(plan.meta.get("warmup_steps", 0))
    measured = [s for s in rows[:-1] if s >= warm]
    if not measured or measured[-1] - measured[0] + 1 != len(measured):
        return None
    return measured[0], measured[-1]


class _RunCounts:
    """One run's race counts over the measured steps (what its summary asks)."""

    def __init__(self, totals: tuple[int, int, int], steps: tuple[int, int]):
        self.totals = totals
        self.steps = steps

    def counts(self, first: int, last: int) -> tuple[int, int, int]:
        assert (first, last) == self.steps, (first, last, self.steps)
        return self.totals


class _LockstepTally:
    """Race counts of a group: latent races and race steps are the same for every run,
    overlaps are counted per run."""

    def __init__(self, n: int):
        self.races = 0
        self.overlaps = np.zeros(n, dtype=np.int64)
        self.steps = _Intervals()

    def add(self, gi: int, ri: int, j0: int, b_step: int, overlap: np.ndarray) -> None:
        m = len(overlap)
        self.races += m
        self.steps.add(b_step, b_step + m)
        self.overlaps += np.count_nonzero(overlap > 0, axis=0)

    def result(self, plan, first, last) -> _LockstepTally:
        return self

    def totals(self, lanes=slice(None)) -> list[tuple[int, int, int]]:
        """Each run's (races, overlapping races, race steps) (``lanes``: of those runs)."""
        steps = self.steps.total()
        return [(self.races, int(o), steps) for o in self.overlaps[lanes].tolist()]


def block_chunks(block, origin: int, chunk: int = CHUNK):
    """The passes of ``block`` (a plan's) ``chunk`` at a time, as ``(start, stop, ks)``:
    passes ``start..stop-1``, ``ks`` their steps as rows of the state (less ``origin``, its
    first step)."""
    for start in range(0, block.n, chunk):
        stop = min(block.n, start + chunk)
        ks = block.steps[start:stop]
        yield start, stop, (range(ks.start - origin, ks.stop - origin)
                            if isinstance(ks, range) else [k - origin for k in ks])


def run_passes(fn, how: tuple, ks, consts: tuple, cols, state: State) -> None:
    """Run the passes ``ks`` of a block compiled in the array target (``fn``;
    ``compile_block(*how)``'s arguments but the feed and target), its parameter columns
    ``cols`` (a 2-d array per column, a row per pass, or a feed's callable). A block that sums
    its windows in the rows they close (``fn.sums_in_rows``: :mod:`~simwar.executors.fast.codegen`)
    takes no window carried from the block before: its first pass then runs in the picked
    form, which adds to it in the same order, and the rest as compiled."""
    if fn.sums_in_rows and len(ks) and (np.any(state.w) or np.any(state.dp)):
        feed = callable(cols)
        compile_block(*how, feed=feed, target="picked")(
            ks[:1], consts, cols if feed else [c[:1] for c in cols], state)
        ks, cols = ks[1:], cols if feed else [c[1:] for c in cols]
    fn(ks, consts, cols, state)


def run_group(plans: list[Plan], window: int = 2, feeds: list | None = None) -> list[dict]:
    """The summaries of runs whose plans share a :func:`group_key`, in their order.

    ``feeds``: per run, the ``feed`` its one-pass run would take
    (:func:`~simwar.executors.fast.execute.run_plan`; a workload fixed as the run goes,
    :func:`realize_group`): each pass calls every run's with that run's host clock, and its
    parameters are the runs' answers side by side."""
    plan = plans[0]
    n = len(plans)
    meta = plan.meta
    fwd = meta.get("forward_stream", "forward")
    if plan.negative:
        raise NotLockstep("negative durations")
    measured = _measured_range(plan, fwd)
    races = RacePlan(plan, window)
    if not races.windowed or measured is None:
        raise NotLockstep("races compared over all accesses, or holes in the steps")
    depth = plan.depth
    state = State(plan.lo, plan.hi, plan.sites, depth, n, marks_results(plan))
    tally = _LockstepTally(n)
    races.reset(new_log=list, tally=tally)
    first, last = measured
    for bi, b in enumerate(plan.blocks):
        slots = tuple(c is None for c in b.consts)
        how = (b.shape, slots, fwd, False, races.logs_of(bi), depth)
        fn = compile_block(*how, feed=feeds is not None, target="array")
        state.logs = races.log_arrays(bi)
        consts = _stack_consts(plans, bi)
        for start, stop, ks in block_chunks(b, state.origin):
            if feeds is not None:
                cols = _fed_columns([feed(bi, p.blocks[bi], start)
                                     for feed, p in zip(feeds, plans)])
            else:
                cols = _stack_columns(plans, bi, start, stop) if any(slots) else ()
            run_passes(fn, how, ks, consts, cols, state)
            races.tally(first, last)
    if state.bad:
        raise NotLockstep("forward steps issued out of order")
    races.counted(first, last)
    out = _summaries(plans, state, tally.totals(), measured)
    state.release()
    return out


#: bytes of one per-step fact of the runs summarized at a time (a row per run): the facts
#: of a chunk and the columns made from them stay in the caches (a summary reads each a few
#: times), and numpy's temporaries stay small enough to be reused rather than mapped anew
SUMMARY_BYTES = 256 << 10
#: steps per tile of the transposition (the facts are a row per step, the summaries want a
#: row per run): numpy copies a transposed array an element at a time, with a cache miss on
#: one side for each; a tile's rows stay in the cache on both
TILE_STEPS = 64
#: bytes of one per-step fact of the runs turned to rows at a time (several chunks): each
#: step's row is then read a few kB at a time rather than a chunk's 256 bytes a page apart
#: (about 7 % less for the summaries of a one-shape batch, 10 % for the mixed grid's)
ROWS_BYTES = 4 << 20


def summary_runs(steps: int) -> int:
    """Runs summarized at a time, for runs of ``steps`` measured steps."""
    return max(8, SUMMARY_BYTES // (8 * max(1, steps)))


def _run_rows(fact: np.ndarray, j0: int, j1: int, out: np.ndarray) -> np.ndarray:
    """Runs ``j0..j1-1`` of a per-step fact (a row per step, a column per run) as a row per
    run, C-contiguous (in ``out``, a buffer of at least that many rows reused chunk after
    chunk): the summaries reduce along each row (:mod:`simwar.analysis.batched`)."""
    steps = fact.shape[0]
    out = out[:j1 - j0]
    for s0 in range(0, steps, TILE_STEPS):
        out[:, s0:s0 + TILE_STEPS] = fact[s0:s0 + TILE_STEPS, j0:j1].T
    return out


def _summaries(plans: list[Plan], state: State, totals: list[tuple[int, int, int]],
               measured: tuple[int, int], spans: list[tuple[int, int]] | None = None
               ) -> list[dict]:
    """Each run's summary from its column of the per-step facts (``totals``: its race
    counts). ``spans``: ranges of runs of one structure (a united batch's groups,
    :mod:`.united`), none of whose chunks holds another's runs (default: all one)."""
    present = np.isfinite(state.fs)
    idx = np.flatnonzero(present[:, 0])
    if not np.array_equal(present.any(axis=1), present.all(axis=1)):
        raise NotLockstep("runs with different forward steps")
    if len(idx) and idx[-1] - idx[0] + 1 == len(idx):
        idx = slice(int(idx[0]), int(idx[-1]) + 1)
    steps = (np.arange(state.fs.shape[0])[idx] + state.origin).astype(np.int32)
    facts = {"fs": state.fs[idx], "fe": state.fe[idx], "launch": state.launch[idx],
             "busy": state.busy[idx], "dep": state.dep[idx]}
    marks = state.done is not None
    if marks:
        facts["done"] = state.done[idx]
    facts.update({("blocked", site): v[idx] for site, v in state.blocked.items()})
    out: list[dict] = []
    chunk = min(len(plans), summary_runs(len(steps)))
    span = min(len(plans), max(1, ROWS_BYTES // (8 * max(1, len(steps)) * chunk)) * chunk)
    buffers = {k: np.empty((span, len(steps))) for k in facts}
    for a, z in spans or [(0, len(plans))]:
        for s0 in range(a, z, span):  # the next span of runs as rows (each chunk's a view)
            s1 = min(z, s0 + span)
            spanned = {k: _run_rows(v, s0, s1, buffers[k]) for k, v in facts.items()}
            for j0 in range(s0, s1, chunk):
                j1 = min(s1, j0 + chunk)
                rows = {k: v[j0 - s0:j1 - s0] for k, v in spanned.items()}
                out += _chunk_summaries(plans[j0:j1], rows, steps, marks,
                                        [_RunCounts(t, measured) for t in totals[j0:j1]])
    return out


def _chunk_summaries(plans: list[Plan], rows: dict, steps: np.ndarray, marks: bool,
                     counts: list) -> list[dict]:
    """The summaries of a chunk of runs of one structure, their facts ``rows`` (a row per
    run)."""
    blocked = {k[1]: v for k, v in rows.items() if isinstance(k, tuple)}
    zero = np.broadcast_to(0.0, rows["fs"].shape)  # the sites no op syncs at
    blocked.update({site: zero for site in set(SITES) - set(blocked)})
    metas = [p.meta for p in plans]
    if any(m.get("workload") for m in metas):  # each run's own per-step facts
        out = []
        for j, meta in enumerate(metas):
            cols = columns_from_arrays(steps, rows["fs"][j], rows["fe"][j],
                                       rows["busy"][j], rows["dep"][j],
                                       {site: np.ascontiguousarray(v[j])
                                        for site, v in blocked.items()},
                                       rows["launch"][j], StepFacts(meta),
                                       rows["done"][j] if marks else None)
            out.append(summarize(cols, meta, counts[j]))
        return out
    columns = columns_from_arrays(steps, rows["fs"], rows["fe"], rows["busy"], rows["dep"],
                                  blocked, rows["launch"], StepFacts(metas[0]),
                                  rows.get("done"))
    return summarize_many(columns, metas, counts)


def realize_group(cfgs: list, window: int = 2) -> list[dict]:
    """The summaries of runs whose batches depend on their own times (arrivals: a run with
    requests, its results marked), in lockstep: each run's sizes fixed as the group goes,
    as :func:`simwar.executors.fast.realize` fixes one run's, so each summary is that of
    ``simulate(cfg)``, bit for bit. Raises :class:`NotLockstep` for configs whose plans do
    not share a :func:`group_key`, or that the lockstep pass cannot take (its runs then go
    one by one)."""
    plans, feeds = [], []
    for cfg in cfgs:
        fast.one_rank(cfg)
        if cfg.shapes_vary:  # :mod:`.shapes` runs them (the package's realize_group)
            raise NotLockstep(f"scheduling.rule {cfg.scheduling.rule}: each run picks its "
                              f"step shapes as it goes")
        sizes = draw_sizes(cfg)
        plan = plan_config(cfg, sizes, fill=False)
        plans.append(plan)
        feeds.append(fast.realizing_feed(cfg, sizes, ArrivalProcess(cfg, sizes), plan))
    if len({group_key(p, window) for p in plans}) > 1:
        raise NotLockstep("runs of different structures")
    return run_group(plans, window, feeds)
