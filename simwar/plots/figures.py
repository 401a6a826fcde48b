"""Plots of runs and sweeps: each function takes data and an optional Axes and returns the Axes.

- :func:`timeline`: one lane per actor (the CPU thread, then each stream),
  spans coloured by kind (a kernel in the graph colour when its issuing call
  was a graph launch: ``Trace.graph_node``), host blocks hatched,
  record→wait / record→sync edges (``ops.bound``) as arrows, races outlined
  in red on both accesses (by op id), step boundaries labelled,
  forward-stream bubbles shaded and explained (:func:`bubbles` and
  :func:`story`, from :mod:`simwar.analysis.bubbles`, find them and follow
  the waits that caused them).
- :func:`stall_figure`: a timeline over a few steps above a zoom on the
  first bubble: the picture that shows what a barrier costs.

Both look only at their window (:func:`simwar.analysis.views.window`): its
spans, ops and bubbles, so a few steps of a long run cost a few steps.
- comparisons: :func:`stall_breakdown` (GPU idle by cause and CPU blocked by
  site, per run), :func:`launch_ahead_hist`, :func:`step_time_ecdf`;
  sweeps: :func:`sweep_lines` (a metric against a swept key, one line per
  hue) and :func:`sweep_heatmap`.
- workloads whose steps differ: :func:`by_batch` (step time and forward gap
  against the batch, by graph bucket), :func:`regime_steps` (batch, step time,
  forward gap and launch lead step by step, host-bound steps shaded) and
  :func:`workload_figure` (both).

Data: a :class:`simwar.api.Result` or a :class:`simwar.core.trace.Trace` for the
timeline; for comparisons a mapping ``label -> Result | summary dict | steps
DataFrame`` (or a DataFrame of summaries indexed by label); for sweeps the
DataFrame ``simwar.sweep`` returns (or its ``results.parquet``).

Everything drawn is read from the Trace's columns, :mod:`simwar.analysis`
(views, bubbles, metrics, hazards) and the relations by id; nothing here
matches labels or times.

Imports: matplotlib (never pyplot, so any backend and no global figure
state), numpy, pandas and simwar's trace-level modules. Nothing here prints
or writes files: callers save the figure.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle
from matplotlib.transforms import blended_transform_factory

from simwar.analysis import views
from simwar.analysis.bubbles import Bubble, Hop, _Walk, bubbles, story
from simwar.core.trace import HOST, SPAN_KINDS, SpanKind, Trace

__all__ = ["timeline", "stall_figure", "bubbles", "story", "Bubble", "Hop", "default_window",
           "stall_breakdown", "launch_ahead_hist", "step_time_ecdf", "sweep_lines",
           "sweep_heatmap", "by_batch", "regime_steps", "workload_figure"]

#: fill colours by span kind; ``graph`` is a kernel launched as a CUDA-graph node
KIND_COLORS = {
    "cpu": "#4c78a8",
    "api": "#f58518",
    "blocked": "#d8d8d8",
    "kernel": "#54a24b",
    "graph": "#9bd18b",
    "wait": "#f2cf5b",
}
KIND_NAMES = {
    "cpu": "CPU work",
    "api": "host API call",
    "blocked": "host blocked (synchronize)",
    "kernel": "kernel",
    "graph": "CUDA-graph kernel",
    "wait": "stream held by a wait",
}
RACE_COLOR = "#d62728"
BUBBLE_COLOR = "#d62728"
CAUSE_COLOR = "#7a3da8"
EDGE_COLORS = {"record_wait": "#444444", "record_sync": "#7a3da8"}
LANE_TITLES = {HOST: "CPU thread"}
_LANE_HEIGHT = 0.72


# --------------------------------------------------------------------------- inputs
def _unpack(data, races=None):
    """(trace, races list, warm-up) from a Result or a Trace."""
    trace = getattr(data, "trace", data)
    if not isinstance(trace, Trace):
        raise TypeError(f"expected a Result or a Trace, got {type(data).__name__}")
    warmup = int(trace.meta.get("warmup_steps", 0))
    if races is None:
        hazards = getattr(data, "hazards", None)
        if hazards is None and len(trace.accesses):
            from simwar.analysis.hazards import detect

            hazards = detect(trace)
        races = hazards.races if hazards is not None else []
    return trace, list(races), warmup


def _step_markers(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    """(step, time) of the ``step`` markers."""
    m = trace.markers
    pick = m.name == trace.code("step")
    return m.step[pick], m.time_us[pick]


def default_window(trace: Trace, n: int = 3) -> tuple[int, int]:
    """``n`` steps starting right after warm-up (or as late as the run allows)."""
    marked, _ = _step_markers(trace)
    steps = np.unique(marked[marked >= 0]).tolist()
    if not steps:
        return (0, n - 1)
    last = steps[-2] if len(steps) > 1 else steps[-1]  # the final marker is the drain
    first = min(int(trace.meta.get("warmup_steps", 0)), max(steps[0], last - n + 1))
    return (first, min(first + n - 1, last))


def time_range(trace: Trace, window: tuple[int, int]) -> tuple[float, float]:
    """From step ``a``'s marker to the end of step ``b``'s spans: steps ``a..b``, both included.

    Step ``b``'s device work is drawn to its end; nothing of step ``b+1`` is drawn (the
    timeline draws the window's spans only, and earlier steps' spans that overlap it).
    """
    a, b = window
    sl = trace.step_slice(a, b)
    if sl.stop <= sl.start:
        raise ValueError(f"steps {a}..{b}: no spans in this trace")
    steps, times = _step_markers(trace)
    starts = times[steps == a]
    x0 = float(starts[0]) if len(starts) else float(trace.spans.start_us[sl].min())
    return x0, float(trace.spans.end_us[sl].max())


# --------------------------------------------------------------------------- timeline
class _Drawn:
    """What a timeline draws: the spans over ``[x0, x1]`` (none of a step after ``last``),
    and the window of their steps (for ops, edges and bubbles)."""

    def __init__(self, trace: Trace, x0: float, x1: float, last: int | None):
        spans = trace.spans
        ids = views.spans_between(trace, x0, x1)
        if last is not None:
            ids = ids[spans.step[ids] <= last]
        self.trace, self.x0, self.x1, self.last = trace, x0, x1, last
        self.ids = ids
        steps = spans.step[ids]
        first = int(steps.min()) if len(ids) else 0
        self.window = views.window(trace, first, last if last is not None else
                                   (int(steps.max()) if len(ids) else 0))
        # draw kinds: a kernel issued by a graph launch is a graph node
        kinds = np.array(SPAN_KINDS, dtype=object)[spans.kind[ids]]
        kern = spans.kind[ids] == SpanKind.KERNEL
        graph = np.zeros(len(ids), dtype=bool)
        kops = spans.op[ids][kern]
        has = kops >= 0
        graph_k = np.zeros(len(kops), dtype=bool)
        graph_k[has] = views.graph_node(trace, kops[has])
        graph[np.flatnonzero(kern)] = graph_k
        kinds[graph] = "graph"
        self.kinds = kinds

    def of(self, lane_code: int, kind: str) -> np.ndarray:
        """Positions (into ``ids``) of the drawn spans of one lane and draw kind."""
        return np.flatnonzero((self.trace.spans.lane[self.ids] == lane_code)
                              & (self.kinds == kind))


def timeline(data, ax: Axes | None = None, *, steps: tuple[int, int] | None = None,
             xlim_us: tuple[float, float] | None = None, races=None, edges: bool = True,
             annotate: bool = True, explain: bool = True, labels: bool = True,
             legend: bool = True, title: str | None = None) -> Axes:
    """A stall timeline of ``data`` (Result or Trace) over steps ``a..b`` (inclusive).

    One lane per actor: ``cpu`` (the scheduler thread) on top, then the streams
    (``schedule``, ``plan``, ``forward``, ``copy``, ``d2h``, those present). The
    time range runs from step ``a``'s marker to the end of step ``b``'s spans;
    nothing of step ``b + 1`` is drawn. ``xlim_us`` zooms to a time range
    instead (every span in it is drawn). ``races`` defaults to the run's races
    after warm-up; pass ``()`` to hide them. With ``annotate`` each
    forward-stream bubble is shaded, its idle time written on it, and the
    waits that caused it outlined; with ``explain`` the first one's cause is
    written out below the axes (:func:`story`). The cost is that of the
    window: only its spans, ops and bubbles are looked at.
    """
    trace, race_list, warmup = _unpack(data, races)
    if races is None:
        race_list = [r for r in race_list if r.second_step >= warmup]
    window = steps if steps is not None else default_window(trace)
    if window[0] > window[1]:
        raise ValueError(f"steps window {window[0]}:{window[1]} is empty")
    if xlim_us is None:
        x0, x1 = time_range(trace, window)
        drawn = _Drawn(trace, x0, x1, window[1])
    else:
        x0, x1 = xlim_us
        drawn = _Drawn(trace, x0, x1, None)
    if ax is None:
        ax = Figure(figsize=(13, 4.2), layout="constrained").add_subplot()

    spans = trace.spans
    lanes = views.lanes(trace, ops=False)
    y = {lane: i for i, lane in enumerate(lanes)}
    ms = 1e-3  # the axis is in ms: steps are milliseconds long
    start, end = spans.start_us[drawn.ids], spans.end_us[drawn.ids]

    for lane in lanes:
        code = trace.code(lane)
        for kind in ("cpu", "api", "blocked", "kernel", "graph", "wait"):
            pos = drawn.of(code, kind)
            if not len(pos):
                continue
            ax.broken_barh(list(zip((start[pos] * ms).tolist(),
                                    ((end[pos] - start[pos]) * ms).tolist())),
                           (y[lane] - _LANE_HEIGHT / 2, _LANE_HEIGHT),
                           facecolors=KIND_COLORS[kind],
                           edgecolors="#555555" if kind == "blocked" else "white",
                           linewidth=0.4, hatch="////" if kind == "blocked" else None,
                           gid=f"span:{lane}:{kind}")

    _step_boundaries(ax, trace, x0, x1, ms, drawn.last)
    if edges:
        _edges(ax, drawn, y, ms)
    raced = _race_spans(drawn, race_list)
    if len(raced):
        lane_of = [trace.text(int(c)) for c in spans.lane[raced]]
        rs, re_ = spans.start_us[raced] * ms, spans.end_us[raced] * ms
        ax.broken_barh(list(zip(rs.tolist(), (re_ - rs).tolist())), (0, 1), facecolors="none",
                       edgecolors=RACE_COLOR, linewidth=1.8, gid="races")
        # broken_barh takes one y-range; move each outline to its own lane
        coll = ax.collections[-1]
        coll.set_verts([[(a, y[lane] - _LANE_HEIGHT / 2), (a, y[lane] + _LANE_HEIGHT / 2),
                         (b, y[lane] + _LANE_HEIGHT / 2), (b, y[lane] - _LANE_HEIGHT / 2)]
                        for a, b, lane in zip(rs.tolist(), re_.tolist(), lane_of)])

    ax.set_xlim(x0 * ms, x1 * ms)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_yticks(range(len(lanes)), [_lane_title(lane) for lane in lanes])
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", color="#eeeeee", linewidth=0.6)
    ax.set_axisbelow(True)

    if annotate:
        walk = _Walk(trace)
        window_bubbles = [b for b in bubbles(drawn.window) if b.end_us > x0 and b.start_us < x1]
        _draw_bubbles(ax, window_bubbles, y, ms, walk if explain else None)
    if labels:
        _span_labels(ax, drawn, y, ms)
    if title is None:
        m = trace.meta
        asked, applied = m.get("barrier", "?"), m.get("barrier_effective", m.get("barrier", "?"))
        title = (f"{m.get('algorithm', '')}: barrier {asked}"
                 + (f" (applied: {applied})" if applied != asked else "")
                 + (f", steps {window[0]}–{window[1]}" if xlim_us is None else ""))
    ax.set_title(title, loc="left", fontsize=10, pad=14)
    if legend:
        _legend(ax, set(drawn.kinds.tolist()), bool(len(raced)), edges)
    return ax


def _lane_title(lane: str) -> str:
    return lane  # lane names are the vocabulary of configs and frames; keep them verbatim


def _step_boundaries(ax: Axes, trace: Trace, x0: float, x1: float, ms: float,
                     last: int | None) -> None:
    top = blended_transform_factory(ax.transData, ax.transAxes)
    steps, times = _step_markers(trace)
    pick = (times >= x0 - 1e-6) & (times <= x1)
    if last is not None:
        pick &= steps <= last
    for step, t in zip(steps[pick].tolist(), times[pick].tolist()):
        ax.axvline(t * ms, color="#888888", linestyle=":", linewidth=0.9, gid=f"step:{step}")
        ax.text(t * ms, 1.0, f" step {step}", transform=top, fontsize=8, va="bottom",
                ha="left", color="#555555", gid=f"steplabel:{step}")


def _edges(ax: Axes, drawn: _Drawn, y: dict, ms: float) -> None:
    """record → wait and record → host sync arrows whose two ends are in the drawn range."""
    trace = drawn.trace
    ops = trace.ops
    x0, x1 = drawn.x0, drawn.x1
    for e in views.edges(drawn.window):
        if e.kind == "launch":
            continue
        src_lane, dst_lane = trace.text(int(ops.lane[e.src])), trace.text(int(ops.lane[e.dst]))
        if src_lane not in y or dst_lane not in y or src_lane == dst_lane:
            continue
        src_us, dst_us = float(ops.end_us[e.src]), float(ops.end_us[e.dst])
        if not (x0 <= src_us <= x1 and x0 <= dst_us <= x1):
            continue
        sy, dy = y[src_lane], y[dst_lane]
        off = _LANE_HEIGHT / 2 * (1 if dy > sy else -1)
        arrow = FancyArrowPatch((src_us * ms, sy + off), (dst_us * ms, dy - off),
                                arrowstyle="-|>", mutation_scale=7, linewidth=0.8,
                                color=EDGE_COLORS.get(e.kind, "#444444"), alpha=0.8,
                                shrinkA=0, shrinkB=0, zorder=4, gid=f"edge:{e.kind}")
        ax.add_patch(arrow)


def _race_spans(drawn: _Drawn, races) -> np.ndarray:
    """The drawn kernel spans of both accesses of each race (by op id)."""
    raced_ops = {op for r in races for op in (r.first_op, r.second_op)}
    if not raced_ops:
        return np.zeros(0, dtype=np.int64)
    spans = drawn.trace.spans
    ids = drawn.ids[spans.kind[drawn.ids] == SpanKind.KERNEL]
    return ids[np.isin(spans.op[ids], np.fromiter(raced_ops, dtype=np.int64))]


def _draw_bubbles(ax: Axes, found: list[Bubble], y: dict, ms: float, walk) -> None:
    for i, b in enumerate(found):
        fy = y.get(b.hops[0].lane if b.hops else "forward", y.get("forward", 0))
        ax.add_patch(Rectangle((b.start_us * ms, -0.5), b.idle_us * ms, len(y),
                               facecolor=BUBBLE_COLOR, alpha=0.10, edgecolor="none",
                               zorder=0.5, gid="bubble"))
        ax.add_patch(Rectangle((b.start_us * ms, fy - _LANE_HEIGHT / 2), b.idle_us * ms,
                               _LANE_HEIGHT, facecolor="none", edgecolor=BUBBLE_COLOR,
                               linewidth=1.6, zorder=5, gid="bubble"))
        ax.annotate(f"GPU idle\n{b.idle_us:.0f} µs", ((b.start_us + b.end_us) / 2 * ms,
                                                     fy + _LANE_HEIGHT / 2),
                    xytext=(0, -2), textcoords="offset points", ha="center", va="top",
                    fontsize=7, color=BUBBLE_COLOR, fontweight="bold", zorder=6,
                    gid="bubble_label")
        for hop in b.hops[1:]:  # the waits upstream of the forward stream's own wait
            s = hop.span
            ax.add_patch(Rectangle((s.start_us * ms, y[hop.lane] - _LANE_HEIGHT / 2),
                                   (s.end_us - s.start_us) * ms, _LANE_HEIGHT,
                                   facecolor="none", edgecolor=CAUSE_COLOR, linewidth=1.8,
                                   linestyle="--", zorder=5, gid="bubble_cause"))
        if walk is not None and i == 0:
            _explain_box(ax, b, y, ms, walk)


def _explain_box(ax: Axes, b: Bubble, y: dict, ms: float, walk) -> None:
    text = "Why the GPU idles:\n" + "\n".join(f"{i + 1}. {line}"
                                              for i, line in enumerate(story(walk, b)))
    root = b.hops[-1] if b.hops else None
    if root is not None:
        s = root.span
        x_lo, x_hi = (v / ms for v in ax.get_xlim())
        tip = min(s.end_us, x_hi) - 0.05 * (min(s.end_us, x_hi) - max(s.start_us, x_lo))
        target = (tip * ms, y[root.lane])
    else:
        target = ((b.start_us + b.end_us) / 2 * ms, y.get("forward", 0))
    ax.annotate(text, target, xytext=(0.0, -0.22), textcoords="axes fraction",
                fontsize=8, ha="left", va="top", color="#222222", linespacing=1.4,
                bbox={"boxstyle": "round,pad=0.5", "fc": "#fff6f6", "ec": BUBBLE_COLOR, "lw": 0.8},
                arrowprops={"arrowstyle": "->", "color": CAUSE_COLOR, "lw": 1.0,
                                "connectionstyle": "arc3,rad=-0.2"},
                annotation_clip=False, zorder=7, gid="bubble_explain")


def _span_labels(ax: Axes, drawn: _Drawn, y: dict, ms: float) -> None:
    """Write a span's label inside it when it fits (measured in pixels after layout)."""
    trace = drawn.trace
    spans = trace.spans
    x0, x1 = ax.get_xlim()
    width_px = ax.get_window_extent().width or 800.0
    px_per_ms = width_px / max(x1 - x0, 1e-9)
    char_px = 4.6  # 7-pt sans serif, about
    ids = drawn.ids
    lo = np.maximum(spans.start_us[ids] * ms, x0)
    hi = np.minimum(spans.end_us[ids] * ms, x1)
    room = (hi - lo) * px_per_ms
    # a label needs room for a few characters at least; API calls are too short to label
    for i in np.flatnonzero((room >= char_px + 6) & (drawn.kinds != "api")).tolist():
        s = int(ids[i])
        label = views.span_text(trace, s)
        if room[i] < char_px * len(label) + 6:
            continue
        dark = drawn.kinds[i] == "cpu"
        ax.text((lo[i] + hi[i]) / 2, y[trace.text(int(spans.lane[s]))], label, ha="center",
                va="center", fontsize=7, color="white" if dark else "#222222", clip_on=True,
                zorder=3, gid="span_label")


def _legend(ax: Axes, kinds: set, raced: bool, edges: bool) -> None:
    handles = [Patch(facecolor=KIND_COLORS[k], edgecolor="#555555" if k == "blocked" else "none",
                     hatch="////" if k == "blocked" else None, label=KIND_NAMES[k])
               for k in KIND_COLORS if k in kinds]
    if edges:
        handles.append(Line2D([], [], color=EDGE_COLORS["record_wait"], lw=0.9, marker=">",
                              markersize=4, label="record → wait"))
        handles.append(Line2D([], [], color=EDGE_COLORS["record_sync"], lw=0.9, marker=">",
                              markersize=4, label="record → host sync"))
    if any(getattr(a, "get_gid", lambda: None)() == "bubble" for a in ax.patches):
        handles.append(Patch(facecolor=BUBBLE_COLOR, alpha=0.25, label="forward-stream bubble"))
        if any(a.get_gid() == "bubble_cause" for a in ax.patches):
            handles.append(Patch(facecolor="none", edgecolor=CAUSE_COLOR, linestyle="--",
                                 label="wait that caused it"))
    if raced:
        handles.append(Patch(facecolor="none", edgecolor=RACE_COLOR, lw=1.8,
                             label="race (both accesses)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=7,
              frameon=False)


def stall_figure(data, steps: tuple[int, int] | None = None, *, zoom_us: float = 900.0,
                 figsize=(13, 7.2), fig: Figure | None = None) -> Figure:
    """A timeline over ``steps`` above a zoom on its first forward-stream bubble.

    Without a bubble in the window the figure holds the timeline alone. ``fig``:
    draw into this (empty) figure, e.g. one made by pyplot in a notebook. Only
    the window's steps are examined.
    """
    trace, race_list, warmup = _unpack(data)
    window = steps if steps is not None else default_window(trace)
    found = bubbles(views.window(trace, *window)) if window[0] <= window[1] else []
    if fig is None:
        fig = Figure(figsize=figsize if found else (figsize[0], figsize[1] * 0.55),
                     layout="constrained")
    races = [r for r in race_list if r.second_step >= warmup]
    if not found:
        timeline(trace, fig.add_subplot(), steps=window, races=races)
        return fig
    top, bottom = fig.subplots(2, 1, height_ratios=(1.2, 1))
    timeline(trace, top, steps=window, races=races, explain=False)
    b = found[0]
    pad = max(zoom_us - b.idle_us, 0.0) / 2
    timeline(trace, bottom, xlim_us=(b.start_us - pad, b.end_us + pad), races=races,
             legend=False, title=f"Zoom: the {b.idle_us:.0f} µs bubble before forward {b.step}")
    return fig


# --------------------------------------------------------------------------- comparisons
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
    from simwar.analysis.metrics import measured

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


def _new_ax(ax: Axes | None, figsize=(7, 4)) -> Axes:
    return ax if ax is not None else Figure(figsize=figsize, layout="constrained").add_subplot()


def stall_breakdown(data, ax: Axes | None = None) -> Axes:
    """Per run, two stacked bars (µs per step): GPU idle by cause, CPU blocked by site."""
    df = _summaries(data)
    ax = _new_ax(ax)
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
    ax = _new_ax(ax)
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
    ax = _new_ax(ax)
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


# --------------------------------------------------------------------------- workloads
def _measured_steps(data) -> pd.DataFrame:
    """The measured steps (after warm-up, with a successor) of a Result or a steps frame."""
    if isinstance(data, pd.DataFrame):
        return data
    from simwar.analysis.metrics import measured

    return measured(data.steps, data.config.warmup_steps)


def by_batch(data, ax: Axes | None = None) -> Axes:
    """Step time and forward gap of every measured step against its batch size, coloured by
    graph bucket (a Result, or a per-step DataFrame)."""
    df = _measured_steps(data)
    ax = _new_ax(ax)
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
    steps (the forward stream idle with nothing enqueued) shaded."""
    df = _measured_steps(data)
    if steps is None:
        first = int(df.step.min()) if len(df) else 0
        steps = (first, first + 71)
    df = df[(df.step >= steps[0]) & (df.step <= steps[1])]
    ax = _new_ax(ax, figsize=(11, 4))
    x = df.step.to_numpy()
    host_bound = (df.gpu_idle_host_us > 0).to_numpy()
    for k, flag in zip(x, host_bound):
        if flag:
            ax.axvspan(k - 0.5, k + 0.5, color="#fde0dd", lw=0, gid=f"host_bound:{k}")
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
    handles += [Patch(color="#fde0dd", label="host-bound step (GPU waited on the host)"),
                Line2D([], [], color="#888888", label="batch size (right axis)")]
    ax.legend(handles=handles, fontsize=7, frameon=False, loc="upper left", ncol=3)
    ax.set_title("Regime flips: host-bound (shaded) and device-bound steps", loc="left",
                 fontsize=10)
    return ax


def workload_figure(data, steps: tuple[int, int] | None = None, *, fig: Figure | None = None) \
        -> Figure:
    """:func:`by_batch` beside :func:`regime_steps`."""
    fig = fig or Figure(figsize=(15, 4.6), layout="constrained")
    left, right = fig.subplots(1, 2, width_ratios=[1, 2.2])
    by_batch(data, ax=left)
    regime_steps(data, ax=right, steps=steps)
    return fig


# --------------------------------------------------------------------------- sweeps
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
    ax = _new_ax(ax)
    groups = list(df.groupby(hue, sort=True)) if hue else [(None, df)]
    categorical = not pd.api.types.is_numeric_dtype(df[x])
    categories = sorted(df[x].dropna().unique(), key=str) if categorical else []
    position = {value: i for i, value in enumerate(categories)}
    for i, (key, g) in enumerate(groups):
        agg = g.groupby(x, sort=True)[y].agg(["mean", "min", "max"])
        label = f"{hue}={key}" if hue else y
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
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    if hue:
        ax.legend(fontsize=8, frameon=False)
    ax.grid(color="#eeeeee")
    return ax


def sweep_heatmap(df: pd.DataFrame, x: str, y: str, value: str, ax: Axes | None = None,
                  fmt: str = "{:.0f}", cmap: str = "viridis") -> Axes:
    """Mean of ``value`` over the grid of two swept keys, annotated cell by cell."""
    _check_columns(df, x, y, value)
    _check_numeric(df, value)
    ax = _new_ax(ax)
    grid = df.pivot_table(index=y, columns=x, values=value, aggfunc="mean").sort_index()
    im = ax.imshow(grid.to_numpy(dtype=float), aspect="auto", origin="lower", cmap=cmap)
    ax.set_xticks(range(grid.shape[1]), [str(c) for c in grid.columns])
    ax.set_yticks(range(grid.shape[0]), [str(i) for i in grid.index])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    values = grid.to_numpy(dtype=float)
    finite = values[np.isfinite(values)]
    mid = (finite.min() + finite.max()) / 2 if finite.size else 0.0
    for (i, j), v in np.ndenumerate(values):
        if np.isfinite(v):
            ax.text(j, i, fmt.format(v), ha="center", va="center", fontsize=7,
                    color="white" if v < mid else "black")
    ax.figure.colorbar(im, ax=ax, label=value)
    return ax
