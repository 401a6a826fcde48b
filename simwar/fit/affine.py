"""A duration that follows the step's size: ``{base, per_seq}`` by least squares, a table per
graph bucket, or a constant.

A capture whose batch changes every step gives, per config key, one sample per step and the
size that step ran at (its real batch, or its graph bucket for a graph phase's device time:
which size and which step each key uses is the config's rule, ``docs/design.md``,
"Durations, sizes and draws"). :func:`fit_sized` fits ``y = base + per_seq × size`` by
ordinary least squares when the slope is significant, else the samples' distribution
as :func:`simwar.fit.durations.fit_values` does:

- **the test**: the slope's t statistic, ``per_seq / se(per_seq)``, must reach
  :data:`T_MIN` (3: two-sided p below about 0.003 for the hundreds of steps a capture holds,
  0.013 at ten) with at least two distinct sizes; samples that do not vary at all are a
  constant. An exact relation (no residual) is significant whenever its slope is not 0.
  **A falling line is never taken**: no work of a step shrinks as it holds more requests, so
  a significant negative slope says something else moved with the size during the capture
  (on the tenth H200 shapes run the host ran 1.5-2x slower for the 40 steps in which the
  batch had fallen to 1-3, and the lines fitted across them fell by up to 14 µs a request,
  carried to batch 16 as a host 2-4x too fast); the samples' distribution is taken.
- **the residual** is the ``noise``: a duration's noise draw is added on top and cannot be
  negative, so the fitted line is moved down to the smallest residual and the residuals above
  it are fitted as a distribution (``--dist``); no spread, no noise.
- **the clamp**: a what-if may ask for batches the capture never ran, so a line is made
  non-negative over every size the config can run: a line never falls, so at :data:`LOW` (0:
  a step that only prefills, in a what-if with prompts), by raising ``base``;
  :attr:`SizedFit.clamped` says by how much, and the fitted file's header says so.
- **per bucket** (:func:`fit_per_bucket`, a graph phase's device time where the config has
  graph buckets): each bucket's measured mean, not a line (``{per_bucket: {8: ..., 16: ...}}``);
  the spread around each bucket's mean is the noise, as for a line. A bucket of the
  config's ``graph_buckets`` with no sample is left out of the table (the config then refuses
  a run that reaches it, and the fit warns), or, with ``extrapolate``, filled from the line
  over the measured buckets (:attr:`SizedFit.extrapolated`).
- **what it was fitted on** (:class:`SizedFit`): n samples, the sizes seen, R² of the line,
  the t statistic, and per size the fit's mean against that size's measured mean.

Imports: numpy and :mod:`simwar.fit.durations`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from simwar.fit.durations import fit_values

#: the slope's least |t| for a duration to scale with the size
T_MIN = 3.0


@dataclass
class SizedFit:
    """One key's fit against the step's size, and what it was fitted on."""

    value: object  # a number, {dist: ...} or {base, per_seq[, noise]}
    detail: dict  # fit_values' detail (of the samples, or of the noise)
    kind: str  # "affine" | "constant"
    size: str  # "batch" | "bucket"
    n: int
    sizes: list[int]
    base: float = 0.0
    per_seq: float = 0.0
    t: float = 0.0
    r2: float = float("nan")
    #: per size: (steps, measured mean µs, the fit's mean µs)
    per_size: dict[int, tuple[int, float, float]] = field(default_factory=dict)
    #: µs added to the line's base so that it is >= 0 at every size the config can run
    clamped: float = 0.0
    #: per bucket: buckets of the config or its run with no sample in the fitted steps, and
    #: those of them the table extrapolates (the others are left out of it)
    missing: list[int] = field(default_factory=list)
    extrapolated: list[int] = field(default_factory=list)

    @property
    def left_out(self) -> list[int]:
        """The missing buckets not extrapolated: the fitted config refuses a run reaching one."""
        return [b for b in self.missing if b not in self.extrapolated]

    def worst_size_error(self) -> float:
        """The largest |fit − measured| / measured over the sizes (0 when all are 0)."""
        errs = [abs(f - m) / m for _, m, f in self.per_size.values() if m > 0]
        return max(errs, default=0.0)

    def text(self) -> str:
        """How the key was fitted, in words (for the fitted config's header)."""
        sizes = ", ".join(map(str, self.sizes[:8])) + (" ..." if len(self.sizes) > 8 else "")
        plural = {"batch": "batches", "bucket": "buckets"}.get(self.size, self.size)
        what = f"n {self.n}, {self.size if len(self.sizes) == 1 else plural} {sizes}"
        if self.kind == "per_bucket":
            means = ", ".join(f"{s}: {m:.1f}" for s, (_, m, _) in self.per_size.items())
            extra = ""
            if self.extrapolated:
                line = ("the line over the measured ones" if len(self.sizes) > 1 else
                        "the one measured bucket, as a constant")
                extra += (f"; {_plural('bucket', self.extrapolated)} in no fitted step: "
                          f"extrapolated from {line}")
            if self.left_out:
                extra += (f"; {_plural('bucket', self.left_out)} in no fitted step: not in "
                          f"the table")
            return f"per bucket, the measured mean of each ({means}; n {self.n}{extra})"
        if self.kind == "affine":
            clamp = (f"; base raised by {self.clamped:.2f} so that it is >= 0 at every batch "
                     f"the config runs" if self.clamped else "")
            t = "exact" if math.isinf(self.t) else f"slope t {self.t:.1f}"
            worst = self.worst_size_error()
            per = (f"; within {100 * worst:.1f}% of each {self.size}'s mean"
                   if len(self.per_size) > 1 else "")
            return (f"affine in the {self.size}: {self.base:.2f} + {self.per_seq:.3f} x "
                    f"{self.size} ({what}; R² {self.r2:.3f}, {t}{per}{clamp})")
        why = ("one size" if len(self.sizes) < 2 else
               f"slope not significant: |t| {abs(self.t):.1f} < {T_MIN:g}")
        return f"constant, mean {_mean(self.value):.2f} ({what}; {why})"


def _plural(word: str, sizes: list[int]) -> str:
    return f"{word}{'s' if len(sizes) > 1 else ''} {', '.join(map(str, sizes))}"


def _mean(v) -> float:
    if isinstance(v, dict):
        if "mean" in v:
            return float(v["mean"])
        if "values" in v:
            return float(np.mean(v["values"]))
        if "low" in v:
            return (float(v["low"]) + float(v["high"])) / 2
    return float(v)


def _r(v: float) -> float:
    return round(float(v), 3) + 0.0  # + 0.0: never -0.0


def _constant(y: np.ndarray, dist: str):
    if np.ptp(y) < 1e-6 * max(1.0, float(np.abs(y).max())):  # constant up to rounding
        m = _r(float(y.mean()))
        return m, {"n": len(y), "mean": m, "chosen": "constant"}
    return fit_values(np.maximum(y, 0.0), dist)


#: the smallest batch a fitted config can run: 0, a step that prefills while no request
#: decodes (a what-if may add prompts to any fitted config)
LOW = 0


def fit_sized(y, x, dist: str = "best", size: str = "batch") -> SizedFit:
    """Fit samples ``y`` (µs) against the sizes ``x`` they ran at (see the module docstring);
    a fitted line is clamped to be >= 0 from :data:`LOW` up."""
    y = np.asarray(y, dtype=float)
    x = np.asarray(x, dtype=float)
    n = len(y)
    sizes = sorted({int(v) for v in x.tolist()})
    b, a, t = 0.0, float(y.mean()) if n else 0.0, 0.0
    if len(sizes) >= 2 and n >= 3:
        xm, ym = float(x.mean()), float(y.mean())
        sxx = float(((x - xm) ** 2).sum())
        b = float(((x - xm) * (y - ym)).sum()) / sxx
        a = ym - b * xm
        r = y - (a + b * x)
        s2 = float((r ** 2).sum()) / max(1, n - 2)
        scale = max(1.0, float(np.abs(y).max()))
        if s2 <= (1e-9 * scale) ** 2:
            t = math.inf if abs(b) > 1e-9 * scale else 0.0
        else:
            t = b / math.sqrt(s2 / sxx)
    per_size = {}
    # a duration that falls as the step grows is no cost of its size: where a capture shows
    # one, something else moved with the size (the host's speed drifting during the capture
    # while the batch ran low), and a line would carry it to sizes the capture never ran
    if abs(t) < T_MIN or b < 0:
        value, detail = _constant(y, dist)
        m = _mean(value)
        for s in sizes:
            sel = x == s
            per_size[s] = (int(sel.sum()), float(y[sel].mean()), m)
        return SizedFit(value, detail, "constant", size, n, sizes, t=t, per_size=per_size)
    if a < 0 and b > 0 and a + b * 1.0 < 0:  # no negative durations at a batch of one
        b = float((x * y).sum() / (x * x).sum())
        a = 0.0
    r = y - (a + b * x)
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((r ** 2).sum()) / ss if ss > 0 else 1.0
    # the line moved down to the smallest residual, clamped so that it is never negative
    # from LOW up (it rises); the residuals above it are the noise
    floor = -b * LOW + 0.0  # + 0.0: never -0.0
    clamped = max(0.0, floor - (a + float(r.min())))
    base = max(a + float(r.min()), floor)
    noise = np.maximum(y - (base + b * x), 0.0)
    value: dict = {"base": _r(base), "per_seq": _r(b)}
    detail: dict = {"n": n, "mean": _r(float(y.mean())), "chosen": "affine"}
    if np.ptp(noise) > 1e-6 * max(1.0, float(np.abs(y).max())):
        nv, nd = fit_values(noise, dist)
        value["noise"] = nv if isinstance(nv, dict) else {"dist": "empirical",
                                                           "values": [_r(nv)]}
        detail = {**nd, "affine": True}
    elif float(noise.mean()) > 1e-9:
        value["base"] = _r(base + float(noise.mean()))
    need = -value["per_seq"] * LOW
    if value["base"] < need:  # the clamp holds for the rounded coefficients too
        value["base"] = math.ceil(need * 1000) / 1000
    extra = float(noise.mean()) if "noise" in value else 0.0  # the noise's mean, everywhere
    for s in sizes:
        sel = x == s
        fitted = float(value["base"]) + float(value["per_seq"]) * s + extra
        per_size[s] = (int(sel.sum()), float(y[sel].mean()), fitted)
    return SizedFit(value, detail, "affine", size, n, sizes, float(value["base"]),
                    float(value["per_seq"]), t, r2, per_size, clamped)


def fit_per_bucket(y, x, dist: str = "best", buckets: list[int] | None = None,
                   extrapolate: bool = False, needed=()) -> SizedFit:
    """Fit a graph phase's samples ``y`` (µs) per graph bucket ``x`` they ran at: each
    bucket's measured mean (see the module docstring). ``buckets``: the config's graph
    buckets (those without samples are ``missing``; ``extrapolate``: filled from the line
    over the measured buckets); ``needed``: buckets the fitted config's own run reaches (a
    bucket that ran only in steps the fit leaves out, the warm-up): extrapolated always.
    One bucket measured is a table of one (another bucket is refused, or extrapolated as
    that bucket's constant: no line through one point); samples that are all 0 (a phase
    without such work) are the constant 0, at every bucket."""
    y = np.asarray(y, dtype=float)
    x = np.asarray(x, dtype=float)
    sizes = sorted({int(v) for v in x.tolist()})
    scale = max(1.0, float(np.abs(y).max())) if len(y) else 1.0
    if not len(y) or float(np.abs(y).max()) < 1e-9:
        return fit_sized(y, x, dist, "bucket")
    means = {s: float(y[x == s].mean()) for s in sizes}
    mean_at = np.array([means[int(v)] for v in x.tolist()])
    r = y - mean_at
    spread = np.ptp(r) > 1e-6 * scale
    # every bucket moved down by the smallest residual; the residuals above are the noise
    low = float(r.min()) if spread else 0.0
    table = {s: max(0.0, m + low) for s, m in means.items()}
    value: dict = {}
    detail: dict = {"n": len(y), "mean": _r(float(y.mean())), "chosen": "per_bucket"}
    extra = 0.0
    if spread:
        noise = np.maximum(y - np.array([table[int(v)] for v in x.tolist()]), 0.0)
        nv, nd = fit_values(noise, dist)
        value["noise"] = nv if isinstance(nv, dict) else {"dist": "empirical",
                                                           "values": [_r(nv)]}
        detail = {**nd, "per_bucket": True}
        extra = float(noise.mean())
    xm = float(x.mean())
    sxx = float(((x - xm) ** 2).sum())
    b = float(((x - xm) * (y - y.mean())).sum()) / sxx if sxx > 0 else 0.0  # one bucket: flat
    a = float(y.mean()) - b * xm
    ss = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float((r ** 2).sum()) / ss if ss > 0 else 1.0
    missing = [int(v) for v in {*(buckets or ()), *needed} if int(v) not in means]
    missing.sort()
    done = [v for v in missing if extrapolate or v in needed]
    for s in done:  # the line over the measured buckets, moved down as they are
        table[s] = max(0.0, a + b * s + low)
    value = {"per_bucket": {s: _r(table[s]) for s in sorted(table)}, **value}
    per_size = {s: (int((x == s).sum()), means[s], value["per_bucket"][s] + extra)
                for s in sizes}
    return SizedFit(value, detail, "per_bucket", "bucket", len(y), sizes, _r(a), _r(b), 0.0,
                    r2, per_size, missing=missing, extrapolated=done)
