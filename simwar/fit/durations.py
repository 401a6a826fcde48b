"""Fit duration distributions from a measured Trace, in simwar's config schema.

Samples (after warm-up):

- per phase and step, the phase's GPU time: the summed length of its kernels
  (all lanes). A capture cannot see the split into pre-replay reads, in-graph
  prep and body, so the fit writes it all as ``body_us`` with
  ``load_batch_us`` and ``prep_us`` set to 0;
- host API costs, from the host spans by their typed call kind
  (``spans.call``): ``launch_us`` from launches (an imported capture's
  memcpy/memset calls that issued device work are launches too),
  ``graph_launch_us`` from graph launches, ``event_record_us`` from event
  records, ``wait_event_us`` from stream waits on an event;
- from the bound ops (``ops.bound``): ``sync_wake_us`` from host syncs that
  really blocked (return minus the bound record's firing) and
  ``cross_stream_us`` from stream waits released by a record on another
  stream (release minus the record's firing).

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

from simwar.core.trace import Call, OpKind, Trace

#: host cost key -> the call kind whose spans sample it
COST_CALLS = {"launch_us": Call.LAUNCH, "graph_launch_us": Call.GRAPH_LAUNCH,
              "event_record_us": Call.RECORD, "wait_event_us": Call.WAIT_EVENT}
CHOICES = ("best", "empirical", "normal", "lognormal")


@dataclass
class FitResult:
    """``config``: the partial config to write; ``details``: per key, the fits compared."""

    config: dict
    details: dict[str, dict] = field(default_factory=dict)


def phase_samples(trace: Trace, from_step: int = 0) -> dict[str, list[float]]:
    """Per phase (in first-seen order): GPU µs per step."""
    ops = trace.ops
    pick = np.flatnonzero((ops.kind == OpKind.KERNEL) & (ops.phase != trace.code(""))
                          & (ops.step >= from_step))
    per: dict[str, dict[int, float]] = {}
    for code, step, dur in zip(ops.phase[pick].tolist(), ops.step[pick].tolist(),
                               (ops.end_us[pick] - ops.start_us[pick]).tolist()):
        per.setdefault(trace.text(code), defaultdict(float))[step] += dur
    return {phase: [steps[k] for k in sorted(steps)] for phase, steps in per.items()}


def cost_samples(trace: Trace, from_step: int = 0) -> dict[str, list[float]]:
    """Host-cost samples by config key (see the module docstring)."""
    out: dict[str, list[float]] = {}
    spans = trace.spans
    later = spans.step >= from_step
    for key, call in COST_CALLS.items():
        pick = later & (spans.call == call)
        if pick.any():
            out[key] = (spans.end_us[pick] - spans.start_us[pick]).tolist()
    ops = trace.ops
    bound = np.flatnonzero((ops.step >= from_step) & (ops.bound >= 0))
    rec = ops.bound[bound]
    fired = ops.end_us[rec]
    start, end = ops.start_us[bound], ops.end_us[bound]
    kind = ops.kind[bound]
    sync = (kind == OpKind.SYNC) & (fired > start) & (end >= fired)
    cross = ((kind == OpKind.WAIT) & (ops.lane[rec] != ops.lane[bound]) & (end > start)
             & (end >= fired) & (fired > start))
    for key, pick in (("sync_wake_us", sync), ("cross_stream_us", cross)):
        if pick.any():
            out[key] = (end[pick] - fired[pick]).tolist()
    return out


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


def shift(value, us: float):
    """A duration (a config value) plus ``us`` µs: a number, a distribution moved as a whole,
    an affine line's base (or a prompt-token line's), or every entry of a per-bucket table.
    A value that is no duration is a :class:`TypeError`. (``simwar import --check --add``
    and the check's profiler cost.)"""
    if isinstance(value, bool) or value is None:
        raise TypeError("not a duration")
    if isinstance(value, (int, float)):
        return float(value) + us
    if not isinstance(value, dict):
        raise TypeError("not a duration")
    d = {k: v for k, v in value.items() if v is not None}
    if d.get("per_bucket") is not None:
        d["per_bucket"] = {b: v + us for b, v in d["per_bucket"].items()}
        return d
    if "dist" not in d:
        if "base" not in d:
            raise TypeError("not a duration")
        d["base"] = d["base"] + us
        return d
    if d["dist"] in ("normal", "lognormal"):
        d["mean"] = d["mean"] + us
    elif d["dist"] == "uniform":
        d["low"], d["high"] = d["low"] + us, d["high"] + us
    else:
        d["values"] = [v + us for v in d["values"]]
    return d


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
