"""The one atomic writer (simwar.core.files): whole files or none, no temporaries, umask modes."""

from __future__ import annotations

import gzip
import json
import os
import stat
from pathlib import Path

import pytest

from simwar.api import simulate
from simwar.cli.app import main
from simwar.core import files as _io
from simwar.core import trace
from simwar.plots import perfetto
from simwar.study import sweeps

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_traces_exports_and_sweeps_share_the_one_writer():
    assert trace.write_text_atomic is _io.write_text_atomic
    assert perfetto.write_text_atomic is _io.write_text_atomic
    assert not hasattr(sweeps, "atomic_write_bytes")
    assert sweeps.write_bytes_atomic is _io.write_bytes_atomic


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    target = tmp_path / "run.json"
    target.write_text("old")
    with pytest.raises(RuntimeError):
        with _io.atomic_file(target) as handle:
            handle.write(b"half of the new")
            raise RuntimeError("disk gone")
    assert target.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["run.json"]


def test_a_directory_target_is_refused_before_anything_is_written(tmp_path):
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(IsADirectoryError):
        _io.write_text_atomic(target, "x" * 1_000_000)
    assert sorted(os.listdir(tmp_path)) == ["out"] and os.listdir(target) == []
    with pytest.raises(FileNotFoundError):
        _io.write_bytes_atomic(tmp_path / "missing" / "f.json", b"{}")
    assert sorted(os.listdir(tmp_path)) == ["out"]


def test_trace_save_into_a_directory_leaves_no_stray_file(tmp_path):
    result = simulate(None, {"steps": 30, "warmup_steps": 5})
    target = tmp_path / "t.json"
    target.mkdir()
    with pytest.raises(IsADirectoryError):
        result.trace.save(target)
    with pytest.raises(IsADirectoryError):
        perfetto.write_chrome_trace(result.trace, target)
    assert sorted(os.listdir(tmp_path)) == ["t.json"]


def test_files_get_the_mode_a_plain_open_would_give(tmp_path, umask_022):
    for writer in (lambda p: _io.write_bytes_atomic(p, b"x"),
                   lambda p: _io.write_text_atomic(p, "x")):
        path = tmp_path / "f.txt"
        writer(path)
        assert _mode(path) == 0o644
        path.unlink()
    os.umask(0o027)
    _io.write_text_atomic(tmp_path / "g.txt", "x")
    assert _mode(tmp_path / "g.txt") == 0o640


def test_sweep_files_and_run_outputs_follow_the_umask(tmp_path, umask_022, capsys):
    out = tmp_path / "out"
    sweeps.sweep({"base": {"steps": 30, "warmup_steps": 5},
                  "grid": {"policy.barrier": ["coarse", "fine"]}}, out)
    files = [out / "sweep.yaml", out / "results.parquet", out / "results.csv",
             *sorted((out / "runs").glob("*.json"))]
    assert len(files) == 5
    assert {_mode(p) for p in files} == {0o644}
    assert main(["run", "--set", "steps=30", "--set", "warmup_steps=5", "--quiet",
                 "--trace", str(tmp_path / "t.json"), "--timeline",
                 str(tmp_path / "t.png")]) == 0
    assert _mode(tmp_path / "t.json") == 0o644 and _mode(tmp_path / "t.png") == 0o644


def test_gzip_output_reads_back(tmp_path):
    result = simulate(None, {"steps": 30, "warmup_steps": 5})
    path = tmp_path / "t.json.gz"
    result.trace.save(path)
    with gzip.open(path, "rt") as fh:
        assert json.load(fh)["format"] == "simwar.trace"
    assert len(trace.Trace.load(path).ops) == len(result.trace.ops)


def test_run_trace_into_a_directory_is_one_line_and_writes_nothing(tmp_path, capsys):
    target = tmp_path / "t.json"
    target.mkdir()
    assert main(["run", "--set", "steps=30", "--set", "warmup_steps=5",
                 "--trace", str(target)]) == 2
    err = capsys.readouterr().err
    assert err == (f"simwar: error: --trace {target}: is a directory (expected the name of a "
                   f"file to write)\n")
    assert sorted(os.listdir(tmp_path)) == ["t.json"]
