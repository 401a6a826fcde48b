"""The fast executor (``engine="fast"``): a Program's per-step table, summary and races in one
pass, without SimPy.

Once durations are drawn the schedule is deterministic, and the host's issue order is a
valid evaluation order (every input of an operation was issued before it). So one pass
over the host operations, placing each device operation by :mod:`simwar.core.rules` (the
functions the SimPy engine calls: ``begins``, ``fires``, ``released``, ``returns``),
gives the engine's times exactly. Nothing is recorded per operation: the per-step facts
the metrics need (forward start and end, forward-stream busy and held time per step
window, from one forward's end to the next's, host blocked time per site, the
``run_batch`` instant) are accumulated as the pass goes, into one array per fact, and
assembled by the same
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
the block like a drawn one (:class:`simwar.builder.loop.AffineTable` lays its per-use values out as
the draws are), and a graph launch's name (which carries its bucket, ``verify.graph@32``) is
not part of a shape. So a varying run is still three or four blocks. A workload whose batches
depend on simulated time (arrivals) is realized by :func:`realize`: the same plan in one
pass, each segment first calling back with the host clock at its marker, which fixes the
step's batch and evaluates the segment's step-dependent durations before its parameters are
read (:mod:`simwar.builder.sizes`); that pass is the run. A run whose scheduler picks each
step's shape from its queue (``scheduling.rule: sglang``) has no plan before it runs: its
realizing pass (:func:`realize_shapes`) plans each context of shapes it meets once (a step's
shape and the few before it, what its bindings depend on) and runs a step at a time, picking
the context's compiled block; the realized steps are then the plan of the run.

**Races.** Latent races depend only on issue order, streams, records, waits and syncs.
:func:`simwar.analysis.hazards.detect` compares accesses whose steps differ by at most
``window``; when every access belongs to its segment's step and segments are consecutive
steps, the pairs whose later access is in segment ``g`` lie in segments ``g - window .. g``,
and whether one happens before the other depends only on the operations issued between
them. So the pairs and their latent flag are a function of the ``window + 1`` shapes
ending at ``g``: they are computed once per distinct window by the same
:func:`~simwar.analysis.hazards.candidate_pairs` the engine's analysis uses (every window of
a run from one pass over its segments, each block cut to its first ``window + 1``), and
mapped onto every segment with that window. An observed overlap needs a latent pair (an
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
(:func:`~simwar.executors.fast.plan.plan_config`), never materialized as a Program.
``summary_only`` keeps the per-step accumulators in a window that moves with the run and
summarizes rows as they become final (the flusher of :mod:`~simwar.executors.fast.execute`,
:mod:`simwar.analysis.streaming`), so memory does not grow with the number of steps.

**The parts.**

- :mod:`~simwar.executors.fast.shaper` and :mod:`~simwar.executors.fast.plan`: shapes and
  blocks (a Program or a config's run cut into iteration shapes and their parameters:
  :func:`~simwar.executors.fast.plan.plan_program`,
  :func:`~simwar.executors.fast.plan.plan_config`; a family's members shaped from its
  first's reading, :class:`~simwar.executors.fast.plan.ShapeMemo`);
- :mod:`~simwar.executors.fast.codegen`: a shape compiled into the straight-line function
  that runs a block of it (over floats; its array target, over arrays of runs, is the
  lockstep executor's, :mod:`simwar.executors.lockstep`);
- :mod:`~simwar.executors.fast.races`: which access pairs are compared where, and the races
  as progressions (:class:`~simwar.executors.fast.races.FastHazards`);
- :mod:`~simwar.executors.fast.counts`: races counted as a summary-only run goes;
- :mod:`~simwar.executors.fast.shapes`: a shape-picking run realized a step at a time
  (:class:`~simwar.executors.fast.shapes.ShapeRun`: its contexts, each planned and compiled
  once, and the realized steps as its plan), for :func:`realize_shapes` and the lockstep
  executor;
- :mod:`~simwar.executors.fast.execute`: the pass
  (:func:`~simwar.executors.fast.execute.run_plan`), the streaming summary of long runs, and
  the result (:class:`~simwar.executors.fast.execute.FastRun`);
- :mod:`~simwar.executors.fast.tracecols` and :mod:`~simwar.executors.fast.trace`: the
  trace mode, the run as a stream of Trace windows equal to the SimPy engine's Trace
  (:func:`~simwar.executors.fast.trace.windows`; the blocks compiled with ``trace=True``);
- :mod:`~simwar.executors.fast.union`: one compiled code for the plans of configs that
  differ only in their records and what binds to them (a family of ``advise``'s
  candidates), each run on it with its own numbers;
- :mod:`~simwar.executors.fast.famraces`: such a family's race windows, every member's,
  from one pass over the unions (its members' vector clocks side by side);
- here: the entry points, :func:`run_config` (a config), :func:`run_family` (configs that
  differ in where their records go, their code compiled once: :func:`family_plans`, then
  :func:`run_members`; the lockstep executor runs them as lanes,
  :mod:`simwar.executors.lockstep.family`), :func:`run` (any Program) and
  :func:`realize` (a workload whose batches depend on simulated time; its feed,
  :func:`realizing_feed`, serves the lockstep executor's groups too).

Each part imports only parts above it in this list (codegen and races only the plan, counts
only the races, shapes only the plan and codegen).

Imports: numpy and simwar's own modules (core, analysis; build only inside the functions
that take a config); no simpy, no pandas.
"""

from __future__ import annotations

from simwar.analysis.metrics import SITES
from simwar.builder.loop import LoopBuilder, build_program
from simwar.config import ConfigError
from simwar.core.program import Program
from simwar.executors.fast.codegen import compile_block
from simwar.executors.fast.execute import FastRun, _finish, _State, nonnegative, run_plan
from simwar.executors.fast.famraces import family_pairs, family_race_plans
from simwar.executors.fast.plan import Unsettled, plan_config, plan_program
from simwar.executors.fast.races import RacePlan
from simwar.executors.fast.union import family_codes


def one_rank(cfg) -> None:
    """Tensor-parallel ranks are not this executor's plans (their coupling needs every rank's
    stream state at each collective; :mod:`simwar.executors.fast.ranks` runs them, one
    pass per rank): refused with one line rather than run as one rank."""
    if cfg.tp > 1:
        raise ConfigError(f"the one-pass plans and trace mode run one rank; parallel.tp "
                          f"{cfg.tp} runs its ranks through simulate (engine fast, auto or "
                          f"simpy)")


def realize(cfg, sizes, model, summary_only: bool = False, progress=None) -> FastRun:
    """Fix a feedback workload's per-step sizes by running the config, and return that run.

    Before iteration ``k`` (the drain is ``steps``) reads its parameters, the pass calls back
    with the host clock at its step marker: ``model.schedule(k, t)`` fixes ``sizes`` for
    step k (see :mod:`simwar.builder.sizes`), and iteration k's durations are evaluated. An
    iteration only uses the sizes of steps <= its own, so what already ran stays valid: the
    sizes realized are exactly those a run of the finished arrays reproduces, and this run
    is that run (its meta, the workload's per-step arrays and requests included, is made
    from the realized sizes before the table is assembled). ``summary_only``: its summary,
    the table dropped (a feedback workload keeps its per-step arrays anyway). ``progress``:
    as :func:`run_config`'s.
    """
    one_rank(cfg)
    if sizes.shape is not None:  # the scheduler picks each step's shape as it goes
        return realize_shapes(cfg, sizes, model, summary_only, progress)
    plan = plan_config(cfg, sizes, fill=False)
    run = run_plan(plan, feed=realizing_feed(cfg, sizes, model, plan), progress=progress)
    if summary_only:
        run = FastRun(None, run.meta, run.hazards, run.segments, run.paths, run.summary)
    return run


#: steps apart that the races compare (run_plan's default)
WINDOW = 2


def realize_shapes(cfg, sizes, model, summary_only: bool = False, progress=None) -> FastRun:
    """:func:`realize` for a run whose scheduler picks each step's shape from its queue
    (``sizes.shape``; ``scheduling.rule: sglang``): the shape of step k is decided when
    iteration k begins, so the run's blocks are not known before it runs.

    An iteration's structure depends on its own shape, on the shapes of the few steps before
    it (the records its waits and syncs bind to: ``launch_ahead + 1`` of them are kept in the
    key, one more than any binding reaches) and on its step only below ``launch_ahead + 1``.
    Each such context is planned once, the first time the run meets it: the builder builds
    its iterations symbolically (:func:`~simwar.builder.loop.shape_template`), the last one is
    shaped against the others (:func:`~simwar.executors.fast.plan.shape_segment`: its
    bindings ``back``/``record`` resolved), compiled, and given a row function that reads its
    parameters at a step: each draw from its distribution's stream at the position the run
    has reached (:class:`~simwar.builder.loop.StreamSampler`, the drawer every other
    executor's Program is built with, so the numbers are the same), each step-dependent
    duration at its step's sizes. The pass then goes a step at a time: with the host clock at
    iteration k's step marker ``model.schedule(k, t)`` fixes step k's sizes and shape, the
    context's row is read and its compiled block runs the iteration, one pass, on the state
    the steps before left (:class:`~simwar.executors.fast.shapes.ShapeRun`). The realized
    steps, grouped into blocks of one kind (contexts of one structure and the same
    constants: :func:`~simwar.executors.fast.plan.plan_segments`), are the run's plan, which
    :func:`~simwar.executors.fast.execute.run_plan` runs for the per-step table, summary and
    races: the plan of the Program every other executor builds from these sizes. When no
    race of the plan needs an op's times (none latent: ``RacePlan`` logs nothing) and the
    forwards ran in order, the realizing pass's accumulators already are that run's, and
    the table, summary and races are made from them without a second pass.
    """
    # lazy: start-up time of a run of one shape (every short `simwar run` of a plain config)
    from simwar.executors.fast.shapes import FORWARD, ShapeRun

    run = ShapeRun(cfg, sizes, model)
    steps = run.steps
    state = _State(0, steps, set(SITES), run.depth, False)
    for k in range(steps + 1):
        ctx = run.pick(k, state.t)  # the host clock at iteration k's step marker
        ctx.fn(range(k, k + 1), ctx.consts, [[p] for p in run.take(k, ctx)], state)
        if progress is not None and (k % 1024 == 0 or k == steps):
            progress(min(k, steps - 1))
    plan = run.plan()
    if not summary_only and not state.bad:
        races = RacePlan(plan, WINDOW)
        if races.windowed and not any(races.logs):
            # no race needs an op's times: the realizing pass's per-step facts are the run's
            # (the same blocks, the same operations in the same order), no second pass
            races.reset()
            return _finish(plan, state, races, FORWARD)
    return run_plan(plan, WINDOW, summary_only=summary_only)


def realizing_feed(cfg, sizes, model, plan):
    """The ``feed`` of :func:`~simwar.executors.fast.execute.run_plan` that realizes a
    feedback workload as ``plan`` (``plan_config(cfg, sizes, fill=False)``) runs: see
    :func:`realize` (the lockstep executor runs many such plans, a feed each)."""
    table = plan.table
    steps = cfg.steps
    lo = plan.lo

    schedule = model.schedule
    at = table.at if table is not None else (lambda k: None)

    def feed(bi, block, start):
        rows = getattr(block.columns, "row_function", None)
        row = rows() if rows is not None else (lambda p, values: ())
        p = lo - block.steps[0]  # the pass of step index ki is ki + p (any chunk)

        def next_pass(ki: int, t: float):
            k = ki + lo
            if k < steps:
                schedule(k, t)
            else:  # the drain: every step's size is fixed
                model.finish_run()
                plan.meta.update(run_meta(cfg, sizes))
            return row(ki + p, at(k))

        return next_pass

    return feed


def run_meta(cfg, sizes) -> dict:
    """The run's meta at these sizes (the builder's)."""
    return LoopBuilder(cfg, None, sizes).meta()


def run_config(cfg, sizes, window: int = 2, summary_only: bool = False,
               progress=None, family=None) -> FastRun:
    """Simulate a config in one pass (its Program is never built); ``sizes``: the run's
    per-step sizes (:func:`simwar.api.resolve_sizes`); ``progress(step)``: called as the
    pass goes (:func:`~simwar.executors.fast.execute.run_plan`); ``family``: as
    :func:`~simwar.executors.fast.plan.plan_config`'s."""
    return run_plan(_plan(cfg, sizes, family), window, summary_only=summary_only,
                    progress=progress)


def run_plan_of(cfg, sizes):
    """The plan :func:`run_config` runs for a config (no family)."""
    return _plan(cfg, sizes, None)


def _plan(cfg, sizes, family):
    """A one-rank config's plan (:func:`~simwar.executors.fast.plan.plan_config`)."""
    one_rank(cfg)
    try:
        return plan_config(cfg, sizes, family=family)
    except Unsettled:  # iterations that never settle into one shape: take the Program
        return plan_program(build_program(cfg, sizes))


def run_family(cfgs: list, sizes: list, window: int = 2, summary_only: bool = False,
               family=None) -> list[FastRun]:
    """``[run_config(c, s, window, summary_only, family=family) for c, s in ...]``, each
    run bit for bit that, with the blocks the plans have in common compiled once: where the
    configs differ only in where records go and what binds to them (``advise``'s families),
    a block's code is the union of theirs (:mod:`simwar.executors.fast.union`), each run on
    it with its own numbers; elsewhere each plan runs its own code."""
    return run_members(*family_plans(cfgs, sizes, window, family), window, summary_only)


def family_plans(cfgs: list, sizes: list, window: int = 2, family=None) -> tuple:
    """The plans of a family's configs, the unions of their blocks (None: none) and their
    race plans: what :func:`run_members` runs (and the lockstep executor's lanes,
    :mod:`simwar.executors.lockstep.family`)."""
    plans, unions, pairs = family_unions(cfgs, sizes, window, family)
    return plans, unions, member_races(plans, unions, pairs, window)


def family_unions(cfgs: list, sizes: list, window: int = 2, family=None) -> tuple:
    """The plans of a family's configs, the unions of their blocks (None: none) and the
    family's one race pass over them (:func:`~simwar.executors.fast.famraces.family_pairs`;
    None: none)."""
    plans = [_plan(cfg, sz, family) for cfg, sz in zip(cfgs, sizes)]
    unions = family_codes(plans) if len(plans) > 1 else None
    pairs = family_pairs(plans, unions, window) if unions is not None else None
    return plans, unions, pairs


def member_races(plans: list, unions: list | None, pairs, window: int = 2) -> list:
    """Each member's race plan (its windows from the family's pass, ``pairs``, where there
    is one), and the unions' logged op times then every member's."""
    races = family_race_plans(plans, unions, window, pairs)
    if unions is not None:
        for bi, u in enumerate(unions):
            if u is not None:
                u.set_log([r.logs_of(bi) for r in races])
    return races


def run_members(plans: list, unions: list | None, races: list, window: int = 2,
                summary_only: bool = False) -> list[FastRun]:
    """Each member of :func:`family_plans`' family run in one pass, on the unions' code where
    there is one."""
    out = []
    for m, (plan, race) in enumerate(zip(plans, races)):
        codes = None if unions is None else _union_code(plan, unions, m)
        out.append(run_plan(plan, window, summary_only=summary_only, races=race,
                            codes=codes))
        plans[m] = races[m] = None  # each run's plan is done with: its memory goes
    return out


def _union_code(plan, unions: list, m: int):
    """The ``codes`` of :func:`~simwar.executors.fast.execute.run_plan` that runs member
    ``m``'s blocks on the unions' code (a block without one, or whose union blocks at a
    site the member's plan has no column for, runs its own)."""
    fwd = plan.meta.get("forward_stream", "forward")
    sites = set(SITES) | plan.sites
    depth = plan.depth

    def codes(bi: int, log: tuple):
        u = unions[bi]
        if u is None or any(h.kind == "sync" and h.site not in sites for h in u.shape.host):
            return None
        nonneg = nonnegative(plan, plan.blocks[bi])
        # the union's function, found once per family (its cache key hashes the union's
        # whole shape)
        fn = u.compiled.get((fwd, depth, nonneg))
        if fn is None:
            fn = u.compiled[(fwd, depth, nonneg)] = compile_block(
                u.shape, (False,) * u.shape.nparams, fwd, False, u.log, depth,
                union=u.guards, nonneg=nonneg)
        return fn, u.consts(m, plan.blocks[bi].consts), u.log_order(m, log)

    return codes


def run(program: Program, window: int = 2) -> FastRun:
    """Simulate any Program in one pass: the per-step columns, summary and races."""
    return run_plan(plan_program(program), window)
