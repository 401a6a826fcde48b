"""Overlap on or off: one config's requests across load and forward time, both loops.

:func:`on_off_grid` runs a config with requests (``workload.arrivals`` at a rate) at each
arrival rate and each scale of its forward (every phase's device time times the scale: a
bigger or smaller model on the same host), once with SGLang's overlap loop and once with its
normal loop (``policy.overlap``), and tabulates what users compare: TTFT (to the host), TPOT,
requests/s and the step time, each on and off, and the relative difference of on over off.
The same seed for both loops: the same requests arrive, so the difference is the loop's.

Imports: pandas, :mod:`simwar.api` and :mod:`simwar.config`.
"""

from __future__ import annotations

import pandas as pd

from simwar.api import simulate
from simwar.config import Config, ConfigError, load_config

#: the figures compared, summary key -> column stem
FIGURES = {"request_ttft_us_mean": "ttft_us", "request_tpot_us_mean": "tpot_us",
           "requests_per_s": "requests_per_s", "step_us_mean": "step_us"}
PHASE_KEYS = ("load_batch_us", "prep_us", "body_us")


def _scaled(d, f: float):
    """A duration times ``f`` (a number, an affine line's coefficients or per-bucket table, a
    distribution's location and spread; noise is kept)."""
    if isinstance(d, (int, float)):
        return d * f
    d = dict(d)
    if "dist" in d:
        for key in ("mean", "std", "low", "high"):
            if key in d:
                d[key] = d[key] * f
        if "values" in d:
            d["values"] = [v * f for v in d["values"]]
        return d
    for key in ("base", "per_seq", "per_token"):
        if key in d:
            d[key] = d[key] * f
    if d.get("per_bucket") is not None:
        d["per_bucket"] = {b: v * f for b, v in d["per_bucket"].items()}
    return d


def scaled_forward(cfg: Config, factor: float) -> dict:
    """The ``phases`` override that scales every phase's device time by ``factor``."""
    out = []
    for p in cfg.model_dump(mode="json")["phases"]:
        out.append({**p, **{k: _scaled(p[k], factor) for k in PHASE_KEYS}})
    return {"algorithm": "custom", "phases": out}


def on_off_grid(cfg, rates: list[float], scales: list[float], overrides=None) -> pd.DataFrame:
    """One row per (rate, scale): each figure of :data:`FIGURES` on and off
    (``<figure>_on``, ``<figure>_off``) and ``<figure>_change`` = on / off - 1, with the
    forward's mean length at that scale (``fwd_us``, overlap on)."""
    cfg = load_config(cfg, overrides)
    wl = cfg.workload
    if wl is None or wl.source != "arrivals" or wl.arrivals.rate_per_s is None:
        raise ConfigError("on/off grid: needs requests arriving at a rate (workload.arrivals."
                          "rate_per_s), whose rate it varies")
    base = cfg.model_dump(mode="json")
    rows = []
    for scale in scales:
        phases = scaled_forward(cfg, scale)
        for rate in rates:
            row = {"rate_per_s": float(rate), "scale": float(scale)}
            for on in (True, False):
                s = simulate(base, {**phases, "workload.arrivals.rate_per_s": float(rate),
                                    "policy.overlap": on}).summary
                tag = "on" if on else "off"
                for key, col in FIGURES.items():
                    row[f"{col}_{tag}"] = s[key]
                if on:
                    row["fwd_us"] = s["fwd_us_mean"]
            for col in FIGURES.values():
                row[f"{col}_change"] = row[f"{col}_on"] / row[f"{col}_off"] - 1
            rows.append(row)
    return pd.DataFrame(rows)


__all__ = ["FIGURES", "on_off_grid", "scaled_forward"]
