"""Sweeps: expansion, seeds and hashes, one-line errors, tables, resume after SIGKILL, backends."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

import simwar.study.sweeps as sweeps
from simwar import __version__
from simwar.api import simulate
from simwar.cli.app import main
from simwar.config import ConfigError
from simwar.core.files import jsonable
from simwar.study.store import RunStore
from simwar.study.sweeps import ID_COLUMNS, load_sweep, sweep

REPO = Path(__file__).resolve().parents[1]
DSPARK_FINE = REPO / "configs" / "dspark_fine.yaml"
SHORT = {"steps": 40, "warmup_steps": 5}


def small_spec(**extra) -> dict:
    spec = {"base": str(DSPARK_FINE),
            "grid": {"policy.barrier": ["coarse", "fine"], "cpu.schedule_us": [500, 2000]},
            "zip": {"phases.verify.body_us": [2000, 5000], "gpu.schedule_writes_us": [100, 300]},
            "repeats": 2}
    spec.update(extra)
    return spec


def write_sweep(tmp_path: Path, text: str, name: str = "sweep.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


# --------------------------------------------------------------------------- expansion
def test_expansion_crosses_grid_zips_zip_and_repeats_innermost():
    plan = load_sweep(small_spec(), SHORT)
    assert len(plan.runs) == 2 * 2 * 2 * 2
    assert [r.run_id for r in plan.runs] == list(range(16))
    first, second, third = plan.runs[:3]
    assert first.values == {"policy.barrier": "coarse", "cpu.schedule_us": 500,
                            "phases.verify.body_us": 2000, "gpu.schedule_writes_us": 100}
    assert (first.repeat, second.repeat) == (0, 1) and second.values == first.values
    assert third.values["phases.verify.body_us"] == 5000
    assert third.values["gpu.schedule_writes_us"] == 300  # zip lists advance together
    assert plan.runs[-1].values["policy.barrier"] == "fine"


def test_seeds_follow_the_repeat_and_hashes_group_repeats():
    plan = load_sweep(small_spec(), {**SHORT, "seed": 7})
    assert {r.seed for r in plan.runs if r.repeat == 0} == {7}
    assert {r.seed for r in plan.runs if r.repeat == 1} == {8}
    first, second = plan.runs[:2]
    assert first.config_hash == second.config_hash  # the seed is not part of the config hash
    assert first.run_key != second.run_key
    assert len({r.config_hash for r in plan.runs}) == 8
    assert len({r.run_key for r in plan.runs}) == 16
    again = load_sweep(small_spec(), {**SHORT, "seed": 7})
    assert [r.run_key for r in again.runs] == [r.run_key for r in plan.runs]


def test_a_run_key_is_the_hash_of_its_config_hash_seed_and_version():
    """The run key written out directly is the canonical JSON hash of the three (the key
    stored results are found by)."""
    for run in load_sweep(small_spec(), {**SHORT, "seed": 2**40}).runs[:4]:
        assert run.run_key == sweeps._hash({"config_hash": run.config_hash, "seed": run.seed,
                                            "version": __version__})
    for config_hash, seed in [("x y", 3), ("ab", True), ("0f", -5)]:
        assert sweeps._run_key(config_hash, seed) == sweeps._hash(
            {"config_hash": config_hash, "seed": seed, "version": __version__})


def test_a_summary_is_made_json_safe_key_by_key():
    """What a sweep stores of a summary: string keys, None for NaN and infinities, lists for
    tuples, Python numbers for numpy's, nested mappings alike."""
    summary = {"a": 1.5, "b": float("nan"), "c": float("inf"), "d": -float("inf"), 3: 2,
               "h": {1: 0.25, 2: float("nan")}, "n": np.float64(2.0), "i": np.int64(4),
               "t": (1, 2.0), "s": "x", "z": None, "k": True}
    out = jsonable(summary)
    assert out == {"a": 1.5, "b": None, "c": None, "d": None, "3": 2, "h": {"1": 0.25, "2": None},
                   "n": 2.0, "i": 4, "t": [1, 2.0], "s": "x", "z": None, "k": True}
    assert type(out["i"]) is int and type(out["k"]) is bool
    json.dumps(out, allow_nan=False)


def test_each_run_applies_its_values_to_the_base_config():
    plan = load_sweep(small_spec(), SHORT)
    run = plan.runs[5]
    phases = {p["name"]: p for p in run.config["phases"]}
    assert run.config["policy"]["barrier"] == run.values["policy.barrier"]
    assert run.config["cpu"]["schedule_us"] == run.values["cpu.schedule_us"]
    assert phases["verify"]["body_us"] == run.values["phases.verify.body_us"]
    assert run.config["steps"] == SHORT["steps"]


def test_base_path_is_relative_to_the_sweep_file(tmp_path):
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "base.yaml").write_text(DSPARK_FINE.read_text())
    path = write_sweep(tmp_path / "configs", """
        base: base.yaml
        grid: {policy.barrier: [coarse, fine]}
    """)
    assert len(load_sweep(path).runs) == 2


def test_inline_base_mapping():
    plan = load_sweep({"base": {"algorithm": "eagle", "steps": 50},
                       "grid": {"policy.barrier": ["none", "fine"]}})
    assert [r.config["algorithm"] for r in plan.runs] == ["eagle", "eagle"]


# --------------------------------------------------------------------------- one-line errors
BAD_SWEEPS = {
    "unknown key": ("base: {}\ngrd: {policy.barrier: [fine]}\n", "grd: unknown key"),
    "empty grid list": ("base: {}\ngrid: {policy.barrier: []}\n",
                        "grid.policy.barrier: expected a non-empty list"),
    "zip lengths": ("base: {}\nzip: {cpu.schedule_us: [1, 2], gpu.schedule_writes_us: [1]}\n",
                    "zip: lists must all have the same length (cpu.schedule_us has 2, "
                    "gpu.schedule_writes_us has 1)"),
    "base missing": ("grid: {policy.barrier: [fine]}\n", "base: Field required"),
    "base file missing": ("base: nowhere.yaml\ngrid: {policy.barrier: [fine]}\n",
                          "base: nowhere.yaml: file not found"),
    "bad value": ("base: {}\ngrid: {policy.barrier: [fine, sideways]}\n",
                  "run 1 (policy.barrier=sideways): policy.barrier: 'sideways' is not a "
                  "barrier policy"),
    "unknown config key": ("base: {}\ngrid: {cpu.scheduel_us: [1]}\n",
                           "cpu.scheduel_us: unknown key"),
    "grid not a list": ("base: {}\ngrid: {policy.barrier: fine}\n",
                        "grid.policy.barrier: Input should be a valid list"),
    "same key twice": ("base: {}\ngrid: {cpu.schedule_us: [1]}\nzip: {cpu.schedule_us: [2]}\n",
                       "cpu.schedule_us: swept in both grid and zip"),
    "seed swept": ("base: {}\ngrid: {seed: [1, 2]}\n", "seed: not sweepable; use repeats"),
    "repeats zero": ("base: {}\nrepeats: 0\n", "repeats: Input should be greater than"),
}


@pytest.mark.parametrize("case", sorted(BAD_SWEEPS))
def test_bad_sweep_file_gives_one_clear_line(tmp_path, capsys, case):
    text, expected = BAD_SWEEPS[case]
    path = write_sweep(tmp_path, text)
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"simwar: error: {path}: ")
    assert expected in err


def test_sweep_command_reports_a_bad_file_in_one_line(tmp_path, capsys):
    path = write_sweep(tmp_path, BAD_SWEEPS["zip lengths"][0])
    assert main(["sweep", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "same length" in err
    assert not (tmp_path / "out").exists()


def test_set_overrides_apply_to_the_base_but_not_to_swept_keys(tmp_path):
    plan = load_sweep(small_spec(), ["cpu.prepare_us=777", "steps=40", "warmup_steps=5"])
    assert {r.config["cpu"]["prepare_us"] for r in plan.runs} == {777}
    with pytest.raises(ConfigError, match=r"^--set policy.barrier: this key is swept"):
        load_sweep(small_spec(), ["policy.barrier=none"])
    with pytest.raises(ConfigError, match=r"--set cpu.prepare_us: .*must be >= 0"):
        load_sweep(small_spec(), ["cpu.prepare_us=-1"])


# --------------------------------------------------------------------------- results
def test_rows_are_the_summaries_of_the_equivalent_single_runs():
    spec = small_spec(repeats=1, grid={"policy.barrier": ["coarse", "fine"]})
    frame = sweep(spec, overrides=SHORT)
    assert list(frame.columns[:6]) == ["policy.barrier", "phases.verify.body_us",
                                       "gpu.schedule_writes_us", *ID_COLUMNS[:3]]
    for row in frame.itertuples(index=False):
        values = {"policy.barrier": row[0], "phases.verify.body_us": row[1],
                  "gpu.schedule_writes_us": row[2], **SHORT}
        expected = simulate(DSPARK_FINE, values).summary
        got = frame.loc[frame["run_id"] == row.run_id].iloc[0]
        for metric in ("step_us_mean", "gpu_idle_us_mean", "cpu_blocked_us_mean",
                       "launch_ahead_mean", "races", "overlaps", "tokens_per_s"):
            assert got[metric] == pytest.approx(expected[metric]), metric
        assert json.loads(got["launch_ahead_hist"]) == {
            str(k): v for k, v in expected["launch_ahead_hist"].items()}


def test_out_dir_holds_tables_runs_and_a_resolved_spec(tmp_path):
    out = tmp_path / "out"
    frame = sweep(small_spec(), out, overrides=SHORT, run_files=True)
    pd.testing.assert_frame_equal(pd.read_parquet(out / "results.parquet"), frame,
                                  check_dtype=False)
    csv = pd.read_csv(out / "results.csv")
    assert list(csv.columns) == list(frame.columns) and len(csv) == len(frame)
    batches = pd.concat([pd.read_parquet(p) for p in sorted((out / "batches").iterdir())])
    assert sorted(batches["run_id"]) == list(frame["run_id"])
    assert not (tmp_path / "plain").exists()
    sweep(small_spec(), tmp_path / "plain", overrides=SHORT)
    assert not (tmp_path / "plain" / "runs").exists()  # per-run files only on request
    runs = sorted((out / "runs").glob("*.json"))
    assert {p.stem for p in runs} == set(frame["run_key"])
    record = json.loads(runs[0].read_text())
    assert record["summary"]["step_us_mean"] > 0 and record["config"]["steps"] == 40
    resolved = yaml.safe_load((out / "sweep.yaml").read_text())
    assert isinstance(resolved["base"], dict)
    assert [r.run_key for r in load_sweep(resolved).runs] == list(frame["run_key"])


def test_rerun_skips_finished_runs_and_redoes_only_missing_ones(tmp_path):
    out = tmp_path / "out"
    first = sweep(small_spec(), out, overrides=SHORT)
    batches = sorted((out / "batches").glob("*.parquet"))
    lost = pd.read_parquet(batches[0])
    batches[0].unlink()  # a batch killed in flight
    (out / "batches" / ".abc.parquet.x1.tmp").write_text("half a file")  # left by a writer
    simulated = []
    again = sweep(small_spec(), out, overrides=SHORT, progress=simulated.append)
    assert sum(simulated) == len(lost)
    pd.testing.assert_frame_equal(again, first)
    assert not list((out / "batches").glob(".*.tmp"))
    nothing = []
    sweep(small_spec(), out, overrides=SHORT, progress=nothing.append)
    assert nothing == []


def test_runs_found_in_run_files_are_committed_as_one_batch(tmp_path):
    first = sweep(small_spec(), tmp_path / "a", overrides=SHORT, run_files=True)
    out = tmp_path / "b"  # another directory holding only the run files
    shutil.copytree(tmp_path / "a" / "runs", out / "runs")
    simulated = []
    again = sweep(small_spec(), out, overrides=SHORT, progress=simulated.append)
    assert simulated == [] and again.attrs["runs_stored"] == len(first)
    assert len(list((out / "batches").glob("*.parquet"))) == 1
    pd.testing.assert_frame_equal(again, first)


def test_a_write_error_committing_found_runs_after_an_interrupt_is_one_line(tmp_path, capsys,
                                                                           monkeypatch):
    spec = write_sweep(tmp_path, """
        base: {steps: 30, warmup_steps: 5}
        grid: {cpu.schedule_us: [300, 600, 900]}
    """)
    assert main(["sweep", str(spec), "--out", str(tmp_path / "a"), "--no-progress",
                 "--run-files"]) == 0
    out = tmp_path / "b"  # the run files alone, and no room for a batch: "batches" is a file
    shutil.copytree(tmp_path / "a" / "runs", out / "runs")
    (out / "batches").write_text("")
    loads, real = [], RunStore.load

    def load(store, run):  # Ctrl-C once a run has been found in its file
        loads.append(run)
        if len(loads) == 2:
            raise KeyboardInterrupt
        return real(store, run)

    monkeypatch.setattr(RunStore, "load", load)
    capsys.readouterr()
    assert main(["sweep", str(spec), "--out", str(out), "--no-progress"]) == 2
    assert capsys.readouterr().err == f"simwar: error: {out / 'batches'}: file exists\n"
    assert not (out / "results.parquet").exists()


def test_runs_of_one_run_key_are_simulated_once_and_each_has_its_row(tmp_path, monkeypatch):
    spec = {"base": str(DSPARK_FINE), "grid": {"cpu.schedule_us": [500, 900, 500, 500]}}
    told = []
    real = sweeps.simulate_batches
    monkeypatch.setattr(sweeps, "simulate_batches",
                        lambda configs, *a: told.append(len(configs)) or real(configs, *a))
    frame = sweep(spec, tmp_path / "out", overrides=SHORT)
    assert sum(told) == 2 and len(frame) == 4 and frame.attrs["runs_simulated"] == 4
    assert frame["run_key"].nunique() == 2
    metrics = frame.drop(columns=["run_id", "name"]).set_index("cpu.schedule_us")
    assert metrics.loc[500].nunique().max() == 1  # three rows, one run
    alone = sweep({**spec, "grid": {"cpu.schedule_us": [500, 900]}}, overrides=SHORT)
    assert frame.iloc[[0, 1]].reset_index(drop=True).drop(columns=["run_id"]).equals(
        alone.drop(columns=["run_id"]))
    nothing = []  # and a rerun finds all four rows stored
    sweep(spec, tmp_path / "out", overrides=SHORT, progress=nothing.append)
    assert nothing == []


def test_one_process_runs_structures_whose_plans_come_out_alike_as_one_group(tmp_path,
                                                                             monkeypatch):
    from simwar.executors import lockstep

    groups = []
    real = lockstep.run_group
    monkeypatch.setattr(lockstep, "run_group",
                        lambda plans, *a, **k: groups.append(len(plans)) or real(plans, *a, **k))
    # eagle's fine barrier plans as its coarse one: two structure keys, one plan structure
    spec = {"base": {"name": "alike", "algorithm": "eagle", "accept": {"tokens": 3.2}},
            "grid": {"policy.barrier": ["coarse", "fine"], "cpu.schedule_us": [300, 900, 2000]}}
    frame = sweep(spec, tmp_path / "out", overrides=SHORT)
    assert groups == [6]
    assert len(list((tmp_path / "out" / "batches").glob("*.parquet"))) == 1
    for run in load_sweep(spec, SHORT).runs:
        got = frame.loc[frame["run_id"] == run.run_id].iloc[0]
        want = jsonable(simulate(run.config).summary)
        for metric in ("step_us_mean", "gpu_idle_us_mean", "cpu_blocked_us_mean", "races",
                       "tokens_per_s"):
            assert got[metric] == want[metric], metric


def test_two_local_jobs_give_the_same_rows_as_one(tmp_path):
    one = sweep(small_spec(), overrides=SHORT, jobs=1)
    two = sweep(small_spec(), overrides=SHORT, jobs=2)
    pd.testing.assert_frame_equal(one, two)


def test_simwar_sweep_is_callable_after_importing_the_submodule():
    code = ("from simwar.study.sweeps import load_sweep; import simwar; "
            "frame = simwar.sweep({'base': {'steps': 20, 'warmup_steps': 2}, "
            "'grid': {'policy.barrier': ['coarse', 'fine']}}); assert len(frame) == 2")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_local_sweep_never_imports_ray():
    code = ("import sys, simwar; simwar.sweep({'base': {'steps': 20, 'warmup_steps': 2}, "
            "'grid': {'policy.barrier': ['coarse', 'fine']}}, jobs=2); "
            "sys.exit(1 if 'ray' in sys.modules else 0)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# --------------------------------------------------------------------------- crash and resume
def _cli(*args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "simwar", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


@pytest.mark.slow  # three real sweeps of 48 runs, two of them through fresh interpreters
def test_sigkill_midway_then_rerun_gives_exactly_the_uninterrupted_table(tmp_path):
    sweep_file = write_sweep(tmp_path, f"""
        base: {DSPARK_FINE}
        grid:
          policy.barrier: [none, coarse, fine, host_sync]
          cpu.schedule_us: [250, 500, 1000, 2000, 4000, 6000]
        repeats: 2
    """)
    total = 48
    overrides = ["steps=3000", "warmup_steps=10"]
    args = ("sweep", str(sweep_file), "--jobs", "2", "--no-progress",
            *(f"--set={item}" for item in overrides))
    out = tmp_path / "out"
    victim = _cli(*args, "--out", str(out), start_new_session=True)
    batches = out / "batches"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and victim.poll() is None:
        if batches.is_dir() and len(list(batches.glob("*.parquet"))) >= 2:
            break
        time.sleep(0.005)
    assert victim.poll() is None, "the sweep ended before it could be killed"
    os.killpg(victim.pid, signal.SIGKILL)  # the sweep and its pool workers, as a crash would
    victim.wait()
    done = sum(len(pd.read_parquet(p)) for p in batches.glob("*.parquet"))
    assert 2 <= done < total
    assert not (out / "results.parquet").exists()

    resumed = _cli(*args, "--out", str(out))
    stdout, stderr = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, stderr.decode()
    assert f"{done} already done, {total - done} simulated" in stdout.decode()

    uninterrupted = sweep(sweep_file, tmp_path / "reference", jobs=2, overrides=overrides)
    final = pd.read_parquet(out / "results.parquet")
    assert len(final) == total and final["run_id"].is_unique and final["run_key"].is_unique
    pd.testing.assert_frame_equal(final, pd.read_parquet(tmp_path / "reference" /
                                                         "results.parquet"))
    pd.testing.assert_frame_equal(final, uninterrupted, check_dtype=False)


@pytest.mark.slow  # two sweeps through fresh interpreters
def test_ctrl_c_stops_the_pool_at_once_and_the_rerun_completes(tmp_path):
    out = tmp_path / "out"
    args = ("sweep", str(REPO / "configs" / "sweeps" / "cost_coarse_vs_fine.yaml"), "--out",
            str(out), "--jobs", "2", "--no-progress", "--set=steps=3000")
    # a shell's background jobs start with SIGINT ignored; a terminal's Ctrl-C does not
    interrupted = _cli(*args, start_new_session=True,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    batches = out / "batches"
    deadline = time.monotonic() + 60
    # a batch finishes (the table of what finished has rows), most do not
    while time.monotonic() < deadline and not (batches.is_dir() and
                                               len(list(batches.glob("*.parquet"))) >= 1):
        time.sleep(0.01)
    os.killpg(interrupted.pid, signal.SIGINT)  # Ctrl-C reaches the whole foreground group
    _, stderr = interrupted.communicate(timeout=10)
    assert interrupted.returncode == 130
    with pytest.raises(ProcessLookupError):  # no pool worker left running
        os.killpg(interrupted.pid, 0)
    done = sum(len(pd.read_parquet(p)) for p in batches.glob("*.parquet"))
    # the results table of what finished is there at once, the rows of the batches
    kept = (f"; {out}/results.parquet (and .csv) hold the {done} runs that finished"
            if done else "")
    assert stderr.decode().strip() == (
        f"simwar: interrupted{kept}; rerun the same command to finish the 36 runs")
    if done:
        partial = pd.read_parquet(out / "results.parquet")
        assert len(partial) == done and partial["run_id"].is_monotonic_increasing
        assert len(pd.read_csv(out / "results.csv")) == done
    resumed = _cli(*args)
    stdout, stderr = resumed.communicate(timeout=120)
    assert resumed.returncode == 0, stderr.decode()
    assert f"({done} already done, {36 - done} simulated" in stdout.decode()
    assert len(pd.read_parquet(out / "results.parquet")) == 36


# --------------------------------------------------------------------------- ray
@pytest.mark.slow  # starting a local Ray takes several seconds on two cores
def test_ray_backend_gives_the_same_rows_as_the_local_pool(tmp_path):
    ray = pytest.importorskip("ray")
    local = sweep(small_spec(), tmp_path / "local", overrides=SHORT, jobs=2, run_files=True)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    told = []
    try:
        remote = sweep(small_spec(), tmp_path / "ray", overrides=SHORT, backend="ray",
                       run_files=True, progress=told.append)
    finally:
        ray.shutdown()
    # a task per lockstep batch, at least one per worker: the progress moves batch by batch
    assert sum(told) == len(local) and len(told) >= 2
    pd.testing.assert_frame_equal(local.sort_values("run_id").reset_index(drop=True),
                                  remote.sort_values("run_id").reset_index(drop=True))
    assert sorted(p.name for p in (tmp_path / "ray" / "runs").iterdir()) == \
        sorted(p.name for p in (tmp_path / "local" / "runs").iterdir())


def test_unknown_backend_is_a_one_line_error():
    with pytest.raises(ConfigError, match="backend: 'slurm' is not one of local, ray"):
        sweep(small_spec(), backend="slurm")


def test_the_sweep_command_writes_run_files_only_when_asked(tmp_path, capsys):
    spec = write_sweep(tmp_path, """
        base: {steps: 30, warmup_steps: 5}
        grid: {cpu.schedule_us: [300, 600]}
    """)
    assert main(["sweep", str(spec), "--out", str(tmp_path / "a"), "--no-progress"]) == 0
    assert main(["sweep", str(spec), "--out", str(tmp_path / "b"), "--no-progress",
                 "--run-files"]) == 0
    assert not (tmp_path / "a" / "runs").exists()
    assert len(list((tmp_path / "b" / "runs").glob("*.json"))) == 2
    assert len(pd.read_parquet(tmp_path / "a" / "results.parquet")) == 2
