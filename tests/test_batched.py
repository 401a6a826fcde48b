"""The batched summary's arithmetic: numpy over a row per run is each run's own, bit for bit.

:mod:`simwar.analysis.batched` summarizes a lockstep group's runs at once, reducing 2-d arrays
along the steps' axis, and relies on numpy computing each row as it computes that row alone
(the same pairwise summation, the same selection and interpolation). These tests hold numpy
to it on random arrays (NaN, infinities, zeros of both signs, repeated values, lengths around
the pairwise summation's blocks), for C-contiguous arrays and for views whose rows are each
contiguous (a table's measured steps), and hold the batched statistics to the per-run ones of
:mod:`simwar.analysis.metrics` (a broadcast row, a per-step constant, included).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from simwar.analysis import batched, metrics

# the arrays hold infinities of both signs on purpose: numpy warns of inf - inf as it computes
# the NaN both sides must then agree on
pytestmark = pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")

ELEMENTS = st.one_of(st.floats(-1e6, 1e6, allow_nan=False, width=64),
                     st.sampled_from([0.0, -0.0, 1.5, 7.0, np.nan, np.inf, -np.inf]))


@st.composite
def tables(draw, nan: bool = True):
    """A 2-d array (a row per run) and a view of it with contiguous rows (runs x steps)."""
    runs = draw(st.integers(1, 5))
    steps = draw(st.one_of(st.integers(0, 20), st.sampled_from([127, 128, 129, 257, 1000])))
    elements = ELEMENTS if nan else st.floats(-1e6, 1e6, allow_nan=False, width=64)
    x = draw(hnp.arrays(np.float64, (runs, steps + 3), elements=elements))
    lo = draw(st.integers(0, 3))
    return x, x[:, lo:lo + steps]


def same(a, b) -> bool:
    """Equal element by element, bit for bit (NaN where NaN, the sign of zeros)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return a.shape == b.shape and a.tobytes() == b.tobytes() or \
        (a.shape == b.shape and bool(np.all((a == b) & (np.signbit(a) == np.signbit(b))
                                            | (np.isnan(a) & np.isnan(b)))))


@settings(max_examples=100, deadline=None)
@given(tables())
def test_numpy_reduces_each_row_as_the_row_alone(arrays):
    for x in arrays:
        rows = [np.array(r) for r in x]  # each row by itself, a fresh 1-d array
        assert same(np.add.reduce(x, axis=-1), [np.add.reduce(r) for r in rows])
        assert same(np.cumsum(x, axis=-1), np.array([np.cumsum(r) for r in rows]).reshape(x.shape))
        if x.shape[-1]:
            assert same(x.min(axis=-1), [r.min() for r in rows])
            assert same(x.max(axis=-1), [r.max() for r in rows])
            for q in (50, 99, 12.5):
                assert same(np.percentile(x, q, axis=-1), [np.percentile(r, q) for r in rows])
            assert same(np.median(x, axis=-1), [np.median(r) for r in rows])


@settings(max_examples=100, deadline=None)
@given(tables())
def test_the_batched_statistics_are_the_per_run_ones(arrays):
    for x in arrays:
        rows = [np.array(r) for r in x]
        assert same(batched._sums(x), [metrics._sum(r) for r in rows])
        assert same(batched._means(x), [metrics._mean(r) for r in rows])
        if x.shape[-1]:
            for q in (50, 99):
                assert same(batched._quantiles(x, q), [np.percentile(r, q) for r in rows])
            assert same(batched._quantiles(x, 50, median=True), [np.median(r) for r in rows])


@settings(max_examples=40, deadline=None)
@given(tables(nan=False), st.integers(2, 4))
def test_a_row_broadcast_to_every_run_has_the_statistics_of_that_row(arrays, runs):
    x = arrays[1][:1]
    wide = np.broadcast_to(x, (runs, x.shape[1]))
    assert batched._one_row(wide)
    full = np.array(wide)
    assert same(batched._sums(wide), batched._sums(full))
    assert same(batched._means(wide), batched._means(full))
    if x.shape[1]:
        assert same(batched._quantiles(wide, 99), batched._quantiles(full, 99))
    ints = np.broadcast_to(np.round(x) % 5, wide.shape)
    assert batched._histograms(ints) == batched._histograms(np.array(ints))
    hist = metrics._histogram(np.array(ints[0]), None, {}) if x.shape[1] else {}
    assert batched._histograms(ints)[0] == hist
