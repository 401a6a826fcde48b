"""Sweep plots never average over a categorical swept key: the mean of the coarse and the fine
barrier is a configuration that does not exist. Such a key is plotted (hue, facet, axis) or
filtered; the title says the filters and what a point does average over, and fits the figure."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg

from simwar import plots
from simwar.cli import plot as cli_plot
from simwar.cli.app import main


def _table() -> pd.DataFrame:
    """A sweep table: barrier x schedule x algorithm x 2 repeats, coarse 356 µs above fine."""
    rows = []
    for barrier in ("coarse", "fine"):
        for sched in (500, 1000, 3000):
            for algo in ("dspark", "eagle"):
                for repeat in range(2):
                    rows.append({"policy.barrier": barrier, "cpu.schedule_us": sched,
                                 "algorithm": algo, "run_id": len(rows), "repeat": repeat,
                                 "fwd_gap_us_mean": 356.0 * (barrier == "coarse") + repeat,
                                 "step_us_mean": 5000.0 + sched})
    return pd.DataFrame(rows)


@pytest.fixture
def table_dir(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    _table().to_parquet(out / "results.parquet")
    return out


def _saved(monkeypatch):
    saved = {}
    real = cli_plot.save_figure

    def keep(fig, out):
        saved["fig"] = fig
        real(fig, out)

    monkeypatch.setattr(cli_plot, "save_figure", keep)
    return saved


def test_the_figures_refuse_to_average_over_a_categorical_key():
    df = _table()
    with pytest.raises(ValueError, match=r"policy.barrier takes 2 values \(coarse, fine\) and "
                                         r"is not plotted"):
        plots.sweep_lines(df, "cpu.schedule_us", "fwd_gap_us_mean", hue="algorithm")
    with pytest.raises(ValueError, match="algorithm takes 2 values"):
        plots.sweep_heatmap(df, "cpu.schedule_us", "policy.barrier", "fwd_gap_us_mean")
    one = df[df.algorithm == "dspark"]
    ax = plots.sweep_heatmap(one, "cpu.schedule_us", "policy.barrier", "fwd_gap_us_mean")
    cells = ax.images[0].get_array()
    assert sorted(np.unique(cells).tolist()) == [0.5, 356.5]  # no 178: coarse and fine apart
    assert plots.categorical_averaged(df, "cpu.schedule_us", "policy.barrier") == {
        "algorithm": ["dspark", "eagle"]}


def test_flags_and_swept_distributions_are_categorical_numbers_are_not():
    df = pd.DataFrame({"policy.plan_stream": [True, False], "cpu.ingest_us": [json.dumps(
        {"dist": "normal", "mean": 5, "std": 1}), "10"], "cpu.schedule_us": [1, 2],
        "run_id": [0, 1], "step_us_mean": [1.0, 2.0]})
    assert plots.categorical_averaged(df, "cpu.schedule_us") == {
        "policy.plan_stream": [False, True], "cpu.ingest_us": ["10", df["cpu.ingest_us"][0]]}
    assert plots.categorical_averaged(df, "policy.plan_stream", "cpu.ingest_us") == {}


def test_simwar_plot_refuses_and_says_which_key_to_pick(table_dir, tmp_path, capsys):
    out = tmp_path / "p.png"
    for extra in ([], ["--kind", "heatmap", "--hue", "algorithm"]):
        assert main(["plot", str(table_dir), "--x", "cpu.schedule_us", "--y",
                     "fwd_gap_us_mean", *extra, "-o", str(out)]) == 2
        assert capsys.readouterr().err == (
            f"simwar: error: policy.barrier takes 2 values (coarse, fine) in {table_dir} and "
            f"is not plotted: each point would average them, a configuration that does not "
            f"exist; keep one with --where policy.barrier=coarse, or show it with --hue "
            f"policy.barrier or --facet policy.barrier\n")
    assert not out.exists()


def test_where_filters_are_in_the_title(table_dir, tmp_path, monkeypatch, capsys):
    saved = _saved(monkeypatch)
    assert main(["plot", str(table_dir), "--x", "cpu.schedule_us", "--y", "fwd_gap_us_mean",
                 "--hue", "policy.barrier", "--where", "algorithm=eagle",
                 "-o", str(tmp_path / "p.png")]) == 0
    capsys.readouterr()
    title = saved["fig"].axes[0].get_title(loc="left")
    assert title.splitlines() == [
        "gap before each forward, mean (µs) by CPU schedule time (µs) and barrier policy",
        "where algorithm=eagle", "each point is the mean over 2 repeats; band: min to max"]


def test_facets_draw_one_panel_per_value(table_dir, tmp_path, monkeypatch, capsys):
    saved = _saved(monkeypatch)
    assert main(["plot", str(table_dir), "--x", "cpu.schedule_us", "--y", "fwd_gap_us_mean",
                 "--hue", "policy.barrier", "--facet", "algorithm", "--kind", "heatmap",
                 "-o", str(tmp_path / "p.png")]) == 0
    capsys.readouterr()
    fig = saved["fig"]
    panels = [ax for ax in fig.axes if ax.images]
    assert [ax.get_title(loc="left") for ax in panels] == ["algorithm = dspark",
                                                           "algorithm = eagle"]
    for ax in panels:
        assert sorted(np.unique(ax.images[0].get_array()).tolist()) == [0.5, 356.5]
    assert "one panel per algorithm" in fig._suptitle.get_text()


def test_a_long_title_stays_inside_the_figure(tmp_path, monkeypatch, capsys):
    rows = []
    for i, (a, b, c) in enumerate(np.ndindex(2, 3, 3)):
        rows.append({"cpu.schedule_us": 500 * (a + 1), "phases.verify.body_us": 1000 + b,
                     "gpu.schedule_writes_us": 100 + c, "costs.host_call_us": float(i % 2),
                     "run_id": i, "repeat": 0, "step_us_mean": float(i)})
    path = tmp_path / "results.parquet"
    pd.DataFrame(rows).to_parquet(path)
    saved = _saved(monkeypatch)
    assert main(["plot", str(path), "--x", "cpu.schedule_us", "--y", "step_us_mean",
                 "--where", "costs.host_call_us=0.0", "-o", str(tmp_path / "p.png")]) == 0
    capsys.readouterr()
    fig = saved["fig"]
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    title = fig.axes[0].title if fig.axes[0].get_title() else fig.axes[0]._left_title
    box = title.get_window_extent(canvas.get_renderer())
    inside = fig.bbox
    assert box.x0 >= inside.x0 - 1 and box.x1 <= inside.x1 + 1, (box, inside)
    assert box.y1 <= inside.y1 + 1
    assert "phases.verify.body_us (3 values)" in title.get_text()


def test_sweep_figures_label_their_axes_in_words():
    df = _table()
    ax = plots.sweep_lines(df[df.algorithm == "dspark"], "cpu.schedule_us", "step_us_mean",
                           hue="policy.barrier")
    assert ax.get_xlabel() == "CPU schedule time (µs)"
    assert ax.get_ylabel() == "step time, mean (µs)"
