"""The Python API: ``simulate(config) -> Result``, ``build_program(config) -> Program``.

The one place that orders the pipeline: config → per-step sizes (:func:`resolve_sizes`:
drawn, then, for arrivals, realized by a run of the fast executor, which is then the
``fast`` executor's run) → builder → executor →
per-step table, summary and races. Every executor gives the same table, summary and races
(tests hold them equal on every shipped config and on random programs); the ``engine=``
argument (the config's ``engine:``) names one:

- ``simpy``: the reference (:mod:`simwar.executors.engine`); builds the Program and keeps the
  full :class:`~simwar.core.trace.Trace` (timelines, Perfetto, the GPU harness's comparisons);
- ``fast``: the fast executor (:mod:`simwar.executors.fast`); no Program of a million
  objects, no trace, 30-100x quicker, memory that grows only with the per-step table;
- ``auto`` (the default, also the config's ``engine:`` default): ``fast``; the trace is
  simulated by the reference the first time ``Result.trace`` is read.

:class:`Runner` is that order for one validated config, its memory check and executor chosen
once (:func:`simulate` is :func:`~simwar.config.load_config` and a Runner's run; ``advise``'s
screen runs its candidates, variants of one config, through one Runner).
:func:`simulate_many` runs batches of alike runs on the ``lockstep`` executor. Which
executor runs, and why the ones preferred to it refused, is decided in one table
(:mod:`simwar.executors.choice`, :func:`choose`); a refusal found only while planning is a
:class:`~simwar.core.refusals.PlanRefused` the runner catches by name, records
(``Result.refused``) and falls back on. Nothing else switches executors.

Nothing here prints or writes files.

Imports: config, builder, the one-pass executor, the executors' table and the analysis; the
SimPy executor lazily (``simulate`` on ``fast`` loads no simpy; pandas only for
``Result.steps``), and so the lockstep executor (:func:`simulate_many` only) and the
tensor-parallel ranks' modules (a config with ``tp > 1`` only): a single run's start-up
loads neither.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Iterator

import numpy as np

from simwar.analysis.hazards import detect
from simwar.analysis.metrics import frame, request_table, step_columns, summarize
from simwar.builder import loop
from simwar.builder.draws import Sum, Use
from simwar.builder.loop import sizes_meta
from simwar.builder.sizes import ArrivalProcess, StepSizes, draw_sizes
from simwar.builder.template import (
    COMPARISONS,
    NotTraceable,
    duration_at,
    structure_key,
    traced,
    value_path,
)
from simwar.config import Config, ConfigError, duration_keys, load_config
from simwar.config.budget import check_memory, memory_inputs
from simwar.config.clipping import clipping_warnings
from simwar.config.workload import REQUEST_SOURCES
from simwar.core.collector import gc_paused
from simwar.core.program import Program
from simwar.executors import fast
from simwar.executors.choice import EXECUTORS, Choice, choice_inputs, choose, describe
from simwar.executors.fast.plan import Unsettled

#: realized arrivals sequences kept, by the config's content (realizing one runs the config)
SIZES_CACHE_LIMIT = 8
_sizes_cache: OrderedDict[str, StepSizes] = OrderedDict()


def resolve_sizes(cfg: Config) -> StepSizes:
    """The run's per-step sizes (:mod:`simwar.builder.sizes`), arrivals realized.

    An arrivals run's batches depend on simulated time: the fast executor runs the
    config, fixing each step's batch as it goes (:func:`simwar.executors.fast.realize`).
    That is computed once per config (cached by its content; the sizes returned are shared,
    not to be changed). Every other run's sizes are drawn afresh (cheap, and deterministic).
    """
    return _resolve(cfg)[0]


def _resolve(cfg: Config, summary_only: bool = False, progress=None):
    """``(sizes, run)``: the sizes, and the one-pass run that realized them (None when they
    were drawn, or realized before: cached); ``progress``: the realizing run's reports."""
    sizes = draw_sizes(cfg)
    if sizes.source not in REQUEST_SOURCES:
        return sizes, None
    key = cfg.model_dump_json()
    hit = _sizes_cache.get(key)
    if hit is not None:
        _sizes_cache.move_to_end(key)
        return hit, None
    run = fast.realize(cfg, sizes, ArrivalProcess(cfg, sizes), summary_only=summary_only,
                      progress=progress)
    _sizes_cache[key] = sizes
    if len(_sizes_cache) > SIZES_CACHE_LIMIT:
        _sizes_cache.popitem(last=False)
    return sizes, run


def trace_windows(cfg: Config | dict | str, *, steps: tuple[int, int] | None = None,
                  chunk: int | None = None, margin: int = 0):
    """A config's run as a stream of Trace windows (the fast executor's trace mode,
    :func:`simwar.executors.fast.trace.windows`): ``(windows, lanes, meta)``, the windows
    an iterator that simulates as it is read. Memory is one window, whatever the run's
    length; ``steps`` (A, B): only the windows holding steps A..B. Raises
    :class:`~simwar.executors.fast.trace.TraceUnsupported` for a run whose names are not
    templates (the ``simpy`` executor's ``Result.trace`` then)."""
    # lazy: start-up time of the CLI (a run that streams no trace does not load the mode)
    from simwar.executors.fast import trace as fast_trace

    cfg = load_config(cfg)  # a path or a mapping, as simulate takes
    fast.one_rank(cfg)  # tensor-parallel ranks: simulate(cfg).combined
    check_memory(cfg)
    sizes = resolve_sizes(cfg)
    try:
        plan = fast.plan_config(cfg, sizes)
    except Unsettled:  # iterations that never settle into one shape: take the Program
        plan = fast.plan_program(loop.build_program(cfg, sizes))
    kw = {} if chunk is None else {"chunk": chunk}
    parts = fast_trace.windows(plan, steps=steps, margin=margin, **kw)
    return parts, fast_trace.lanes(plan), fast_trace.meta(plan)


#: iterations of context before each window an explanation walks in (grown when a walk
#: reaches past it)
EXPLAIN_MARGINS = (4, 16, 64)


def explain(cfg: Config | dict | str, steps: tuple[int, int] | None = None):
    """The critical path of a config's run (:mod:`simwar.analysis.critical_path`), simulated
    once and streamed in windows (:func:`trace_windows`): a run of any length in the
    memory of one window, to the figures and causes of the ``simpy`` executor's whole Trace.
    ``steps`` (A, B): those steps (default: the measured steps). A tensor-parallel config:
    rank 0's, its ranks simulated at once (:func:`simulate`), each collective's wait named
    by the rank it waited for. The trace mode refused (:func:`choose`, purpose ``trace``),
    the walk is over the Trace of the executor it falls back to."""
    # lazy: start-up time of the CLI (only explain walks critical paths)
    from simwar.analysis.critical_path import Truncated, critical_path
    from simwar.analysis.critical_stream import critical_path_stream  # lazy: as above
    from simwar.executors.fast.trace import TraceUnsupported  # lazy: as above

    cfg = load_config(cfg)  # a path or a mapping, as simulate takes
    choice = choose(cfg, purpose="trace", trace_for="explain")
    if choice.key == "trace":
        for margin in EXPLAIN_MARGINS:
            try:
                parts, _, _ = trace_windows(cfg, margin=margin,
                                            steps=None if steps is None else (0, steps[1] + 2))
                return critical_path_stream(parts, steps)
            except Truncated:  # a walk went back past its window: more context
                continue
            except TraceUnsupported as signal:  # names the trace mode cannot make
                choice = choice.fell_back(signal)
                break
        else:
            choice = choice.fell_back(f"a walk reached back past {EXPLAIN_MARGINS[-1]} "
                                      f"iterations of context")
    run = simulate(cfg, engine=choice.name, trace_for="explain")  # the walk reads it
    if cfg.tp > 1:
        # lazy: start-up time (the ranks' modules load only for a tensor-parallel run)
        from simwar.analysis.ranks import Collectives

        joined = Collectives.of_traces([r.trace for r in run.ranks]).late_of(0)
        return critical_path(run.ranks[0].trace, steps, ranks=joined)
    return critical_path(run.trace, steps)


def build_program(cfg: Config | dict | str) -> Program:
    """The run's Program: every host operation of every iteration, durations drawn (a
    validated Config: :func:`simwar.config.load_config` validates), at its sizes. A
    tensor-parallel config's: rank 0's (:func:`build_rank_programs` for every rank's)."""
    cfg = load_config(cfg)  # a path or a mapping, as simulate takes
    if cfg.tp > 1:
        return build_rank_programs(cfg)[0]
    check_memory(cfg)
    return loop.build_program(cfg, resolve_sizes(cfg))


def build_rank_programs(cfg: Config | dict | str) -> list[Program]:
    """Each tensor-parallel rank's Program, ops listed (:mod:`simwar.builder.ranks`)."""
    # lazy: start-up time (the ranks' modules load only for a tensor-parallel run)
    from simwar.builder.ranks import rank_programs

    cfg = load_config(cfg)
    check_memory(cfg)
    return [Program(ops=list(p.ops), streams=p.streams, meta=p.meta)
            for p in rank_programs(cfg, resolve_sizes(cfg))]


class NoTraceError(RuntimeError):
    """A trace (timeline, Perfetto export) was asked of a run simulated without one (a
    usage error, never an executor's planning signal)."""


class Result:
    """One simulated run.

    ``summary``: a flat dict; ``steps``: the per-step DataFrame (``columns``: the same as
    numpy arrays); ``hazards``/``races``: latent races and observed overlaps; ``engine``:
    the executor that ran (``simpy`` or ``fast``), ``refused``: ``(executor, reason)`` for
    each one preferred to it that refused the run (:func:`choose`; ``executor_line``: both
    on one line); ``warnings``: what the config may have
    got wrong although it is valid, one line each (distributions clipped often:
    :func:`simwar.config.clipping.clipping_warnings`; nothing here prints them).
    ``program`` is built on first use for a fast run. ``trace`` is the reference's
    Trace: kept by a ``simpy`` run, simulated on first use after an ``auto`` run, and a
    :class:`NoTraceError` after ``engine="fast"``.
    """

    def __init__(self, config: Config, engine: str, summary: dict, hazards, *,
                 columns: dict | None = None, program=None, trace=None, events: int = 0,
                 meta: dict | None = None, requested: str = "auto",
                 refused: tuple[tuple[str, str], ...] = ()):
        self.config = config
        self.engine = engine
        self.requested = requested
        self.refused = tuple(refused)
        self.summary = summary
        self.hazards = hazards
        self.columns = columns
        self.events = events
        self._program = program
        self._trace = trace
        self._steps = None
        self._meta = meta
        #: a tensor-parallel run's ranks (:class:`RankResult`), else empty
        self.ranks: list = []
        self._combined = None
        self._warnings: list[str] | None = None

    def __repr__(self) -> str:
        return (f"Result({self.config.name!r}, engine={self.engine!r}, "
                f"steps_measured={self.summary.get('steps_measured')})")

    @property
    def executor_line(self) -> str:
        """The executor that ran and why each one preferred to it refused, one line:
        ``executor simpy: fast refused: --timeline needs a trace``."""
        return describe(self.engine, self.refused)

    @property
    def warnings(self) -> list[str]:
        """One line per thing the config may have got wrong although it is valid."""
        if self._warnings is None:
            self._warnings = clipping_warnings(self.config)
        return self._warnings

    @property
    def meta(self) -> dict:
        """Run facts (the Program's ``meta``)."""
        if self._meta is None:
            self._meta = dict(self.program.meta)
        return self._meta

    @property
    def program(self):
        if self._program is None:
            self._program = build_program(self.config)
        return self._program

    @property
    def combined(self):
        """A tensor-parallel run's ranks' Traces side by side, one Trace
        (:func:`simwar.core.ranks.side_by_side`), put together on first use (a run that
        exports no trace does not pay for it); None for a run of one rank."""
        if self._combined is None and self.ranks and self.has_trace:
            # lazy: start-up time (the ranks' modules load only for a tensor-parallel run)
            from simwar.core.ranks import side_by_side

            self._combined = side_by_side(
                [r.trace for r in self.ranks],
                [{"rank": r.rank, "seed": r.trace.meta["rank_seed"]} for r in self.ranks])
        return self._combined

    @property
    def has_trace(self) -> bool:
        """Whether ``trace`` is available (kept, or simulated on first use)."""
        return self._trace is not None or self.requested != "fast"

    @property
    def trace(self):
        if self._trace is None:
            if self.requested == "fast":
                raise NoTraceError(
                    "this run used the executor 'fast', which keeps no trace: simulate it "
                    "with engine='simpy' (or 'auto', which simulates the trace when first "
                    "read)")
            if self.ranks:  # tensor-parallel ranks run in lockstep: again, keeping theirs
                again = _simulate_ranks(self.config, choose(self.config, self.requested,
                                                            trace_for="a trace"),
                                        self.requested)
                for mine, kept in zip(self.ranks, again.ranks):
                    mine.trace = kept.trace
                self._trace = again.trace
                return self._trace
            from simwar.executors.engine import Engine  # lazy: simpy, for a trace only

            engine = Engine(self.program)
            with gc_paused():
                self._trace = engine.run()
            self.events = engine.events
        return self._trace

    @property
    def steps(self):
        """Per-step DataFrame (pandas, built on first use)."""
        if self._steps is None:
            if self.columns is None:
                raise ValueError("this run kept no per-step table (summary_only=True)")
            self._steps = frame(self.columns)
        return self._steps

    @property
    def requests(self):
        """Per request finished in the measured steps (a run with requests): arrival,
        lengths, steps, TTFT both ways, TPOT, ITL, latency (a DataFrame: group it by prompt
        length or by arrival time; :func:`simwar.analysis.metrics.request_table`)."""
        import pandas as pd  # lazy: simulate() needs no pandas

        if self.columns is None:
            raise ValueError("this run kept no per-step table (summary_only=True)")
        return pd.DataFrame(request_table(self.columns, self.meta))

    @property
    def races(self):
        """Latent races and observed overlaps after warm-up, one row per access pair."""
        return self.hazards.since(self.config.warmup_steps).frame()


def resolve_engine(requested: str | None, cfg: Config, want_trace: bool = False) -> str:
    """The name of the executor :func:`choose` picks for one run, ``simpy`` or ``fast``
    (``want_trace``: a trace is needed before the run); the name asked for when it refuses
    (``fast`` with a trace needed). Another name is a :class:`~simwar.config.ConfigError`.
    """
    choice = choose(cfg, requested, trace_for="a trace" if want_trace else None)
    return choice.name or requested or cfg.engine


def simulate(cfg: Config | dict | str | None = None, overrides=None, engine: str | None = None,
             *, summary_only: bool = False, progress: Callable[[int], None] | None = None,
             trace_for: str | None = None) -> Result:
    """Simulate a config (path, mapping, Config, or None for the packaged default).

    ``engine``: the executor, ``simpy``, ``fast`` or ``auto`` (default: the config's
    ``engine``, itself ``auto`` by default); :func:`choose` decides, and the Result says
    which ran and why any preferred one refused (``Result.refused``). ``trace_for``: what
    needs the run's Trace kept (e.g. ``"--timeline"``): ``auto`` then takes an executor
    that keeps one; ``fast`` asked for with one needed is a
    :class:`~simwar.config.ConfigError`. ``summary_only``: keep no per-step table (``fast``:
    the summary is computed as the run goes, its quantiles from a sketch; see
    :mod:`simwar.analysis.streaming`). ``progress``: called with a step number as the run
    reaches it: ``simpy`` at each step, ``fast`` after each chunk of its pass (a few
    hundredths to a few tenths of a second of work apart), both with ``steps`` at the end.
    """
    return Runner(load_config(cfg, overrides), engine, summary_only=summary_only,
                  trace_for=trace_for).run(progress=progress)


class Runner:
    """Runs of one validated config: what :func:`simulate` decides before a run, decided once.

    ``Runner(cfg, engine, summary_only=, trace_for=)`` checks the memory the run needs and
    chooses its executor (:func:`choose`: ``engine`` and ``trace_for`` as :func:`simulate`
    takes them; every executor refusing is a :class:`~simwar.config.ConfigError`);
    :meth:`run` runs it. :func:`simulate` is :func:`~simwar.config.load_config` and one
    Runner's run. A caller that simulates many variants of one validated config (``advise``'s
    candidates: a barrier, where a record goes) passes each to :meth:`run`: a variant keeps
    what the check and the choice read (:func:`~simwar.config.budget.memory_inputs`,
    :func:`~simwar.executors.choice.choice_inputs`; :meth:`run` refuses one that does not),
    so they are the base's.
    """

    def __init__(self, cfg: Config, engine: str | None = None, *, summary_only: bool = False,
                 trace_for: str | None = None):
        check_memory(cfg)  # before anything is allocated
        choice = choose(cfg, engine, trace_for=trace_for)
        self.requested = engine or cfg.engine
        if choice.name is None:
            raise ConfigError(f"engine {self.requested}: "
                              f"{'; '.join(why for _, why in choice.refused)}")
        self.config = cfg
        self.choice = choice
        self.summary_only = summary_only
        self._inputs: list[dict] | None = None  # what _variant compares, of the config

    def run(self, variant: Config | None = None,
            progress: Callable[[int], None] | None = None, *, family=None,
            trace=None) -> Result:
        """Simulate the config, or ``variant`` of it (validated, equal in what the check
        and the choice read: :func:`~simwar.config.budget.memory_inputs`,
        :func:`~simwar.executors.choice.choice_inputs`); ``progress`` as
        :func:`simulate`'s. ``family``: a :class:`simwar.builder.moves.Family` the variant
        belongs to (the one-pass executor's plan takes its iterations from it).
        ``trace``: ``(stream, take)``, the stream :meth:`trace_stream` gave for the config
        and a callable each of the run's Trace windows is handed to as the pass makes it
        (the same windows as :func:`trace_windows`', the same Result as without it)."""
        cfg = self.config if variant is None else self._variant(variant)
        choice, requested = self.choice, self.requested
        if trace is not None:
            if variant is not None or family is not None:
                raise ValueError("a traced run is of the Runner's own config")
            with gc_paused():
                run = fast.run_plan(trace[0].plan, trace=trace, progress=progress)
            if progress is not None:
                progress(cfg.steps)
            return _fast_result(cfg, run, requested, choice.refused)
        with gc_paused():
            if cfg.tp > 1:
                return _simulate_ranks(cfg, choice, requested, progress)
            if choice.name == "simpy":
                return _simulate_simpy(cfg, requested, progress, choice.refused)
            result = _simulate_fast(cfg, requested, self.summary_only, progress,
                                    choice.refused, family)
        if progress is not None:
            progress(cfg.steps)
        return result

    def trace_stream(self, steps: tuple[int, int] | None = None):
        """The Trace windows of the config's run, made by the run's own pass
        (:meth:`run` with ``trace``): a :class:`~simwar.executors.fast.trace.Stream` (its
        ``lanes`` and ``meta``: what a writer needs before the first window; ``steps`` as
        :func:`trace_windows`'), or None where the run's pass cannot make them: the
        ``simpy`` executor (its Trace is kept), ranks, a summary-only run, a workload
        realized as it runs (:func:`trace_windows` after the run then). Raises
        :class:`~simwar.executors.fast.trace.TraceUnsupported` as :func:`trace_windows`."""
        cfg = self.config
        if self.choice.name != "fast" or cfg.tp > 1 or self.summary_only:
            return None
        sizes = draw_sizes(cfg)  # (as _resolve draws them for the run)
        if sizes.source in REQUEST_SOURCES:
            return None
        # lazy: start-up time of the CLI (a run that streams no trace does not load the mode)
        from simwar.executors.fast import trace as fast_trace

        return fast_trace.stream(fast.run_plan_of(cfg, sizes), steps=steps)

    def run_family(self, variants: list[Config], family=None) -> list[Result]:
        """``[self.run(v, family=family) for v in variants]``, bit for bit, for variants that
        differ only in where read-done is published (an ``advise`` family): on the one-pass
        executor their plans run on code compiled once for all of them
        (:func:`simwar.executors.fast.run_family`), as the lanes of one lockstep pass where
        they can (:func:`simwar.executors.lockstep.family.run_family`)."""
        # lazy: start-up time (a single run needs no lockstep)
        from simwar.executors.lockstep.family import run_family

        cfgs = [self._variant(v) for v in variants]
        if self.choice.name != "fast" or len(cfgs) < 2 or any(c.tp > 1 for c in cfgs):
            return [self.run(v, family=family) for v in variants]
        choice, requested = self.choice, self.requested
        with gc_paused():
            resolved = [_resolve(cfg, self.summary_only) for cfg in cfgs]
            todo = [m for m, (_, run) in enumerate(resolved) if run is None]
            runs = dict(zip(todo, run_family([cfgs[m] for m in todo],
                                             [resolved[m][0] for m in todo],
                                             summary_only=self.summary_only,
                                             family=family)))
        return [_fast_result(cfg, run, requested, choice.refused)
                for cfg, run in ((cfgs[m], runs[m] if m in runs else resolved[m][1])
                                 for m in range(len(cfgs)))]

    def _variant(self, cfg: Config) -> Config:
        if self._inputs is None:  # the config's, read once (a screen runs many variants)
            self._inputs = [inputs(self.config) for inputs in (memory_inputs, choice_inputs)]
        # what the check and the choice read
        for inputs, mine in zip((memory_inputs, choice_inputs), self._inputs):
            theirs = inputs(cfg)
            for key, value in mine.items():
                other = theirs[key]
                if value is not other and value != other:
                    raise ValueError(f"a variant run by this Runner keeps the config's {key} "
                                     f"(the memory check and the executor's choice read it)")
        return cfg


def simulate_many(configs: list, on_done: Callable[[list[int], list[dict]], None] | None = None,
                  keys: list[str] | None = None) -> list[dict]:
    """The summary of each config (``simulate(config).summary``, bit for bit), in order.

    ``configs``: validated configs, as :class:`~simwar.config.Config` objects or their
    resolved mappings (``Config.model_dump(mode="json")``, which a sweep's runs hold). Runs
    that differ in their durations' values only share one plan
    (:func:`simwar.builder.template.traced`, :func:`simwar.executors.fast.plan.bind`) and run
    on the ``lockstep`` executor (:mod:`simwar.executors.lockstep`), in batches; a run it
    refuses (:func:`choose` with purpose ``many``: arrivals, whose batches depend on the
    run's own times; ``simpy`` asked for; tensor-parallel ranks; a plan the lockstep pass
    cannot take) runs alone, as :func:`simulate` runs it.

    ``on_done(indices, summaries)``: called as each batch finishes (the runs of one structure
    that run alone: together), with the positions of its configs (:func:`simulate_batches`).
    ``keys``: each config's :func:`~simwar.builder.template.structure_key` when the caller
    knows it (a sweep's runs made from one template share theirs), else computed here.
    """
    out: list[dict | None] = [None] * len(configs)
    for indices, summaries in simulate_batches(configs, keys):
        for i, s in zip(indices, summaries):
            out[i] = s
        if on_done is not None:
            on_done(indices, summaries)
    return out


def simulate_batches(configs: list, keys: list[str] | None = None
                     ) -> Iterator[tuple[list[int], list[dict]]]:
    """:func:`simulate_many`'s summaries as they finish: ``(positions, summaries)`` for the
    runs of one structure key that run alone (together, once all have run), then for each
    lockstep batch. Runs of different structure keys whose plans come out alike (two
    algorithms of the same iteration shapes) share their batches, each numpy call of a step
    paid once for all of them (a sweep with one worker hands several structures over at
    once for that: :func:`simwar.study.sweeps.sweep`)."""
    # lazy: start-up time (a single run, the command line's usual case, needs no lockstep)
    from simwar.executors import lockstep

    resolved = [c.model_dump(mode="json") if isinstance(c, Config) else c for c in configs]

    similar: dict[str, list[int]] = {}
    for i, r in enumerate(resolved):
        similar.setdefault(structure_key(r) if keys is None else keys[i], []).append(i)
    groups: dict[tuple, list] = {}
    keyed: dict[int, tuple] = {}  # group keys by id of the plan (held in ``groups``)
    lone: list[list[int]] = []  # per structure key, the runs that run alone
    for members in similar.values():
        alone: list[int] = []
        lone.append(alone)
        rep = load_config(resolved[members[0]])
        if choose(rep, purpose="many").key != "lockstep":
            alone += members
            continue
        together: dict = {}
        left = members
        for attempt in range(TRACES_PER_GROUP):  # runs that decide alike, bound at once
            if attempt:
                rep = load_config(resolved[left[0]])
            sizes = draw_sizes(rep)
            try:
                trace = traced(rep, sizes)
                template = fast.plan.plan_template(trace.plan)
            except (NotTraceable, Unsettled):  # each run's own plan, or alone
                trace = template = None
                break
            bound = _bound_many(trace, template, rep, sizes, left, resolved)
            together.update(bound)
            left = [i for i in left if i not in bound]
            if not bound or len(left) < 2:
                break
        for i in members:
            plan = together.get(i)
            if plan is None and trace is not None:
                plan = _bound(trace, template, rep, sizes, resolved[i])
            if plan is None:
                try:
                    cfg = load_config(resolved[i])
                    plan = fast.plan_config(cfg, draw_sizes(cfg))
                except Unsettled:  # iterations that never settle into one shape
                    alone.append(i)
                    continue
            if EXECUTORS["lockstep"].plan_refusal(plan) is not None:
                alone.append(i)
                continue
            # the plans bound at once share their key (the same blocks, steps and meta but
            # the name): computed once for them
            by = plan.bound[0] if plan.bound is not None else plan
            key = keyed.get(id(by))
            if key is None:
                key = keyed[id(by)] = lockstep.group_key(by)
            groups.setdefault(key, []).append((i, plan))
    for alone in lone:
        if alone:
            with gc_paused():
                summaries = [simulate(resolved[i]).summary for i in alone]
            yield alone, summaries
    grouped = list(groups.values())
    for united in lockstep.unite([members[0][1] for members in grouped]):
        if len(united) > 1:  # groups that differ in an op or two: one pass, if one batch
            every = [x for g in united for x in grouped[g]]
            if len(every) <= lockstep.batch_size(every[0][1].hi - every[0][1].lo):
                with gc_paused():
                    try:
                        summaries = lockstep.run_united([[plan for _, plan in grouped[g]]
                                                         for g in united])
                    except lockstep.NotLockstep:
                        summaries = None
                if summaries is not None:
                    yield [i for i, _ in every], summaries
                    continue
        yield from _batches([grouped[g] for g in united], resolved)


def _batches(groups: list[list], resolved: list[dict]
             ) -> Iterator[tuple[list[int], list[dict]]]:
    """:func:`simulate_batches`' lockstep batches of each group (``(position, plan)`` of
    its runs), each run alone where its batch cannot run in lockstep."""
    from simwar.executors import lockstep  # lazy, as simulate_batches' (start-up time)

    for members in groups:
        size = lockstep.batch_size(members[0][1].hi - members[0][1].lo)
        # batches of one size (the last no smaller): each reuses the last one's arrays
        size = -(-len(members) // -(-len(members) // size))
        for b in range(0, len(members), size):
            batch = members[b:b + size]
            with gc_paused():
                try:
                    summaries = lockstep.run_group([plan for _, plan in batch])
                except lockstep.NotLockstep:
                    summaries = [_simulate_fast(load_config(resolved[i]), "fast", False).summary
                                 for i, _ in batch]
            yield [i for i, _ in batch], summaries


#: templates traced per structure: each binds at once the runs that take its decisions
#: (``cpu.ingest_us`` zero or not); the runs still left are bound one by one
TRACES_PER_GROUP = 4


def _bound_many(trace, template, rep: Config, sizes: StepSizes, members: list[int],
                resolved: list[dict]) -> dict:
    """The plans of the runs ``members`` (positions in ``resolved``) from the templates traced
    for ``rep``, bound once per seed: the durations in which they differ (plain numbers) are
    arrays of one element per run in a single :func:`~simwar.executors.fast.plan.bind`, and
    each run's plan takes its element of each constant. The same numbers, added in the same
    order, as :func:`_bound`'s, run by run. Runs that differ in anything else (a distribution,
    an affine duration), or decide otherwise on a duration (:meth:`TemplateTrace.fits`), or
    a template whose drawn columns add a duration that varies, are left out (bound one by
    one). Returns ``{position: plan}``."""
    if len(members) < 2:
        return {}
    varying: dict[str, list] = {}
    rows = [resolved[i] for i in members]
    for key, _, _ in duration_keys(rep):  # rep: the config of members[0]
        a, b, *c = value_path(rows[0], key)  # the same in every row: one structure key
        column = [r[a][b] for r in rows] if not c else [r[a][b][c[0]] for r in rows]
        if any(v != column[0] or type(v) is not type(column[0]) for v in column):
            if any(type(v) not in (int, float) for v in column):
                return {}  # distributions or affine durations differ: draws differ
            varying[key] = column
    if _adds_a_varying_duration(template, varying):
        return {}
    arrays = {k: np.array(v, dtype=np.float64) for k, v in varying.items()}
    fit = np.ones(len(members), dtype=bool)
    for k, op, other, out in trace.decisions:
        if k in arrays:
            fit &= COMPARISONS[op](arrays[k], other) == out  # element by element
    fitting = np.flatnonzero(fit).tolist()
    # the decisions on the durations every run has alike: one answer for all of them (those
    # on the varying ones were just taken element by element)
    if not fitting or not trace.fits(_values(resolved[members[fitting[0]]],
                                             {k: float(a[fitting[0]]) for k, a in arrays.items()})):
        return {}
    by_seed: dict[int, list[int]] = {}
    for j in fitting:
        by_seed.setdefault(resolved[members[j]]["seed"], []).append(j)
    plans = {}
    for seed, js in by_seed.items():
        picked = {k: a[js] for k, a in arrays.items()}
        lead = resolved[members[js[0]]]
        value = _values(lead, picked)
        cfg = rep.model_copy(update={"seed": seed, "name": lead["name"]})
        run_sizes = draw_sizes(cfg) if rep.varies else sizes
        iterations = trace.for_run(cfg, run_sizes, value)
        meta = {**trace.plan.meta, "name": cfg.name, "seed": seed, **sizes_meta(run_sizes)}
        together = fast.plan.bind(template, iterations.sampler(), value, meta)
        per_block = [[c.tolist() if isinstance(c, np.ndarray) else [c] * len(js)
                      for c in b.consts] for b in together.blocks]
        # per block, per run (a block without parameters: an empty tuple each)
        per_run = [list(zip(*consts)) if consts else [()] * len(js) for consts in per_block]
        for n, j in enumerate(js):
            i = members[j]
            blocks = [_copy(b, consts=runs[n]) for b, runs in zip(together.blocks, per_run)]
            run_meta = meta if resolved[i]["name"] == meta["name"] else \
                {**meta, "name": resolved[i]["name"]}
            plans[i] = _copy(together, blocks=blocks, meta=dict(run_meta), bound=(together, n))
    return plans


def _copy(obj, **changes):
    """A shallow copy of a plan or a block with ``changes`` (thousands a batch: a
    dataclass's ``replace`` runs its ``__init__`` over every field)."""
    out = object.__new__(type(obj))
    out.__dict__.update(obj.__dict__)
    out.__dict__.update(changes)
    return out


def _values(resolved: dict, picked: dict):
    """``value(key)``: ``picked[key]`` (an array of the runs' numbers, or one number), else
    the duration of ``resolved`` there (read once)."""
    values: dict[str, object] = dict(picked)

    def value(key: str):
        v = values.get(key)
        if v is None:
            v = values[key] = duration_at(resolved, key)
        return v

    return value


def _adds_a_varying_duration(template, varying: dict) -> bool:
    """Whether a drawn parameter of the template adds a duration that varies between runs
    (its column would be each run's own: bound one by one)."""

    def refs(x) -> bool:
        if isinstance(x, Sum):
            return refs(x.a) or refs(x.b)
        return getattr(x, "key", None) in varying and not isinstance(x, Use)

    return any(refs(x) for tb in template.blocks for x in tb.params
               if isinstance(x, Sum) and fast.plan._drawn(x))


def _bound(trace, template, rep: Config, sizes: StepSizes, resolved: dict):
    """The plan of the run ``resolved`` from the templates traced for ``rep`` (a config of
    the same structure key), or None when it decides otherwise on a duration."""
    value = _values(resolved, {})
    if not trace.fits(value):
        return None
    cfg = rep.model_copy(update={"seed": resolved["seed"], "name": resolved["name"]})
    run_sizes = draw_sizes(cfg) if rep.varies else sizes  # constant sizes: the same arrays
    iterations = trace.for_run(cfg, run_sizes, value)
    meta = {**trace.plan.meta, "name": cfg.name, "seed": cfg.seed, **sizes_meta(run_sizes)}
    return fast.plan.bind(template, iterations.sampler(), value, meta)


def _simulate_simpy(cfg: Config, requested: str, progress=None, refused=()) -> Result:
    from simwar.executors.engine import Engine  # lazy: simpy, for this executor only

    # the ops are generated as the executor reads them: a long run holds its trace, not its
    # ops (Result.program rebuilds them on demand: building is deterministic)
    program = loop.stream_program(cfg, resolve_sizes(cfg))
    engine = Engine(program, progress=progress)
    trace = engine.run()
    columns = step_columns(trace)
    hazards = detect(trace)
    summary = summarize(columns, trace.meta, hazards)
    return Result(cfg, "simpy", summary, hazards, columns=columns, trace=trace,
                  events=engine.events, meta=dict(program.meta), requested=requested,
                  refused=refused)


def _simulate_ranks(cfg: Config, choice: Choice, requested: str, progress=None) -> Result:
    """A tensor-parallel run: every rank's loop, coupled, on the ``simpy`` executor
    (:mod:`simwar.executors.ranks`) or, ``fast`` chosen, in one pass per rank
    (:mod:`simwar.executors.fast.ranks`: the same Traces; ranks whose collectives it
    cannot follow fall back to ``simpy``, the reason recorded). The summary is rank 0's
    keys plus the ranks' (:func:`simwar.analysis.ranks.rank_summary`); ``Result.ranks``
    holds each rank's summary, per-step table, races and Trace; ``Result.trace`` is rank
    0's (as the summary's standard keys are), ``Result.combined`` the ranks side by side
    (put together when first read)."""
    # lazy, each of them: start-up time (the ranks' modules load only for a tensor-parallel run)
    from simwar.analysis.ranks import group_columns, rank_columns
    from simwar.builder.ranks import rank_programs  # lazy: start-up time

    if choice.key == "lanes":
        from simwar.executors.lockstep import ranks as lanes  # lazy: start-up time

        try:
            runs, col = lanes.run_ranks(cfg, resolve_sizes(cfg), progress=progress)
        except lanes.RanksApart as signal:  # one pass per rank, or the reference
            choice = choice.fell_back(signal)
        else:
            ranks = [RankResult(r.rank, r.summary, r.columns, r.hazards, None) for r in runs]
            return _ranks_result(cfg, choice, requested, ranks, group_columns(
                col, [r.columns for r in ranks]), None, 0, runs[0].meta)
    traces = None
    events = 0
    if choice.key == "ranks":
        from simwar.executors.fast import ranks as fast_ranks  # lazy: start-up time

        try:
            traces = fast_ranks.run_ranks(rank_programs(cfg, resolve_sizes(cfg)), progress)
        except fast_ranks.Unfollowable as signal:  # the reference: its answer or deadlock
            choice = choice.fell_back(signal)
    if traces is None:
        from simwar.executors.ranks import run_ranks  # lazy: simpy, for this executor only

        traces, events = run_ranks(rank_programs(cfg, resolve_sizes(cfg)), progress)
    ranks = []
    for t in traces:
        columns = step_columns(t)
        hazards = detect(t)
        ranks.append(RankResult(t.meta["rank"], summarize(columns, t.meta, hazards), columns,
                                hazards, t))
    group = rank_columns(traces, [r.columns for r in ranks])
    return _ranks_result(cfg, choice, requested, ranks, group, traces[0], events,
                         dict(traces[0].meta))


def _ranks_result(cfg: Config, choice: Choice, requested: str, ranks: list, group: dict,
                  trace, events: int, meta: dict) -> Result:
    """The Result of a tensor-parallel run from its ranks and the group's table."""
    from simwar.analysis.ranks import rank_summary  # lazy: start-up time

    summary = dict(ranks[0].summary)
    summary.update(rank_summary(group, cfg.tp, cfg.warmup_steps,
                                [r.summary["races"] for r in ranks]))
    columns = dict(ranks[0].columns)
    columns.update({("tp_step_us" if k == "step_us" else k): v for k, v in group.items()
                    if k != "step"})
    result = Result(cfg, choice.name, summary, ranks[0].hazards, columns=columns,
                    trace=trace, events=events, meta=meta, requested=requested,
                    refused=choice.refused)
    result.ranks = ranks
    for r in ranks:
        r.run = result
    return result


class RankResult:
    """One rank of a tensor-parallel run: its summary, per-step table, races and Trace (a
    run in lockstep keeps none: read, it is simulated as the run's ``trace`` is)."""

    def __init__(self, rank: int, summary: dict, columns: dict, hazards, trace):
        self.rank, self.summary, self.columns = rank, summary, columns
        self.hazards, self._trace = hazards, trace
        self.run: Result | None = None  # the run it is a rank of

    @property
    def trace(self):
        if self._trace is None and self.run is not None:
            _ = self.run.trace  # keeps every rank's
        return self._trace

    @trace.setter
    def trace(self, trace) -> None:
        self._trace = trace

    def __repr__(self) -> str:
        return f"RankResult(rank {self.rank}, step_us_mean={self.summary.get('step_us_mean')})"


def _simulate_fast(cfg: Config, requested: str, summary_only: bool, progress=None,
                   refused=(), family=None) -> Result:
    sizes, run = _resolve(cfg, summary_only, progress)
    if run is None:  # the realizing run is the run (arrivals); else run it now
        run = fast.run_config(cfg, sizes, summary_only=summary_only, progress=progress,
                              family=family)
    return _fast_result(cfg, run, requested, refused)


def _fast_result(cfg: Config, run, requested: str, refused) -> Result:
    """The Result of a one-pass run (a :class:`~simwar.executors.fast.execute.FastRun`)."""
    return Result(cfg, "fast", run.summary, run.hazards, columns=run.columns, meta=run.meta,
                  requested=requested, refused=refused)
