"""The prefill's costs and forms, and the idle shape: an eager prefill's launches (the GPU
runs its first kernels while the host still launches), where a prefill step records its
read-done (``prefill.read_ends``), the prefix-attention term of a later chunk
(``forward_us.per_token_prefix``), and a DP-attention idle step in place of the wait for a
request (``scheduling.idle``). Every executor's answer on them: tests/test_shapes.py's random
mixes; here, what each one does to the Program and the run.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_fast import _same, assert_same_run, reference
from test_shapes import BURSTY, ONE
from test_trace_stream import assert_same_trace

import simwar
from simwar.api import build_program, resolve_sizes, simulate_many, trace_windows
from simwar.config import ConfigError, load_config
from simwar.core.program import CpuWork, GraphLaunch, Launch, Record, StepMarker, WaitEvent
from simwar.executors import fast, lockstep
from simwar.executors.choice import EXECUTORS
from simwar.executors.fast import trace as T

#: a prefill whose host work is as long as its kernel: what its launches overlap
HOSTLY = {**ONE, "prefill": {**ONE["prefill"], "host_us": {"base": 600}}}


def _same_summary(a: dict, b: dict) -> bool:
    return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)


def _step_ops(cfg, k: int) -> list:
    out, step = [], -1
    for op in build_program(cfg).ops:
        if isinstance(op, StepMarker):
            step = op.step
        elif step == k:
            out.append(op)
    return out


def test_launches_split_the_prefill_and_its_gpu_work_starts_as_launched():
    one = load_config(None, HOSTLY)
    four = load_config(None, {**HOSTLY, "prefill.launches": 4})
    ops = _step_ops(four, 0)
    kernels = [op.kernel for op in ops if isinstance(op, Launch)
               and op.kernel.label == "prefill.forward"]
    dispatch = [op.duration_us for op in ops if isinstance(op, CpuWork)
                and op.label == "prefill.dispatch"]
    # 256 tokens: 100 + 2 * 256 = 612 µs of kernel, 600 µs of host work, each in four
    assert [k.duration_us for k in kernels] == [153.0] * 4
    assert dispatch == [150.0] * 4
    # launches 1 is one dispatch and one kernel, as before the key
    assert sum(isinstance(op, Launch) and op.kernel.label == "prefill.forward"
               for op in _step_ops(one, 0)) == 1
    a = simwar.simulate(one, engine="simpy")
    b = simwar.simulate(four, engine="simpy")
    # the first kernel runs while the host dispatches the other three: the prefill forward
    # ends sooner though the host does three more launches
    spans = [s for s in b.trace.spans if s.step == 0]
    first = min(s.start_us for s in spans if s.label == "prefill.forward")
    host = max(s.end_us for s in spans if s.label == "prefill.dispatch")
    assert first < host
    assert b.columns["fwd_end_us"][0] < a.columns["fwd_end_us"][0]
    assert_same_run(*reference(build_program(four)), fast.run_config(four, resolve_sizes(four)))


def test_launches_one_keeps_the_program_bit_for_bit():
    a = simwar.simulate(None, BURSTY, engine="fast")
    b = simwar.simulate(None, {**BURSTY, "prefill.launches": 1,
                               "prefill.read_ends": "post_replay",
                               "prefill.forward_us.per_token_prefix": 0}, engine="fast")
    assert a.summary == b.summary and a.steps.equals(b.steps)


@pytest.mark.parametrize("rule", ["sglang_mixed", "vllm"])
@pytest.mark.parametrize("weighted", [False, True])
def test_one_shape_runs_take_launches_and_the_prefix_term_in_every_executor(rule, weighted):
    """A one-shape run (the chunk mixed into every step) is planned from iteration templates
    and its series read per use (launches > 1: several uses per iteration; weighted: each
    launch its own share), and a group of such runs realizes its arrivals in lockstep: each
    gives the SimPy engine's answer."""
    pf = {**BURSTY["prefill"], "launches": 5, "read_ends": "in_replay",
          "forward_us": {"base": 150, "per_token": 1.5, "per_token_prefix": 0.002}}
    if weighted:
        pf.update(host_shares=[3, 1, 0, 1, 1], device_shares=[0.1, 2.5, 0.4, 0, 7])
    configs = [load_config(None, {**BURSTY, "seed": seed, "prefill": pf,
                                  "scheduling": {"rule": rule}}) for seed in range(2)]
    for cfg, summary in zip(configs, lockstep.realize_group(configs)):
        ref = reference(build_program(cfg))
        assert_same_run(*ref, fast.run_config(cfg, resolve_sizes(cfg)))
        assert _same_summary(summary, simwar.simulate(cfg, engine="simpy").summary)
    sz = resolve_sizes(configs[0])
    assert sz.prefill_prefix.any()  # prompts longer than the chunk: later chunks pay more
    if not weighted:
        np.testing.assert_array_equal(sz.prefill_launch_us, sz.prefill_us / 5)
    else:  # the whole scaled per launch, no array of equal shares
        assert sz.prefill_launch_us is None and sz.prefill_launch_host_us is None


def test_weighted_launches_take_their_shares_of_the_prefill():
    """``prefill.host_shares`` and ``device_shares``: each launch's host dispatch and kernel
    take weight / sum of the step's prefill host and device time (the same total as equal
    shares), in launch order; a long kernel behind a short first one lets the host launch
    the rest under it."""
    def launches(over):
        cfg = load_config(None, {**ONE, "prefill.launches": 3, "prefill.host_us": 300, **over})
        sz = resolve_sizes(cfg)
        ops = build_program(cfg).ops
        k = int(np.flatnonzero(sz.prefill_tokens)[0])
        dev = [op.kernel.duration_us for op in ops if isinstance(op, Launch)
               and op.kernel.label == "prefill.forward" and op.step == k]
        host = [op.duration_us for op in ops if getattr(op, "label", "") == "prefill.dispatch"
                and op.step == k]
        return sz.prefill_us[k], sz.prefill_host_us[k], dev, host
    us, host_us, dev, host = launches({"prefill.device_shares": [1, 0, 3],
                                       "prefill.host_shares": [2, 2, 4]})
    assert dev == pytest.approx([us / 4, 0.0, us * 3 / 4]) and sum(dev) == pytest.approx(us)
    assert host == pytest.approx([host_us / 4, host_us / 4, host_us / 2])
    _, _, dev_eq, host_eq = launches({})
    assert dev_eq == pytest.approx([us / 3] * 3) and host_eq == pytest.approx([host_us / 3] * 3)
    # the long kernel first runs under the host's other launches; last, after all of them
    # (equal weights written out are equal shares)
    def run(shares):
        over = {**BURSTY, "prefill.launches": 3, "prefill.host_us": 3000,
                "policy.overlap": False}  # (with overlap the host hides the difference)
        if shares:
            over["prefill.device_shares"] = shares
        return simwar.simulate(None, over).summary
    a, b, c, d = run([8, 1, 1]), run([1, 1, 8]), run([1, 1, 1]), run(None)
    assert a["step_us_mean"] < b["step_us_mean"]
    assert c["step_us_mean"] == pytest.approx(d["step_us_mean"], rel=1e-12)


@pytest.mark.parametrize("ends", ["post_replay", "in_replay", "pre_replay", "unknown"])
def test_a_prefill_step_records_its_read_done_where_the_config_says(ends):
    cfg = load_config(None, {**ONE, "prefill.launches": 3, "prefill.read_ends": ends,
                             "phases": [{"name": "decode", "reads": ["req_to_token"],
                                         "read_ends": "post_replay"}]})
    ops = _step_ops(cfg, 1)  # a prefill step (step 0 has no fence before it)
    order = [("launch", bool(op.kernel.reads)) if isinstance(op, Launch)
             and op.kernel.label == "prefill.forward" else "read_done"
             if isinstance(op, Record) and op.event.startswith("read_done") else None
             for op in ops]
    order = [x for x in order if x is not None]
    want = {"post_replay": [("launch", True)] * 3 + ["read_done"],
            "in_replay": [("launch", True), "read_done", ("launch", False), ("launch", False)],
            "pre_replay": ["read_done"] + [("launch", True)] * 3,
            "unknown": [("launch", True)] * 3}[ends]
    assert order == want
    fenced = [op for op in ops if isinstance(op, WaitEvent) and op.stream == "schedule"]
    assert bool(fenced) == (ends != "unknown")  # unknown: that step's fence is coarse
    run = simwar.simulate(cfg, engine="simpy")
    # recording it before the reads is a what-if: the next step's writes then race them
    assert (len(run.races) > 0) == (ends == "pre_replay")
    assert_same_run(*reference(build_program(cfg)), fast.run_config(cfg, resolve_sizes(cfg)))


def test_a_later_chunk_pays_for_the_prefix_in_the_cache():
    pf = {"base": 100, "per_token": 2.0, "per_token_prefix": 0.001}
    sz = resolve_sizes(load_config(None, {**ONE, "prefill.forward_us": pf}))
    # 1000 tokens in chunks of 256: each chunk attends over the chunks before it
    assert sz.prefill_prefix[:5].tolist() == [0, 256 * 256, 256 * 512, 232 * 768, 0]
    want = [100 + 2.0 * t + 0.001 * p for t, p in zip([256, 256, 256, 232], [0, 65536,
                                                                               131072, 178176])]
    assert sz.prefill_us[:4].tolist() == want
    # two requests in one chunk: each one's tokens times its own prefix, summed
    wl = {**ONE["workload"], "initial_batch": 2, "prompt_tokens": 300}
    two = resolve_sizes(load_config(None, {**ONE, "workload": wl, "prefill.forward_us": pf}))
    # chunk 1: the first request's last 44 tokens over its 256, then the second's first 212
    assert two.prefill_tokens[:3].tolist() == [256, 256, 88]
    assert two.prefill_prefix[:3].tolist() == [0, 44 * 256, 88 * 212]


def test_an_idle_step_runs_in_place_of_the_wait_for_a_request():
    wl = {**ONE["workload"], "arrivals": {"rate_per_s": 50}, "initial_batch": 0,
          "prompt_tokens": 100}
    base = {**ONE, "steps": 60, "workload": wl}
    idle = {**base, "scheduling.idle": {"forward_us": 300, "host_us": 20, "graph": "full"}}
    waits = resolve_sizes(load_config(None, base))
    sz = resolve_sizes(load_config(None, idle))
    shapes = sz.shape.tolist()
    assert shapes[0] == 3 and 0 in shapes and 1 in shapes  # idle, decode, prefill steps
    assert waits.idle[0] > 0 and not sz.idle.any()  # the host no longer waits: it runs idle
    assert np.all(sz.batch[sz.shape == 3] == 0)
    cfg = load_config(None, idle)
    graphs = [op for op in _step_ops(cfg, 0) if isinstance(op, GraphLaunch)]
    assert [g.graph for g in graphs] == ["idle.graph"]
    assert graphs[0].nodes[0].duration_us == 300.0 and not graphs[0].nodes[0].reads
    run = simwar.simulate(cfg, engine="fast")
    assert set(run.summary["shape_steps"]) == {"idle", "prefill", "decode"}
    assert _same_summary(run.summary, simwar.simulate(cfg, engine="simpy").summary)
    # the mixed rule with idle steps: mixed, decode (no prompt token waits) and idle
    mixed = load_config(None, {**idle, "scheduling.rule": "sglang_mixed"})
    assert mixed.shapes == ("decode", "mixed", "idle") and mixed.shapes_vary
    assert set(simwar.simulate(mixed).summary["shape_steps"]) == {"idle", "mixed", "decode"}


@pytest.mark.parametrize("variant", [
    {"policy.launch_ahead": 2}, {"policy.overlap": False}, {"policy.barrier": "host_sync"},
    {"policy.placement": "loop_top", "policy.barrier": "coarse"},
    {"policy.needs_cpu_seq_lens": True, "policy.plan_stream": True},
], ids=str)
def test_idle_steps_in_every_loop_give_the_engines_answer(variant):
    wl = {**BURSTY["workload"], "arrivals": {"rate_per_s": 150}, "initial_batch": 0}
    cfg = load_config(None, {**BURSTY, "steps": 80, "workload": wl, **variant,
                             "scheduling.idle": {"forward_us": 250, "host_us": 15}})
    sz = resolve_sizes(cfg)
    assert {0, 1, 3} <= set(sz.shape.tolist())  # decode, prefill and idle steps
    ref = reference(build_program(cfg))
    assert_same_run(*ref, fast.run_config(cfg, sz))
    assert _same_summary(simwar.simulate(cfg, engine="fast").summary,
                         simwar.simulate(cfg, engine="simpy").summary)


def test_the_trace_mode_streams_the_engines_trace_with_idle_steps_and_launches():
    wl = {**BURSTY["workload"], "arrivals": {"rate_per_s": 200}, "initial_batch": 0}
    cfg = load_config(None, {**BURSTY, "steps": 50, "workload": wl, "prefill.launches": 3,
                             "prefill.read_ends": "in_replay",
                             "scheduling.idle": {"forward_us": 200, "graph": "eager"}})
    want = simwar.simulate(cfg, engine="simpy").trace
    assert 3 in resolve_sizes(cfg).shape.tolist()
    windows, _, _ = trace_windows(cfg, chunk=9)
    assert_same_trace(T.join(list(windows)), want)


def test_lockstep_refuses_runs_with_idle_steps_and_the_batch_falls_back():
    # requests without prompts: the mixed rule's one shape, a decode step, and idle steps
    wl = {k: v for k, v in ONE["workload"].items() if k != "prompt_tokens"}
    wl.update(arrivals={"rate_per_s": 50}, initial_batch=0)
    plain = {k: v for k, v in ONE.items() if k not in ("prefill", "scheduling")}
    cfg = load_config(None, {**plain, "workload": wl, "scheduling.rule": "sglang_mixed",
                             "scheduling.idle": {"forward_us": 300}})
    assert EXECUTORS["lockstep"].refusal(cfg).endswith(
        "step shapes are picked as it runs: idle steps (scheduling.idle: no request runs or "
        "waits) among its decode steps")
    out = simulate_many([cfg, cfg])
    ref = simwar.simulate(cfg, engine="simpy").summary
    assert _same_summary(out[0], ref) and _same_summary(out[1], ref)


@pytest.mark.parametrize("over, line", [
    ({"prefill.launches": 0}, r"prefill.launches: a number of kernel launches from 1 to 32, "
                              r"got 0"),
    ({"prefill.launches": 33}, r"prefill.launches: .* got 33"),
    ({"prefill.launches": 4, "prefill.graph": "piecewise"},
     r"prefill.launches: 4 launches are an eager prefill's kernels; graph piecewise is one "
     r"graph launch"),
    ({"prefill.read_ends": "in_replay"}, r"prefill.read_ends: in_replay ends the reads after "
                                         r"the first of several kernels"),
    ({"prefill.forward_us.per_token_prefix": -1}, r"prefill.forward_us.per_token_prefix: "),
    ({"scheduling.idle": {"forward_us": 100},
      "workload": {"closed_loop": {"concurrency": 4}, "max_batch": 8, "output_tokens": 10,
                   "prompt_tokens": 1000}},
     r"scheduling.idle: an idle step runs when no request runs or waits; it needs requests "
     r"that arrive"),
])
def test_bad_prefill_and_idle_keys_are_one_line_each(over, line):
    with pytest.raises(ConfigError, match=line):
        load_config(None, {**ONE, **over})
