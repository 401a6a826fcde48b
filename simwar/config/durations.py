"""Durations and accepted tokens: what a config's timed keys and ``accept.tokens`` may be.

Every duration is a number of microseconds, a distribution ``{dist: normal|lognormal|
uniform|empirical, ...}`` (:class:`Dist`; the builder draws each one per use from the run's
single generator), an affine function of the step's batch ``{base, per_seq, per_token,
noise}``, or, for a duration sized by the graph bucket, a table of µs per bucket
``{per_bucket: {8: 1682, 16: 1726}, noise}`` (both :class:`Affine`; which batch each duration
uses: :func:`simwar.config.schema.duration_keys`). :data:`Duration` is that choice as a field type;
:class:`Accept` holds the accepted tokens per request per step.

Imports: pydantic and :mod:`simwar.config.base`.
"""

import math
from typing import Annotated, Any, Literal, Union

from pydantic import BeforeValidator, Field, ValidationError, field_validator, model_validator
from typing_extensions import TypeAliasType

from simwar.config.base import StrictModel, first_error


class Dist(StrictModel):
    """A duration distribution in microseconds; samples are clipped at ``min`` (default 0)."""

    dist: Literal["normal", "lognormal", "uniform", "empirical"]
    """The distribution: normal and lognormal need mean and std, uniform low and high,
    empirical values (drawn with equal odds)."""
    mean: float | None = None
    """The mean of a normal or lognormal (µs, >= 0; > 0 for a lognormal)."""
    std: float | None = Field(default=None, ge=0)
    """The standard deviation of a normal or lognormal (µs)."""
    low: float | None = None
    """The lower end of a uniform (µs, >= 0)."""
    high: float | None = None
    """The upper end of a uniform (µs, >= low)."""
    values: list[float] | None = None
    """The values an empirical distribution draws from, with equal odds (µs, >= 0)."""
    min: float = Field(default=0.0, ge=0)
    """Draws below it are clipped to it, which moves the mean (default 0: a duration is
    never negative); a distribution clipped in more than 1% of its draws gets a warning."""

    @model_validator(mode="after")
    def _check(self) -> "Dist":
        need = {"normal": ("mean", "std"), "lognormal": ("mean", "std"),
                "uniform": ("low", "high"), "empirical": ("values",)}[self.dist]
        for key in need:
            if getattr(self, key) is None:
                raise ValueError(f"dist {self.dist} needs '{key}'")
        if self.dist in ("normal", "lognormal") and self.mean < 0:
            raise ValueError("mean must be >= 0 (a duration)")
        if self.dist == "lognormal" and self.mean == 0:
            raise ValueError("lognormal needs mean > 0")
        if self.dist == "uniform" and not (0 <= self.low <= self.high):
            raise ValueError("uniform needs 0 <= low <= high")
        if self.dist == "empirical" and (not self.values or min(self.values) < 0):
            raise ValueError("empirical needs a non-empty list of values >= 0")
        return self


class Affine(StrictModel):
    """A duration that scales with the step: ``base + per_seq * size + per_token * size *
    accepted tokens``, plus a ``noise`` draw (a :class:`Dist`) on top.

    ``size`` is the step's batch, padded to its graph bucket for the ``prep_us`` and
    ``body_us`` of graph phases; ``accepted tokens`` the step's accepted tokens per request
    (which step each key uses: :func:`duration_keys`). A negative result for a batch the
    run can have is an error naming the key and the batch.

    ``per_bucket`` replaces the line by a table: the µs at each graph bucket (a graph phase's
    ``prep_us`` and ``body_us`` only, whose size is the bucket), as a capture measures them
    at the buckets it ran; a bucket the run reaches and the table lacks is an error naming
    the key and the bucket.
    """

    # the table is a form of this class, not a class of its own, so that every place that
    # evaluates, draws, traces or checks an affine duration does the same for a table

    base: float = 0.0
    """The duration at size 0 (µs)."""
    per_seq: float = 0.0
    """µs added per request of the step's size (its batch, or graph bucket)."""
    per_token: float = 0.0
    """µs added per request per accepted token of the step."""
    noise: Dist | None = None
    """A distribution {dist: ...} drawn per use and added on top."""
    per_bucket: dict[int, float] | None = None
    """µs at each graph bucket ({8: 1682, 16: 1726, 32: 1950}) instead of base, per_seq and
    per_token: for a duration sized by the graph bucket (a graph phase's prep_us and
    body_us); a bucket the run reaches and the table lacks is an error."""

    @field_validator("base", "per_seq", "per_token", mode="before")
    @classmethod
    def _number(cls, v: Any) -> Any:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"expected a number of µs, got {v!r}")
        return v

    @field_validator("noise", mode="before")
    @classmethod
    def _noise(cls, v: Any) -> Any:
        if v is not None and not isinstance(v, (dict, Dist)):
            raise ValueError(f"expected a distribution {{dist: ...}}, got {v!r}")
        return v

    @field_validator("per_bucket", mode="before")
    @classmethod
    def _table(cls, v: Any) -> Any:
        if v is None:
            return v
        if not isinstance(v, dict) or not v:
            raise ValueError(f"per_bucket: expected a mapping of graph bucket: µs "
                             f"({{8: 1682, 16: 1726}}), got {v!r}")
        out = {}
        for b, us in v.items():
            size = int(b) if isinstance(b, str) and b.strip().isdigit() else b
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"per_bucket: a bucket is a batch size >= 1, got {b!r}")
            if isinstance(us, bool) or not isinstance(us, (int, float)) \
                    or not math.isfinite(us) or us < 0:
                raise ValueError(f"per_bucket.{size}: expected a number of µs >= 0, got {us!r}")
            out[size] = float(us)
        return dict(sorted(out.items()))

    @model_validator(mode="after")
    def _one_form(self) -> "Affine":
        if self.per_bucket is not None and (self.base or self.per_seq or self.per_token):
            raise ValueError("per_bucket: a table per bucket replaces base, per_seq and "
                             "per_token (give one or the other)")
        return self

    def value(self, size, tokens=1.0):
        """The deterministic part at ``size`` (scalars or numpy arrays), without noise; a
        per-bucket table gives NaN at a size it lacks (the error names them:
        :func:`simwar.config.schema.affine_error`)."""
        if self.per_bucket is None:
            return self.base + self.per_seq * size + self.per_token * size * tokens
        if isinstance(size, (int, float)):
            return self.per_bucket.get(int(size), math.nan) if size == int(size) else math.nan
        import numpy as np  # lazy: loading a config needs no numpy

        keys = np.fromiter(self.per_bucket, dtype=float, count=len(self.per_bucket))
        vals = np.fromiter(self.per_bucket.values(), dtype=float, count=len(self.per_bucket))
        size = np.asarray(size, dtype=float)
        i = np.minimum(np.searchsorted(keys, size), len(keys) - 1)
        return np.where(keys[i] == size, vals[i], np.nan)

    def text(self) -> str:
        if self.per_bucket is not None:
            return "per_bucket {" + ", ".join(f"{b}: {v:g}" for b, v in
                                              self.per_bucket.items()) + "}"
        parts = [f"base {self.base:g}"]
        if self.per_seq:
            parts.append(f"per_seq {self.per_seq:g}")
        if self.per_token:
            parts.append(f"per_token {self.per_token:g}")
        return ", ".join(parts)


#: keys that make a mapping an affine duration (a mapping with ``dist`` is a distribution)
AFFINE_KEYS = ("base", "per_seq", "per_token", "noise", "per_bucket")


def _duration(v: Any) -> Any:
    if isinstance(v, (Dist, Affine)):
        return v
    if isinstance(v, dict):
        cls = Affine if "dist" not in v and any(k in v for k in AFFINE_KEYS) else Dist
        try:
            return cls(**v)
        except ValidationError as e:
            raise ValueError(first_error(e)) from None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number of µs, {{dist: ...}}, {{base: ..., per_seq: "
                         f"...}} or {{per_bucket: ...}}, got {v!r}")
    if v < 0:
        raise ValueError(f"a duration must be >= 0 µs, got {v}")
    return float(v)


# Named types (TypeAliasType): pydantic generates a named type's schema once, as a
# definition the fields refer to, where an Annotated alias is generated again for each of the
# ~60 fields that take a duration (the config validator's generation 14.5 to about 12 ms);
# the same validation and errors (the one-line corpus of tests/test_bad_inputs.py)
Duration = TypeAliasType("Duration",
                         Annotated[Union[float, Dist, Affine], BeforeValidator(_duration)])


RankDuration = TypeAliasType("RankDuration",
                             Annotated[Union[float, Dist], BeforeValidator(_duration)])


#: a decode step yields at least one token per request (the one it verifies, or the only
#: one without speculation): the fewest accepted tokens a step can have
MIN_TOKENS = 1.0


def _tokens(v: Any) -> Any:
    """``accept.tokens``: a number >= 1, a distribution whose every draw is >= 1, or a
    non-empty per-step list of numbers >= 1."""
    if isinstance(v, Dist):
        return _token_dist(v)
    if isinstance(v, dict):
        try:
            return _token_dist(Dist(**v))
        except ValidationError as e:
            raise ValueError(first_error(e)) from None
    if isinstance(v, (list, tuple)):
        if not v:
            raise ValueError("empty list (give one accepted-token count per step, or a "
                             "number)")
        for i, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not x >= MIN_TOKENS:
                raise ValueError(f"item {i}: accepted tokens per request must be a number >= 1 "
                                 f"(a step yields at least one token per request), got {x!r}")
        return [float(x) for x in v]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ValueError(f"expected a number >= 1, a per-step list or {{dist: ...}}, got {v!r}")
    if not v >= MIN_TOKENS:
        raise ValueError(f"expected at least 1 accepted token per request (a step yields at "
                         f"least one: the one it verifies), got {v!r}")
    return float(v)


def _token_dist(d: Dist) -> Dist:
    """A distribution of accepted tokens: every draw (clipped at ``min``) must be >= 1."""
    lowest = (d.low if d.dist == "uniform" else min(d.values) if d.dist == "empirical"
              else -math.inf)
    if max(lowest, d.min) < MIN_TOKENS:
        fix = ("give min: 1 (draws below it are clipped to it)" if d.dist in ("normal", "lognormal")
               else f"give {'low' if d.dist == 'uniform' else 'values'} >= 1 or min: 1")
        raise ValueError(f"{d.dist}: accepted tokens can fall below 1 (a step yields at least "
                         f"one token per request); {fix}")
    return d


class Accept(StrictModel):
    """Accepted tokens per request per step: a number, a per-step list (cycled) or a
    distribution drawn once per step (clipped at its ``min``)."""

    tokens: Annotated[Union[float, Dist, list[float]], BeforeValidator(_tokens)] = 1.0
    """Accepted tokens per request per step (>= 1): a number, a per-step list (cycled) or a
    distribution {dist: ...} drawn once per step; they feed tokens/s and per_token
    durations."""

    @property
    def varies(self) -> bool:
        return not isinstance(self.tokens, float)
