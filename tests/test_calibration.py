"""The calibrated simulator against the committed H200 suite measurements (``calibration/``).

``calibration/h200.yaml`` was fitted from repeat 1 (per-call host costs, not
step times); the check runs against repeat 2 of the same session, simulating
every suite case with those costs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from simwar.harness import fit, suite

CAL = Path(__file__).resolve().parents[1] / "calibration"


@pytest.fixture(scope="module")
def table():
    costs = yaml.safe_load((CAL / "h200.yaml").read_text())["costs"]
    measured = json.loads((CAL / "h200_suite_run2.json").read_text())["cases"]
    configs = {}
    for name in measured:
        cfg = suite.config_mapping(name)
        cfg["costs"] = dict(cfg["costs"], **costs)
        configs[name] = cfg
    return fit.compare(configs, measured,
                       metrics=("step_us_mean", "fwd_gap_us_mean", "launch_ahead_mean"))


def test_committed_suite_covers_every_algorithm_policy_and_regime():
    measured = json.loads((CAL / "h200_suite_run2.json").read_text())["cases"]
    assert len(measured) >= 30
    assert set(measured) == set(suite.cases())
    assert sum(m["measured_races"] > 0 for m in measured.values()) >= 4


def test_step_time_error(table):
    c = fit.criteria(table)
    assert c["cases"] >= 30
    assert c["step_rel_error_median"] <= 0.03
    assert c["step_rel_error_max"] <= 0.08


def test_race_presence_identical_and_launch_ahead(table):
    c = fit.criteria(table)
    assert c["race_presence_mismatches"] == 0
    assert c["racy_cases"] >= 4
    assert c["launch_ahead_abs_error_max"] <= 0.15


def test_forward_gap_error_on_gpu_bound_cases(table):
    """GPU-bound gaps are device-side and within max(25 µs, 10%) everywhere. CPU-bound gaps
    carry the host's drift on the device machine (see calibration/README.md): they are
    held to a looser 20%."""
    gap = table[table.metric == "fwd_gap_us_mean"]
    bound = (gap.measured.abs() * 0.10).clip(lower=25.0)
    gpu = ~gap.config.str.contains("-cpu")
    assert (gap.abs_error[gpu] <= bound[gpu]).all()
    assert (gap.abs_error[~gpu] <= (gap.measured[~gpu].abs() * 0.20).clip(lower=25.0)).all()


def test_repeats_agree():
    """Device-paced cases repeat within 1%; host-paced ones (CPU-bound, or a host_sync barrier
    on the critical path) carry the device machine's host drift, recorded, not hidden."""
    runs = [json.loads((CAL / f"h200_suite_run{i}.json").read_text())["cases"]
            for i in (1, 2, 3)]
    spread = {}
    for name in runs[0]:
        steps = [r[name]["summary"]["step_us_mean"] for r in runs]
        spread[name] = max(steps) / min(steps) - 1
    device_paced = [n for n in spread if "-cpu" not in n and "host_sync" not in n]
    assert len(device_paced) >= 15
    assert max(spread[n] for n in device_paced) <= 0.01
    assert sorted(spread.values())[len(spread) // 2] <= 0.01
