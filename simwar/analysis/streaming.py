"""A run's summary computed chunk by chunk, without keeping the per-step table.

:class:`StreamingSummary` takes the per-step columns a few thousand rows at a time (as
:func:`simwar.analysis.metrics.columns_from_arrays` makes them) and gives the summary of
:mod:`simwar.analysis.summary`'s spec, the keys of :func:`simwar.analysis.metrics.summarize`
in its order:

- counts, the launch-ahead histogram and its mean, and the run-ahead fraction are exact;
- means and sums are running sums of each chunk's (pairwise) sum: equal to the table's to
  about 1e-15 relative (the summation order differs);
- quantiles (``step_us_p50``, ``step_us_p99``, ``fwd_gap_us_p50``, ``launch_lead_us_p50``)
  come from :class:`QuantileSketch`. While a column has at most ``exact_limit`` (4096)
  distinct values, as a constant or few-valued config has, it counts each value and gives
  numpy's ``linear`` percentile (and median) exactly, with numpy's arithmetic (the sign of
  a zero aside). Beyond that, values are counted in logarithmic buckets whose
  representative is within ``alpha`` (1e-4) relative of every value in it (the DDSketch
  construction): a quantile is then within ``alpha`` relative of the order statistics it
  interpolates between. ``benchmarks/bench_fast.py quantiles`` measures the error.

Imports: numpy, the analysis' metrics and spec, and the run record
(:mod:`simwar.core.run_meta`).
"""

from __future__ import annotations

import math

import numpy as np

from simwar.analysis.metrics import (
    first_tokens,
    hazard_counts,
    numpy_lerp,
    numpy_percentile,
    request_columns,
)
from simwar.analysis.summary import (
    BUCKET_METRICS,
    REQUEST_KEYS,
    SHAPE_KEYS,
    SLO_KEYS,
    WORKLOAD_KEYS,
    Key,
    assemble,
    measured_mask,
    step_keys,
)
from simwar.core.run_meta import RunMeta


class QuantileSketch:
    """Quantiles of a stream of floats, exact for few distinct values (see the module doc)."""

    def __init__(self, alpha: float = 1e-4, exact_limit: int = 4096):
        self.alpha = alpha
        self.exact_limit = exact_limit
        self.gamma = (1 + alpha) / (1 - alpha)
        self.log_gamma = math.log(self.gamma)
        self.exact: dict[float, int] | None = {}
        self.pos: dict[int, int] = {}
        self.neg: dict[int, int] = {}
        self.zero = 0
        self.nan = 0
        self.n = 0
        self.lo = math.inf
        self.hi = -math.inf

    def add(self, x: np.ndarray) -> None:
        x = np.asarray(x, dtype=np.float64)
        nan = np.isnan(x)
        if nan.any():
            self.nan += int(np.count_nonzero(nan))
            x = x[~nan]
        if not len(x):
            return
        self.n += len(x)
        self.lo = min(self.lo, float(x.min()))
        self.hi = max(self.hi, float(x.max()))
        if self.exact is not None:
            values, counts = np.unique(x, return_counts=True)
            for v, c in zip(values.tolist(), counts.tolist()):
                self.exact[v] = self.exact.get(v, 0) + c
            if len(self.exact) <= self.exact_limit:
                return
            exact, self.exact = self.exact, None
            x = np.array(list(exact), dtype=np.float64)
            self._bucket(x, np.array(list(exact.values()), dtype=np.int64))
            return
        self._bucket(x, None)

    def _bucket(self, x: np.ndarray, counts: np.ndarray | None) -> None:
        if counts is None:
            counts = np.ones(len(x), dtype=np.int64)
        zero = x == 0
        self.zero += int(counts[zero].sum())
        for store, sel in ((self.pos, x > 0), (self.neg, x < 0)):
            if not sel.any():
                continue
            idx = np.ceil(np.log(np.abs(x[sel])) / self.log_gamma).astype(np.int64)
            keys, inverse = np.unique(idx, return_inverse=True)
            sums = np.bincount(inverse, weights=counts[sel]).astype(np.int64)
            for k, c in zip(keys.tolist(), sums.tolist()):
                store[k] = store.get(k, 0) + c

    def _sorted(self) -> tuple[np.ndarray, np.ndarray]:
        """(values, counts) ascending: exact values, or bucket representatives."""
        if self.exact is not None:
            values = np.array(sorted(self.exact), dtype=np.float64)
            return values, np.array([self.exact[v] for v in values.tolist()], dtype=np.int64)
        g = self.gamma
        neg = sorted(self.neg, reverse=True)
        pos = sorted(self.pos)
        values = ([-2 * g ** k / (g + 1) for k in neg] + ([0.0] if self.zero else [])
                  + [2 * g ** k / (g + 1) for k in pos])
        counts = [self.neg[k] for k in neg] + ([self.zero] if self.zero else []) + \
            [self.pos[k] for k in pos]
        values = np.array(values, dtype=np.float64)
        # the extremes are known exactly
        values[0], values[-1] = self.lo, self.hi
        return values, np.array(counts, dtype=np.int64)

    def quantile(self, q: float, median: bool = False) -> float:
        """numpy's ``percentile(values, q)`` (``linear``), or ``median(values)``; NaN if a
        value was NaN or none was added. Exact in exact mode, else within ``alpha``."""
        if self.nan or self.n == 0:
            return float("nan")
        values, counts = self._sorted()
        cum = np.cumsum(counts)
        if self.exact is not None:
            def at(i):  # the i-th smallest value
                return float(values[np.searchsorted(cum, i, side="right")])
            return _numpy_median(at, self.n) if median else numpy_percentile(at, self.n, q)
        rank = (50 if median else q) / 100 * (self.n - 1)
        i = int(math.floor(rank))
        j = min(i + 1, self.n - 1)
        a = float(values[np.searchsorted(cum, i, side="right")])
        b = float(values[np.searchsorted(cum, j, side="right")])
        return numpy_lerp(a, b, rank - i)


def _numpy_median(at, n: int) -> float:
    """``numpy.median``: the middle value, or the mean of the two middle ones."""
    if n % 2:
        return at(n // 2)
    return (0.0 + at(n // 2 - 1) + at(n // 2)) / 2


class StreamingSummary:
    """The summary of :mod:`simwar.analysis.summary`'s spec from column chunks.

    Each key's statistic is kept as the chunks come (``_STREAM``: running sums, quantile
    sketches, counts; per column, shared by the keys that use it) and evaluated at the end.
    """

    def __init__(self, meta: dict, alpha: float = 1e-4):
        self.meta = meta  # as the run wrote it, for the summary's copied keys
        self.run = RunMeta.from_meta(meta)
        self.alpha = alpha
        self.warm = self.run.warmup_steps
        self.measured = 0
        self.first = self.last = None  # the measured steps' range
        self.columns: list[str] | None = None
        self.keys: list[Key] = []
        self.acc: dict[tuple, object] = {}  # (statistic's accumulator, column, valid) -> it
        self.requests = self.run.requests
        if self.requests is not None:
            finish = np.asarray(self.requests["finish_step"], dtype=np.int64)
            self.req_order = np.argsort(finish, kind="stable")
            self.req_finish = finish[self.req_order]
            self.req_first = first_tokens(self.requests, np.zeros(0, dtype=np.int64),
                                      np.zeros(0), None)

    def _start(self, cols: dict) -> None:
        self.columns = list(cols)
        keys = step_keys(self.columns)
        if self.run.workload:
            keys += WORKLOAD_KEYS
            if "shape" in self.run.workload:
                keys += SHAPE_KEYS
            if self.requests is not None:
                keys += REQUEST_KEYS
                if self.run.slo:
                    keys += SLO_KEYS
        self.keys = keys
        for key in keys:
            for acc in _STREAM[key.stat].needs(key):
                if acc not in self.acc:
                    self.acc[acc] = _ACCUMULATORS[acc[0]](self)

    def add(self, cols: dict) -> None:
        """Rows of the per-step table (a mapping of equal-length numpy columns)."""
        if "step_us" not in cols:
            return
        if self.columns is None:
            self._start(cols)
        if self.requests is not None:  # first tokens of any step (the warm-up's too)
            first_tokens(self.requests, cols["step"], cols["fwd_end_us"],
                         cols.get("result_done_us"), into=self.req_first)
        keep = measured_mask(cols["step"], cols["step_us"], self.warm)
        if not keep.any():
            return
        m = {name: col[keep] for name, col in cols.items()}
        self.measured += len(m["step"])
        lo, hi = int(m["step"].min()), int(m["step"].max())
        self.first = lo if self.first is None else min(self.first, lo)
        self.last = hi if self.last is None else max(self.last, hi)
        if self.requests is not None:
            m.update(self._requests(m))
        valid: dict[str, np.ndarray] = {}
        for (_, column, is_valid), acc in self.acc.items():
            x = m[column]
            if is_valid:
                if column not in valid:
                    valid[column] = x[~np.isnan(x)]
                x = valid[column]
            acc.add(x, m)

    def _requests(self, m: dict) -> dict:
        """The per-request columns of the requests finished in these rows."""
        steps = m["step"]
        slo = self.run.slo
        lo = np.searchsorted(self.req_finish, steps.min(), side="left")
        hi = np.searchsorted(self.req_finish, steps.max(), side="right")
        pick = np.sort(self.req_order[lo:hi])  # in request order, as the table's summary
        req = {k: np.asarray(v)[pick] for k, v in self.requests.items()}
        first = (self.req_first[0][pick], self.req_first[1][pick])
        return request_columns(req, steps if hi > lo else steps[:0], m["fwd_end_us"], first,
                               slo)

    def result(self, hazards=None) -> dict:
        meta, name = self.meta, self.run.name
        if not self.measured:
            return assemble(name, 0, self.columns or [], meta, None, {})

        def value(key: Key):
            return _STREAM[key.stat].value(self, key)

        counts = hazard_counts(hazards, range(self.first, self.last + 1))
        return assemble(name, self.measured, self.columns, meta, value, counts)

    def get(self, kind: str, column: str, valid: bool = False):
        return self.acc[(kind, column, valid)]


# --------------------------------------------------------------------------- accumulators
class _Sum:
    """Running sum and count of the values that are not NaN (NaN added as zero)."""

    __slots__ = ("total", "count")

    def __init__(self, owner=None) -> None:
        self.total = 0.0
        self.count = 0

    def add(self, x: np.ndarray, m: dict | None = None) -> None:
        x = np.asarray(x, dtype=np.float64)
        nan = np.isnan(x)
        if nan.any():
            x = np.where(nan, 0.0, x)
        self.total += float(x.sum())
        self.count += len(x) - int(np.count_nonzero(nan))

    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")


class _Sketch(QuantileSketch):
    def __init__(self, owner) -> None:
        super().__init__(owner.alpha)

    def add(self, x: np.ndarray, m: dict | None = None) -> None:
        super().add(x)


class _Positive:
    __slots__ = ("positive", "n")

    def __init__(self, owner=None) -> None:
        self.positive = 0
        self.n = 0

    def add(self, x: np.ndarray, m: dict | None = None) -> None:
        self.positive += int(np.count_nonzero(x > 0))
        self.n += len(x)


class _CountAccumulator:
    """How often each value occurs."""

    __slots__ = ("counts",)

    def __init__(self, owner=None) -> None:
        self.counts: dict[int, int] = {}

    def add(self, x: np.ndarray, m: dict | None = None) -> None:
        values, counts = np.unique(x, return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist()):
            self.counts[int(v)] = self.counts.get(int(v), 0) + c


class _Buckets:
    """Per value of the column: a :class:`_Sum` of each of the bucket metrics."""

    def __init__(self, owner=None) -> None:
        self.sums: dict[int, dict[str, _Sum]] = {}

    def add(self, x: np.ndarray, m: dict) -> None:
        for b in np.unique(x).tolist():
            rows = x == b
            sums = self.sums.setdefault(int(b), {c: _Sum() for c in BUCKET_METRICS})
            for c in BUCKET_METRICS:
                sums[c].add(m[c][rows])


class _Shares:
    """Per value of a column of names: its rows, and the sum of their step times."""

    def __init__(self, owner=None) -> None:
        self.rows: dict[str, int] = {}
        self.time: dict[str, _Sum] = {}

    def add(self, x: np.ndarray, m: dict) -> None:
        for name in np.unique(x).tolist():
            pick = x == name
            self.rows[name] = self.rows.get(name, 0) + int(np.count_nonzero(pick))
            self.time.setdefault(name, _Sum()).add(m["step_us"][pick])


def _shares(s: StreamingSummary, key: Key) -> dict:
    acc = s.get("shares", key.column, key.valid)
    if key.arg is None:
        n = sum(acc.rows.values())
        return {k: float(c / n) for k, c in sorted(acc.rows.items())}
    total = sum(v.total for v in acc.time.values())
    return {k: float(_ratio(v.total, total)) for k, v in sorted(acc.time.items())}


_ACCUMULATORS = {"sum": _Sum, "sketch": _Sketch, "positive": _Positive, "counts": _CountAccumulator,
                 "buckets": _Buckets, "shares": _Shares}
_NAN = float("nan")


def _ratio(a: float, b: float) -> float:
    return a / b if b else _NAN  # steps that take no time: no rate, no share


class _Stat:
    """How one statistic of the spec is kept: the accumulators it needs and its value."""

    def __init__(self, needs, value):
        self._needs = needs
        self._value = value

    def needs(self, key: Key) -> list[tuple]:
        return self._needs(key)

    def value(self, s: StreamingSummary, key: Key):
        return self._value(s, key)


def _own(kind: str):
    return lambda key: [(kind, key.column, key.valid)]


def _both(key: Key) -> list[tuple]:
    return [("sum", key.column, False), ("sum", key.arg, False)]


def _quantile(s: StreamingSummary, key: Key) -> float:
    sketch = s.get("sketch", key.column, key.valid)
    if key.valid and not sketch.n:
        return _NAN
    return sketch.quantile(key.arg)


def _median(s: StreamingSummary, key: Key) -> float:
    sketch = s.get("sketch", key.column, key.valid)
    return sketch.quantile(50, median=True) if sketch.n else _NAN


def _fraction(s: StreamingSummary, key: Key) -> float:
    p = s.get("positive", key.column, key.valid)
    return p.positive / p.n if p.n else _NAN


def _histogram(s: StreamingSummary, key: Key) -> dict:
    counts = s.get("counts", key.column, key.valid).counts
    n = sum(counts.values())
    return {k: float(c / n) for k, c in sorted(counts.items())}


def _by_bucket(s: StreamingSummary, key: Key) -> dict:
    sums = s.get("buckets", key.column, key.valid).sums
    return {b: {"steps": per["step_us"].count, **{f"{c}_mean": v.mean() for c, v in per.items()}}
            for b, per in sorted(sums.items())}


def _count_rate(s: StreamingSummary, key: Key) -> float:
    n = s.get("sum", key.column, key.valid).count
    return float(_ratio(n, s.get("sum", key.arg).total) * 1e6)


#: each statistic of the spec (:mod:`simwar.analysis.summary`), as chunks come
_STREAM = {
    "mean": _Stat(_own("sum"), lambda s, key: float(s.get("sum", key.column, key.valid).mean())),
    "percentile": _Stat(_own("sketch"), _quantile),
    "median": _Stat(_own("sketch"), _median),
    "positive_fraction": _Stat(_own("positive"), _fraction),
    "histogram": _Stat(_own("counts"), _histogram),
    "busy_fraction": _Stat(_both, lambda s, key: float(_ratio(
        s.get("sum", key.column).total,
        s.get("sum", key.column).total + s.get("sum", key.arg).total))),
    "rate": _Stat(_both, lambda s, key: float(_ratio(
        s.get("sum", key.column).total, s.get("sum", key.arg).total) * 1e6)),
    "count": _Stat(_own("sum"), lambda s, key: s.get("sum", key.column, key.valid).count),
    "count_rate": _Stat(lambda key: [("sum", key.column, key.valid), ("sum", key.arg, False)],
                        _count_rate),
    "by_bucket": _Stat(_own("buckets"), _by_bucket),
    "shares": _Stat(_own("shares"), _shares),
}
