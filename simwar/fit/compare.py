"""A measured summary against a simulated one: the one comparison every check builds on.

Both sides are summaries of :func:`simwar.analysis.metrics.analyze` (a capture's through
:func:`simwar.capture.stalls.import_report`, a replay's through
:func:`simwar.fit.replays.measured_summary`, a simulation's its own), so a figure means
the same on both. :func:`compare_figures` takes the keys to compare and returns one
:class:`FigureComparison` per key: both values, the error (simulated minus measured) and
the relative error (the error over the measured value). Two callers build on it:

- :func:`simwar.fit.check.check_rows`: the rows ``simwar import --check`` prints (a
  capture against the simulation of its fitted config), signed, with acceptance bounds;
- :func:`simwar.fit.replays.error_table`: the table ``simwar compare`` writes (each
  replayed case against its simulation), as absolute errors.

Imports: numpy and the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np


class FigureComparison(NamedTuple):
    """One figure of a measured and a simulated summary."""

    key: str
    measured: float
    simulated: float
    #: simulated - measured
    error: float
    #: error / measured; NaN where the measured value is 0 (undefined)
    relative: float


def figure(summary: dict, key: str) -> float:
    """A summary's figure as a float: NaN where it is absent or not a number."""
    v = summary.get(key)
    return float(v) if isinstance(v, (int, float)) else float("nan")


def relative_error(error, measured):
    """``error / measured``, NaN where ``measured`` is 0: of floats, or of numpy arrays
    element by element (per-step columns)."""
    if isinstance(measured, np.ndarray):
        out = np.full(np.shape(measured), math.nan)
        np.divide(error, measured, out=out, where=measured != 0)
        return out
    return error / measured if measured else math.nan


def compare_figure(key: str, measured: float, simulated: float) -> FigureComparison:
    """One figure's error and relative error (see :class:`FigureComparison`)."""
    error = simulated - measured
    return FigureComparison(key, measured, simulated, error, relative_error(error, measured))


def compare_figures(measured: dict, simulated: dict,
                    keys: Iterable[str]) -> list[FigureComparison]:
    """Per key, in order: the figure of both summaries compared (:func:`figure`)."""
    return [compare_figure(k, figure(measured, k), figure(simulated, k)) for k in keys]
