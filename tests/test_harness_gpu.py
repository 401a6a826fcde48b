"""The CUDA backend on a real GPU (marked ``gpu``; skipped without torch or CUDA)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def _program(overrides):
    from simwar.api import simulate
    from simwar.harness import suite

    name, steps = overrides
    cfg = suite.case_config(name).model_copy(update={"steps": steps, "warmup_steps": 5})
    return simulate(cfg)


@pytest.fixture(scope="module")
def calibration():
    from simwar.harness.cuda import calibrate_device

    cal = calibrate_device()
    assert 1000 < cal["sleep_cycles_per_us"] < 5000
    return cal


def test_gpu_bound_replay_matches_the_simulated_step(calibration):
    from simwar.analysis.metrics import analyze
    from simwar.harness import make_plan, replay
    from simwar.harness.cuda import CudaBackend

    sim = _program(("dspark-fine-gpu", 40))
    trace = replay(make_plan(sim.program), CudaBackend(calibration))
    _, measured, _ = analyze(trace)
    assert measured["step_us_mean"] == pytest.approx(sim.summary["step_us_mean"], rel=0.02)
    assert trace.meta["measured_races"] == []


def test_racy_replay_is_caught_by_the_value_check(calibration):
    from simwar.harness import make_plan, replay
    from simwar.harness.cuda import CudaBackend

    sim = _program(("dspark-none-gpu", 30))
    trace = replay(make_plan(sim.program), CudaBackend(calibration))
    assert any(r["read_step"] >= 5 for r in trace.meta["measured_races"])
    assert sim.summary["overlaps"] > 0
