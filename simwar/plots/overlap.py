"""The overlap on/off decision across load and forward time, with the crossover drawn.

:func:`decision_figure` draws a table of :func:`simwar.study.overlap.on_off_grid`: per
figure (TTFT to the host, TPOT, requests/s), the change overlap makes (on / off - 1) as a
colour map over the arrival rate (x) and the forward's mean length (y, the model's size),
red where overlap is worse, blue where it is better, and the crossover (no change) as a
black line. The cells' labels and the colour bar give the same number, the figure's own
change (+39 % requests/s is better, blue; +39 % TTFT is worse, red). What
``simwar plot CONFIG.yaml --on-off`` and notebooks/07 draw.

Imports: matplotlib (never pyplot), numpy, pandas. Nothing here prints or writes files.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure

#: column stem -> (title, lower is better, crossover drawn); at an open load below
#: saturation requests/s is the arrival rate either way: its changes are the run's noise
PANELS = {"ttft_us": ("TTFT (to the host)", True, True), "tpot_us": ("TPOT", True, True),
          "requests_per_s": ("requests/s", False, False)}

__all__ = ["PANELS", "decision_figure"]


def decision_figure(df: pd.DataFrame, title: str = "", *, fig: Figure | None = None) -> Figure:
    """One panel per figure of :data:`PANELS` (see the module docstring); ``fig``: a figure
    to draw into (a notebook's ``plt.figure``), else a new one."""
    rates = np.sort(df.rate_per_s.unique())
    scales = np.sort(df.scale.unique())
    fwd = df.groupby("scale").fwd_us.mean().reindex(scales).to_numpy()
    fig = fig or Figure(figsize=(5.2 * len(PANELS), 4.4), layout="constrained")
    axes = fig.subplots(1, len(PANELS))
    for ax, (col, (name, lower, crossover)) in zip(axes, PANELS.items()):
        grid = df.pivot(index="scale", columns="rate_per_s", values=f"{col}_change")
        z = 100 * grid.reindex(index=scales, columns=rates).to_numpy()
        # the colours, the cell labels and the colour bar all show z, the figure's own change
        # (a panel where higher is better reverses the map, so red is worse in every panel)
        lim = max(1.0, float(np.nanmax(np.abs(z))))
        mesh = ax.pcolormesh(rates, fwd, z, shading="nearest",
                             cmap="RdBu_r" if lower else "RdBu",
                             norm=TwoSlopeNorm(0.0, -lim, lim))
        if crossover and np.nanmin(z) < 0 < np.nanmax(z) and len(rates) > 1 \
                and len(fwd) > 1:
            ax.contour(rates, fwd, z, levels=[0.0], colors="black", linewidths=1.6)
        for i, f in enumerate(fwd):
            for j, r in enumerate(rates):
                ax.text(r, f, f"{z[i, j]:+.0f}%", ha="center", va="center", fontsize=7)  # on/off-1
        ax.set_yscale("log")
        ax.set_xlabel("arrival rate (requests/s)")
        ax.set_ylabel("forward µs (model size)")
        ax.set_title(f"{name}: overlap on vs off")
        sign = "lower" if lower else "higher"
        fig.colorbar(mesh, ax=ax, label=f"% change with overlap on ({sign} is better): red "
                                        f"worse, blue better")
    fig.suptitle(title or "Overlap on or off: the change overlap makes; black line: no change")
    return fig
