"""The phase table: one decode step's phases on the forward stream, and how a config's
``algorithm`` and ``phases`` resolve to it.

A built-in algorithm (:mod:`simwar.config.algorithms`) gives the table and ``phases``
overrides its entries by name; ``algorithm: custom`` gives the whole table
(:func:`resolve_phases`).

Imports: pydantic, :mod:`simwar.config.base`, :mod:`simwar.config.durations` and
:mod:`simwar.config.algorithms`.
"""

import re
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator

from simwar.config.algorithms import builtin_phases
from simwar.config.base import StrictModel, first_error
from simwar.config.durations import Duration, RankDuration

#: what a phase's name may be
PHASE_NAME = re.compile(r"[A-Za-z_][\w-]*")

GraphKind = Literal["full", "breakable", "eager"]
ReadEnds = Literal["pre_replay", "in_replay", "post_replay", "unknown"]


#: a duration of the rank model: a number of µs or a distribution (drawn per rank, per use)


class CollectiveSpec(StrictModel):
    """A device collective inside a phase (an all-reduce per layer): ``count`` kernels
    of ``us`` each, the phase's body split evenly around them. On each rank a collective
    kernel completes at the latest rank's start of it plus its own ``us``
    (docs/design.md, "Tensor-parallel ranks")."""

    name: str = Field(min_length=1)
    """The collective's name (its kernels are named after it)."""
    us: RankDuration = 0.0
    """Each kernel's own time on a rank (µs, or a distribution drawn per rank, per use)."""
    count: int = Field(default=1, ge=1)
    """Kernels per phase (one per layer), the phase's body split evenly around them."""


class Phase(StrictModel):
    """One phase of a decode step on the forward stream.

    GPU time = ``load_batch_us`` (pre-replay shared reads, eager kernels) +
    ``prep_us`` (in-graph metadata prep; shared reads) + ``body_us`` (no shared
    reads, except in breakable graphs, which re-read per segment).
    ``read_ends`` declares where this phase's shared reads end.
    """

    name: str
    """The phase's name (overrides of a built-in table name the phase they change): letters,
    digits, ``_`` and ``-``, starting with a letter or ``_`` (``--set phases.NAME.key``,
    ``policy.publish_phase`` and the kernels' names use it)."""

    @field_validator("name")
    @classmethod
    def _a_name(cls, value: str) -> str:
        if not PHASE_NAME.fullmatch(value):
            raise ValueError(f"expected a name of letters, digits, _ and - starting with a "
                             f"letter or _, got {value!r}")
        return value
    runner: Literal["target", "draft"] = "target"
    """The model the phase runs: the target model or the draft model."""
    graph: GraphKind = "full"
    """How the phase runs: a full CUDA graph, a breakable graph (segments that re-read the
    shared buffers) or eager kernels."""
    read_ends: ReadEnds = "unknown"
    """Where the phase's shared reads end, where a fine barrier's read-done is recorded:
    pre_replay, in_replay (an in-graph node), post_replay (a host record after the launch)
    or unknown (nothing: a fine barrier falls back to coarse)."""
    load_batch_us: Duration = 0.0
    """GPU time before the replay: the shared reads of eager kernels (µs, real batch)."""
    prep_us: Duration = 0.0
    """GPU time of the in-graph metadata prep, which reads the shared buffers (µs; a graph
    phase's scales with the graph bucket)."""
    body_us: Duration = 0.0
    """GPU time of the body, which reads no shared buffer except in a breakable graph (µs;
    a graph phase's scales with the graph bucket)."""
    host_us: Duration = 0.0
    """Host time to dispatch the phase (µs)."""
    reads: list[str] = []  # a plain default: see StrictModel
    """The shared buffers the phase reads (those the schedule writes, gpu.writes)."""
    future_publish: bool = False
    """The phase publishes the step's future (FutureMap): the next step's copies wait on an
    event recorded after it."""
    collectives: list[CollectiveSpec] = []  # a plain default: see StrictModel
    """Device collectives inside the phase's graph (tensor-parallel ranks, parallel.tp)."""


def resolve_phases(algorithm: str, entries: list[dict]) -> list[Phase]:
    """Built-in table with overrides by name, or the custom table as given."""
    if algorithm == "custom":
        if not entries:
            raise ValueError("phases: algorithm custom needs a non-empty phases list")
        out = []
        for i, e in enumerate(entries):
            out.append(_phase(e, f"phases.{i}"))
        _unique([p.name for p in out])
        return out
    table = [dict(p) for p in builtin_phases(algorithm)]
    by_name = {p["name"]: p for p in table}
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or "name" not in e:
            raise ValueError(f"phases.{i}: each override needs a 'name'")
        for key in e:
            if key not in Phase.model_fields:
                raise ValueError(f"phases.{i}.{key}: unknown key")
        if not isinstance(e["name"], str):  # a list or a mapping is not a name (nor hashable)
            raise ValueError(f"phases.{i}.name: expected a phase name, got {e['name']!r}")
        if e["name"] not in by_name:
            raise ValueError(f"phases.{i}.name: '{e['name']}' is not a phase of {algorithm} "
                             f"({', '.join(by_name)}); use algorithm: custom to add phases")
        by_name[e["name"]].update(e)
    return [_phase(p, f"phases.{i}") for i, p in enumerate(table)]


def _phase(entry: Any, where: str) -> Phase:
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: expected a mapping")
    try:
        return Phase(**entry)
    except ValidationError as e:
        raise ValueError(first_error(e, prefix=where)) from None


def _unique(names: list[str]) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise ValueError(f"phases: duplicate phase name '{n}'")
        seen.add(n)


#: phase models by the id of their resolved dict, with the dict (alive: its id not reused)
_MODELS: dict[int, tuple[dict, Phase]] = {}
_MODELS_LIMIT = 4096


def phase_model(resolved: dict) -> Phase:
    """The model of a config's resolved phase dict, made once per dict (by identity: a
    config's dicts are never changed in place), so a copy of a config that keeps a phase's
    dict shares its model, as ``simwar advise``'s candidates do for every phase but the one
    whose ``read_ends`` they move (validating 50 phases costs about as much as building one
    iteration of them). Shared: never to be changed (a change is a new dict, a new model)."""
    hit = _MODELS.get(id(resolved))
    if hit is None or hit[0] is not resolved:
        if len(_MODELS) >= _MODELS_LIMIT:
            _MODELS.clear()
        hit = _MODELS[id(resolved)] = (resolved, Phase(**resolved))
    return hit[1]


def share_phase_models(resolved: list[dict], models: list[Phase]) -> None:
    """Make ``models`` :func:`phase_model`'s models of the dicts ``resolved`` (pairwise): a
    config read back from the cache of validated configs (:mod:`simwar.config.cache`) comes
    with the phase models validated with it, so its phase table builds no validator."""
    if len(_MODELS) + len(resolved) > _MODELS_LIMIT:
        _MODELS.clear()
    for d, model in zip(resolved, models, strict=True):
        _MODELS[id(d)] = (d, model)
