"""Slips that gave a wrong answer or a traceback, each fixed at its root: the API takes a path
everywhere simulate does, a stream (``validate <(cat f)``) is read once, ``--fit -o`` keeps
a batch file that is not its own, a typo in a buffer name is named (not a race-free run)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import simwar.api as api
from simwar.cli.app import main
from simwar.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]
COARSE = REPO / "configs" / "dspark_coarse.yaml"


def test_the_api_takes_a_path_where_simulate_does():
    cfg = load_config(COARSE, {"steps": 60})
    small = str(COARSE)
    assert api.explain(cfg).steps == api.explain(load_config(small, {"steps": 60})).steps
    parts, _, _ = api.trace_windows(small)
    assert next(iter(parts)) is not None
    assert len(api.build_program(small).ops) == len(api.build_program(load_config(small)).ops)


def test_a_stream_is_read_once_by_a_command_that_reads_its_file_twice(tmp_path, capsys):
    fifo = tmp_path / "config.fifo"
    os.mkfifo(fifo)
    text = COARSE.read_text()

    def writer():
        with open(fifo, "w") as fh:  # a FIFO gives its text to one reader
            fh.write(text)

    thread = threading.Thread(target=writer)
    thread.start()
    assert main(["validate", str(fifo)]) == 0
    thread.join(timeout=10)
    assert "ok (config dspark-coarse" in capsys.readouterr().out


def test_a_buffer_typo_is_named_not_a_race_free_run():
    racy = api.simulate(REPO / "configs" / "dspark_none.yaml", {"steps": 60})
    assert racy.summary["races"] > 0
    with pytest.raises(ConfigError, match="'req_to_tokn' is written but no phase reads it"):
        api.simulate(REPO / "configs" / "dspark_none.yaml",
                     {"steps": 60, "gpu.writes": ["req_to_tokn"]})


def test_fit_output_keeps_a_batch_file_that_is_not_its_own(tmp_path, capsys):
    other = tmp_path / "f.batches.csv"
    other.write_text("batch_size\n7\n")
    args = ["import", str(REPO / "examples" / "capture.json.gz"), "--mapping",
            str(REPO / "examples" / "mapping.yaml"), "--fit", "-o", str(tmp_path / "f.yaml"),
            "--no-progress"]
    assert main(args) == 2
    assert "which is not f.yaml's batch file" in capsys.readouterr().err
    assert other.read_text() == "batch_size\n7\n"
    assert not (tmp_path / "f.yaml").exists()
    other.unlink()
    assert main(args) == 0  # its own batch file, written with it, is replaced on a rerun
    assert main(args) == 0
