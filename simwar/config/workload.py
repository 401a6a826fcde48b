"""The workload: what changes from step to step, one pydantic model per batch source.

A config's ``workload`` section gives at most one batch source, and the key it gives picks
the model (no ``kind:`` key in a user's file: :func:`workload_tag` is the union's
discriminator):

- none of them, :class:`ConstantBatch`: every step has the config's ``batch_size``;
- ``batch_sizes``, :class:`BatchSizes`: one per step, cycled;
- ``batch_sizes_file``, :class:`BatchSizesFile`: a CSV column ``batch_size``, read by the
  loader (:func:`simwar.config.load.validate`), never by the validation;
- ``batch_size``, :class:`DrawnBatch`: a plain int, or a distribution drawn per step;
- ``arrivals``, :class:`ArrivingRequests`: requests arriving at a rate or as a trace gives
  them, joining the batch when there is room and leaving once their output is produced;
- ``closed_loop``, :class:`ClosedLoopRequests`: ``concurrency`` requests in flight, a new one
  arriving as one finishes.

Each model's ``source`` names its batch source (``closed_loop`` is its own, not a kind of
``arrivals``); the two whose batches follow simulated time (the requests of
:data:`REQUEST_SOURCES`) are asked for by name wherever that matters. Every model
takes ``graph_buckets`` (graph phases run the graph captured for the smallest bucket >= the
batch: :func:`buckets_of`, the rule's one definition).

A model's plain dump lists every workload key, the absent ones at their defaults, so that a
config's dump (which a sweep's run keys hash and ``simwar show`` prints) has one shape
whatever the source: :meth:`_BatchSource._every_key`.

Imports: pydantic, :mod:`simwar.config.base` and :mod:`simwar.config.durations` (numpy
lazily).
"""

import functools
import math
from typing import Annotated, Any, Callable, ClassVar, Union

from pydantic import (
    BeforeValidator,
    Discriminator,
    Field,
    PrivateAttr,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    Tag,
    ValidationError,
    ValidationInfo,
    model_serializer,
    model_validator,
)

from simwar.config.base import ConfigError, StrictModel, first_error
from simwar.config.durations import Dist

#: the keys that choose a batch source (at most one of them)
SOURCE_KEYS = ("batch_sizes", "batch_sizes_file", "batch_size", "arrivals", "closed_loop")
#: the sources whose batches follow simulated time: requests arrive, join and leave
REQUEST_SOURCES = ("arrivals", "closed_loop")
#: the keys only requests use (``initial_batch`` too, when it is not 0)
REQUEST_KEYS = ("output_tokens", "max_batch", "prompt_tokens")
#: every key of a workload section, in the order a dump lists them, with its default
WORKLOAD_KEYS = {"batch_sizes": None, "batch_sizes_file": None, "batch_size": None,
                 "graph_buckets": None, "arrivals": None, "output_tokens": None,
                 "prompt_tokens": None, "closed_loop": None, "max_batch": None,
                 "initial_batch": 0}
#: the validation context's key under which the loader passes the CSV files it read
#: (``{path: batch sizes}``): :class:`BatchSizesFile` takes its sizes from there
READ_FILES = "read_files"


class ArrivalTrace(StrictModel):
    """Requests as they arrived (a server's log): each one's arrival time (µs from the run's
    start, non-decreasing), output tokens and, optionally, prompt tokens."""

    arrival_us: list[float]
    """Each request's arrival time (µs from the run's start, non-decreasing)."""
    output_tokens: list[int]
    """Each request's output tokens."""
    prompt_tokens: list[int] | None = None
    """Each request's prompt tokens (needs a prefill: section; None: no prompts)."""

    @model_validator(mode="after")
    def _check(self) -> "ArrivalTrace":
        n = len(self.arrival_us)
        if not n:
            raise ValueError("workload.arrivals.trace.arrival_us: empty (one time per request)")
        for key in ("output_tokens", "prompt_tokens"):
            v = getattr(self, key)
            if v is not None and len(v) != n:
                raise ValueError(f"workload.arrivals.trace.{key}: {len(v)} values for {n} "
                                 f"arrivals")
        _check_tokens(self, "workload.arrivals.trace")
        t = self.arrival_us
        for i in range(n):
            if not (math.isfinite(t[i]) and t[i] >= 0 and (i == 0 or t[i] >= t[i - 1])):
                raise ValueError(f"workload.arrivals.trace.arrival_us.{i}: arrival times are "
                                 f"finite, >= 0 and non-decreasing, got {t[i]!r}")
        return self


class Arrivals(StrictModel):
    """Requests arriving as a Poisson process of ``rate_per_s`` requests per second, or as
    a ``trace`` gives them (:class:`ArrivalTrace`)."""

    rate_per_s: float | None = Field(default=None, gt=0)
    """Requests per second of a Poisson process (or give trace)."""
    trace: ArrivalTrace | None = None
    """The requests as they arrived, from a server's log (or give rate_per_s)."""

    @model_validator(mode="after")
    def _one(self) -> "Arrivals":
        if (self.rate_per_s is None) == (self.trace is None):
            raise ValueError("workload.arrivals: give rate_per_s or trace (one of them)")
        return self


def positive_int(x: Any) -> bool:
    """Whether ``x`` is an integer >= 1 (a float that is one counts): a batch size, a bucket,
    a count of tokens."""
    if isinstance(x, bool):
        return False
    if isinstance(x, float) and x.is_integer():
        x = int(x)
    return isinstance(x, int) and x >= 1


def batch_error(where: str, x: Any) -> str:
    return f"{where}: a batch size is a positive integer, got {x!r}"




def buckets_of(batch, buckets: list[int] | None,
               where: str | Callable[[int], str] = "workload"):
    """The graph bucket each step's batch runs at: the smallest of ``buckets`` >= it (the
    batch itself without buckets); an int64 numpy array, one entry per step.

    ``batch``: the batch sizes, one per step (a sequence or an array); ``buckets``: sorted,
    as every workload model stores them. A batch above the largest bucket is a
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


class ClosedLoopLengths(StrictModel):
    """A closed loop's requests' lengths in the order the loop sends them (a server's log, or
    its client's seed): the i-th request sent, the first ``concurrency`` at the start
    included, has the i-th lengths; the requests past the lists draw theirs from
    ``workload.output_tokens`` and ``prompt_tokens``. A closed loop's waits depend on which
    request comes when (a burst of long prompts queues every first token behind it), so a
    prediction of a measured run sends the run's own requests, as ``arrivals.trace`` does for
    an open loop."""

    output_tokens: list[int]
    """Each request's output tokens, in the order sent."""
    prompt_tokens: list[int] | None = None
    """Each request's prompt tokens, in the order sent (with workload.prompt_tokens)."""

    @model_validator(mode="after")
    def _check(self) -> "ClosedLoopLengths":
        n = len(self.output_tokens)
        if not n:
            raise ValueError("workload.closed_loop.lengths.output_tokens: empty (one length per "
                             "request, in the order sent)")
        if self.prompt_tokens is not None and len(self.prompt_tokens) != n:
            raise ValueError(f"workload.closed_loop.lengths.prompt_tokens: "
                             f"{len(self.prompt_tokens)} values for {n} output_tokens")
        _check_tokens(self, "workload.closed_loop.lengths")
        return self


def _check_tokens(lists, where: str) -> None:
    """Each listed request's output and prompt tokens positive (one rule for a log's lengths,
    open or closed loop)."""
    for key in ("output_tokens", "prompt_tokens"):
        for i, x in enumerate(getattr(lists, key) or ()):
            if not x >= 1:
                raise ValueError(f"{where}.{key}.{i}: a positive number of tokens, got {x!r}")


class ClosedLoop(StrictModel):
    """``concurrency`` requests in flight: each finished request is replaced by a new one,
    which arrives when the host has processed the finishing step's result (the benchmark
    setting of most published serving comparisons)."""

    concurrency: int = Field(ge=1)
    """Requests in flight at every moment."""
    lengths: ClosedLoopLengths | None = None
    """The requests' lengths in the order sent (output_tokens, prompt_tokens lists); past
    them, drawn from workload.output_tokens and prompt_tokens (None: all drawn)."""




def _count(key: str) -> Callable[[Any], Any]:
    """The check of ``workload.KEY``, a number of tokens per request: a positive integer or a
    distribution (drawn per request). A partial of a module's function, not a closure: the
    validator's schema holds it, and :mod:`simwar.config.cache` pickles that schema."""
    return functools.partial(_check_count, key)


def _check_count(key: str, v: Any) -> Any:
    """:func:`_count`'s check of ``v``, the value of ``workload.KEY``."""
    if v is None or isinstance(v, Dist):
        return v
    if isinstance(v, dict):
        try:
            return Dist(**v)
        except ValidationError as e:
            raise ValueError(f"workload.{key}: {first_error(e)}") from None
    if not positive_int(v):
        raise ValueError(f"workload.{key}: a positive integer or a distribution "
                         f"{{dist: ...}}, got {v!r}")
    return int(v)


def _drawn_batch(v: Any) -> Any:
    """``workload.batch_size``: a positive integer, or a distribution of them."""
    if isinstance(v, dict):
        try:
            v = Dist(**v)
        except ValidationError as e:
            raise ValueError(f"workload.batch_size: {first_error(e)}") from None
    if isinstance(v, Dist):
        if v.dist == "empirical":
            for i, x in enumerate(v.values):
                if not positive_int(x):
                    raise ValueError(batch_error(f"workload.batch_size.values.{i}", x))
        if v.dist == "uniform" and math.floor(v.high) < max(1, math.ceil(v.low)):
            raise ValueError("workload.batch_size: uniform has no integer >= 1 between "
                             "low and high")
        return v
    if positive_int(v):
        return int(v)
    raise ValueError(batch_error("workload.batch_size", v) + " (or a distribution {dist: ...})")


class _BatchSource(StrictModel):
    """What every workload model has: its ``source`` and the graph buckets. Its validator checks
    the buckets, then the model's own source (``_check_source``)."""

    #: the batch source, as the key that gives it names it (``constant``: none)
    source: ClassVar[str]

    graph_buckets: list | None = None
    """The batch sizes graphs were captured for: a graph phase runs the graph of the smallest
    bucket >= the step's batch (None: at the real batch; a batch above the largest bucket is
    an error naming the step)."""

    @model_validator(mode="after")
    def _check(self, info: ValidationInfo) -> "_BatchSource":
        buckets = self.graph_buckets
        if buckets is not None:
            if not buckets:
                raise ValueError("workload.graph_buckets: empty (give the captured batch "
                                 "sizes, or leave the key out)")
            for i, b in enumerate(buckets):
                if not positive_int(b):
                    raise ValueError(f"workload.graph_buckets.{i}: a bucket is a positive "
                                     f"integer, got {b!r}")
            ints = [int(b) for b in buckets]
            if len(set(ints)) != len(ints):
                raise ValueError("workload.graph_buckets: duplicate buckets")
            object.__setattr__(self, "graph_buckets", sorted(ints))
        self._check_source(info)
        return self

    def _check_source(self, info: ValidationInfo) -> None:
        """The checks of the model's own keys (none here)."""

    def _check_buckets(self, sizes: list[int], where: str | Callable[[int], str]) -> None:
        if self.graph_buckets:
            buckets_of(sizes, self.graph_buckets, where)

    @property
    def has_prompts(self) -> bool:
        """Whether requests come with prompts (``prompt_tokens``, or a trace's)."""
        return False

    @model_serializer(mode="wrap")
    def _every_key(self, handler: SerializerFunctionWrapHandler,
                   info: SerializationInfo) -> dict[str, Any]:
        """The dump with every workload key in one order, absent ones at their defaults (a
        dump that leaves keys out keeps that order)."""
        data = handler(self)
        if info.exclude_unset or info.exclude_defaults or info.exclude_none:
            return {key: data[key] for key in WORKLOAD_KEYS if key in data}
        return {key: data.get(key, default) for key, default in WORKLOAD_KEYS.items()}


class ConstantBatch(_BatchSource):
    """No batch source: every step has the config's ``batch_size`` requests."""

    source: ClassVar[str] = "constant"


class BatchSizes(_BatchSource):
    """``batch_sizes``: one batch size per step, cycled."""

    source: ClassVar[str] = "batch_sizes"

    batch_sizes: list
    """One batch size per step (positive integers), cycled."""

    def _check_source(self, info: ValidationInfo) -> None:
        if not self.batch_sizes:
            raise ValueError("workload.batch_sizes: empty (give at least one batch size)")
        for i, x in enumerate(self.batch_sizes):
            if not positive_int(x):
                raise ValueError(batch_error(f"workload.batch_sizes.{i}", x))
        sizes = [int(x) for x in self.batch_sizes]
        object.__setattr__(self, "batch_sizes", sizes)
        self._check_buckets(sizes, lambda i: f"workload.batch_sizes.{i}")


class BatchSizesFile(_BatchSource):
    """``batch_sizes_file``: the ``batch_size`` column of a CSV file, one per step, cycled.

    The loader reads the file (:func:`simwar.config.load.validate`, relative to the config
    file) and passes its sizes to the validation, which checks them against the graph
    buckets; a model validated without them has not read its file (:attr:`read`)."""

    source: ClassVar[str] = "batch_sizes_file"

    batch_sizes_file: str
    """A CSV file whose batch_size column gives one batch size per step, cycled (a path
    relative to the config file)."""
    _sizes: list[int] | None = PrivateAttr(default=None)

    def _check_source(self, info: ValidationInfo) -> None:
        sizes = (info.context or {}).get(READ_FILES, {}).get(self.batch_sizes_file)
        if sizes is None:
            return
        path = self.batch_sizes_file
        self._check_buckets(sizes, lambda i: f"workload.batch_sizes_file: {path}: line {i + 2}")
        self._sizes = list(sizes)

    @property
    def read(self) -> bool:
        """Whether the loader read the file (its sizes are known)."""
        return self._sizes is not None

    def file_sizes(self) -> list[int]:
        """The file's batch sizes, as the loader read them."""
        if self._sizes is None:
            raise ConfigError(f"workload.batch_sizes_file: {self.batch_sizes_file}: not read "
                              f"(a config is loaded by simwar.config.load_config, which reads "
                              f"its files)")
        return self._sizes


class DrawnBatch(_BatchSource):
    """``batch_size``: a plain int, or a distribution drawn per step and rounded to an integer
    >= 1 (``uniform`` draws the integers ``ceil(low)..floor(high)`` with equal odds)."""

    source: ClassVar[str] = "batch_size"

    batch_size: Annotated[Union[int, Dist], BeforeValidator(_drawn_batch)]
    """Every step's batch (a positive integer), or a distribution {dist: ...} drawn per step
    (uniform draws the integers ceil(low)..floor(high) with equal odds, others are rounded,
    at least 1)."""

    def _check_source(self, info: ValidationInfo) -> None:
        if isinstance(self.batch_size, int):
            self._check_buckets([self.batch_size], "workload.batch_size")


class _Requests(_BatchSource):
    """Requests that arrive, join the batch at the next schedule when there is room (up to
    ``max_batch``) and leave once their ``output_tokens`` are produced
    (:mod:`simwar.builder.sizes`)."""

    output_tokens: Annotated[Union[int, Dist, None], BeforeValidator(_count("output_tokens"))] \
        = None
    """Output tokens of each request (a positive integer, or a distribution drawn per
    request); a request leaves once they are produced."""
    prompt_tokens: Annotated[Union[int, Dist, None], BeforeValidator(_count("prompt_tokens"))] \
        = None
    """Prompt length of each request (a number or a distribution; needs a prefill: section):
    the request is prefilled before it decodes."""
    max_batch: int | None = None
    """The most requests in a batch; the others wait for room."""
    initial_batch: int = Field(default=0, ge=0)
    """Requests waiting when the run starts."""

    def _check_source(self, info: ValidationInfo) -> None:
        where = self.source
        traced = self.trace is not None
        if traced:
            for key in ("output_tokens", "prompt_tokens", "initial_batch"):
                if getattr(self, key):
                    raise ValueError(f"workload.{key}: not with arrivals.trace (the trace "
                                     f"gives each request)")
        for key in ("max_batch",) if traced else ("output_tokens", "max_batch"):
            if getattr(self, key) is None:
                raise ValueError(f"workload.{where}: needs workload.{key}")
        if not positive_int(self.max_batch):
            raise ValueError(f"workload.max_batch: a positive integer, got {self.max_batch!r}")
        if self.initial_batch > self.max_batch:
            raise ValueError(f"workload.initial_batch: {self.initial_batch} is above max_batch "
                             f"({self.max_batch})")
        if self.graph_buckets and self.max_batch > self.graph_buckets[-1]:
            raise ValueError(f"workload.max_batch: {self.max_batch} is above the largest graph "
                             f"bucket ({self.graph_buckets[-1]})")

    @property
    def trace(self) -> ArrivalTrace | None:
        """The requests as a server's log gives them (None: drawn)."""
        return None

    @property
    def has_prompts(self) -> bool:
        return self.prompt_tokens is not None or (self.trace is not None
                                                  and self.trace.prompt_tokens is not None)


class ArrivingRequests(_Requests):
    """``arrivals``: requests arriving as a Poisson process or as a trace gives them."""

    source: ClassVar[str] = "arrivals"

    arrivals: Arrivals
    """How requests arrive: rate_per_s (a Poisson process) or trace (each request's arrival
    time and tokens)."""

    @property
    def trace(self) -> ArrivalTrace | None:
        return self.arrivals.trace


class ClosedLoopRequests(_Requests):
    """``closed_loop``: ``concurrency`` requests in flight, a new one arriving as one
    finishes (its ``max_batch`` is the concurrency unless given)."""

    source: ClassVar[str] = "closed_loop"

    closed_loop: ClosedLoop
    """concurrency requests in flight, a new one arriving as one finishes."""

    def _check_source(self, info: ValidationInfo) -> None:
        n = self.closed_loop.concurrency
        if self.initial_batch:
            raise ValueError("workload.initial_batch: not used with closed_loop (its "
                             "concurrency requests arrive at the start)")
        if self.max_batch is None:
            object.__setattr__(self, "max_batch", n)
        elif positive_int(self.max_batch) and self.max_batch < n:
            raise ValueError(f"workload.max_batch: {self.max_batch} is below "
                             f"closed_loop.concurrency ({n})")
        lengths = self.closed_loop.lengths
        if lengths is not None and (lengths.prompt_tokens is None) != (self.prompt_tokens
                                                                      is None):
            # the listed requests and the drawn ones past them: prompts for all or for none
            raise ValueError("workload.closed_loop.lengths.prompt_tokens: give it with "
                             "workload.prompt_tokens (the draws past the list), or neither")
        super()._check_source(info)


#: the model of each batch source, by the key that gives it (None: no source key)
MODELS: dict[str | None, type[_BatchSource]] = {
    None: ConstantBatch, "batch_sizes": BatchSizes, "batch_sizes_file": BatchSizesFile,
    "batch_size": DrawnBatch, "arrivals": ArrivingRequests, "closed_loop": ClosedLoopRequests}


def _one_source(v: Any) -> Any:
    """A workload mapping as its model takes it: keys given as null left out (as if not
    given), and the errors across models (two sources; a request's key without requests)."""
    if not isinstance(v, dict):
        return v
    v = {k: x for k, x in v.items() if not (k in WORKLOAD_KEYS and x is None)}
    sources = [k for k in SOURCE_KEYS if k in v]
    if len(sources) > 1:
        raise ValueError(f"workload: {' and '.join(sources)}: give one batch source "
                         f"(batch_sizes, batch_sizes_file, batch_size, arrivals or "
                         f"closed_loop)")
    if not set(sources) & set(REQUEST_SOURCES):
        given = [k for k in REQUEST_KEYS if k in v]
        if v.get("initial_batch"):
            given.append("initial_batch")
        if given:
            raise ValueError(f"workload.{given[0]}: only used with arrivals or closed_loop")
        v.pop("initial_batch", None)  # 0: no request waits at the start, as without requests
    return v


def workload_tag(v: Any) -> str | None:
    """The union's discriminator: the model a workload mapping (or model) is, by the one
    batch source key it gives (None: not a mapping)."""
    if isinstance(v, _BatchSource):
        return type(v).__name__
    if isinstance(v, dict):
        source = next((k for k in SOURCE_KEYS if v.get(k) is not None), None)
        return MODELS[source].__name__
    return None


#: the ``workload`` section: one of the models of :data:`MODELS`, picked by its source key
Workload = Annotated[
    Union[tuple(Annotated[model, Tag(model.__name__)] for model in MODELS.values())],
    Discriminator(workload_tag, custom_error_type="workload_type",
                  custom_error_message="Input should be a valid dictionary or instance of "
                  "Workload"),
    BeforeValidator(_one_source)]
