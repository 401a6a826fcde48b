"""Closed-form checks: what the barrier policies cost, with constant durations."""

from __future__ import annotations

import pytest

import simwar

ZERO_COSTS = {f"costs.{k}": 0 for k in ("launch_us", "event_record_us", "wait_event_us",
                                         "wait_stream_us", "graph_launch_us", "sync_us",
                                         "sync_wake_us", "host_call_us")}
BASE = {"steps": 40, "warmup_steps": 5, "algorithm": "dspark"}
# DSPARK defaults: draft 20 + 20 + 500, verify 40 + 60 + 5100, sample 100
FWD = 20 + 20 + 500 + 40 + 60 + 5100 + 100


@pytest.mark.parametrize("writes_us", [50, 300, 900])
def test_fine_hides_schedule_writes_and_coarse_adds_them_to_every_step(writes_us):
    o = {**BASE, "gpu.schedule_writes_us": writes_us, "gpu.result_writes_us": 50,
         "costs.cross_stream_us": 3}
    fine = simwar.simulate(None, {**o, "policy.barrier": "fine"}).summary
    coarse = simwar.simulate(None, {**o, "policy.barrier": "coarse"}).summary
    # GPU-bound: the fine barrier releases the writes at verify's in-graph read-done
    assert fine["step_us_mean"] == pytest.approx(FWD)
    assert fine["fwd_gap_us_mean"] == pytest.approx(0)
    # coarse: result writes + next schedule writes run after the whole forward, and the next
    # forward waits for them: two cross-stream hops
    bubble = 50 + writes_us + 2 * 3
    assert coarse["step_us_mean"] == pytest.approx(FWD + bubble)
    assert coarse["fwd_gap_us_mean"] == pytest.approx(bubble)
    assert coarse["gpu_idle_dep_us_mean"] == pytest.approx(bubble)  # all of it is kernel-wait
    assert coarse["launch_ahead_mean"] == pytest.approx(1.0)  # the CPU still runs ahead


def test_host_sync_loses_launch_ahead():
    # decode published after the graph (post_replay) and a host block on it right after the
    # launch: the CPU cannot prepare step k+1 before forward k is nearly done
    o = {**BASE, **ZERO_COSTS, "algorithm": "none", "policy.barrier": "host_sync",
         "phases.decode.read_ends": "post_replay", "costs.cross_stream_us": 3}
    s = simwar.simulate(None, o).summary
    assert s["launch_ahead_mean"] == 0
    assert s["run_ahead_fraction"] == 0
    # one step = decode until read-done (30 + 20 + 7000) + the CPU chain (process 800, ingest 100,
    # schedule 900, prepare 300) + the schedule writes (300) + a cross-stream hop (3)
    assert s["step_us_mean"] == pytest.approx(7050 + 2100 + 300 + 3)
    # the fine barrier on the same late read-done keeps the CPU ahead; the GPU pays the result
    # writes (50) and next writes (300) after decode's reads end, across two hops
    fine = simwar.simulate(None, {**o, "policy.barrier": "fine"}).summary
    assert fine["launch_ahead_mean"] == 1
    assert fine["step_us_mean"] == pytest.approx(7050 + 50 + 300 + 2 * 3)


def test_cpu_bound_step_is_the_host_loop():
    o = {**BASE, **ZERO_COSTS, "cpu.schedule_us": 9000, "costs.cross_stream_us": 0}
    s = simwar.simulate(None, o).summary
    cpu = 100 + 9000 + 300 + 800 + 40 + 30 + 20  # ingest, schedule, prepare, process, dispatch
    assert s["step_us_mean"] == pytest.approx(cpu)
    assert s["launch_ahead_mean"] == 0
    assert s["fwd_gap_us_mean"] == pytest.approx(cpu - FWD)
    # the forward waits 300 µs for the writes the late host just issued (kernel-wait), the
    # rest of the bubble is the host not having launched it yet (host-wait)
    assert s["gpu_idle_dep_us_mean"] == pytest.approx(300)
    assert s["gpu_idle_host_us_mean"] == pytest.approx(cpu - FWD - 300)


def test_tokens_per_second():
    s = simwar.simulate(None, {**BASE, "batch_size": 8, "accept.tokens": 2.5}).summary
    assert s["tokens_per_s"] == pytest.approx(8 * 2.5 / FWD * 1e6)


def test_legacy_dflash_verify_done_block_costs_cpu_time():
    base = {**BASE, "algorithm": "dflash", "phases.verify.read_ends": "post_replay"}
    legacy = simwar.simulate(None, {**base, "policy.barrier": "host_sync",
                                    "policy.placement": "loop_top"}).summary
    fine = simwar.simulate(None, {**base, "policy.barrier": "fine"}).summary
    assert legacy["cpu_blocked_verify_done_us_mean"] > 1000
    assert fine["cpu_blocked_verify_done_us_mean"] == 0
    assert fine["races"] == 0
    # the verify_done block orders only the next step's writes: result-processing writes issued
    # after the launch still race with this forward's reads (why #31687 mattered)
    r = simwar.simulate(None, {**base, "policy.barrier": "host_sync",
                               "policy.placement": "loop_top"})
    assert legacy["races"] > 0
    assert {x.second_label for x in r.hazards.latent} == {"result_writes"}


def test_cpu_seq_lens_mirror_blocks_on_the_previous_publish():
    s = simwar.simulate(None, {**BASE, "policy.needs_cpu_seq_lens": True}).summary
    assert s["cpu_blocked_seq_lens_us_mean"] > 0
    assert simwar.simulate(None, BASE).summary["cpu_blocked_seq_lens_us_mean"] == 0
