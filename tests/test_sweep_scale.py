"""Sweeps of any size: counted without being expanded, refused above a limit unless asked for,
expanded lazily as they run, reported in lines on a log, and an interrupted one leaves the
results table of what finished."""

from __future__ import annotations

import io
import sys

import pandas as pd
import pytest

import simwar.cli.common as common
import simwar.study.sweeps as sweeps
from simwar.cli.app import main
from simwar.config import ConfigError
from simwar.study import expand
from simwar.study.sweeps import SweepInterrupted, SweepTooLarge, load_sweep, sweep

SHORT = {"steps": 30, "warmup_steps": 5}
#: 10 values of 7 keys: 10^7 runs
HUGE = {"base": SHORT, "grid": {key: list(range(1, 11)) for key in (
    "cpu.schedule_us", "cpu.prepare_us", "cpu.ingest_us", "cpu.process_result_us",
    "gpu.schedule_writes_us", "gpu.result_writes_us", "costs.launch_us")}}


def _counter(monkeypatch, name: str) -> list[int]:
    count = [0]
    real = getattr(sweeps.Sweep, name)

    def counted(self, *args):
        count[0] += 1
        return real(self, *args)

    monkeypatch.setattr(sweeps.Sweep, name, counted)
    return count


@pytest.fixture
def expansions(monkeypatch):
    """How many runs were expanded."""
    return _counter(monkeypatch, "run")


@pytest.fixture
def validations(monkeypatch):
    """How many configs were validated on their own (a run's, or a template's corner)."""
    return _counter(monkeypatch, "resolve")


def test_a_huge_grid_is_counted_without_being_expanded(expansions, validations):
    plan = load_sweep(HUGE)
    assert plan.count == 10 ** 7
    assert plan.spec.count_text() == "grid 10 x 10 x 10 x 10 x 10 x 10 x 10"
    assert expansions[0] == 0
    assert validations[0] == 2 ** 7  # its durations checked at the corners of their box


def test_a_run_from_its_template_is_the_run_validated_on_its_own():
    spec = {"base": SHORT, "grid": {"policy.barrier": ["fine", "coarse"],
                                    "cpu.schedule_us": [100, 250.5, 3000],
                                    "phases.verify.body_us": [0, 4000.25]},
            "zip": {"gpu.result_writes_us": [5, 7]}, "repeats": 2}
    plan = load_sweep(spec)
    for run in plan.iter_runs():
        alone = plan.validated(run.run_id, run.repeat, run.values)
        assert run.group is not None  # made from its template
        assert (run.config, run.config_hash, run.run_key, run.seed) == \
            (alone.config, alone.config_hash, alone.run_key, alone.seed)


def test_a_template_with_a_bad_corner_names_the_run_of_the_bad_value(validations):
    spec = {"base": SHORT, "grid": {"policy.barrier": ["fine", "coarse"],
                                    "cpu.schedule_us": [100, -5, 300]}}
    with pytest.raises(ConfigError, match=r"^<sweep>: run 1 \(policy.barrier=fine, "
                                          r"cpu.schedule_us=-5\): cpu.schedule_us"):
        load_sweep(spec)


def test_above_the_limit_it_is_refused_with_the_count(expansions):
    with pytest.raises(SweepTooLarge) as e:
        load_sweep(HUGE, max_runs=100_000)
    assert str(e.value) == ("<sweep>: 10000000 runs (grid 10 x 10 x 10 x 10 x 10 x 10 x 10), "
                            "more than 100000: give --yes to expand them anyway (each costs "
                            "time and memory before it runs), or sweep fewer values")
    assert expansions[0] == 0


def test_a_bad_value_is_still_found_before_anything_runs(tmp_path):
    spec = {"base": SHORT, "grid": {"cpu.schedule_us": [100, 200, 300],
                                    "policy.barrier": ["fine", "coarse", "sideways"]}}
    with pytest.raises(ConfigError, match=r"^<sweep>: run 2 \(cpu.schedule_us=100, "
                                          r"policy.barrier=sideways\): policy.barrier"):
        sweep(spec, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_run_invalid_only_in_combination_is_found_before_its_batch_runs(tmp_path):
    spec = {"base": SHORT, "grid": {"steps": [30, 100], "warmup_steps": [5, 50]}}
    with pytest.raises(ConfigError, match=r"run 1 \(steps=30, warmup_steps=50\): warmup_steps"):
        sweep(spec, tmp_path / "out")
    assert not list((tmp_path / "out").glob("runs/*.json"))
    assert not (tmp_path / "out" / "results.parquet").exists()


def test_a_huge_sweep_starts_at_once_and_ctrl_c_leaves_the_table_of_what_finished(
        tmp_path, expansions, monkeypatch):
    monkeypatch.setattr(sweeps, "BATCH", 8)
    finished = []

    def progress(n):
        finished.append(n)
        if len(finished) == 3:
            raise KeyboardInterrupt

    with pytest.raises(SweepInterrupted) as e:
        sweep(HUGE, tmp_path / "out", progress=progress)
    # the progress is told a batch at a time: the third batch of 8 had finished
    assert (e.value.finished, e.value.total) == (24, 10 ** 7)
    assert expansions[0] < 100  # the runs handed over so far, not the grid
    table = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert table["run_id"].tolist() == list(range(24))
    assert len(pd.read_csv(tmp_path / "out" / "results.csv")) == 24
    assert len(list((tmp_path / "out" / "batches").glob("*.parquet"))) == 3


def test_the_cli_refuses_a_huge_sweep_unless_yes(tmp_path, capsys, monkeypatch):
    spec = tmp_path / "s.yaml"
    spec.write_text("base: {steps: 30, warmup_steps: 5}\n"
                    "grid: {cpu.schedule_us: [100, 200, 300], policy.barrier: [fine, coarse]}\n"
                    "repeats: 2\n")
    monkeypatch.setattr(sweeps, "MAX_RUNS", 10)
    line = (f"simwar: error: {spec}: 12 runs (grid 3 x 2, repeats 2), more than 10: give --yes "
            f"to expand them anyway (each costs time and memory before it runs), or sweep "
            f"fewer values\n")
    for command in (["validate"], ["show"], ["sweep", "--out", str(tmp_path / "o")]):
        assert main([command[0], str(spec), *command[1:]]) == 2
        assert capsys.readouterr() == ("", line)
    assert main(["validate", str(spec), "--yes"]) == 0
    assert capsys.readouterr().out == (f"{spec}: ok (sweep of 12 runs over cpu.schedule_us, "
                                       f"policy.barrier; cpu.schedule_us checked at the ends "
                                       f"of its range, each other swept value in its first "
                                       f"run)\n")
    assert main(["show", str(spec), "--yes"]) == 0
    out = capsys.readouterr().out
    assert "# 12 runs\n" in out and out.count("\n# ") == 12 + 2
    assert main(["sweep", str(spec), "--out", str(tmp_path / "o"), "--yes"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines()[0] == f"simwar: {spec}: 12 runs (grid 3 x 2, repeats 2)"
    assert f"{spec}: 12 runs (0 already done, 12 simulated" in out


def test_a_sweep_logs_lines_not_a_bar_when_stderr_is_no_terminal(tmp_path, capsys):
    # 30 runs of three algorithms: three lockstep batches (runs of one algorithm under
    # several barriers would be one), a line as each finishes
    spec = {"base": SHORT, "grid": {"algorithm": ["none", "eagle", "dflash"],
                                    "cpu.schedule_us": list(range(100, 1100, 100))}}
    sweep(spec, tmp_path / "out", progress=True)
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err and "it/s" not in err  # no tqdm redraws
    assert 1 < len(lines) <= 20 + 1
    assert all(line.startswith("simwar: sweep ") for line in lines)
    assert lines[-1].startswith("simwar: sweep 30/30 runs (100%; 30 simulated in ")
    assert lines[0].endswith(" s left)")  # runs/s and the time left, while runs remain
    # a rerun finds them stored: the lines say none were simulated
    sweep(spec, tmp_path / "out", progress=True)
    assert capsys.readouterr().err.splitlines()[-1].startswith(
        "simwar: sweep 30/30 runs (100%; 0 simulated in ")


def test_validate_yes_checks_each_swept_value_of_a_huge_sweep_once(tmp_path, capsys,
                                                                   validations):
    spec = tmp_path / "huge.yaml"
    spec.write_text("base: {steps: 30, warmup_steps: 5}\n"
                    "grid: {" + ", ".join(f"{k}: {list(range(1, 11))}" for k in HUGE["grid"])
                    + "}\n")
    assert main(["validate", str(spec), "--yes"]) == 0
    assert validations[0] == 2 ** 7  # the corners of the durations' box, not 10^7
    keys = ", ".join(HUGE["grid"])
    assert capsys.readouterr().out == (
        f"{spec}: ok (sweep of 10000000 runs over {keys}; {keys} checked at the ends of their "
        f"ranges, each other swept value in its first run)\n")


def test_validate_checks_every_run_of_a_sweep_under_the_limit(tmp_path, capsys, validations,
                                                              monkeypatch):
    spec = tmp_path / "s.yaml"
    spec.write_text("base: {steps: 30, warmup_steps: 5}\n"
                    "grid: {steps: [30, 100], warmup_steps: [5, 50]}\nrepeats: 2\n")
    assert main(["validate", str(spec)]) == 2  # run 2 is invalid only in combination
    assert capsys.readouterr().err.startswith(f"simwar: error: {spec}: run 2 (steps=30, "
                                              f"warmup_steps=50): warmup_steps")
    spec.write_text("base: {steps: 30, warmup_steps: 5}\n"
                    "grid: {steps: [30, 100], warmup_steps: [5, 10]}\nrepeats: 2\n")
    validations[0] = 0

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr(common, "BAR_DELAY_S", 0)
    monkeypatch.setattr(sys, "stderr", Terminal())
    assert main(["validate", str(spec)]) == 0
    assert validations[0] == 3 + 8  # load_sweep's firsts, then every run
    assert "validating" in sys.stderr.getvalue()


def test_a_loaded_sweep_holds_no_object_per_run_and_calls_grow_no_cache():
    """What made ``simulate()`` slow in a process holding a big sweep cannot come back:
    loading a sweep keeps nothing per run (its runs are expanded as they are handed out, its
    templates are a bounded cache), and repeated calls of one shape add no cache entry."""
    import gc

    from simwar.api import _sizes_cache, simulate
    from simwar.executors.fast import codegen, races

    def call(i: int) -> None:
        simulate({**SHORT, "cpu": {"schedule_us": 300.0 + i}}, engine="fast",
                 summary_only=True)

    call(0)
    gc.collect()
    before = len(gc.get_objects())
    plan = load_sweep({"base": SHORT, "grid": {"cpu.schedule_us": [100.0 + i
                                                                   for i in range(20_000)],
                                               "policy.barrier": ["fine", "coarse"]}})
    gc.collect()
    assert len(gc.get_objects()) - before < 5_000  # not a config, nor a Run, per run
    assert len(plan.templates._kept) <= expand.TEMPLATES_KEPT
    caches = (len(codegen._CODE), len(races._WINDOWS), len(_sizes_cache))
    for i in range(1, 30):
        call(i)
    assert (len(codegen._CODE), len(races._WINDOWS), len(_sizes_cache)) == caches
