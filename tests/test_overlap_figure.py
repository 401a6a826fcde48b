"""The on/off heatmap agrees with itself: each cell's label is the number its colour shows,
and red is worse in every panel (higher requests/s is better, higher TTFT worse)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from simwar.plots.overlap import PANELS, decision_figure


def _frame() -> pd.DataFrame:
    rows = []
    for scale, fwd in ((1.0, 1000.0), (2.0, 2000.0)):
        for rate in (10.0, 20.0):
            change = 0.39 if rate == 10.0 else -0.2
            rows.append({"rate_per_s": rate, "scale": scale, "fwd_us": fwd,
                         **{f"{col}_change": change for col in PANELS}})
    return pd.DataFrame(rows)


def test_labels_are_the_colours_numbers_and_red_is_worse():
    fig = decision_figure(_frame())
    panels = [ax for ax in fig.axes if ax.get_title().endswith("overlap on vs off")]
    assert len(panels) == len(PANELS)
    for ax, (_, lower, _) in zip(panels, PANELS.values()):
        mesh = ax.collections[0]
        shown = np.asarray(mesh.get_array()).ravel()
        labels = sorted(float(t.get_text().rstrip("%")) for t in ax.texts)
        assert sorted(np.round(shown).tolist()) == labels
        r, _, b, _ = mesh.cmap(mesh.norm(39.0))
        better = not lower  # +39 % is better where higher is better
        assert (b > r) == better, ax.get_title()
