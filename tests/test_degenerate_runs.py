"""Runs a config allows but whose figures used to be garbage: steps that take no time,
distributions clipped at their min most of the time, fewer than one accepted token."""

from __future__ import annotations

import json

import numpy as np
import pytest

import simwar
from simwar.builder.draws import sample
from simwar.cli.app import main
from simwar.config import ConfigError, Dist, load_config
from simwar.config.clipping import clipped, clipping_warnings

ZERO = {"name": "zero", "algorithm": "custom", "steps": 100, "warmup_steps": 10,
        "phases": [{"name": "fwd", "body_us": 0, "reads": ["req_to_token"],
                    "read_ends": "in_replay"}],
        "cpu": {k: 0 for k in ("ingest_us", "schedule_us", "prepare_us", "process_result_us")},
        "gpu": {k: 0 for k in ("schedule_writes_us", "result_writes_us", "result_copy_us",
                               "seq_lens_copy_us")},
        "costs": {k: 0 for k in ("launch_us", "event_record_us", "wait_event_us",
                                 "wait_stream_us", "graph_launch_us", "sync_us", "sync_wake_us",
                                 "cross_stream_us")}}


@pytest.mark.parametrize("summary_only", [False, True])
def test_steps_that_take_no_time_have_no_throughput_and_no_busy_share(summary_only):
    s = simwar.simulate(ZERO, summary_only=summary_only).summary
    assert s["step_us_mean"] == 0.0
    assert np.isnan(s["tokens_per_s"]) and np.isnan(s["gpu_busy_fraction"])


def test_run_says_so_instead_of_printing_nan_and_inf(tmp_path, capsys):
    path = tmp_path / "zero.yaml"
    path.write_text(json.dumps(ZERO))
    assert main(["run", str(path), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "nan" not in out and "inf " not in out, out
    assert "busy n/a (the steps take no time)" in out
    assert "throughput          n/a: the steps take no time" in out
    assert main(["run", str(path), "--quiet", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["tokens_per_s"] is None and s["gpu_busy_fraction"] is None


# --------------------------------------------------------------------------- clipping
@pytest.mark.parametrize("d", [
    {"dist": "normal", "mean": 10, "std": 1000},
    {"dist": "normal", "mean": 300, "std": 200, "min": 100},
    {"dist": "lognormal", "mean": 500, "std": 400, "min": 300},
    {"dist": "uniform", "low": 0, "high": 100, "min": 30},
    {"dist": "empirical", "values": [0, 5, 10, 50], "min": 8},
])
def test_the_clipped_share_and_mean_are_those_of_the_draws(d):
    dist = Dist(**d)
    share, after, _ = clipped(dist)
    x = sample(np.random.default_rng(7), dist, 400_000)
    assert np.mean(x == dist.min) == pytest.approx(share, abs=0.004)
    assert np.mean(x) == pytest.approx(after, rel=0.01)


def test_the_issue_s_example_drifts_to_about_400_us():
    share, after, before = clipped(Dist(dist="normal", mean=10, std=1000))
    assert share == pytest.approx(0.496, abs=0.001) and after == pytest.approx(404, abs=1)
    assert before == 10


def test_a_clipped_distribution_is_a_warning_on_the_result_and_nothing_is_printed(capsys):
    r = simwar.simulate(None, {"steps": 60, "warmup_steps": 5,
                               "cpu.schedule_us": {"dist": "normal", "mean": 10, "std": 1000},
                               "phases.verify.body_us": {"base": 100, "per_seq": 1, "noise": {
                                   "dist": "normal", "mean": 0, "std": 20}}})
    assert capsys.readouterr() == ("", "")  # the core never prints
    assert r.warnings == [
        "cpu.schedule_us: normal(mean 10, std 1000) falls below its min 0 in 49.6% of its "
        "draws, which are clipped to 0: what is drawn averages 404 µs, not 10 (raise min, or "
        "narrow the distribution)",
        "phases.verify.body_us.noise: normal(mean 0, std 20) falls below its min 0 in 50.0% of "
        "its draws, which are clipped to 0: what is drawn averages 7.979 µs, not 0 (raise "
        "min, or narrow the distribution)"]


def test_run_and_validate_print_the_warning_on_stderr(tmp_path, capsys):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("steps: 60\nwarmup_steps: 5\ncpu:\n  schedule_us: {dist: normal, mean: 10, "
                   "std: 1000}\n")
    assert main(["run", str(cfg), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert "warning" not in out
    assert err.startswith("simwar: warning: cpu.schedule_us: normal(mean 10, std 1000) falls "
                          "below its min 0 in 49.6%")
    assert main(["validate", str(cfg)]) == 0
    out, err = capsys.readouterr()
    assert out == f"{cfg}: ok (config unnamed: dspark, barrier fine, after_launch)\n"
    assert err.startswith(f"simwar: warning: {cfg}: cpu.schedule_us: normal(mean 10")


def test_a_distribution_rarely_clipped_or_a_constant_is_not_warned_about():
    cfg = load_config(None, {"cpu.schedule_us": {"dist": "normal", "mean": 900, "std": 300},
                             "cpu.ingest_us": {"dist": "lognormal", "mean": 100, "std": 50},
                             "gpu.schedule_writes_us": {"dist": "uniform", "low": 0,
                                                        "high": 400}})
    assert clipping_warnings(cfg) == []  # 0.13% below 0; a lognormal and uniform(0, ..) never
    assert clipping_warnings(load_config(None)) == []


# --------------------------------------------------------------------------- accepted tokens
@pytest.mark.parametrize("tokens", [0.5, [2, 0.9], {"dist": "normal", "mean": 3, "std": 1},
                                    {"dist": "uniform", "low": 0.5, "high": 4},
                                    {"dist": "empirical", "values": [0, 1, 2]}])
def test_fewer_than_one_accepted_token_is_refused(tokens):
    with pytest.raises(ConfigError, match="accept.tokens"):
        load_config(None, {"accept.tokens": tokens})


@pytest.mark.parametrize("tokens", [1, 3.2, [1, 2.5], {"dist": "normal", "mean": 3, "std": 1,
                                                       "min": 1},
                                    {"dist": "uniform", "low": 1, "high": 4},
                                    {"dist": "empirical", "values": [1, 2, 3, 4, 5]}])
def test_one_or_more_accepted_tokens_are_fine(tokens):
    load_config(None, {"accept.tokens": tokens})
