"""Prefill in a run's steps: each request's chunks, and the decode pauses behind prefill steps.

Both are read from data the run keeps, never from labels: the per-step table's ``step``,
``fwd_start_us``, ``fwd_end_us``, ``fwd_us`` and ``shape`` columns (``shape`` only where the
scheduler picked shapes: a run with prompts, or ``scheduling.idle``),
``meta.workload.prefill_tokens`` (the prompt tokens each step prefilled) and per request
``meta.workload.requests``' ``prefill_step`` (the step of its first chunk) and
``first_step`` (the step of its last chunk, which gives its first token). A request's chunks
are the steps from its ``prefill_step`` to its ``first_step`` that prefilled tokens: chunks
are taken first come first served (:class:`simwar.builder.sizes.ArrivalProcess`), so from
its first chunk on a request is the first still prefilling and takes a chunk of every step
that prefills, until its last (between two of them may come a decode step under ``sglang``,
forced by ``max_consecutive_prefill``, or under ``vllm`` a step whose decodes took the whole
token budget).

- :func:`chunk_columns`: per request its chunks, their forwards' time and the rest of its
  prefill (``Result.requests``);
- :func:`prefill_pauses`: per decode step right after a run of prefill steps while requests
  were decoding, how long the decodes paused and for what prefill (``simwar explain``).

Imports: numpy and :mod:`simwar.core.run_meta`.
"""

from __future__ import annotations

import numpy as np

from simwar.core.run_meta import RunMeta

__all__ = ["chunk_columns", "pause_words", "prefill_pauses"]


def _prefills(columns: dict, meta) -> np.ndarray:
    """Per row of the per-step table: whether the step prefilled prompt tokens
    (``meta.workload.prefill_tokens``: a ``prefill`` or ``mixed`` step that took some; under
    ``vllm`` a step whose decodes took the whole budget takes none)."""
    tokens = np.asarray((RunMeta.of(meta).workload or {}).get("prefill_tokens", []),
                        dtype=np.int64)
    steps = np.asarray(columns["step"], dtype=np.int64)
    inside = (steps >= 0) & (steps < len(tokens))
    return inside & (tokens[np.where(inside, steps, 0)] > 0 if len(tokens) else inside)


def chunk_columns(rows: dict, columns: dict, meta) -> dict[str, np.ndarray]:
    """Per request of ``rows`` (the request table's ``prefill_step``, ``first_step`` and
    ``ttft_prefill_us``): ``ttft_chunks``, the steps that prefilled its prompt,
    ``ttft_chunk_fwd_us``, their forwards summed (a mixed step's whole forward: its decodes
    too), and ``ttft_other_us``, the rest of ``ttft_prefill_us`` (other requests' chunks,
    decode steps and the gaps between forwards). A request without a chunk (no prompt under a
    mixed rule: its admission step gives its first token) has 0 chunks."""
    steps = np.asarray(columns["step"], dtype=np.int64)
    fwd = np.asarray(columns["fwd_us"], dtype=np.float64)
    chunk = _prefills(columns, meta)
    lo = np.searchsorted(steps, np.asarray(rows["prefill_step"], dtype=np.int64), side="left")
    hi = np.searchsorted(steps, np.asarray(rows["first_step"], dtype=np.int64), side="right")
    has = np.asarray(rows["prefill_step"]) >= 0
    n = np.zeros(len(lo), dtype=np.int64)
    us = np.zeros(len(lo))
    for i in np.flatnonzero(has).tolist():
        pick = chunk[lo[i]:hi[i]]
        n[i] = int(np.count_nonzero(pick))
        us[i] = float(fwd[lo[i]:hi[i]][pick].sum())
    return {"ttft_chunks": n, "ttft_chunk_fwd_us": us,
            "ttft_other_us": np.asarray(rows["ttft_prefill_us"]) - us}


def prefill_pauses(columns: dict, meta, steps: tuple[int, int] | None = None) -> dict | None:
    """The decode steps of ``steps`` (A and B included; default: every step) that waited
    behind a run of prefill steps while requests were decoding: a decode step whose previous
    step was a prefill step, with a decode step before that run, and requests that decoded
    by then and had tokens left after it (``paused``: their first token before that decode
    step, their last after it).

    Its pause is the decode forward's start less the end of the last decode forward before
    it: the time no decode ran. Per such step (``per_step``, in step order): ``step``,
    ``pause_us``, ``prefill_steps`` (the run's length), ``prefill_tokens`` (summed over the
    run), ``requests`` (those with a chunk in the run) and ``paused``; and over them ``count``,
    ``decode_steps`` (every decode step of ``steps``), ``total_us``, ``mean_us`` and the
    means of the others. None for a run with no prefill step of its own (its scheduler picked
    no shapes, or a mixed rule's: a chunk runs inside a decode step, which pauses nothing)."""
    if "shape" not in columns or not (np.asarray(columns["shape"]) == "prefill").any():
        return None
    run = RunMeta.of(meta)
    wl = run.workload or {}
    step = np.asarray(columns["step"], dtype=np.int64)
    shape = np.asarray(columns["shape"])
    start = np.asarray(columns["fwd_start_us"], dtype=np.float64)
    end = np.asarray(columns["fwd_end_us"], dtype=np.float64)
    tokens = np.asarray(wl.get("prefill_tokens", np.zeros(0)), dtype=np.int64)
    req = run.requests or {}
    first_chunk = np.asarray(req.get("prefill_step", []), dtype=np.int64)
    first_token = np.asarray(req.get("first_step", []), dtype=np.int64)
    finish = np.asarray(req.get("finish_step", []), dtype=np.int64)
    finish = np.where(finish < 0, np.iinfo(np.int64).max, finish)  # still decoding at the end
    a, b = steps if steps is not None else (int(step.min()), int(step.max()))
    decode = shape == "decode"
    rows = []
    last_decode = -1  # row of the last decode step so far
    for i in range(len(step)):
        if not decode[i]:
            continue
        prev, last_decode = last_decode, i
        if not a <= step[i] <= b:
            continue
        if prev < 0 or prev == i - 1:
            continue  # no decode before (nothing paused), or no prefill step in between
        run_lo, run_hi = int(step[prev + 1]), int(step[i - 1])  # the prefill steps
        between = shape[prev + 1:i]
        if (between != "prefill").any():
            continue
        # the requests it paused: decoding by the last decode step, with tokens left after it
        paused = int(np.count_nonzero((first_token < step[prev]) & (first_token >= 0)
                                      & (finish > step[prev])))
        if not paused:
            continue  # every request had finished: the decodes did not wait, they were done
        took = tokens[run_lo:run_hi + 1] if len(tokens) > run_hi else np.zeros(0, np.int64)
        chunked = (first_chunk >= 0) & (first_chunk <= run_hi) & (first_token >= run_lo)
        rows.append({"step": int(step[i]), "pause_us": float(start[i] - end[prev]),
                     "prefill_steps": run_hi - run_lo + 1,
                     "prefill_tokens": int(took.sum()),
                     "requests": int(np.count_nonzero(chunked)), "paused": paused})
    decodes = int(np.count_nonzero(decode & (step >= a) & (step <= b)))
    out = {"steps": [a, b], "decode_steps": decodes, "count": len(rows),
           "total_us": float(sum(r["pause_us"] for r in rows)), "per_step": rows}
    for key in ("pause_us", "prefill_steps", "prefill_tokens", "requests", "paused"):
        out[f"mean_{key}"] = (float(np.mean([r[key] for r in rows])) if rows
                              else float("nan"))
    return out


def pause_words(p: dict) -> str:
    """One decode pause in words: ``decode paused 12.4 ms for a prefill of 2048 tokens, 3
    requests (2 prefill steps; 40 requests paused)``."""
    steps, n = p["prefill_steps"], p["requests"]
    return (f"decode paused {p['pause_us'] / 1e3:.1f} ms for a prefill of "
            f"{p['prefill_tokens']} tokens, {n} request{'s' if n != 1 else ''} ({steps} "
            f"prefill step{'s' if steps != 1 else ''}; {p['paused']} requests paused)")
