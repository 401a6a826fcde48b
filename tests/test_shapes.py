"""Step shapes picked at run time (``scheduling.rule``): SGLang's default prefill steps of
their own (decodes pause; a long prompt carried over several steps), the bound on consecutive
prefill steps, vLLM's token budget, the mixed rules' decode steps when no prompt token waits,
and every executor's answer on them.

The SimPy engine is the reference: the fast executor (its realizing pass, its run of the
Program, its trace mode) gives its per-step table, summary, races and Trace bit for bit, with
overlap on and off, every barrier, bursts that give runs of prefill steps, and random mixes
(idle steps under every rule, prefill launches, read-done positions and the prefix term
included: tests/test_prefill_cost.py holds what each does to the Program).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fast import _same, assert_same_run, reference
from test_trace_stream import assert_same_trace

import simwar
from simwar.api import build_program, resolve_sizes, simulate_many, trace_windows
from simwar.builder.sizes import ArrivalProcess, draw_sizes
from simwar.cli.app import main
from simwar.config import ConfigError, load_config
from simwar.core.program import GraphLaunch, Launch, Marker, Synchronize
from simwar.executors import fast, lockstep
from simwar.executors.choice import EXECUTORS
from simwar.executors.fast import trace as T
from simwar.executors.fast.plan import Unsettled, plan_config, plan_program
from simwar.executors.lockstep import shapes as lockstep_shapes

#: one request at a time: a prompt of 1000 tokens prefilled 256 a step
ONE = {"steps": 40, "warmup_steps": 0, "algorithm": "none", "accept.tokens": 1.0,
       "workload": {"arrivals": {"rate_per_s": 1e-3}, "max_batch": 8, "initial_batch": 1,
                    "output_tokens": 10, "prompt_tokens": 1000},
       "prefill": {"chunk_tokens": 256, "forward_us": {"base": 100, "per_token": 2.0}},
       "scheduling": {"rule": "sglang"}}
#: bursts of long prompts: runs of prefill steps, prompts carried over several steps
BURSTY = {"steps": 120, "warmup_steps": 3, "algorithm": "none",
          "workload": {"arrivals": {"rate_per_s": 2500}, "max_batch": 16, "initial_batch": 4,
                       "output_tokens": {"dist": "uniform", "low": 1, "high": 30},
                       "prompt_tokens": {"dist": "uniform", "low": 50, "high": 2000},
                       "graph_buckets": [4, 8, 16]},
          "prefill": {"chunk_tokens": 512, "forward_us": {"base": 150, "per_token": 1.5},
                      "host_us": {"base": 40, "per_token": 0.1}},
          "scheduling": {"rule": "sglang"},
          "cpu.schedule_us": {"dist": "lognormal", "mean": 300, "std": 200},
          "costs.host_call_us": {"dist": "normal", "mean": 2, "std": 3},
          "phases": [{"name": "decode", "body_us": {"base": 900, "per_seq": 40,
                                                    "noise": {"dist": "normal", "mean": 0,
                                                              "std": 30}}}]}


def _sizes(overrides):
    return resolve_sizes(load_config(None, overrides))


def _shapes(sz) -> str:
    return "".join("dpmi"[c] for c in sz.shape.tolist())


def test_a_long_prompt_is_carried_over_prefill_steps_then_decodes():
    sz = _sizes(ONE)
    # 256 + 256 + 256 + 232 tokens in four prefill steps of their own, then ten decode steps
    # (step 13: the overlap loop's extra step; then the next request, waited for, prefills)
    assert _shapes(sz)[:16] == "pppp" + "d" * 10 + "pp"
    assert sz.prefill_tokens[:5].tolist() == [256, 256, 256, 232, 0]
    req = sz.requests
    assert req["first_step"][0] == 3 and req["finish_step"][0] == 12
    assert req["decode_steps"][0] == 9
    # no request decodes in a prefill step: its batch is empty
    assert sz.batch[:4].tolist() == [0] * 4 and sz.batch[4:14].tolist() == [1] * 10
    prog = build_program(load_config(None, ONE))
    fwd = [op for op in prog.ops if isinstance(op, (Launch, GraphLaunch))
           and op.stream == "forward" and op.step < 4]
    # a prefill step launches the prefill forward alone: no decode graph
    assert {op.kernel.label for op in fwd if isinstance(op, Launch)} == {"prefill.forward"}
    assert not [op for op in fwd if isinstance(op, GraphLaunch)]


def test_decodes_pause_while_a_later_prompt_is_prefilled():
    wl = {**ONE["workload"], "initial_batch": 2, "prompt_tokens": 600, "output_tokens": 6}
    sz = _sizes({**ONE, "workload": wl})
    # both prompts in the same chunks (FIFO): 256, 256, 256, 256, 176 tokens
    assert _shapes(sz)[:10] == "ppppp" + "ddddd"
    req = sz.requests
    assert req["first_step"].tolist()[:2] == [2, 4]
    # the first request's five other tokens wait for the prefill steps 3 and 4
    assert req["finish_step"].tolist()[:2] == [9, 9]
    assert req["decode_steps"].tolist()[:2] == [5, 5]


def test_at_most_max_consecutive_prefill_steps_while_requests_decode():
    sz = _sizes({**BURSTY, "steps": 300, "scheduling.max_consecutive_prefill": 2})
    req = sz.requests
    first, finish = req["first_step"], req["finish_step"]
    run = 0
    for k, shape in enumerate(_shapes(sz)):
        run = run + 1 if shape == "p" else 0
        # requests in step k's batch (the overlap loop learns of a finish a step late)
        decoding = np.sum((first >= 0) & (first < k) & ((finish == -1) | (k <= finish + 1)))
        assert run <= 2 or decoding == 0, k
    free = _sizes({**BURSTY, "steps": 300})
    assert max(len(r) for r in _shapes(free).split("d") if r) > 2


def test_vllm_budget_gives_the_decodes_their_tokens_first():
    base = {**BURSTY, "scheduling": {"rule": "vllm"}}
    sz = _sizes(base)
    # a step that prefills is mixed; one whose decodes took the whole budget, a decode step
    assert [c == "m" for c in _shapes(sz)] == (sz.prefill_tokens > 0).tolist()
    assert np.all(sz.prefill_tokens + sz.batch <= 512)
    assert np.any(sz.prefill_tokens + sz.batch == 512)
    # SGLang's mixed chunk takes the decodes' tokens out of the budget too (PrefillAdder's
    # mixed_with_decode_tokens): the same chunks
    mixed = _sizes({**base, "scheduling": {"rule": "sglang_mixed"}})
    assert np.array_equal(mixed.prefill_tokens, sz.prefill_tokens)


def test_the_default_rule_is_the_mixed_chunk_bit_for_bit():
    base = {k: v for k, v in BURSTY.items() if k != "scheduling"}
    a = simwar.simulate(None, base, engine="fast")
    b = simwar.simulate(None, {**base, "scheduling": {"rule": "sglang_mixed"}}, engine="fast")
    assert a.summary == b.summary and set(a.summary["shape_steps"]) <= {"decode", "mixed"}
    assert a.steps.equals(b.steps)


#: one request's prompt of 1000 tokens at a time under a mixed rule: four mixed steps, then
#: decode steps
MIXED_ONE = {**ONE, "scheduling": {"rule": "sglang_mixed"}, "prefill.launches": 3}


@pytest.mark.parametrize("rule", ["sglang_mixed", "vllm"])
@pytest.mark.parametrize("variant", [{}, {"policy.overlap": False},
                                     {"policy.barrier": "coarse", "policy.launch_ahead": 2}],
                         ids=str)
def test_a_mixed_rule_runs_a_decode_step_when_no_prompt_token_waits(rule, variant):
    """SGLang's --enable-mixed-chunk and vLLM run a plain decode step when no prompt token
    waits: no prefill launch, no host dispatch for an empty chunk; a step that prefills is
    mixed (the chunk, then the decode phases). Every executor gives the engine's answer."""
    cfg = load_config(None, {**MIXED_ONE, "scheduling.rule": rule, **variant})
    sz = resolve_sizes(cfg)
    assert cfg.shapes == ("decode", "mixed") and cfg.shapes_vary
    assert [c == "m" for c in _shapes(sz)] == (sz.prefill_tokens > 0).tolist()
    assert _shapes(sz)[:6] == "mmmmdd"
    program = build_program(cfg)
    prefill = {op.step for op in program.ops
               if isinstance(op, Launch) and op.kernel.phase == "prefill"}
    assert prefill == set(np.flatnonzero(sz.prefill_tokens).tolist())
    ref = reference(program)
    assert_same_run(*ref, fast.run_config(cfg, sz))
    assert_same_run(*ref, fast.run(program))
    fresh = draw_sizes(cfg)
    realized = fast.realize(cfg, fresh, ArrivalProcess(cfg, fresh))
    assert np.array_equal(fresh.shape, sz.shape)
    assert_same_run(*ref, realized)
    windows, _, _ = trace_windows(cfg, chunk=9)
    assert_same_trace(T.join(list(windows)), simwar.simulate(cfg, engine="simpy").trace)


@pytest.mark.parametrize("variant", [
    {}, {"policy.overlap": False}, {"scheduling.max_consecutive_prefill": 1},
    {"scheduling.overlap_consecutive_prefill": False},
    {"scheduling.overlap_consecutive_prefill": False, "policy.placement": "loop_top",
     "policy.barrier": "host_sync"},
    {"policy.barrier": "coarse"}, {"policy.barrier": "host_sync"}, {"policy.barrier": "none"},
    {"policy.placement": "loop_top"}, {"policy.launch_ahead": 2},
    {"policy.needs_cpu_seq_lens": True, "policy.plan_stream": True},
    {"prefill.graph": "piecewise", "algorithm": "dflash", "phases": []},
    {"prefill.graph": "full", "policy.needs_cpu_seq_lens": True},
    {"algorithm": "eagle", "phases": [], "accept.tokens": [1.0, 2.5, 3.0]},
    {"prefill.launches": 4, "prefill.read_ends": "in_replay", "policy.launch_ahead": 2},
    {"prefill.launches": 3, "prefill.read_ends": "unknown", "policy.barrier": "host_sync",
     "policy.placement": "loop_top"},
    {"prefill.launches": 3, "prefill.host_before_us": {"base": 60, "per_token": 0.2}},
    {"prefill.graph": "piecewise", "prefill.host_before_us": 80},
], ids=str)
def test_fast_equals_simpy_on_shape_mixes(variant):
    cfg = load_config(None, {**BURSTY, **variant})
    sz = resolve_sizes(cfg)
    assert set(_shapes(sz)) == {"p", "d"}  # both shapes, in runs
    program = build_program(cfg)
    ref = reference(program)
    assert_same_run(*ref, fast.run_config(cfg, sz))  # the Program's plan
    assert_same_run(*ref, fast.run(program))
    fresh = draw_sizes(cfg)
    realized = fast.realize(cfg, fresh, ArrivalProcess(cfg, fresh))  # its realizing pass
    assert np.array_equal(fresh.shape, sz.shape) and np.array_equal(fresh.batch, sz.batch)
    assert_same_run(*ref, realized)


def test_simulate_engines_agree_and_the_summary_has_the_shapes():
    cfg = load_config(None, BURSTY)
    a, b = simwar.simulate(cfg, engine="simpy"), simwar.simulate(cfg, engine="fast")
    assert (a.engine, b.engine) == ("simpy", "fast")
    assert a.summary == b.summary
    assert a.steps.equals(b.steps) and a.races.equals(b.races)
    s = a.summary
    assert set(s["shape_steps"]) == {"decode", "prefill"}
    assert sum(s["shape_steps"].values()) == pytest.approx(1.0)
    assert sum(s["shape_time"].values()) == pytest.approx(1.0)
    steps = a.steps[a.steps.step >= cfg.warmup_steps].dropna(subset=["step_us"])
    assert s["shape_steps"]["prefill"] == pytest.approx((steps["shape"] == "prefill").mean())
    share = steps.step_us[steps["shape"] == "prefill"].sum() / steps.step_us.sum()
    assert s["shape_time"]["prefill"] == pytest.approx(share)
    # the summary kept as the rows go (summary only): the same shares
    c = simwar.simulate(cfg, engine="fast", summary_only=True)
    assert c.summary["shape_steps"] == s["shape_steps"]
    assert c.summary["shape_time"] == pytest.approx(s["shape_time"])


def test_the_trace_mode_streams_the_engines_trace():
    cfg = load_config(None, {**BURSTY, "steps": 60})
    want = simwar.simulate(cfg, engine="simpy").trace
    sz = resolve_sizes(cfg)
    with pytest.raises(Unsettled, match="picks each step's shape"):
        plan_config(cfg, sz)
    plan = plan_program(build_program(cfg))
    for chunk, margin in ((7, 3), (10 ** 9, 0)):
        assert_same_trace(T.join(list(T.windows(plan, chunk=chunk, margin=margin))), want)
    windows, _, _ = trace_windows(cfg, chunk=11)  # the API's trace mode takes the same way
    assert_same_trace(T.join(list(windows)), want)


#: a DP-attention idle step (``scheduling.idle``): a drawn idle forward, eager or a graph
IDLE = {"forward_us": {"dist": "normal", "mean": 400, "std": 60}, "host_us": 25}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 50), rate=st.sampled_from([100, 300, 1500, 5000]),
       chunk=st.integers(1, 900), bound=st.sampled_from([None, 1, 3]),
       overlap=st.booleans(), barrier=st.sampled_from(["none", "coarse", "fine", "host_sync"]),
       graph=st.sampled_from(["eager", "piecewise"]), steps=st.integers(8, 60),
       prompts=st.sampled_from([40, {"dist": "uniform", "low": 1, "high": 1500}]),
       consecutive=st.booleans(), launches=st.sampled_from([1, 3]),
       shares=st.sampled_from([((), ()), ((1.0, 0.0, 5.0), ()), ((), (0.2, 3.0, 0.7)),
                               ((0.5, 2.0, 1.0), (4.0, 0.0, 1.0))]),
       ends=st.sampled_from(["post_replay", "in_replay", "pre_replay", "unknown"]),
       prefix=st.sampled_from([0.0, 0.002]), before=st.sampled_from([0, 70]),
       idle=st.sampled_from([None, "eager", "full"]),
       rule=st.sampled_from(["sglang", "sglang", "sglang_mixed", "vllm"]))
def test_fast_equals_simpy_on_random_shape_mixes(seed, rate, chunk, bound, overlap, barrier,
                                                 graph, steps, prompts, consecutive, launches,
                                                 shares, ends, prefix, before, idle, rule):
    """Random mixes of every shape (prefill, decode, mixed, idle) and every prefill form
    (launches, equal or weighted shares, where its read-done is recorded, a prefix-attention
    term, host work before its first launch)."""
    eager = graph == "eager" or launches > 1
    wl = {**BURSTY["workload"], "arrivals": {"rate_per_s": rate}, "initial_batch": seed % 5,
          "prompt_tokens": prompts}
    pf = {**BURSTY["prefill"], "chunk_tokens": chunk, "graph": "eager" if eager else graph,
          "launches": launches, "read_ends": ends if launches > 1 or ends != "in_replay"
          else "post_replay",
          "forward_us": {**BURSTY["prefill"]["forward_us"], "per_token_prefix": prefix},
          "host_before_us": {"base": before, "per_token": before / 1000}}
    if launches == 3:
        pf.update(host_shares=list(shares[0]), device_shares=list(shares[1]))
    sch = {"rule": rule}
    if rule == "sglang":
        sch.update(max_consecutive_prefill=bound,
                   overlap_consecutive_prefill=consecutive or not overlap)
    if idle is not None:
        sch["idle"] = {**IDLE, "graph": idle}
    over = {**BURSTY, "seed": seed, "steps": steps, "warmup_steps": 1, "workload": wl,
            "prefill": pf, "scheduling": sch, "policy.overlap": overlap,
            "policy.barrier": barrier}
    cfg = load_config(None, over)
    program = build_program(cfg)
    ref = reference(program)
    assert_same_run(*ref, fast.run_config(cfg, resolve_sizes(cfg)))
    a = simwar.simulate(cfg, engine="fast").summary  # its realizing pass's run
    b = simwar.simulate(cfg, engine="simpy").summary
    assert list(a) == list(b) and all(_same(a[k], b[k]) for k in a)


def test_host_before_comes_before_the_prefills_first_launch():
    """``prefill.host_before_us``: host work of each step that prefills, before any launch of
    the prefill (none of its kernels overlaps it); 0 builds the Program of a config without
    the key, op for op."""
    from simwar.core.program import CpuWork

    def ops(over):
        return build_program(load_config(None, {**ONE, **over})).ops

    plain = ops({})
    assert ops({"prefill.host_before_us": 0}) == plain
    got = ops({"prefill.host_before_us": {"base": 50, "per_token": 0.25}, "prefill.launches": 3})
    steps = {op.step for op in got if isinstance(op, CpuWork) and op.label == "prefill.prepare"}
    tokens = _sizes(ONE).prefill_tokens
    assert steps == {op.step for op in plain if isinstance(op, Launch)
                     and op.kernel.label == "prefill.forward"}
    for k in steps:
        mine = [op for op in got if getattr(op, "step", None) == k]
        labels = [getattr(op, "label", "") for op in mine]
        first = next(i for i, op in enumerate(mine) if isinstance(op, Launch)
                     and op.kernel.label == "prefill.forward")
        assert labels.index("prefill.prepare") < first
        prep = next(op for op in mine if getattr(op, "label", "") == "prefill.prepare")
        assert prep.duration_us == pytest.approx(50 + 0.25 * tokens[k])  # at its chunk
    # the same host work before the launches, not between them: the prefill's kernels run
    # back to back, no longer paced by its launches
    spread = simwar.simulate(None, {**ONE, "prefill.launches": 4,
                                    "prefill.host_us": {"base": 2000}})
    before = simwar.simulate(None, {**ONE, "prefill.launches": 4,
                                    "prefill.host_before_us": {"base": 2000}})
    assert before.summary["fwd_us_mean"] < spread.summary["fwd_us_mean"]


def test_two_prefill_steps_in_a_row_without_overlap_between_them():
    """SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP: the previous prefill step's result is
    processed before the next prefill step is launched (after it, otherwise)."""
    def order(overrides):
        cfg = load_config(None, {**ONE, **overrides})
        out = {}
        for op in build_program(cfg).ops:
            if isinstance(op, Synchronize) and op.site == "result_copy":
                out.setdefault(op.step, []).append("sync")
            elif isinstance(op, Marker) and op.name == "run_batch":
                out.setdefault(op.step, []).append("run_batch")
        return out
    on = order({})
    off = order({"scheduling.overlap_consecutive_prefill": False})
    # steps 0-3 are prefill steps: iterations 1-3 follow a prefill step
    for k in (1, 2, 3):
        assert on[k] == ["run_batch", "sync"] and off[k] == ["sync", "run_batch"]
    assert on[4] == off[4] == ["run_batch", "sync"]  # a decode step after a prefill step
    a = simwar.simulate(None, {**ONE, "scheduling.overlap_consecutive_prefill": False})
    b = simwar.simulate(None, ONE)
    # step 2's result is processed sooner (before step 3's launch); step 3's prefill, later
    assert a.columns["result_done_us"][2] < b.columns["result_done_us"][2]
    assert a.columns["fwd_end_us"][3] > b.columns["fwd_end_us"][3]


def test_lockstep_runs_shape_picking_runs_together_each_its_own():
    """Runs that pick their step shapes as they go advance in lockstep: at each step each
    run's shape comes from its own queue and each shape's block runs over the runs that
    picked it. Every run's table, summary and races are its own run's, bit for bit."""
    wl = {**BURSTY["workload"], "arrivals": {"rate_per_s": 300}}
    cfgs = [load_config(None, {**BURSTY, "steps": 70, **v}) for v in (
        {}, {"seed": 2, "workload": wl}, {"seed": 3, "prefill.chunk_tokens": 100},
        {"cpu.schedule_us": 50}, {"policy.barrier": "none"}, {"policy.overlap": False},
        {"seed": 5, "scheduling.max_consecutive_prefill": 1},
        # the mixed rules' runs pick theirs too (decode steps when no prompt token waits)
        {"seed": 6, "workload": wl, "scheduling": {"rule": "sglang_mixed"}},
        {"seed": 7, "workload": wl, "scheduling": {"rule": "vllm"}, "policy.overlap": False},
        {"seed": 8, "prefill.host_before_us": {"base": 90, "per_token": 0.1}})]
    # simulate_many runs arrivals alone, shapes picked or not (their batches follow their times)
    assert EXECUTORS["lockstep"].refusal(cfgs[0]) == \
        "workload arrivals: each run's batches depend on its own simulated times"
    runs = lockstep_shapes.realize_shape_runs(cfgs)
    codes = [resolve_sizes(c).shape for c in cfgs]
    assert len({c.tobytes() for c in codes}) >= 4  # runs of their own shapes, grouped apart
    for cfg, run in zip(cfgs, runs):
        assert_same_run(*reference(build_program(cfg)), run)
    alone = simulate_many(cfgs[:2])  # a sweep's runs: one by one, the same summaries
    for cfg, summary, lone in zip(cfgs, lockstep.realize_group(cfgs),
                                  alone + [None] * (len(cfgs) - 2)):
        want = simwar.simulate(cfg, engine="fast").summary
        assert list(summary) == list(want) and all(_same(summary[k], want[k]) for k in want)
        assert lone is None or all(_same(lone[k], want[k]) for k in want)
    with pytest.raises(lockstep.NotLockstep, match="different lengths or launch-ahead"):
        lockstep.realize_group([cfgs[0], load_config(None, {**BURSTY, "steps": 71})])
    # requests without prompts under a mixed rule: one shape, not picked
    plain = {**{k: v for k, v in BURSTY.items() if k not in ("prefill", "scheduling")},
             "steps": 70, "workload": {k: v for k, v in BURSTY["workload"].items()
                                       if k != "prompt_tokens"}}
    with pytest.raises(lockstep.NotLockstep, match="different structures"):
        lockstep.realize_group([cfgs[0], load_config(None, plain)])


_run = st.fixed_dictionaries({
    "seed": st.integers(0, 30), "rate": st.sampled_from([300, 1500, 5000]),
    "chunk": st.integers(1, 900), "bound": st.sampled_from([None, 1, 3]),
    "overlap": st.booleans(), "barrier": st.sampled_from(["none", "coarse", "fine", "host_sync"]),
    "schedule": st.sampled_from([50, 300])})


@settings(max_examples=15, deadline=None)
@given(runs=st.lists(_run, min_size=2, max_size=4), steps=st.integers(8, 40),
       graph=st.sampled_from(["eager", "piecewise"]), ahead=st.sampled_from([1, 2]))
def test_lockstep_equals_simpy_on_random_shape_mixes(runs, steps, graph, ahead):
    cfgs = []
    for r in runs:
        wl = {**BURSTY["workload"], "arrivals": {"rate_per_s": r["rate"]},
              "initial_batch": r["seed"] % 5}
        cfgs.append(load_config(None, {
            **BURSTY, "seed": r["seed"], "steps": steps, "warmup_steps": 1, "workload": wl,
            "prefill": {**BURSTY["prefill"], "chunk_tokens": r["chunk"], "graph": graph},
            "scheduling": {"rule": "sglang", "max_consecutive_prefill": r["bound"]},
            "policy.overlap": r["overlap"] or ahead > 1, "policy.barrier": r["barrier"],
            "policy.launch_ahead": ahead, "cpu.schedule_us": r["schedule"]}))
    for cfg, run in zip(cfgs, lockstep_shapes.realize_shape_runs(cfgs)):
        assert_same_run(*reference(build_program(cfg)), run)


def test_tensor_parallel_ranks_never_run_picked_shapes():
    """A prefill step needs requests with prompts, and requests that arrive are refused with
    ``parallel.tp > 1`` (one rank would realize every rank's batches): the ranks' executors
    (SimPy's and the fast one's) never meet a shape-picking run; the refusal is one line,
    which says why for a config that picks its shapes (batch sizes cannot say them)."""
    with pytest.raises(ConfigError, match=r"arrivals: tensor-parallel runs \(parallel.tp 2\) "
                                          r"take batch sizes, not arriving requests, so "
                                          r"iteration shapes picked from a queue \(decode, "
                                          r"prefill\) need parallel.tp 1$"):
        load_config(None, {**BURSTY, "parallel.tp": 2})
    with pytest.raises(ConfigError, match=r"iteration shapes picked from a queue \(decode, "
                                          r"mixed\) need parallel.tp 1$"):
        load_config(None, {**BURSTY, "parallel.tp": 2, "scheduling.rule": "sglang_mixed"})
    wl = {k: v for k, v in BURSTY["workload"].items() if k != "prompt_tokens"}
    with pytest.raises(ConfigError, match=r"arrivals: requests that arrive \(arrivals, "
                                          r"closed_loop\) are not modelled with parallel.tp > 1 "
                                          r".*give batch sizes instead"):
        load_config(None, {**{k: v for k, v in BURSTY.items() if k not in ("prefill",
                                                                          "scheduling")},
                           "workload": wl, "parallel.tp": 2})


def test_bad_scheduling_keys_are_one_line_each():
    with pytest.raises(ConfigError, match=r"scheduling.rule: sglang runs decode and prefill "
                                          r"steps; a prefill step needs requests with prompts"):
        load_config(None, {"scheduling.rule": "sglang"})
    with pytest.raises(ConfigError, match=r"scheduling.max_consecutive_prefill: a positive "
                                          r"number of steps, got 0"):
        load_config(None, {**ONE, "scheduling.max_consecutive_prefill": 0})
    with pytest.raises(ConfigError, match=r"scheduling: max_consecutive_prefill bounds the "
                                          r"prefill steps of the sglang rule; rule vllm"):
        load_config(None, {**ONE, "scheduling": {"rule": "vllm",
                                                 "max_consecutive_prefill": 2}})
    with pytest.raises(ConfigError, match=r"prefill.graph: full is a graph of the prefill step "
                                          r"alone, which cannot run mixed into a decode step "
                                          r"\(scheduling.rule vllm\)"):
        load_config(None, {**ONE, "prefill.graph": "full", "scheduling.rule": "vllm"})
    with pytest.raises(ConfigError, match=r"scheduling.overlap_consecutive_prefill: false takes "
                                          r"a prefill step out of the overlap loop"):
        load_config(None, {**ONE, "scheduling.overlap_consecutive_prefill": False,
                           "policy.overlap": False})


def test_run_prints_the_shapes_line(capsys):
    assert main(["run", "configs/sglang_default_prefill.yaml", "--set", "steps=120",
                 "--set", "warmup_steps=5"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if "step shapes" in x)
    assert "decode" in line and "prefill" in line and "% of time" in line


def test_dotted_overrides_leave_the_callers_mapping_as_it_was():
    over = {**BURSTY, "scheduling.max_consecutive_prefill": 2}
    load_config(None, over)
    assert BURSTY["scheduling"] == {"rule": "sglang"}
