"""The command line under user mistakes and edge cases: one-line errors, no silent wrong answers.

Each test reproduces one failure of the CLI (a traceback, a silently ignored input, a result
quietly replaced, a misleading figure) and checks the behaviour that replaced it.
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402

import simwar  # noqa: E402
from simwar.api import simulate  # noqa: E402
from simwar.cli import main  # noqa: E402
from simwar.config import ConfigError, load_config  # noqa: E402
from simwar.sweeps import load_sweep, sweep  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHORT = ["--set", "steps=30", "--set", "warmup_steps=5"]


def one_error_line(capsys) -> str:
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    assert err.count("\n") == 1 and err.startswith("simwar: error: "), err
    return err.rstrip("\n")


# --------------------------------------------------------------------------- 1: too few steps
def test_a_run_measuring_fewer_than_two_steps_is_rejected_up_front(capsys):
    assert main(["run", "--set", "steps=21"]) == 2  # warm-up 20 + 1: nothing to measure
    assert one_error_line(capsys) == (
        "simwar: error: --set steps=21: steps (21) must be at least warmup_steps + 3 (23) so "
        "that at least 2 steps are measured (the last step, having no successor, is not)")
    assert simulate(None, {"steps": 23}).summary["steps_measured"] == 2


def test_every_builtin_suite_case_and_shipped_config_still_validates():
    from simwar.harness import suite

    for name in suite.cases():
        suite.case_config(name)
    for path in sorted((REPO / "configs").glob("*.yaml")):
        load_config(path)


# --------------------------------------------------------------------------- 2, 3: directories
def test_a_directory_as_the_config_is_one_line(tmp_path, capsys):
    assert main(["run", str(tmp_path)]) == 2
    assert one_error_line(capsys) == (f"simwar: error: {tmp_path}: is a directory (expected a "
                                      f"YAML file)")


@pytest.mark.parametrize("option", ["--trace", "--timeline"])
def test_an_output_that_is_a_directory_is_refused_before_running(tmp_path, capsys, option):
    target = tmp_path / "out"
    target.mkdir()
    assert main(["run", *SHORT, option, str(target)]) == 2
    assert one_error_line(capsys) == (f"simwar: error: {option} {target}: is a directory "
                                      f"(expected the name of a file to write)")
    assert sorted(os.listdir(tmp_path)) == ["out"] and os.listdir(target) == []


# --------------------------------------------------------------------------- 5: empty config
@pytest.mark.parametrize("text", ["", "# only a comment\n", "\n\n"])
def test_an_empty_config_file_is_an_error(tmp_path, capsys, text):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    assert main(["run", str(path)]) == 2
    assert one_error_line(capsys) == (f"simwar: error: {path}: the file is empty (expected a "
                                      f"YAML mapping)")
    assert load_config(None).name == "dspark-fine"  # the packaged default still loads


# --------------------------------------------------------------------------- 6: empty sweeps
@pytest.mark.parametrize("text, message", [
    ("base: {}\ngrid: {}\n", "grid: expected at least one dotted key"),
    ("base: {}\ngrid: {policy.barrier: [coarse, fine]}\nzip: {}\n",
     "zip: expected at least one dotted key"),
    ("base: {}\n", "nothing to sweep: expected a grid, a zip or repeats above 1"),
])
def test_a_sweep_that_sweeps_nothing_is_an_error(tmp_path, capsys, text, message):
    path = tmp_path / "sweep.yaml"
    path.write_text(text)
    assert main(["sweep", str(path), "--out", str(tmp_path / "out"), "--no-progress"]) == 2
    assert one_error_line(capsys).startswith(f"simwar: error: {path}: {message}")
    assert not (tmp_path / "out").exists()


def test_repeats_alone_are_still_a_sweep():
    assert len(load_sweep({"base": {"steps": 30, "warmup_steps": 5}, "repeats": 3}).runs) == 3


# --------------------------------------------------------------------------- 7: --set blame
@pytest.mark.parametrize("overrides, expected", [
    (["warmup_steps=2000"], "--set warmup_steps=2000: warmup_steps (2000) must be < steps (2000)"),
    (["bogus.key=3"], "--set bogus.key=3: bogus: unknown key"),
    (["bogus=3"], "--set bogus: unknown key"),
    (["steps=10", "warmup_steps=20"],
     "--set steps=10 --set warmup_steps=20: warmup_steps (20) must be < steps (10)"),
    (["policy.barrier=coarse", "warmup_steps=2000"],
     "--set warmup_steps=2000: warmup_steps (2000) must be < steps (2000)"),
])
def test_errors_caused_by_set_name_the_flag_not_the_packaged_defaults(capsys, overrides,
                                                                       expected):
    argv = ["run"]
    for item in overrides:
        argv += ["--set", item]
    assert main(argv) == 2
    line = one_error_line(capsys)
    assert line == f"simwar: error: {expected}"
    assert "default.yaml" not in line


def test_a_broken_file_is_still_blamed_when_set_is_given_too(tmp_path, capsys):
    path = tmp_path / "c.yaml"
    path.write_text("steps: 100\nwarmup_steps: 100\n")
    assert main(["run", str(path), "--set", "policy.barrier=coarse"]) == 2
    assert one_error_line(capsys) == (f"simwar: error: {path}: warmup_steps (100) must be < "
                                      f"steps (100)")


# --------------------------------------------------------------------------- 8: sweep into OUT
def _sweep_file(tmp_path: Path, name: str, barriers: list[str]) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump({"base": {"steps": 30, "warmup_steps": 5},
                                    "grid": {"policy.barrier": barriers}}))
    return path


def test_a_different_sweep_never_replaces_results_silently(tmp_path, capsys):
    out = tmp_path / "out"
    first = _sweep_file(tmp_path, "a.yaml", ["none", "coarse", "fine"])
    second = _sweep_file(tmp_path, "b.yaml", ["fine"])
    assert main(["sweep", str(first), "--out", str(out), "--no-progress"]) == 0
    table = (out / "results.csv").read_bytes()
    capsys.readouterr()
    assert main(["sweep", str(second), "--out", str(out), "--no-progress"]) == 2
    assert one_error_line(capsys) == (
        f"simwar: error: --out {out}: holds the results of a different sweep "
        f"({out / 'sweep.yaml'} differs from {second}); use another output directory, or "
        f"--force to replace its results table")
    assert (out / "results.csv").read_bytes() == table
    # the same sweep resumes
    assert main(["sweep", str(first), "--out", str(out), "--no-progress"]) == 0
    assert "(3 already done, 0 simulated" in capsys.readouterr().out
    # --force replaces
    assert main(["sweep", str(second), "--out", str(out), "--no-progress", "--force"]) == 0
    assert len(pd.read_csv(out / "results.csv")) == 1


def test_results_without_a_resolved_sweep_are_not_overwritten(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.csv").write_text("a,b\n1,2\n")
    spec = _sweep_file(tmp_path, "a.yaml", ["coarse", "fine"])
    assert main(["sweep", str(spec), "--out", str(out), "--no-progress"]) == 2
    assert "holds results.csv but no sweep.yaml" in one_error_line(capsys)
    assert sorted(os.listdir(out)) == ["results.csv"]


def test_the_sweep_table_names_each_run_by_what_it_changed():
    frame = sweep({"base": {"name": "base", "steps": 30, "warmup_steps": 5},
                   "grid": {"policy.barrier": ["coarse", "fine"]}},
                  overrides=["cpu.schedule_us=700"])
    assert list(frame["name"]) == ["base [--set cpu.schedule_us=700, policy.barrier=coarse]",
                                   "base [--set cpu.schedule_us=700, policy.barrier=fine]"]


# --------------------------------------------------------------------------- the API too
def test_set_blame_in_the_api():
    with pytest.raises(ConfigError, match=r"^--set warmup_steps=2000: warmup_steps \(2000\)"):
        simwar.simulate(None, {"warmup_steps": 2000})
