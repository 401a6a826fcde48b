"""Tensor-parallel ranks: the coupling rules, the results, and per-rank captures.

The model (docs/design.md, "Tensor-parallel ranks"): each rank's loop is the single-rank
loop, coupled by host collectives (every rank leaves at the last arrival plus the cost, plus
the wake-up of a blocking wait) and device collectives (each rank's kernel completes at the
last rank's begin plus its own duration). Captures written from simulated ranks are read
back with the simulator as the truth.
"""

from __future__ import annotations

import numpy as np
import pytest

from simwar.analysis.ranks import Collectives, late_arrivals, skew_report
from simwar.api import build_rank_programs, resolve_engine, resolve_sizes, simulate, simulate_many
from simwar.capture.rank_files import write_rank_captures
from simwar.capture.to_trace import import_kineto
from simwar.cli.app import main
from simwar.config import ConfigError, load_config
from simwar.core.program import (
    Collective,
    CpuWork,
    GraphLaunch,
    HostCollective,
    Kernel,
    Program,
    StepMarker,
)
from simwar.executors import fast
from simwar.executors.ranks import Deadlock, run_ranks

SHIPPED = "configs/tp2_slow_rank.yaml"
SHORT = {"steps": 80, "warmup_steps": 10}


def _rank(host_us: float, body_us: float, wake_us: float = 0.0, collective: bool = True):
    nodes = (Kernel("body", body_us, phase="p"),) + (
        (Collective("allreduce", 20.0, "p"),) if collective else ())
    return Program(ops=[StepMarker(0), CpuWork("work", host_us, 0),
                        HostCollective("broadcast", 0, 10.0, wake_us),
                        GraphLaunch("forward", "g", nodes, 0, "p", 5.0), StepMarker(1)])


def _op(trace, label: str):
    i = [k for k, x in enumerate(trace.ops.decoded("label").tolist()) if x == label]
    return float(trace.ops.start_us[i[0]]), float(trace.ops.end_us[i[0]])


@pytest.mark.parametrize("wake", [0.0, 7.0])
def test_host_and_device_collectives_follow_the_rules(wake):
    (t0, t1), _ = run_ranks([_rank(100.0, 50.0, wake), _rank(300.0, 80.0, wake)])
    # the host collective: both arrive (100, 300), leave at the last arrival + its cost; the
    # rank that waited also wakes up when it blocks
    assert _op(t0, "broadcast") == (100.0, 310.0 + wake)
    assert _op(t1, "broadcast") == (300.0, 310.0)
    # the device collective: begins after each rank's own body, completes at the last begin
    # + its duration on both
    launch0, launch1 = 310.0 + wake + 5.0, 315.0
    s0, e0 = _op(t0, "allreduce")
    s1, e1 = _op(t1, "allreduce")
    assert s0 == launch0 + 50.0 and s1 == launch1 + 80.0
    assert e0 == e1 == max(s0, s1) + 20.0
    assert t0.meta["collectives"]["device"] == [0, 1]


def test_a_collective_one_rank_never_reaches_is_a_deadlock():
    with pytest.raises(Deadlock, match="device collective 0: rank.s. 1 never reached it"):
        run_ranks([_rank(100.0, 50.0), _rank(100.0, 50.0, collective=False)])


def test_rank_0_without_coupling_is_the_single_rank_loop():
    base = load_config("configs/dspark_fine.yaml", SHORT)
    lone = simulate(base, engine="simpy")
    tp = simulate(base, {"parallel": {"tp": 2, "broadcast": False}})
    assert tp.ranks[0].summary == lone.summary
    for k, v in lone.columns.items():
        np.testing.assert_array_equal(tp.ranks[0].columns[k], v)
    # rank 1 draws its own durations
    assert tp.ranks[1].trace.meta["rank_seed"] != base.seed


def _jittery(wait: str = "spin") -> dict:
    return {**SHORT, "parallel": {"tp": 3, "broadcast_us": {"dist": "uniform", "low": 50,
                                                           "high": 200},
                                  "allgather": True, "wait": wait},
            "ranks": {"jitter_us": {"dist": "lognormal", "mean": 200, "std": 300},
                      "at": "launch", "slow_rank": 2, "slow_us": 400},
            "phases": [{"name": "verify", "body_us": 2000,
                        "collectives": [{"name": "allreduce", "us": {"dist": "normal",
                                                                     "mean": 15, "std": 5},
                                         "count": 8}]},
                       {"name": "draft", "collectives": [{"name": "allgather", "us": 9}]}]}


@pytest.mark.parametrize("wait", ["spin", "block"])
def test_every_collective_instance_obeys_the_rules_under_random_jitter(wait):
    r = simulate(SHIPPED, _jittery(wait))
    traces = [x.trace for x in r.ranks]
    col = Collectives.of_traces(traces)
    assert col.unmatched == 0 and col.ranks == 3
    per_step = 8 + 1 + 2  # all-reduces, the draft's all-gather, broadcast and all-gather
    assert len(col) == per_step * r.config.steps
    last = col.arrive.max(axis=1, keepdims=True)
    dev, host = col.device, ~col.device
    # device: each rank's kernel ends at the last begin + its own drawn duration
    drawn = [[n.duration_us for op in p.ops if type(op) is GraphLaunch for n in op.nodes
              if type(n) is Collective] for p in build_rank_programs(r.config)]
    assert np.array_equal(col.leave[dev], last[dev] + np.array(drawn).T)
    # host: the last arrival + the rank's own cost; a blocking rank that waited wakes later
    progs = build_rank_programs(r.config)
    cost = np.array([[op.cost_us for op in p.ops if type(op) is HostCollective] for p in progs]).T
    wake = np.array([[op.wake_us for op in p.ops if type(op) is HostCollective] for p in progs]).T
    waited = col.arrive[host] < last[host]
    expect = last[host] + cost + (wake * waited if wait == "block" else 0.0)
    assert np.array_equal(col.leave[host], expect)
    assert (wait == "block") == bool(np.any(wake > 0))
    # the waits the summary reports are these, per measured step
    s = r.summary
    assert s["tp"] == 3 and s["straggler_rank"] == 2
    w = col.waits()
    assert np.all(w >= 0) and np.all(w.min(axis=1) == 0)
    keep = (col.step >= 10) & (col.step < r.config.steps - 1)
    steps = r.summary["steps_measured"]
    for k in range(3):
        assert s[f"rank{k}_collective_wait_us_mean"] == pytest.approx(
            w[keep, k].sum() / steps, rel=1e-9)


def test_the_shipped_config_finds_its_slow_rank_and_its_what_ifs_move_the_step():
    base = simulate(SHIPPED, SHORT).summary
    assert base["straggler_rank"] == 1 and base["straggler_share"] > 0.9
    assert base["rank0_host_wait_us_mean"] > 10 * base["rank1_host_wait_us_mean"]
    even = simulate(SHIPPED, {**SHORT, "ranks.slow_us": 0}).summary
    assert even["tp_step_us_mean"] < base["tp_step_us_mean"]
    for key, value in (("parallel.broadcast_us", 20), ("parallel.allgather", False)):
        faster = simulate(SHIPPED, {**SHORT, key: value}).summary
        assert faster["tp_step_us_mean"] < base["tp_step_us_mean"], key
    block = simulate(SHIPPED, {**SHORT, "parallel.wait": "block"}).summary
    assert block["tp_step_us_mean"] > base["tp_step_us_mean"]
    late = simulate(SHIPPED, {**SHORT, "ranks.at": "launch"}).summary
    assert late["rank0_device_wait_us_mean"] > 0 == base["rank0_device_wait_us_mean"]
    ahead = simulate(SHIPPED, {**SHORT, "policy.launch_ahead": 2}).summary
    assert ahead["launch_ahead_mean"] > 1.5 > base["launch_ahead_mean"]
    assert ahead["tp_step_us_mean"] < base["tp_step_us_mean"]


def test_ranks_run_in_one_pass_a_trace_wanted_or_not():
    cfg = load_config(SHIPPED, SHORT)
    assert resolve_engine(None, cfg) == resolve_engine("auto", cfg) == "fast"
    # one pass per rank keeps every rank's Trace (the reference's, column for column)
    assert resolve_engine("auto", cfg, want_trace=True) == "fast"
    # the fast executor's plans and trace mode still run one rank
    with pytest.raises(ConfigError, match="the one-pass plans and trace mode run one rank"):
        fast.run_config(cfg, resolve_sizes(cfg))
    # a sweep runs it alone, as simulate does (tests/test_ranks_fast.py: equal to the engine)
    assert simulate_many([cfg]) == [simulate(cfg).summary]


def test_rank_programs_round_trip_as_json():
    programs = build_rank_programs(load_config(SHIPPED, {**SHORT, "steps": 30}))
    assert len(programs) == 2
    for p in programs:
        assert Program.from_json(p.to_json()).ops == p.ops
        assert any(type(op) is HostCollective for op in p.ops)


def test_per_rank_captures_import_aligned_with_the_simulators_skew(tmp_path):
    r = simulate(SHIPPED, {**_jittery(), "steps": 40})
    traces = [x.trace for x in r.ranks]
    errors = [0.0, 250.0, -40.0]
    paths = write_rank_captures(traces, tmp_path, "run", errors)
    assert [p.name for p in paths] == [f"run-TP-{k}.trace.json.gz" for k in range(3)]
    imp = import_kineto(paths)
    assert imp.collective_shift_us == pytest.approx([-e for e in errors], abs=1e-6)
    sim, got = Collectives.of_traces(traces), imp.collectives
    assert len(got) == len(sim) and got.unmatched == 0
    nccl = {"allreduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
            "allgather": "ncclDevKernel_AllGather_RING_LL"}
    for device in (False, True):
        for name in ("broadcast", "allgather") if not device else nccl:
            a = [i for i in range(len(sim)) if sim.device[i] == device and sim.name[i] == name]
            cap = nccl[name] if device else name
            b = [i for i in range(len(got)) if got.device[i] == device and got.name[i] == cap]
            assert len(a) == len(b) > 0
            # the same instances, the same skew (the files' ts are in ns), the same late rank
            assert np.allclose(got.skew()[b], sim.skew()[a], atol=2e-3)
            clear = sim.skew()[a] > 0.01
            np.testing.assert_array_equal(got.late_rank()[b][clear], sim.late_rank()[a][clear])
    host = [w for w in late_arrivals(sim, 0) if not w["device"]]
    assert host and [w["words"] for w in late_arrivals(got, 0) if not w["device"]] == \
        [w["words"] for w in host]
    report = {c["collective"]: c for c in skew_report(got)}
    assert report["broadcast"]["instances"] == 40
    assert report["ncclDevKernel_AllReduce_Sum_bf16_RING_LL"]["instances"] == 8 * 40


def test_explain_names_the_late_rank_for_a_config_and_its_captures(tmp_path, capsys):
    assert main(["explain", SHIPPED, "--set", "steps=60"]) == 0
    out = capsys.readouterr().out
    assert "rank 1's host work arrived late at the broadcast" in out  # in the cause tables
    line = next(x for x in out.splitlines() if "arrived" in x and "µs late" in x)
    assert line.strip().startswith("rank 1's host work arrived ")
    r = simulate(SHIPPED, {"steps": 60})
    paths = write_rank_captures([x.trace for x in r.ranks], tmp_path, "run", [0.0, 90.0])
    assert main(["explain", *map(str, paths)]) == 0
    out = capsys.readouterr().out
    assert "rank 0 waited at the collectives" in out
    assert "rank 1's host work arrived " in out and "late at the broadcast" in out


def test_the_perfetto_export_of_a_tp_run_holds_every_rank(tmp_path, capsys):
    out = tmp_path / "tp.json"
    assert main(["run", SHIPPED, "--set", "steps=40", "--trace", str(out), "-q"]) == 0
    text = out.read_text()
    assert all(f'"r{k}.forward"' in text for k in (0, 1))
