"""The workload of a fitted config whose capture prefills: requests arriving as the
capture's did, with prompts as its carried-over runs of prefill steps show
(:func:`shape_workload`), so that the fitted config runs every shape the capture ran.

Imports: numpy and :mod:`simwar.fit.shapes` (the steps' shapes).
"""

from __future__ import annotations

import numpy as np

from simwar.fit.shapes import StepKinds


def prompt_groups(kinds: StepKinds, steps: list[int], chunk: int) -> list[tuple[int, int]]:
    """``(requests, tokens)`` of each run of steps that prefill (prefill steps of their own or
    mixed steps, whose chunks are the same queue's) whose chunks carry a request over (every
    step of the run but the last is a full chunk, ``chunk`` tokens): the requests whose
    prompts it prefilled (each step's, less the one carried in from the step before; a step
    whose range does not count its chunk's requests, as an older capture's mixed step, one)
    and their
    tokens. A run of one request gives its prompt exactly."""
    out: list[tuple[int, int]] = []
    cur = None
    for k in steps:
        if kinds.shape.get(k) not in ("prefill", "mixed") or kinds.tokens.get(k, -1) < 0:
            cur = None
            continue
        n, t = kinds.requests.get(k, 1), kinds.tokens[k]
        full = kinds.budget(k) >= chunk
        if cur is None:
            cur = [n, t]
            out.append(cur)
        else:
            cur[0] += max(0, n - 1)
            cur[1] += t
        if not full:  # the queue's prompts all prefilled: the next step starts afresh
            cur = None
    return [(max(n, 1), t) for n, t in out]


def shape_workload(kinds: StepKinds, steps: list[int], batch, accept: float, duration_us: float,
                   buckets, chunk: int) -> tuple[dict, str]:
    """``(workload, header line)``: requests arriving as the capture's did on average, so
    that the fitted config runs every shape the capture ran (its steps cannot be replayed one
    for one: a step's shape follows the simulated queue). The requests are those whose
    prompt began in a fitted step (:func:`prompt_groups` of the prefill steps; without them,
    the decode batch's growth), the rate their count over the fitted steps' time, the prompt
    a lognormal of the groups' tokens per request (their mean and spread), the output the
    decode tokens per request, plus the first."""
    groups = prompt_groups(kinds, steps, chunk)
    grown = sum(max(0, batch[k] - batch[k - 1]) for k in steps if k - 1 in batch and k in batch)
    requests = max(sum(n for n, _ in groups) or grown, 1)
    tokens = [kinds.tokens[k] for k in steps if kinds.tokens.get(k, -1) > 0]
    mean = sum(tokens) / requests if tokens else 256.0
    per = [t / n for n, t in groups]
    std = float(np.std(per)) if len(per) > 1 else 0.0
    prompt: int | dict = max(int(round(mean)), 1)
    if std > 0.05 * mean:
        prompt = {"dist": "lognormal", "mean": round(mean, 1), "std": round(std, 1)}
    decoded = sum(batch.get(k, 0) for k in steps if kinds.shape.get(k) != "prefill") * accept
    output = max(1, int(round(decoded / requests + 1)))
    rate = requests / max(duration_us, 1.0) * 1e6
    top = max([batch.get(k, 0) for k in steps] + [1])
    max_batch = top if not buckets else min(top, max(buckets))
    wl = {"arrivals": {"rate_per_s": round(rate, 3)}, "max_batch": int(max_batch),
          "initial_batch": 0, "output_tokens": output, "prompt_tokens": prompt}
    if buckets:
        wl["graph_buckets"] = list(buckets)
    shown = f"lognormal prompts (mean {mean:.0f}, std {std:.0f} tokens: the carried-over runs " \
        f"of prefill steps, per request)" if isinstance(prompt, dict) else \
        f"{prompt} prompt tokens each (their mean)"
    line = (f"Workload: requests arriving at the capture's mean rate ({requests} requests "
            f"began their prompt in the fitted steps: {rate:.1f}/s), {shown}, {output} output "
            f"tokens (their mean), max_batch {max_batch}: each run's queue picks its shapes, "
            f"so `--check` compares each shape's figures at the capture's sizes, not step for "
            f"step.")
    return wl, line


__all__ = ["prompt_groups", "shape_workload"]
