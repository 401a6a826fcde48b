"""A run's summary computed chunk by chunk, without keeping the per-step table.

:class:`StreamingSummary` takes the per-step columns a few thousand rows at a time (as
:func:`simwar.analysis.metrics.columns_from_arrays` makes them) and gives the keys of
:func:`simwar.analysis.metrics.summarize`, in its order:

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

Imports: numpy.
"""

from __future__ import annotations

import math

import numpy as np

from simwar.analysis.metrics import BUCKET_METRICS, hazard_counts, request_latencies


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
            return _numpy_median(at, self.n) if median else _numpy_percentile(at, self.n, q)
        rank = (50 if median else q) / 100 * (self.n - 1)
        i = int(math.floor(rank))
        j = min(i + 1, self.n - 1)
        a = float(values[np.searchsorted(cum, i, side="right")])
        b = float(values[np.searchsorted(cum, j, side="right")])
        t = rank - i
        return a + (b - a) * t if t < 0.5 else b - (b - a) * (1 - t)


def _numpy_percentile(at, n: int, q: float) -> float:
    """``numpy.percentile`` (method ``linear``) of ``n`` values, ``at(i)`` the i-th smallest:
    numpy's own arithmetic (virtual index, then its two-sided lerp), without the array."""
    virtual = (n - 1) * float(np.true_divide(q, 100))
    if virtual >= n - 1:
        return at(n - 1)
    prev = math.floor(virtual)
    gamma = virtual - prev
    a, b = at(prev), at(prev + 1)
    diff = b - a
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


def _numpy_median(at, n: int) -> float:
    """``numpy.median``: the middle value, or the mean of the two middle ones."""
    if n % 2:
        return at(n // 2)
    return (0.0 + at(n // 2 - 1) + at(n // 2)) / 2


class _Sum:
    __slots__ = ("total", "count")

    def __init__(self) -> None:
        self.total = 0.0
        self.count = 0

    def add(self, x: np.ndarray) -> None:
        nan = np.isnan(x)
        if nan.any():
            x = np.where(nan, 0.0, x)
        self.total += float(x.sum())
        self.count += len(x) - int(np.count_nonzero(nan))

    def mean(self) -> float:
        return self.total / self.count if self.count else float("nan")


MEANS = ("step_us", "fwd_us", "fwd_gap_us", "gpu_idle_us", "gpu_idle_dep_us",
         "gpu_idle_host_us", "gpu_busy_us", "cpu_blocked_us", "tokens")


class StreamingSummary:
    """:func:`~simwar.analysis.metrics.summarize`'s keys from column chunks."""

    def __init__(self, meta: dict, alpha: float = 1e-4):
        self.meta = meta
        self.warm = int(meta.get("warmup_steps", 0))
        self.sums: dict[str, _Sum] = {}
        self.step_us = QuantileSketch(alpha)
        self.fwd_gap = QuantileSketch(alpha)
        self.lead = QuantileSketch(alpha)
        self.lead_sum = _Sum()
        self.lead_pos = 0
        self.ahead: dict[int, int] = {}
        self.ahead_sum = _Sum()
        self.measured = 0
        self.first = self.last = None  # the measured steps' range
        self.columns: list[str] | None = None
        # a varying workload: per-bucket sums, and requests finished in the rows seen
        self.workload = meta.get("workload") or None
        self.batch_sum = _Sum()
        self.accept_sum = _Sum()
        self.buckets: dict[int, dict[str, _Sum]] = {}
        self.latency = QuantileSketch(alpha)
        self.latency_sum = _Sum()
        self.queue_sum = _Sum()
        req = (self.workload or {}).get("requests")
        self.requests = req
        if req is not None:
            finish = np.asarray(req["finish_step"], dtype=np.int64)
            self.req_order = np.argsort(finish, kind="stable")
            self.req_finish = finish[self.req_order]

    def add(self, cols: dict) -> None:
        """Rows of the per-step table (a mapping of equal-length numpy columns)."""
        if "step_us" not in cols:
            return
        if self.columns is None:
            self.columns = list(cols)
        keep = (cols["step"] >= self.warm) & ~np.isnan(cols["step_us"])
        if not keep.any():
            return
        m = {name: col[keep] for name, col in cols.items()}
        self.measured += len(m["step"])
        lo, hi = int(m["step"].min()), int(m["step"].max())
        self.first = lo if self.first is None else min(self.first, lo)
        self.last = hi if self.last is None else max(self.last, hi)
        for name in [c for c in m if c in MEANS or c.startswith("cpu_blocked_")]:
            self.sums.setdefault(name, _Sum()).add(m[name])
        self.step_us.add(m["step_us"])
        self.fwd_gap.add(m["fwd_gap_us"])
        lead = m["launch_lead_us"]
        lead = lead[~np.isnan(lead)]
        self.lead.add(lead)
        self.lead_sum.add(lead)
        self.lead_pos += int(np.count_nonzero(lead > 0))
        ahead = m["launch_ahead"]
        ahead = ahead[~np.isnan(ahead)]
        self.ahead_sum.add(ahead)
        values, counts = np.unique(ahead, return_counts=True)
        for v, c in zip(values.tolist(), counts.tolist()):
            self.ahead[int(v)] = self.ahead.get(int(v), 0) + c
        if self.workload is not None:
            self._add_workload(m)

    def _add_workload(self, m: dict) -> None:
        self.batch_sum.add(m["batch_size"].astype(np.float64))
        self.accept_sum.add(m["accepted_tokens"])
        buckets = m["graph_bucket"]
        for b in np.unique(buckets).tolist():
            rows = buckets == b
            sums = self.buckets.setdefault(int(b), {c: _Sum() for c in BUCKET_METRICS})
            for c in BUCKET_METRICS:
                sums[c].add(m[c][rows])
        if self.requests is None:
            return
        steps = m["step"]
        lo = np.searchsorted(self.req_finish, steps.min(), side="left")
        hi = np.searchsorted(self.req_finish, steps.max(), side="right")
        if hi <= lo:
            return
        pick = np.sort(self.req_order[lo:hi])  # in request order, as the table's summary
        req = {k: np.asarray(self.requests[k])[pick] for k in ("finish_step", "admit_us",
                                                                "arrival_us")}
        lat, queue = request_latencies(req, steps, m["fwd_end_us"])
        self.latency.add(lat)
        self.latency_sum.add(lat)
        self.queue_sum.add(queue)

    def result(self, hazards=None) -> dict:
        meta = self.meta
        out: dict = {"name": meta.get("name", ""), "steps_measured": self.measured}
        if not self.measured:
            return out
        s = self.sums
        nan = float("nan")

        def mean(name):
            return float(s[name].mean())

        def ratio(a, b):
            return a / b if b else nan  # steps that take no time: no rate, no share

        out.update({
            "step_us_mean": mean("step_us"),
            "step_us_p50": self.step_us.quantile(50),
            "step_us_p99": self.step_us.quantile(99),
            "fwd_us_mean": mean("fwd_us"),
            "fwd_gap_us_mean": mean("fwd_gap_us"),
            "fwd_gap_us_p50": self.fwd_gap.quantile(50),
            "gpu_idle_us_mean": mean("gpu_idle_us"),
            "gpu_idle_dep_us_mean": mean("gpu_idle_dep_us"),
            "gpu_idle_host_us_mean": mean("gpu_idle_host_us"),
            "gpu_busy_fraction": float(ratio(s["gpu_busy_us"].total,
                                             s["gpu_busy_us"].total + s["gpu_idle_us"].total)),
            "cpu_blocked_us_mean": mean("cpu_blocked_us"),
        })
        for col in sorted(c for c in self.columns if c.startswith("cpu_blocked_")
                          and c.endswith("_us") and c != "cpu_blocked_us"):
            out[f"{col}_mean"] = mean(col)
        n_lead = self.lead.n
        n_ahead = sum(self.ahead.values())
        out.update({
            "launch_lead_us_mean": self.lead_sum.mean() if n_lead else nan,
            "launch_lead_us_p50": self.lead.quantile(50, median=True) if n_lead else nan,
            "run_ahead_fraction": self.lead_pos / n_lead if n_lead else nan,
            "launch_ahead_mean": self.ahead_sum.mean() if n_ahead else nan,
            "launch_ahead_hist": {k: float(c / n_ahead) for k, c in sorted(self.ahead.items())},
            "tokens_per_s": float(ratio(s["tokens"].total, s["step_us"].total) * 1e6),
        })
        if self.workload is not None:
            out["batch_size_mean"] = self.batch_sum.mean()
            out["accepted_tokens_mean"] = self.accept_sum.mean()
            out["by_bucket"] = {b: {"steps": sums["step_us"].count,
                                    **{f"{c}_mean": v.mean() for c, v in sums.items()}}
                                for b, sums in sorted(self.buckets.items())}
            if self.requests is not None:
                n = self.latency.n
                out.update({
                    "requests_completed": n,
                    "requests_per_s": float(ratio(n, s["step_us"].total) * 1e6),
                    "request_latency_us_mean": self.latency_sum.mean(),
                    "request_latency_us_p50": self.latency.quantile(50) if n else nan,
                    "request_latency_us_p99": self.latency.quantile(99) if n else nan,
                    "request_queue_us_mean": self.queue_sum.mean(),
                })
        out.update(hazard_counts(hazards, np.arange(self.first, self.last + 1)))
        for key in ("barrier", "barrier_effective", "placement", "publish_phase",
                    "publish_position"):
            if key in meta:
                out[key] = meta[key]
        return out
