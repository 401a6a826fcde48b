"""Same config and seed → identical results; distributions are drawn from the config's seed."""

from __future__ import annotations

import simwar
from simwar.api import build_program

NOISY = {"steps": 150, "warmup_steps": 10,
         "cpu.schedule_us": {"dist": "lognormal", "mean": 900, "std": 300},
         "phases.verify.body_us": {"dist": "normal", "mean": 5100, "std": 400},
         "gpu.schedule_writes_us": {"dist": "uniform", "low": 100, "high": 400},
         "cpu.process_result_us": {"dist": "empirical", "values": [600, 800, 1500]}}


def test_same_seed_same_summary_and_frame():
    a = simwar.simulate(None, NOISY)
    b = simwar.simulate(None, NOISY)
    assert a.summary == b.summary
    assert a.steps.equals(b.steps)
    assert build_program(a.config).to_json() == build_program(b.config).to_json()


def test_other_seed_other_draws():
    a = simwar.simulate(None, NOISY).summary
    b = simwar.simulate(None, {**NOISY, "seed": 1}).summary
    assert a["step_us_mean"] != b["step_us_mean"]


def test_distributions_respect_their_parameters():
    p = build_program(simwar.load_config(None, {**NOISY, "steps": 2000}))
    from simwar.core.program import CpuWork, Launch

    sched = [op.duration_us for op in p.ops if type(op) is CpuWork and op.label == "schedule"]
    writes = [op.kernel.duration_us for op in p.ops
              if type(op) is Launch and op.kernel.label == "schedule_writes"]
    proc = {op.duration_us for op in p.ops if type(op) is CpuWork and op.label == "process_result"}
    assert abs(sum(sched) / len(sched) - 900) < 30  # lognormal parameterized by its own mean
    assert min(writes) >= 100 and max(writes) <= 400
    assert proc == {600.0, 800.0, 1500.0}


def test_program_round_trips_through_json():
    p = build_program(simwar.load_config(None, {"steps": 5, "warmup_steps": 1}))
    from simwar.core.program import Program

    q = Program.from_json(p.to_json())
    assert q.ops == p.ops and q.meta == p.meta
