"""Distributions that are clipped often: what a valid config may still get silently wrong.

Every draw of a distribution is clipped at its ``min`` (default 0: a duration is never
negative; :func:`simwar.builder.draws.sample`). A distribution that falls below ``min``
often is then not the distribution written: ``{dist: normal, mean: 10, std: 1000}`` is
clipped at 0 in half of its draws, and the durations drawn average about 404 µs, not 10.
:func:`clipping_warnings` finds each distribution of a config (durations, the noise of
affine durations, accepted tokens) clipped in more than :data:`WARN_SHARE` of its draws and
says, in one line each, the share clipped and the mean of what is drawn. Both are exact
(from the distribution, not from a run's draws), so the same config always gets the same
warnings.

The warnings are data: :func:`simwar.api.simulate` puts them on ``Result.warnings``, and
the command line prints them. Nothing here prints.

Imports: the standard library and :mod:`simwar.config.schema`.
"""

from __future__ import annotations

import math

from simwar.config.schema import Affine, Config, Dist, duration_keys

#: a distribution clipped in more than this share of its draws is warned about
WARN_SHARE = 0.01

__all__ = ["WARN_SHARE", "clipped", "clipping_warnings"]


def _phi(x: float) -> float:
    """The standard normal CDF."""
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _pdf(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def clipped(d: Dist) -> tuple[float, float, float]:
    """``(share clipped, mean of the draws after clipping, mean before)`` of ``d``.

    The share is P(X < min); the mean is E[max(X, min)], both exact for each kind (normal,
    lognormal with the mean and std of its samples, uniform, empirical).
    """
    m = float(d.min)
    if d.dist == "normal":
        mu, sd = float(d.mean), float(d.std)
        if sd == 0:
            return (1.0 if mu < m else 0.0), max(mu, m), mu
        a = (m - mu) / sd
        share = _phi(a)
        return share, m * share + mu * (1 - share) + sd * _pdf(a), mu
    if d.dist == "lognormal":
        mean, sd = float(d.mean), float(d.std)
        if m <= 0:
            return 0.0, mean, mean
        var = math.log1p((sd / mean) ** 2)
        mu, sigma = math.log(mean) - var / 2, math.sqrt(var)
        if sigma == 0:
            return (1.0 if mean < m else 0.0), max(mean, m), mean
        share = _phi((math.log(m) - mu) / sigma)
        return share, m * share + mean * _phi((mu + var - math.log(m)) / sigma), mean
    if d.dist == "uniform":
        lo, hi = float(d.low), float(d.high)
        mean = (lo + hi) / 2
        if m <= lo:
            return 0.0, mean, mean
        if m >= hi:
            return (1.0 if hi > lo or lo < m else 0.0), m, mean
        share = (m - lo) / (hi - lo)
        return share, m * share + (1 - share) * (m + hi) / 2, mean
    values = [float(v) for v in d.values]
    mean = sum(values) / len(values)
    share = sum(v < m for v in values) / len(values)
    return share, sum(max(v, m) for v in values) / len(values), mean


def _text(d: Dist) -> str:
    if d.dist in ("normal", "lognormal"):
        return f"{d.dist}(mean {d.mean:g}, std {d.std:g})"
    if d.dist == "uniform":
        return f"uniform({d.low:g}, {d.high:g})"
    return f"empirical({len(d.values)} values)"


def clipping_warnings(cfg: Config, share: float = WARN_SHARE) -> list[str]:
    """One line per distribution of ``cfg`` clipped at its min in more than ``share`` of its
    draws (see the module docstring), in the config's key order."""
    found: list[tuple[str, Dist, str]] = []
    for key, value, _ in duration_keys(cfg):
        if isinstance(value, Dist):
            found.append((key, value, "µs"))
        elif isinstance(value, Affine) and value.noise is not None:
            found.append((f"{key}.noise", value.noise, "µs"))
    if isinstance(cfg.accept.tokens, Dist):
        found.append(("accept.tokens", cfg.accept.tokens, "tokens"))
    out = []
    for key, d, unit in found:
        part, after, before = clipped(d)
        if part > share:
            out.append(f"{key}: {_text(d)} falls below its min {d.min:g} in {100 * part:.1f}% "
                       f"of its draws, which are clipped to {d.min:g}: what is drawn averages "
                       f"{after:.4g} {unit}, not {before:.4g} (raise min, or narrow the "
                       f"distribution)")
    return out
