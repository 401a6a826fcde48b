"""The mini-server's device side: stream/event/graph ops, and a paged-KV decoder on real kernels.

- :class:`CudaOps` / :class:`DryOps`: streams, events, pinned memory, graph capture and
  device timing of the current CUDA device, or the same calls on the CPU with no streams and
  graphs as plain calls (``--dry-run``; the pattern of :mod:`lab.probe`).
- :class:`ModelShape`: the sizes. :class:`ServerModel`: random bf16 weights (nothing is
  downloaded), the KV pool, the shared ``req_to_token`` table, one static input set and one
  pair of CUDA graphs per batch bucket, the eager prefill and sample, the result buffers.

**The KV pool** is per layer: ``k_pool[l]`` and ``v_pool[l]`` of shape
``[kv_slots, heads, head_dim]``. Slot 0 is the padding slot, never handed out;
``kv_slots = (rows + 1) * max_context + 1`` so the scheduler never runs out.
**``req_to_token``** is ``[rows + 1, max_context + 1]`` int64 (request row × position → KV
slot), shared by every layer and by the draft; row ``rows`` is the padding row (its position
0 is slot 0); column ``max_context`` is the race-check marker (the step's stamp). It starts
filled with random valid slots, so a row's positions beyond its sequence hold stale slots:
every gather reads its rows up to ``max_context`` whatever their lengths, and a bucket's
attention costs the same at every batch in it.

**Per bucket** ``b`` (8, 16, 32, 64): static inputs ``[2, b]`` (rows, sequence lengths after
this step's new slot; padding rows are the padding row with length 1), the two snapshots
``[2, b]`` (what the draft's and verify's gathers read at the marker), the draft's and
verify's outputs, and an ``Event(external=True)`` that the verify graph records right after
its gather (the in-graph read-done node). Per step, on the forward stream:

1. ``load_batch``: the step's rows and lengths copied from the step's staging buffer (which
   the schedule stream filled) into the bucket's static inputs;
2. ``prefill`` (eager, only with a chunk): the chunk's T tokens packed (no padding) and the
   K/V positions of its requests' prompts so far (S, padded to a multiple of 8), both read
   through ``req_to_token``; per target layer, q/k/v of the T tokens, their K/V written into
   the pool, attention of the T queries over the S positions with a block-diagonal causal
   mask (a token sees its own request's positions up to its own), output projection and
   MLP; the last token's hidden state per request. GEMMs grow with T, attention with T × S;
   at these sizes its ~50 eager launches make a small chunk launch-bound on the host;
3. ``draft`` graph: its own gather of the batch's ``req_to_token`` rows, ``draft_steps``
   chained MLP layers of its own (EAGLE-like: about a fifth to a third of the forward);
4. ``verify`` graph: the gather (then the read-done node), the new token's slot, then per
   target layer: q/k/v projection, the new K/V written at its slot, K/V gathered through the
   page table for all ``max_context`` positions, softmax attention with the sequence-length
   mask (``scaled_dot_product_attention``), output projection, a SwiGLU MLP;
5. ``sample`` (eager): the vocabulary GEMM and argmax for the decode batch and the
   prefilled requests, packed with the snapshots into the step's result buffer; a
   per-step "logprob" buffer (what ``--hidden-sync`` fetches).

Attention and the GEMMs grow with the bucket (the gathers move ``bucket × max_context``
K/V rows per layer). ``--eager`` runs the same functions without graphs (read-done is then
a plain event recorded after verify's gather).

Imports: the standard library (torch is handed in by the caller, which imports it: the GPU
machine has torch, the CPU tests a CPU build).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class ModelShape:
    """The model's and the pools' sizes."""

    hidden: int = 4096
    heads: int = 16  # attention width heads × head_dim = 2048, narrower than hidden
    head_dim: int = 128
    ffn: int = 14336
    layers: int = 3  # target layers (verify, prefill)
    draft_ffn: int = 14336
    draft_steps: int = 3  # EAGLE-like chained draft steps, one MLP layer each
    vocab: int = 32000
    max_context: int = 1024
    max_batch: int = 64
    buckets: tuple[int, ...] = (8, 16, 32, 64)
    max_prefill_requests: int = 8
    max_chunk_tokens: int = 1024

    @property
    def rows(self) -> int:
        """Request rows of ``req_to_token`` (the padding row is one more)."""
        return self.max_batch + 2

    @property
    def kv_slots(self) -> int:
        return (self.rows + 1) * self.max_context + 1

    @property
    def staging(self) -> int:
        """int64 entries of one step's staging buffer (writes, batch inputs, prefill meta)."""
        writes = self.rows * self.max_context + 2 * self.max_batch
        prefill = (3 * self.max_chunk_tokens + 3 * (self.max_prefill_requests
                                                    * self.max_context + 8)
                   + self.max_prefill_requests)
        return 3 * writes + 2 * self.max_batch + prefill

    @property
    def result(self) -> int:
        """int64 entries of one step's result: tokens, snapshots, prefill tokens."""
        return 3 * self.max_batch + self.max_prefill_requests

    @classmethod
    def dry(cls) -> ModelShape:
        return cls(hidden=16, heads=2, head_dim=8, ffn=24, layers=2, draft_ffn=16,
                   draft_steps=2, vocab=64)

    def with_sizes(self, layers: int | None = None, draft_steps: int | None = None,
                   max_context: int | None = None, max_chunk_tokens: int | None = None
                   ) -> ModelShape:
        return replace(self, layers=layers or self.layers,
                       draft_steps=draft_steps or self.draft_steps,
                       max_context=max_context or self.max_context,
                       max_chunk_tokens=max_chunk_tokens or self.max_chunk_tokens)


# --------------------------------------------------------------------------- device ops
class CudaOps:
    """Streams, events, graphs and pinned memory of the current CUDA device."""

    dry = False

    def __init__(self, torch):
        self.torch = torch
        self.device = "cuda"
        self.dtype = torch.bfloat16
        # cuDNN's attention builds a plan for every new shape (~8 ms each on the H200), and
        # the eager prefill's shapes change every step: the memory-efficient kernel serves all
        torch.backends.cuda.enable_cudnn_sdp(False)

    def stream(self):
        return self.torch.cuda.Stream()

    def use(self, stream):
        return self.torch.cuda.stream(stream)

    def event(self, timing: bool = False, external: bool = False):
        if external:
            return self.torch.cuda.Event(external=True)
        return self.torch.cuda.Event(enable_timing=timing)

    def pinned(self, n: int, dtype=None):
        return self.torch.zeros(n, dtype=dtype or self.torch.int64, pin_memory=True)

    def synchronize(self) -> None:
        self.torch.cuda.synchronize()

    def capture(self, fn):
        """A CUDA graph of ``fn(True)``, warmed up on a side stream first (``fn(False)``: no
        in-graph event record outside the capture); returns its replay."""
        torch = self.torch
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                fn(False)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn(True)
        torch.cuda.synchronize()
        return graph.replay

    def time_us(self, fn, n: int = 7, reps: int = 10) -> float:
        """Median device time of one ``fn`` (µs): ``reps`` calls between two CUDA events
        (the host queues them faster than the device runs them), ``n`` times."""
        for _ in range(3):
            fn()
        out = []
        for _ in range(n):
            a, b = self.event(True), self.event(True)
            a.record()
            for _ in range(reps):
                fn()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) * 1e3 / reps)
        self.synchronize()
        return statistics.median(out)


class DryStream:
    """A stream of the dry run: waits are no-ops."""

    cuda_stream = 0

    def wait_stream(self, other) -> None:
        return None

    def wait_event(self, event) -> None:
        return None


class DryEvent:
    """An event of the dry run: it fires when recorded (host time)."""

    def __init__(self):
        self.t = None

    def record(self, stream=None) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def elapsed_time(self, other) -> float:
        return (other.t - self.t) * 1e3


class DryOps(CudaOps):
    """The same calls on the CPU, with no streams and graphs as plain calls (tests)."""

    dry = True

    def __init__(self, torch):  # not CudaOps.__init__: no CUDA backend to configure
        self.torch = torch
        self.device = "cpu"
        self.dtype = torch.float32

    def stream(self):
        return DryStream()

    def use(self, stream):
        return contextlib.nullcontext()

    def event(self, timing: bool = False, external: bool = False):
        return DryEvent()

    def pinned(self, n: int, dtype=None):
        return self.torch.zeros(n, dtype=dtype or self.torch.int64)

    def synchronize(self) -> None:
        return None

    def capture(self, fn):
        return lambda: fn(False)

    def time_us(self, fn, n: int = 3, reps: int = 1) -> float:
        fn()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n * 1e6


# --------------------------------------------------------------------------- the model
class BucketBuffers:
    """One bucket's static graph inputs and outputs, and its in-graph read-done event."""

    def __init__(self, torch, ops, shape: ModelShape, b: int):
        dev, dt = ops.device, ops.dtype
        self.b = b
        self.inputs = torch.zeros(2, b, dtype=torch.int64, device=dev)  # rows, seq lens
        self.snaps = torch.zeros(2, b, dtype=torch.int64, device=dev)  # draft, verify
        self.draft_out = torch.zeros(b, shape.hidden, dtype=dt, device=dev)
        self.verify_out = torch.zeros(b, shape.hidden, dtype=dt, device=dev)
        self.read_done = ops.event(external=True)


class ServerModel:
    """Weights, pools, the shared table, per-bucket buffers and graphs (module docstring)."""

    def __init__(self, ops: CudaOps, shape: ModelShape, seed: int = 0):
        torch = ops.torch
        self.ops, self.shape, self.torch = ops, shape, torch
        dev, dt = ops.device, ops.dtype
        gen = torch.Generator(device=dev)
        gen.manual_seed(seed)
        h, hd, f = shape.hidden, shape.heads * shape.head_dim, shape.ffn

        def w(*size):
            return torch.randn(*size, device=dev, dtype=dt, generator=gen) * 0.02

        self.wqkv = [w(h, 3 * hd) for _ in range(shape.layers)]
        self.wo = [w(hd, h) for _ in range(shape.layers)]
        self.w1 = [w(h, 2 * f) for _ in range(shape.layers)]
        self.w2 = [w(f, h) for _ in range(shape.layers)]
        self.dw1 = w(h, 2 * shape.draft_ffn)
        self.dw2 = w(shape.draft_ffn, h)
        self.emb = w(shape.vocab, h)
        self.head = w(h, shape.vocab)
        kv = (shape.kv_slots, shape.heads, shape.head_dim)
        self.k_pool = [torch.randn(*kv, device=dev, dtype=dt, generator=gen)
                       for _ in range(shape.layers)]
        self.v_pool = [torch.randn(*kv, device=dev, dtype=dt, generator=gen)
                       for _ in range(shape.layers)]
        i64 = torch.int64
        self.req_to_token = torch.randint(1, shape.kv_slots, (shape.rows + 1,
                                                              shape.max_context + 1),
                                          dtype=i64, device=dev, generator=gen)
        self.req_to_token[shape.rows, 0] = 0  # the padding row's one position: slot 0
        self.req_to_token[:, shape.max_context] = 0  # the marker
        self.positions = torch.arange(shape.max_context, dtype=i64, device=dev)
        self.buckets = {b: BucketBuffers(torch, ops, shape, b) for b in shape.buckets}
        self.staging = [torch.zeros(shape.staging, dtype=i64, device=dev) for _ in range(2)]
        self.result = [torch.zeros(shape.result, dtype=i64, device=dev) for _ in range(2)]
        self.logprob = [torch.zeros(shape.max_batch, dtype=torch.float32, device=dev)
                        for _ in range(2)]
        self.prefill_last = torch.zeros(shape.max_prefill_requests, h, dtype=dt, device=dev)
        self.read_done_eager = ops.event()
        self.graphs: dict[int, tuple] = {}

    def named_tensors(self) -> dict:
        """Name → device tensor, for classifying sanitizer reports."""
        out = {"req_to_token": self.req_to_token, "emb": self.emb, "head": self.head,
               "prefill_last": self.prefill_last}
        for i in range(2):
            out[f"staging[{i}]"], out[f"result[{i}]"] = self.staging[i], self.result[i]
            out[f"logprob[{i}]"] = self.logprob[i]
        for layer in range(self.shape.layers):
            out[f"k_pool[{layer}]"], out[f"v_pool[{layer}]"] = (self.k_pool[layer],
                                                                self.v_pool[layer])
        for b, bb in self.buckets.items():
            for name in ("inputs", "snaps", "draft_out", "verify_out"):
                out[f"{name}[{b}]"] = getattr(bb, name)
        return out

    # ------------------------------------------------------------------ forward pieces
    def load_batch(self, b: int, src) -> None:
        """The step's rows and lengths into bucket ``b``'s static inputs."""
        self.buckets[b].inputs.copy_(src.view(2, b))

    def _gather_table(self, bb: BucketBuffers, which: int, record=None):
        """The shared read: the batch's ``req_to_token`` rows; what it read at the marker."""
        tbl = self.req_to_token.index_select(0, bb.inputs[0])
        if record is not None:
            record.record()  # read-done right after the gather (in-graph node when captured)
        bb.snaps[which].copy_(tbl[:, self.shape.max_context])
        return tbl

    def _new_slot(self, tbl, seq):
        return tbl.gather(1, (seq - 1).clamp(min=0).unsqueeze(1)).squeeze(1)

    def draft(self, b: int, record=None) -> None:
        torch, s = self.torch, self.shape
        bb = self.buckets[b]
        tbl = self._gather_table(bb, 0)
        x = self.emb.index_select(0, torch.remainder(self._new_slot(tbl, bb.inputs[1]),
                                                     s.vocab))
        f = s.draft_ffn
        for _ in range(s.draft_steps):
            gu = x @ self.dw1
            x = torch.tanh(torch.addmm(x, torch.nn.functional.silu(gu[:, :f]) * gu[:, f:],
                                       self.dw2))
        bb.draft_out.copy_(x)

    def verify(self, b: int, record=None) -> None:
        torch, s = self.torch, self.shape
        bb = self.buckets[b]
        tbl = self._gather_table(bb, 1, record)
        seq = bb.inputs[1]
        slots = tbl[:, :s.max_context]
        out_loc = self._new_slot(tbl, seq)
        valid = self.positions.unsqueeze(0) < seq.unsqueeze(1)
        mask = torch.zeros(b, 1, 1, s.max_context, dtype=self.ops.dtype, device=self.ops.device)
        mask.masked_fill_(~valid.view(b, 1, 1, -1), float("-inf"))
        x = self.emb.index_select(0, torch.remainder(out_loc, s.vocab)) + bb.draft_out
        flat = slots.reshape(-1)
        for layer in range(s.layers):
            x = self._layer(layer, x, b, 1, out_loc, flat, s.max_context, mask)
        bb.verify_out.copy_(x)

    def _layer(self, layer: int, x, r: int, q_len: int, new_slots, kv_slots, kv_len: int,
               mask):
        """One target layer for ``r`` sequences of ``q_len`` queries over ``kv_len`` slots."""
        torch, s = self.torch, self.shape
        H, D, f = s.heads, s.head_dim, s.ffn
        qkv = x @ self.wqkv[layer]
        q, k, v = qkv.split(H * D, dim=-1)
        self.k_pool[layer].index_copy_(0, new_slots, k.reshape(-1, H, D))
        self.v_pool[layer].index_copy_(0, new_slots, v.reshape(-1, H, D))
        kk = self.k_pool[layer].index_select(0, kv_slots).view(r, kv_len, H, D)
        vv = self.v_pool[layer].index_select(0, kv_slots).view(r, kv_len, H, D)
        o = torch.nn.functional.scaled_dot_product_attention(
            q.reshape(r, q_len, H, D).transpose(1, 2), kk.transpose(1, 2), vv.transpose(1, 2),
            attn_mask=mask)
        x = torch.addmm(x, o.transpose(1, 2).reshape(r * q_len, H * D), self.wo[layer])
        gu = x @ self.w1[layer]
        return torch.tanh(torch.addmm(x, torch.nn.functional.silu(gu[:, :f]) * gu[:, f:],
                                      self.w2[layer]))

    def prefill(self, meta, t: int, s: int, r: int) -> None:
        """Eager prefill of a packed chunk: ``meta`` holds, for its ``t`` tokens, their rows,
        positions and request indices, for its ``s`` K/V positions the same, and per request
        (``r``) the index of its last token (:meth:`prefill_meta`)."""
        torch, sh = self.torch, self.shape
        tok_row, tok_pos, tok_req = meta[:t], meta[t:2 * t], meta[2 * t:3 * t]
        o = 3 * t
        kv_row, kv_pos, kv_req = meta[o:o + s], meta[o + s:o + 2 * s], meta[o + 2 * s:o + 3 * s]
        last = meta[o + 3 * s:o + 3 * s + r]
        new = self.req_to_token[tok_row, tok_pos]  # the shared reads: the chunk's slots
        kv = self.req_to_token[kv_row, kv_pos]  # and its prompts' so far
        visible = ((tok_req.unsqueeze(1) == kv_req.unsqueeze(0))
                   & (kv_pos.unsqueeze(0) <= tok_pos.unsqueeze(1)))
        mask = torch.zeros(1, 1, t, s, dtype=self.ops.dtype, device=self.ops.device)
        mask.masked_fill_(~visible.view(1, 1, t, s), float("-inf"))
        x = self.emb.index_select(0, torch.remainder(new, sh.vocab))
        for layer in range(sh.layers):
            x = self._layer(layer, x, 1, t, new, kv, s, mask)
        self.prefill_last[:r].copy_(x.index_select(0, last))

    def prefill_meta(self, chunk) -> tuple[list[int], int, int]:
        """The packed meta of a chunk ``[(row, first position, tokens), ...]``: the int64
        list, T and S (the padding K/V entries are the padding row's slot 0, in no request)."""
        tok = ([], [], [])
        kv = ([], [], [])
        last = []
        for i, (row, start, n) in enumerate(chunk):
            tok[0].extend([row] * n)
            tok[1].extend(range(start, start + n))
            tok[2].extend([i] * n)
            last.append(len(tok[0]) - 1)
            kv[0].extend([row] * (start + n))
            kv[1].extend(range(start + n))
            kv[2].extend([i] * (start + n))
        pad = -len(kv[0]) % 8  # the memory-efficient kernel wants an aligned mask
        kv[0].extend([self.shape.rows] * pad)
        kv[1].extend([0] * pad)
        kv[2].extend([-1] * pad)
        return tok[0] + tok[1] + tok[2] + kv[0] + kv[1] + kv[2] + last, len(tok[0]), len(kv[0])

    def sample(self, b: int, parity: int, r: int) -> None:
        """Tokens (argmax of the vocabulary GEMM), snapshots and prefill tokens → result."""
        mb = self.shape.max_batch
        res = self.result[parity]
        if b:
            bb = self.buckets[b]
            logits = bb.verify_out @ self.head
            res[:b].copy_(logits.argmax(-1))
            self.logprob[parity][:b].copy_(logits.amax(-1))
            res[mb:mb + 2 * b].copy_(bb.snaps.view(-1))
        if r:
            res[3 * mb:3 * mb + r].copy_((self.prefill_last[:r] @ self.head).argmax(-1))

    # ------------------------------------------------------------------ graphs and timing
    def capture(self) -> None:
        """One draft and one verify graph per bucket (the verify graph records read-done)."""
        for b, bb in self.buckets.items():
            bb.inputs[0].fill_(self.shape.rows)  # the padding row: a valid batch to capture
            bb.inputs[1].fill_(1)
            draft = self.ops.capture(lambda capturing, b=b: self.draft(b))
            verify = self.ops.capture(
                lambda capturing, b=b, e=bb.read_done: self.verify(b, e if capturing else None))
            self.graphs[b] = (draft, verify)

    def launchers(self, b: int, eager: bool):
        """(draft, verify, read-done event) of bucket ``b``: graph replays, or eager calls."""
        if eager:
            return (lambda: self.draft(b), lambda: self.verify(b, self.read_done_eager),
                    self.read_done_eager)
        draft, verify = self.graphs[b]
        return draft, verify, self.buckets[b].read_done

    def forward_us(self, b: int, eager: bool = False) -> float:
        """Device time of one whole decode forward at bucket ``b`` (load, graphs, sample),
        with rows 0..b-1 at half the context."""
        torch = self.torch
        src = torch.cat([torch.arange(b, dtype=torch.int64, device=self.ops.device),
                         torch.full((b,), self.shape.max_context // 2, dtype=torch.int64,
                                    device=self.ops.device)])
        draft, verify, _ = self.launchers(b, eager)

        def fwd():
            self.load_batch(b, src)
            draft()
            verify()
            self.sample(b, 0, 0)

        return self.ops.time_us(fwd)

    def prefill_us(self, tokens: int) -> float:
        """Device time of an eager prefill of one request's first ``tokens`` prompt tokens."""
        packed, t, s = self.prefill_meta([(0, 0, tokens)])
        meta = self.torch.tensor(packed, dtype=self.torch.int64, device=self.ops.device)
        return self.ops.time_us(lambda: self.prefill(meta, t, s, 1), n=3, reps=3)


__all__ = ["BucketBuffers", "CudaOps", "DryEvent", "DryOps", "DryStream", "ModelShape",
           "ServerModel"]
