"""For CI and sweep users: ``run --fail-on-race`` and ``simwar results OUT``, which prints a
sweep's table (sorted, chosen columns, CSV), also the table an interrupted sweep left."""

from __future__ import annotations

import io
from pathlib import Path

import pandas as pd
import pytest

from simwar.cli.app import main
from simwar.study.sweeps import SweepInterrupted, sweep

REPO = Path(__file__).resolve().parents[1]
SHORT = ["--set", "steps=60", "--set", "warmup_steps=5"]


def test_fail_on_race_exits_1_with_latent_races_and_0_without(capsys):
    assert main(["run", str(REPO / "configs" / "dspark_none.yaml"), *SHORT, "-q",
                 "--fail-on-race"]) == 1
    out, err = capsys.readouterr()
    races = int(out.split("  races               ")[1].split()[0])
    assert races > 0 and err == (f"simwar: {races} latent races in the steps measured "
                                 f"(--fail-on-race)\n")
    assert main(["run", str(REPO / "configs" / "dspark_none.yaml"), *SHORT, "-q"]) == 0
    assert main(["run", *SHORT, "-q", "--fail-on-race", "--json"]) == 0  # dspark fine: none
    capsys.readouterr()


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    out = tmp_path_factory.mktemp("results") / "out"
    sweep({"base": {"steps": 60, "warmup_steps": 5},
           "grid": {"policy.barrier": ["coarse", "fine", "none"],
                    "cpu.schedule_us": [500, 3000]}}, out)
    return out


def test_results_prints_the_swept_keys_and_headline_metrics(out, capsys):
    assert main(["results", str(out)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["policy.barrier", "cpu.schedule_us", "step_us_mean",
                                "fwd_gap_us_mean", "gpu_idle_us_mean", "tokens_per_s", "races"]
    assert len(lines) == 1 + 6
    assert lines[1].split()[:3] == ["coarse", "500", "6196.0"]


def test_results_sorts_filters_chooses_columns_and_writes_csv(out, capsys):
    assert main(["results", str(out), "--sort", "step_us_mean", "--sort", "cpu.schedule_us",
                 "--descending", "--columns", "policy.barrier,cpu.schedule_us,step_us_mean",
                 "--csv"]) == 0
    table = pd.read_csv(io.StringIO(capsys.readouterr().out))
    full = pd.read_parquet(out / "results.parquet")
    expect = full.sort_values(["step_us_mean", "cpu.schedule_us"], ascending=False,
                              kind="mergesort")[["policy.barrier", "cpu.schedule_us",
                                                 "step_us_mean"]].reset_index(drop=True)
    pd.testing.assert_frame_equal(table, expect)
    assert main(["results", str(out), "--where", "policy.barrier=fine", "--limit", "1",
                 "--columns", "run_id,races"]) == 0
    assert capsys.readouterr().out.split() == ["run_id", "races", "2", "0"]


def test_results_of_an_interrupted_sweep_are_the_runs_that_finished(tmp_path, capsys):
    # a lockstep batch per algorithm (one iteration shape each), in run order (the barriers
    # of one algorithm would run as one batch)
    spec = {"base": {"steps": 60, "warmup_steps": 5},
            "grid": {"algorithm": ["none", "eagle", "dflash", "dspark"],
                     "cpu.schedule_us": [100 * i for i in range(1, 6)]}}
    done = []

    def stop_after_two_batches(n):
        done.append(n)
        if len(done) == 2:
            raise KeyboardInterrupt

    with pytest.raises(SweepInterrupted):
        sweep(spec, tmp_path / "out", progress=stop_after_two_batches)
    assert main(["results", str(tmp_path / "out"), "--columns", "cpu.schedule_us"]) == 0
    assert capsys.readouterr().out.split() == ["cpu.schedule_us",
                                               *(["100", "200", "300", "400", "500"] * 2)]


@pytest.mark.parametrize("args,line", [
    (["--sort", "bogus"], "--sort bogus: not a column of {out} (swept keys: policy.barrier, "
                          "cpu.schedule_us; metrics like step_us_mean, fwd_gap_us_mean, "
                          "gpu_idle_us_mean, tokens_per_s, races)"),
    (["--descending"], "--descending: only with --sort KEY"),
    (["--where", "policy.barrier=sideways"], "--where policy.barrier=sideways: no rows match"),
])
def test_results_errors_are_one_line(out, capsys, args, line):
    assert main(["results", str(out), *args]) == 2
    assert capsys.readouterr() == ("", f"simwar: error: {line.format(out=out)}\n")
