"""SIGTERM is answered as Ctrl-C (one handler, :func:`simwar.core.files.interrupts_noted`): a
terminated sweep writes the tables of the runs that finished and leaves no temporary file."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from simwar.core.files import TMP_SUFFIX, interrupts_noted

REPO = Path(__file__).resolve().parents[1]


def test_sigterm_is_noted_as_sigint_inside_the_block_only():
    # a library may have set its own SIGTERM handler in this process (Ray does): it is kept;
    # here, from the default one
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        with interrupts_noted():
            assert signal.getsignal(signal.SIGTERM) is signal.getsignal(signal.SIGINT)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
        own = signal.signal(signal.SIGTERM, lambda *a: None)
        with interrupts_noted():
            assert signal.getsignal(signal.SIGTERM) is not signal.getsignal(signal.SIGINT)
        signal.signal(signal.SIGTERM, own)
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_sigtermed_sweep_writes_its_tables_and_no_temporary(tmp_path):
    sweep = tmp_path / "s.yaml"
    # a lockstep batch of 100 runs per algorithm (its two placements run as one, as its
    # barriers would; the algorithms do not unite): it stops between
    sweep.write_text(f"base: {REPO / 'configs' / 'dspark_fine.yaml'}\n"
                     "grid:\n  algorithm: [none, eagle, dflash, dspark]\n"
                     "  policy.placement: [after_launch, loop_top]\n"
                     "  cpu.schedule_us: [" + ", ".join(str(100 + i) for i in range(50))
                     + "]\n  steps: [2000]\n")
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "simwar", "sweep", str(sweep), "--out",
                             str(out), "--jobs", "1", "--no-progress"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # a batch finished: the sweep is under way
        if len(list((out / "batches").glob("*.parquet"))) >= 1 or proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted" in err
    table = pd.read_parquet(out / "results.parquet")
    assert 100 <= len(table) < 400 and len(table) % 100 == 0  # whole batches
    assert not [p for p in out.rglob(f"*{TMP_SUFFIX}")]


def test_a_second_sweep_into_a_busy_directory_is_refused(tmp_path):
    from simwar.core.files import directory_lock
    from simwar.study.sweeps import SweepConflict, sweep

    spec = {"base": str(REPO / "configs" / "dspark_fine.yaml"),
            "grid": {"cpu.schedule_us": [100, 200], "steps": [30]}}
    out = tmp_path / "out"
    out.mkdir()
    with directory_lock(out):  # another sweep holds it
        try:
            sweep(spec, out)
        except SweepConflict as e:
            assert "another sweep is writing into it now" in str(e)
        else:
            raise AssertionError("a second sweep into a held directory ran")
        assert sorted(p.name for p in out.iterdir()) == [".simwar.lock"]
    assert len(sweep(spec, out)) == 2
    assert not (out / ".simwar.lock").exists()


def test_a_sigtermed_trace_export_leaves_no_temporary(tmp_path):
    out = tmp_path / "t.json"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "simwar", "run", "--set", "steps=400000",
                             "--trace", str(out), "--quiet"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:  # the export under way
        if list(tmp_path.glob(f".*{TMP_SUFFIX}")):
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "simwar: interrupted"
    assert os.listdir(tmp_path) == []


def test_an_interrupt_while_the_results_tables_are_written_still_writes_them(tmp_path,
                                                                             monkeypatch):
    """Every run done, an interrupt arriving as the results tables are written is answered
    as one between batches: the tables of every run are written, and the sweep says it was
    interrupted (before, the tables' write was abandoned, the batches left to a rerun)."""
    from simwar.study import sweeps

    real = sweeps.write_tables
    calls = []

    def interrupted_once(table, out_dir):
        calls.append(table.num_rows)
        if len(calls) == 1:
            raise KeyboardInterrupt
        real(table, out_dir)

    monkeypatch.setattr(sweeps, "write_tables", interrupted_once)
    spec = {"base": {"steps": 30, "warmup_steps": 5},
            "grid": {"cpu.schedule_us": [100.0, 200.0, 300.0]}}
    stopped = None
    with interrupts_noted():
        try:
            sweeps.sweep(spec, tmp_path / "out")
        except sweeps.SweepInterrupted as e:
            stopped = e
        except KeyboardInterrupt:  # (pytest would take it for its own and stop the session)
            pytest.fail("the interrupt left the sweep unanswered")
    assert stopped is not None, "the sweep finished as if not interrupted"
    assert (stopped.finished, stopped.total, stopped.out_dir) == (3, 3, tmp_path / "out")
    assert calls == [3, 3]
    assert len(pd.read_parquet(tmp_path / "out" / "results.parquet")) == 3
