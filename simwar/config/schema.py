"""The config schema (pydantic v2): durations, sections, the workload and the Config.

A config describes one simulated run: the speculative algorithm (a phase
table), the barrier policy, CPU and GPU durations, host API costs, and optionally
a ``workload`` (per-step batch sizes, graph buckets, arrivals). Every duration is
a number of microseconds, a distribution ``{dist: normal|lognormal|uniform|empirical,
...}`` (the builder draws each one per use from the run's single generator), or an
affine function of the step's batch ``{base, per_seq, per_token, noise}``
(:class:`Affine`; which batch each duration uses: :func:`duration_keys`).

Errors a user can cause are raised as :class:`ConfigError`, whose message is
one line: ``FILE: dotted.key: what was expected``; each validator raises a one-line
``ValueError`` naming its key, and :func:`first_error` turns pydantic's errors into that
line. Reading files, dotted overrides and naming the override to blame:
:mod:`simwar.config.load`.

The rules every later layer must apply the same way are defined here, once: the graph-bucket
rule (:func:`buckets_of`: the validation, the drawn sizes and the arrivals model), the engine
names (:data:`ENGINES`), the algorithm names (:data:`ALGORITHMS`) and which step's batch each
duration uses (:func:`duration_keys`).

Size (~1050 lines): each model is kept with the validators that give its errors their one
line, which are most of the file; splitting them would part a model from its checks.

Imports: pydantic and :mod:`simwar.config.algorithms` / :mod:`simwar.config.policies` (numpy
lazily); nothing from build, executors or above.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from simwar.config.algorithms import BUILTIN, builtin_phases
from simwar.config.policies import barrier

#: the executors a config's ``engine`` may name: ``simpy`` (the reference, keeps a full
#: trace), ``fast`` (one pass, no trace; same per-step table and summary) or ``auto`` (fast
#: unless a trace is asked for); :func:`simwar.api.resolve_engine` chooses between them
ENGINES = ("simpy", "fast", "auto")
#: the config's ``algorithm``: a built-in phase table, or ``custom`` (the config's own)
ALGORITHMS = (*BUILTIN, "custom")


class ConfigError(ValueError):
    """One-line, user-facing configuration error (file, key, expectation)."""


def first_error(e: ValidationError, prefix: str = "") -> str:
    """The first error of a pydantic validation as one line: ``dotted.key: message``.

    ``prefix`` is put before the key (the place of a nested model, ``phases.0``). A
    validator's own message that already names its key is kept as it is.
    """
    err = e.errors()[0]
    loc = [str(x) for x in err["loc"]]
    # drop union-branch tags pydantic adds ("float", "Dist", "function-after[...]")
    loc = [x for x in loc if not (x in ("float", "Dist", "Affine", "int") or "[" in x)]
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


def non_finite(data: Any, where: str = "") -> tuple[str, float] | None:
    """The first NaN or infinity in a config-like value (mappings and lists walked), as
    ``(dotted key, value)``; None when every number is finite. The one rule of configs,
    overrides and sweep grids: no duration, count or rate is infinite or undefined."""
    if isinstance(data, float) and not math.isfinite(data):
        return where or "value", data
    if isinstance(data, dict):
        items = data.items()
    elif isinstance(data, (list, tuple)):
        items = enumerate(data)
    else:
        if hasattr(data, "dtype") and getattr(data, "shape", None) == ():  # a numpy scalar
            return non_finite(float(data), where) if data.dtype.kind == "f" else None
        return None
    for key, value in items:
        found = non_finite(value, f"{where}.{key}" if where else str(key))
        if found is not None:
            return found
    return None


def finite_error(found: tuple[str, float]) -> str:
    """The one line for :func:`non_finite`'s find."""
    return f"{found[0]}: expected a finite number, got {found[1]}"


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


class Affine(_Strict):
    """A duration that scales with the step: ``base + per_seq * size + per_token * size *
    accepted tokens``, plus a ``noise`` draw (a :class:`Dist`) on top.

    ``size`` is the step's batch, padded to its graph bucket for the ``prep_us`` and
    ``body_us`` of graph phases; ``accepted tokens`` the step's accepted tokens per request
    (which step each key uses: :func:`duration_keys`). A negative result for a batch the
    run can have is an error naming the key and the batch.
    """

    base: float = 0.0
    per_seq: float = 0.0
    per_token: float = 0.0
    noise: Dist | None = None

    @field_validator("base", "per_seq", "per_token", mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"expected a number of µs, got {v!r}")
        return v

    @field_validator("noise", mode="before")
    @classmethod
    def _noise(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, (dict, Dist)):
            raise ValueError(f"expected a distribution {{dist: ...}}, got {v!r}")
        return v

    def value(self, size, tokens=1.0):
        """The deterministic part at ``size`` (scalars or numpy arrays), without noise."""
        return self.base + self.per_seq * size + self.per_token * size * tokens

    def text(self) -> str:
        parts = [f"base {self.base:g}"]
        if self.per_seq:
            parts.append(f"per_seq {self.per_seq:g}")
        if self.per_token:
            parts.append(f"per_token {self.per_token:g}")
        return ", ".join(parts)


#: keys that make a mapping an affine duration (a mapping with ``dist`` is a distribution)
AFFINE_KEYS = ("base", "per_seq", "per_token", "noise")


def _duration(v: Any) -> Any:
    if isinstance(v, (Dist, Affine)):
        return v
    if isinstance(v, dict):
        cls = Affine if "dist" not in v and any(k in v for k in AFFINE_KEYS) else Dist
        try:
            return cls(**v)
        except ValidationError as e:
            raise ValueError(first_error(e)) from None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number of µs, {{dist: ...}} or {{base: ..., per_seq: "
                         f"...}}, got {v!r}")
    if v < 0:
        raise ValueError(f"a duration must be >= 0 µs, got {v}")
    return float(v)


Duration = Annotated[Union[float, Dist, Affine], BeforeValidator(_duration)]


# --------------------------------------------------------------------------- sections
GraphKind = Literal["full", "breakable", "eager"]
ReadEnds = Literal["pre_replay", "in_replay", "post_replay", "unknown"]


#: a duration of the rank model: a number of µs or a distribution (drawn per rank, per use)
RankDuration = Annotated[Union[float, Dist], BeforeValidator(_duration)]


class CollectiveSpec(_Strict):
    """A device collective inside a phase (an all-reduce per layer): ``count`` kernels
    of ``us`` each, the phase's body split evenly around them. On each rank a collective
    kernel completes at the latest rank's start of it plus its own ``us``
    (docs/design.md, "Tensor-parallel ranks")."""

    name: str = Field(min_length=1)
    us: RankDuration = 0.0
    count: int = Field(default=1, ge=1)


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
    #: device collectives inside the phase's graph (tensor-parallel ranks, ``parallel.tp``)
    collectives: list[CollectiveSpec] = Field(default_factory=list)


class Policy(_Strict):
    barrier: str = "fine"  # a registered barrier policy (simwar.config.policies.BARRIERS)
    placement: Literal["after_launch", "loop_top"] = "after_launch"
    external_events: bool = True
    in_replay_fallback: Literal["post_replay", "pre_replay"] = "post_replay"
    plan_stream: bool = False
    needs_cpu_seq_lens: bool = False
    publish_phase: str = "auto"
    #: SGLang's overlap loop (``event_loop_overlap``: step k's result is processed after
    #: step k+1 is launched); ``false``: its normal loop (``event_loop_normal``: the result
    #: of step k is processed before step k+1 is scheduled; no barrier, no run-ahead)
    overlap: bool = True
    #: forwards the loop launches before processing a result (1: SGLang's overlap loop,
    #: step k-1's result in iteration k; 2: a what-if, step k-2's)
    launch_ahead: int = Field(default=1, ge=1, le=2)

    @model_validator(mode="after")
    def _ahead(self) -> Policy:
        if self.launch_ahead > 1 and not self.overlap:
            raise ValueError(f"launch_ahead {self.launch_ahead} runs ahead in the overlap loop; "
                             f"with overlap false each result is processed in its own iteration")
        return self

    @field_validator("barrier")
    @classmethod
    def _registered(cls, name: str) -> str:
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
    ``simwar calibrate`` (or ``simwar.fit.replays.fit_host_call_us``) rather than guessing.
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



#: a decode step yields at least one token per request (the one it verifies, or the only
#: one without speculation): the fewest accepted tokens a step can have
MIN_TOKENS = 1.0


def _tokens(v: Any) -> Any:
    """``accept.tokens``: a number >= 1, a distribution whose every draw is >= 1, or a
    non-empty per-step list of numbers >= 1."""
    if isinstance(v, Dist):
        return _token_dist(v)
    if isinstance(v, dict):
        try:
            return _token_dist(Dist(**v))
        except ValidationError as e:
            raise ValueError(first_error(e)) from None
    if isinstance(v, (list, tuple)):
        if not v:
            raise ValueError("empty list (give one accepted-token count per step, or a "
                             "number)")
        for i, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not x >= MIN_TOKENS:
                raise ValueError(f"item {i}: accepted tokens per request must be a number >= 1 "
                                 f"(a step yields at least one token per request), got {x!r}")
        return [float(x) for x in v]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number >= 1, a per-step list or {{dist: ...}}, got {v!r}")
    if not v >= MIN_TOKENS:
        raise ValueError(f"expected at least 1 accepted token per request (a step yields at "
                         f"least one: the one it verifies), got {v!r}")
    return float(v)


def _token_dist(d: Dist) -> Dist:
    """A distribution of accepted tokens: every draw (clipped at ``min``) must be >= 1."""
    lowest = (d.low if d.dist == "uniform" else min(d.values) if d.dist == "empirical"
              else -math.inf)
    if max(lowest, d.min) < MIN_TOKENS:
        fix = ("give min: 1 (draws below it are clipped to it)" if d.dist in ("normal", "lognormal")
               else f"give {'low' if d.dist == 'uniform' else 'values'} >= 1 or min: 1")
        raise ValueError(f"{d.dist}: accepted tokens can fall below 1 (a step yields at least "
                         f"one token per request); {fix}")
    return d


class Accept(_Strict):
    """Accepted tokens per request per step: a number, a per-step list (cycled) or a
    distribution drawn once per step (clipped at its ``min``)."""

    tokens: Annotated[Union[float, Dist, list[float]], BeforeValidator(_tokens)] = 1.0

    @property
    def varies(self) -> bool:
        return not isinstance(self.tokens, float)


# --------------------------------------------------------------------------- workload
class ArrivalTrace(_Strict):
    """Requests as they arrived (a server's log): each one's arrival time (µs from the run's
    start, non-decreasing), output tokens and, optionally, prompt tokens."""

    arrival_us: list[float]
    output_tokens: list[int]
    prompt_tokens: list[int] | None = None

    @model_validator(mode="after")
    def _check(self) -> ArrivalTrace:
        n = len(self.arrival_us)
        if not n:
            raise ValueError("workload.arrivals.trace.arrival_us: empty (one time per request)")
        for key in ("output_tokens", "prompt_tokens"):
            v = getattr(self, key)
            if v is not None and len(v) != n:
                raise ValueError(f"workload.arrivals.trace.{key}: {len(v)} values for {n} "
                                 f"arrivals")
            for i, x in enumerate(v or ()):
                if not x >= 1:
                    raise ValueError(f"workload.arrivals.trace.{key}.{i}: a positive number "
                                     f"of tokens, got {x!r}")
        t = self.arrival_us
        for i in range(n):
            if not (math.isfinite(t[i]) and t[i] >= 0 and (i == 0 or t[i] >= t[i - 1])):
                raise ValueError(f"workload.arrivals.trace.arrival_us.{i}: arrival times are "
                                 f"finite, >= 0 and non-decreasing, got {t[i]!r}")
        return self


class Arrivals(_Strict):
    """Requests arriving as a Poisson process of ``rate_per_s`` requests per second, or as
    a ``trace`` gives them (:class:`ArrivalTrace`)."""

    rate_per_s: float | None = Field(default=None, gt=0)
    trace: ArrivalTrace | None = None

    @model_validator(mode="after")
    def _one(self) -> Arrivals:
        if (self.rate_per_s is None) == (self.trace is None):
            raise ValueError("workload.arrivals: give rate_per_s or trace (one of them)")
        return self


def _positive_int(x: Any) -> bool:
    if isinstance(x, bool):
        return False
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    return isinstance(x, int) and x >= 1


def _batch_error(where: str, x: Any) -> str:
    return f"{where}: a batch size is a positive integer, got {x!r}"


def read_batch_sizes(path: str | Path) -> list[int]:
    """The ``batch_size`` column of a CSV file, as positive integers (one line on error)."""
    where = f"workload.batch_sizes_file: {path}"
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{where}: file not found")
    if path.is_dir():
        raise ValueError(f"{where}: is a directory (expected a CSV file)")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ValueError(f"{where}: not a text file (expected CSV)") from None
    except OSError as e:
        raise ValueError(f"{where}: cannot read: {e.strerror or e}") from None
    try:
        rows = list(csv.reader(text.splitlines()))
    except csv.Error as e:
        raise ValueError(f"{where}: malformed CSV ({e})") from None
    rows = [r for r in rows if any(cell.strip() for cell in r)]
    if not rows:
        raise ValueError(f"{where}: the file is empty (expected a header with a "
                         f"'batch_size' column)")
    header = [c.strip() for c in rows[0]]
    if "batch_size" not in header:
        raise ValueError(f"{where}: no column 'batch_size' (columns: {', '.join(header)})")
    col = header.index("batch_size")
    out = []
    for line, row in enumerate(rows[1:], start=2):
        cell = row[col].strip() if col < len(row) else ""
        try:
            value = float(cell)
        except ValueError:
            value = None
        if value is None or not _positive_int(value):
            raise ValueError(_batch_error(f"{where}: line {line}", cell))
        out.append(int(value))
    if not out:
        raise ValueError(f"{where}: no rows (expected one batch size per step)")
    return out


def buckets_of(batch, buckets: list[int] | None,
               where: str | Callable[[int], str] = "workload"):
    """The graph bucket each step's batch runs at: the smallest of ``buckets`` >= it (the
    batch itself without buckets); an int64 numpy array, one entry per step.

    ``batch``: the batch sizes, one per step (a sequence or an array); ``buckets``: sorted,
    as :class:`Workload` stores them. A batch above the largest bucket is a
    :class:`ConfigError` naming the first such step: ``WHERE: batch B at step K is above the
    largest graph bucket (TOP)``, ``where`` a place or a function of the step giving it. The
    rule's one definition: the validation, the drawn sizes and the arrivals model use it.
    """
    import numpy as np  # lazy: loading a config without graph buckets needs no numpy

    batch = np.asarray(batch, dtype=np.int64)
    if not buckets:
        return batch.copy()
    b = np.asarray(buckets, dtype=np.int64)
    idx = np.searchsorted(b, batch, side="left")
    over = np.flatnonzero(idx >= len(b))
    if len(over):
        k = int(over[0])
        place = where(k) if callable(where) else where
        raise ConfigError(f"{place}: batch {int(batch[k])} at step {k} is above the largest "
                          f"graph bucket ({buckets[-1]})")
    return b[idx]


class ClosedLoop(_Strict):
    """``concurrency`` requests in flight: each finished request is replaced by a new one,
    which arrives when the host has processed the finishing step's result (the benchmark
    setting of most published serving comparisons)."""

    concurrency: int = Field(ge=1)


class TokenCost(_Strict):
    """A duration of a prefill step: ``base + per_token * tokens`` for a step that prefills
    ``tokens`` > 0 prompt tokens, nothing for a step that prefills none."""

    base: float = Field(default=0.0, ge=0)
    per_token: float = Field(default=0.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError(f"expected a number of µs or {{base, per_token}}, got {v!r}")
        if isinstance(v, (int, float)):
            return {"base": v}
        return v

    def value(self, tokens):
        """The duration at ``tokens`` prompt tokens (a scalar or a numpy array)."""
        import numpy as np  # lazy: loading a config needs no numpy

        t = np.asarray(tokens, dtype=float)
        return np.where(t > 0, self.base + self.per_token * t, 0.0)


class Prefill(_Strict):
    """The prefill of requests with prompts (``workload.prompt_tokens``), as SGLang's chunked
    prefill mixed into decode (``--enable-mixed-chunk``, ``--chunked-prefill-size``): each
    step prefills up to ``chunk_tokens`` prompt tokens of the requests waiting for prefill,
    first come first served, in the same forward as the decode batch. ``forward_us``: the
    prefill part of the forward (one kernel on the forward stream, before the decode phases);
    ``host_us``: the host's extra work to prepare it; ``graph``: ``eager`` (a kernel launch)
    or ``piecewise`` (a graph launch: SGLang's piecewise CUDA graph for extend). See
    docs/design.md, "Durations, sizes and draws" (Prefill)."""

    chunk_tokens: int = 8192
    forward_us: TokenCost
    host_us: TokenCost = Field(default_factory=TokenCost)
    graph: Literal["eager", "piecewise"] = "eager"
    reads: list[str] = Field(default_factory=lambda: ["req_to_token"])

    @field_validator("chunk_tokens", mode="before")
    @classmethod
    def _chunk(cls, v: Any) -> Any:
        if not _positive_int(v):
            raise ValueError(f"prefill.chunk_tokens: a positive number of tokens per step, "
                             f"got {v!r}")
        return int(v)


#: the metrics an SLO may bound (``slo:``, ``--slo``): the per-request column of each
SLO_METRICS = {"ttft": "request_ttft_us", "ttft_forward": "request_ttft_forward_us",
               "tpot": "request_tpot_us", "itl": "request_itl_us",
               "latency": "request_latency_us"}


def _slo(v: Any) -> Any:
    if v is None:
        return v
    if not isinstance(v, dict) or not v:
        raise ValueError(f"expected a mapping of metric: µs ({', '.join(SLO_METRICS)}), "
                         f"got {v!r}")
    out = {}
    for k, x in v.items():
        if k not in SLO_METRICS:
            raise ValueError(f"slo.{k}: not a request metric (one of {', '.join(SLO_METRICS)})")
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0:
            raise ValueError(f"slo.{k}: a bound in µs > 0, got {x!r}")
        out[k] = float(x)
    return out


class Workload(_Strict):
    """What changes from step to step: the batch, its graph bucket, arriving requests.

    One batch source at most: ``batch_sizes`` (one per step, cycled), ``batch_sizes_file``
    (a CSV column ``batch_size``, relative to the config file), ``batch_size`` (a plain int,
    or a distribution drawn per step and rounded to an integer >= 1; ``uniform`` draws the
    integers ``ceil(low)..floor(high)`` with equal odds), or ``arrivals`` (requests join at
    the next schedule when there is room, up to ``max_batch``, and leave once their
    ``output_tokens`` are produced: see :mod:`simwar.builder.sizes`). None of them: the
    config's constant ``batch_size``. ``graph_buckets``: graph phases run the graph
    captured for the smallest bucket >= the batch.
    """

    batch_sizes: list | None = None
    batch_sizes_file: str | None = None
    batch_size: Any = None
    graph_buckets: list | None = None
    arrivals: Arrivals | None = None
    output_tokens: Any = None
    #: prompt length of each arriving request (a number or a distribution; needs a
    #: ``prefill:`` section): the request is prefilled before it decodes
    prompt_tokens: Any = None
    #: a closed loop: ``concurrency`` requests in flight, a new one arriving as one finishes
    closed_loop: ClosedLoop | None = None
    max_batch: int | None = None
    initial_batch: int = Field(default=0, ge=0)
    _file_sizes: list[int] | None = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _check(self) -> Workload:
        sources = [k for k in ("batch_sizes", "batch_sizes_file", "batch_size", "arrivals",
                               "closed_loop") if getattr(self, k) is not None]
        if len(sources) > 1:
            raise ValueError(f"workload: {' and '.join(sources)}: give one batch source "
                             f"(batch_sizes, batch_sizes_file, batch_size, arrivals or "
                             f"closed_loop)")
        buckets = self.graph_buckets
        if buckets is not None:
            if not buckets:
                raise ValueError("workload.graph_buckets: empty (give the captured batch "
                                 "sizes, or leave the key out)")
            for i, b in enumerate(buckets):
                if not _positive_int(b):
                    raise ValueError(f"workload.graph_buckets.{i}: a bucket is a positive "
                                     f"integer, got {b!r}")
            ints = [int(b) for b in buckets]
            if len(set(ints)) != len(ints):
                raise ValueError("workload.graph_buckets: duplicate buckets")
            object.__setattr__(self, "graph_buckets", sorted(ints))
        if self.batch_sizes is not None:
            if not self.batch_sizes:
                raise ValueError("workload.batch_sizes: empty (give at least one batch size)")
            for i, x in enumerate(self.batch_sizes):
                if not _positive_int(x):
                    raise ValueError(_batch_error(f"workload.batch_sizes.{i}", x))
            sizes = [int(x) for x in self.batch_sizes]
            object.__setattr__(self, "batch_sizes", sizes)
            self._check_buckets(sizes, lambda i: f"workload.batch_sizes.{i}")
        if self.batch_sizes_file is not None:
            sizes = read_batch_sizes(self.batch_sizes_file)
            path = self.batch_sizes_file
            self._check_buckets(sizes, lambda i: f"workload.batch_sizes_file: {path}: "
                                                 f"line {i + 2}")
            self._file_sizes = sizes
        if self.batch_size is not None:
            v = self.batch_size
            if isinstance(v, dict):
                try:
                    v = Dist(**v)
                except ValidationError as e:
                    raise ValueError(f"workload.batch_size: {first_error(e)}") from None
                object.__setattr__(self, "batch_size", v)
            if isinstance(v, Dist):
                if v.dist == "empirical":
                    for i, x in enumerate(v.values):
                        if not _positive_int(x):
                            raise ValueError(_batch_error(f"workload.batch_size.values.{i}", x))
                if v.dist == "uniform" and math.floor(v.high) < max(1, math.ceil(v.low)):
                    raise ValueError("workload.batch_size: uniform has no integer >= 1 between "
                                     "low and high")
            elif _positive_int(v):
                object.__setattr__(self, "batch_size", int(v))
                self._check_buckets([int(v)], "workload.batch_size")
            else:
                raise ValueError(_batch_error("workload.batch_size", v) +
                                 " (or a distribution {dist: ...})")
        arrival_keys = [k for k in ("output_tokens", "max_batch", "prompt_tokens")
                        if getattr(self, k) is not None]
        if self.initial_batch:
            arrival_keys.append("initial_batch")
        if self.arrivals is None and self.closed_loop is None:
            if arrival_keys:
                raise ValueError(f"workload.{arrival_keys[0]}: only used with arrivals or "
                                 f"closed_loop")
            return self
        if self.closed_loop is not None:
            n = self.closed_loop.concurrency
            if self.initial_batch:
                raise ValueError("workload.initial_batch: not used with closed_loop (its "
                                 "concurrency requests arrive at the start)")
            if self.max_batch is None:
                object.__setattr__(self, "max_batch", n)
            elif _positive_int(self.max_batch) and self.max_batch < n:
                raise ValueError(f"workload.max_batch: {self.max_batch} is below "
                                 f"closed_loop.concurrency ({n})")
        where = "arrivals" if self.arrivals is not None else "closed_loop"
        traced = self.arrivals is not None and self.arrivals.trace is not None
        if traced:
            for key in ("output_tokens", "prompt_tokens", "initial_batch"):
                if getattr(self, key):
                    raise ValueError(f"workload.{key}: not with arrivals.trace (the trace "
                                     f"gives each request)")
        for key in ("max_batch",) if traced else ("output_tokens", "max_batch"):
            if getattr(self, key) is None:
                raise ValueError(f"workload.{where}: needs workload.{key}")
        if not _positive_int(self.max_batch):
            raise ValueError(f"workload.max_batch: a positive integer, got {self.max_batch!r}")
        if self.initial_batch > self.max_batch:
            raise ValueError(f"workload.initial_batch: {self.initial_batch} is above max_batch "
                             f"({self.max_batch})")
        if buckets and self.max_batch > self.graph_buckets[-1]:
            raise ValueError(f"workload.max_batch: {self.max_batch} is above the largest graph "
                             f"bucket ({self.graph_buckets[-1]})")
        out = self.output_tokens
        if traced:
            return self
        if isinstance(out, dict):
            try:
                out = Dist(**out)
            except ValidationError as e:
                raise ValueError(f"workload.output_tokens: {first_error(e)}") from None
            object.__setattr__(self, "output_tokens", out)
        elif not isinstance(out, Dist):
            if not _positive_int(out):
                raise ValueError(f"workload.output_tokens: a positive integer or a "
                                 f"distribution {{dist: ...}}, got {out!r}")
            object.__setattr__(self, "output_tokens", int(out))
        prompt = self.prompt_tokens
        if isinstance(prompt, dict):
            try:
                prompt = Dist(**prompt)
            except ValidationError as e:
                raise ValueError(f"workload.prompt_tokens: {first_error(e)}") from None
            object.__setattr__(self, "prompt_tokens", prompt)
        elif prompt is not None and not isinstance(prompt, Dist):
            if not _positive_int(prompt):
                raise ValueError(f"workload.prompt_tokens: a positive integer or a "
                                 f"distribution {{dist: ...}}, got {prompt!r}")
            object.__setattr__(self, "prompt_tokens", int(prompt))
        return self

    @property
    def has_prompts(self) -> bool:
        """Whether requests come with prompts (``prompt_tokens``, or a trace's)."""
        trace = self.arrivals.trace if self.arrivals is not None else None
        return self.prompt_tokens is not None or (trace is not None
                                                  and trace.prompt_tokens is not None)

    def _check_buckets(self, sizes: list[int], where: str | Callable[[int], str]) -> None:
        if self.graph_buckets:
            buckets_of(sizes, self.graph_buckets, where)

    @property
    def source(self) -> str:
        """``batch_sizes``, ``batch_sizes_file``, ``batch_size``, ``arrivals`` (requests that
        arrive: an open Poisson process or a closed loop) or ``constant``."""
        for key in ("batch_sizes", "batch_sizes_file", "batch_size", "arrivals"):
            if getattr(self, key) is not None:
                return key
        if self.closed_loop is not None:
            return "arrivals"
        return "constant"

    def file_sizes(self) -> list[int]:
        if self._file_sizes is None:
            self._file_sizes = read_batch_sizes(self.batch_sizes_file)
        return self._file_sizes


# --------------------------------------------------------------------------- top level
#: the fewest steps a run must measure (after the warm-up, without the last step): a step
#: time needs a successor, a spread needs two of them
MIN_MEASURED = 2


class Ranks(_Strict):
    """How ranks differ: extra host work per step (``jitter_us`` on every rank, ``slow_us``
    on ``slow_rank`` only) ``at`` the loop top (before the request broadcast, which absorbs
    it) or at the ``launch`` (after the host collectives, right before ``run_batch``: the
    forward's collectives absorb it), and per-rank overrides of any config key
    (``per_rank: {1: {cpu.schedule_us: 1200}}``)."""

    jitter_us: RankDuration = 0.0
    at: Literal["loop_top", "launch"] = "loop_top"
    slow_rank: int | None = Field(default=None, ge=0)
    slow_us: RankDuration = 0.0
    per_rank: dict[int, dict[str, Any]] = Field(default_factory=dict)


class Parallel(_Strict):
    """Tensor parallelism: ``tp`` ranks, each its own scheduler loop, coupled by the per-step
    host collectives (the request ``broadcast``; a DP-attention ``allgather``, off by
    default) and the device collectives of the phases. ``wait``: how a host waits at a host
    collective (``spin``: leaves as the last rank arrives; ``block``: a rank that waited
    wakes ``wake_us`` later)."""

    tp: int = Field(default=1, ge=1)
    broadcast: bool = True
    broadcast_us: RankDuration = 150.0
    allgather: bool = False
    allgather_us: RankDuration = 150.0
    wait: Literal["spin", "block"] = "spin"
    wake_us: RankDuration = 16.0


class Config(_Strict):
    name: str = "unnamed"
    seed: int = 0
    steps: int = Field(default=2000, ge=1)
    warmup_steps: int = Field(default=20, ge=0)
    algorithm: Literal[ALGORITHMS] = "dspark"
    phases: list[dict] = Field(default_factory=list)
    policy: Policy = Field(default_factory=Policy)
    cpu: Cpu = Field(default_factory=Cpu)
    gpu: Gpu = Field(default_factory=Gpu)
    costs: Costs = Field(default_factory=Costs)
    accept: Accept = Field(default_factory=lambda: Accept(tokens=3.2))
    batch_size: int = Field(default=32, ge=1)
    #: what changes from step to step (None: every step has ``batch_size`` requests)
    workload: Workload | None = None
    #: the executor (one of :data:`ENGINES`)
    engine: Literal[ENGINES] = "auto"
    #: tensor-parallel ranks (None: one rank)
    parallel: Parallel | None = None
    ranks: Ranks | None = None
    #: the prefill of requests with prompts (``workload.prompt_tokens``)
    prefill: Prefill | None = None
    #: service-level objectives per request, in µs (``{ttft: 200000, tpot: 30000}``): the
    #: summary adds the goodput (requests/s meeting every bound) and the share meeting them
    slo: Annotated[dict | None, BeforeValidator(_slo)] = None

    @model_validator(mode="before")
    @classmethod
    def _finite(cls, data: Any) -> Any:
        found = non_finite(data)
        if found is not None:
            raise ValueError(finite_error(found))
        return data

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
        wl = self.workload
        if wl is not None and wl.source == "constant" and wl.graph_buckets \
                and self.batch_size > wl.graph_buckets[-1]:
            raise ValueError(f"batch_size: {self.batch_size} is above the largest graph bucket "
                             f"({wl.graph_buckets[-1]})")
        prompts = wl is not None and wl.has_prompts
        if prompts and self.prefill is None:
            raise ValueError("workload.prompt_tokens: needs a prefill: section (at least "
                             "prefill.forward_us, the prefill forward's duration)")
        if self.prefill is not None and not prompts:
            raise ValueError("prefill: only used with workload.prompt_tokens")
        if self.slo is not None and (wl is None or wl.source != "arrivals"):
            raise ValueError("slo: only used with requests (workload.arrivals or "
                             "workload.closed_loop)")
        check_affine(self)
        self._check_ranks(resolved)
        return self

    @property
    def tp(self) -> int:
        """The number of tensor-parallel ranks (1: a single-rank run)."""
        return self.parallel.tp if self.parallel is not None else 1

    def _check_ranks(self, phases: list[Phase]) -> None:
        tp = self.tp
        for p in phases:
            if p.collectives and tp == 1:
                raise ValueError(f"phases.{p.name}.collectives: a single-rank config has no "
                                 f"collectives (set parallel.tp > 1)")
            if p.collectives and p.graph == "eager":
                raise ValueError(f"phases.{p.name}.collectives: collectives run inside a "
                                 f"graph phase (graph full or breakable), not eager")
        if self.ranks is not None and tp == 1:
            raise ValueError("ranks: a single-rank config has no ranks to vary "
                             "(set parallel.tp > 1)")
        if tp > 1 and self.workload is not None and self.workload.source == "arrivals":
            raise ValueError("workload.arrivals: requests that arrive (arrivals, closed_loop) "
                             "are not modelled with parallel.tp > 1 (rank 0 would realize the "
                             "batches alone); give batch sizes instead")
        r = self.ranks
        if r is not None:
            if r.slow_rank is not None and r.slow_rank >= tp:
                raise ValueError(f"ranks.slow_rank: {r.slow_rank} is not a rank of "
                                 f"parallel.tp {tp} (0..{tp - 1})")
            for k in r.per_rank:
                if not 0 <= k < tp:
                    raise ValueError(f"ranks.per_rank.{k}: not a rank of parallel.tp {tp} "
                                     f"(0..{tp - 1})")

    def phase_table(self) -> list[Phase]:
        return [Phase(**p) for p in self.phases]

    @property
    def varies(self) -> bool:
        """Whether steps differ in batch or accepted tokens (a ``workload`` section, or
        ``accept.tokens`` that is a list or a distribution)."""
        return self.workload is not None or self.accept.varies


# --------------------------------------------------------------------------- duration keys
def duration_keys(cfg: Config, phases: list[Phase] | None = None) -> list[tuple[str, Any, bool]]:
    """Every duration of a config as ``(dotted key, value, padded)``.

    ``padded``: the size is the step's graph bucket (the ``prep_us`` and ``body_us`` of a
    graph phase); otherwise the real batch. The step whose batch a duration uses is the one
    the scheduler is working on when it is drawn: in iteration k, processing the result of
    step k-1 (the result-copy sync, ``cpu.process_result_us``, ``gpu.result_writes_us``, and
    the host API costs of those calls) uses step k-1; everything else (the iteration's
    schedule, prepare, launches, phases, barrier and their host API costs) uses step k, the
    step being prepared.
    """
    out: list[tuple[str, Any, bool]] = []
    for section in ("cpu", "gpu", "costs"):
        model = getattr(cfg, section)
        for name in type(model).model_fields:
            value = getattr(model, name)
            if isinstance(value, (float, Dist, Affine)):
                out.append((f"{section}.{name}", value, False))
    for ph in phases if phases is not None else cfg.phase_table():
        for name in ("load_batch_us", "prep_us", "body_us", "host_us"):
            padded = ph.graph != "eager" and name in ("prep_us", "body_us")
            out.append((f"phases.{ph.name}.{name}", getattr(ph, name), padded))
    return out


def _size_range(cfg: Config) -> list[int] | None:
    """The batch sizes a run can have (None: not bounded before drawing)."""
    wl = cfg.workload
    src = wl.source if wl is not None else "constant"
    if src == "constant":
        return [cfg.batch_size]
    if src == "batch_sizes":
        return sorted(set(wl.batch_sizes))
    if src == "batch_sizes_file":
        return sorted(set(wl.file_sizes()))
    if src == "arrivals":  # with prompts a step may prefill while no request decodes
        return list(range(0 if wl.has_prompts else 1, wl.max_batch + 1))
    d = wl.batch_size
    if isinstance(d, int):
        return [d]
    if d.dist == "uniform":
        return list(range(max(1, math.ceil(d.low)), math.floor(d.high) + 1))
    if d.dist == "empirical":
        return sorted({int(x) for x in d.values})
    return None


def _token_range(cfg: Config) -> tuple[float, float] | None:
    t = cfg.accept.tokens
    if isinstance(t, float):
        return t, t
    if isinstance(t, list):
        return min(t), max(t)
    if t.dist == "uniform":
        return max(t.min, t.low), max(t.min, t.high)
    if t.dist == "empirical":
        return max(t.min, min(t.values)), max(t.min, max(t.values))
    return None


def affine_error(key: str, a: Affine, size, tokens, value, step: int | None = None) -> str:
    """The one line for an affine duration that is negative at some batch."""
    at = f"batch {size:g}" + (f" and {tokens:g} accepted tokens" if a.per_token else "")
    when = f" (step {step})" if step is not None else ""
    return (f"{key}: {a.text()} gives {value:g} µs at {at}{when}; a duration must be >= 0 µs")


def check_affine(cfg: Config) -> None:
    """Each affine duration is >= 0 at every batch (and bucket) the run can have."""
    keys = [(k, v, p) for k, v, p in duration_keys(cfg) if isinstance(v, Affine)]
    if not keys:
        return
    sizes = _size_range(cfg)
    tokens = _token_range(cfg)
    if sizes is None:
        return  # checked as the sizes are drawn (simwar.builder.sizes)
    import numpy as np  # lazy: loading a config without affine durations needs no numpy

    buckets = cfg.workload.graph_buckets if cfg.workload is not None else None
    real = np.asarray(sizes, dtype=float)
    # a batch above the largest bucket is an error of the drawn sizes, not of the duration
    fits = [x for x in sizes if not buckets or x <= buckets[-1]]
    padded_sizes = np.unique(buckets_of(fits, buckets)).astype(float)
    for key, a, padded in keys:
        if a.per_token and tokens is None:
            continue
        at = padded_sizes if padded else real
        for tok in (tokens or (1.0,)):
            v = a.value(at, tok)
            bad = np.flatnonzero(v < 0)
            if len(bad):
                raise ValueError(affine_error(key, a, float(at[bad[0]]), tok, float(v[bad[0]])))


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
        raise ValueError(first_error(e, prefix=where)) from None


def _unique(names: list[str]) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise ValueError(f"phases: duplicate phase name '{n}'")
        seen.add(n)


__all__ = ["ALGORITHMS", "BUILTIN", "ENGINES", "MIN_MEASURED", "SLO_METRICS", "Affine",
           "ClosedLoop", "CollectiveSpec", "Config", "ConfigError", "Dist", "Duration", "Parallel",
           "Phase", "Policy", "Prefill", "Ranks", "TokenCost", "Workload", "buckets_of",
           "duration_keys", "finite_error", "first_error", "non_finite"]
