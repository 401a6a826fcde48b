"""The summaries of many runs at once, each equal bit for bit to its own exact summary.

:func:`summarize_many` takes per-step columns as 2-d arrays (a row per run, a column per
step: runs of one structure, with the same steps) and gives each run the summary
:func:`simwar.analysis.metrics.summarize` gives its own table: every key of the spec
(:mod:`simwar.analysis.summary`) evaluated over all runs with numpy, by the same arithmetic:

- a sum is numpy's pairwise summation of the run's row (a reduction along the last axis
  runs the same summation over each row as over that row alone, for rows that are each
  contiguous); the NaN a mean skips are looked for only in the rows whose sum is NaN;
- a percentile or median is numpy's, along the steps' axis (the same selection and
  interpolation per row); a run whose row holds one value has it as every quantile;
- fractions and histograms are counts;
- a column that is the same row for every run (a broadcast: a per-step constant, a site no
  op syncs at) has its statistics computed once, on that row.

``tests/test_batched.py`` holds numpy to each of these on random arrays (Hypothesis).

Runs with a varying workload (per-bucket figures, requests) and runs whose undefined values
(NaN: a step without a launch) are not at the same steps are summarized one by one.

Imports: numpy and the analysis' metrics and spec.
"""

from __future__ import annotations

import numpy as np

from simwar.analysis.metrics import hazard_counts, summarize
from simwar.analysis.summary import Key, assemble, assemble_many, measured_mask, summary_keys
from simwar.core.run_meta import RunMeta


def _one_row(x: np.ndarray) -> bool:
    """Whether every row of ``x`` is the same row (a broadcast: a per-step constant of the
    runs, a site no op syncs at): its statistics are then computed once, on that row."""
    return x.ndim == 2 and x.shape[0] > 1 and x.strides[0] == 0


def _per_row(fn, x: np.ndarray) -> np.ndarray:
    """``fn(x)`` (a value per row), computed on the first row alone when every row is it."""
    if _one_row(x):
        return np.repeat(fn(x[:1]), x.shape[0])
    return fn(x)


def _sums(x: np.ndarray) -> np.ndarray:
    """:func:`simwar.analysis.metrics._sum` per row: NaN added as zero."""
    return _per_row(_row_sums, x)


def _rows(x: np.ndarray, dtype=None) -> np.ndarray:
    """``x`` with each row contiguous (a view of a table's measured steps already is): numpy
    then reduces along each row as over the row alone; it may reduce a row laid out otherwise
    in another order (``tests/test_batched.py`` holds both)."""
    if x.strides[-1] != x.itemsize or (dtype is not None and x.dtype != dtype):
        return np.ascontiguousarray(x, dtype=dtype)
    return x


def _row_sums(x: np.ndarray) -> np.ndarray:
    x = _rows(x)
    out = np.add.reduce(x, axis=-1)
    # a NaN makes its row's sum NaN (so does inf + -inf): those rows again, NaN as zero; any
    # other row holds no NaN, and its sum is the one with NaN as zero
    redo = np.flatnonzero(np.isnan(out))
    if len(redo):
        sub = x[redo]
        out[redo] = np.add.reduce(np.where(np.isnan(sub), 0.0, sub), axis=-1)
    return out


def _means(x: np.ndarray) -> np.ndarray:
    """:func:`simwar.analysis.metrics._mean` per row (NaN where no value is defined): the
    sum of :func:`_sums` over the count of values that are not NaN."""
    return _per_row(_row_means, x)


def _row_means(x: np.ndarray) -> np.ndarray:
    x = _rows(x, np.float64)
    sums = np.add.reduce(x, axis=-1)
    redo = np.flatnonzero(np.isnan(sums))  # rows with a NaN (see _row_sums)
    if not len(redo) and x.shape[-1]:  # every value defined: the same division, at once
        return sums / x.shape[-1]
    n = np.full(x.shape[0], x.shape[-1])
    if len(redo):
        sub = x[redo]
        nan = np.isnan(sub)
        n[redo] -= np.count_nonzero(nan, axis=-1)
        sums[redo] = np.add.reduce(np.where(nan, 0.0, sub), axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(n > 0, sums / np.maximum(n, 1), np.nan)


def _quantiles(x: np.ndarray, q: float, median: bool = False) -> np.ndarray:
    """numpy's ``percentile(row, q)`` (or ``median``) per row."""
    if not x.shape[-1]:
        return np.full(x.shape[0], np.nan)
    return _per_row(lambda rows: _row_quantiles(rows, q, median), x)


def _row_quantiles(x: np.ndarray, q: float, median: bool) -> np.ndarray:
    lo, hi = x.min(axis=-1), x.max(axis=-1)
    # one value: every quantile is it (numpy's interpolation of a value with itself gives it
    # back, but for a zero, whose sign it may change, an infinity or a huge value)
    one = (lo == hi) & (np.abs(lo) < 1e300) & (lo != 0)
    out = np.where(one, lo, np.nan)
    rest = np.flatnonzero(~one)
    if len(rest):
        sub = x if len(rest) == x.shape[0] else x[rest]
        out[rest] = np.median(sub, axis=-1) if median else np.percentile(sub, q, axis=-1)
    return out


def _histograms(x: np.ndarray) -> list[dict]:
    """Per row: ``{int(value): its fraction of the row}``, ascending (a row without NaN)."""
    n = x.shape[-1]
    if not n:
        return [{} for _ in range(x.shape[0])]
    if _one_row(x):
        return [dict(h) for h in _histograms(x[:1]) * x.shape[0]]
    lo, hi = x.min(), x.max()
    values = [lo] if lo == hi else np.unique(x).tolist()
    counts = [np.count_nonzero(x == v, axis=-1).tolist() for v in values]
    return [{int(v): float(c[j] / n) for v, c in zip(values, counts) if c[j]}
            for j in range(x.shape[0])]


def _stat(key: Key, x: np.ndarray, m: dict) -> list:
    """One key of the spec for every run (a list, a value per run)."""
    stat, n = key.stat, x.shape[-1]
    nan = float("nan")
    if stat == "mean":
        return _means(x).tolist()
    if stat == "percentile":
        return _quantiles(x, key.arg).tolist()
    if stat == "median":
        return _quantiles(x, 50, median=True).tolist() if n else [nan] * x.shape[0]
    if stat == "positive_fraction":
        if not n:
            return [nan] * x.shape[0]
        positive = _per_row(lambda r: np.count_nonzero(r > 0, axis=-1), x)
        return [float(c / n) for c in positive.tolist()]
    if stat == "histogram":
        return _histograms(x)
    with np.errstate(divide="ignore", invalid="ignore"):
        # steps that take no time have no share and no rate: NaN where the divisor is 0
        if stat == "busy_fraction":
            busy = _sums(x)
            total = busy + _sums(m[key.arg])
            return np.where(total != 0, busy / total, np.nan).tolist()
        if stat == "rate":
            div = _sums(m[key.arg])
            return np.where(div != 0, _sums(x) / div * 1e6, np.nan).tolist()
    raise KeyError(stat)  # the workload's statistics: runs one by one


def summarize_many(columns: dict[str, np.ndarray], metas: list[dict],
                   hazards: list | None = None) -> list[dict]:
    """Each run's :func:`~simwar.analysis.metrics.summarize`: ``columns`` as 2-d arrays (a
    row per run; ``step`` 1-d, the runs' common steps), ``metas`` and ``hazards`` (its race
    report or counts, or None) per run."""
    n_runs = len(metas)
    hazards = hazards if hazards is not None else [None] * n_runs
    runs = [RunMeta.from_meta(meta) for meta in metas]
    one_by_one = [j for j, run in enumerate(runs) if run.workload]
    together = [j for j, run in enumerate(runs) if not run.workload]
    out: list[dict | None] = [None] * n_runs
    if together:
        sub = columns if len(together) == n_runs else \
            {k: v if v.ndim == 1 else v[together] for k, v in columns.items()}
        try:
            for j, s in zip(together, _together(sub, [metas[j] for j in together],
                                                [hazards[j] for j in together],
                                                [runs[j] for j in together])):
                out[j] = s
        except _OneByOne:
            one_by_one += together
    for j in one_by_one:
        cols = {k: v if v.ndim == 1 else v[j] for k, v in columns.items()}
        out[j] = summarize(cols, metas[j], hazards[j])
    return out


class _OneByOne(Exception):
    """Runs whose undefined values differ in place: summarize them one by one."""


def _together(cols: dict, metas: list[dict], hazards: list, runs: list[RunMeta]) -> list[dict]:
    warm = {run.warmup_steps for run in runs}
    if len(warm) != 1 or "step_us" not in cols:
        raise _OneByOne
    rows = measured_mask(cols["step"], cols["step_us"], warm.pop())
    if not np.array_equal(rows.all(axis=0), rows.any(axis=0)):
        raise _OneByOne
    keep = np.flatnonzero(rows[0]) if rows.shape[0] else np.zeros(0, dtype=np.intp)
    if len(keep) and keep[-1] - keep[0] + 1 == len(keep):  # one run of steps: views
        keep = slice(int(keep[0]), int(keep[-1]) + 1)
    m = {name: col[..., keep] for name, col in cols.items()}
    steps = m["step"]
    if len(steps) and steps[-1] - steps[0] + 1 == len(steps) and (np.diff(steps) == 1).all():
        steps = range(int(steps[0]), int(steps[-1]) + 1)  # a run of steps: no search per run
    from_hazards = [hazard_counts(h, steps) for h in hazards]
    if not len(m["step"]):
        return [assemble(run.name, 0, cols, meta, None, {}) for run, meta in zip(runs, metas)]
    values: dict[str, list] = {}
    valid: dict[str, np.ndarray] = {}

    def column(key: Key) -> np.ndarray:
        x = m[key.column]
        if not key.valid:
            return x
        if key.column not in valid:
            nan = np.isnan(x[:1] if _one_row(x) else x)
            if not nan.any():  # every value defined: the column as it is
                valid[key.column] = x
            elif not np.array_equal(nan.all(axis=0), nan.any(axis=0)):
                raise _OneByOne
            elif _one_row(x):
                keep = x[:1, ~nan[0]]
                valid[key.column] = np.broadcast_to(keep, (x.shape[0], keep.shape[1]))
            else:
                valid[key.column] = x[:, ~nan[0]]
        return valid[key.column]

    if all(run.workload is None for run in runs):
        # one list of keys for every run: each key evaluated once, the dicts built from rows
        keys = summary_keys(cols, runs[0])
        return assemble_many([run.name for run in runs], len(m["step"]), keys,
                             [_stat(key, column(key), m) for key in keys], metas, from_hazards)
    out = []
    for j, (run, meta) in enumerate(zip(runs, metas)):
        def value(key: Key, j=j):
            if key.name not in values:
                values[key.name] = _stat(key, column(key), m)
            return values[key.name][j]

        out.append(assemble(run.name, len(m["step"]), cols, meta, value,
                            from_hazards[j]))
    return out


