"""Fit duration distributions from a measured Trace, in simwar's config schema.

Samples (after warm-up):

- per phase and step, the phase's GPU time: the summed length of its kernels
  (all lanes). A capture cannot see the split into pre-replay reads, in-graph
  prep and body, so the fit writes it all as ``body_us`` with
  ``load_batch_us`` and ``prep_us`` set to 0;
- host API costs, from the ``api`` spans of an imported capture:
  ``launch_us`` (kernel launches), ``graph_launch_us``, ``event_record_us``,
  ``wait_event_us``; ``sync_wake_us`` from host syncs that really blocked
  (return minus the inferred record time); ``cross_stream_us`` from stream
  waits released by another stream's record (next op start minus the record).

Each sample set gets an empirical distribution (at most ``max_values``
evenly spaced quantiles), a normal and a lognormal fit (maximum likelihood;
the lognormal written as the mean and std of its samples, as the config
expects) and each fit's Kolmogorov–Smirnov distance. ``choose="best"`` takes
the closer of the two fits, or the empirical one when both are rejected at
the 5% level (distance above 1.36/√n).

The result's ``config`` is a partial config (``phases`` overrides by name and
``costs``): ``simwar run --costs FILE`` reads its ``costs``, and its entries
can be passed as ``--set`` overrides or merged into a sweep's base.

Imports: numpy and the standard library.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np

from ..trace import HOST, Trace
from .kineto import RECORD_CALLS, WAIT_CALLS

LAUNCH_CALLS = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaLaunchCooperativeKernel"}
GRAPH_CALLS = {"cudaGraphLaunch", "cuGraphLaunch"}
COST_CALLS = {"launch_us": LAUNCH_CALLS, "graph_launch_us": GRAPH_CALLS,
              "event_record_us": RECORD_CALLS, "wait_event_us": WAIT_CALLS}
CHOICES = ("best", "empirical", "normal", "lognormal")


@dataclass
class FitResult:
    """``config``: the partial config to write; ``details``: per key, the fits compared."""

    config: dict
    details: dict[str, dict] = field(default_factory=dict)


def phase_samples(trace: Trace, from_step: int = 0) -> dict[str, list[float]]:
    """Per phase (in first-seen order): GPU µs per step."""
    per: dict[str, dict[int, float]] = {}
    for op in trace.ops:
        if op.kind == "kernel" and op.phase and op.step >= from_step:
            per.setdefault(op.phase, defaultdict(float))[op.step] += op.end_us - op.start_us
    return {phase: [steps[k] for k in sorted(steps)] for phase, steps in per.items()}


def cost_samples(trace: Trace, from_step: int = 0) -> dict[str, list[float]]:
    out: dict[str, list[float]] = defaultdict(list)
    for s in trace.spans:
        if s.lane == HOST and s.kind == "api" and s.step >= from_step:
            for key, names in COST_CALLS.items():
                if s.label in names:
                    out[key].append(s.end_us - s.start_us)
    by_id = {op.op_id: op for op in trace.ops}
    for op in trace.ops:
        if op.step < from_step or op.bound < 0:
            continue
        rec = by_id[op.bound]
        if op.kind == "sync" and rec.end_us > op.start_us and op.end_us >= rec.end_us:
            out["sync_wake_us"].append(op.end_us - rec.end_us)
        elif (op.kind == "wait" and rec.lane != op.lane and op.end_us > op.start_us
              and op.end_us >= rec.end_us > op.start_us):
            out["cross_stream_us"].append(op.end_us - rec.end_us)
    return dict(out)


def fit_values(values, choose: str = "best", max_values: int = 200) -> tuple:
    """``(duration, detail)``: a number or ``{dist: ...}`` mapping, and the fits compared."""
    if choose not in CHOICES:
        raise ValueError(f"choose: '{choose}' is not one of {', '.join(CHOICES)}")
    x = np.sort(np.asarray(values, dtype=float))
    n = len(x)
    mean = float(x.mean())
    detail: dict = {"n": n, "mean": _r(mean), "p50": _r(float(np.median(x)))}
    if n < 2 or float(x.std()) == 0.0:
        detail["chosen"] = "constant"
        return _r(mean), detail
    std = float(x.std(ddof=1))
    fits = {"empirical": {"dist": "empirical", "values": _quantiles(x, max_values)},
            "normal": {"dist": "normal", "mean": _r(mean), "std": _r(std)}}
    ks = {"normal": _ks(x, lambda v: _phi((v - mean) / std))}
    if x[0] > 0:
        logs = np.log(x)
        mu, s = float(logs.mean()), float(logs.std(ddof=1))
        if s > 0:
            fits["lognormal"] = {"dist": "lognormal", "mean": _r(math.exp(mu + s * s / 2)),
                                 "std": _r(math.exp(mu + s * s / 2) * math.sqrt(math.expm1(s * s)))}
            ks["lognormal"] = _ks(x, lambda v: _phi((np.log(v) - mu) / s))
    detail.update({"std": _r(std), "ks": {k: round(v, 4) for k, v in ks.items()},
                   "ks_critical": round(1.36 / math.sqrt(n), 4),
                   "fits": {k: v for k, v in fits.items() if k != "empirical"}})
    if choose == "best":
        name = min(ks, key=ks.get)
        if ks[name] > 1.36 / math.sqrt(n):
            name = "empirical"
    else:
        name = choose if choose in fits else "empirical"
    detail["chosen"] = name
    return fits[name], detail


def fit_durations(trace: Trace, choose: str = "best", max_values: int = 200) -> FitResult:
    """Fit every phase's GPU time and every host cost that has samples."""
    warm = int(trace.meta.get("warmup_steps", 0))
    result = FitResult(config={})
    phases = []
    for phase, values in phase_samples(trace, warm).items():
        body, detail = fit_values(values, choose, max_values)
        result.details[f"phases.{phase}.body_us"] = detail
        phases.append({"name": phase, "load_batch_us": 0.0, "prep_us": 0.0, "body_us": body})
    if phases:
        result.config["phases"] = phases
    costs = {}
    for key, values in sorted(cost_samples(trace, warm).items()):
        if len(values) >= 3:
            costs[key], result.details[f"costs.{key}"] = fit_values(values, choose, max_values)
    if costs:
        result.config["costs"] = costs
    return result


def _quantiles(x: np.ndarray, m: int) -> list[float]:
    if len(x) > m:
        x = np.quantile(x, (np.arange(m) + 0.5) / m)
    return [_r(float(v)) for v in x]


def _ks(x: np.ndarray, cdf) -> float:
    n = len(x)
    f = np.clip(np.asarray(cdf(x), dtype=float), 0.0, 1.0)
    i = np.arange(1, n + 1)
    return float(max(np.max(i / n - f), np.max(f - (i - 1) / n)))


def _phi(z):
    return 0.5 * (1.0 + np.vectorize(math.erf)(np.asarray(z) / math.sqrt(2.0)))


def _r(v: float) -> float:
    return round(float(v), 3)
