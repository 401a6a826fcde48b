"""Plot functions on the Agg backend: the lanes, artists and explanations they draw."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from matplotlib.axes import Axes  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from simwar import plots  # noqa: E402
from simwar.analysis.bubbles import bubbles, story  # noqa: E402
from simwar.api import simulate  # noqa: E402
from simwar.cli.app import main  # noqa: E402
from simwar.core.trace import Call, OpKind  # noqa: E402
from simwar.plots.timelines import RACE_COLOR  # noqa: E402

SMALL = {"steps": 14, "warmup_steps": 4}
WINDOW = (5, 7)


@pytest.fixture(scope="module")
def runs():
    return {
        "coarse": simulate(None, {**SMALL, "policy.barrier": "coarse"}),
        "fine": simulate(None, {**SMALL, "policy.barrier": "fine"}),
        "none": simulate(None, {**SMALL, "policy.barrier": "none"}),
    }


def _gids(ax: Axes) -> list[str]:
    return [a.get_gid() for a in [*ax.collections, *ax.patches, *ax.texts, *ax.lines]
            if a.get_gid()]


def _ylabels(ax: Axes) -> list[str]:
    return [t.get_text() for t in ax.get_yticklabels()]


def test_timeline_lanes_kinds_edges_and_steps(runs):
    ax = plots.timeline(runs["fine"], steps=WINDOW)
    assert isinstance(ax, Axes)
    assert _ylabels(ax) == ["cpu", "schedule", "forward", "copy"]
    gids = set(_gids(ax))
    for gid in ("span:cpu:cpu", "span:cpu:api", "span:cpu:blocked", "span:forward:kernel",
                "span:forward:graph", "span:copy:wait", "edge:record_wait", "edge:record_sync"):
        assert gid in gids, gid
    # host blocks are hatched, nothing else is
    hatched = {c.get_gid() for c in ax.collections if c.get_hatch()}
    assert hatched == {"span:cpu:blocked"}
    # every step of the window is marked and labelled
    for k in range(WINDOW[0], WINDOW[1] + 1):
        assert f"step:{k}" in gids and f"steplabel:{k}" in gids
    lo, hi = ax.get_xlim()
    trace = runs["fine"].trace
    marks = {m.step: m.time_us for m in trace.markers if m.name == "step"}
    assert lo == pytest.approx(marks[WINDOW[0]] * 1e-3)
    # the window is inclusive: it ends with the last of step B's spans, and nothing of step
    # B + 1 is drawn (neither its boundary nor its host work, which starts at its marker)
    assert hi == pytest.approx(max(s.end_us for s in trace.spans
                                   if WINDOW[0] <= s.step <= WINDOW[1]) * 1e-3)
    nxt = WINDOW[1] + 1
    assert f"step:{nxt}" not in gids and f"steplabel:{nxt}" not in gids
    assert marks[nxt] * 1e-3 < hi  # step B + 1 began inside the range, yet is not drawn
    cpu_bars = [x for c in ax.collections if c.get_gid().startswith("span:cpu:")
                for x in c.get_paths()]
    assert cpu_bars and all(p.vertices[:, 0].min() < marks[nxt] * 1e-3 for p in cpu_bars)
    # the fine barrier leaves no forward-stream bubble and no race
    assert "bubble" not in gids and "races" not in gids


def test_timeline_lanes_include_plan_and_d2h_when_present():
    r = simulate(None, {**SMALL, "policy.plan_stream": True, "policy.needs_cpu_seq_lens": True})
    ax = plots.timeline(r, steps=WINDOW, annotate=False)
    assert _ylabels(ax) == ["cpu", "schedule", "plan", "forward", "copy", "d2h"]


def test_timeline_takes_a_trace_and_an_axes(runs):
    fig = Figure()
    ax = fig.add_subplot()
    out = plots.timeline(runs["coarse"].trace, ax=ax, steps=WINDOW)
    assert out is ax
    assert "bubble" in _gids(ax)


def test_coarse_bubble_is_shaded_and_its_cause_explained(runs):
    r = runs["coarse"]
    ax = plots.timeline(r, steps=WINDOW)
    gids = _gids(ax)
    assert "bubble" in gids and "bubble_cause" in gids
    explain = [t for t in ax.texts if t.get_gid() == "bubble_explain"]
    assert len(explain) == 1
    text = explain[0].get_text()
    assert "schedule.wait_stream(forward)" in text and "coarse WAR barrier" in text
    assert "schedule_writes" in text
    labels = [t.get_text() for t in ax.texts if t.get_gid() == "bubble_label"]
    gap = float(r.steps.set_index("step").fwd_gap_us[WINDOW[0] + 1])
    assert f"{gap:.0f} µs" in labels[0]


def test_bubbles_walk_back_to_the_barrier(runs):
    r = runs["coarse"]
    found = bubbles(r, window=(5, 10))
    steps = r.steps.set_index("step")
    assert [b.step for b in found] == list(range(5, 11))
    for b in found:
        assert b.idle_us == pytest.approx(steps.fwd_gap_us[b.step])
        # forward held by its wait on schedule; schedule held by the coarse barrier on forward
        assert [(h.lane, h.released_by) for h in b.hops] == [("forward", "schedule"),
                                                            ("schedule", "forward")]
        assert b.hops[0].api_label == "forward.wait_stream(schedule)"
        assert b.hops[1].api_label == "schedule.wait_stream(forward)"
        # the barrier released exactly when the previous forward ended
        assert b.hops[1].released_at_us == pytest.approx(b.start_us)
    lines = story(r, found[0])
    assert lines[-1].startswith(f"Result: forward idles {found[0].idle_us:.0f} µs")
    assert bubbles(runs["fine"]) == []


def test_host_caused_bubble_names_the_host_block():
    r = simulate(None, {**SMALL, "policy.needs_cpu_seq_lens": True})
    found = bubbles(r, window=WINDOW)
    assert found and all(not b.hops for b in found)
    assert "seq_lens" in found[0].cause and "nothing was enqueued" in found[0].cause


def test_races_outline_both_accesses_in_red(runs):
    r = runs["none"]
    ax = plots.timeline(r, steps=WINDOW)
    coll = [c for c in ax.collections if c.get_gid() == "races"]
    assert len(coll) == 1
    assert tuple(coll[0].get_edgecolor()[0][:3]) == pytest.approx(
        matplotlib.colors.to_rgb(RACE_COLOR))
    # both sides of WAR on req_to_token: the forward's reads and the schedule stream's writes
    ys = {round(float(np.mean(p.vertices[:, 1]))) for p in coll[0].get_paths()}
    lanes = _ylabels(ax)
    assert {lanes[y] for y in ys} == {"forward", "schedule"}
    assert plots.timeline(r, steps=WINDOW, races=()).collections  # hiding races still draws
    assert "races" not in _gids(plots.timeline(r, steps=WINDOW, races=()))


def test_timeline_window_errors(runs):
    with pytest.raises(ValueError, match="empty"):
        plots.timeline(runs["fine"], steps=(6, 5))
    with pytest.raises(ValueError, match="no spans"):
        plots.timeline(runs["fine"], steps=(500, 501))


def _bars(ax: Axes, suffix: str) -> int:
    return sum(len(c.get_paths()) for c in ax.collections
               if (c.get_gid() or "").startswith("span:") and c.get_gid().endswith(suffix))


def test_graph_colour_marks_exactly_the_kernels_a_graph_launch_issued():
    # an eager phase (every kernel its own launch) and a CUDA-graph phase (load_batch launched
    # eagerly, prep and body nodes of one graph launch)
    r = simulate(None, {**SMALL, "algorithm": "custom", "phases": [
        {"name": "eager", "graph": "eager", "load_batch_us": 20, "prep_us": 30, "body_us": 300},
        {"name": "graphed", "graph": "full", "load_batch_us": 20, "prep_us": 30,
         "body_us": 400}]})
    trace = r.trace
    spans = {s.span_id: s for s in trace.spans}
    kernels = [op for op in trace.ops if op.kind == "kernel"]
    node = trace.graph_node()
    graph_ops = {op.op_id for op in kernels if node[op.op_id]}
    assert graph_ops == {op.op_id for op in kernels if spans[op.call].call == "graph_launch"}
    assert {op.label for op in kernels if op.op_id in graph_ops} == {"graphed.prep",
                                                                     "graphed.body"}
    assert {op.label for op in kernels if spans[op.call].call == "launch"} >= {
        "eager.load_batch", "eager.prep", "eager.body", "graphed.load_batch"}
    # the timeline draws those, and only those, in the graph colour
    ax = plots.timeline(r, steps=WINDOW, annotate=False, labels=False)
    lo, hi = (x * 1e3 for x in ax.get_xlim())
    drawn = [s for s in trace.spans if s.kind == "kernel" and s.step <= WINDOW[1]
             and s.end_us >= lo and s.start_us <= hi]
    assert _bars(ax, ":graph") == sum(1 for s in drawn if s.op in graph_ops) > 0
    assert _bars(ax, ":kernel") == sum(1 for s in drawn if s.op not in graph_ops) > 0


REAL_FINE = Path(__file__).parent / "data" / "kineto" / "dspark-fine-gpu.kineto.json.gz"


@pytest.mark.skipif(not REAL_FINE.exists(), reason="no H200 capture under tests/data/kineto")
def test_graph_nodes_of_the_h200_capture_are_the_graph_launched_kernels():
    # the capture itself: each device kernel or copy correlates with the runtime call issuing it
    doc = json.load(gzip.open(REAL_FINE, "rt"))
    runtime = {e["args"]["correlation"]: e["name"] for e in doc["traceEvents"]
               if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    issued_by = Counter(runtime.get(e["args"].get("correlation")) for e in doc["traceEvents"]
                        if e.get("cat") in ("kernel", "gpu_memcpy"))
    assert sum(issued_by.values()) == 1131
    assert issued_by["cudaLaunchKernel"] == 490 and issued_by["cudaGraphLaunch"] == 400

    from simwar.capture.to_trace import import_kineto

    # the whole capture (no step ranges: nothing is left outside the steps)
    trace = import_kineto(REAL_FINE).trace
    ops = trace.ops
    kernels = np.flatnonzero(ops.kind == OpKind.KERNEL)
    assert len(kernels) == 1131
    calls = ops.call[kernels]
    call_kind = np.where(calls >= 0, trace.spans.call[np.maximum(calls, 0)], -1)
    call_name = np.array([trace.text(int(trace.spans.label[c])) if c >= 0 else ""
                          for c in calls.tolist()])
    launched, graphed = call_name == "cudaLaunchKernel", call_name == "cudaGraphLaunch"
    assert launched.sum() == 490 and graphed.sum() == 400
    assert (call_kind[launched] == Call.LAUNCH).all()
    assert (call_kind[graphed] == Call.GRAPH_LAUNCH).all()
    node = trace.graph_node()[kernels]
    assert np.array_equal(node, call_kind == Call.GRAPH_LAUNCH)
    assert np.array_equal(node, graphed) and not node[launched].any()
    # the timeline of the whole capture draws the 400 graph nodes, and only them, as such
    spans = trace.spans
    ax = plots.timeline(trace, xlim_us=(float(spans.start_us.min()), float(spans.end_us.max())),
                        races=(), annotate=False, labels=False, edges=False)
    assert _bars(ax, ":graph") == 400
    assert _bars(ax, ":graph") + _bars(ax, ":kernel") == 1131


def test_stall_figure_zooms_on_the_first_bubble(runs):
    fig = plots.stall_figure(runs["coarse"], WINDOW)
    top, zoom = fig.axes[:2]
    b = bubbles(runs["coarse"], window=WINDOW)[0]
    lo, hi = zoom.get_xlim()
    assert lo * 1e3 < b.start_us and b.end_us < hi * 1e3
    assert "bubble_explain" in _gids(zoom) and "bubble_explain" not in _gids(top)
    FigureCanvasAgg(fig).draw()  # renders without error
    assert len(plots.stall_figure(runs["fine"], WINDOW).axes) == 1


def test_timeline_and_stall_figure_examine_only_their_window(runs, monkeypatch):
    from simwar.analysis import bubbles as walk

    seen = []
    hops = walk.BubbleWalk.hops

    def counting(self, kernel, start, end):
        seen.append(int(self.ops.step[kernel]))
        return hops(self, kernel, start, end)

    monkeypatch.setattr(walk.BubbleWalk, "hops", counting)
    plots.stall_figure(runs["coarse"], WINDOW)
    # the window's bubbles, and those of the steps whose spans the zoom shows: not the run's
    assert set(range(WINDOW[0], WINDOW[1] + 1)) <= set(seen)
    assert min(seen) >= WINDOW[0] - 2 and max(seen) <= WINDOW[1]
    seen.clear()
    assert [b.step for b in bubbles(runs["coarse"], window=(6, 6))] == [6]
    assert seen == [6]


def test_comparison_plots(runs):
    ax = plots.stall_breakdown(runs)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["coarse", "fine", "none"]
    bars = {p.get_gid() for p in ax.patches if p.get_gid()}
    assert "bar:gpu_idle_dep_us_mean" in bars and "bar:cpu_blocked_result_copy_us_mean" in bars
    dep = [p.get_height() for p in ax.patches if p.get_gid() == "bar:gpu_idle_dep_us_mean"]
    assert dep[0] == pytest.approx(runs["coarse"].summary["gpu_idle_dep_us_mean"])

    ax = plots.launch_ahead_hist(runs)
    assert sum(1 for p in ax.patches if p.get_gid() == "hist:fine") >= 1

    ax = plots.step_time_ecdf(runs)
    assert [ln.get_gid() for ln in ax.lines] == ["ecdf:coarse", "ecdf:fine", "ecdf:none"]
    coarse_x = ax.lines[0].get_xdata()
    assert coarse_x.max() == pytest.approx(runs["coarse"].steps.step_us.max())

    # summaries as plain dicts work too
    summaries = {k: r.summary for k, r in runs.items()}
    assert plots.stall_breakdown(summaries).patches


def _sweep_frame() -> pd.DataFrame:
    rows = []
    for barrier in ("coarse", "fine"):
        for sched in (250, 1000, 4000):
            for repeat in range(2):
                rows.append({"policy.barrier": barrier, "cpu.schedule_us": sched,
                             "run_id": len(rows), "repeat": repeat,
                             "step_us_mean": 5000 + sched * (barrier == "coarse") + repeat})
    return pd.DataFrame(rows)


def test_sweep_lines_and_heatmap():
    df = _sweep_frame()
    ax = plots.sweep_lines(df, "cpu.schedule_us", "step_us_mean", hue="policy.barrier")
    assert [ln.get_gid() for ln in ax.lines] == ["line:coarse", "line:fine"]
    assert list(ax.lines[0].get_xdata()) == [250, 1000, 4000]
    assert list(ax.lines[0].get_ydata()) == [5250.5, 6000.5, 9000.5]  # mean of the repeats
    assert len(ax.collections) == 2  # a min-max band per line
    assert ax.get_xlabel() == "CPU schedule time (µs)" and ax.get_ylabel() == "step time, mean (µs)"

    ax = plots.sweep_heatmap(df, "cpu.schedule_us", "policy.barrier", "step_us_mean")
    assert ax.images[0].get_array().shape == (2, 3)
    with pytest.raises(KeyError, match="nope"):
        plots.sweep_lines(df, "nope", "step_us_mean")


def _png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_run_timeline(tmp_path, capsys):
    out = tmp_path / "t.png"
    rc = main(["run", "--set", "steps=14", "--set", "warmup_steps=4", "--set",
               "policy.barrier=coarse", "--timeline", str(out), "--steps-window", "5:7", "--json"])
    assert rc == 0 and _png(out)
    assert "wrote" in capsys.readouterr().err
    small = ["run", "--set", "steps=14", "--set", "warmup_steps=4"]
    for bad in ("7:5", "x", "5:99"):
        assert main([*small, "--timeline", str(out), "--steps-window", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("simwar: error: --steps-window") and len(err.splitlines()) == 1
    assert main([*small, "--timeline", str(tmp_path / "t.txt")]) == 2
    assert main([*small, "--steps-window", "1:2"]) == 2
    assert capsys.readouterr().err.count("simwar: error:") == 2


def test_cli_plot(tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    sweep_dir.mkdir()
    _sweep_frame().to_parquet(sweep_dir / "results.parquet", index=False)
    out = tmp_path / "s.png"
    args = ["plot", str(sweep_dir), "--x", "cpu.schedule_us", "--y", "step_us_mean"]
    assert main([*args, "--hue", "policy.barrier", "-o", str(out)]) == 0 and _png(out)
    out.unlink()
    assert main([*args, "--hue", "policy.barrier", "--kind", "heatmap", "-o", str(out)]) == 0
    assert _png(out)
    assert main([*args, "--where", "policy.barrier=fine", "-o", str(out)]) == 0
    capsys.readouterr()
    assert main([*args, "--hue", "nope", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--hue nope" in err and "policy.barrier" in err and len(err.splitlines()) == 1
    assert main(["plot", str(tmp_path), "--x", "a", "--y", "b", "-o", str(out)]) == 2
    assert main([*args, "--kind", "heatmap", "-o", str(out)]) == 2
    assert main([*args, "-o", str(tmp_path / "missing" / "s.png")]) == 2
