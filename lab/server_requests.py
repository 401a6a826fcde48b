"""The mini-server's requests and scheduler, and its metrics arithmetic: pure Python, no torch.

:mod:`lab.server` drives these from its GPU loop; the tests drive them directly,
without torch, to check the rules the simulator models:

- :class:`Arrivals`: requests on the host clock (seconds since the run began), a Poisson
  process (a constant rate, or a triangular :class:`Ramp` of rates by thinning) or a closed
  loop (``concurrency`` requests; the client sends one whenever a finish is streamed to it,
  :meth:`Scheduler.stream`, at the end of the result's processing), with ``initial``
  requests already there at time 0. Arrival gaps and request lengths come from two
  ``random.Random`` streams of the case's seed, so a seed gives the same requests whatever
  the timing.
- :class:`Scheduler`: admission, slot allocation, chunked prefill and the finish rule.
  Step k's batch is fixed when :meth:`Scheduler.schedule` runs for k: a decode-only
  request arrived by then (:meth:`Scheduler.recv`) is admitted while fewer than
  ``max_batch`` are running, taking a ``req_to_token`` row from a FIFO free list and the
  slots of its already cached context from a FIFO free list of KV slots, both as in
  SGLang's pools; a request with a prompt is admitted with its first chunk (below). Every
  decoding request gets one new KV slot per step (its query token; the accepted draft
  tokens get none). Each decode step produces ``accept_tokens`` tokens per request (a
  constant for the whole batch, default 2.0; the request's produced count is the floor of
  the running sum): a request finishes in the step whose tokens reach its
  ``output_tokens``. The scheduler learns of a finish in :meth:`Scheduler.process`, which
  the overlap loop calls for step k after scheduling step k+1, so a request finished by
  step k is still in batch k+1 and leaves before batch k+2 (without overlap, process(k)
  comes first and it leaves before batch k+1); its row and slots go back to the free lists
  then, and later admissions reuse them.
- Prefill (``prompt_tokens`` > 0): each step's prefill batch is built as SGLang's
  ``get_new_batch_prefill`` builds it (:meth:`Scheduler._add_prefill`, its
  ``PrefillAdder``): up to ``chunk_tokens`` prompt tokens, the carried-over request first,
  then waiting requests first come first served, each admitted with its first chunk (a row
  then, and only the chunk's slots: ``prepare_for_extend``; in the mixed mode the decoding
  requests take one token each of the budget first, SGLang's ``mixed_with_decode_tokens``);
  a request may be split across steps, and several may share a step, at most
  ``max_prefill_requests``. The step that takes
  a request's last prompt tokens gives its first token (it counts as one of
  ``output_tokens``), and the request decodes from the next step on; the scheduler knows
  this when it schedules, not from a result. Two policies pick a step's shape
  (:data:`POLICIES`): ``mixed`` (SGLang's ``--enable-mixed-chunk``) mixes the prefill batch
  into the decode step (``mix_with_running``), a prefill step of its own when nothing
  decodes; ``sglang`` (SGLang's default) makes a step that has prompt tokens to take a
  prefill step of its own, where every decoding request pauses
  (:meth:`Scheduler._prefill_step`), and a decode step otherwise. Before 2026-12-02 the
  mixed mode admitted every waiting request at once and wrote its whole prompt's slots then
  (the shapes runs up to ``run7``), and up to ``run8`` its budget was the whole
  ``chunk_tokens``, the decodes' tokens not taken out. :attr:`StepPlan.shape` names the result.
- The name of the range around the receive's work (:func:`receive_range`).
- The scheduler's Python padding to per-range time targets (:class:`HostWork`,
  :func:`python_work_until`), its polling for an arrival (:func:`wait_until`), and the loop
  thread's core (:func:`pin_loop`).
- The race check (:func:`overtaken`), the arithmetic that sizes a load (:func:`rate_for`),
  and the metrics: the per-step log (:class:`StepLog`), the per-request arrays and the
  summary (:func:`request_arrays`, :func:`summarize`; definitions in
  :mod:`lab.server`'s docstring).

Imports: the standard library only.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field

#: a few strings the "detokenizer" maps token ids to (string work per produced token)
PIECES = tuple(f"{w} " for w in ("the", "of", "and", "to", "in", "a", "is", "that", "for",
                                 "it", "as", "was", "with", "be", "by", "on", "not", "he"))


@dataclass(frozen=True)
class Dist:
    """Integers drawn uniformly from ``lo``..``hi`` (inclusive); a constant when equal."""

    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str) -> Dist:
        """``"64..512"`` (uniform) or ``"256"`` (constant)."""
        lo, _, hi = str(text).partition("..")
        try:
            d = cls(int(lo), int(hi or lo))
        except ValueError:
            d = cls(-1, -1)
        if d.lo < 0 or d.hi < d.lo:
            raise ValueError(f"{text!r}: want LO..HI with 0 <= LO <= HI, or N")
        return d

    def draw(self, rng: random.Random) -> int:
        return self.lo if self.lo == self.hi else rng.randint(self.lo, self.hi)

    def mean(self) -> float:
        return (self.lo + self.hi) / 2

    def __str__(self) -> str:
        return str(self.lo) if self.lo == self.hi else f"{self.lo}..{self.hi}"


@dataclass(frozen=True)
class Ramp:
    """A triangular arrival rate: ``base`` at 0, rising linearly to ``peak`` at ``rise`` of
    ``duration_s``, falling back to ``base`` at ``duration_s`` and staying there."""

    base: float
    peak: float
    duration_s: float
    rise: float = 0.6

    def rate(self, t: float) -> float:
        x = t / self.duration_s if self.duration_s > 0 else 1.0
        if x >= 1.0:
            tri = 0.0
        elif x <= self.rise:
            tri = x / self.rise
        else:
            tri = (1.0 - x) / (1.0 - self.rise)
        return self.base + (self.peak - self.base) * tri


@dataclass(eq=False)
class Request:
    """One request's lengths and what happened to it (steps, host times in seconds)."""

    rid: int
    arrival: float
    output_tokens: int
    prompt_tokens: int = 0  # to prefill (0: a decode-only request)
    context_tokens: int = 0  # already cached at admission (decode-only requests)
    row: int = -1
    slots: list[int] = field(default_factory=list)
    prefilled: int = 0
    decode_from: int = -1  # first decode step (-1: not yet known)
    remaining: float = 0.0
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    admit_step: int = -1
    admit_time: float = math.nan
    prefill_done_step: int = -1
    first_token_step: int = -1
    first_token_time: float = math.nan  # when the host processed it
    finish_step: int = -1
    finish_time: float = math.nan  # when the host learned of it

    def produced(self) -> int:
        return int(math.floor(self.output_tokens - self.remaining + 1e-9))


class Arrivals:
    """The case's requests, in arrival order (see the module docstring)."""

    def __init__(self, *, seed: int, output: Dist, prompt: Dist | None = None,
                 context: Dist = Dist(32, 256), rate: float | None = None,
                 ramp: Ramp | None = None, concurrency: int | None = None, initial: int = 0):
        if sum(x is not None for x in (rate, ramp, concurrency)) != 1:
            raise ValueError("arrivals: give exactly one of rate, ramp, concurrency")
        self.output, self.prompt, self.context = output, prompt, context
        self.rate, self.ramp, self.concurrency = rate, ramp, concurrency
        self._gaps = random.Random(f"{seed}:arrivals")
        self._lengths = random.Random(f"{seed}:lengths")
        self.made: list[Request] = []
        self._due: deque[Request] = deque()
        for _ in range(concurrency if concurrency is not None else initial):
            self._due.append(self._new(0.0))
        self._next = self._draw_after(0.0)

    def _new(self, t: float) -> Request:
        prompt = self.prompt.draw(self._lengths) if self.prompt is not None else 0
        context = 0 if prompt else self.context.draw(self._lengths)
        out = max(1, self.output.draw(self._lengths))
        r = Request(len(self.made), t, out, prompt, context, remaining=float(out))
        self.made.append(r)
        return r

    def _draw_after(self, t: float) -> float:
        if self.concurrency is not None:
            return math.inf
        if self.ramp is None:
            return t + self._gaps.expovariate(self.rate) if self.rate > 0 else math.inf
        top = max(self.ramp.base, self.ramp.peak)
        while True:  # thinning: candidates at the top rate, kept with rate(t) / top
            if top <= 0 or (t >= self.ramp.duration_s and self.ramp.base <= 0):
                return math.inf
            t += self._gaps.expovariate(top)
            if self._gaps.random() * top <= self.ramp.rate(t):
                return t

    def next_time(self) -> float:
        """The next arrival not yet due (inf: none will come by itself)."""
        return self._due[0].arrival if self._due else self._next

    def due(self, now: float) -> list[Request]:
        """Every request arrived by ``now``, oldest first (each is handed out once)."""
        while self._next <= now:
            self._due.append(self._new(self._next))
            self._next = self._draw_after(self._next)
        out = list(self._due)
        self._due.clear()
        return out

    def finished(self, now: float) -> None:
        """A finish was streamed to its client at ``now``: a closed loop sends another."""
        if self.concurrency is not None:
            self._due.append(self._new(now))


@dataclass
class StepPlan:
    """What schedule(k) decided: the decode batch, the table writes, the prefill chunk."""

    step: int
    stamp: int
    decode: list[Request]
    bucket: int
    admitted: list[Request]
    #: ``req_to_token[w_rows[i], w_cols[i]] = w_vals[i]``: admissions' slots, the new slot
    #: of every decoding request, the marker stamps of the decode batch's rows
    w_rows: list[int]
    w_cols: list[int]
    w_vals: list[int]
    #: (request, first prompt position, tokens) per request in this step's chunk
    prefill: list[tuple[Request, int, int]]
    #: requests that could decode but do not this step (a prefill step of its own pauses them)
    paused: int = 0

    def prefill_tokens(self) -> int:
        return sum(n for _, _, n in self.prefill)

    @property
    def shape(self) -> str:
        """``decode`` (a decode batch, no chunk), ``prefill`` (a chunk, no decode batch),
        ``mixed`` (both) or ``idle`` (neither)."""
        return SHAPES[bool(self.decode)][bool(self.prefill)]


#: a step's shape by (decodes, prefills)
SHAPES = {False: {False: "idle", True: "prefill"}, True: {False: "decode", True: "mixed"}}
#: ``mixed``: today's loop (the chunk mixed into the decode forward); ``sglang``: SGLang's
#: default (a prefill step of its own while prompt tokens wait)
POLICIES = ("mixed", "sglang")


def receive_range(requests: int, tokens: int) -> str:
    """The range around the "tokenizing" of the requests an iteration receives
    (``lab.server``'s ``Server._recv``, in ``scheduler.recv_requests``, or in
    ``scheduler.wait_requests`` for those that arrive while the host waits): ``recv reqs=<N>
    toks=<T>``, N requests of T tokens in all (each a prompt's, or a decode-only request's
    context: the tokens it arrives with). Its duration is that work alone: simwar fits
    ``cpu.receive_us`` from it (``lab.check.SERVER_MAPPING``). Written only where N > 0: an
    empty one holds no work to fit and would add the profiler's cost of a range to every
    step. Captures before 2026-12-02 (the shapes runs up to ``run9``) have none."""
    return f"recv reqs={requests} toks={tokens}"


def bucket_of(batch: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket >= ``batch`` (0 for an empty batch)."""
    if batch <= 0:
        return 0
    for b in sorted(buckets):
        if b >= batch:
            return b
    raise ValueError(f"batch {batch} exceeds the largest bucket {max(buckets)}")


class Scheduler:
    """Admission, slots, chunked prefill and the finish rule (see the module docstring).

    ``rows`` request rows (numbered from 0; the table's padding row is ``rows``) and
    ``kv_slots`` KV slots (slot 0 is the padding slot, never handed out); a request may hold
    at most ``max_context`` slots. The table column ``max_context`` is the race-check marker.
    """

    def __init__(self, arrivals: Arrivals, *, max_batch: int, accept_tokens: float,
                 buckets: tuple[int, ...], rows: int, kv_slots: int, max_context: int,
                 chunk_tokens: int = 0, max_prefill_requests: int = 8,
                 policy: str = "mixed"):
        if not accept_tokens > 0:
            raise ValueError("accept_tokens must be > 0")
        if policy not in POLICIES:
            raise ValueError(f"policy {policy!r} not in {POLICIES}")
        self.policy = policy
        self.arrivals = arrivals
        self.max_batch, self.accept = max_batch, float(accept_tokens)
        self.buckets, self.max_context = tuple(buckets), max_context
        self.marker = max_context
        self.pad_row = rows
        self.chunk_tokens, self.max_prefill_requests = chunk_tokens, max_prefill_requests
        self.free_rows: deque[int] = deque(range(rows))
        self.free_slots: deque[int] = deque(range(1, kv_slots))
        self.waiting: deque[Request] = deque()
        self.prefilling: deque[Request] = deque()
        self.running: list[Request] = []  # admitted and not known to have finished
        self.finished: list[Request] = []

    # ------------------------------------------------------------------ host-side stages
    def recv(self, now: float) -> list[Request]:
        """Queue every request arrived by ``now``; returns them."""
        new = self.arrivals.due(now)
        self.waiting.extend(new)
        return new

    def idle(self) -> bool:
        """Nothing running or waiting: the host waits for the next arrival."""
        return not self.running and not self.waiting

    def schedule(self, k: int, now: float, stamp: int) -> StepPlan:
        """Fix step k's batch at host time ``now``; ``stamp`` is written at the marker."""
        if self.policy == "sglang":
            plan = self._prefill_step(k, now, stamp)
            if plan is not None:
                return plan
        rows, cols, vals = [], [], []
        admitted = []
        while self.waiting and len(self.running) < self.max_batch and self.free_rows:
            r = self.waiting[0]
            if r.prompt_tokens:
                break  # a prompt is admitted with its first chunk (_add_prefill)
            need = r.prompt_tokens or r.context_tokens
            if need > len(self.free_slots):
                break
            self.waiting.popleft()
            r.row = self.free_rows.popleft()
            r.slots = [self.free_slots.popleft() for _ in range(need)]
            rows.extend([r.row] * need)
            cols.extend(range(need))
            vals.extend(r.slots)
            r.admit_step, r.admit_time = k, now
            r.decode_from = k
            self.running.append(r)
            admitted.append(r)
        decode = [r for r in self.running if 0 <= r.decode_from <= k]
        for r in decode:
            if len(r.slots) >= self.max_context:
                raise RuntimeError(f"request {r.rid}: context over {self.max_context} slots")
            slot = self.free_slots.popleft()
            r.slots.append(slot)
            rows.append(r.row)
            cols.append(len(r.slots) - 1)
            vals.append(slot)
        for r in decode:
            rows.append(r.row)
            cols.append(self.marker)
            vals.append(stamp)
        chunk = []
        if self.policy == "mixed":  # the prefill batch, mixed into the running one
            chunk, new = self._add_prefill(k, now, rows, cols, vals, decoding=len(decode))
            admitted += new
        return StepPlan(k, stamp, decode, bucket_of(len(decode), self.buckets), admitted,
                        rows, cols, vals, chunk)

    def _prefill_step(self, k: int, now: float, stamp: int) -> StepPlan | None:
        """SGLang's default (``get_next_batch_to_run``): while prompt tokens wait, a prefill
        step of its own (:meth:`_add_prefill`), every decoding request paused; None
        otherwise."""
        rows, cols, vals = [], [], []
        chunk, admitted = self._add_prefill(k, now, rows, cols, vals)
        if not chunk:
            return None
        paused = sum(1 for r in self.running if 0 <= r.decode_from <= k)
        return StepPlan(k, stamp, [], 0, admitted, rows, cols, vals, chunk, paused)

    def _add_prefill(self, k: int, now: float, rows: list, cols: list, vals: list,
                     decoding: int = 0) -> tuple[list[tuple[Request, int, int]], list[Request]]:
        """Step k's prefill batch, as SGLang's ``get_new_batch_prefill`` builds it in both
        modes (``PrefillAdder``): a budget of ``chunk_tokens`` new tokens, the carried-over
        request (``chunked_req``) first, then waiting requests first come first served while
        there is budget, room (``max_batch``, a row) and fewer than ``max_prefill_requests``
        in the chunk; a prompt longer than what is left is cut there and carried over to the
        next step, first in it. A request is admitted with its first chunk, and only the
        chunk's slots are allocated and written (``prepare_for_extend``: appended to
        ``rows``/``cols``/``vals``). The mixed mode then mixes the batch into the running one
        (``mix_with_running``); with nothing decoding the step is a prefill step of its own.
        ``decoding``: the mixed mode's running requests, one token each of the budget
        (SGLang passes ``running_bs`` as the adder's ``mixed_with_decode_tokens`` under
        ``--enable-mixed-chunk``, 0 otherwise); with none left, no chunk this step.
        Returns the chunk ``[(request, first position, tokens)]`` and the admitted."""
        budget, chunk, admitted = self.chunk_tokens - decoding, [], []
        while budget > 0 and len(chunk) < self.max_prefill_requests:
            if self.prefilling:  # the carried-over request (at most one)
                r = self.prefilling.popleft()
            elif (self.waiting and self.waiting[0].prompt_tokens
                  and len(self.running) < self.max_batch and self.free_rows):
                r = self.waiting.popleft()
                r.row = self.free_rows.popleft()
                r.admit_step, r.admit_time = k, now
                self.running.append(r)
                admitted.append(r)
            else:
                break
            n = min(r.prompt_tokens - r.prefilled, budget)
            if n > len(self.free_slots):
                raise RuntimeError(f"request {r.rid}: out of KV slots")
            new = [self.free_slots.popleft() for _ in range(n)]
            rows.extend([r.row] * n)
            cols.extend(range(r.prefilled, r.prefilled + n))
            vals.extend(new)
            r.slots.extend(new)
            chunk.append((r, r.prefilled, n))
            r.prefilled += n
            budget -= n
            if r.prefilled == r.prompt_tokens:
                r.prefill_done_step = k
                r.decode_from = k + 1
            else:
                self.prefilling.appendleft(r)  # chunked_req: first in the next step
        return chunk, admitted

    def process(self, plan: StepPlan, now: float, tokens: list[int] | None = None) -> list[
            Request]:
        """Step ``plan.step``'s result, processed at host time ``now``: tokens appended, first
        tokens, finishes (rows and slots freed); returns the requests that finished, for
        :meth:`stream` once the rest of the result's processing is done."""
        k = plan.step
        done = []
        for i, r in enumerate(plan.decode):
            if r.finish_step >= 0:  # finished earlier: this step's tokens are dropped
                continue
            before = r.produced()
            r.remaining -= self.accept
            tok = tokens[i] if tokens is not None else k
            self._append(r, tok, r.produced() - before)
            if r.first_token_step < 0:
                r.first_token_step, r.first_token_time = k, now
            if r.remaining <= 1e-9:
                done.append(r)
        for r, start, n in plan.prefill:
            if start + n == r.prompt_tokens:
                r.first_token_step, r.first_token_time = k, now
                r.remaining -= 1.0
                self._append(r, k, 1)
                if r.remaining <= 1e-9:
                    done.append(r)
        for r in done:
            r.finish_step, r.finish_time = k, now
            self.running.remove(r)
            self.free_rows.append(r.row)
            self.free_slots.extend(r.slots)
            self.finished.append(r)
        return done

    def stream(self, done: list[Request], now: float) -> None:
        """The finishes of one result streamed to their clients at host time ``now``: SGLang
        streams at the end of ``process_batch_result`` (``stream_output``), after the rest of
        the result's processing, so a closed loop's client sends its next request then, not
        when :meth:`process` learned of the finish."""
        for _ in done:
            self.arrivals.finished(now)

    @staticmethod
    def _append(r: Request, tok: int, n: int) -> None:
        """Append ``n`` tokens and detokenize them incrementally (string work per token)."""
        n = max(0, min(n, r.output_tokens - len(r.tokens)))
        new = [(tok + j) & 0xFFFF for j in range(n)]
        r.tokens.extend(new)
        r.text = r.text[-64:] + "".join(PIECES[t % len(PIECES)] for t in new)


# --------------------------------------------------------------------------- host work
def python_work(reps: int, salt: int = 0) -> int:
    """``reps`` rounds of scheduler-like Python: a record dict built, hashed and folded."""
    acc = salt
    for i in range(reps):
        rec = {"rid": i + salt, "pos": (i * 7) & 1023, "prio": (i * 40503) & 0xFFFF}
        acc = (acc * 31 + hash((rec["rid"], rec["pos"])) + rec["prio"]) & 0xFFFFFFFF
    return acc


def python_work_until(deadline: float, salt: int = 0) -> int:
    """:func:`python_work` in small rounds until ``time.perf_counter()`` passes ``deadline``."""
    acc = salt
    while time.perf_counter() < deadline:
        acc = python_work(8, acc)
    return acc


def wait_until(t: float) -> None:
    """Poll until host time ``t`` (perf_counter seconds), as SGLang's scheduler polls its
    socket; sleep only through long waits (a sleeping core may come back slower)."""
    while True:
        left = t - time.perf_counter()
        if left <= 0:
            return
        if left > 0.02:
            time.sleep(left - 0.01)


@dataclass(frozen=True)
class HostWork:
    """How long two host ranges last at least, µs: ``base + per_req × B``.

    ``schedule``: from the iteration's start (after any wait for an arrival) to the batch
    built in get_next_batch_to_run (before prepare_for_decode); ``process``: from
    ``copy_done.synchronize()`` returning to the end of process_batch_result. The scheduler's
    real Python runs first; :func:`python_work_until` pads the range to its target, so the
    ranges hold their length whatever the CPU's speed (the H200 machine's vCPU ran at two
    speeds, 2× apart, for seconds at a time).
    """

    schedule_base_us: float = 0.0
    schedule_per_req_us: float = 0.0
    process_base_us: float = 0.0
    process_per_req_us: float = 0.0

    @classmethod
    def fit(cls, other: dict[int, float], fwd: dict[int, float], light_factor: float = 1.3,
            saturated_factor: float = 0.7) -> tuple[HostWork, str]:
        """Targets that make the host's busy µs per iteration ``light_factor`` × the bucket-8
        forward at 5 requests (host-bound) and ``saturated_factor`` × the bucket-64 forward at
        64 (device-bound), given ``other[B]``, the µs of the rest of an iteration (prepare,
        launch, barrier) measured at B requests: affine between the two, the slope not
        negative, split 55 / 45 between schedule and process. Returns it and a warning ("" if
        both targets were met)."""
        t5 = light_factor * fwd[8] - other[5]
        t64 = saturated_factor * fwd[64] - other[64]
        warn = []
        per = max(0.0, (t64 - t5) / 59)
        base = t5 - 5 * per if per > 0 else min(t5, t64)
        if t64 < 0:
            warn.append(f"the rest of an iteration at 64 requests ({other[64]:.0f} µs) exceeds "
                        f"{saturated_factor} × the bucket-64 forward: saturated loads are "
                        f"host-bound here")
        elif per == 0 and t5 > t64:
            warn.append(f"the light target is capped by the saturated one: the host works "
                        f"{other[5] + base:.0f} µs at 5 requests")
        base = max(0.0, base)
        return cls(0.55 * base, 0.55 * per, 0.45 * base, 0.45 * per), "; ".join(warn)

    def schedule_us(self, batch: int) -> float:
        return self.schedule_base_us + self.schedule_per_req_us * batch

    def process_us(self, batch: int) -> float:
        return self.process_base_us + self.process_per_req_us * batch

    def scaled(self, factor: float) -> HostWork:
        """Every target × ``factor``."""
        return HostWork(*(factor * v for v in (self.schedule_base_us, self.schedule_per_req_us,
                                               self.process_base_us, self.process_per_req_us)))


# --------------------------------------------------------------------------- race check
def cpu_arg(text: str) -> str:
    """``--cpu``: auto, none or a core number."""
    if text in ("auto", "none") or text.isdigit():
        return text
    raise argparse.ArgumentTypeError(f"expected auto, none or a core number, got {text!r}")


#: ``--cpu auto`` pins only where the process may use this many cores: the loop's core is
#: then its own, and CUDA's and the profiler's threads have the others
PIN_MIN_CORES = 4


def pin_loop(cpu: str) -> int | None:
    """Pin the calling thread (the loop's; after CUDA's init, so the driver's threads keep
    every core) to one core, meant to steady its speed (the H200 machine's host ran the same
    Python at x0.56-1.60 of the profiled run's from case to case). Threads it starts later
    inherit the core (torch's CPU pool: :mod:`lab.server` then runs torch's CPU ops on one
    thread; the profiler's). Tried once on the H200, with the pool inheriting it: the spread
    was no narrower (x0.55-1.75) and the pool stalled the loop, so it is not the default
    (tests/data/server/shapes/README.md). Returns the core, or None where not pinned
    (``none``, no ``sched_setaffinity``, or ``auto`` with too few cores)."""
    if cpu == "none" or not hasattr(os, "sched_setaffinity"):
        return None
    if cpu == "auto":
        cores = sorted(os.sched_getaffinity(0))
        if len(cores) < PIN_MIN_CORES:
            return None
        core = cores[-1]
    else:
        core = int(cpu)
    os.sched_setaffinity(threading.get_native_id(), {core})
    return core


def overtaken(snapshot: list[int], stamp: int) -> bool:
    """Whether a gather read a later step's stamp at the marker: a next-step write overtook
    the read (``snapshot``: what it read for the batch's real rows)."""
    return any(v > stamp for v in snapshot)


# --------------------------------------------------------------------------- load sizing
def mean_decode_steps(output: Dist, accept: float, first_token_from_prefill: bool) -> float:
    """Mean decode steps a request needs (uniform ``output``; the first token of a prefilled
    request comes from its prefill step)."""
    total = 0
    for out in range(output.lo, output.hi + 1):
        total += math.ceil(max(0, out - (1 if first_token_from_prefill else 0)) / accept - 1e-9)
    return total / (output.hi - output.lo + 1)


def rate_for(in_system: float, step_us: float, steps_per_request: float) -> float:
    """Little's law: the arrival rate (req/s) that keeps ``in_system`` requests running when a
    step lasts ``step_us`` and a request stays ``steps_per_request`` steps."""
    return in_system / (steps_per_request * step_us * 1e-6)


# --------------------------------------------------------------------------- summaries
def percentile(xs: list[float], p: float) -> float:
    """The nearest-rank ``p``-th percentile (nan for no values)."""
    xs = sorted(x for x in xs if x == x)
    if not xs:
        return math.nan
    return xs[min(len(xs) - 1, max(0, round(p / 100 * (len(xs) - 1))))]


def stats(xs: list[float], prefix: str) -> dict:
    """``{prefix}_mean``, ``_p50`` and ``_p99`` of the finite values (nan for none)."""
    vals = [x for x in xs if x == x and not math.isinf(x)]
    return {f"{prefix}_mean": sum(vals) / len(vals) if vals else math.nan,
            f"{prefix}_p50": percentile(vals, 50), f"{prefix}_p99": percentile(vals, 99)}


@dataclass
class StepLog:
    """Per-step arrays of one run (names as in the metrics)."""

    n: int
    cols: dict = field(default_factory=dict)

    def __post_init__(self):
        for c in ("batch", "bucket", "prefill_tokens", "prefill_requests", "admitted",
                  "paused", "processed_in", "launch_ahead", "racy_draft", "racy_verify"):
            self.cols[c] = [0] * self.n
        self.cols["shape"] = [""] * self.n
        for c in ("wait_us", "t_begin_us", "t_batch_us", "t_scheduled_us", "t_launched_us",
                  "t_barrier_us",
                  "proc_begin_us", "proc_synced_us", "proc_end_us", "fwd_start_us",
                  "fwd_end_us"):
            self.cols[c] = [math.nan] * self.n


def summarize(log: StepLog, sched: Scheduler, timing: bool, warmup: int) -> dict:
    """A run's summary over its measured steps (:mod:`lab.server`: Metrics)."""
    c, n = log.cols, log.n
    keep = list(range(min(warmup, max(0, n - 1)), n - 1))
    out: dict = {"steps": n, "warmup": warmup, "steps_measured": len(keep)}
    fs, fe, tb = c["fwd_start_us"], c["fwd_end_us"], c["t_begin_us"]
    step = {k: fs[k + 1] - fs[k] for k in keep} if timing else {}
    fwd = {k: fe[k] - fs[k] for k in keep} if timing else {}
    it = {k: tb[k + 1] - tb[k] for k in keep}
    out.update(stats(list(step.values()), "step_us"))
    out.update(stats(list(fwd.values()), "fwd_us"))
    out.update(stats([fs[k + 1] - fe[k] for k in keep] if timing else [], "gap_us"))
    out.update(stats(list(it.values()), "iter_us"))
    out["batch_mean"] = statistics.fmean(c["batch"][k] for k in keep) if keep else math.nan
    per_bucket: dict = {}
    for k in keep:
        per_bucket.setdefault(str(c["bucket"][k]), []).append(k)
    out["per_bucket"] = {b: {"steps": len(ks),
                             "step_us_mean": _mean([step[k] for k in ks]) if timing else None,
                             "fwd_us_mean": _mean([fwd[k] for k in ks]) if timing else None,
                             "iter_us_mean": _mean([it[k] for k in ks])}
                         for b, ks in sorted(per_bucket.items(), key=lambda x: int(x[0]))}
    per_shape: dict = {}
    for k in keep:
        per_shape.setdefault(c["shape"][k], []).append(k)
    out["per_shape"] = {sh: {"steps": len(ks),
                             "step_us_mean": _mean([step[k] for k in ks]) if timing else None,
                             "fwd_us_mean": _mean([fwd[k] for k in ks]) if timing else None,
                             "prefill_tokens_mean": _mean([c["prefill_tokens"][k] for k in ks]),
                             "paused_mean": _mean([c["paused"][k] for k in ks])}
                        for sh, ks in sorted(per_shape.items())}
    out["paused_steps"] = sum(1 for k in keep if c["paused"][k] > 0)
    out["launch_ahead_mean"] = _mean([c["launch_ahead"][k] for k in keep]) if timing else None
    out["host_us"] = {
        "schedule": _mean([c["t_batch_us"][k] - tb[k] - _z(c["wait_us"][k]) for k in keep]),
        "prepare": _mean([c["t_scheduled_us"][k] - c["t_batch_us"][k] for k in keep]),
        "launch": _mean([c["t_launched_us"][k] - c["t_scheduled_us"][k] for k in keep]),
        "barrier": _mean([c["t_barrier_us"][k] - c["t_launched_us"][k] for k in keep]),
        "process": _mean([c["proc_end_us"][k] - c["proc_synced_us"][k] for k in keep]),
        "sync_wait": _mean([c["proc_synced_us"][k] - c["proc_begin_us"][k] for k in keep]),
        "wait_requests": _mean([_z(c["wait_us"][k]) for k in keep])}
    h = out["host_us"]
    h["busy"] = out["iter_us_mean"] - h["sync_wait"] - h["wait_requests"]
    h["other"] = h["prepare"] + h["launch"] + h["barrier"]
    reqs = request_arrays(sched, log, timing)
    arr = reqs["arrival_us"]
    done = [i for i, s in enumerate(reqs["finish_step"]) if s >= 0]
    first = [i for i, s in enumerate(reqs["first_token_step"]) if s >= 0]
    multi = [i for i in done if reqs["output_tokens"][i] > 1]
    out["requests_arrived"] = len(arr)
    out["requests_completed"] = len(done)
    out.update(stats([reqs["finish_host_us"][i] - arr[i] for i in done], "latency_us"))
    out.update(stats([reqs["finish_dev_us"][i] - arr[i] for i in done] if timing else [],
                     "latency_dev_us"))
    out.update(stats([reqs["first_token_dev_us"][i] - arr[i] for i in first] if timing else [],
                     "ttft_dev_us"))
    out.update(stats([reqs["first_token_host_us"][i] - arr[i] for i in first], "ttft_host_us"))
    for src, name in (("dev", "tpot_dev_us"), ("host", "tpot_host_us")):
        vals = [(reqs[f"finish_{src}_us"][i] - reqs[f"first_token_{src}_us"][i])
                / (reqs["output_tokens"][i] - 1) for i in multi] if timing or src == "host" else []
        out.update(stats(vals, name))
    racy = [k for k in range(n) if c["racy_draft"][k] or c["racy_verify"][k]]
    out["racy_steps_all"] = len(racy)
    out["racy_steps"] = sum(1 for k in racy if k >= warmup)
    out["racy_draft_steps"] = sum(c["racy_draft"])
    out["racy_verify_steps"] = sum(c["racy_verify"])
    return out


def request_arrays(sched: Scheduler, log: StepLog, timing: bool) -> dict:
    """Per request, in arrival order (:mod:`lab.server`: Metrics)."""
    fe = log.cols["fwd_end_us"]

    def dev(step):
        return fe[step] if timing and step >= 0 else math.nan

    rs = sched.arrivals.made
    return {"rid": [r.rid for r in rs], "arrival_us": [r.arrival * 1e6 for r in rs],
            "prompt_tokens": [r.prompt_tokens for r in rs],
            "context_tokens": [r.context_tokens for r in rs],
            "output_tokens": [r.output_tokens for r in rs],
            "admit_step": [r.admit_step for r in rs],
            "admit_us": [r.admit_time * 1e6 for r in rs],
            "prefill_done_step": [r.prefill_done_step for r in rs],
            "first_token_step": [r.first_token_step for r in rs],
            "first_token_dev_us": [dev(r.first_token_step) for r in rs],
            "first_token_host_us": [r.first_token_time * 1e6 for r in rs],
            "finish_step": [r.finish_step for r in rs],
            "finish_dev_us": [dev(r.finish_step) for r in rs],
            "finish_host_us": [r.finish_time * 1e6 for r in rs]}


def _mean(xs) -> float:
    xs = [x for x in xs if x == x]
    return statistics.fmean(xs) if xs else math.nan


def _z(x: float) -> float:
    return 0.0 if x != x else x


def clean(obj):
    """``obj`` with every non-finite float replaced by None (strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


__all__ = ["PIECES", "PIN_MIN_CORES", "Arrivals", "Dist", "HostWork", "Ramp", "Request",
           "Scheduler", "StepLog", "POLICIES", "SHAPES", "StepPlan", "python_work",
           "python_work_until", "bucket_of", "clean", "cpu_arg", "pin_loop", "mean_decode_steps",
           "overtaken", "percentile", "rate_for", "request_arrays", "stats", "summarize"]
