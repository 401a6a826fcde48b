"""Figures of a run whose steps differ (a ``workload``): steps by batch, regime flips.

- :func:`by_batch`: step time and forward gap against the batch size, by graph bucket;
- :func:`regime_steps`: batch, step time, forward gap and launch lead step by step,
  host-bound steps shaded, and where the scheduler picked each step's shape (a ``shape``
  column) a band per prefill, mixed or idle step;
- :func:`workload_figure`: both, side by side (what ``simwar plot CONFIG.yaml`` draws).

Data: a :class:`simwar.api.Result` or its measured per-step DataFrame.

Imports: matplotlib (never pyplot), pandas and :mod:`simwar.analysis.metrics`. Nothing
here prints or writes files.
"""

from __future__ import annotations

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from simwar.analysis.metrics import measured
from simwar.plots.axes import new_axes

__all__ = ["SHAPE_COLORS", "by_batch", "regime_steps", "requests_over_time", "workload_figure"]

#: the band colour of each step shape that is not a plain decode step (``shape`` column)
SHAPE_COLORS = {"prefill": "#f58518", "mixed": "#b279a2", "idle": "#9d9da1"}
#: the legend's words for a shape's band (the band at the bottom of the step timeline)
SHAPE_LABELS = {"prefill": "prefill step (band at the bottom; decodes pause)",
                "mixed": "mixed step (band at the bottom)",
                "idle": "idle step (band at the bottom; a forward with no request)"}


def _measured_steps(data) -> pd.DataFrame:
    """The measured steps (after warm-up, with a successor) of a Result or a steps frame."""
    if isinstance(data, pd.DataFrame):
        return data
    return measured(data.steps, data.config.warmup_steps)


def by_batch(data, ax: Axes | None = None) -> Axes:
    """Step time and forward gap of every measured step against its batch size, coloured by
    graph bucket (a Result, or a per-step DataFrame)."""
    df = _measured_steps(data)
    ax = new_axes(ax)
    buckets = sorted(df.graph_bucket.unique())
    cmap = {b: f"C{i % 10}" for i, b in enumerate(buckets)}
    for b in buckets:
        g = df[df.graph_bucket == b]
        ax.scatter(g.batch_size, g.step_us, s=14, color=cmap[b], label=f"bucket {b}: step time",
                   gid=f"step:{b}")
        ax.scatter(g.batch_size, g.fwd_gap_us, s=14, color=cmap[b], marker="x",
                   label=f"bucket {b}: forward gap", gid=f"gap:{b}")
    ax.set_xlabel("batch size (requests in the step)")
    ax.set_ylabel("µs")
    ax.set_title("Step time (dots) and gap before the forward (crosses) by batch", loc="left",
                 fontsize=10)
    ax.legend(fontsize=7, frameon=False, ncol=2)
    ax.grid(color="#eeeeee")
    return ax


def regime_steps(data, ax: Axes | None = None, steps: tuple[int, int] | None = None) -> Axes:
    """Step by step over ``steps`` (A and B included; default: the first 72 measured): step
    time, forward gap and launch lead, the batch size on a second axis, and the host-bound
    steps shaded: those whose forward waited on the host (the forward stream idle with
    nothing enqueued between the previous forward's end and this one's: ``gpu_idle_host_us``
    of the same row as the gap before the forward)."""
    df = _measured_steps(data)
    if steps is None:
        first = int(df.step.min()) if len(df) else 0
        steps = (first, first + 71)
    df = df[(df.step >= steps[0]) & (df.step <= steps[1])]
    ax = new_axes(ax, figsize=(11, 4))
    x = df.step.to_numpy()
    host_bound = (df.gpu_idle_host_us > 0).to_numpy()
    for k, flag in zip(x, host_bound):
        if flag:
            ax.axvspan(k - 0.5, k + 0.5, color="#fde0dd", lw=0, gid=f"host_bound:{k}")
    # a run whose scheduler picked each step's shape: a band along the bottom per step, by
    # its shape (the table's ``shape`` column; decode steps unshaded; axvspan's ymin and
    # ymax are fractions of the axes' height)
    shapes = df["shape"].to_numpy() if "shape" in df.columns else None
    if shapes is not None:
        for k, shape in zip(x, shapes):
            if shape in SHAPE_COLORS:
                ax.axvspan(k - 0.5, k + 0.5, ymin=0, ymax=0.06, color=SHAPE_COLORS[shape],
                           lw=0, gid=f"shape:{shape}:{k}")
    ax.plot(x, df.step_us, "-o", ms=3, label="step time", color="#4c78a8", gid="line:step_us")
    ax.plot(x, df.fwd_gap_us, "-", label="gap before the forward", color="#e45756",
            gid="line:fwd_gap_us")
    ax.plot(x, df.launch_lead_us, "--", label="launch lead (next launch ahead of this "
            "forward's end)", color="#54a24b", gid="line:launch_lead_us")
    ax.axhline(0, color="#999999", lw=0.6)
    lo, hi = ax.get_ylim()
    ax.set_ylim(lo, hi + (hi - lo) * 0.3)  # room for the legend
    ax.set_xlabel("step")
    ax.set_ylabel("µs")
    twin = ax.twinx()
    twin.step(x, df.batch_size, where="mid", color="#888888", lw=1.0, gid="line:batch_size")
    twin.set_ylabel("batch size", color="#666666")
    twin.set_ylim(0, max(1, df.batch_size.max() if len(df) else 1) * 1.9)
    handles, labels = ax.get_legend_handles_labels()
    handles += [Patch(color="#fde0dd", label="host-bound step (its forward waited on the host)"),
                Line2D([], [], color="#888888", label="batch size (right axis)")]
    if shapes is not None:
        handles += [Patch(color=c, label=SHAPE_LABELS[name])
                    for name, c in SHAPE_COLORS.items() if name in set(shapes.tolist())]
    ax.legend(handles=handles, fontsize=7, frameon=False, loc="upper left", ncol=3)
    ax.set_title("Regime flips: host-bound (shaded) and device-bound steps", loc="left",
                 fontsize=10)
    return ax


def requests_over_time(requests: pd.DataFrame, ax: Axes | None = None,
                       window: int = 25) -> Axes:
    """TTFT (to the host and to the forward's end) and TPOT of each request against its
    arrival time, with their rolling means over ``window`` requests (``Result.requests``)."""
    ax = new_axes(ax)
    df = requests.sort_values("arrival_us")
    t = df.arrival_us.to_numpy() / 1e6
    for col, label, color in (("request_ttft_us", "TTFT (to the host)", "C3"),
                              ("request_ttft_forward_us", "TTFT (forward end)", "C1")):
        ax.scatter(t, df[col] / 1e3, s=6, color=color, alpha=0.35)
        ax.plot(t, df[col].rolling(window, min_periods=1).mean() / 1e3, color=color,
                label=f"{label}, mean of {window}")
    ax.set_xlabel("arrival time (s)")
    ax.set_ylabel("TTFT (ms)")
    right = ax.twinx()
    right.plot(t, df.request_tpot_us.rolling(window, min_periods=1).mean() / 1e3, color="C0",
               label=f"TPOT, mean of {window}")
    right.set_ylabel("TPOT (ms)")
    lines = ax.get_legend_handles_labels()
    more = right.get_legend_handles_labels()
    ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=8, loc="upper left")
    ax.set_title("requests over time")
    return ax


def workload_figure(data, steps: tuple[int, int] | None = None, *, fig: Figure | None = None) \
        -> Figure:
    """:func:`by_batch` beside :func:`regime_steps`; for a Result with requests,
    :func:`requests_over_time` below them."""
    requests = getattr(data, "requests", None) if hasattr(data, "config") else None
    if requests is not None and len(requests):
        fig = fig or Figure(figsize=(15, 8.6), layout="constrained")
        top, bottom = fig.subfigures(2, 1)
        left, right = top.subplots(1, 2, width_ratios=[1, 2.2])
        requests_over_time(requests, ax=bottom.subplots(1, 1))
    else:
        fig = fig or Figure(figsize=(15, 4.6), layout="constrained")
        left, right = fig.subplots(1, 2, width_ratios=[1, 2.2])
    by_batch(data, ax=left)
    regime_steps(data, ax=right, steps=steps)
    return fig


