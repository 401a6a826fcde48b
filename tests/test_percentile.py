"""The summary's percentile and median (:func:`simwar.analysis.metrics.percentile`,
:func:`~simwar.analysis.metrics.median`), written out so that a run does not import
``numpy.ma`` (numpy's own call ``np.unique`` and ``np.ma.isMaskedArray``): bit for bit
``numpy.percentile`` (method ``linear``) and ``numpy.median`` of every kind of column a summary
takes: floats with NaN, signed zeros, infinities and ties, integers, one value or a few.
"""

from __future__ import annotations

import numpy as np
import pytest

from simwar.analysis.metrics import median, numpy_percentile, percentile


def _bits(v) -> bytes:
    return np.float64(v).tobytes()


def _columns(rng: np.random.Generator):
    for trial in range(600):
        n = int(rng.integers(1, 60))
        kind = trial % 6
        if kind == 0:
            yield rng.normal(0, 1e3, n)
        elif kind == 1:  # ties, signed zeros, tiny values
            yield rng.choice([0.0, -0.0, 1.5, 5840.0, 1e-300, 3.3333333], n)
        elif kind == 2:
            yield rng.lognormal(5, 3, n)
        elif kind == 3:
            yield rng.integers(-5, 5, n)  # an integer column
        elif kind == 4:  # infinities
            yield rng.choice([-np.inf, -1.0, 0.0, 2.5, np.inf], n)
        else:  # a NaN somewhere (as inf - inf makes it: its sign bit set, on x86)
            x = rng.normal(100, 10, n)
            with np.errstate(invalid="ignore"):
                x[int(rng.integers(0, n))] = np.float64(np.inf) - np.inf
            yield x


def test_percentile_is_numpys_bit_for_bit():
    rng = np.random.default_rng(7)
    for x in _columns(rng):
        before = x.copy()
        for q in (0, 1, 13.7, 50, 99, 99.9, 100, float(rng.uniform(0, 100))):
            with np.errstate(invalid="ignore"):
                want = np.percentile(x, q)
                got = percentile(x, q)
            assert type(got) is float
            assert _bits(got) == _bits(want), (x.tolist(), q, got, want)
        with np.errstate(invalid="ignore"):
            assert _bits(median(x)) == _bits(np.median(x)), x.tolist()
        np.testing.assert_array_equal(x, before)  # the column is left as it was


def test_percentile_from_order_statistics_is_numpys():
    """The streaming summary's form: ``at(i)``, the i-th smallest, rather than the array
    (no NaN; and no -0.0: which of two equal zeros is the i-th smallest is numpy's
    partition's choice, so the sign of a zero result may differ)."""
    rng = np.random.default_rng(11)
    for x in _columns(rng):
        if np.isnan(x).any():
            continue
        x = x + 0.0  # -0.0 becomes 0.0
        ordered = np.sort(x)
        for q in (0, 50, 99, 100, float(rng.uniform(0, 100))):
            with np.errstate(invalid="ignore"):
                want = np.percentile(x, q)
                got = numpy_percentile(ordered.__getitem__, len(x), q)
            assert _bits(got) == _bits(want), (x.tolist(), q)


def test_an_empty_column_is_numpys_case():
    with pytest.raises(IndexError):
        np.percentile(np.zeros(0), 50)
    with pytest.raises(IndexError):
        percentile(np.zeros(0), 50)
