"""A row of the per-step table is about one forward: ``fwd_gap_us[k]`` is the gap before
forward k, and ``gpu_idle_us[k]`` (with its dependency / host split and ``gpu_busy_us[k]``)
the forward stream's time from forward k-1's end to forward k's end, the same gap plus any
idle inside forward k. The per-bucket table and the workload plot follow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import simwar
from simwar.analysis.bubbles import bubbles
from simwar.analysis.metrics import measured
from simwar.plots.workload import regime_steps

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
NOISY = {"steps": 150, "warmup_steps": 10,
         "cpu.schedule_us": {"dist": "lognormal", "mean": 900, "std": 300},
         "gpu.schedule_writes_us": {"dist": "uniform", "low": 100, "high": 400},
         "cpu.process_result_us": {"dist": "empirical", "values": [600, 800, 6500]}}


@pytest.mark.parametrize("name,overrides", [
    ("dspark_fine_bimodal", {}), ("dspark_coarse", NOISY), ("dflash_legacy_host_sync", NOISY),
    ("eagle_fine", NOISY)])
@pytest.mark.parametrize("engine", ["fast", "simpy"])
def test_gap_and_idle_of_a_row_are_about_the_same_forward(name, overrides, engine):
    r = simwar.simulate(str(CONFIGS / f"{name}.yaml"), overrides, engine=engine)
    c = r.columns
    prev_end = np.insert(c["fwd_end_us"][:-1], 0, np.nan)
    window = c["fwd_end_us"] - prev_end
    k = slice(1, None)  # the first forward has no predecessor (NaN)
    assert np.isnan(c["gpu_idle_us"][0]) and np.isnan(c["fwd_gap_us"][0])
    assert np.allclose(c["gpu_busy_us"][k] + c["gpu_idle_us"][k], window[k], atol=1e-6)
    # every forward-stream kernel of a simulated step is a phase kernel: the idle is the gap
    # before the forward plus the idle inside it
    inside = c["fwd_us"] - c["gpu_busy_us"]
    assert np.allclose(c["gpu_idle_us"][k], c["fwd_gap_us"][k] + inside[k], atol=1e-6)
    assert np.all(c["gpu_idle_us"][k] >= c["fwd_gap_us"][k] - 1e-6)
    assert np.allclose(c["gpu_idle_dep_us"][k] + c["gpu_idle_host_us"][k], c["gpu_idle_us"][k])
    s = r.summary
    busy, idle = (np.nansum(measured(r.steps, r.config.warmup_steps)[col])
                  for col in ("gpu_busy_us", "gpu_idle_us"))
    assert s["gpu_busy_fraction"] == pytest.approx(busy / (busy + idle), rel=1e-12)


def test_the_per_bucket_table_shows_the_gap_inside_the_idle():
    # before, bucket 64 showed "GPU idle 0.0" beside "fwd gap 143.8": the idle after its
    # forwards against the gap before them
    by = simwar.simulate(str(CONFIGS / "dspark_fine_bimodal.yaml")).summary["by_bucket"]
    for bucket, row in by.items():
        assert row["gpu_idle_us_mean"] >= row["fwd_gap_us_mean"] - 1e-9, bucket
    assert by[64]["fwd_gap_us_mean"] == pytest.approx(143.8, abs=0.05)
    assert by[64]["gpu_idle_us_mean"] == pytest.approx(143.8, abs=0.05)


def test_the_workload_plot_shades_the_steps_whose_forward_waited_on_the_host():
    r = simwar.simulate(str(CONFIGS / "dspark_fine_bimodal.yaml"), {"steps": 120},
                        engine="simpy")
    window = (24, 95)
    ax = regime_steps(r, steps=window)
    shaded = {int(p.get_gid().split(":")[1]) for p in ax.patches
              if (p.get_gid() or "").startswith("host_bound:")}
    # the gaps whose cause is the host (no wait held the forward stream: it was not enqueued)
    host = {b.step for b in bubbles(r, window) if not b.hops and b.idle_us >= 1.0}
    assert host and host <= shaded
    steps = r.steps.set_index("step")
    in_window = steps.loc[window[0]:window[1]]
    assert shaded == set(in_window.index[in_window.gpu_idle_host_us > 0])
    # the first large-batch forward after small ones waited on the host, and is shaded
    flips = [k for k in range(window[0] + 1, window[1] + 1)
             if steps.graph_bucket[k] == 64 and steps.graph_bucket[k - 1] == 8]
    assert flips and all(k in shaded for k in flips)
