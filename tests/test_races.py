"""Race detection on the overlap loop: the SGLang situations the reference describes."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import simwar

SHORT = {"steps": 60, "warmup_steps": 5}


def run(**overrides):
    return simwar.simulate(None, {**SHORT, **overrides}).summary


def test_loop_top_barrier_races_with_result_processing_writes():
    # SGLang #31687: at the loop top, the radix-insert/free writes of iteration k are not
    # ordered behind forward k's reads; right after the launch they are.
    assert run(**{"policy.placement": "loop_top"})["races"] > 0
    assert run(**{"policy.placement": "after_launch"})["races"] == 0
    # and it is the result writes that race
    r = simwar.simulate(None, {**SHORT, "policy.placement": "loop_top"})
    assert {x.second_label for x in r.hazards.latent} == {"result_writes"}


def test_no_barrier_is_a_latent_race_even_when_timing_avoids_it():
    s = run(**{"policy.barrier": "none"})
    assert s["races"] > 0 and s["overlaps"] == 0


def test_pre_replay_publish_before_in_graph_reads_is_a_latent_race():
    s = run(**{"phases.verify.read_ends": "pre_replay"})
    assert s["races"] > 0 and s["overlaps"] == 0
    # without in-graph reads a pre-replay record is sound
    assert run(**{"phases.verify.read_ends": "pre_replay", "phases.verify.prep_us": 0})[
        "races"] == 0


def test_in_replay_without_external_events_falls_back_soundly_or_not():
    post = run(**{"policy.external_events": False})
    pre = run(**{"policy.external_events": False, "policy.in_replay_fallback": "pre_replay"})
    assert post["races"] == 0 and post["publish_position"] == "post_replay"
    assert pre["races"] > 0 and pre["publish_position"] == "pre_replay"


def test_eagle_publishing_at_verify_while_draft_extend_reads_is_flagged():
    s = run(algorithm="eagle", **{"policy.publish_phase": "verify"})
    assert s["races"] > 0
    r = simwar.simulate(None, {**SHORT, "algorithm": "eagle", "policy.publish_phase": "verify"})
    assert "draft_extend" in {x.first_phase for x in r.hazards.latent}
    # the 0.5.23 default: draft_extend declares unknown, so EAGLE falls back to coarse, safely
    d = run(algorithm="eagle")
    assert d["barrier_effective"] == "coarse" and d["races"] == 0


def test_racing_write_is_observed_when_reads_are_long():
    # a read phase long enough that the next schedule's writes land inside it
    s = run(**{"policy.barrier": "none", "phases.verify.prep_us": 5000,
               "phases.verify.body_us": 100})
    assert s["overlaps"] > 0


@pytest.mark.parametrize("algorithm", ["none", "eagle", "dflash", "dspark"])
@pytest.mark.parametrize("barrier", ["fine", "coarse"])
@pytest.mark.parametrize("plan_stream", [False, True])
def test_sound_barriers_never_race(algorithm, barrier, plan_stream):
    s = run(algorithm=algorithm, **{"policy.barrier": barrier, "policy.plan_stream": plan_stream})
    assert s["races"] == 0 and s["overlaps"] == 0


durations = st.floats(0, 3000)


@settings(max_examples=25, deadline=None)
@given(algorithm=st.sampled_from(["none", "eagle", "dflash", "dspark"]),
       barrier=st.sampled_from(["fine", "coarse"]),
       placement=st.just("after_launch"),
       schedule=durations, process=durations, writes=st.floats(0, 500),
       result_writes=st.floats(0, 500), seq_lens=st.booleans())
def test_fine_and_coarse_are_race_free_for_any_durations(algorithm, barrier, placement, schedule,
                                                         process, writes, result_writes,
                                                         seq_lens):
    s = simwar.simulate(None, {
        "steps": 12, "warmup_steps": 0, "algorithm": algorithm, "policy.barrier": barrier,
        "policy.placement": placement, "policy.needs_cpu_seq_lens": seq_lens,
        "cpu.schedule_us": schedule, "cpu.process_result_us": process,
        "gpu.schedule_writes_us": writes, "gpu.result_writes_us": result_writes}).summary
    assert s["races"] == 0


def _pairs_by_definition(lane, kind, bound, acc_op, acc_buf, acc_mode, acc_step, window):
    """``candidate_pairs`` spelled out, for accesses whose steps never decrease: every earlier
    access on the buffer within ``window`` steps, nearest first, not both reads, on another
    lane; latent when no happens-before path (full vector clocks, kept for every op)."""
    from simwar.core.trace import Mode, OpKind

    lanes = sorted(set(lane), key=str)
    n = len(lanes)
    host, clocks, at_op = [0] * n, {x: [0] * n for x in lanes}, []
    for op in range(len(lane)):
        if kind[op] == OpKind.SYNC:
            if bound[op] >= 0:
                host = [max(a, b) for a, b in zip(host, at_op[bound[op]])]
            at_op.append(list(host))
            continue
        v = [max(a, b) for a, b in zip(clocks[lane[op]], host)]
        if kind[op] == OpKind.WAIT and bound[op] >= 0:
            v = [max(a, b) for a, b in zip(v, at_op[bound[op]])]
        v[lanes.index(lane[op])] += 1
        clocks[lane[op]] = v
        at_op.append(list(v))
    out = []
    for j in range(len(acc_op)):
        for i in range(j - 1, -1, -1):
            if acc_buf[i] != acc_buf[j] or acc_step[j] - acc_step[i] > window:
                continue
            if acc_mode[i] == Mode.READ and acc_mode[j] == Mode.READ:
                continue
            a, b = acc_op[i], acc_op[j]
            if lane[a] == lane[b] or a == b:
                continue
            la = lanes.index(lane[a])
            out.append((i, j, at_op[a][la] > at_op[b][la]))
    return out


def _accesses_of(trace):
    import numpy as np

    acc = trace.accesses
    order = np.argsort(acc.op, kind="stable")
    ops = trace.ops
    return (ops.lane.tolist(), ops.kind.tolist(), ops.bound.tolist(), acc.op[order].tolist(),
            acc.buffer[order].tolist(), acc.mode[order].tolist(), acc.step[order].tolist())


@settings(max_examples=60, deadline=None)
@given(phases=st.integers(1, 12), steps=st.integers(3, 6),
       barrier=st.sampled_from(["none", "fine", "coarse", "host_sync"]),
       placement=st.sampled_from(["after_launch", "loop_top"]), window=st.integers(0, 3),
       graph=st.sampled_from(["full", "eager", "breakable"]))
def test_candidate_pairs_are_the_definition_for_many_reading_phases(phases, steps, barrier,
                                                                    placement, window, graph):
    from simwar.analysis.hazards import candidate_pairs

    table = [{"name": f"p{i}", "graph": graph, "load_batch_us": 2, "prep_us": 3,
              "body_us": 10, "reads": ["req_to_token"] + (["swa"] if i % 2 else []),
              "read_ends": "post_replay" if i == phases - 1 else "unknown"}
             for i in range(phases)]
    trace = simwar.simulate({"algorithm": "custom", "phases": table, "steps": steps,
                             "warmup_steps": 0,
                             # a buffer written must be read: swa only when a phase reads it
                             "gpu": {"writes": ["req_to_token"] + (["swa"] if phases > 1 else [])},
                             "policy": {"barrier": barrier, "placement": placement}},
                            engine="simpy").trace
    cols = _accesses_of(trace)
    assert list(candidate_pairs(*cols, window)) == _pairs_by_definition(*cols, window)


@pytest.mark.parametrize("config", ["configs/dspark_fine.yaml", "configs/eagle_fine.yaml",
                                    "configs/dflash_legacy_host_sync.yaml"])
def test_race_windows_of_one_pass_are_each_windows_own(config):
    # the fast executor finds the latent pairs of every window of a run in one pass over its
    # segments: for every program of the advise space (barriers, placements, publish points)
    # each window's pairs are those of the window analysed alone
    from simwar.builder.sizes import draw_sizes
    from simwar.config import load_config
    from simwar.executors.fast import races
    from simwar.executors.fast.plan import plan_config
    from simwar.study.advise import candidate_config, space

    cfg = load_config(config)
    base = load_config(cfg, {"steps": 40, "warmup_steps": 5})
    checked = 0
    for cand in space(cfg):
        c = candidate_config(base, cand.overrides)
        races._WINDOWS.clear()
        plan = races.RacePlan(plan_config(c, draw_sizes(c)), 2)
        assert plan.windowed
        for (key, w), tpls in races._WINDOWS.items():
            alone = [r for r, _, _ in races._pairs(list(key), list(range(w + 1)), w, True)]
            assert tpls == alone, cand.description
            checked += bool(alone)
    assert checked > 0
