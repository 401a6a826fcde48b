"""The Axes a figure function draws on when its caller passes none.

Shared by the comparison, workload and sweep figures. Imports: matplotlib only (never
pyplot, so no global figure state).
"""

from __future__ import annotations

from matplotlib.axes import Axes
from matplotlib.figure import Figure


def new_axes(ax: Axes | None, figsize=(7, 4)) -> Axes:
    """``ax`` itself, or the Axes of a new figure of ``figsize`` inches."""
    return ax if ax is not None else Figure(figsize=figsize, layout="constrained").add_subplot()
