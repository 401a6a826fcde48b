"""A mini-server of SGLang's overlap loop on real kernels: requests, paged KV, graphs, barriers.

``python -m lab.server OUT_DIR --suite NAME[,NAME...] [--dry-run] [options]``
runs, on one CUDA GPU, cases of a scheduler loop shaped like SGLang's
``Scheduler.event_loop_overlap`` (docs/design.md, "SGLang's overlap loop as simwar models
it") serving arriving requests with a paged-KV decoder (:mod:`lab.server_model`),
and writes what the simulator is fitted to and checked against. ``--dry-run`` runs the same
loop on the CPU with tiny shapes, no streams and graphs as plain calls (tests).
Without ``--suite`` it runs one case made of the flags (``--load``, ``--rate``,
``--concurrency``, ``--barrier``, ...); with it, the flags given override every case.

**The loop**, iteration k (host ranges are SGLang's names, ``torch.profiler.record_function``;
each iteration is one ``prof.step()``, so ``ProfilerStep#k``; the drain is in the last):

1. ``scheduler.recv_requests``: requests arrived by now (host clock) are queued, each
   "tokenized" (Python over its prompt) in a range ``recv reqs=<N> toks=<T>`` (N > 0 only:
   :func:`~lab.server_requests.receive_range`). If nothing is running or waiting,
   ``scheduler.wait_requests``: the host polls until the next arrival and receives it there.
2. ``scheduler.get_next_batch_to_run``: batch k is fixed (:class:`~lab.server_requests.Scheduler`:
   admission up to ``max_batch`` = 64, a prompt's with its first chunk as SGLang's ``PrefillAdder``
   in both modes, rows and KV slots from FIFO free lists, one new slot per decoding request, the
   chunk's slots), a batch entry built per request; then ``scheduler.prepare_for_decode``: the
   step's writes packed into a pinned buffer, copied H2D into the step's staging buffer and
   scattered into ``req_to_token`` (``index_put_``: admissions' slots, the new slots, the marker
   stamps) on the **schedule stream**.
3. ``scheduler.run_batch``: ``forward.wait_stream(schedule)``; on the **forward stream**, inside a
   range naming the step's shape (:func:`step_range`: ``decode bs=<B>``, B the real decode batch;
   ``prefill bs=<N> toks=<T>``, a chunk of T tokens of N requests and no decode; ``mixed bs=<B>
   toks=<T> reqs=<N>``, both): ``load_batch``, ``prefill`` (eager, with a chunk), ``draft`` and
   ``verify`` graphs of bucket ``bucket(B)`` (the smallest of 8, 16, 32, 64 >= B; none when B = 0),
   ``sample`` (eager); then ``copy.wait_stream(forward)``, the result's D2H on the **copy stream**,
   ``copy_done`` recorded.
4. The barrier (``--barrier``): ``fine``: ``schedule.wait_event(read_done)``, the verify graph's
   in-graph node after its gather; ``coarse``: ``schedule.wait_stream(forward)``; ``none``:
   nothing; ``planted`` (a bug of the vLLM kind): a host record of an event on the forward stream
   after the draft graph and before verify, whose gather still reads ``req_to_token``, and the wait
   on it. With B = 0 nothing is published: ``fine`` and ``planted`` fall back to ``coarse``, as
   SGLang's scheduler does.
5. ``scheduler.process_batch_result`` for step k-1 (``--no-overlap``: for step k, SGLang's normal
   loop, before k+1 is scheduled): ``copy_done.synchronize()``, the race check, per request tokens
   appended, finishes, "detokenize" string work; at its end the finishes are streamed (a closed
   loop's client sends its next request then, as SGLang's ``stream_output`` at the end of
   ``process_batch_result``). ``--hidden-sync`` adds a D2H copy of the step's logprobs into a
   strided pinned slice, issued on the forward stream; torch performs it synchronously, so the host
   waits for the forward just launched.

**The step's shape** (``--schedule``, :data:`lab.server_requests.POLICIES`): ``mixed`` (the
default; SGLang's ``--enable-mixed-chunk``) mixes the prefill batch, built as SGLang's (admission
with a first chunk; the decodes take a token each of its budget: SGLang's
``mixed_with_decode_tokens``), into every decode step (a prefill step of its own when nothing
decodes); ``sglang`` (SGLang's default, ``get_next_batch_to_run``) runs a **prefill step of its
own** while prompt tokens wait (a carried-over prompt, or a waiting request with room to admit it):
only the chunk's forward (eager, launch by launch), every decoding request paused (no draft or
verify graph that step); a prompt longer than the ``chunk_tokens`` budget is carried over and
prefilled over several steps, first in each, and decodes from the step after its last chunk;
otherwise a decode step. A later chunk's attention reads its prompt's prefix already in the KV
cache. Overlap on and off work with both (a prefill step's first token is processed one step later
under overlap, as any result); the barrier fences the next step's writes against this step's reads
whatever the two shapes (a prefill step publishes no graph read-done: ``fine`` falls back to
``coarse`` there).

A final drain processes the last result. The finish rule: a request finished by step k is in batch
k+1 and leaves before batch k+2 (with overlap); ``accept_tokens`` (default 2.0) tokens per request
per decode step, the same for the whole batch (:mod:`lab.server_requests`).

**Host work.** The scheduler's own work is real Python (dicts, lists, free lists, strings); two
ranges are padded with more Python up to a time target (:class:`~lab.server_requests.HostWork`,
``base + per_req × B`` µs): the iteration's start to the batch built (``schedule``) and
``copy_done`` returned to the end of process_batch_result (``process``). Time targets, not
repetition counts, because the H200 machine's vCPU ran at two speeds 2× apart for seconds at a
time. At set-up, unpadded closed loops measure the rest of an iteration (prepare, launch, barrier)
at 5 and 64 requests; the targets make the host's busy time 1.3 × forward(bucket 8) at 5 requests
(light loads are host-bound) and 0.7 × forward(bucket 64) at 64 (saturated ones are device-bound);
the log warns where that cannot be met. A case's ``host_scale`` multiplies the targets.

**The race check.** Each step's write stamps the marker column of its batch's rows with a
new stamp; each graph gather copies what it read there into a snapshot that goes back with
the result; a step is racy when a snapshot shows a later stamp (the next step's write
overtook the read). ``--csan`` runs an ``--eager`` case under PyTorch's CUDA sanitizer
(:class:`~simwar.harness.csan.CsanCollector`: every report collected) and classifies the
reports by tensor (``req_to_token`` or another of the model's tensors).

**Loads.** After the host targets, pilot closed loops (fixed batches of 5, 20 and 64 decode
requests, and 6 and 20 with prefill) measure the mean step time T(N). A load of N requests
in the system gets the Poisson rate N / (L × T(N)) (Little's law), L the mean steps a
request stays (``ceil(output / accept)`` decode steps, +1 for the overlap's extra step, +0.5
waiting for admission; with prefill, +1 prefill step and +mean prompt / chunk): ``light`` 5
(bucket 8), ``medium`` 20 (bucket 32: at 25 the Poisson tail crossed 32, bucket 64's slower
steps held the batch there, and the load settled in either of two states), ``saturated``
1.15 × 64 / (L × T(64)) (the queue grows, the batch stays at 64), ``prefill_light`` 6 and
``prefill_medium`` 20; the decode loads start with their N requests there. ``ramp`` (the
fit): a triangular rate from 0.5 × light up to 1.1 × the bucket-64 capacity at half the
run's expected length (steps × T(20)) and back, so the batch sweeps every bucket up and
down.
``closed``: ``--concurrency`` requests. The realized batch is in each case's metrics.
``shapes_light`` and ``shapes_medium``: 0.3 and 0.6 × the request rate of a pilot closed
loop of 16 with the case's lengths under SGLang's default scheduling (16 / its mean latency),
run only when a case needs them.

**Suites** (fixed seeds; ``--dry-run`` caps the steps; about 80 s in all on the H200, and
~2 min more for ``shapes``). ``--cpu`` pins the loop's thread to one core
(:func:`lab.server_requests.pin_loop`; not by default: tests/data/server/shapes/README.md):

- ``fit``: ``fit_ramp_profiled`` (200 steps, profiled, fine) and ``fit_ramp`` (the same, timed);
- ``loads``: ``loads_<light|medium|saturated>_<fine|coarse|none>_r<0-2>``, 400 steps, timed;
- ``races``: ``races_<none|fine|coarse|planted>`` (60 steps, profiled) and
  ``races_csan_<...>`` (20 steps, eager, under CSAN; run after every other case, since the
  sanitizer's callbacks stay registered for the process's life): a closed loop of 16 with
  no padding and 600..900-token prompts in 1024-token chunks, so every forward starts with a
  prefill longer than its launches and the host gets ahead of the verify graph's gather;
- ``hostsync``: ``hostsync_medium`` (120 steps, profiled, ``--hidden-sync``, fine);
- ``prefill``: ``prefill_<light|medium|closed8>_<overlap|normal>_r<0-1>`` (250 steps,
  prompts 64..512, chunk 256, timed) and ``prefill_light_overlap_profiled`` (120 steps);
- ``shapes``: ``shapes_<sglang|mixed>_<light|medium|closed16>_<overlap|normal>_r<0-2>``
  (400 steps, timed; prompts 256..4096 in a 2,048-token budget, outputs 16..128) and
  ``shapes_<sglang|mixed>_medium_overlap_profiled`` (200 steps), in rounds: round r runs
  repeat r of every case, its order rotated, the profiled cases between rounds 2 and 3 (a
  slow stretch of host takes one repeat of a few cases, not every repeat of one); the pools
  and the chunk buffers grow to hold the prompts (``max_context`` 4,224: every decode gather
  reads that many positions), so this suite runs in a process of its own (~2 min on the
  H200);
- ``shapes_normal``: ``shapes_<sglang|mixed>_medium_<normal|overlap>_profiled`` (200 steps),
  each between timed twins of its loop (``..._r0``, ``..._r1``; ~1 min, a process of its own);
- ``smoke``: three short cases (timed decode, profiled prefill, eager).

**Files.** ``OUT/<case>.metrics.json`` (after each case, so a failure keeps what ran),
``OUT/<case>.kineto.json.gz`` (profiled cases: CPU and CUDA activities, CUDA sync events
where this torch has them, gzipped; the profiler is warmed up once first),
``OUT/server_log.txt``, ``OUT/server_device.json`` (device, torch, shape, per-bucket forward
µs with graphs and eager, prefill µs, host targets, pilot step times, load rates).

**Metrics.** Times are µs on the host clock since the run began; device times come from
CUDA events on the forward stream (timed cases only), placed on the host clock by an anchor
event recorded on the idle stream. Per step k (``steps``): ``shape`` (``decode``,
``prefill``, ``mixed``; ``idle`` for a step with neither), ``batch`` (B), ``bucket``,
``prefill_tokens``, ``prefill_requests``, ``admitted``, ``paused`` (requests that could
decode but paused for a prefill step), ``wait_us`` (idle wait for an
arrival), host stamps ``t_begin_us``, ``t_batch_us`` (batch built), ``t_scheduled_us``
(prepare done), ``t_launched_us`` (copy_done recorded), ``t_barrier_us``, ``proc_begin_us`` /
``proc_synced_us`` (copy_done returned) / ``proc_end_us`` of its result's processing,
``processed_in`` (the iteration that processed it), ``fwd_start_us`` / ``fwd_end_us``,
``launch_ahead`` (forwards k-1, k-2 not finished when forward k was launched),
``racy_draft`` / ``racy_verify``. Per request (``requests``, every arrived one): arrival,
lengths, admit step/time, ``prefill_done_step``, first-token step with
``first_token_dev_us`` (end of that forward) and ``first_token_host_us`` (that result
processed), finish step with ``finish_dev_us`` and ``finish_host_us``. Summary over the
measured steps (from ``warmup`` to the second-last: a step time needs a successor):
``step_us`` = fwd_start[k+1] - fwd_start[k], ``fwd_us`` = fwd_end[k] - fwd_start[k],
``gap_us`` = fwd_start[k+1] - fwd_end[k] (mean/p50/p99), ``iter_us`` (host: t_begin[k+1] -
t_begin[k], also when profiled), ``batch_mean``, ``per_bucket`` (steps, step/fwd/iter
means), ``per_shape`` (steps, step/fwd means, prefill tokens and paused requests per step),
``paused_steps``, ``launch_ahead_mean, ``host_us`` (means per step: ``schedule``, ``prepare``,
``launch``, ``barrier``, ``process`` (after the sync), ``sync_wait``, ``wait_requests``,
``busy`` = iter - sync_wait - wait_requests, ``other`` = prepare + launch + barrier),
``requests_completed`` (finish processed in the run), ``latency_us`` = finish_host -
arrival, ``latency_dev_us`` = finish_dev - arrival, ``ttft_dev_us`` = first_token_dev -
arrival, ``ttft_host_us`` = first_token_host - arrival, ``tpot_dev_us`` = (finish_dev -
first_token_dev) / (output - 1) (requests of > 1 token), ``tpot_host_us`` likewise,
``racy_steps`` (measured steps), ``racy_steps_all``, ``racy_draft_steps``,
``racy_verify_steps``, and ``csan`` when run (reports by tensor, the ``req_to_token`` and
``other`` verdicts, examples).

Imports: torch (inside :func:`main`, which hands it down) and the standard library; the lab's
GPU-side modules and simwar's GPU-side CSAN collector (:mod:`simwar.harness.csan`). Split in four
because one file would pass 1,900 lines: this one the loop, the set-up and the CLI (past 750 lines
by this docstring, which keeps the loop, the suites and every metric's definition in one place);
``server_cases`` the cases, suites and loads; ``server_model`` the device side; ``server_requests``
the pure-Python scheduler and metrics the tests check without torch.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import inspect
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

from lab.server_cases import (
    BARRIERS,
    LOADS,
    SHAPES_LOADS,
    SHAPES_PILOT,
    Case,
    Loads,
    check_lengths,
    select_cases,
    sized_for,
)
from lab.server_model import CudaOps, DryOps, ModelShape, ServerModel
from lab.server_requests import (
    PIN_MIN_CORES,
    POLICIES,
    Arrivals,
    Dist,
    HostWork,
    Scheduler,
    StepLog,
    clean,
    cpu_arg,
    overtaken,
    pin_loop,
    python_work_until,
    receive_range,
    request_arrays,
    summarize,
    wait_until,
)
from simwar.harness.csan import SHARED, CsanCollector, PointerMap, Region, describe


def step_range(shape: str, batch: int, requests: int, tokens: int) -> str:
    """The range around a step's forward, naming its shape (simwar reads it from the capture:
    ``lab.check.SERVER_MAPPING``): ``decode bs=<B>``, ``prefill bs=<N> toks=<T>`` (N requests
    in the chunk, T tokens), ``mixed bs=<B> toks=<T> reqs=<N>`` (B decoding, T prefill tokens
    of N requests: SGLang's log names a mixed batch's new requests, ``#new-seq``, as it does
    a prefill batch's; the fit reads which chunk continues a carried-over request from them).
    Captures written before ``reqs`` named a mixed step ``mixed bs=<B> toks=<T>``."""
    if shape == "prefill":
        return f"prefill bs={requests} toks={tokens}"
    if shape == "mixed":
        return f"mixed bs={batch} toks={tokens} reqs={requests}"
    return f"decode bs={batch}"


def barrier_calls(barrier: str, has_graphs: bool) -> tuple[tuple[str, str], ...]:
    """What the scheduler issues after the launch: (call on the schedule stream, target).
    ``planted`` also records ``early_done`` on the forward stream after the draft graph."""
    if barrier == "none":
        return ()
    if barrier == "coarse" or not has_graphs:  # nothing published: fall back to coarse
        return (("wait_stream", "forward"),)
    return (("wait_event", "read_done" if barrier == "fine" else "early_done"),)


# --------------------------------------------------------------------------- the loop
class Server:
    """SGLang's overlap loop around :class:`ServerModel`; one case per :meth:`run`."""

    def __init__(self, ops: CudaOps, model: ServerModel, host: HostWork, accept: float):
        self.ops, self.model, self.base_host, self.accept = ops, model, host, accept
        self.host = host
        self.torch = ops.torch
        shape = model.shape
        self.schedule, self.forward, self.copy = ops.stream(), ops.stream(), ops.stream()
        self.pinned = [ops.pinned(shape.staging) for _ in range(2)]
        self.res_host = [ops.pinned(shape.result) for _ in range(2)]
        self.lp_host = ops.pinned(2 * shape.max_batch, ops.torch.float32)
        self.copy_done = [ops.event() for _ in range(2)]
        self.early_done = ops.event()
        self.stamp = 0  # every step of every run writes a new stamp

    def run(self, case: Case, arrivals: Arrivals, timing: bool, prof=None,
            csan: CsanCollector | None = None) -> tuple[StepLog, Scheduler, float]:
        """``case.steps`` iterations and the drain; returns the per-step log, the scheduler
        (its requests) and the host time the run began (perf_counter seconds)."""
        ops, shape = self.ops, self.model.shape
        n = case.steps
        self.case, self.prof, self.csan = case, prof, csan
        self.host = self.base_host.scaled(case.host_scale)
        self.sched = Scheduler(arrivals, max_batch=shape.max_batch, accept_tokens=self.accept,
                               buckets=shape.buckets, rows=shape.rows,
                               kv_slots=shape.kv_slots, max_context=shape.max_context,
                               chunk_tokens=case.chunk_tokens if case.prompt_tokens else 0,
                               max_prefill_requests=shape.max_prefill_requests,
                               policy=case.schedule)
        self.log = StepLog(n)
        self.plans: list = [None] * n
        self.t0 = [ops.event(True) for _ in range(n)] if timing else None
        self.t1 = [ops.event(True) for _ in range(n)] if timing else None
        anchor = ops.event(True)
        ops.synchronize()
        if timing:  # torch creates a CUDA event at its first record: not in the loop
            for e in self.t0 + self.t1:
                e.record()
        ops.synchronize()
        self.start = time.perf_counter()
        with ops.use(self.forward):
            a = time.perf_counter()
            anchor.record(self.forward)
        anchor.synchronize()
        anchor_us = ((a + time.perf_counter()) / 2 - self.start) * 1e6
        if csan is not None:
            csan.begin()
        gc_on = gc.isenabled()
        gc.disable()
        try:
            for k in range(n + 1):
                if csan is not None:
                    csan.set_step(k)
                if k < n:
                    self._iteration(k)
                    if not case.overlap:
                        self._process(k, k)
                if case.overlap and k > 0:
                    self._process(k - 1, k)
                if prof is not None and k < n:  # the drain stays in the last ProfilerStep
                    prof.step()
        finally:
            if csan is not None:
                csan.end()
            if gc_on:
                gc.enable()
        ops.synchronize()
        if timing:
            col = self.log.cols
            for k in range(n):
                col["fwd_start_us"][k] = anchor_us + anchor.elapsed_time(self.t0[k]) * 1e3
                col["fwd_end_us"][k] = anchor_us + anchor.elapsed_time(self.t1[k]) * 1e3
        return self.log, self.sched, self.start

    def _now(self) -> float:
        return time.perf_counter() - self.start

    def _iteration(self, k: int) -> None:
        rf = self.torch.profiler.record_function
        ops, m, host, col = self.ops, self.model, self.host, self.log.cols
        sched, case = self.sched, self.case
        parity = k % 2
        col["t_begin_us"][k] = self._now() * 1e6
        with rf("scheduler.recv_requests"):
            self._recv()
        start = time.perf_counter()
        if sched.idle():
            with rf("scheduler.wait_requests"):
                if math.isinf(sched.arrivals.next_time()):
                    raise RuntimeError(f"{case.name}: nothing running and no request to come")
                wait_until(self.start + sched.arrivals.next_time())
                col["wait_us"][k] = (time.perf_counter() - start) * 1e6
                start = time.perf_counter()
                self._recv()
        with rf("scheduler.get_next_batch_to_run"):
            self.stamp += 1
            plan = sched.schedule(k, self._now(), self.stamp)
            self.plans[k] = plan
            entries = []
            for r in plan.decode:
                entries.append({"rid": r.rid, "row": r.row, "seq_len": len(r.slots),
                                "out_loc": r.slots[-1], "sampling": (0.7, 0.95)})
            python_work_until(start + host.schedule_us(len(plan.decode)) * 1e-6, k)
            col["t_batch_us"][k] = self._now() * 1e6
            with rf("scheduler.prepare_for_decode"):
                offsets = self._write(plan, parity)
        b, bucket, chunk = len(plan.decode), plan.bucket, plan.prefill
        col["batch"][k], col["bucket"][k] = b, bucket
        col["prefill_tokens"][k], col["prefill_requests"][k] = plan.prefill_tokens(), len(chunk)
        col["admitted"][k], col["paused"][k] = len(plan.admitted), plan.paused
        col["shape"][k] = plan.shape
        col["t_scheduled_us"][k] = self._now() * 1e6
        with rf("scheduler.run_batch"):
            if self.t1 is not None:
                col["launch_ahead"][k] = sum(1 for j in (k - 1, k - 2)
                                             if j >= 0 and not self.t1[j].query())
            self.forward.wait_stream(self.schedule)
            read_done = None
            with ops.use(self.forward):
                if self.t0 is not None:
                    self.t0[k].record(self.forward)
                with rf(step_range(plan.shape, b, len(chunk), plan.prefill_tokens())):
                    staging = m.staging[parity]
                    if b:
                        draft, verify, read_done = m.launchers(bucket, case.eager)
                        with rf("load_batch"):
                            m.load_batch(bucket, staging[offsets[0]:offsets[0] + 2 * bucket])
                    if chunk:
                        with rf("prefill"):
                            t, kv, off = offsets[1], offsets[2], offsets[3]
                            m.prefill(staging[off:], t, kv, len(chunk))
                    if b:
                        with rf("draft"):
                            draft()
                        if case.barrier == "planted":
                            self.early_done.record(self.forward)
                        with rf("verify"):
                            verify()
                    with rf("sample"):
                        m.sample(bucket, parity, len(chunk))
                if self.t1 is not None:
                    self.t1[k].record(self.forward)
            self.copy.wait_stream(self.forward)
            with ops.use(self.copy):
                self.res_host[parity].copy_(m.result[parity], non_blocking=True)  # D2H
                self.copy_done[parity].record(self.copy)
        col["t_launched_us"][k] = self._now() * 1e6
        targets = {"forward": self.forward, "read_done": read_done,
                   "early_done": self.early_done}
        for call, target in barrier_calls(case.barrier, b > 0):
            getattr(self.schedule, call)(targets[target])
        col["t_barrier_us"][k] = self._now() * 1e6

    def _recv(self) -> None:
        """Queue the arrivals; "tokenize" each (Python over its prompt or context) in a range."""
        arrived = self.sched.recv(self._now())
        if not arrived:
            return
        tokens = [r.prompt_tokens or r.context_tokens for r in arrived]
        with self.torch.profiler.record_function(receive_range(len(arrived), sum(tokens))):
            for r, n in zip(arrived, tokens):
                r.text = str(hash(tuple((r.rid * 31 + i * 17) & 0xFFFF for i in range(n))))

    def _write(self, plan, parity: int) -> tuple[int, int, int, int]:
        """The step's table writes and inputs: pinned → staging (H2D) → ``index_put_``, on the
        schedule stream. Returns the offset of the batch inputs, the prefill chunk's tokens and
        K/V positions, and the offset of its meta."""
        torch, m = self.torch, self.model
        b, bucket = len(plan.decode), plan.bucket
        pad = bucket - b
        meta, t, kv = m.prefill_meta([(r.row, s, n) for r, s, n in plan.prefill])
        packed = (plan.w_rows + plan.w_cols + plan.w_vals
                  + [r.row for r in plan.decode] + [m.shape.rows] * pad
                  + [len(r.slots) for r in plan.decode] + [1] * pad + meta)
        size, nw = len(packed), len(plan.w_rows)
        self.pinned[parity][:size].copy_(torch.tensor(packed, dtype=torch.int64))
        staging = m.staging[parity]
        with self.ops.use(self.schedule):
            staging[:size].copy_(self.pinned[parity][:size], non_blocking=True)  # H2D
            if nw:  # the shared write
                m.req_to_token.index_put_((staging[:nw], staging[nw:2 * nw]),
                                          staging[2 * nw:3 * nw])
        return 3 * nw, t, kv, 3 * nw + 2 * bucket

    def _process(self, k: int, iteration: int) -> None:
        rf = self.torch.profiler.record_function
        col, plan, host, m = self.log.cols, self.plans[k], self.host, self.model
        parity, mb = k % 2, m.shape.max_batch
        with rf("scheduler.process_batch_result"):
            col["proc_begin_us"][k] = self._now() * 1e6
            self.copy_done[parity].synchronize()
            synced = time.perf_counter()
            col["proc_synced_us"][k] = (synced - self.start) * 1e6
            if self.case.hidden_sync:  # a strided pinned target: torch copies synchronously
                with self.ops.use(self.forward):
                    self.lp_host[::2].copy_(m.logprob[parity], non_blocking=True)
            vals = self.res_host[parity].tolist()
            b, bucket = len(plan.decode), plan.bucket
            col["racy_draft"][k] = int(overtaken(vals[mb:mb + b], plan.stamp))
            col["racy_verify"][k] = int(overtaken(vals[mb + bucket:mb + bucket + b],
                                                  plan.stamp))
            done = self.sched.process(plan, self._now(), vals[:b])
            python_work_until(synced + host.process_us(b) * 1e-6, k)
            col["processed_in"][k] = iteration
            end = self._now()
            col["proc_end_us"][k] = end * 1e6
            # the finishes go out at the processing's end, as SGLang's stream_output
            self.sched.stream(done, end)


def csan_verdict(collector: CsanCollector, server: Server, warmup: int) -> dict:
    """The sanitizer's reports of one case, classified by the model's tensors."""
    regions = [Region(t.data_ptr(), t.numel() * t.element_size(),
                      SHARED if name == "req_to_token" else "internal", name)
               for name, t in server.model.named_tensors().items()]
    pmap = PointerMap(regions)
    names = {s.cuda_stream: name for name, s in (("schedule", server.schedule),
                                                 ("forward", server.forward),
                                                 ("copy", server.copy))}
    reports = [describe(step, e, pmap, names) for step, e in collector.raw]
    by: dict = {}
    after: dict = {}
    for r in reports:
        by[r["name"]] = by.get(r["name"], 0) + 1
        if r["step"] >= warmup:
            after[r["name"]] = after.get(r["name"], 0) + 1
    return {"reports": len(reports), "by_tensor": by, "by_tensor_after_warmup": after,
            "req_to_token": by.get("req_to_token", 0) > 0,
            "other": any(v for name, v in by.items() if name != "req_to_token"),
            "examples": [{k: v for k, v in r.items() if k != "ptr"} for r in reports[:5]]}


# --------------------------------------------------------------------------- main
def profile_kwargs(torch) -> tuple[dict, bool]:
    """The profiler's arguments: a schedule that always records (with a schedule, each
    ``prof.step()`` opens a ``ProfilerStep#N`` range), and ``experimental_config`` with CUDA
    sync events where this torch has them; and whether it has them."""
    out = {"schedule": lambda step: torch.profiler.ProfilerAction.RECORD}
    if "acc_events" in inspect.signature(torch.profiler.profile).parameters:
        out["acc_events"] = True  # one cycle: nothing is cleared (and no warning that it is)
    exp = getattr(getattr(torch._C, "_profiler", None), "_ExperimentalConfig", None)
    if exp is None:
        return out, False
    try:
        return dict(out, experimental_config=exp(enable_cuda_sync_events=True)), True
    except TypeError:
        return out, False


def device_info(torch, ops: CudaOps) -> dict:
    if ops.dry:
        return {"device": "cpu (dry run)", "torch": torch.__version__}
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return {"device": props.name, "capability": f"{props.major}.{props.minor}",
            "torch": torch.__version__, "cuda": torch.version.cuda}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lab.server",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--suite", help="comma-separated: fit, loads, races, hostsync, prefill, "
                                    "shapes, shapes_normal, smoke (none: one case from the "
                                    "flags)")
    ap.add_argument("--cases", help="comma-separated case names to keep")
    ap.add_argument("--dry-run", action="store_true",
                    help="tiny shapes on the CPU, no streams or graphs (tests)")
    ap.add_argument("--dry-steps", type=int, default=8, help="steps per case when dry")
    ap.add_argument("--accept-tokens", type=float, default=2.0)
    ap.add_argument("--layers", type=int, help="target layers (default: the shape's)")
    ap.add_argument("--draft-steps", type=int, help="draft MLP steps (default: the shape's)")
    ap.add_argument("--host-light-factor", type=float, default=1.3)
    ap.add_argument("--host-saturated-factor", type=float, default=0.7)
    ap.add_argument("--cpu", default="none", type=cpu_arg,
                    help="pin the loop's thread to this core (and run torch's CPU ops on it "
                         "alone); auto: to the last core this process may use, where it may "
                         f"use at least {PIN_MIN_CORES}; none (the default): not pinned")
    g = ap.add_argument_group("one case (with --suite: overrides for every case)")
    g.add_argument("--name")
    g.add_argument("--steps", type=int)
    g.add_argument("--load", choices=LOADS)
    g.add_argument("--rate", type=float, help="Poisson arrivals per second")
    g.add_argument("--concurrency", type=int, help="closed loop of N requests")
    g.add_argument("--barrier", choices=BARRIERS)
    g.add_argument("--seed", type=int)
    g.add_argument("--profile", action="store_true", default=None, dest="profiled")
    g.add_argument("--hidden-sync", action="store_true", default=None)
    g.add_argument("--no-overlap", action="store_false", default=None, dest="overlap")
    g.add_argument("--prompt-tokens", help="prefill prompts: LO..HI or N")
    g.add_argument("--chunk-tokens", type=int)
    g.add_argument("--output-tokens", help="LO..HI or N (default 16..128)")
    g.add_argument("--eager", action="store_true", default=None)
    g.add_argument("--csan", action="store_true", default=None)
    g.add_argument("--host-scale", type=float, help="× the Python padding (default 1)")
    g.add_argument("--schedule", choices=POLICIES,
                   help="mixed: the chunk mixed into the decode step (SGLang's "
                        "--enable-mixed-chunk; the default); sglang: SGLang's default, a "
                        "prefill step of its own while prompt tokens wait")
    return ap


#: pilot closed loops: (requests, prefilled)
PILOTS = ((5, False), (20, False), (64, False), (6, True), (20, True))


class Bench:
    """The process's set-up (model, graphs, figures, loads) and its per-case runs."""

    def __init__(self, args, torch, log, cases: list[Case]):
        self.args, self.torch, self.log = args, torch, log
        self.ops = ops = DryOps(torch) if args.dry_run else CudaOps(torch)
        shape = ModelShape.dry() if args.dry_run else ModelShape()
        # the pools and buffers hold the longest case (the shapes suite's 4,096-token prompts
        # widen max_context, and with it every decode gather: a suite of its own)
        shape = shape.with_sizes(args.layers, args.draft_steps,
                                 *sized_for(cases, args.accept_tokens, shape.max_context,
                                            shape.max_chunk_tokens))
        self.model = model = ServerModel(ops, shape)
        model.capture()
        fwd = {b: model.forward_us(b) for b in shape.buckets}
        fwd_eager = {b: model.forward_us(b, eager=True) for b in shape.buckets}
        prefill = {t: model.prefill_us(t) for t in (64, 256, 1024, 2048)
                   if t <= 256 or t <= shape.max_chunk_tokens}
        log("forward µs per bucket (graphs): " + ", ".join(f"{b}: {v:.0f}"
                                                           for b, v in fwd.items()))
        log("forward µs per bucket (eager): " + ", ".join(f"{b}: {v:.0f}"
                                                          for b, v in fwd_eager.items()))
        log("prefill µs per chunk of one request: " + ", ".join(f"{t} tokens: {v:.0f}"
                                                                for t, v in prefill.items()))
        self.loads = Loads({}, args.accept_tokens)
        self.server = Server(ops, model, HostWork(), args.accept_tokens)
        # unpadded closed loops measure the rest of an iteration; a throwaway one first: the
        # first loops after the set-up (the allocator, the eager shapes' cuBLAS plans) ran
        # ~30% slower on the H200 machine
        other = {}
        for n, steps in ((25, 80), (5, 40), (64, 40)):
            case = Case(f"pilot_unpadded_{n}", args.dry_steps if args.dry_run else steps,
                        "closed", concurrency=n, warmup=2 if args.dry_run else 10)
            steplog, sched, _ = self.server.run(case, self.loads.arrivals(case), timing=True)
            other[n] = summarize(steplog, sched, True, case.warmup_steps())["host_us"]["other"]
        host, warning = HostWork.fit(other, fwd, args.host_light_factor,
                                     args.host_saturated_factor)
        if ops.dry:  # the dry run's "device" is this host: fixed targets, to run the padding
            host, warning = HostWork(300.0, 5.0, 200.0, 4.0), ""
        self.server.base_host = host
        log(f"host µs outside the padded ranges: 5: {other[5]:.0f}, 64: {other[64]:.0f}; "
            "targets µs: " + ", ".join(f"{k} {v:.1f}" for k, v in asdict(host).items())
            + (f"; WARNING: {warning}" if warning else ""))
        self.prof_kwargs, self.sync_events = profile_kwargs(torch)
        act = torch.profiler.ProfilerActivity
        self.activities = [act.CPU] + ([] if ops.dry else [act.CUDA])
        self.profiler_warm = False
        self.collector = None
        pilots = {}
        for n, prefill_on in PILOTS:
            key = Loads.pilot_key(n, prefill_on)
            steps, warm = (80, 30) if prefill_on else (40, 10)
            if args.dry_run:
                steps, warm = min(steps, args.dry_steps), 2
            case = Case(f"pilot_{key}", steps, "closed", concurrency=n, warmup=warm,
                        prompt_tokens="64..512" if prefill_on else None)
            steplog, sched, _ = self.server.run(case, self.loads.arrivals(case), timing=True)
            pilots[key] = summarize(steplog, sched, True, warm)["step_us_mean"]
        rps, shapes_steps = self._shapes_pilot(cases)
        pilots.update(shapes_steps)
        self.loads = Loads(pilots, args.accept_tokens, pilot_rps=rps)
        rates = {load: self.loads.rate(load) for load in
                 ("light", "medium", "saturated", "prefill_light", "prefill_medium",
                  *(SHAPES_LOADS if rps else ()))}
        log("pilot step µs: " + ", ".join(f"{k}: {v:.0f}" for k, v in pilots.items())
            + "; rates /s: " + ", ".join(f"{k}: {v:.0f}" for k, v in rates.items()))
        self.device = {"format": "simwar.server_device", "version": 1,
                       **device_info(torch, ops), "shape": asdict(shape),
                       "kv_slots": shape.kv_slots, "rows": shape.rows,
                       "accept_tokens": args.accept_tokens,
                       "forward_us": {str(b): v for b, v in fwd.items()},
                       "forward_eager_us": {str(b): v for b, v in fwd_eager.items()},
                       "prefill_us": {str(t): v for t, v in prefill.items()},
                       "host_work": asdict(host), "host_other_us": other,
                       "host_work_warning": warning, "pilot_step_us": pilots,
                       "pilot_requests_per_s": rps,
                       "load_rates_per_s": rates, "cuda_sync_events": self.sync_events}

    def _shapes_pilot(self, cases: list[Case]) -> tuple[dict, dict]:
        """Where a case runs a shapes load: a closed loop of :data:`SHAPES_PILOT` requests
        with that case's lengths, SGLang's default scheduling and overlap; ``(rates, steps)``:
        its request rate, N / its mean latency (``{"shapes_<N>": ...}``), and its mean step
        µs (``{"step_shapes_<N>": ...}``); two empty mappings where no case runs one.
        Without a finished request (a dry run's few steps) the latency is taken as its step
        time × (``ceil(output / accept)`` decode steps + the N requests' prefill steps)."""
        shaped = [c for c in cases if c.load in SHAPES_LOADS]
        if not shaped:
            return {}, {}
        args, c, n = self.args, shaped[0], SHAPES_PILOT
        steps, warm = (min(200, args.dry_steps), 2) if args.dry_run else (200, 40)
        case = Case(f"pilot_shapes_{n}", steps, "closed", concurrency=n, warmup=warm,
                    schedule="sglang", prompt_tokens=c.prompt_tokens,
                    chunk_tokens=c.chunk_tokens, output_tokens=c.output_tokens)
        steplog, sched, _ = self.server.run(case, self.loads.arrivals(case), timing=True)
        s = summarize(steplog, sched, True, warm)
        lat, step = s["latency_us_mean"], s["step_us_mean"]
        if not math.isfinite(lat):
            out = Dist.parse(c.output_tokens).mean()
            prefill = n * Dist.parse(c.prompt_tokens).mean() / c.chunk_tokens
            lat = step * (math.ceil(out / args.accept_tokens) + prefill)
        return {f"shapes_{n}": n / (lat * 1e-6)}, {f"step_shapes_{n}": step}

    def run_case(self, case: Case) -> dict:
        """One case: timed (or sanitized) or profiled; returns its metrics."""
        args, server = self.args, self.server
        shape = self.model.shape
        check_lengths(case, args.accept_tokens, shape.max_context, shape.max_chunk_tokens)
        profile = self.torch.profiler.profile
        capture = None
        if case.profiled:
            if not self.profiler_warm:
                # the profiler's first start (its buffers, CUPTI's callbacks) takes seconds
                # and slowed a dozen steps of the probe's first capture
                warm = Case("profiler_warmup", min(20, args.dry_steps) if args.dry_run else 20,
                            "closed", concurrency=8)
                with profile(activities=self.activities, **self.prof_kwargs) as prof:
                    server.run(warm, self.loads.arrivals(warm), timing=False, prof=prof)
                self.profiler_warm = True
            with profile(activities=self.activities, **self.prof_kwargs) as prof:
                steplog, sched, _ = server.run(case, self.loads.arrivals(case), timing=False,
                                               prof=prof)
            capture = self._export(prof, case.name)
        else:
            collector = None
            if case.csan and not self.ops.dry:
                if self.collector is None:
                    self.collector = CsanCollector()
                collector = self.collector
            steplog, sched, _ = server.run(case, self.loads.arrivals(case), timing=True,
                                           csan=collector)
        summary = summarize(steplog, sched, not case.profiled, case.warmup_steps())
        if case.csan:
            summary["csan"] = (csan_verdict(collector, server, case.warmup_steps())
                               if collector is not None else {"run": False,
                                                              "why": "dry run: no CUDA"})
        return {"format": "simwar.server", "version": 1, "case": asdict(case),
                "arrivals": self.loads.describe(case), "accept_tokens": args.accept_tokens,
                "host_work": asdict(server.host),
                "timed": not case.profiled, "capture": capture and capture[0],
                "capture_bytes": capture and capture[1], "summary": summary,
                "steps": steplog.cols, "requests": request_arrays(sched, steplog,
                                                                  not case.profiled)}

    def _export(self, prof, name: str) -> tuple[str, int]:
        tmp = Path(tempfile.mkdtemp())
        prof.export_chrome_trace(str(tmp / "k.json"))
        raw = (tmp / "k.json").read_bytes()
        (tmp / "k.json").unlink()
        tmp.rmdir()
        out = self.args.out / f"{name}.kineto.json.gz"
        out.write_bytes(gzip.compress(raw, compresslevel=6))
        return out.name, out.stat().st_size


def case_line(name: str, m: dict, seconds: float) -> str:
    s = m["summary"]

    def f(key):
        v = s.get(key)
        return "-" if v is None or v != v else f"{v:.0f}"

    line = (f"{name}: {seconds:.1f}s, batch {s['batch_mean']:.1f}, step {f('step_us_mean')} "
            f"µs (p99 {f('step_us_p99')}), fwd {f('fwd_us_mean')}, gap {f('gap_us_mean')}, "
            f"iter {f('iter_us_mean')}, racy {s['racy_steps']}/{s['steps_measured']}, "
            f"done {s['requests_completed']}/{s['requests_arrived']}")
    shapes = s.get("per_shape") or {}
    if set(shapes) - {"decode"}:
        line += ", shapes " + " ".join(f"{k} {v['steps']}" for k, v in shapes.items())
    if s.get("ttft_host_us_mean") is not None and m["case"]["prompt_tokens"]:
        line += f", ttft {f('ttft_dev_us_mean')}/{f('ttft_host_us_mean')} µs"
    if m["capture"]:
        line += f", capture {m['capture_bytes'] / 1e6:.2f} MB gz"
    if "csan" in s:
        c = s["csan"]
        line += (f", csan: {c.get('reports', '-')} reports, req_to_token {c.get('req_to_token')}"
                 f", other {c.get('other')}")
    return line


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    try:
        cases = select_cases(args)
    except ValueError as e:
        ap.error(str(e))
    if not cases:
        ap.error("no case selected")
    import torch  # lazy: the GPU side; importing this module (tests, --help) needs no torch

    if not args.dry_run and not torch.cuda.is_available():
        print("no CUDA device (use --dry-run on the CPU)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []

    def log(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    def write_log() -> None:
        (args.out / "server_log.txt").write_text("\n".join(lines) + "\n")

    t_all = time.time()
    threads = torch.get_num_threads()
    if args.dry_run:  # tiny CPU kernels run faster without the thread pool on a busy CPU
        torch.set_num_threads(1)
    try:
        return _run(args, cases, torch, log, write_log, t_all)
    finally:
        torch.set_num_threads(threads)


def _run(args, cases: list[Case], torch, log, write_log, t_all: float) -> int:
    if not args.dry_run:
        torch.cuda.init()
        torch.zeros(1, device="cuda")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    cpu = pin_loop(args.cpu) if not args.dry_run else None
    if cpu is not None:
        # torch's CPU thread pool starts later, from this thread, and inherits its one core:
        # 16 threads on it stalled the loop's packing copies up to 148 ms (pinned_rerun/)
        torch.set_num_threads(1)
    bench = Bench(args, torch, log, cases)
    bench.device["loop_cpu"] = cpu
    log(f"set-up {time.time() - t_all:.1f}s ({bench.device['device']}; loop thread "
        + (f"pinned to core {cpu} of {cores})" if cpu is not None else "not pinned)"))
    (args.out / "server_device.json").write_text(json.dumps(clean(bench.device), indent=1))
    failed = []
    for case in cases:
        t = time.time()
        try:
            m = bench.run_case(case)
            m["seconds"] = round(time.time() - t, 2)
            (args.out / f"{case.name}.metrics.json").write_text(json.dumps(clean(m)))
            log(case_line(case.name, m, time.time() - t))
        except Exception as e:  # noqa: BLE001 - one run on the GPU: keep the other cases
            failed.append(case.name)
            log(f"{case.name}: FAILED after {time.time() - t:.1f}s: {type(e).__name__}: {e}")
            bench.ops.synchronize()
        write_log()
    log(f"total {time.time() - t_all:.0f}s for {len(cases)} cases"
        + (f"; failed: {', '.join(failed)}" if failed else ""))
    write_log()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
