"""The command line under user mistakes and edge cases: one-line errors, no silent wrong answers.

Each test reproduces one failure of the CLI (a traceback, a silently ignored input, a result
quietly replaced, a misleading figure) and checks the behaviour that replaced it.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import yaml  # noqa: E402

import simwar  # noqa: E402
from simwar import plots  # noqa: E402
from simwar.analysis.metrics import measured  # noqa: E402
from simwar.api import simulate  # noqa: E402
from simwar.cli import common as cli_common  # noqa: E402
from simwar.cli import run as cli_run  # noqa: E402
from simwar.cli.app import main  # noqa: E402
from simwar.cli.run import format_summary  # noqa: E402
from simwar.config import ConfigError, load_config  # noqa: E402
from simwar.plots.timelines import time_range  # noqa: E402
from simwar.study.sweeps import load_sweep, sweep  # noqa: E402

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


def test_a_summary_without_measured_steps_prints_without_crashing():
    cfg = load_config(None, {"steps": 30}).model_copy(update={"steps": 21})  # unvalidated
    result = simulate(cfg)
    assert result.summary["steps_measured"] == 0
    text = format_summary(result)
    assert "steps measured      0" in text and "step time" not in text


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


# --------------------------------------------------------------------------- 4: non-numeric --y
@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "out"
    sweep({"base": str(REPO / "configs" / "dspark_fine.yaml"),
           "grid": {"policy.barrier": ["coarse", "fine"], "cpu.schedule_us": [500, 4000],
                    "phases.verify.body_us": [2000, 5100]}, "repeats": 2},
          out, overrides={"steps": 30, "warmup_steps": 5})
    return out


@pytest.mark.parametrize("metric", ["launch_ahead_hist", "barrier"])
def test_plotting_a_non_numeric_metric_names_the_numeric_ones(sweep_dir, tmp_path, capsys,
                                                               metric):
    out = tmp_path / "p.png"
    assert main(["plot", str(sweep_dir), "--x", "cpu.schedule_us", "--y", metric,
                 "-o", str(out)]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"simwar: error: --y {metric}: not a numeric column of {sweep_dir} "
                           f"(numeric: ")
    assert "step_us_mean" in line and "launch_ahead_mean" in line and "config_hash" not in line
    assert not out.exists()


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


# --------------------------------------------------------------------------- 9: --costs phases
def test_costs_file_phases_are_applied(tmp_path, capsys):
    fitted = tmp_path / "fitted.yaml"
    fitted.write_text("phases:\n  - {name: verify, load_batch_us: 0.0, prep_us: 0.0, "
                      "body_us: 1234.0}\ncosts: {launch_us: 7.5}\n")
    assert main(["run", *SHORT, "--costs", str(fitted), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    expected = simulate(None, {"steps": 30, "warmup_steps": 5, "costs.launch_us": 7.5,
                               "phases.verify.load_batch_us": 0.0,
                               "phases.verify.prep_us": 0.0,
                               "phases.verify.body_us": 1234.0}).summary
    assert got["fwd_us_mean"] == pytest.approx(expected["fwd_us_mean"])
    assert got["step_us_mean"] == pytest.approx(expected["step_us_mean"])
    assert got["fwd_us_mean"] != simulate(None, {"steps": 30, "warmup_steps": 5}).summary[
        "fwd_us_mean"]
    # --set still wins over the file
    assert main(["run", *SHORT, "--costs", str(fitted), "--set",
                 "phases.verify.body_us=5100", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["fwd_us_mean"] > got["fwd_us_mean"]


def test_an_import_fit_file_round_trips_through_run_costs(tmp_path, capsys):
    from simwar.fit.durations import fit_durations

    sim = simulate(None, {"steps": 40, "warmup_steps": 5, "phases.verify.body_us": 3000})
    fitted = tmp_path / "fitted.yaml"
    fitted.write_text(yaml.safe_dump(fit_durations(sim.trace).config))
    assert main(["run", *SHORT, "--costs", str(fitted), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["fwd_us_mean"] == pytest.approx(sim.summary["fwd_us_mean"], rel=1e-3)


@pytest.mark.parametrize("text, message", [
    ("phases:\n  - {name: draft_extend, body_us: 1}\n",
     "phases.0.name: 'draft_extend' is not a phase of the config (draft, verify, sample)"),
    ("costs: {launch_us: 5}\nfit: {n: 3}\n",
     "fit: not used (a costs file sets 'costs' and 'phases' only)"),
])
def test_costs_file_keys_it_would_not_use_are_errors(tmp_path, capsys, text, message):
    path = tmp_path / "f.yaml"
    path.write_text(text)
    assert main(["run", "--costs", str(path)]) == 2
    assert one_error_line(capsys) == f"simwar: error: --costs {path}: {message}"


def test_a_calibration_file_still_works_as_costs(capsys):
    assert main(["run", *SHORT, "--costs", str(REPO / "calibration" / "h200.yaml"),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["steps_measured"] == 24


def test_run_help_says_what_a_costs_file_may_hold(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "'phases' list" in text and "any other top-level key is an error" in text


# --------------------------------------------------------------------------- 10: calibrate
def test_calibrate_without_bench_keeps_device_latencies_and_says_so(tmp_path, capsys):
    out = tmp_path / "cal.yaml"
    assert main(["calibrate", str(REPO / "calibration" / "h200_suite_run1.json"),
                 "-o", str(out)]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("simwar: warning: sync_wake_us, "
                                                   "cross_stream_us: not timed")
    costs = yaml.safe_load(out.read_text())["costs"]
    assert "sync_wake_us" not in costs and "cross_stream_us" not in costs
    cfg = load_config(None, {f"costs.{k}": v for k, v in costs.items()})
    assert cfg.costs.sync_wake_us == 16.0 and cfg.costs.cross_stream_us == 3.0


# --------------------------------------------------------------------------- 11: smaller ones
def test_the_summary_header_says_what_was_overridden(capsys):
    assert main(["run", *SHORT, "--set", "policy.barrier=coarse"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("dspark-fine [--set steps=30, --set warmup_steps=5, --set "
                            "policy.barrier=coarse]: dspark, barrier coarse")
    assert main(["run", *SHORT, "--set", "name=mine"]) == 0
    assert capsys.readouterr().out.startswith("mine [--set steps=30, --set warmup_steps=5]:")


def test_the_sweep_table_names_each_run_by_what_it_changed():
    frame = sweep({"base": {"name": "base", "steps": 30, "warmup_steps": 5},
                   "grid": {"policy.barrier": ["coarse", "fine"]}},
                  overrides=["cpu.schedule_us=700"])
    assert list(frame["name"]) == ["base [--set cpu.schedule_us=700, policy.barrier=coarse]",
                                   "base [--set cpu.schedule_us=700, policy.barrier=fine]"]


def test_negative_zero_is_never_printed():
    noisy = {"steps": 100, "warmup_steps": 5, "policy.barrier": "none",
             "costs.launch_us": {"dist": "normal", "mean": 6, "std": 3}}
    result = simulate(None, noisy)
    # float noise just below zero (the metrics now add intervals in start order, which
    # cancels exactly here, so the noise is planted)
    result.summary["gpu_idle_us_mean"] = -1e-9
    result.summary["fwd_gap_us_mean"] = -3e-13
    assert "-0.0" not in format_summary(result)
    assert cli_common.num(-1e-12) == "0.0" and cli_common.num(-0.04, ".2f") == "-0.04"
    assert cli_common.num(-0.0, ".3f") == "0.000" and cli_common.num(-12.0) == "-12.0"


def test_the_import_report_never_prints_negative_zero_either():
    from simwar.capture.stalls import import_report
    from simwar.capture.to_trace import import_kineto
    from simwar.cli.capture import format_report

    _, report = import_report(import_kineto(
        REPO / "tests" / "data" / "kineto_synthetic" / "three_steps.json",
        {"streams": {7: "forward", 13: "schedule"}}))
    report["metrics"]["fwd_gap_us_mean"] = -1e-9  # float noise below zero
    next(iter(report["idle"].values()))["other_us"] = -1e-9
    text = format_report(report)
    assert "gap before it 0.0 µs" in text and "-0.0" not in text


def test_races_are_listed_and_counted_over_the_steps_measured(capsys):
    result = simulate(None, {"steps": 30, "warmup_steps": 5, "policy.barrier": "none"})
    steps = set(measured(result.steps, 5).step)
    text = format_summary(result, max_races=1000)
    listed = [line for line in text.splitlines() if line.startswith("    WAR")]
    assert listed
    for line in listed:
        first, second = (int(part.split(")")[0]) for part in line.split("(step ")[1:])
        assert first in steps and second in steps, line
    s = result.summary
    assert s["race_steps"] == s["steps_measured"] == 24
    assert "(in 24 of the 24 steps measured)" in text
    assert all(r.first_step >= 5 for r in result.hazards.since(5).races)


def test_steps_window_is_inclusive_and_draws_nothing_of_the_next_step():
    result = simulate(REPO / "configs" / "dspark_coarse.yaml", {"steps": 40})
    markers = {m.step: m.time_us for m in result.trace.markers if m.name == "step"}
    x0, x1 = time_range(result.trace, (20, 22))
    step22_end = max(s.end_us for s in result.trace.spans if s.step == 22)
    assert (x0, x1) == (markers[20], step22_end)  # step 22's forward is drawn to its end
    ax = plots.timeline(result, steps=(20, 22))
    gids = {a.get_gid() for a in [*ax.lines, *ax.texts] if a.get_gid()}
    assert {"step:20", "step:21", "step:22"} <= gids and "step:23" not in gids


def test_plot_says_what_it_averages_and_labels_axes_in_words(sweep_dir, tmp_path):
    df = pd.read_parquet(sweep_dir / "results.parquet")
    assert plots.averaged_over(df, "cpu.schedule_us", "step_us_mean", "policy.barrier") == {
        "phases.verify.body_us": 2, "repeat": 2}
    title = cli_plot_title(df, "cpu.schedule_us", "step_us_mean", "policy.barrier")
    assert title.splitlines()[1] == ("each point is the mean over phases.verify.body_us "
                                     "(2 values), 2 repeats; band: min to max")
    assert plots.column_label("step_us_mean") == "step time, mean (µs)"
    assert plots.column_label("phases.verify.body_us") == "verify body time (µs)"
    assert plots.column_label("some_new_metric") == "some_new_metric"
    fig = _plot(sweep_dir, tmp_path, "--x", "cpu.schedule_us", "--hue", "policy.barrier")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "CPU schedule time (µs)"
    assert ax.get_ylabel() == "step time, mean (µs)"


def cli_plot_title(*args):
    from simwar.cli.plot import plot_title

    return plot_title(*args)


def _plot(sweep_dir, tmp_path, *args):
    """Run ``simwar plot`` and return the figure it saved."""
    from simwar.cli import plot as cli_plot

    saved = {}
    original = cli_plot.save_figure

    def keep(fig, out):
        saved["fig"] = fig
        original(fig, out)

    cli_plot.save_figure = keep
    try:
        assert main(["plot", str(sweep_dir), "--y", "step_us_mean", *args,
                     "-o", str(tmp_path / "p.png")]) == 0
    finally:
        cli_plot.save_figure = original
    return saved["fig"]


def test_a_categorical_x_is_drawn_as_points_not_lines(sweep_dir, tmp_path):
    fig = _plot(sweep_dir, tmp_path, "--x", "policy.barrier", "--hue", "cpu.schedule_us")
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["coarse", "fine"]
    data_lines = [ln for ln in ax.lines if str(ln.get_gid()).startswith("points:")]
    assert len(data_lines) == 2
    assert all(ln.get_linestyle() == "None" for ln in data_lines)  # markers, no joining line
    numeric = plots.sweep_lines(pd.read_parquet(sweep_dir / "results.parquet"),
                                "cpu.schedule_us", "step_us_mean", hue="policy.barrier")
    assert all(ln.get_linestyle() == "-" for ln in numeric.lines)


# --------------------------------------------------------------------------- progress
def test_simulate_reports_each_step_to_a_progress_callback():
    seen = []
    short = {"steps": 30, "warmup_steps": 5}
    result = simulate(None, short, engine="simpy", progress=seen.append)
    assert seen == sorted(seen) and seen[0] == 0 and seen[-1] >= 29
    assert result.summary == simulate(None, short).summary
    # the fast executor (the default) reports each chunk of its pass, then the end
    seen.clear()
    simulate(None, short, progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == 30


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_run_shows_a_progress_bar_on_a_terminal_unless_quiet(monkeypatch, capsys):
    monkeypatch.setattr(cli_run, "PROGRESS_DELAY_S", 0.0)
    for quiet, shown in ((False, True), (True, False)):
        terminal = _Terminal()
        monkeypatch.setattr("sys.stderr", terminal)
        assert main(["run", "--set", "steps=300", "--set", "warmup_steps=5",
                     *(["--quiet"] if quiet else [])]) == 0
        assert ("simulating" in terminal.getvalue() or "analysing" in terminal.getvalue()) \
            == shown
    capsys.readouterr()
    # not a terminal: no bar (capsys' stderr is not one), only the executor's name
    monkeypatch.undo()
    assert main(["run", *SHORT]) == 0
    assert capsys.readouterr().err == "simwar: executor fast\n"


def test_the_engine_stays_free_of_tqdm_and_printing():
    import subprocess
    import sys

    code = ("import sys, io, contextlib; from simwar.api import simulate\n"
            "out = io.StringIO()\n"
            "with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):\n"
            "    simulate(None, {'steps': 30, 'warmup_steps': 5}, progress=lambda k: None)\n"
            "assert out.getvalue() == '', out.getvalue()\n"
            "assert 'tqdm' not in sys.modules\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# --------------------------------------------------------------------------- the API too
def test_set_blame_in_the_api():
    with pytest.raises(ConfigError, match=r"^--set warmup_steps=2000: warmup_steps \(2000\)"):
        simwar.simulate(None, {"warmup_steps": 2000})


def test_readme_quickstart_run_still_works(tmp_path):
    shutil.copy(REPO / "configs" / "dspark_coarse.yaml", tmp_path / "c.yaml")
    assert main(["run", str(tmp_path / "c.yaml"), "--set", "steps=60", "--quiet",
                 "--timeline", str(tmp_path / "t.png"), "--steps-window", "20:22",
                 "--trace", str(tmp_path / "t.json")]) == 0
    assert (tmp_path / "t.png").exists() and (tmp_path / "t.json").exists()
