"""Smaller points of the command line and the API: help that matches the picture, a Trace's
repr, an error table that never writes -0.0000."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import simwar
from simwar.cli.app import build_parser
from simwar.cli.compare import table_csv
from simwar.core.trace import Trace

REPO = Path(__file__).resolve().parents[1]


def test_run_help_describes_the_window_as_the_picture_draws_it(capsys):
    parser = build_parser()
    run = next(a for a in parser._subparsers._group_actions[0].choices["run"]._actions
               if "--steps-window" in a.option_strings)
    assert "B+1's start" not in run.help
    assert "to the end of step B's work, nothing of step B+1" in run.help


def test_a_trace_repr_is_one_short_line():
    trace = simwar.simulate(None, {"steps": 30, "warmup_steps": 5}, engine="simpy").trace
    text = repr(trace)
    assert text == (f"Trace('dspark-fine': {len(trace.spans)} spans, {len(trace.ops)} ops, "
                    f"{len(trace.accesses)} accesses, {len(trace.markers)} markers, "
                    f"{len(trace.strings)} strings, steps 0..30)")
    assert "schedule_writes" not in text and len(text) < 200
    assert repr(trace.ops).startswith("Table('ops': ")
    assert repr(Trace.empty()) == "Trace(0 spans, 0 ops, 0 accesses, 0 markers, 0 strings)"


def test_the_error_table_never_writes_minus_zero():
    table = pd.DataFrame({"config": ["a", "b", "c"], "metric": ["m"] * 3,
                          "abs_error": [-0.0, -1e-9, 1.23456], "rel_error": [-4e-5, 0.0, -0.5]})
    lines = table_csv(table).splitlines()
    assert lines[1:] == ["a,m,0.0000,0.0000", "b,m,0.0000,0.0000", "c,m,1.2346,-0.5000"]


def test_the_committed_error_tables_are_what_a_regeneration_writes():
    for path in sorted((REPO / "calibration").glob("*.csv")):
        assert "-0.0000" not in path.read_text(), path.name
