"""The host's work per request received (``cpu.receive_us``): in the iteration whose marker
receives the request, not spread over every step as ``cpu.ingest_us``; what it does to the
sizes, the Program and the run, and every executor's answer with it.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_fast import assert_same_run, reference
from test_prefill_cost import _same_summary
from test_shapes import BURSTY, ONE

import simwar
from simwar.api import build_program, resolve_sizes
from simwar.config import load_config
from simwar.core.program import CpuWork
from simwar.executors import fast, lockstep

RECEIVE = {"per_request": 30.0, "per_prompt_token": 0.25}


def test_the_work_lands_in_the_iteration_that_receives_the_request():
    wl = {**ONE["workload"], "arrivals": {"rate_per_s": 40}, "initial_batch": 2}
    cfg = load_config(None, {**ONE, "steps": 60, "workload": wl, "cpu.receive_us": RECEIVE})
    sz = resolve_sizes(cfg)
    req = sz.requests
    # every request is received at the marker of the first iteration at or after its
    # arrival, and admitted there (never more than max_batch running)
    assert sz.batch.max() < 8
    want = np.zeros(len(sz.batch))
    for k, p in zip(req["admit_step"], req["prompt_tokens"]):
        want[k] += RECEIVE["per_request"] + RECEIVE["per_prompt_token"] * p
    np.testing.assert_allclose(sz.received_us, want)
    assert sz.received_us[0] == 2 * (30.0 + 0.25 * 1000)  # the two there at time 0
    ops = [op for op in build_program(cfg).ops
           if isinstance(op, CpuWork) and op.label == "ingest.requests"]
    assert [op.step for op in ops] == np.flatnonzero(want).tolist()
    assert [op.duration_us for op in ops] == want[want > 0].tolist()


def test_a_lone_request_reaches_its_first_forward_that_much_later():
    base = {**ONE, "policy.overlap": False}
    plain = simwar.simulate(None, base, engine="simpy").summary
    paid = simwar.simulate(None, {**base, "cpu.receive_us": RECEIVE}, engine="simpy").summary
    cost = RECEIVE["per_request"] + RECEIVE["per_prompt_token"] * 1000
    # the loop waits for the host alone before a lone request's first forward
    assert paid["request_ttft_forward_us_mean"] == pytest.approx(
        plain["request_ttft_forward_us_mean"] + cost)


def test_without_the_key_a_run_is_what_it_was():
    cfg = load_config(None, BURSTY)
    assert resolve_sizes(cfg).received_us is None
    zero = load_config(None, {**BURSTY, "cpu.receive_us": {"per_request": 0}})
    assert _same_summary(simwar.simulate(cfg).summary, simwar.simulate(zero).summary)


@pytest.mark.parametrize("variant", [
    {}, {"scheduling": {"rule": "sglang_mixed"}}, {"policy.overlap": False},
    {"workload": {**{k: v for k, v in BURSTY["workload"].items() if k != "arrivals"},
                  "initial_batch": 0, "closed_loop": {"concurrency": 6}}},
], ids=["sglang", "mixed", "normal_loop", "closed_loop"])
def test_every_executor_gives_the_engines_answer(variant):
    configs = [load_config(None, {**BURSTY, **variant, "seed": seed,
                                  "cpu.receive_us": RECEIVE}) for seed in range(2)]
    sz = resolve_sizes(configs[0])
    assert sz.received_us.any()
    one_shape = variant.get("scheduling", {}).get("rule") == "sglang_mixed"
    group = lockstep.realize_group(configs) if one_shape else [None, None]
    for cfg, summary in zip(configs, group):
        ref = reference(build_program(cfg))
        assert_same_run(*ref, fast.run_config(cfg, resolve_sizes(cfg)))
        want = simwar.simulate(cfg, engine="simpy").summary
        assert _same_summary(simwar.simulate(cfg, engine="fast").summary, want)
        if summary is not None:
            assert _same_summary(summary, want)



def test_a_host_at_another_speed_scales_it_with_the_loops_other_host_work():
    from simwar.fit.profiler import host_keys, scale_host

    cfg = {"cpu": {"ingest_us": 50.0, "receive_us": dict(RECEIVE)}}
    assert "cpu.receive_us" in host_keys(cfg)
    assert scale_host(cfg, 2.0)["cpu"] == {"ingest_us": 100.0, "receive_us": {
        "per_request": 60.0, "per_prompt_token": 0.5}}
    assert "cpu.receive_us" not in host_keys({"cpu": {"receive_us": {"per_request": 0.0}}})


def test_written_as_a_capture_the_receive_is_inside_recv_requests():
    from simwar.capture.synthetic import sglang_cpu_ranges

    wl = {**ONE["workload"], "arrivals": {"rate_per_s": 40}, "initial_batch": 2}
    run = simwar.simulate(None, {**ONE, "steps": 30, "workload": wl,
                                 "cpu.receive_us": RECEIVE}, engine="simpy")
    ingest = {round(b - a, 6) for name, a, b in sglang_cpu_ranges(run.trace)
              if name == "recv_requests"}
    # step 0 receives the two requests there at time 0 after its ingest (100 µs)
    assert round(100.0 + 2 * (30.0 + 0.25 * 1000), 6) in ingest
