"""The config schema (pydantic v2): the top-level :class:`Config`, its sections and the
rules across them.

A config describes one simulated run: the speculative algorithm (a phase table:
:mod:`simwar.config.phases`), the barrier policy, CPU and GPU durations
(:mod:`simwar.config.durations`), host API costs, and optionally a ``workload`` (per-step
batch sizes, graph buckets, arriving requests: :mod:`simwar.config.workload`), a prefill and
the scheduling rule that picks each step's shape (:mod:`simwar.config.shapes`),
tensor-parallel ranks and service-level objectives. Errors a user can cause are one-line
:class:`ConfigError` s (:mod:`simwar.config.base`). Reading files, dotted overrides and
naming the override to blame: :mod:`simwar.config.load`.

The rules every later layer must apply the same way are defined here, once (or in the
module this one re-exports them from): the graph-bucket rule (:func:`buckets_of`), the
engine names (:data:`ENGINES`), the algorithm names (:data:`ALGORITHMS`) and which step's
batch each duration uses (:func:`duration_keys`). ``from simwar.config.schema import X``
works for every public name of the config's modules.

Imports: pydantic and the modules of :mod:`simwar.config` below it (numpy lazily); nothing
from builder, executors or above.
"""

import math
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_validator, model_validator

from simwar.config.algorithms import BUILTIN
from simwar.config.base import (
    ConfigError,
    StrictModel,
    default_buffers,
    finite_error,
    first_error,
    non_finite,
)
from simwar.config.durations import (
    AFFINE_KEYS,
    MIN_TOKENS,
    Accept,
    Affine,
    Dist,
    Duration,
    RankDuration,
)
from simwar.config.phases import (
    CollectiveSpec,
    GraphKind,
    Phase,
    ReadEnds,
    phase_model,
    resolve_phases,
)
from simwar.config.policies import barrier
from simwar.config.shapes import (
    MAX_LAUNCHES,
    RULE_SHAPES,
    SHAPES,
    Idle,
    Prefill,
    PrefillReadEnds,
    Scheduling,
    TokenCost,
)
from simwar.config.workload import (
    REQUEST_SOURCES,
    Arrivals,
    ArrivalTrace,
    ArrivingRequests,
    BatchSizes,
    BatchSizesFile,
    ClosedLoop,
    ClosedLoopLengths,
    ClosedLoopRequests,
    ConstantBatch,
    DrawnBatch,
    Workload,
    buckets_of,
)

#: the executors a config's ``engine`` may name: ``simpy`` (the reference, keeps a full
#: trace), ``fast`` (one pass, no trace; same per-step table and summary) or ``auto`` (fast
#: unless a trace is asked for); :func:`simwar.api.resolve_engine` chooses between them
ENGINES = ("simpy", "fast", "auto")
#: the config's ``algorithm``: a built-in phase table, or ``custom`` (the config's own)
ALGORITHMS = (*BUILTIN, "custom")


class Policy(StrictModel):
    """The scheduler loop and its WAR barrier: what orders step k+1's shared writes after
    forward k's reads, where it sits, and where the read-done event is published
    (:mod:`simwar.config.policies`)."""

    barrier: str = "fine"
    """The WAR barrier policy, a registered name (none, coarse, fine, host_sync, or one added
    with @register_barrier)."""
    placement: Literal["after_launch", "loop_top"] = "after_launch"
    """Where the barrier for forward k sits: after its launch (since SGLang #31687) or at the
    top of the next iteration (before it)."""
    external_events: bool = True
    """In-graph record nodes are available (torch.cuda.Event(external=True)); without them
    an in_replay read-done falls back to in_replay_fallback."""
    in_replay_fallback: Literal["post_replay", "pre_replay"] = "post_replay"
    """Where an in_replay read-done is recorded without external events: post_replay, or
    pre_replay (unsound when the in-graph prep re-reads live tables)."""
    plan_stream: bool = False
    """The shared-buffer writes run on a plan stream (spec-v2 prep) rather than the schedule
    stream."""
    needs_cpu_seq_lens: bool = False
    """The forward needs the FutureMap's seq_lens on the host: a D2H copy of the previous
    forward's published seq_lens and a host block on it before each forward."""
    publish_phase: str = "auto"
    """The phase that publishes read-done (auto: the last phase that reads shared buffers)."""
    overlap: bool = True
    """SGLang's overlap loop (event_loop_overlap: step k's result is processed after step
    k+1 is launched); false: its normal loop (event_loop_normal: the result of step k is
    processed before step k+1 is scheduled; no barrier, no run-ahead)."""
    launch_ahead: int = Field(default=1, ge=1, le=2)
    """Forwards the loop launches before processing a result (1: SGLang's overlap loop, step
    k-1's result in iteration k; 2: a what-if, step k-2's)."""

    @model_validator(mode="after")
    def _ahead(self) -> "Policy":
        if self.launch_ahead > 1 and not self.overlap:
            raise ValueError(f"launch_ahead {self.launch_ahead} runs ahead in the overlap loop; "
                             f"with overlap false each result is processed in its own iteration")
        return self

    @field_validator("barrier")
    @classmethod
    def _registered(cls, name: str) -> str:
        barrier(name)  # raises with the registered names
        return name


class ReceiveCost(StrictModel):
    """The host's work for each request an iteration receives (µs), after ``ingest_us``, in
    the iteration that receives it (with arriving requests only): ``per_request`` +
    ``per_prompt_token`` x its prompt tokens, summed over the requests received. SGLang's
    ``recv_requests`` takes each request's token ids off its socket there, so the cost lands
    on the iteration that admits the request, not spread over every step as ``ingest_us``
    (calibration/README.md, "Why the TTFT to the first token's forward was short")."""

    per_request: float = Field(default=0.0, ge=0)
    """µs per request received."""
    per_prompt_token: float = Field(default=0.0, ge=0)
    """µs per prompt token of a request received."""

    def at(self, requests: int, prompt_tokens: int) -> float:
        """The work of receiving ``requests`` requests of ``prompt_tokens`` tokens in all."""
        return self.per_request * requests + self.per_prompt_token * prompt_tokens

    def given(self) -> bool:
        """Whether receiving costs anything (only then does an iteration hold the op)."""
        return bool(self.per_request or self.per_prompt_token)


class Cpu(StrictModel):
    """The scheduler thread's own work in each iteration (µs)."""

    ingest_us: Duration = 100.0
    """Ingesting new requests at the top of the iteration."""
    receive_us: ReceiveCost = Field(default_factory=ReceiveCost)
    """The work per request received, in the iteration that receives it (arriving requests
    only; {per_request, per_prompt_token}; 0: none, as before this key)."""
    schedule_us: Duration = 900.0
    """Scheduling the next batch."""
    prepare_us: Duration = 300.0
    """Preparing the batch for the forward."""
    process_result_us: Duration = 800.0
    """Processing a step's result once its copy is done (uses the batch of the step whose
    result it is)."""
    post_launch_us: Duration = 0.0
    """Host work after the launch and its barrier, before the previous result is processed
    (result queue, loop overhead); 0 issues nothing (simwar import --fit measures it)."""



class Gpu(StrictModel):
    """Device work outside the phases (µs) and the shared buffers the loop writes."""

    schedule_prep_us: Duration = 0.0
    """Schedule-stream work before the shared writes of a step (0 issues nothing)."""
    schedule_writes_us: Duration = 300.0
    """The shared-buffer writes for the step being prepared (req_to_token slot allocation),
    on the schedule stream (or the plan stream)."""
    result_writes_us: Duration = 50.0
    """Result processing's writes to the shared buffers (radix insert, frees), on the
    schedule stream (0 issues nothing)."""
    result_copy_us: Duration = 10.0
    """The device-to-host copy of a step's result."""
    seq_lens_copy_us: Duration = 5.0
    """The FutureMap's seq_lens copy to the host (with policy.needs_cpu_seq_lens)."""
    result_copy_stream: Literal["copy", "forward"] = "copy"
    """The stream the result copy runs on: its own copy stream (after the forward), or the
    forward stream."""
    writes: list[str] = Field(default_factory=default_buffers)
    """The shared buffers the schedule and result writes write (the phases' reads name
    them)."""



class Costs(StrictModel):
    """Host cost of each API call (µs), plus two device-model latencies.

    ``host_call_us`` is a per-call host overhead added to every API call (the
    interpreter and framework dispatch around the driver call); fit it with
    ``simwar calibrate`` (or ``simwar.fit.replays.fit_host_call_us``) rather than guessing.
    """

    launch_us: Duration = 6.0
    """Host cost of a kernel launch."""
    event_record_us: Duration = 9.0
    """Host cost of an event record."""
    wait_event_us: Duration = 2.0
    """Host cost of a stream's wait_event."""
    wait_stream_us: Duration = 12.0
    """Host cost of a wait_stream (a record and a wait)."""
    graph_launch_us: Duration = 5.0
    """Host cost of a CUDA-graph launch."""
    sync_us: Duration = 1.0
    """Host cost of a synchronize call (it returns after it, or at the event's firing plus
    sync_wake_us)."""
    sync_wake_us: Duration = 16.0
    """A device-model latency: the host's wake-up after the event a synchronize waits on
    fires."""
    cross_stream_us: Duration = 3.0
    """A device-model latency: a wait is released this long after its record fires on
    another stream."""
    host_call_us: Duration = 0.0
    """Framework dispatch added to every API call (fit it with simwar calibrate)."""


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


# --------------------------------------------------------------------------- top level
#: the fewest steps a run must measure (after the warm-up, without the last step): a step
#: time needs a successor, a spread needs two of them
MIN_MEASURED = 2


class Ranks(StrictModel):
    """How ranks differ: extra host work per step (``jitter_us`` on every rank, ``slow_us``
    on ``slow_rank`` only) ``at`` the loop top (before the request broadcast, which absorbs
    it) or at the ``launch`` (after the host collectives, right before ``run_batch``: the
    forward's collectives absorb it), and per-rank overrides of any config key
    (``per_rank: {1: {cpu.schedule_us: 1200}}``)."""

    jitter_us: RankDuration = 0.0
    """Extra host work per step on every rank (µs, or a distribution drawn per rank, per
    step)."""
    at: Literal["loop_top", "launch"] = "loop_top"
    """Where the extra work falls: the loop top (before the request broadcast, which absorbs
    it) or the launch (after the host collectives: the forward's collectives absorb it)."""
    slow_rank: int | None = Field(default=None, ge=0)
    """The rank that does slow_us of extra work per step (None: none)."""
    slow_us: RankDuration = 0.0
    """Extra host work per step on slow_rank only (µs, or a distribution)."""
    per_rank: dict[int, dict[str, Any]] = Field(default_factory=dict)
    """Per-rank overrides of any config key, by rank ({1: {cpu.schedule_us: 1200}})."""


class Parallel(StrictModel):
    """Tensor parallelism: ``tp`` ranks, each its own scheduler loop, coupled by the per-step
    host collectives (the request ``broadcast``; a DP-attention ``allgather``, off by
    default) and the device collectives of the phases. ``wait``: how a host waits at a host
    collective (``spin``: leaves as the last rank arrives; ``block``: a rank that waited
    wakes ``wake_us`` later)."""

    tp: int = Field(default=1, ge=1)
    """Tensor-parallel ranks, each its own scheduler loop (1: a single-rank run)."""
    broadcast: bool = True
    """The per-step request broadcast, a host collective every rank joins."""
    broadcast_us: RankDuration = 150.0
    """The broadcast's own time once the last rank arrives (µs, or a distribution)."""
    allgather: bool = False
    """A DP-attention allgather, a second per-step host collective."""
    allgather_us: RankDuration = 150.0
    """The allgather's own time once the last rank arrives (µs, or a distribution)."""
    wait: Literal["spin", "block"] = "spin"
    """How a host waits at a host collective: spin (it leaves as the last rank arrives) or
    block (a rank that waited wakes wake_us later)."""
    wake_us: RankDuration = 16.0
    """The wake-up of a blocked rank (wait: block; µs, or a distribution)."""


#: the schema a build of Config's validator takes (see :func:`build_validator_from`)
_PREBUILT: list = []


def build_validator_from(schema: dict) -> None:
    """Build :class:`Config`'s validator from ``schema``, the core schema an earlier build of
    this same install made (``Config.__pydantic_core_schema__``), instead of generating it (a
    Config already built is left as it is). Only the cache of validated configs calls it,
    with a schema it kept for the same sources and library versions
    (:mod:`simwar.config.cache`); raises what pydantic raises for a schema it cannot build."""
    _PREBUILT[:] = [schema]
    try:
        Config.model_rebuild()
    finally:
        _PREBUILT.clear()


class Config(StrictModel):
    """One simulated run: the algorithm's phase table, the loop's policy, CPU and GPU
    durations, host API costs, and what changes from step to step."""

    name: str = "unnamed"
    """The run's name, as its summary and the sweep's results show it."""
    seed: int = 0
    """The seed of every draw of the run (durations, batches, arrivals): the same seed gives
    the same run."""
    steps: int = Field(default=2000, ge=1)
    """Decode steps simulated."""
    warmup_steps: int = Field(default=20, ge=0)
    """Steps at the start left out of the metrics (the last step, having no successor, is
    left out too)."""
    algorithm: Literal[ALGORITHMS] = "dspark"
    """The speculative algorithm: a built-in phase table (none, eagle, dflash, dspark), or
    custom (the config's phases are the whole table)."""
    phases: list[dict] = []  # a plain default: see StrictModel
    """Overrides of the built-in phases, by name (phases.verify.read_ends), or the whole
    table of a custom algorithm (each entry a Phase)."""
    policy: Policy = Field({}, validate_default=True)  # see StrictModel
    """The scheduler loop and its WAR barrier."""
    cpu: Cpu = Field({}, validate_default=True)  # see StrictModel
    """The scheduler thread's work per iteration (µs)."""
    gpu: Gpu = Field({}, validate_default=True)  # see StrictModel
    """Device work outside the phases (µs) and the shared buffers written."""
    costs: Costs = Field({}, validate_default=True)  # see StrictModel
    """Host cost of each CUDA API call (µs) and two device-model latencies."""
    accept: Accept = Field({"tokens": 3.2}, validate_default=True)  # see StrictModel
    """Accepted tokens per request per step."""
    batch_size: int = Field(default=32, ge=1)
    """Requests in every step's batch when no workload gives them."""
    workload: Workload | None = None
    """What changes from step to step: the batch (a list, a CSV file, a distribution,
    arriving requests or a closed loop) and the graph buckets (None: every step has
    batch_size requests)."""
    engine: Literal[ENGINES] = "auto"
    """The executor: simpy (the reference, keeps a full trace), fast (one pass, the same
    per-step table and summary) or auto (fast unless a trace is asked for)."""
    parallel: Parallel | None = None
    """Tensor-parallel ranks and their host collectives (None: one rank)."""
    ranks: Ranks | None = None
    """How ranks differ (extra host work, per-rank overrides); needs parallel.tp > 1."""
    prefill: Prefill | None = None
    """The prefill of requests with prompts (workload.prompt_tokens), chunked, in steps of its
    own or mixed into decode (scheduling.rule)."""
    scheduling: Scheduling = Field({}, validate_default=True)  # see StrictModel
    """Which step shape runs when: SGLang's default (prefill steps of their own), its mixed
    chunk, or vLLM's token budget."""
    slo: Annotated[dict | None, BeforeValidator(_slo)] = None
    """Service-level objectives per request, in µs ({ttft: 200000, tpot: 30000}): the
    summary adds the goodput (requests/s meeting every bound) and the share meeting them."""

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: Any) -> Any:
        # pydantic's hook for a type's schema: the validator's schema as an earlier run of
        # this very install generated it, where the cache of validated configs holds one
        # (simwar.config.cache, through build_validator_from); else generated as for any model.
        # Generating it is nearly all of building the validator: about 12 ms, against under
        # 2 ms from the kept schema, unpickling it included (with the command line's settings)
        if source is Config and _PREBUILT:
            return _PREBUILT.pop()
        return handler(source)

    @model_validator(mode="before")
    @classmethod
    def _finite(cls, data: Any) -> Any:
        found = non_finite(data)
        if found is not None:
            raise ValueError(finite_error(found))
        return data

    @model_validator(mode="after")
    def _resolve(self) -> "Config":
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
        rule = self.scheduling.rule
        if rule != "sglang_mixed" and not prompts:
            shape = "prefill" if "prefill" in RULE_SHAPES[rule] else "mixed"
            raise ValueError(f"scheduling.rule: {rule} runs {' and '.join(RULE_SHAPES[rule])} "
                             f"steps; a {shape} step needs requests with prompts "
                             f"(workload.prompt_tokens and a prefill: section)")
        if self.prefill is not None and self.prefill.graph == "full" and \
                "mixed" in RULE_SHAPES[rule]:
            raise ValueError(f"prefill.graph: full is a graph of the prefill step alone, which "
                             f"cannot run mixed into a decode step (scheduling.rule {rule}); "
                             f"use eager or piecewise, or scheduling.rule sglang")
        if self.scheduling.idle is not None and (wl is None or wl.source != "arrivals"):
            raise ValueError("scheduling.idle: an idle step runs when no request runs or "
                             "waits; it needs requests that arrive (workload.arrivals; a "
                             "closed loop always has one)")
        pol = self.policy
        if not self.scheduling.overlap_consecutive_prefill and (not pol.overlap
                                                                or pol.launch_ahead > 1):
            raise ValueError("scheduling.overlap_consecutive_prefill: false takes a prefill "
                             "step out of the overlap loop of launch-ahead 1 (policy.overlap "
                             "true, policy.launch_ahead 1)")
        if self.slo is not None and (wl is None or wl.source not in REQUEST_SOURCES):
            raise ValueError("slo: only used with requests (workload.arrivals or "
                             "workload.closed_loop)")
        check_affine(self)
        self._check_ranks(resolved)
        self._check_buffers(resolved)
        return self

    def _check_buffers(self, phases: list[Phase]) -> None:
        """Each shared buffer written is read and each read is written: a name on one side
        only is a slip (a typo in ``gpu.writes`` would leave nothing to race and hide every
        race of the config)."""
        written = list(dict.fromkeys(self.gpu.writes))
        readers: dict[str, str] = {}
        for p in phases:
            for b in p.reads:
                readers.setdefault(b, f"phases.{p.name}.reads")
        if self.prefill is not None:
            for b in self.prefill.reads:
                readers.setdefault(b, "prefill.reads")
        if not readers:  # nothing reads a shared buffer: no WAR to order, whatever is written
            return
        for b in written:
            if b not in readers:
                raise ValueError(f"gpu.writes: '{b}' is written but no phase reads it (read: "
                                 f"{', '.join(readers)})")
        for b, where in readers.items():
            if b not in written:
                raise ValueError(f"{where}: '{b}' is read but gpu.writes does not write it "
                                 f"(written: {', '.join(written) or 'nothing'})")

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
        if tp > 1 and self.workload is not None and self.workload.source in REQUEST_SOURCES:
            if self.shapes_vary:  # its shapes come from a queue: batch sizes cannot say them
                raise ValueError(f"workload.arrivals: tensor-parallel runs (parallel.tp {tp}) "
                                 f"take batch sizes, not arriving requests, so iteration "
                                 f"shapes picked from a queue ({', '.join(self.shapes)}) need "
                                 f"parallel.tp 1")
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
        """The phase table as models (a new list of shared models: :func:`phase_model`)."""
        return [phase_model(p) for p in self.phases]

    @property
    def varies(self) -> bool:
        """Whether steps differ in batch or accepted tokens (a ``workload`` section, or
        ``accept.tokens`` that is a list or a distribution)."""
        return self.workload is not None or self.accept.varies

    @property
    def shapes(self) -> tuple[str, ...]:
        """The step shapes the run's scheduler picks from: its rule's, a mixed step being a
        decode step without a prefill section, and idle with ``scheduling.idle``."""
        out = self.scheduling.shapes
        if self.prefill is None:
            out = tuple(dict.fromkeys("decode" if s == "mixed" else s for s in out))
        return out

    @property
    def shapes_vary(self) -> bool:
        """Whether the scheduler picks each step's shape from its queue (more than one shape:
        ``scheduling.rule: sglang``, or ``scheduling.idle``), so the run's iteration shapes
        are known only as it runs (docs/design.md, "Iteration shapes")."""
        return len(self.shapes) > 1


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
    idle = cfg.scheduling.idle
    if idle is not None:  # last: a config without it keeps every other key's position
        out += [("scheduling.idle.forward_us", idle.forward_us, False),
                ("scheduling.idle.host_us", idle.host_us, False)]
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
        return sorted(set(wl.file_sizes())) if wl.read else None  # read by the loader
    if src in REQUEST_SOURCES:  # with prompts a step may prefill while no request decodes
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
    """The one line for an affine duration that is negative at some batch, or a per-bucket
    table that lacks a bucket the run reaches."""
    when = f" (step {step})" if step is not None else ""
    if a.per_bucket is not None:
        who = f"step {step}" if step is not None else "the run"
        return (f"{key}: per_bucket has no entry for bucket {size:g}, which {who} reaches "
                f"(it gives buckets {', '.join(map(str, a.per_bucket))})")
    at = f"batch {size:g}" + (f" and {tokens:g} accepted tokens" if a.per_token else "")
    return (f"{key}: {a.text()} gives {value:g} µs at {at}{when}; a duration must be >= 0 µs")


def check_affine(cfg: Config) -> None:
    """Each affine duration is >= 0 at every batch (and bucket) the run can have, and each
    per-bucket table gives every bucket the run can reach (and sizes a duration by the
    bucket)."""
    keys = [(k, v, p) for k, v, p in duration_keys(cfg) if isinstance(v, Affine)]
    if not keys:
        return
    for key, a, padded in keys:
        if a.per_bucket is not None and not padded:
            raise ValueError(f"{key}: per_bucket: only a duration sized by the graph bucket "
                             f"(a graph phase's prep_us or body_us) takes a table per bucket; "
                             f"this one uses the step's batch")
    sizes = _size_range(cfg)
    tokens = _token_range(cfg)
    if sizes is None:
        return  # checked as the sizes are drawn (simwar.builder.draws.AffineTable)
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
            bad = np.flatnonzero(~(v >= 0))  # negative, or a bucket the table lacks (NaN)
            if len(bad):
                raise ValueError(affine_error(key, a, float(at[bad[0]]), tok, float(v[bad[0]])))


__all__ = ["AFFINE_KEYS", "ALGORITHMS", "BUILTIN", "ENGINES", "MAX_LAUNCHES", "MIN_MEASURED",
           "MIN_TOKENS", "REQUEST_SOURCES", "RULE_SHAPES", "SHAPES", "SLO_METRICS", "Accept",
           "Affine", "ArrivalTrace", "Arrivals", "ArrivingRequests", "BatchSizes",
           "BatchSizesFile", "ClosedLoop", "ClosedLoopLengths", "ClosedLoopRequests",
           "CollectiveSpec", "Config", "ConfigError", "ConstantBatch", "Costs", "Cpu", "Dist",
           "DrawnBatch", "Duration", "Gpu", "GraphKind", "Idle", "Parallel", "Phase", "Policy",
           "Prefill",
           "PrefillReadEnds", "RankDuration", "Ranks", "ReadEnds", "Scheduling", "StrictModel",
           "TokenCost", "Workload", "affine_error", "buckets_of", "check_affine", "duration_keys",
           "finite_error", "first_error", "non_finite", "resolve_phases"]
