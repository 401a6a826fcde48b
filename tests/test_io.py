"""The one atomic writer (simwar.core.files): whole files or none, no temporaries, umask modes."""

from __future__ import annotations

import gzip
import json
import os
import signal
import stat
from pathlib import Path

import numpy as np
import pytest

from simwar.api import simulate
from simwar.cli.app import main
from simwar.core import files as _io
from simwar.core import trace
from simwar.plots import perfetto
from simwar.study import store, sweeps

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
    assert perfetto.atomic_file is _io.atomic_file
    assert not hasattr(sweeps, "atomic_write_bytes")
    assert store.write_bytes_atomic is _io.write_bytes_atomic
    assert store.atomic_file is _io.atomic_file


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
                  "grid": {"algorithm": ["none", "dspark"]}}, out, run_files=True)
    files = [out / "sweep.yaml", out / "results.parquet", out / "results.csv",
             *sorted((out / "runs").glob("*.json")), *sorted((out / "batches").glob("*"))]
    assert len(files) == 7  # two runs, a batch table each
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


class _Swallowing(type):
    """A class whose attribute misses run Python code (as ``IntEnum``'s do in Python 3.11)."""

    pending = False  # send Ctrl-C at the next lookup

    def __getattr__(cls, name):
        if cls.pending:
            # Ctrl-C arrives here: the handler runs at the loop's next check and raises
            # inside this lookup, which numpy answers by clearing every error
            cls.pending = False
            signal.raise_signal(signal.SIGINT)
            for _ in range(1000):
                pass
        raise AttributeError(name)


class _Code(int, metaclass=_Swallowing):
    pass


def test_an_interrupt_swallowed_by_a_library_still_stops_the_write(tmp_path):
    # how `run --trace` lost Ctrl-C 4 times in 11: numpy looked up __array_ufunc__ on the
    # enum compared with a numpy scalar, and cleared the KeyboardInterrupt raised there
    target = tmp_path / "run.json"
    target.write_text("old")
    with pytest.raises(KeyboardInterrupt):
        with _io.atomic_file(target) as handle:
            handle.write(b"half of the new")
            _Code.pending = True
            assert np.int8(3) in (_Code(3),)  # the interrupt is raised and swallowed here
            assert not _Code.pending
            handle.write(b" and the rest")
    assert target.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["run.json"]
    with _io.atomic_file(target) as handle:  # the next write is not refused
        handle.write(b"new")
    assert target.read_text() == "new"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_an_interrupt_swallowed_during_a_command_exits_130(tmp_path, capsys, monkeypatch):
    from simwar.cli import run as run_command

    def swallowing(result, *args, **kwargs):
        _Code.pending = True
        assert np.int8(3) in (_Code(3),)
        return "summary"

    monkeypatch.setattr(run_command, "format_summary", swallowing)
    assert main(["run", "--set", "steps=30", "--set", "warmup_steps=5", "--quiet"]) == 130
    assert capsys.readouterr().err == "simwar: interrupted\n"
