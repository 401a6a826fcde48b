"""Which executor runs a config, and why the others do not: the table of executors.

Every executor gives the same per-step table, summary and races (the tests hold them equal
bit for bit); they differ in what they keep, what they take and how fast they are:

- ``simpy``: the reference (:mod:`simwar.executors.engine`; tensor-parallel ranks:
  :mod:`simwar.executors.ranks`), takes every config and keeps the whole Trace;
- ``fast``: the fast executor (:mod:`simwar.executors.fast`), no Trace kept; for
  tensor-parallel ranks, the ranks' plans in lockstep, a lane per rank
  (:mod:`simwar.executors.lockstep.ranks`, key ``lanes``: no Trace kept) or, a Trace
  needed or the ranks' plans apart, its one pass per rank
  (:mod:`simwar.executors.fast.ranks`, key ``ranks``), which keeps every rank's Trace;
- ``lockstep``: a batch of runs that share their iteration shapes, run together
  (:mod:`simwar.executors.lockstep`; :func:`simwar.api.simulate_many`, sweeps); runs whose
  shapes are picked as they go (``scheduling.rule: sglang``) advance together too, each
  step's block over the runs that picked it (``lockstep.realize_group``);
- the trace mode (key ``trace``): the fast executor's, a run as a stream of Trace
  windows (:mod:`simwar.executors.fast.trace`; ``simwar explain``, ``run --trace``).

Each entry of :data:`EXECUTORS` lists why it refuses a config: rules that return None or a
reason, checked before anything runs. :func:`choose` walks the executors a request
prefers, in order, and returns the first that takes the config, with the reasons the ones
before it were refused (:class:`Choice`). What can only be found while planning or running
(iterations that never settle into one shape, ranks whose collectives one pass cannot
follow, a plan the lockstep pass cannot take, names the trace mode cannot make) is a
:class:`~simwar.core.refusals.PlanRefused` of the executor's own: the runner
(:mod:`simwar.api`) catches exactly those and takes the next executor, recording the reason
where a Result comes of the run (:meth:`Choice.fell_back`, ``Result.refused``). Any other
exception propagates.

Imports: the config, :mod:`simwar.core.refusals` and the fast executor's
``marks_results`` (the lockstep plan rule reads a plan).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from simwar.config import ENGINES, Config, ConfigError
from simwar.config.workload import REQUEST_SOURCES
from simwar.core.frozen import Frozen, set_field
from simwar.core.refusals import PlanRefused

#: what a run is for: one run, a batch of runs (``simulate_many``), a Trace streamed
PURPOSES = ("run", "many", "trace")


class Need(Frozen):
    """What the caller needs of the run beyond its summary: ``trace``, what needs the run's
    Trace kept (an option such as ``--timeline``, named in the reason), or None."""

    __slots__ = ("trace",)

    def __init__(self, trace: str | None = None):
        set_field(self, "trace", trace)


#: a run that needs nothing beyond its summary
NO_NEED = Need()


Rule = Callable[[Config, Need], "str | None"]


def _keeps_no_trace(cfg: Config, need: Need) -> str | None:
    return f"{need.trace} needs a trace" if need.trace else None


def _one_rank(cfg: Config, need: Need) -> str | None:
    return f"parallel.tp {cfg.tp}: its plans are of one rank" if cfg.tp > 1 else None


def _own_feedback(cfg: Config, need: Need) -> str | None:
    source = cfg.workload.source if cfg.workload is not None else "constant"
    if source not in REQUEST_SOURCES:
        return None
    why = f"workload {source}: each run's batches depend on its own simulated times"
    ruled = [s for s in cfg.shapes if s != "idle"]
    if cfg.shapes_vary and len(ruled) == 1:  # a one-shape rule whose idle steps make it vary
        why += (f"; step shapes are picked as it runs: idle steps (scheduling.idle: no request "
                f"runs or waits) among its {ruled[0]} steps")
    return why


class Executor(Frozen):
    """One way to run a config: ``name`` (what a Result reports as its ``engine``), what it
    is, and ``rules``: each returns why it refuses a config, or None; ``plan_rules`` the
    same of the one-pass plan of a run (checked after planning, before running)."""

    __slots__ = ("name", "about", "rules", "plan_rules")

    def __init__(self, name: str, about: str, rules: tuple[Rule, ...] = (),
                 plan_rules: tuple[Callable[[object], str | None], ...] = ()):
        set_field(self, "name", name)
        set_field(self, "about", about)
        set_field(self, "rules", rules)
        set_field(self, "plan_rules", plan_rules)

    def refusal(self, cfg: Config, need: Need = NO_NEED) -> str | None:
        """Why this executor refuses ``cfg`` (the first rule that does), or None."""
        for rule in self.rules:
            reason = rule(cfg, need)
            if reason:
                return reason
        return None

    def plan_refusal(self, plan) -> str | None:
        """Why this executor refuses a run of this plan, or None."""
        for rule in self.plan_rules:
            reason = rule(plan)
            if reason:
                return reason
        return None


#: every executor, by the key :func:`choose` names it (``lanes`` and ``ranks``: the fast
#: executor of tensor-parallel ranks, reported as ``fast``)
EXECUTORS = {
    "simpy": Executor("simpy", "the reference (SimPy); keeps the whole Trace"),
    "fast": Executor("fast", "one pass over the run's iteration shapes; keeps no Trace",
                     (_keeps_no_trace,)),
    "lanes": Executor("fast", "tensor-parallel ranks' plans in lockstep, a lane per rank; "
                      "keeps no Trace", (_keeps_no_trace,)),
    "ranks": Executor("fast", "one pass per tensor-parallel rank; keeps every rank's Trace"),
    "lockstep": Executor("lockstep", "runs that share their iteration shapes, together",
                         (_one_rank, _own_feedback)),
    "trace": Executor("trace mode", "the fast executor's trace mode: Trace windows "
                      "streamed", (_one_rank,)),
}


@dataclass(frozen=True)
class Choice:
    """The executor chosen (``name``; ``key`` its entry in :data:`EXECUTORS`) and, in order,
    ``(executor, reason)`` for each one preferred to it that refused the run; ``rest``: the
    keys still to fall back to, for the config ``cfg`` and what it needs (``need``)."""

    key: str | None
    refused: tuple[tuple[str, str], ...] = ()
    rest: tuple[str, ...] = ()
    cfg: Config | None = field(default=None, repr=False, compare=False)
    need: Need = field(default=NO_NEED, repr=False, compare=False)

    @property
    def name(self) -> str | None:
        """The executor's name (``simpy``, ``fast``, ``lockstep``, ``trace``), or None when
        every one the request allows refused (see ``refused``)."""
        return None if self.key is None else EXECUTORS[self.key].name

    def fell_back(self, signal: PlanRefused | str) -> Choice:
        """The next choice after the chosen executor refused while planning or running
        (``signal``: its exception, or the reason); the reason is recorded."""
        return _first(self.cfg, self.need, self.rest, [*self.refused, (self.name, str(signal))])

    def line(self) -> str:
        """``executor NAME`` and why each preferred executor was refused (:func:`describe`)."""
        return describe(self.name, self.refused)


def choice_inputs(cfg: Config) -> dict:
    """What the executors' rules (:data:`EXECUTORS`) and :func:`requested` read of a config,
    by key: two configs equal in it are chosen alike (``simwar.api.Runner`` holds a variant
    to its base's choice by it)."""
    return {"engine": cfg.engine, "parallel.tp": cfg.tp, "workload": cfg.workload,
            "scheduling": (cfg.shapes, cfg.shapes_vary)}


def describe(name: str | None, refused) -> str:
    """One line: the executor that ran and why each one preferred to it refused, e.g.
    ``executor simpy: fast refused: --timeline needs a trace`` (a Result's ``engine`` and
    ``refused``; no name: every executor allowed refused)."""
    head = f"executor {name}" if name else "no executor"
    return head + (": " if refused else "") + "; ".join(f"{n} refused: {why}"
                                                         for n, why in refused)


def requested(cfg: Config, engine: str | None) -> str:
    """The executor asked for: ``engine``, or the config's; a name not in
    :data:`~simwar.config.ENGINES` is a :class:`~simwar.config.ConfigError`."""
    name = engine or cfg.engine
    if name not in ENGINES:
        raise ConfigError(f"engine: '{name}' is not one of {', '.join(ENGINES)}")
    return name


def preferred(cfg: Config, engine: str | None = None, purpose: str = "run") -> tuple[str, ...]:
    """The keys of :data:`EXECUTORS` a request tries, most preferred first.

    ``run``: ``simpy`` or ``fast`` as asked; ``auto`` is ``fast``, then ``simpy``. ``many``:
    the lockstep executor first unless ``simpy`` is asked for. ``trace`` (a Trace streamed):
    the trace mode, then the run's executors, then the reference. ``fast`` is, for a
    tensor-parallel config, the ranks in lockstep, then their one pass per rank (which
    keeps the Traces), then the reference (which gives its answer, or its deadlock, for
    ranks whose collectives one pass cannot follow).
    """
    if purpose not in PURPOSES:
        raise ValueError(f"purpose {purpose!r}: one of {', '.join(PURPOSES)}")
    name = requested(cfg, engine)
    fast = ("lanes", "ranks", "simpy") if cfg.tp > 1 else ("fast",)
    run = {"simpy": ("simpy",), "fast": fast, "auto": (*fast, "simpy")}[name]
    run = tuple(dict.fromkeys(run))
    if purpose == "many" and name != "simpy":
        return ("lockstep", *run)
    if purpose == "trace":
        return ("trace", *run, *(("simpy",) if "simpy" not in run else ()))
    return run


def choose(cfg: Config, engine: str | None = None, *, purpose: str = "run",
           trace_for: str | None = None) -> Choice:
    """The executor that runs ``cfg`` and why each one preferred to it refused.

    ``engine``: ``simpy``, ``fast`` or ``auto`` (None: the config's ``engine``);
    ``purpose``: ``run``, ``many`` or ``trace`` (:func:`preferred`); ``trace_for``: what
    needs the run's Trace kept (an executor that keeps none refuses, naming it; a Trace
    streamed needs one of whatever it falls back to). Every executor allowed refusing
    (``fast`` asked for with a trace needed) gives a Choice whose ``name`` is None.
    """
    if purpose == "trace" and trace_for is None:
        trace_for = "a Trace"
    return _first(cfg, Need(trace_for), preferred(cfg, engine, purpose), [])


def _first(cfg: Config, need: Need, keys: tuple[str, ...], refused: list) -> Choice:
    """The first of ``keys`` that takes ``cfg``, after those ``refused`` already. A rule's
    refusal by one way of the executor that then takes the run (the ranks' lockstep, a
    Trace needed, when their one pass keeps it) is not a refusal of that executor: not
    recorded."""
    before = len(refused)
    for i, key in enumerate(keys):
        reason = EXECUTORS[key].refusal(cfg, need)
        if reason is None:
            name = EXECUTORS[key].name
            refused[before:] = [r for r in refused[before:] if r[0] != name]
            return Choice(key, tuple(refused), keys[i + 1:], cfg, need)
        refused.append((EXECUTORS[key].name, reason))
    return Choice(None, tuple(refused), (), cfg, need)


__all__ = ["EXECUTORS", "PURPOSES", "Choice", "Executor", "Need", "choose",
           "describe", "preferred", "requested"]
