"""Stall timelines: one lane per actor, the spans of a few steps, and why the GPU idled.

- :func:`timeline`: one lane per actor (the CPU thread, then each stream),
  spans coloured by kind (a kernel in the graph colour when its issuing call
  was a graph launch: ``Trace.graph_node``), host blocks hatched,
  record→wait / record→sync edges (``ops.bound``) as arrows, races outlined
  in red on both accesses (by op id), step boundaries labelled,
  forward-stream bubbles shaded and explained (``bubbles`` and ``story`` of
  :mod:`simwar.analysis.bubbles` find them and follow the waits that caused
  them).
- :func:`stall_figure`: a timeline over a few steps above a zoom on the
  first bubble: the picture that shows what a barrier costs.
- :func:`default_window` and :func:`time_range`: the steps drawn by default, and the
  time range a window of steps covers.

Both figures look only at their window (:func:`simwar.analysis.views.window`): its
spans, ops and bubbles, so a few steps of a long run cost a few steps. Everything drawn
is read from the Trace's columns and the relations by id; nothing here matches labels or
times.

The module is ``timelines``, not ``timeline``: ``simwar.plots`` exports the function
:func:`timeline`, which would hide a submodule of the same name.

Imports: matplotlib (never pyplot), numpy, :mod:`simwar.core.trace` and
:mod:`simwar.analysis`. Nothing here prints or writes files.
"""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle
from matplotlib.transforms import blended_transform_factory

from simwar.analysis import views
from simwar.analysis.bubbles import Bubble, bubbles, story
from simwar.analysis.hazards import detect
from simwar.core.trace import SPAN_KINDS, SpanKind, Trace

__all__ = ["timeline", "stall_figure", "default_window", "time_range"]

#: fill colours by span kind; ``graph`` is a kernel launched as a CUDA-graph node
SPAN_KIND_COLORS = {
    "cpu": "#4c78a8",
    "api": "#f58518",
    "blocked": "#d8d8d8",
    "kernel": "#54a24b",
    "graph": "#9bd18b",
    "wait": "#f2cf5b",
}
#: legend entries by span kind
SPAN_KIND_NAMES = {
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
_LANE_HEIGHT = 0.72


# --------------------------------------------------------------------------- inputs
def _unpack(data, races=None):
    """(trace, races list, warm-up) from a Result or a Trace."""
    trace = getattr(data, "trace", data)
    if not isinstance(trace, Trace):
        raise TypeError(f"expected a Result or a Trace, got {type(data).__name__}")
    warmup = trace.run.warmup_steps
    if races is None:
        hazards = getattr(data, "hazards", None)
        if hazards is None and len(trace.accesses):
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
    first = min(trace.run.warmup_steps, max(steps[0], last - n + 1))
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
                           facecolors=SPAN_KIND_COLORS[kind],
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
        window_bubbles = [b for b in bubbles(drawn.window) if b.end_us > x0 and b.start_us < x1]
        _draw_bubbles(ax, window_bubbles, y, ms, trace if explain else None)
    if labels:
        _span_labels(ax, drawn, y, ms)
    if title is None:
        run = trace.run
        asked = "?" if run.barrier is None else run.barrier
        applied = asked if run.barrier_effective is None else run.barrier_effective
        title = (f"{run.algorithm}: barrier {asked}"
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


def _draw_bubbles(ax: Axes, found: list[Bubble], y: dict, ms: float,
                  explained: Trace | None) -> None:
    """Shade each bubble and outline the waits behind it; write out the first one's cause
    when ``explained`` (the trace its story is told from) is given."""
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
        if explained is not None and i == 0:
            _explain_box(ax, b, y, ms, explained)


def _explain_box(ax: Axes, b: Bubble, y: dict, ms: float, trace: Trace) -> None:
    text = "Why the GPU idles:\n" + "\n".join(f"{i + 1}. {line}"
                                              for i, line in enumerate(story(trace, b)))
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
    handles = [Patch(facecolor=SPAN_KIND_COLORS[k],
                     edgecolor="#555555" if k == "blocked" else "none",
                     hatch="////" if k == "blocked" else None, label=SPAN_KIND_NAMES[k])
               for k in SPAN_KIND_COLORS if k in kinds]
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


