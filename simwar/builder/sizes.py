"""Per-step sizes of a run: batch, graph bucket, accepted tokens, and arriving requests.

:func:`draw_sizes` turns a config's ``workload`` and ``accept`` sections into arrays over the
run's steps (:class:`StepSizes`), computed once, before any op is built:

- ``batch[k]``: the requests in step k's batch (``workload.batch_sizes`` cycled, the
  ``batch_sizes_file`` column cycled, ``workload.batch_size`` drawn per step, the arrivals
  model below, or the config's constant ``batch_size``);
- ``bucket[k]``: the graph bucket step k's graph phases run at (the smallest of
  ``workload.graph_buckets`` >= the batch, the batch itself without buckets:
  :func:`simwar.config.schema.buckets_of`, the rule the validation applies);
- ``accept[k]``: accepted tokens per request in step k (``accept.tokens``: a number, a
  per-step list cycled, or a distribution drawn once per step).

A size that is the same in every step is a read-only array of no memory
(``numpy.broadcast_to``): a constant run allocates nothing per step.

The durations that scale with the step (:class:`simwar.config.schema.Affine`) are evaluated on
these arrays by :class:`simwar.builder.draws.AffineTable`, vectorised, in the same layout as the
distribution draws, so every executor reads the same numbers.

**Seeds.** Each random source has its own generator, seeded by ``(config.seed, stream)``
(``batch``, ``accept``, ``arrivals``, ``output``), separate from the durations' generator
(``config.seed``, as without a workload): changing the batch source does not move the
duration draws, and a config without ``workload`` draws exactly what it drew before.

**Arrivals (feedback).** With ``workload.arrivals`` the batch depends on simulated time:
requests arrive as a Poisson process, join at the next schedule when there is room (up to
``max_batch``), and leave once their ``output_tokens`` are produced (each step advances every
request in the batch by that step's accepted tokens). The scheduler learns that a request
finished when it processes that step's result, which the overlap loop does in the *next*
iteration, after scheduling it: a request completed by step k is still in batch k+1 (the
overlap loop's extra step) and leaves before batch k+2. Step k's batch is fixed at the host
time iteration k begins (its step marker: what arrived by then is admitted); if nothing is
running or waiting, the host waits for the next arrival there (a ``wait_requests`` CPU span).

:func:`draw_sizes` leaves an arrivals run's batches at zero; :class:`ArrivalProcess` is
the model that fixes them, and the fast executor realizes the sequence with it, in one
pass over the run's own plan (:func:`simwar.executors.fast.realize`, called by
:func:`simwar.api.resolve_sizes`): before iteration k it reads the host clock, fixes batch k
(and the wait), and evaluates iteration k's durations; iteration k's ops only use the
batches of steps <= k, so nothing already run changes (that pass is the fast engine's run).
A request's finish step is known when it is admitted (its output less each step's accepted
tokens, which do not depend on time), so a step costs its admissions, not its batch.
The realized sequence is then a fixed per-step array like any other: the one Program every
executor runs (the SimPy engine, the fast executor, the GPU harness) is built from it,
and it is exported in the per-step table (``batch_size``) and the program's
``meta.workload``. The same seed gives the same sequence.

**Prompts, the normal loop, closed loops.** With ``workload.prompt_tokens`` an admitted
request is first prefilled: each step prefills up to ``prefill.chunk_tokens`` prompt tokens
of the admitted requests still prefilling, first come first served (SGLang's chunked prefill
mixed into decode); the step that prefills a request's last prompt token produces its first
token, and the request decodes from the next step on (the scheduler chose the chunks, so it
knows at once), producing its ``output_tokens - 1`` others. Step k's batch is the requests
decoding in it, its ``prefill_tokens[k]`` the prompt tokens it prefills (``prefill_us`` and
``prefill_host_us``: the durations they cost). Without prompts a request decodes from its
admission step, which produces its first token. That is the mixed rule (``scheduling.rule``
``sglang_mixed``, the default, and ``vllm`` take the decoding requests' tokens, one each, out
of the chunk first, as SGLang's ``PrefillAdder`` with mixed chunk and vLLM's token budget do):
a step that prefills some token is a ``mixed`` step, one that prefills none (no prompt token
waits, or the decodes took the whole budget) a plain
``decode`` step, which launches no prefill (``shape[k]``: the shapes are picked as the run
goes, as under ``sglang``; every step decodes either way, so a request's finish step does
not depend on them). Under ``scheduling.rule: sglang`` (SGLang's default) the model also picks
each step's shape (``shape[k]``): a prefill step of its own while prompt tokens wait (a
carried-over chunk included; every new request goes through one, a prompt of at least one
token), its batch empty because the decoding requests pause, at most
``max_consecutive_prefill`` of them in a row while requests decode; otherwise a decode step,
in which each decoding request advances by the step's accepted tokens. A request's finish
step then depends on the shapes to come, so it is found as the steps are picked, and its
decode steps are kept (``requests["decode_steps"]``, what ITL divides by).

With ``policy.overlap: false`` (the normal loop) a result is processed in its own
iteration, so a request finished by step k leaves before batch k+1 (no extra step).
``workload.closed_loop`` keeps ``concurrency`` requests in flight: they arrive at time 0,
and each request that leaves before batch k is replaced by one arriving at iteration k's
start (when the host has processed the finishing result: the client's reply, sent again at
once). ``closed_loop.lengths`` gives the requests' lengths in the order sent (a measured
run's own requests); past its lists they are drawn.

Imports: numpy, :mod:`simwar.config`, :mod:`simwar.core.frozen` and
:mod:`simwar.builder.draws`; nothing from executors (realizing arrivals runs the executor:
:mod:`simwar.api` orders it).
"""

from __future__ import annotations

import heapq
import math
from collections import deque

import numpy as np

from simwar.builder.draws import sample
from simwar.config.base import ConfigError
from simwar.config.schema import REQUEST_SOURCES, SHAPES, Config, buckets_of
from simwar.core.frozen import MutableRecord

#: the generator stream of each random source: ``default_rng([seed, STREAMS[name]])``
STREAMS = {"batch": 1, "accept": 2, "arrivals": 3, "output": 4, "prompt": 5}
#: arrival gaps and output lengths are drawn in chunks of this many (whatever the run's length)
CHUNK = 4096


def rng(seed: int, stream: str) -> np.random.Generator:
    """The generator of one random source of the sizes (a name of :data:`STREAMS`)."""
    return np.random.default_rng([seed, STREAMS[stream]])



def has_host_before(pf) -> bool:
    """Whether a prefill section gives host work before its first launch
    (``prefill.host_before_us``): only then does a step's program hold that host op, so that
    a config without the key builds what it built before, op for op."""
    c = pf.host_before_us
    return bool(c.base or c.per_token or c.per_token_prefix)

class StepSizes(MutableRecord):
    """Per-step arrays of one run (see the module docstring)."""

    _fields = ("batch", "bucket", "accept", "buckets", "idle", "requests", "prefill_tokens",
               "prefill_us", "prefill_host_us", "prefill_host_before_us", "prefill_prefix",
               "prefill_launch_us", "prefill_launch_host_us", "per_step", "suffix", "source",
               "shape", "received_us")

    def __init__(self, batch: np.ndarray, bucket: np.ndarray, accept: np.ndarray,
                 buckets: list[int] | None = None, idle: np.ndarray | None = None,
                 requests: dict | None = None, prefill_tokens: np.ndarray | None = None,
                 prefill_us: np.ndarray | None = None,
                 prefill_host_us: np.ndarray | None = None,
                 prefill_host_before_us: np.ndarray | None = None,
                 prefill_prefix: np.ndarray | None = None,
                 prefill_launch_us: np.ndarray | None = None,
                 prefill_launch_host_us: np.ndarray | None = None, per_step: bool = False,
                 suffix: bool = False, source: str = "constant",
                 shape: np.ndarray | None = None, received_us: np.ndarray | None = None):
        self.batch = batch  # int64, one per step
        self.bucket = bucket  # int64
        self.accept = accept  # float64
        self.buckets = buckets
        #: arrivals only: host time waited for a request at the top of each iteration
        #: (steps + 1 entries: the drain waits for nothing)
        self.idle = idle
        #: arrivals only: per admitted request (arrays of equal length)
        self.requests = requests
        #: prompts only: prompt tokens prefilled in each step, and what that costs (µs)
        self.prefill_tokens = prefill_tokens
        self.prefill_us = prefill_us
        self.prefill_host_us = prefill_host_us
        #: ``prefill.host_before_us`` given only: the host's work before the prefill's first
        #: launch
        self.prefill_host_before_us = prefill_host_before_us
        #: prompts only: the (chunk token, cached token) pairs of each step's attention over
        #: the prefixes its requests have in the cache (``prefill.forward_us.per_token_prefix``)
        self.prefill_prefix = prefill_prefix
        #: ``prefill.launches`` > 1 only, without ``prefill.device_shares`` (``host_shares``):
        #: each launch's equal share of ``prefill_us`` (``prefill_host_us``): the kernel and the
        #: host dispatch of each of the step's launches
        self.prefill_launch_us = prefill_launch_us
        self.prefill_launch_host_us = prefill_launch_host_us
        #: the program's meta carries the per-step arrays (a workload section, or varying
        #: accepted tokens)
        self.per_step = per_step
        #: graph launches carry their size in their name (``verify.graph@32``): one captured
        #: graph per (phase, bucket)
        self.suffix = suffix
        #: the workload's batch source (``constant`` without one): :mod:`simwar.config.workload`
        self.source = source
        #: a run whose scheduler picks each step's shape (``scheduling.rule: sglang``): the
        #: shape of each step, an index into :data:`~simwar.config.schema.SHAPES` (None: every
        #: step has the rule's one shape)
        self.shape = shape
        #: ``cpu.receive_us`` given only (arrivals): the host's work for the requests each
        #: iteration receives at its marker
        self.received_us = received_us

    def meta(self) -> dict:
        """The ``meta.workload`` block (plain lists: programs and traces are JSON)."""
        out = {"source": META_SOURCE.get(self.source, self.source),
               "batch_size": self.batch.tolist(), "graph_bucket": self.bucket.tolist(),
               "accepted_tokens": self.accept.tolist(), "graph_buckets": self.buckets}
        if self.requests is not None:
            out["requests"] = {k: v.tolist() for k, v in self.requests.items()}
        if self.prefill_tokens is not None:
            out["prefill_tokens"] = self.prefill_tokens.tolist()
        if self.shape is not None:
            out["shape"] = [SHAPES[c] for c in self.shape.tolist()]
        return out

    def shape_of(self, k: int) -> str | None:
        """The shape of step ``k`` when the run picks shapes (None: the rule's one shape)."""
        return None if self.shape is None else SHAPES[int(self.shape[k])]


#: the codes of the step shapes in :attr:`StepSizes.shape`
DECODE, PREFILL, MIXED, IDLE = (SHAPES.index(name)
                                for name in ("decode", "prefill", "mixed", "idle"))
#: ``meta.workload.source`` for a source the trace format names otherwise: a trace names every
#: run of arriving requests, an open or a closed loop, ``arrivals`` (as saved traces do)
META_SOURCE = {"closed_loop": "arrivals"}


def constant(value, n: int, dtype) -> np.ndarray:
    """``n`` equal values as a read-only array of no memory (a constant run allocates nothing
    per step)."""
    return np.broadcast_to(np.asarray(value, dtype=dtype), (n,))


def _batches(cfg: Config, n: int) -> np.ndarray:
    wl = cfg.workload
    src = wl.source if wl is not None else "constant"
    if src == "constant":
        return constant(cfg.batch_size, n, np.int64)
    if src in ("batch_sizes", "batch_sizes_file"):
        seq = np.asarray(wl.batch_sizes if src == "batch_sizes" else wl.file_sizes(),
                         dtype=np.int64)
        return np.resize(seq, n)
    if src in REQUEST_SOURCES:
        return np.zeros(n, dtype=np.int64)  # realized later
    d = wl.batch_size
    if isinstance(d, int):
        return constant(d, n, np.int64)
    g = rng(cfg.seed, "batch")
    if d.dist == "uniform":
        lo, hi = max(1, math.ceil(d.low)), math.floor(d.high)
        return g.integers(lo, hi + 1, size=n).astype(np.int64)
    return np.maximum(1, np.rint(sample(g, d, n))).astype(np.int64)


def _accepted(cfg: Config, n: int) -> np.ndarray:
    t = cfg.accept.tokens
    if isinstance(t, float):
        return constant(t, n, np.float64)
    if isinstance(t, list):
        return np.resize(np.asarray(t, dtype=float), n)
    return sample(rng(cfg.seed, "accept"), t, n)


def draw_sizes(cfg: Config) -> StepSizes:
    """The per-step arrays; an arrivals run's are not realized yet (its batches are zeros,
    its ``idle`` waits too: :class:`ArrivalProcess` fills them)."""
    n = cfg.steps
    wl = cfg.workload
    src = wl.source if wl is not None else "constant"
    batch = _batches(cfg, n)
    buckets = wl.graph_buckets if wl is not None else None
    where = f"workload.{src}" if src in ("batch_size", "batch_sizes", "batch_sizes_file") \
        else "batch_size"
    if src in REQUEST_SOURCES:
        bucket = batch.copy()  # realized later
    elif batch.strides == (0,) and len(batch):  # one batch for every step
        bucket = constant(buckets_of(batch[:1], buckets, where)[0], n, np.int64)
    else:
        bucket = buckets_of(batch, buckets, where)
    out = StepSizes(batch, bucket, _accepted(cfg, n), buckets,
                    idle=np.zeros(n + 1) if src in REQUEST_SOURCES else None,
                    per_step=cfg.varies, suffix=wl is not None, source=src)
    if cfg.prefill is not None:  # realized with the arrivals
        out.prefill_tokens = np.zeros(n, dtype=np.int64)
        out.prefill_us = np.zeros(n)
        out.prefill_host_us = np.zeros(n)
        out.prefill_prefix = np.zeros(n, dtype=np.int64)
        if has_host_before(cfg.prefill):
            out.prefill_host_before_us = np.zeros(n)
        if cfg.prefill.launches > 1:  # equal shares only: weighted ones scale the whole
            if not cfg.prefill.device_shares:
                out.prefill_launch_us = np.zeros(n)
            if not cfg.prefill.host_shares:
                out.prefill_launch_host_us = np.zeros(n)
    if cfg.shapes_vary:  # realized with the arrivals
        out.shape = np.zeros(n, dtype=np.int8)
    if src in REQUEST_SOURCES and cfg.cpu.receive_us.given():  # realized with the arrivals
        out.received_us = np.zeros(n)
    return out


class ArrivalProcess:
    """The arrivals model of ``workload.arrivals``, which fills ``sizes`` (from
    :func:`draw_sizes`) one step at a time, as :func:`simwar.executors.fast.realize`
    runs the iterations.

    ``schedule(k, t)`` fixes batch k (and its bucket) at host time ``t`` (iteration k's step
    marker), applies step k's accepted tokens to the requests in its batch, and returns the
    time waited for a first request; ``finish_run()``, once every step is fixed, stores the
    admitted requests (``sizes.requests``).
    """

    def __init__(self, cfg: Config, sizes: StepSizes):
        wl = cfg.workload
        self.sizes = sizes
        self.max_batch = int(wl.max_batch)
        # the bucket of every batch the run can have (validated: max_batch fits the buckets)
        self.bucket_at = buckets_of(np.arange(self.max_batch + 1), sizes.buckets,
                                    "workload.max_batch").tolist()
        self.closed = wl.source == "closed_loop"
        self.trace = wl.trace
        #: a closed loop's requests' lengths in the order sent (None: drawn)
        self.lengths = wl.closed_loop.lengths if self.closed else None
        self.gap_us = 1e6 / wl.arrivals.rate_per_s if not self.closed and self.trace is None \
            else math.inf
        self.output = wl.output_tokens
        self.prompt = wl.prompt_tokens
        self.prefill = cfg.prefill
        sch = cfg.scheduling
        #: SGLang's default: a prefill step of its own while prompt tokens wait
        self.separate = sch.rule == "sglang"
        #: the decodes take their tokens of the chunk first: vLLM's token budget, and SGLang's
        #: mixed chunk (its ``PrefillAdder`` built with ``mixed_with_decode_tokens``, the
        #: running batch's size, taken out of ``rem_chunk_tokens``)
        self.budgeted = sch.rule in ("vllm", "sglang_mixed")
        self.max_prefills = sch.max_consecutive_prefill
        #: ``cpu.receive_us``: the host's work per request received (None: none)
        self.receive = cfg.cpu.receive_us if sizes.received_us is not None else None
        self.unreceived: list[int] = []  # requests arrived, not yet received by a marker
        #: ``scheduling.idle``: an idle step when no request runs or waits (not a wait)
        self.idles = sch.idle is not None
        self.prefills = 0  # prefill steps in a row so far (the sglang rule)
        # the sglang rule's decode steps: the accepted tokens summed over them, their count,
        # and per decoding request (a heap) the sum at which its last token is produced
        self.summed = 0.0
        self.decodes = 0
        self.due: list[tuple[float, int]] = []
        self.since: dict[int, int] = {}  # request -> decode steps before its first one
        self.starting: list[tuple[int, int]] = []  # (request, tokens) decoding from next
        self.decoded: dict[int, int] = {}  # the sglang rule: request -> its decode steps
        # the loop learns of a finish when it processes that step's result: one iteration
        # later with overlap, in the same iteration without
        self.lag = 2 if cfg.policy.overlap else 1
        self._arr_rng = rng(cfg.seed, "arrivals")
        self._out_rng = rng(cfg.seed, "output")
        self._prompt_rng = rng(cfg.seed, "prompt")
        self._gaps: list[float] = []
        self._outs: list[int] = []
        self._prompts: list[int] = []
        self.prompt_tokens: list[int] = []
        self.first: list[int] = []  # per request: the step producing its first token
        self.chunk_first: list[int] = []  # per request: the step of its first prompt chunk
        self.prefilling: deque[int] = deque()  # admitted, prompt tokens left (FIFO)
        self.left: dict[int, int] = {}  # request -> prompt tokens still to prefill
        self.joining: dict[int, int] = {}  # step -> requests that start decoding there
        self.decoding = 0
        self.last_arrival = 0.0
        # per request (by id): arrival, output, admit step/time, finish step
        self.arrival: list[float] = []
        self.out_tokens: list[int] = []
        self.admit_step: list[int] = []
        self.admit_us: list[float] = []
        self.finish: list[int] = []
        self.queue: deque[int] = deque()
        self.active = 0  # requests in the batch (admitted, not yet left)
        self.leaving: dict[int, int] = {}  # step -> requests that leave before its batch
        self.decoding_leaving: dict[int, int] = {}  # step -> of them, those that decoded
        self._accept: list[float] | None = None  # accepted tokens per step, as floats
        self.next_time = 0.0  # the next arrival not yet in the queue
        for _ in range(wl.closed_loop.concurrency if self.closed else wl.initial_batch):
            self._new(0.0)
        self.next_time = self._gap()
        self.done = -1  # last iteration scheduled

    def _gap(self) -> float:
        if self.closed:  # a closed loop's requests arrive as others leave
            return math.inf
        if self.trace is not None:  # the next request of the trace, or none
            i = len(self.arrival)
            times = self.trace.arrival_us
            return float(times[i]) if i < len(times) else math.inf
        if not self._gaps:
            self._gaps = self._arr_rng.exponential(self.gap_us, CHUNK).tolist()[::-1]
        return self.last_arrival + self._gaps.pop()

    def _output(self, rid: int) -> int:
        if self.trace is not None:
            return int(self.trace.output_tokens[rid])
        if self.lengths is not None and rid < len(self.lengths.output_tokens):
            return int(self.lengths.output_tokens[rid])
        if isinstance(self.output, int):
            return self.output
        if not self._outs:
            draws = sample(self._out_rng, self.output, CHUNK)
            self._outs = np.maximum(1, np.ceil(draws)).astype(np.int64).tolist()[::-1]
        return self._outs.pop()

    def _prompt(self, rid: int) -> int:
        if self.trace is not None:
            p = self.trace.prompt_tokens
            return 0 if p is None else int(p[rid])
        if self.lengths is not None and self.lengths.prompt_tokens is not None \
                and rid < len(self.lengths.prompt_tokens):
            return int(self.lengths.prompt_tokens[rid])
        if self.prompt is None:
            return 0
        if isinstance(self.prompt, int):
            return self.prompt
        if not self._prompts:
            draws = sample(self._prompt_rng, self.prompt, CHUNK)
            self._prompts = np.maximum(1, np.ceil(draws)).astype(np.int64).tolist()[::-1]
        return self._prompts.pop()

    def _new(self, t: float) -> None:
        rid = len(self.arrival)
        self.out_tokens.append(self._output(rid))
        self.prompt_tokens.append(self._prompt(rid))
        self.arrival.append(t)
        if self.receive is not None:
            self.unreceived.append(rid)
        self.first.append(-1)
        self.chunk_first.append(-1)
        self.admit_step.append(-1)
        self.admit_us.append(math.nan)
        self.finish.append(-1)
        self.queue.append(rid)

    def _arrive_until(self, t: float) -> None:
        while self.next_time <= t:
            self.last_arrival = self.next_time
            self._new(self.next_time)
            self.next_time = self._gap()

    def schedule(self, k: int, t: float) -> float:
        """Fix batch k at host time ``t``; return the time waited for a request."""
        if k <= self.done:  # the executor may re-run a pass: the decision stands
            return float(self.sizes.idle[k])
        self.done = k
        idle = self._fix(k, t)
        if self.receive is not None:  # every request arrived by the marker (or the wait)
            got = self.unreceived
            self.sizes.received_us[k] = self.receive.at(
                len(got), sum(self.prompt_tokens[rid] for rid in got))
            got.clear()
        return idle

    def _fix(self, k: int, t: float) -> float:
        """:meth:`schedule`'s decision for a step not fixed yet."""
        # finished by step k-2 (k-1 without overlap): the scheduler processed that result
        gone = self.leaving.pop(k, 0)
        self.active -= gone
        self.decoding += self.joining.pop(k, 0) - self.decoding_leaving.pop(k, 0)
        if self.closed:  # each request that left is sent again, as its reply came back
            for _ in range(gone):
                self._new(t)
        if self.next_time <= t:
            self._arrive_until(t)
        idle = 0.0
        sizes = self.sizes
        if not self.active and not self.queue and self.idles:
            # a DP-attention idle batch: a forward with no request, in place of the wait
            self.prefills = 0
            sizes.shape[k] = IDLE
            sizes.batch[k] = 0
            sizes.bucket[k] = self.bucket_at[0]
            return idle
        if not self.active and not self.queue:
            if self.trace is not None and math.isinf(self.next_time):
                # every request of the trace came and went: the loop would wait forever
                raise ConfigError(
                    f"workload.arrivals.trace: its {len(self.arrival)} requests have all "
                    f"finished by step {k} of {len(self.sizes.batch)} and none is left to "
                    f"arrive; expected a trace that lasts the run (more requests, or fewer "
                    f"steps)")
            idle = self.next_time - t
            t = self.next_time
            self._arrive_until(t)
        room = self.max_batch - self.active
        while room > 0 and self.queue:
            rid = self.queue.popleft()
            self.admit_step[rid] = k
            self.admit_us[rid] = t
            self.active += 1
            room -= 1
            if self.prompt_tokens[rid] or self.separate:
                # the sglang rule: every new request goes through a prefill (extend) step
                self.left[rid] = max(1, self.prompt_tokens[rid])
                self.prefilling.append(rid)
            else:  # decodes from this step, which gives its first token
                self._decode(rid, k, k, self.out_tokens[rid])
        if self.separate:
            decoding = self._pick(k)
        else:
            if self.prefill is not None:
                self._prefill(k)
            if sizes.shape is not None:  # a mixed step only when it prefills some token
                sizes.shape[k] = MIXED if self.prefill is not None \
                    and sizes.prefill_tokens[k] else DECODE
            decoding = self.decoding
        sizes.batch[k] = decoding
        sizes.bucket[k] = self.bucket_at[decoding]
        if idle:
            sizes.idle[k] = idle
        return idle

    def _decode(self, rid: int, first: int, start: int, tokens: int) -> None:
        """Request ``rid`` gives its first token at step ``first`` and decodes its other
        ``tokens`` from step ``start`` on (``tokens`` 0: it is done at ``first``)."""
        self.first[rid] = first
        done = self._finish_step(tokens, start) if tokens > 0 else first
        self.finish[rid] = done
        if start == first:  # decoding now (no prefill)
            self.decoding += 1
        else:
            self.joining[start] = self.joining.get(start, 0) + 1
        if done >= 0:
            leave = done + self.lag
            self.leaving[leave] = self.leaving.get(leave, 0) + 1
            self.decoding_leaving[leave] = self.decoding_leaving.get(leave, 0) + 1

    def _pick(self, k: int) -> int:
        """The sglang rule (SGLang's ``get_next_batch_to_run``): step k is a prefill step of
        its own while prompt tokens wait (a chunked request carried over included), unless
        ``max_consecutive_prefill`` prefill steps ran in a row while requests decode; else a
        decode step. Returns the requests decoding in step k (none in a prefill step: the
        running decodes pause)."""
        if self.prefilling and (self.max_prefills is None or self.prefills < self.max_prefills
                                or not self.decoding):
            self.prefills += 1
            self.sizes.shape[k] = PREFILL
            self._prefill(k)
            return 0
        self.prefills = 0
        self.sizes.shape[k] = DECODE
        for rid, tokens in self.starting:  # prefilled before this step: they decode now
            heapq.heappush(self.due, (self.summed + tokens, rid))
            self.since[rid] = self.decodes
        self.starting.clear()
        # every decoding request advances by the step's accepted tokens: a request is done
        # once they sum (over its decode steps) to its tokens, within 1e-9
        self.summed += self.sizes.accept.item(k)
        self.decodes += 1
        due = self.due
        while due and due[0][0] - self.summed <= 1e-9:
            rid = heapq.heappop(due)[1]  # its last token: the scheduler learns of it later
            self.decoded[rid] = self.decodes - self.since.pop(rid)
            self.finish[rid] = k
            leave = k + self.lag
            self.leaving[leave] = self.leaving.get(leave, 0) + 1
            self.decoding_leaving[leave] = self.decoding_leaving.get(leave, 0) + 1
        return self.decoding

    def _prefill(self, k: int) -> None:
        """Step k's chunk: up to ``chunk_tokens`` prompt tokens, first come first served,
        what the decoding requests leave of them, one token each (the mixed rules)."""
        budget = self.prefill.chunk_tokens
        if self.budgeted:
            budget -= self.decoding
        used = 0
        prefix = 0
        while budget > 0 and self.prefilling:
            rid = self.prefilling[0]
            left = self.left[rid]
            take = min(budget, left)
            if self.chunk_first[rid] < 0:
                self.chunk_first[rid] = k
            # its tokens prefilled in earlier steps, which this chunk's attention reads
            prefix += take * (max(1, self.prompt_tokens[rid]) - left)
            self.left[rid] = left - take
            budget -= take
            used += take
            if self.left[rid] == 0:
                self.prefilling.popleft()
                del self.left[rid]
                if self.separate:  # its first token now, the others from the next decode step
                    self._first(rid, k)
                else:
                    self._decode(rid, k, k + 1, self.out_tokens[rid] - 1)
        s = self.sizes
        s.prefill_tokens[k] = used
        s.prefill_prefix[k] = prefix
        pf = self.prefill
        us = s.prefill_us[k] = pf.forward_us.at(used, prefix)
        host = s.prefill_host_us[k] = pf.host_us.at(used, prefix)
        if s.prefill_host_before_us is not None:
            s.prefill_host_before_us[k] = pf.host_before_us.at(used, prefix)
        # each launch its equal share (prefill.launches; weighted shares: launch_series)
        if s.prefill_launch_us is not None:
            s.prefill_launch_us[k] = us / pf.launches
        if s.prefill_launch_host_us is not None:
            s.prefill_launch_host_us[k] = host / pf.launches

    def _first(self, rid: int, k: int) -> None:
        """The sglang rule: request ``rid``'s prefill ended in step k, which gives its first
        token; it joins the running batch at step k+1 and decodes its other tokens in the
        decode steps from then on (when it finishes depends on the shapes to come)."""
        self.first[rid] = k
        self.joining[k + 1] = self.joining.get(k + 1, 0) + 1
        tokens = self.out_tokens[rid] - 1
        if tokens > 0:
            self.starting.append((rid, tokens))
            return
        self.finish[rid] = k
        leave = k + self.lag
        self.leaving[leave] = self.leaving.get(leave, 0) + 1
        self.decoding_leaving[leave] = self.decoding_leaving.get(leave, 0) + 1

    def _finish_step(self, output: int, k: int) -> int:
        """The step that produces the last token of a request admitted at step k: its output
        less each step's accepted tokens, from step k on, until none is left (``<= 1e-9``);
        -1 if that is not within the run. (Its tokens are known in advance: they do not
        depend on time.)"""
        if self._accept is None:
            self._accept = self.sizes.accept.tolist()
        acc = self._accept
        left = float(output)
        for j in range(k, len(acc)):
            left -= acc[j]
            if left <= 1e-9:
                return j
        return -1

    def finish_run(self) -> None:
        s = self.sizes
        admitted = np.flatnonzero(np.asarray(self.admit_step, dtype=np.int64) >= 0)
        s.requests = {
            "arrival_us": np.asarray(self.arrival, dtype=float)[admitted],
            "output_tokens": np.asarray(self.out_tokens, dtype=np.int64)[admitted],
            "admit_step": np.asarray(self.admit_step, dtype=np.int64)[admitted],
            "admit_us": np.asarray(self.admit_us, dtype=float)[admitted],
            "finish_step": np.asarray(self.finish, dtype=np.int64)[admitted],
            "first_step": np.asarray(self.first, dtype=np.int64)[admitted],
            "prompt_tokens": np.asarray(self.prompt_tokens, dtype=np.int64)[admitted],
        }
        if self.prefill is not None:  # where each request's prefill began (-1: none)
            s.requests["prefill_step"] = np.asarray(self.chunk_first, dtype=np.int64)[admitted]
        if self.separate:  # decode steps are not every step after the first token
            for rid, first in self.since.items():  # still decoding at the run's end
                self.decoded[rid] = self.decodes - first
            s.requests["decode_steps"] = np.asarray(
                [self.decoded.get(rid, 0) for rid in admitted.tolist()], dtype=np.int64)


__all__ = ["CHUNK", "DECODE", "IDLE", "MIXED", "PREFILL", "STREAMS", "ArrivalProcess",
           "StepSizes", "constant", "draw_sizes", "rng"]
