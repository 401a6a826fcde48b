"""The config schema (pydantic v2), loading, dotted overrides and clear errors.

A config describes one simulated run: the speculative algorithm (a phase
table), the barrier policy, CPU and GPU durations, host API costs. Every
duration is either a number of microseconds or a distribution
``{dist: normal|lognormal|uniform|empirical, ...}``; the builder draws each
one per step from the run's single generator.

Errors a user can cause are raised as :class:`ConfigError`, whose message is
one line: ``FILE: dotted.key: what was expected``.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple, Union

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from .algorithms import BUILTIN, builtin_phases

DEFAULT_CONFIG = Path(__file__).parent / "data" / "default.yaml"


class ConfigError(ValueError):
    """One-line, user-facing configuration error (file, key, expectation)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


# --------------------------------------------------------------------------- durations
class Dist(_Strict):
    """A duration distribution in microseconds; samples are clipped at ``min`` (default 0)."""

    dist: Literal["normal", "lognormal", "uniform", "empirical"]
    mean: float | None = None
    std: float | None = Field(default=None, ge=0)
    low: float | None = None
    high: float | None = None
    values: list[float] | None = None
    min: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _check(self) -> Dist:
        need = {"normal": ("mean", "std"), "lognormal": ("mean", "std"),
                "uniform": ("low", "high"), "empirical": ("values",)}[self.dist]
        for key in need:
            if getattr(self, key) is None:
                raise ValueError(f"dist {self.dist} needs '{key}'")
        if self.dist in ("normal", "lognormal") and self.mean < 0:
            raise ValueError("mean must be >= 0 (a duration)")
        if self.dist == "lognormal" and self.mean == 0:
            raise ValueError("lognormal needs mean > 0")
        if self.dist == "uniform" and not (0 <= self.low <= self.high):
            raise ValueError("uniform needs 0 <= low <= high")
        if self.dist == "empirical" and (not self.values or min(self.values) < 0):
            raise ValueError("empirical needs a non-empty list of values >= 0")
        return self


def _duration(v: Any) -> Any:
    if isinstance(v, Dist):
        return v
    if isinstance(v, dict):
        try:
            return Dist(**v)
        except ValidationError as e:
            raise ValueError(_first_error(e)) from None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number of µs or {{dist: ...}}, got {v!r}")
    if v < 0:
        raise ValueError(f"a duration must be >= 0 µs, got {v}")
    return float(v)


Duration = Annotated[Union[float, Dist], BeforeValidator(_duration)]


# --------------------------------------------------------------------------- sections
GraphKind = Literal["full", "breakable", "eager"]
ReadEnds = Literal["pre_replay", "in_replay", "post_replay", "unknown"]


class Phase(_Strict):
    """One phase of a decode step on the forward stream.

    GPU time = ``load_batch_us`` (pre-replay shared reads, eager kernels) +
    ``prep_us`` (in-graph metadata prep; shared reads) + ``body_us`` (no shared
    reads, except in breakable graphs, which re-read per segment).
    ``read_ends`` declares where this phase's shared reads end.
    """

    name: str
    runner: Literal["target", "draft"] = "target"
    graph: GraphKind = "full"
    read_ends: ReadEnds = "unknown"
    load_batch_us: Duration = 0.0
    prep_us: Duration = 0.0
    body_us: Duration = 0.0
    host_us: Duration = 0.0
    reads: list[str] = Field(default_factory=list)
    future_publish: bool = False


class Policy(_Strict):
    barrier: str = "fine"  # a registered barrier policy (simwar.policies.BARRIERS)
    placement: Literal["after_launch", "loop_top"] = "after_launch"
    external_events: bool = True
    in_replay_fallback: Literal["post_replay", "pre_replay"] = "post_replay"
    plan_stream: bool = False
    needs_cpu_seq_lens: bool = False
    publish_phase: str = "auto"

    @field_validator("barrier")
    @classmethod
    def _registered(cls, name: str) -> str:
        from .policies import barrier

        barrier(name)  # raises with the registered names
        return name


class Cpu(_Strict):
    ingest_us: Duration = 100.0
    schedule_us: Duration = 900.0
    prepare_us: Duration = 300.0
    process_result_us: Duration = 800.0
    #: host work after the launch and its barrier, before the previous result is processed
    #: (result queue, loop overhead); 0 issues nothing (``simwar import --fit`` measures it)
    post_launch_us: Duration = 0.0



class Gpu(_Strict):
    schedule_prep_us: Duration = 0.0
    schedule_writes_us: Duration = 300.0
    result_writes_us: Duration = 50.0
    result_copy_us: Duration = 10.0
    seq_lens_copy_us: Duration = 5.0
    result_copy_stream: Literal["copy", "forward"] = "copy"
    writes: list[str] = Field(default_factory=lambda: ["req_to_token"])



class Costs(_Strict):
    """Host cost of each API call (µs), plus two device-model latencies.

    ``host_call_us`` is a per-call host overhead added to every API call (the
    interpreter and framework dispatch around the driver call); fit it with
    ``simwar calibrate`` (or ``simwar.calibrate.fit_host_call_us``) rather than guessing.
    """

    launch_us: Duration = 6.0
    event_record_us: Duration = 9.0
    wait_event_us: Duration = 2.0
    wait_stream_us: Duration = 12.0
    graph_launch_us: Duration = 5.0
    sync_us: Duration = 1.0
    sync_wake_us: Duration = 16.0
    cross_stream_us: Duration = 3.0
    host_call_us: Duration = 0.0



class Accept(_Strict):
    tokens: float = Field(default=1.0, gt=0)


# --------------------------------------------------------------------------- top level
#: the fewest steps a run must measure (after the warm-up, without the last step): a step
#: time needs a successor, a spread needs two of them
MIN_MEASURED = 2


class Config(_Strict):
    name: str = "unnamed"
    seed: int = 0
    steps: int = Field(default=2000, ge=1)
    warmup_steps: int = Field(default=20, ge=0)
    algorithm: Literal["none", "eagle", "dflash", "dspark", "custom"] = "dspark"
    phases: list[dict] = Field(default_factory=list)
    policy: Policy = Field(default_factory=Policy)
    cpu: Cpu = Field(default_factory=Cpu)
    gpu: Gpu = Field(default_factory=Gpu)
    costs: Costs = Field(default_factory=Costs)
    accept: Accept = Field(default_factory=lambda: Accept(tokens=3.2))
    batch_size: int = Field(default=32, ge=1)
    #: executor: ``simpy`` (the reference, keeps a full trace), ``fast`` (one pass, no trace;
    #: same per-step table and summary) or ``auto`` (fast unless a trace is asked for)
    engine: Literal["simpy", "fast", "auto"] = "auto"

    @model_validator(mode="after")
    def _resolve(self) -> Config:
        if self.warmup_steps >= self.steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) must be < steps ({self.steps})")
        if self.steps < self.warmup_steps + MIN_MEASURED + 1:
            raise ValueError(f"steps ({self.steps}) must be at least warmup_steps + "
                             f"{MIN_MEASURED + 1} ({self.warmup_steps + MIN_MEASURED + 1}) so "
                             f"that at least {MIN_MEASURED} steps are measured (the last "
                             f"step, having no successor, is not)")
        resolved = resolve_phases(self.algorithm, self.phases)
        # store the resolved table (idempotent: resolving it again gives the same)
        object.__setattr__(self, "phases", [p.model_dump() for p in resolved])
        names = [p.name for p in resolved]
        pp = self.policy.publish_phase
        if pp != "auto" and pp not in names:
            raise ValueError(f"policy.publish_phase: '{pp}' is not a phase ({', '.join(names)})")
        return self

    def phase_table(self) -> list[Phase]:
        return [Phase(**p) for p in self.phases]


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
        raise ValueError(_first_error(e, prefix=where)) from None


def _unique(names: list[str]) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise ValueError(f"phases: duplicate phase name '{n}'")
        seen.add(n)


# --------------------------------------------------------------------------- loading
def _first_error(e: ValidationError, prefix: str = "") -> str:
    err = e.errors()[0]
    loc = [str(x) for x in err["loc"]]
    # drop union-branch tags pydantic adds ("float", "Dist", "function-after[...]")
    loc = [x for x in loc if not (x in ("float", "Dist", "int") or "[" in x)]
    key = ".".join(([prefix] if prefix else []) + loc)
    msg = err["msg"]
    if err["type"] == "extra_forbidden":
        msg = "unknown key"
    elif msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
        if key and (msg.startswith(key + ".") or msg.startswith(key + ":")):
            key = ""  # the message names the key itself (e.g. grid.policy.barrier: ...)
    if "input" in err and err["type"] not in ("extra_forbidden", "missing", "value_error"):
        got = err["input"]
        if not isinstance(got, (dict, list)):
            msg += f" (got {got!r})"
    return f"{key}: {msg}" if key else msg


def read_yaml(path: str | Path) -> dict:
    """The top-level mapping of a YAML file; a missing, unreadable or empty file is an error."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: file not found")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory (expected a YAML file)")
    try:
        data = yaml.safe_load(path.read_text())
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (expected YAML)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    if data is None:  # nothing but blank lines and comments
        raise ConfigError(f"{path}: the file is empty (expected a YAML mapping)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return data


class Override(NamedTuple):
    """A dotted-key override and where it came from, as an error message names it."""

    key: str
    value: Any
    origin: str  # "--set policy.barrier=coarse", "--costs fitted.yaml", ...


def override_list(overrides: list | dict | None) -> list[Override]:
    """``["key=value", ...]``, ``{key: value}`` or Overrides, as a list of :class:`Override`."""
    if not overrides:
        return []
    if isinstance(overrides, dict):
        return [Override(k, v, f"--set {k}={_value_text(v)}") for k, v in overrides.items()]
    out = []
    for item in overrides:
        if isinstance(item, Override):
            out.append(item)
        else:
            key, value = parse_override(item)
            out.append(Override(key, value, f"--set {item}"))
    return out


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def parse_override(item: str) -> tuple[str, Any]:
    """``key.path=value`` → (key.path, YAML-parsed value)."""
    if "=" not in item:
        raise ConfigError(f"--set {item}: expected key.path=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set {item}: empty key")
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError:
        value = raw
    return key, value


def set_dotted(data: dict, key: str, value: Any) -> None:
    """Set ``a.b.0.c`` in nested dicts/lists; ``phases.NAME.key`` targets a phase by name."""
    parts = key.split(".")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        nxt_is_last = i == len(parts) - 2
        if isinstance(node, list):
            node = _list_item(node, part, key)
            continue
        if part == "phases" and not nxt_is_last and not parts[i + 1].isdigit():
            phases = node.setdefault("phases", [])
            name = parts[i + 1]
            entry = next((p for p in phases if isinstance(p, dict) and p.get("name") == name),
                         None)
            if entry is None:
                entry = {"name": name}
                phases.append(entry)
            node = {"__phase__": entry}
            continue
        if "__phase__" in node:
            node = node["__phase__"]
            continue
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        node = child
    last = parts[-1]
    if isinstance(node, dict) and "__phase__" in node:
        node = node["__phase__"]
    if isinstance(node, list):
        idx = _index(node, last, key)
        node[idx] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError(f"{key}: cannot set a key inside a {type(node).__name__}")


def _index(node: list, part: str, key: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(f"{key}: '{part}' is not an index of a list of {len(node)}")
    return int(part)


def _list_item(node: list, part: str, key: str) -> Any:
    return node[_index(node, part, key)]


def load_config(source: str | Path | dict | Config | None = None,
                overrides: list[str] | dict | None = None) -> Config:
    """Load and validate a config.

    ``source``: a YAML path, a mapping, a Config, or None for the packaged
    default (DSPARK, fine barrier). ``overrides``: ``["key.path=value", ...]``
    or a ``{dotted.key: value}`` mapping, applied before validation.
    """
    if isinstance(source, Config) and not overrides:
        return source
    label = "<config>"
    if source is None:
        source = DEFAULT_CONFIG
    if isinstance(source, Config):
        data = source.model_dump()
    elif isinstance(source, dict):
        data = copy.deepcopy(source)
    else:
        label = str(source)
        data = read_yaml(source)
    items = override_list(overrides)
    source_data = copy.deepcopy(data) if items else data
    for item in items:
        try:
            set_dotted(data, item.key, item.value)
        except ConfigError as e:
            raise ConfigError(f"{item.origin}: {e}") from None
    try:
        return validate(data, label)
    except ConfigError as e:
        raise _blame(e, label, source_data, items) from None


def _blame(error: ConfigError, label: str, source_data: dict,
           items: list[Override]) -> ConfigError:
    """The error, naming the override that caused it rather than the file when it was one."""
    if not items:
        return error
    text = str(error)
    bad = text[len(label) + 2:] if text.startswith(label + ": ") else text
    match = re.match(r"([\w.-]+): ", bad)
    failing = match.group(1) if match else None
    if failing is not None:
        for item in reversed(items):  # the last override of a key is the one that counts
            if failing == item.key or failing.startswith(item.key + "."):
                if item.origin.startswith("--set "):
                    return ConfigError(f"--set {item.key}: {bad[len(item.key) + 1:].strip()}")
                return ConfigError(f"{item.origin}: {bad}")
            if item.key.startswith(failing + "."):  # e.g. --set bogus.key=3: bogus: unknown key
                return ConfigError(f"{item.origin}: {bad}")
    # a rule across keys (warmup_steps < steps, ...): the overrides are to blame when the
    # source is valid without them; name those the message mentions (all if none is)
    try:
        validate(source_data, label)
    except ConfigError:
        return error
    named = [item for item in items if _mentions(bad, item.key)] or items
    return ConfigError(f"{' '.join(dict.fromkeys(item.origin for item in named))}: {bad}")


def _mentions(message: str, key: str) -> bool:
    return any(re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", message)
               for name in (key, key.split(".")[-1]))


def validate(data: dict, label: str = "<config>") -> Config:
    try:
        return Config(**data)
    except ValidationError as e:
        raise ConfigError(f"{label}: {_first_error(e)}") from None
    except ValueError as e:
        raise ConfigError(f"{label}: {e}") from None


__all__ = ["BUILTIN", "MIN_MEASURED", "Config", "ConfigError", "Dist", "Duration", "Override",
           "Phase", "Policy", "load_config", "override_list", "parse_override",
           "read_yaml", "set_dotted", "validate"]
