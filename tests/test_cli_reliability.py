"""The command line under user mistakes and edge cases: one-line errors, no silent wrong answers.

Each test reproduces one failure of the CLI (a traceback, a silently ignored input, a result
quietly replaced, a misleading figure) and checks the behaviour that replaced it.
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

import simwar  # noqa: E402
from simwar.api import simulate  # noqa: E402
from simwar.cli import main  # noqa: E402
from simwar.config import ConfigError, load_config  # noqa: E402

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


# --------------------------------------------------------------------------- the API too
def test_set_blame_in_the_api():
    with pytest.raises(ConfigError, match=r"^--set warmup_steps=2000: warmup_steps \(2000\)"):
        simwar.simulate(None, {"warmup_steps": 2000})
