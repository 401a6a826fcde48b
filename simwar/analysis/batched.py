"""The summaries of many runs at once, each equal bit for bit to its own exact summary.

:func:`summarize_many` takes per-step columns as 2-d arrays (a row per step, a column per
run: runs of one structure, with the same steps) and gives each run the summary
:func:`simwar.analysis.metrics.summarize` gives its own table: every key of the spec
(:mod:`simwar.analysis.summary`) evaluated over all runs with numpy, by the same arithmetic:

- a sum is numpy's pairwise summation of a column (:func:`pairwise_sums` computes it for
  every run at once: the same blocks of eight partial sums, added in the same tree);
- a percentile or median is numpy's, along the runs' axis (the same selection and
  interpolation per column); a run whose column holds one value has it as every quantile;
- fractions and histograms are counts.

Runs with a varying workload (per-bucket figures, requests) and runs whose undefined values
(NaN: a step without a launch) are not at the same steps are summarized one by one.

Imports: numpy and the analysis' metrics and spec.
"""

from __future__ import annotations

import numpy as np

from simwar.analysis.metrics import hazard_counts, summarize
from simwar.analysis.summary import Key, assemble, measured_mask

#: numpy's pairwise summation: blocks of at most this many values are summed with eight
#: partial sums (numpy/_core/src/umath/loops_utils.h.src, ``PW_BLOCKSIZE``)
PW_BLOCKSIZE = 128


def pairwise_sums(x: np.ndarray) -> np.ndarray:
    """Per column of ``x`` (rows x runs): the sum numpy's ``add.reduce`` gives that column
    as a 1-d array, bit for bit (its pairwise summation, emulated over all columns)."""
    return _pairwise(x, 0, x.shape[0])


def _pairwise(x: np.ndarray, lo: int, n: int) -> np.ndarray:
    if n < 8:
        res = np.zeros(x.shape[1:])
        for i in range(lo, lo + n):
            res = res + x[i]
        return res
    if n <= PW_BLOCKSIZE:
        r = x[lo:lo + 8].copy()
        end = lo + n - n % 8
        for i in range(lo + 8, end, 8):
            r += x[i:i + 8]
        res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
        for i in range(end, lo + n):
            res = res + x[i]
        return res
    n2 = n // 2
    n2 -= n2 % 8
    return _pairwise(x, lo, n2) + _pairwise(x, lo + n2, n - n2)


def _sums(x: np.ndarray) -> np.ndarray:
    """:func:`simwar.analysis.metrics._sum` per column: NaN added as zero."""
    nan = np.isnan(x)
    return pairwise_sums(np.where(nan, 0.0, x) if nan.any() else x)


def _means(x: np.ndarray) -> np.ndarray:
    """:func:`simwar.analysis.metrics._mean` per column (NaN where no value is defined)."""
    n = x.shape[0] - np.count_nonzero(np.isnan(x), axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n > 0, _sums(x) / np.maximum(n, 1), np.nan)


def _quantiles(x: np.ndarray, q: float, median: bool = False) -> np.ndarray:
    """numpy's ``percentile(column, q)`` (or ``median``) per column."""
    if not len(x):
        return np.full(x.shape[1], np.nan)
    lo, hi = x.min(axis=0), x.max(axis=0)
    one = lo == hi  # one value (no NaN): every quantile is it
    out = np.where(one, lo, np.nan)
    rest = np.flatnonzero(~one)
    if len(rest):
        sub = x[:, rest]
        out[rest] = np.median(sub, axis=0) if median else np.percentile(sub, q, axis=0)
    return out


def _stat(key: Key, x: np.ndarray, m: dict) -> list:
    """One key of the spec for every run (a list, a value per run)."""
    stat, n = key.stat, x.shape[0]
    nan = float("nan")
    if stat == "mean":
        return _means(x.astype(np.float64, copy=False)).tolist()
    if stat == "percentile":
        return _quantiles(x, key.arg).tolist()
    if stat == "median":
        return _quantiles(x, 50, median=True).tolist() if n else [nan] * x.shape[1]
    if stat == "positive_fraction":
        if not n:
            return [nan] * x.shape[1]
        return [float(c / n) for c in np.count_nonzero(x > 0, axis=0).tolist()]
    if stat == "histogram":
        values = np.unique(x).tolist()
        counts = [np.count_nonzero(x == v, axis=0).tolist() for v in values]
        return [{int(v): float(c[j] / n) for v, c in zip(values, counts) if c[j]}
                for j in range(x.shape[1])]
    with np.errstate(divide="ignore", invalid="ignore"):
        if stat == "busy_fraction":
            return (1 - _sums(x) / _sums(m[key.arg])).tolist()
        if stat == "rate":
            return (_sums(x) / _sums(m[key.arg]) * 1e6).tolist()
    raise KeyError(stat)  # the workload's statistics: runs one by one


def summarize_many(columns: dict[str, np.ndarray], metas: list[dict],
                   hazards: list | None = None) -> list[dict]:
    """Each run's :func:`~simwar.analysis.metrics.summarize`: ``columns`` as 2-d arrays (a
    column per run; ``step`` 1-d, the runs' common steps), ``metas`` and ``hazards`` (its
    race report or counts, or None) per run."""
    n_runs = len(metas)
    hazards = hazards if hazards is not None else [None] * n_runs
    one_by_one = [j for j, meta in enumerate(metas) if meta.get("workload")]
    together = [j for j in range(n_runs) if not metas[j].get("workload")]
    out: list[dict | None] = [None] * n_runs
    if together:
        sub = columns if len(together) == n_runs else \
            {k: v if v.ndim == 1 else v[:, together] for k, v in columns.items()}
        try:
            for j, s in zip(together, _together(sub, [metas[j] for j in together],
                                                [hazards[j] for j in together])):
                out[j] = s
        except _OneByOne:
            one_by_one += together
    for j in one_by_one:
        cols = {k: v if v.ndim == 1 else np.ascontiguousarray(v[:, j])
                for k, v in columns.items()}
        out[j] = summarize(cols, metas[j], hazards[j])
    return out


class _OneByOne(Exception):
    """Runs whose undefined values differ in place: summarize them one by one."""


def _together(cols: dict, metas: list[dict], hazards: list) -> list[dict]:
    warm = {int(m.get("warmup_steps", 0)) for m in metas}
    if len(warm) != 1 or "step_us" not in cols:
        raise _OneByOne
    step = cols["step"]
    rows = measured_mask(step[:, None], cols["step_us"], warm.pop())
    if not np.array_equal(rows.all(axis=1), rows.any(axis=1)):
        raise _OneByOne
    keep = np.flatnonzero(rows[:, 0]) if rows.shape[1] else np.zeros(0, dtype=np.intp)
    if len(keep) and keep[-1] - keep[0] + 1 == len(keep):  # one run of rows: views
        keep = slice(int(keep[0]), int(keep[-1]) + 1)
    m = {name: col[keep] for name, col in cols.items()}
    from_hazards = [hazard_counts(h, m["step"]) for h in hazards]
    if not len(m["step"]):
        return [assemble(meta.get("name", ""), 0, cols, meta, None, {}) for meta in metas]
    values: dict[str, list] = {}
    valid: dict[str, np.ndarray] = {}

    def column(key: Key) -> np.ndarray:
        x = m[key.column]
        if not key.valid:
            return x
        if key.column not in valid:
            nan = np.isnan(x)
            if not np.array_equal(nan.all(axis=1), nan.any(axis=1)):
                raise _OneByOne
            valid[key.column] = x[~nan[:, 0]] if x.shape[1] else x
        return valid[key.column]

    out = []
    for j, meta in enumerate(metas):
        def value(key: Key, j=j):
            if key.name not in values:
                values[key.name] = _stat(key, column(key), m)
            return values[key.name][j]

        out.append(assemble(meta.get("name", ""), len(m["step"]), cols, meta, value,
                            from_hazards[j]))
    return out


