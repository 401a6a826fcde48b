"""Simulated against measured, per case: the figure of ``simwar compare --plot``.

:func:`plot_compare` draws the error table of :func:`simwar.fit.replays.compare` (one row
per case and metric, with ``simulated`` and ``measured`` columns) as two scatter plots,
step time and forward gap, on the diagonal where the simulation is exact. Cases are
marked GPU-bound, CPU-bound (a ``-cpu`` case) or varying per step (a case with a
``step_us_per_step`` row, the table's per-step error).

Imports: matplotlib (never pyplot) and pandas; the table is read by its column and metric
names, so nothing of :mod:`simwar.fit` is imported. Nothing here prints or writes files.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.figure import Figure

__all__ = ["plot_compare"]

#: the metric of the table's per-step step-time error rows (present for cases that vary)
PER_STEP_METRIC = "step_us_per_step"


def plot_compare(table: pd.DataFrame, ax_step=None, ax_gap=None):
    """Simulated vs measured step time and forward gap per case (two Axes); returns them.

    Without both Axes, a new 10 x 4.6 inch figure holds them side by side.
    """
    if ax_step is None or ax_gap is None:
        ax_step, ax_gap = Figure(figsize=(10, 4.6)).subplots(1, 2)
    varying = set(table.config[table.metric == PER_STEP_METRIC])
    for ax, metric, title in ((ax_step, "step_us_mean", "step time (µs)"),
                              (ax_gap, "fwd_gap_us_mean", "forward gap (µs)")):
        t = table[table.metric == metric]
        cpu = t.config.str.contains("-cpu")
        vary = t.config.isin(varying)
        for mask, label, marker in ((~cpu & ~vary, "GPU-bound", "o"), (cpu & ~vary, "CPU-bound",
                                                                       "s"),
                                    (vary, "batch varies per step", "^")):
            if not mask.any():
                continue
            ax.scatter(t.measured[mask], t.simulated[mask], s=16, marker=marker, label=label)
        hi = max(t.measured.max(), t.simulated.max(), 1.0) * 1.05
        ax.plot([0, hi], [0, hi], lw=0.8, color="grey")
        ax.set_xlabel(f"measured {title}")
        ax.set_ylabel(f"simulated {title}")
        ax.set_xlim(0, hi)
        ax.set_ylim(0, hi)
        ax.legend(loc="upper left", fontsize=8)
    return ax_step, ax_gap
