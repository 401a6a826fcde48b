"""A run's iteration templates with its durations as references: one plan for many runs.

Runs of a sweep mostly differ in durations only. The builder's iterations
(:func:`simwar.builder.loop.plan_iterations`) then have the same structure, and their numbers
differ. :func:`traced` builds them once, for a representative config whose every constant
duration is a :class:`Tagged` float (the config's own value, and its dotted key): the
drawer (:class:`Tracing`) hands each one out as a :class:`Ref`, so an op's duration or host
cost is a reference to the config's key (or a sum of two, a host call's cost), not the
representative's number. Every decision the builder takes on a duration (an op issued only
for a positive one: ``cpu.ingest_us: 0`` issues no ingest) is recorded; another config
shares the templates when it takes the same decisions (:meth:`TemplateTrace.fits`), and its numbers
are read at the keys (:func:`duration_at`, from the resolved mapping a sweep holds).

A duration used in any other way (multiplied, converted) raises :class:`NotTraceable`:
the templates would hold the representative's number, so they are not shared.

Imports: :mod:`simwar.config` and the other build modules.
"""

from __future__ import annotations

import json
import operator

from simwar.builder.draws import Sum, Symbolic
from simwar.builder.loop import IterationPlan, plan_iterations
from simwar.builder.sizes import StepSizes
from simwar.config.durations import _duration
from simwar.config.schema import Affine, Config, Dist, duration_keys
from simwar.core.refusals import PlanRefused


class NotTraceable(PlanRefused):
    """A duration was used in a way a template cannot carry; plan the run on its own."""


#: a traced comparison's operator by name (numbers, or numpy arrays element by element)
COMPARISONS = {"gt": operator.gt, "ge": operator.ge, "lt": operator.lt, "le": operator.le,
               "eq": operator.eq, "ne": operator.ne}


class _Decisions(list):
    """``(key, comparison, other, outcome)`` of every comparison on a traced duration."""

    def compare(self, key: str, value: float, op: str, other) -> bool:
        if isinstance(other, (Tagged, Ref)) or not isinstance(other, (int, float)):
            raise NotTraceable(f"{key}: compared with {other!r}")
        out = COMPARISONS[op](value, other)
        self.append((key, op, other, out))
        return out


def _compare(op: str):
    def method(self, other):
        return self._log.compare(self.key, self.value, op, other)
    return method


def _refuse(name: str):
    def method(self, *args, **kwargs):
        raise NotTraceable(f"{self.key}: used in {name}")
    return method


class Tagged(float):
    """A constant duration of a traced config: its value and its dotted key. Comparisons
    are recorded; arithmetic and conversions are refused (they would bake the value in)."""

    def __new__(cls, value: float, key: str, log: _Decisions):
        obj = super().__new__(cls, value)
        obj.key = key
        obj.value = float.__float__(obj)
        obj._log = log
        return obj

    __gt__, __ge__, __lt__, __le__ = (_compare(op) for op in ("gt", "ge", "lt", "le"))
    __eq__, __ne__ = _compare("eq"), _compare("ne")
    __hash__ = float.__hash__

    def __bool__(self) -> bool:
        return self._log.compare(self.key, self.value, "ne", 0)


for _name in ("add", "radd", "sub", "rsub", "mul", "rmul", "truediv", "rtruediv", "floordiv",
              "rfloordiv", "mod", "rmod", "pow", "rpow", "neg", "pos", "abs", "float", "int",
              "round", "trunc", "floor", "ceil", "divmod", "rdivmod"):
    setattr(Tagged, f"__{_name}__", _refuse(_name))


class Ref:
    """A traced duration in a template op: the config's value at ``key`` (adds to a
    :class:`~simwar.builder.draws.Sum`; comparisons are recorded)."""

    __slots__ = ("key", "value", "_log")

    def __init__(self, key: str, value: float, log: _Decisions):
        self.key = key
        self.value = value
        self._log = log

    def __add__(self, other):
        return Sum(self, other)

    def __radd__(self, other):
        return Sum(other, self)

    __gt__, __ge__, __lt__, __le__ = (_compare(op) for op in ("gt", "ge", "lt", "le"))

    def __repr__(self) -> str:
        return f"Ref({self.key!r})"


class Tracing(Symbolic):
    """The symbolic drawer, handing out a :class:`Ref` for a traced constant duration."""

    def __call__(self, d, at: int = 0, padded: bool = False):
        if isinstance(d, Tagged):
            return Ref(d.key, d.value, d._log)
        return super().__call__(d, at, padded)


class TemplateTrace:
    """A representative config's traced iteration templates (:func:`traced`).

    ``plan``: the :class:`~simwar.builder.loop.IterationPlan` (its ops' numbers are
    :class:`Ref`, :class:`~simwar.builder.draws.Use` or sums of them); ``keys``: the dotted
    key of each distribution and step-dependent duration, by its key in the plan;
    ``decisions``: what the builder decided on durations.
    """

    def __init__(self, plan: IterationPlan, keys: dict[int, str], decisions: list):
        self.plan = plan
        self.keys = keys
        self.decisions = list(dict.fromkeys(decisions))  # each once, in order

    def fits(self, value) -> bool:
        """Whether a config whose duration at each key is ``value(key)`` takes the same
        decisions (then it shares these templates)."""
        for key, op, other, out in self.decisions:
            v = value(key)
            if isinstance(v, (Dist, Affine)) or COMPARISONS[op](v, other) != out:
                return False
        return True

    def for_run(self, cfg: Config, sizes: StepSizes, value) -> IterationPlan:
        """The templates for another config of the same structure: its config, sizes,
        distributions and step-dependent durations (``value(key)``: its duration there)."""
        plan = self.plan
        run = IterationPlan(cfg, plan.ops, plan.uses,
                            {k: value(self.keys[k]) for k in plan.dists}, plan.meta,
                            plan.phases, {k: value(self.keys[k]) for k in plan.affines},
                            plan.contexts, sizes)
        run.noise_of = plan.noise_of
        run.keys = self.keys  # the dotted key of each duration, for errors
        return run


def traced(cfg: Config, sizes: StepSizes) -> TemplateTrace:
    """The iteration templates of ``cfg`` at ``sizes``, its durations as references."""
    log = _Decisions()
    tagged = cfg.model_copy(deep=True)
    phases = tagged.phase_table()
    keys: dict[int, str] = {}
    for key, value, _ in duration_keys(tagged, phases):
        owner, name = _owner(tagged, phases, key)
        if isinstance(value, float):
            owner.__dict__[name] = Tagged(value, key, log)
        else:
            keys[id(value)] = key
            if isinstance(value, Affine) and value.noise is not None:
                keys[id(value.noise)] = key + ".noise"
    plan = plan_iterations(tagged, sizes, phases=phases, drawer=Tracing())
    return TemplateTrace(plan, keys, log)


def _owner(cfg: Config, phases: list, key: str):
    """The model holding a dotted duration key, and the field's name."""
    parts = key.split(".")
    if parts[0] == "phases":
        return next(p for p in phases if p.name == parts[1]), parts[2]
    return getattr(cfg, parts[0]), parts[1]


def structure_key(resolved: dict) -> str:
    """What a resolved config mapping's templates depend on besides its durations' values:
    the mapping without its name and seed, each duration reduced to its kind (a number, a
    distribution, an affine duration with or without noise). Configs of one key share
    :func:`traced` templates when they also take the same decisions (:meth:`TemplateTrace.fits`)."""
    out = {k: v for k, v in resolved.items() if k not in ("name", "seed")}
    for section in ("cpu", "gpu", "costs"):
        out[section] = {k: _kind(v) if k.endswith("_us") else v
                        for k, v in resolved[section].items()}
    out["phases"] = [{k: _kind(v) if k.endswith("_us") else v for k, v in p.items()}
                     for p in resolved["phases"]]
    return json.dumps(out, sort_keys=True)


def _kind(v) -> str:
    if not isinstance(v, dict):
        return "number"
    if "dist" in v:
        return "dist"
    return "affine" if v.get("noise") is None else "affine+noise"


def duration_at(resolved: dict, key: str):
    """The duration at a dotted key (:func:`~simwar.config.schema.duration_keys`' form) of a
    resolved config mapping (``Config.model_dump(mode="json")``): a float, a
    :class:`~simwar.config.schema.Dist` or an :class:`~simwar.config.schema.Affine`
    (``KEY.noise``: an affine duration's noise)."""
    parts = key.split(".")
    if parts[-1] == "noise":
        return _duration(duration_at(resolved, ".".join(parts[:-1])).noise)
    return _duration(value_at(resolved, key))


def value_at(resolved: dict, key: str):
    """The value at a dotted duration key of a resolved config mapping, as it is there: a
    number, or a distribution's or an affine duration's mapping (:func:`value_path`)."""
    value = resolved
    for part in value_path(resolved, key):
        value = value[part]
    return value


def value_path(resolved: dict, key: str) -> tuple:
    """Where a dotted duration key's value is in a resolved config mapping: its keys and
    positions one after another (a phase at its position in ``phases``, found by its
    ``name``; the other keys section by section). Mappings of one structure key share it."""
    parts = key.split(".")
    if parts[0] == "phases":
        at = next(i for i, p in enumerate(resolved["phases"]) if p["name"] == parts[1])
        return ("phases", at, parts[2])
    return tuple(parts)


__all__ = ["NotTraceable", "Ref", "Tagged", "TemplateTrace", "Tracing", "duration_at",
           "structure_key", "traced", "value_at", "value_path"]
