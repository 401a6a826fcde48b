"""Figures that compare runs: stalls per step, launch-ahead depth and step-time spread.

- :func:`stall_breakdown`: per run, GPU idle by cause and CPU blocked by site;
- :func:`launch_ahead_hist`: the share of launches at each launch-ahead depth;
- :func:`step_time_ecdf`: each run's step times as an empirical CDF.

Data: a mapping ``label -> Result | summary dict | steps DataFrame`` (or, for
:func:`stall_breakdown`, a DataFrame of summaries indexed by label); a single Result is
one run labelled by its config's name.

Imports: matplotlib (never pyplot), numpy, pandas and :mod:`simwar.analysis.metrics`.
Nothing here prints or writes files.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from simwar.analysis.metrics import measured
from simwar.plots.axes import new_axes

__all__ = ["stall_breakdown", "launch_ahead_hist", "step_time_ecdf"]


def _summaries(data) -> pd.DataFrame:
    """One row of summary metrics per label."""
    if isinstance(data, pd.DataFrame):
        return data
    rows = {}
    for label, value in _as_mapping(data).items():
        if isinstance(value, Mapping):
            rows[label] = dict(value)
        elif isinstance(value, pd.DataFrame):
            rows[label] = {f"{c}_mean": float(value[c].mean()) for c in value.columns
                           if c.endswith("_us")}
        else:
            rows[label] = dict(value.summary)
    return pd.DataFrame.from_dict(rows, orient="index")


def _step_frames(data) -> dict[str, pd.DataFrame]:
    """Measured steps (after warm-up, with a successor) per label."""
    out = {}
    for label, value in _as_mapping(data).items():
        if isinstance(value, pd.DataFrame):
            out[label] = value
        else:
            out[label] = measured(value.steps, value.config.warmup_steps)
    return out


def _as_mapping(data) -> Mapping:
    if isinstance(data, Mapping):
        return data
    if hasattr(data, "summary"):
        return {getattr(data.config, "name", "run"): data}
    raise TypeError("expected a mapping label -> Result / summary / steps frame")


def stall_breakdown(data, ax: Axes | None = None) -> Axes:
    """Per run, two stacked bars (µs per step): GPU idle by cause, CPU blocked by site."""
    df = _summaries(data)
    ax = new_axes(ax)
    gpu = [("gpu_idle_dep_us_mean", "GPU idle: waiting on a dependency", "#f2cf5b"),
           ("gpu_idle_host_us_mean", "GPU idle: nothing enqueued (host)", "#e45756")]
    sites = sorted(c for c in df.columns if c.startswith("cpu_blocked_") and c.endswith("_us_mean")
                   and c != "cpu_blocked_us_mean")
    site_colors = ["#bab0ac", "#9d755d", "#b279a2", "#72b7b2", "#4c78a8", "#ff9da6"]
    cpu = [(c, f"CPU blocked: {c[len('cpu_blocked_'):-len('_us_mean')]}",
            site_colors[i % len(site_colors)]) for i, c in enumerate(sites)]
    x = np.arange(len(df))
    width = 0.38
    for offset, parts, group in ((-width / 2 - 0.01, gpu, "gpu"), (width / 2 + 0.01, cpu, "cpu")):
        bottom = np.zeros(len(df))
        for col, label, color in parts:
            vals = df[col].fillna(0.0).to_numpy(dtype=float) if col in df else np.zeros(len(df))
            if not vals.any():
                continue
            ax.bar(x + offset, vals, width, bottom=bottom, color=color, label=label,
                   hatch="////" if group == "cpu" else None, edgecolor="white", linewidth=0.5,
                   gid=f"bar:{col}")
            bottom += vals
    ax.set_xticks(x, [str(i) for i in df.index], rotation=20 if len(df) > 4 else 0)
    ax.set_ylabel("µs per step")
    ax.set_title("Stalls per step: GPU idle (left bar) and CPU blocked (right bar)",
                 loc="left", fontsize=10)
    top = max((b.get_y() + b.get_height() for b in ax.patches), default=1.0)
    ax.set_ylim(0, top * 1.35 or 1.0)  # headroom for the legend
    ax.legend(fontsize=7, frameon=False, loc="upper left", ncol=2)
    ax.grid(axis="y", color="#eeeeee")
    ax.set_axisbelow(True)
    return ax


def launch_ahead_hist(data, ax: Axes | None = None) -> Axes:
    """Share of launches at each launch-ahead depth, one bar group per depth, a bar per run."""
    frames = _step_frames(data)
    ax = new_axes(ax)
    depths = sorted({int(d) for f in frames.values() for d in f.launch_ahead.dropna()})
    width = 0.8 / max(len(frames), 1)
    for i, (label, f) in enumerate(frames.items()):
        share = f.launch_ahead.dropna().astype(int).value_counts(normalize=True)
        ax.bar(np.arange(len(depths)) + (i - (len(frames) - 1) / 2) * width,
               [share.get(d, 0.0) for d in depths], width, label=str(label), gid=f"hist:{label}")
    ax.set_xticks(range(len(depths)), [str(d) for d in depths])
    ax.set_xlabel("forwards launched ahead and unfinished at each launch")
    ax.set_ylabel("share of launches")
    ax.set_ylim(0, 1.3)  # headroom for the legend
    ax.set_yticks(np.linspace(0, 1, 6))
    ax.legend(fontsize=7, frameon=False, loc="upper left", ncol=min(len(frames), 4))
    ax.set_title("Launch-ahead depth", loc="left", fontsize=10)
    return ax


def step_time_ecdf(data, ax: Axes | None = None) -> Axes:
    """Step-time distribution per run as an empirical CDF (reads well when runs are constant)."""
    frames = _step_frames(data)
    ax = new_axes(ax)
    for label, f in frames.items():
        v = np.sort(f.step_us.dropna().to_numpy(dtype=float))
        if len(v) == 0:
            continue
        ax.step(np.concatenate([[v[0]], v]), np.concatenate([[0.0], np.arange(1, len(v) + 1)
                                                             / len(v)]),
                where="post", label=f"{label} (mean {v.mean():.0f} µs)", gid=f"ecdf:{label}")
    ax.set_xlabel("step time (µs)")
    ax.set_ylabel("fraction of steps ≤ x")
    ax.set_ylim(0, 1.02)
    ax.legend(fontsize=7, frameon=False)
    ax.grid(color="#eeeeee")
    ax.set_title("Step-time distribution", loc="left", fontsize=10)
    return ax


