"""Iteration shapes in the config: the prefill of requests with prompts, its token-priced
durations, the DP-attention idle batch and the scheduling rule that picks each step's shape.

A step is a decode step (the phase table), a prefill step of its own, a mixed step (a prefill
chunk, then the decode phases, in one forward) or an idle step (:data:`SHAPES`); which ones a
run has is its ``scheduling.rule``'s (:data:`RULE_SHAPES`), with ``scheduling.idle``. These
are the ``prefill:`` and ``scheduling:`` sections of :class:`simwar.config.schema.Config`, kept
apart from the loop's own sections (policy, CPU, GPU, host costs) because they say what a
step holds, not how the loop runs it; the rules across sections (a prefill needs prompts, a
full-graph prefill cannot run mixed) are the Config's. See docs/design.md, "Iteration
shapes" and "Durations, sizes and draws" (Prefill). ``simwar.config.schema`` re-exports every
public name here.

Imports: pydantic and the modules of :mod:`simwar.config` below it (base, durations,
workload).
"""

import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from simwar.config.base import StrictModel, default_buffers
from simwar.config.durations import RankDuration
from simwar.config.workload import positive_int


class TokenCost(StrictModel):
    """A duration of a prefill step: ``base + per_token * tokens + per_token_prefix *
    prefix`` for a step that prefills ``tokens`` > 0 prompt tokens, nothing for a step that
    prefills none. ``prefix``: the (chunk token, cached token) pairs the step's attention adds
    over the prompts' prefixes already in the cache, summed over its requests (a request
    carried over from earlier chunks: the tokens this step prefills of it times those
    prefilled before; 0 for a prompt prefilled in one step). See docs/design.md, "Durations,
    sizes and draws" (Prefill)."""

    base: float = Field(default=0.0, ge=0)
    """µs of a step that prefills any prompt tokens."""
    per_token: float = Field(default=0.0, ge=0)
    """µs per prompt token the step prefills."""
    per_token_prefix: float = Field(default=0.0, ge=0)
    """µs per prompt token the step prefills per token of its request's prefix already in
    the cache (a later chunk's attention over the earlier chunks; 0: the cost is linear in
    the tokens, as before this key)."""

    @model_validator(mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        if isinstance(v, bool):
            raise ValueError(f"expected a number of µs or {{base, per_token, "
                             f"per_token_prefix}}, got {v!r}")
        if isinstance(v, (int, float)):
            return {"base": v}
        return v

    def at(self, tokens: int, prefix: int = 0) -> float:
        """The duration of a step that prefills ``tokens`` prompt tokens over ``prefix``
        (chunk token, cached token) pairs (without the prefix term when it is 0: a config
        without the key gives what it gave before, bit for bit)."""
        if tokens <= 0:
            return 0.0
        out = self.base + self.per_token * float(tokens)
        if self.per_token_prefix:
            out += self.per_token_prefix * float(prefix)
        return out


#: the most prefill launches a config may model (``prefill.launches``): each is a host
#: dispatch and a kernel in the Program, so the count bounds a prefill step's ops
#: (docs/design.md, "Prefill": a real eager prefill's hundreds of kernels are modelled as at
#: most this many, each taking its share of the host and device time)
MAX_LAUNCHES = 32
#: where a prefill step's read-done is recorded (:attr:`Prefill.read_ends`)
PrefillReadEnds = Literal["post_replay", "in_replay", "pre_replay", "unknown"]


class Prefill(StrictModel):
    """The prefill of requests with prompts (``workload.prompt_tokens``), as SGLang's chunked
    prefill (``--chunked-prefill-size``): a step prefills up to ``chunk_tokens`` prompt tokens
    of the requests waiting for prefill, first come first served, in a step of its own or in
    the same forward as the decode batch (``scheduling.rule``). ``forward_us``: the prefill
    forward (on the forward stream, before the decode phases of a mixed step; its cost grows
    with the prefix a later chunk attends over); ``host_us``: the host's extra work to prepare
    it; ``graph``: ``eager`` (``launches`` kernel launches, each after its share of the host
    work), ``piecewise`` (a graph launch: SGLang's piecewise CUDA graph for extend) or
    ``full`` (a graph of the prefill step alone); ``read_ends``: where a prefill step records
    its read-done. See docs/design.md, "Durations, sizes and draws"
    (Prefill, Iteration shapes)."""

    chunk_tokens: int = 8192
    """The most prompt tokens a step prefills (SGLang's --chunked-prefill-size)."""
    forward_us: TokenCost
    """The prefill part of the forward, on the forward stream before the decode phases (µs, or
    {base, per_token, per_token_prefix}; split over launches by device_shares)."""
    host_us: TokenCost = Field({}, validate_default=True)  # see StrictModel
    """The host's extra work to prepare the prefill (µs, or {base, per_token}; split over
    launches by host_shares)."""
    host_before_us: TokenCost = Field({}, validate_default=True)  # see StrictModel
    """The host's work on the prefill before its first launch, beyond ``host_us`` (µs, or
    {base, per_token}: preparing its requests' batch, which no kernel of it can overlap; 0:
    none, every launch after its share of ``host_us`` alone)."""
    graph: Literal["eager", "piecewise", "full"] = "eager"
    """How the prefill runs: eager (kernel launches), piecewise (a graph launch: SGLang's
    piecewise CUDA graph for extend) or full (a graph launch of a graph captured for the
    prefill step alone: graph-only, so it cannot run mixed into a decode step; needs
    scheduling.rule sglang)."""
    reads: list[str] = Field(default_factory=default_buffers)
    """The shared buffers the prefill reads."""
    launches: int = 1
    """Kernel launches of an eager prefill (1..32): each a host dispatch taking its share of
    host_us, then its kernel taking its share of forward_us, so the GPU runs the first
    kernels while the host still launches the others (1: host work, then one kernel)."""
    host_shares: list[float] = Field(default_factory=list)
    """Each launch's share of host_us, one weight per launch (launches of them, >= 0, any
    positive sum; each launch takes host_us x its weight / their sum; empty: equal shares).
    A real eager prefill's launches are not alike: the fit measures them from the capture."""
    device_shares: list[float] = Field(default_factory=list)
    """Each launch's kernel's share of forward_us, as host_shares (empty: equal shares): a
    prefill's long kernels (attention, the large GEMMs) keep the GPU busy while the host
    launches the short ones after them, which equal shares cannot show."""
    read_ends: PrefillReadEnds = "post_replay"
    """Where a prefill step's read-done is recorded (when the run publishes one): post_replay
    (after its last kernel: every kernel reads prefill.reads), in_replay (after its first
    kernel, the only one that reads: the attention metadata; eager, launches > 1),
    pre_replay (before its first launch: a what-if whose reads race the next step's writes)
    or unknown (nothing: a fine barrier fences that step at the whole forward)."""

    @field_validator("chunk_tokens", mode="before")
    @classmethod
    def _chunk(cls, v: Any) -> Any:
        if not positive_int(v):
            raise ValueError(f"prefill.chunk_tokens: a positive number of tokens per step, "
                             f"got {v!r}")
        return int(v)

    @field_validator("launches", mode="before")
    @classmethod
    def _launches(cls, v: Any) -> Any:
        if not positive_int(v) or int(v) > MAX_LAUNCHES:
            raise ValueError(f"prefill.launches: a number of kernel launches from 1 to "
                             f"{MAX_LAUNCHES}, got {v!r}")
        return int(v)

    @model_validator(mode="after")
    def _eager(self) -> "Prefill":
        if self.launches > 1 and self.graph != "eager":
            raise ValueError(f"prefill.launches: {self.launches} launches are an eager "
                             f"prefill's kernels; graph {self.graph} is one graph launch "
                             f"(give launches 1, or graph eager)")
        for key in ("host_shares", "device_shares"):
            got = getattr(self, key)
            if got and (len(got) != self.launches or not sum(got) > 0
                        or not all(0 <= w < math.inf for w in got)):
                raise ValueError(f"prefill.{key}: one finite weight >= 0 per launch "
                                 f"(prefill.launches {self.launches}) with a positive sum, "
                                 f"got {len(got)} weight{'s' if len(got) != 1 else ''} "
                                 f"{got!r}")
        if self.read_ends == "in_replay" and self.launches == 1:
            raise ValueError("prefill.read_ends: in_replay ends the reads after the first of "
                             "several kernels; give prefill.launches > 1 (eager)")
        return self


#: the step shapes a server runs (docs/design.md, "Iteration shapes"): a decode step (the
#: phase table), a prefill step of its own (the prefill forward alone: decodes pause), a
#: mixed step (a prefill chunk, then the decode phases, in one forward), an idle step (a
#: DP-attention idle batch: the idle forward, no request; ``scheduling.idle``)
SHAPES = ("decode", "prefill", "mixed", "idle")
#: the shapes each scheduling rule picks from (idle added by ``scheduling.idle``): the mixed
#: rules run a mixed step when prompt tokens wait and a plain decode step when none does
#: (SGLang's ``--enable-mixed-chunk`` and vLLM launch no prefill for an empty chunk)
RULE_SHAPES = {"sglang": ("decode", "prefill"), "sglang_mixed": ("decode", "mixed"),
               "vllm": ("decode", "mixed")}


class Idle(StrictModel):
    """A DP-attention idle batch (SGLang's ``ForwardMode.IDLE``): a forward with no request,
    which a data-parallel attention rank runs when it has nothing to run so that its
    collectives stay in step with the other ranks'. With this section, a step whose
    scheduler finds no request running or waiting runs it instead of waiting for the next
    arrival: host work, then one kernel (eager) or one graph launch (full), after the step's
    shared writes like any step's forward. See docs/design.md, "Iteration shapes"."""

    forward_us: RankDuration
    """The idle forward on the forward stream (µs, or a distribution drawn per idle step)."""
    host_us: RankDuration = 0.0
    """The host's work to prepare the idle batch (µs, or a distribution; 0 issues nothing)."""
    graph: Literal["eager", "full"] = "eager"
    """How the idle forward runs: eager (a kernel launch) or full (a graph launch)."""


class Scheduling(StrictModel):
    """Which step shape the scheduler runs, chosen from its queue at each step's start.

    ``sglang``: SGLang's default (``get_next_batch_to_run``): while prompt tokens wait (a
    request admitted and not yet fully prefilled, a chunked one carried over included), the
    step is a prefill step of its own and every running decode pauses; otherwise a decode
    step. ``sglang_mixed``: SGLang's ``--enable-mixed-chunk``: while prompt tokens wait, a mixed
    step (the decode step with their chunk mixed in; the decoding requests take one token
    each of ``prefill.chunk_tokens`` first, as SGLang's ``PrefillAdder`` does with mixed
    chunk), otherwise a plain decode step, which launches no prefill (what configs without
    this section mean). ``vllm``: vLLM's token
    budget: the decodes take their tokens of ``prefill.chunk_tokens`` first and the prompts
    the rest; a step that prefills no token is a decode step. See docs/design.md, "Iteration
    shapes"."""

    rule: Literal["sglang", "sglang_mixed", "vllm"] = "sglang_mixed"
    """sglang (a prefill step of its own while prompt tokens wait; decodes pause),
    sglang_mixed (--enable-mixed-chunk: a mixed step, the prefill chunk in the decode step's
    forward, its decodes' tokens taken out of the budget first, while prompt tokens wait;
    otherwise a decode step) or vllm (one token budget,
    decodes first: a mixed step when prompt tokens get some of it; otherwise a decode step)."""
    max_consecutive_prefill: int | None = None
    """The sglang rule: at most this many prefill steps in a row while requests are
    decoding, then a decode step (None: no bound, SGLang's default)."""

    idle: Idle | None = None
    """A DP-attention idle batch, run in place of waiting when no request runs or waits
    ({forward_us, host_us, graph}; None: the host waits for the next arrival)."""
    overlap_consecutive_prefill: bool = True
    """The sglang rule in the overlap loop: a prefill step right after another runs overlapped
    with it (SGLang's default); false: the previous prefill step's result is processed
    before the step is launched (SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP=1, sooner first
    tokens)."""

    @field_validator("max_consecutive_prefill", mode="before")
    @classmethod
    def _bound(cls, v: Any) -> Any:
        if v is not None and not positive_int(v):
            raise ValueError(f"scheduling.max_consecutive_prefill: a positive number of "
                             f"steps, got {v!r}")
        return v

    @model_validator(mode="after")
    def _rule(self) -> "Scheduling":
        if self.max_consecutive_prefill is not None and self.rule != "sglang":
            raise ValueError(f"max_consecutive_prefill bounds the prefill steps of the "
                             f"sglang rule; rule {self.rule} runs none")
        if not self.overlap_consecutive_prefill and self.rule != "sglang":
            raise ValueError(f"overlap_consecutive_prefill: false is about two prefill steps "
                             f"in a row of the sglang rule; rule {self.rule} runs none")
        return self

    @property
    def shapes(self) -> tuple[str, ...]:
        """The step shapes the rule picks from (idle too with ``idle``)."""
        return RULE_SHAPES[self.rule] + (("idle",) if self.idle is not None else ())


__all__ = ["MAX_LAUNCHES", "RULE_SHAPES", "SHAPES", "Idle", "Prefill", "PrefillReadEnds",
           "Scheduling", "TokenCost"]
