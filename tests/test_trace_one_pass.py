"""One pass for a run's summary and its trace (``simwar run --trace``): the run's own pass,
its blocks compiled with the trace mode's rows and the sums at once
(:func:`simwar.executors.fast.execute.run_plan`'s ``trace``), gives the summary, table and
races of a run without a trace, and the windows of the trace mode's own pass
(:func:`simwar.executors.fast.trace.windows`), bit for bit, on every shipped config, random
programs and a run whose first attempt is refused (forward steps issued out of order)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from programs import programs
from test_fast import assert_same_run, reference
from test_trace_stream import CONFIGS, assert_same_trace

import simwar
from simwar.api import Runner, trace_windows
from simwar.cli import main
from simwar.config import load_config
from simwar.config.workload import REQUEST_SOURCES
from simwar.core.program import Kernel, Launch, Program, StepMarker
from simwar.executors import fast
from simwar.executors.fast import trace as T
from simwar.executors.fast.execute import run_plan
from simwar.executors.fast.plan import plan_program

SHORT = {"steps": 300, "warmup_steps": 5}


def traced(plan, **kw) -> tuple:
    """The plan's run with its trace made by its pass: (FastRun, windows)."""
    windows: list = []
    run = run_plan(plan, trace=(T.stream(plan, **kw), windows.append))
    return run, windows


def assert_same_windows(got: list, want: list) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert (a.first, a.last, a.op_base, a.core_op, a.complete_below, a.clock) == \
            (b.first, b.last, b.op_base, b.core_op, b.complete_below, b.clock)
        for name in ("span_core", "marker_core", "span_issue"):
            x, y = getattr(a, name), getattr(b, name)
            assert (x is None) == (y is None) and (x is None or np.array_equal(x, y)), name
        assert_same_trace(a, b)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_one_pass_gives_the_runs_result_and_the_trace_modes_windows(path):
    cfg = load_config(path, SHORT)
    runner = Runner(cfg, "fast")
    stream = runner.trace_stream()
    if stream is None:  # a workload realized as it runs: its trace is made after the run
        assert simwar.api.draw_sizes(cfg).source in REQUEST_SOURCES
        return
    windows: list = []
    got = runner.run(trace=(stream, windows.append))
    want = simwar.simulate(cfg, engine="fast")
    assert list(got.summary) == list(want.summary)
    for key, value in want.summary.items():
        assert got.summary[key] == value or (value != value and got.summary[key] !=
                                             got.summary[key]), key
    for name, col in want.columns.items():
        assert np.array_equal(got.columns[name], col, equal_nan=col.dtype.kind == "f"), name
    assert got.races.equals(want.races)
    parts, lanes, meta = trace_windows(cfg)
    assert_same_windows(windows, list(parts))
    assert (stream.lanes, stream.meta) == (lanes, meta)


@pytest.mark.parametrize("steps", [(0, 40), (120, 130), (290, 299)])
def test_one_pass_of_some_steps_makes_their_windows_and_the_whole_summary(steps):
    cfg = load_config("configs/dspark_fine.yaml", SHORT)
    runner = Runner(cfg, "fast")
    windows: list = []
    got = runner.run(trace=(runner.trace_stream(steps), windows.append))
    assert got.summary == simwar.simulate(cfg, engine="fast").summary
    parts, _, _ = trace_windows(cfg, steps=steps)
    assert_same_windows(windows, list(parts))


@settings(max_examples=80, deadline=None)
@given(programs(max_ops=60, max_steps=6, irregular=True))
def test_one_pass_of_random_programs(program):
    plan = plan_program(program)
    try:
        want_windows = list(T.windows(plan, chunk=3))
    except T.TraceUnsupported:  # markers the shapes keep none of: no trace either way
        with pytest.raises(T.TraceUnsupported):
            T.stream(plan)
        return
    run, windows = traced(plan, chunk=3)
    assert_same_run(*reference(program), run)
    assert_same_windows(windows, want_windows)


def test_a_first_attempt_refused_keeps_its_windows_and_takes_the_second_ones_sums():
    def forward(step: int) -> Launch:
        return Launch("forward", Kernel(f"forward{step}", 10.0, phase="decode"), step)

    program = Program([StepMarker(0), forward(1), forward(0), StepMarker(1), forward(2),
                       StepMarker(2), forward(3)],
                      meta={"forward_stream": "forward", "warmup_steps": 0})
    plan = plan_program(program)
    run, windows = traced(plan, chunk=2)
    assert run.paths[1] == "collect"  # the second attempt's
    assert_same_run(*reference(program), run)
    assert_same_windows(windows, list(T.windows(plan, chunk=2)))
    assert windows[-1].last and not any(w.last for w in windows[:-1])


def test_a_traced_run_takes_no_feed_and_no_other_code():
    plan = fast.plan_config(load_config(None, SHORT), simwar.api.resolve_sizes(
        load_config(None, SHORT)))
    with pytest.raises(ValueError, match="no feed"):
        run_plan(plan, trace=(T.stream(plan), [].append), feed=lambda *a: None)


def test_run_trace_writes_in_the_runs_pass_the_bytes_of_the_trace_modes_file(tmp_path,
                                                                             monkeypatch,
                                                                             capsys):
    """``simwar run --trace``: one pass (the trace mode's own never runs), the file and the
    summary those of the run and of its windows written after it."""
    from simwar.plots.perfetto import write_run

    args = ["run", "configs/dspark_fine.yaml", "--set", "steps=500", "--quiet", "--json"]
    assert main(args) == 0
    summary = capsys.readouterr().out
    cfg = load_config("configs/dspark_fine.yaml", {"steps": 500})
    parts, lanes, meta = trace_windows(cfg)
    write_run(parts, lanes, meta, tmp_path / "want.json")

    def refused(*a, **k):
        raise AssertionError("the trace mode's own pass ran")

    monkeypatch.setattr(T.Stream, "alone", refused)
    assert main(args + ["--trace", str(tmp_path / "got.json")]) == 0
    assert capsys.readouterr().out == summary
    assert (tmp_path / "got.json").read_bytes() == (tmp_path / "want.json").read_bytes()
