"""simwar's figures: each function takes data (and an optional Axes) and returns what it drew.

Notebooks use them as ``from simwar import plots; plots.timeline(result, steps=(20, 22))``:

- runs: :func:`timeline` and :func:`stall_figure` (:mod:`simwar.plots.timelines`);
- comparisons of runs: :func:`stall_breakdown`, :func:`launch_ahead_hist`,
  :func:`step_time_ecdf` (:mod:`simwar.plots.summary`);
- runs whose steps differ: :func:`by_batch`, :func:`regime_steps`, :func:`workload_figure`
  (:mod:`simwar.plots.workload`);
- sweeps: :func:`sweep_lines`, :func:`sweep_heatmap`, :func:`sweep_facets`, and the words
  of their axes :func:`column_label`, :func:`numeric_columns`, :func:`averaged_over`,
  :func:`categorical_averaged`
  (:mod:`simwar.plots.sweeps`);
- the critical-path chain of ``simwar explain``: :func:`chain_figure`
  (:mod:`simwar.plots.chain`);
- simulated against measured: :func:`plot_compare` (:mod:`simwar.plots.compare`).

:mod:`simwar.plots.perfetto` writes a Trace as Chrome trace-event JSON (import it by its
module name). The bubbles a timeline explains are :func:`simwar.analysis.bubbles.bubbles`
and :func:`simwar.analysis.bubbles.story`.

Every figure uses matplotlib's object API (``Figure``, never pyplot): any backend, no
global figure state; pass ``ax=``/``fig=`` from pyplot to draw into a notebook's figure.
Nothing here prints or writes files: callers save the figure. The names below load their
modules (and with them matplotlib and pandas) on first use, so that the Perfetto export,
which needs neither, starts without them.
"""

from __future__ import annotations

from simwar.core.lazy import lazy_getattr

_LAZY = {
    "chain_figure": ("simwar.plots.chain", "chain_figure"),
    "plot_compare": ("simwar.plots.compare", "plot_compare"),
    "launch_ahead_hist": ("simwar.plots.summary", "launch_ahead_hist"),
    "stall_breakdown": ("simwar.plots.summary", "stall_breakdown"),
    "step_time_ecdf": ("simwar.plots.summary", "step_time_ecdf"),
    "averaged_over": ("simwar.plots.sweeps", "averaged_over"),
    "categorical_averaged": ("simwar.plots.sweeps", "categorical_averaged"),
    "column_label": ("simwar.plots.sweeps", "column_label"),
    "numeric_columns": ("simwar.plots.sweeps", "numeric_columns"),
    "sweep_facets": ("simwar.plots.sweeps", "sweep_facets"),
    "sweep_heatmap": ("simwar.plots.sweeps", "sweep_heatmap"),
    "sweep_lines": ("simwar.plots.sweeps", "sweep_lines"),
    "stall_figure": ("simwar.plots.timelines", "stall_figure"),
    "timeline": ("simwar.plots.timelines", "timeline"),
    "by_batch": ("simwar.plots.workload", "by_batch"),
    "regime_steps": ("simwar.plots.workload", "regime_steps"),
    "workload_figure": ("simwar.plots.workload", "workload_figure"),
}

__all__ = ["timeline", "stall_figure", "stall_breakdown", "launch_ahead_hist",
           "step_time_ecdf", "by_batch", "regime_steps", "workload_figure", "sweep_lines",
           "sweep_heatmap", "sweep_facets", "column_label", "numeric_columns", "averaged_over",
           "categorical_averaged",
           "chain_figure", "plot_compare"]

__getattr__ = lazy_getattr("simwar.plots", _LAZY, globals())
