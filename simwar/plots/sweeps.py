"""Figures of a sweep's results table, and the words their axes and titles use.

- :func:`sweep_lines`: a metric against a swept key, one line per hue (repeats as the
  mean and its min-max band; a categorical key as points with min-max bars);
- :func:`sweep_heatmap`: the mean of a metric over the grid of two swept keys;
- :func:`sweep_facets`: either of them once per value of another swept key, side by side;
- :func:`column_label` (axis labels in words, with units), :func:`numeric_columns` (what a
  value axis can show), :func:`averaged_over` (what each point is the mean of) and
  :func:`categorical_averaged` (the categorical swept keys a figure would average over),
  which ``simwar plot`` also uses for its title and its checks.

A point (or cell) may be the mean over repeats and over the values of a numeric swept key
it does not plot, which the title says; never over a categorical one (a barrier, an
algorithm, a swept distribution, a flag): the mean of the coarse and the fine barrier is a
configuration that does not exist. Such a key must be plotted (``hue``, a facet, an axis)
or filtered to one value; the figures raise ``ValueError`` naming it otherwise.

Data: the DataFrame ``simwar.sweep`` returns (or its ``results.parquet``), or any table
with the columns named.

Imports: matplotlib (never pyplot), numpy and pandas. Nothing here prints or writes files.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from simwar.plots.axes import new_axes

__all__ = ["sweep_lines", "sweep_heatmap", "sweep_facets", "column_label", "numeric_columns",
           "averaged_over", "categorical_averaged", "COLUMN_LABELS"]


def _check_columns(df: pd.DataFrame, *cols: str | None) -> None:
    missing = [c for c in cols if c is not None and c not in df.columns]
    if missing:
        raise KeyError(f"column(s) {', '.join(missing)} not in the sweep frame "
                       f"(has: {', '.join(map(str, df.columns))})")


#: axis labels of known sweep-table columns, in words with units (others keep their name)
COLUMN_LABELS = {
    "step_us_mean": "step time, mean (µs)",
    "step_us_p50": "step time, median (µs)",
    "step_us_p99": "step time, p99 (µs)",
    "fwd_us_mean": "forward time, mean (µs)",
    "fwd_gap_us_mean": "gap before each forward, mean (µs)",
    "fwd_gap_us_p50": "gap before each forward, median (µs)",
    "gpu_idle_us_mean": "GPU idle per step, mean (µs)",
    "gpu_idle_dep_us_mean": "GPU idle on a dependency per step, mean (µs)",
    "gpu_idle_host_us_mean": "GPU idle on the host per step, mean (µs)",
    "gpu_busy_fraction": "GPU busy fraction",
    "cpu_blocked_us_mean": "CPU blocked per step, mean (µs)",
    "launch_lead_us_mean": "launch lead, mean (µs)",
    "launch_lead_us_p50": "launch lead, median (µs)",
    "run_ahead_fraction": "run-ahead fraction",
    "launch_ahead_mean": "launch-ahead depth, mean",
    "tokens_per_s": "throughput (tokens/s)",
    "races": "latent races",
    "overlaps": "observed overlaps",
    "race_steps": "steps with a latent race",
    "steps_measured": "steps measured",
    "algorithm": "algorithm",
    "policy.barrier": "barrier policy",
    "policy.placement": "barrier placement",
    "cpu.ingest_us": "CPU ingest time (µs)",
    "cpu.schedule_us": "CPU schedule time (µs)",
    "cpu.prepare_us": "CPU prepare time (µs)",
    "cpu.process_result_us": "CPU result processing time (µs)",
    "gpu.schedule_writes_us": "schedule-stream writes (µs)",
    "gpu.result_writes_us": "result writes (µs)",
    "accept.tokens": "accepted tokens per step",
    "batch_size": "batch size",
    "batch_size_mean": "batch size, mean",
    "accepted_tokens_mean": "accepted tokens per request, mean",
    "requests_per_s": "requests completed per second",
    "request_latency_us_mean": "decode latency per request, mean (µs)",
    "request_latency_us_p50": "decode latency per request, median (µs)",
    "request_latency_us_p99": "decode latency per request, p99 (µs)",
    **{f"request_{m}_us_{s}": f"{what}, {stat} (µs)"
       for m, what in (("ttft", "TTFT to the host"), ("ttft_forward", "TTFT to the forward's end"),
                       ("tpot", "TPOT (per output token)"), ("itl", "inter-token latency"))
       for s, stat in (("mean", "mean"), ("p50", "median"), ("p99", "p99"))},
    "goodput_per_s": "goodput: requests meeting the SLO per second",
    "slo_attainment": "share of requests meeting the SLO",
    "workload.arrivals.rate_per_s": "arrival rate (requests/s)",
    "policy.overlap": "overlap loop",
}


def column_label(column: str) -> str:
    """Words (with units) for a sweep-table column; the column's name when it is not known."""
    if column in COLUMN_LABELS:
        return COLUMN_LABELS[column]
    if column.startswith("cpu_blocked_") and column.endswith("_us_mean"):
        return f"CPU blocked in {column[len('cpu_blocked_'):-len('_us_mean')]} per step, mean (µs)"
    parts = column.split(".")
    if len(parts) == 3 and parts[0] == "phases" and parts[2].endswith("_us"):
        return f"{parts[1]} {parts[2][:-len('_us')].replace('_', ' ')} time (µs)"
    if len(parts) == 2 and parts[0] == "costs" and parts[1].endswith("_us"):
        return f"host cost: {parts[1][:-len('_us')].replace('_', ' ')} (µs)"
    return column


def numeric_columns(df: pd.DataFrame) -> list[str]:
    """The columns a sweep plot can put on its value axis (id columns excluded)."""
    return [c for c in df.columns if c not in ("run_id", "repeat", "seed")
            and pd.api.types.is_numeric_dtype(df[c]) and not pd.api.types.is_bool_dtype(df[c])]


def averaged_over(df: pd.DataFrame, *plotted: str | None) -> dict[str, int]:
    """What each plotted point averages over: ``{column: number of values}``.

    The swept keys not plotted (the columns before ``run_id`` in a sweep table) that
    take several values, and ``repeat`` when there are repeats; for another table,
    ``{"rows": n}`` when up to ``n`` rows fall on one point.
    """
    columns = list(df.columns)
    shown = {c for c in plotted if c is not None}
    if "run_id" in columns:
        swept = [c for c in columns[:columns.index("run_id")] if c not in shown]
        if "repeat" in columns:
            swept.append("repeat")
        counts = {c: int(df[c].nunique(dropna=False)) for c in swept}
        return {c: n for c, n in counts.items() if n > 1}
    keys = [c for c in shown if c in columns]
    most = int(df.groupby(keys, dropna=False).size().max()) if keys and len(df) else 1
    return {"rows": most} if most > 1 else {}


def _swept(df: pd.DataFrame) -> list[str]:
    """The swept keys of a sweep table: its columns before ``run_id`` (none for another
    table)."""
    columns = list(df.columns)
    return columns[:columns.index("run_id")] if "run_id" in columns else []


def _categorical(series: pd.Series) -> bool:
    return (not pd.api.types.is_numeric_dtype(series)) or pd.api.types.is_bool_dtype(series)


def categorical_averaged(df: pd.DataFrame, *plotted: str | None) -> dict[str, list]:
    """The categorical swept keys (text, flags, swept distributions) that take several
    values in ``df`` and are not among ``plotted``: ``{key: its values}``. A figure that
    averaged over one would show configurations that do not exist."""
    shown = {c for c in plotted if c is not None}
    out = {}
    for c in _swept(df):
        if c not in shown and _categorical(df[c]) and df[c].nunique(dropna=False) > 1:
            out[c] = sorted(df[c].dropna().unique().tolist(), key=str)
    return out


def _refuse_categorical(df: pd.DataFrame, *plotted: str | None) -> None:
    over = categorical_averaged(df, *plotted)
    if over:
        key, values = next(iter(over.items()))
        raise ValueError(f"{key} takes {len(values)} values ({', '.join(map(str, values))}) "
                         f"and is not plotted: each point would average them, a "
                         f"configuration that does not exist; plot it (hue, a facet) or keep "
                         f"one of its values")


def _check_numeric(df: pd.DataFrame, column: str) -> None:
    if column not in numeric_columns(df):
        raise TypeError(f"{column}: not a numeric column (numeric: "
                        f"{', '.join(numeric_columns(df)) or 'none'})")


def sweep_lines(df: pd.DataFrame, x: str, y: str, hue: str | None = None,
                ax: Axes | None = None) -> Axes:
    """``y`` against swept key ``x``, one line per value of ``hue``; repeats as mean ± range.

    A numeric ``x`` gives lines with a min-max band; a categorical one (text, e.g.
    ``policy.barrier``) gives points with min-max bars, side by side per hue: there is
    nothing between two categories for a line to join.
    """
    _check_columns(df, x, y, hue)
    _check_numeric(df, y)
    _refuse_categorical(df, x, hue)
    ax = new_axes(ax)
    groups = list(df.groupby(hue, sort=True)) if hue else [(None, df)]
    categorical = not pd.api.types.is_numeric_dtype(df[x])
    categories = sorted(df[x].dropna().unique(), key=str) if categorical else []
    position = {value: i for i, value in enumerate(categories)}
    for i, (key, g) in enumerate(groups):
        agg = g.groupby(x, sort=True)[y].agg(["mean", "min", "max"])
        label = f"{hue}={key}" if hue else column_label(y)
        if categorical:
            shift = (i - (len(groups) - 1) / 2) * min(0.6 / max(len(groups), 1), 0.15)
            xs = [position[v] + shift for v in agg.index]
            bars = ax.errorbar(xs, agg["mean"], fmt="o", markersize=5, capsize=3, label=label,
                               yerr=[agg["mean"] - agg["min"], agg["max"] - agg["mean"]])
            bars.lines[0].set_gid(f"points:{key}")
            continue
        line, = ax.plot(agg.index, agg["mean"], marker="o", markersize=3.5, label=label,
                        gid=f"line:{key}")
        if (agg["max"] > agg["min"]).any():
            ax.fill_between(agg.index, agg["min"], agg["max"], color=line.get_color(), alpha=0.15)
    if categorical:
        ax.set_xticks(range(len(categories)), [str(c) for c in categories])
        ax.set_xlim(-0.5, len(categories) - 0.5)
    ax.set_xlabel(column_label(x))
    ax.set_ylabel(column_label(y))
    if hue:
        ax.legend(fontsize=8, frameon=False)
    ax.grid(color="#eeeeee")
    return ax


def sweep_heatmap(df: pd.DataFrame, x: str, y: str, value: str, ax: Axes | None = None,
                  fmt: str = "{:.0f}", cmap: str = "viridis") -> Axes:
    """Mean of ``value`` over the grid of two swept keys, annotated cell by cell."""
    _check_columns(df, x, y, value)
    _check_numeric(df, value)
    _refuse_categorical(df, x, y)
    ax = new_axes(ax)
    grid = df.pivot_table(index=y, columns=x, values=value, aggfunc="mean").sort_index()
    im = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", origin="lower", cmap=cmap)
    ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns])
    ax.set_yticks(range(grid.shape[0]), [str(i) for i in grid.index])
    ax.set_xlabel(column_label(x))
    ax.set_ylabel(column_label(y))
    values = grid.to_numpy(dtype=float)
    finite = values[np.isfinite(values)]
    mid = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=7,
                    color="white" if v < mid else "black")
    ax.figure.colorbar(im, ax=ax, label=column_label(value))
    return ax


def sweep_facets(df: pd.DataFrame, x: str, y: str, facet: str, hue: str | None = None,
                 kind: str = "line", fig: Figure | None = None, columns: int = 3) -> Figure:
    """:func:`sweep_lines` (``kind="line"``: ``y`` against ``x``, one line per ``hue``) or
    :func:`sweep_heatmap` (``kind="heatmap"``: ``y`` over ``x`` and ``hue``) once per value
    of ``facet``, side by side (``columns`` a row), each panel titled by its value."""
    _check_columns(df, x, y, hue, facet)
    if kind not in ("line", "heatmap"):
        raise ValueError(f"kind: '{kind}' is not line or heatmap")
    if kind == "heatmap" and hue is None:
        raise ValueError("a heatmap needs hue (its y axis)")
    _refuse_categorical(df, x, hue, facet)
    values = sorted(df[facet].dropna().unique().tolist(), key=str)
    cols = min(columns, len(values))
    rows = -(-len(values) // cols)
    fig = fig or Figure(figsize=(4.6 * cols, 3.6 * rows), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False, sharey=kind == "line")
    for ax, value in zip(axes.flat, values):
        part = df[df[facet] == value]
        if kind == "heatmap":
            sweep_heatmap(part, x, hue, y, ax=ax)
        else:
            sweep_lines(part, x, y, hue=hue, ax=ax)
        ax.set_title(f"{facet} = {value}", fontsize=9, loc="left")
        if ax is not axes.flat[0] and ax.get_legend() is not None:
            ax.get_legend().remove()  # one legend: the lines are the same in every panel
    for ax in list(axes.flat)[len(values):]:
        ax.set_visible(False)
    return fig
