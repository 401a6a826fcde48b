"""Agreement with real H200 measurements (tests/data/h200_overlap_run1.json).

Every case except ``policy: host`` is expressed as a simwar config with the
measured primitive costs (``simwar.fit.replays.loop_case_config``); the one cost
the primitives lack, the per-call host overhead of the measuring loop, is
fitted on the CPU-bound cases (``fit_host_call_us``). Tolerances are the
project's: step time within 5 %, forward-stream gap within max(25 µs, 10 %),
observed-overlap presence equal to measured ``hazards > 0``, launch-ahead
within 0.15.

Measured races are value checks (a read saw the next step's write), so they
are compared with the simulator's *observed* overlaps; latent races are a
superset by design (a barrier-less loop is a latent race even when its timing
hides it).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import simwar
from simwar.fit.replays import fit_host_call_us, loop_case_config

#: shipped with the tests (its description: h200_overlap_run1.README.md beside it)
DATA = Path(__file__).resolve().parent / "data" / "h200_overlap_run1.json"


@pytest.fixture(scope="module")
def reference():
    data = json.loads(DATA.read_text())
    cases = [c for c in data["loops"] if c["policy"] != "host"]
    cpu_bound = [c for c in cases if c["launch_ahead_mean"] < 0.5]
    host_call_us = fit_host_call_us([loop_case_config(c, data["primitives"]) for c in cpu_bound],
                                    [c["wall_per_step_us"] for c in cpu_bound])
    rows = []
    for c in cases:
        s = simwar.simulate(loop_case_config(c, data["primitives"],
                                             host_call_us=host_call_us)).summary
        rows.append((c, s))
    return host_call_us, rows


def _id(c):
    g = f"graph-{c['boundary']}" if c["graph"] else "eager"
    return f"{c['policy']}-{g}-R{c['R']}-P{c['P']}"


def test_fitted_host_cost_is_plausible(reference):
    host_call_us, _ = reference
    # Python + framework dispatch per call: tens of µs at most, never negative
    assert 0 < host_call_us < 50


def test_every_case_within_tolerance(reference):
    _, rows = reference
    assert len(rows) == 35
    failures = []
    for c, s in rows:
        step_err = abs(s["step_us_mean"] - c["wall_per_step_us"]) / c["wall_per_step_us"]
        gap_err = abs(s["fwd_gap_us_p50"] - c["gpu_gap_median_us"])
        checks = {
            "step": step_err <= 0.05,
            "gap": gap_err <= max(25.0, 0.10 * c["gpu_gap_median_us"]),
            "race": (s["overlaps"] > 0) == (c["hazards"] > 0),
            "launch_ahead": abs(s["launch_ahead_mean"] - c["launch_ahead_mean"]) <= 0.15,
        }
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            failures.append(f"{_id(c)}: {bad} sim step {s['step_us_mean']:.0f} vs "
                            f"{c['wall_per_step_us']:.0f}, gap {s['fwd_gap_us_p50']:.0f} vs "
                            f"{c['gpu_gap_median_us']:.0f}")
    assert not failures, "\n".join(failures)


def test_racy_cases_are_also_latent_races(reference):
    _, rows = reference
    for c, s in rows:
        if c["hazards"] > 0:
            assert s["races"] > 0, _id(c)
        if c["policy"] in ("coarse",) or (c["policy"] == "fine" and c["boundary"] in
                                          ("in", "post", "eager")):
            assert s["races"] == 0, _id(c)
