"""The critical-path chain of a step drawn over its timeline (``simwar explain --timeline``).

:func:`chain_figure` draws every span of a step's window in grey on its lane and the step
chain of :func:`simwar.analysis.critical_path.critical_path` over it, each segment outlined
in the colour of its cause kind (:data:`CAUSE_KIND_COLORS`; the timeline's span colours
are :data:`simwar.plots.timelines.SPAN_KIND_COLORS`), with the gap sentence below.

Imports: matplotlib (never pyplot), :mod:`simwar.core.trace` and
:mod:`simwar.analysis.critical_path`. Nothing here prints or writes files.
"""

from __future__ import annotations

import textwrap

from matplotlib.figure import Figure
from matplotlib.patches import Patch

from simwar.analysis.critical_path import SegmentKind, sentence
from simwar.core.trace import HOST, SpanKind

__all__ = ["chain_figure", "CAUSE_KIND_COLORS"]

#: edge colours of the chain's segments by cause kind
CAUSE_KIND_COLORS = {SegmentKind.DEVICE: "#1f77b4", SegmentKind.CROSS_STREAM: "#9467bd",
                     SegmentKind.HOST: "#2ca02c", SegmentKind.HOST_API: "#17becf",
                     SegmentKind.WAKE_UP: "#d62728", SegmentKind.LAUNCH_LATENCY: "#ff7f0e",
                     SegmentKind.RANK: "#e377c2", SegmentKind.UNEXPLAINED: "#7f7f7f"}


def chain_figure(cp, step: int, figsize=(13, 4.6), *, fig: Figure | None = None) -> Figure:
    """A timeline of steps ``step``..``step+1`` with the step chain of ``step`` drawn over it
    (into ``fig`` when given, e.g. a pyplot figure that a notebook shows; else a new one).

    Every span in the window is drawn in grey on its lane (the CPU thread on top, then
    each stream; waits and host blocks hatched); the chain's segments are drawn in colour
    by kind on the lane they belong to, joined in time order, and the gap sentence is
    written below.
    """
    chain = next((c for c in cp.periods if c.step == step), None)
    if chain is None:
        raise ValueError(f"step {step} has no step chain in this critical path")
    trace = cp.trace
    spans = trace.spans
    x0, x1 = chain.start_us - 0.05 * chain.us, chain.end_us + 0.05 * chain.us
    inside = (spans.end_us >= x0) & (spans.start_us <= x1)
    lanes = [HOST] + [lane for lane in trace.lanes() if lane != HOST
                      and (inside & (spans.lane == trace.code(lane))).any()]
    lanes += [s.lane for s in chain.segments if s.lane not in lanes]
    y = {lane: i for i, lane in enumerate(dict.fromkeys(lanes))}
    fig = fig or Figure(figsize=figsize, layout="constrained")
    ax = fig.add_subplot()
    ms = 1e-3
    held = (spans.kind == SpanKind.WAIT) | (spans.kind == SpanKind.BLOCKED)
    for lane, i in y.items():
        for waiting in (False, True):
            pick = inside & (spans.lane == trace.code(lane)) & (held == waiting)
            bars = [(s * ms, (e - s) * ms) for s, e in zip(spans.start_us[pick].tolist(),
                                                           spans.end_us[pick].tolist())]
            ax.broken_barh(bars, (i - 0.3, 0.6), facecolors="#f4f4f4" if waiting else "#d8d8d8",
                           edgecolors="#bbbbbb" if waiting else "white", linewidth=0.4,
                           hatch="////" if waiting else None)
    points = []
    for s in chain.segments:
        i = y[s.lane]
        ax.broken_barh([(s.start_us * ms, s.us * ms)], (i - 0.36, 0.72), facecolors="none",
                       edgecolors=CAUSE_KIND_COLORS.get(s.kind, "black"), linewidth=2.0)
        points += [(s.start_us * ms, i), (s.end_us * ms, i)]
    if points:
        xs, ys = zip(*points)
        ax.plot(xs, ys, color="black", linewidth=0.8, alpha=0.6)
    ax.set_xlim(x0 * ms, x1 * ms)
    ax.set_ylim(len(y) - 0.5, -0.5)
    ax.set_yticks(range(len(y)), ["CPU thread" if lane == HOST else lane for lane in y])
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", color="#eeeeee", linewidth=0.6)
    ax.set_axisbelow(True)
    used = dict.fromkeys(s.kind for s in chain.segments)
    ax.legend(handles=[Patch(facecolor="none", edgecolor=CAUSE_KIND_COLORS.get(k, "black"),
                             linewidth=2, label=k) for k in used],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, title="chain")
    span = ("the step's start to its forward's end" if getattr(cp, "one_step", False)
            else f"forward {step}'s start to forward {step + 1}'s")
    ax.set_title(f"{trace.run.name}: the chain behind step {step} ({chain.us:.0f} µs, from "
                 f"{span})", loc="left", fontsize=10)
    fig.supxlabel("\n".join(textwrap.wrap(sentence(cp), 160)), fontsize=8, x=0.01,
                  ha="left")
    return fig
