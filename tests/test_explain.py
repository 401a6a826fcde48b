"""The critical path and ``simwar explain``: hand-built timelines with known chains, the sum
rule on every shipped config, the command line, and the H200 captures (marked ``capture``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from simwar.analysis.critical_path import (
    KINDS,
    ChainKind,
    NoForward,
    SegmentKind,
    critical_path,
    sentence,
)
from simwar.api import simulate
from simwar.cli.app import main
from simwar.core.program import (
    CpuWork,
    GraphLaunch,
    GraphRecord,
    Kernel,
    Launch,
    Program,
    Record,
    StepMarker,
    Synchronize,
    WaitEvent,
    WaitStream,
)
from simwar.core.recorder import Recorder
from simwar.core.trace import Call, OpKind, Trace
from simwar.executors.engine import run

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
REAL = ROOT / "tests" / "data" / "kineto"


def F(label, us, phase="p"):
    """A forward kernel (a phased kernel on the forward stream)."""
    return Kernel(label, us, phase=phase)


def program(ops, barrier="coarse", warmup=0):
    return Program(ops, meta={"forward_stream": "forward", "barrier_effective": barrier,
                              "warmup_steps": warmup, "name": "hand-built"})


def causes(chain):
    return [(s.kind, s.cause, s.start_us, s.end_us) for s in chain.segments]


# --------------------------------------------------------------------------- hand-built chains
def coarse_loop(latency=5.0):
    """Three forwards; between them the coarse barrier, the next writes, the forward's wait.

    forward F0 [0, 1000]; schedule.wait_stream(forward) releases at 1000 + 5; writes W1
    [1005, 1205]; forward.wait_stream(schedule) releases at 1205 + 7; F1 starts at 1212.
    """
    ops = []
    for k in range(3):
        ops += [StepMarker(k), Launch("forward", F(f"F{k}", 1000), k)]
        ops += [WaitStream("schedule", "forward", k, latency_us=latency),
                Launch("schedule", Kernel(f"W{k + 1}", 200), k),
                WaitStream("forward", "schedule", k, latency_us=7.0)]
    return run(program(ops))


def test_the_kinds_read_and_write_as_the_words_explain_printed():
    # `simwar explain` prints a kind padded in a column and writes it in its JSON: a member
    # must format and serialise as its value, as the plain strings it replaced did
    words = ("device", "cross_stream", "host", "host_api", "wake_up", "launch_latency", "rank",
             "unexplained")
    assert KINDS == tuple(SegmentKind) == words
    assert [f"{k:<14}" for k in SegmentKind] == [f"{w:<14}" for w in words]
    assert json.dumps({"kind": SegmentKind.WAKE_UP, "what": ChainKind.GAP}) == \
        '{"kind": "wake_up", "what": "gap"}'


def test_coarse_barrier_chain_exact():
    cp = critical_path(coarse_loop(), (1, 1))
    (gap,), (step,) = cp.gaps, cp.periods
    assert (gap.start_us, gap.end_us) == (1000.0, 1212.0)
    assert causes(gap) == [
        ("cross_stream", "cross-stream latency: schedule.wait_stream(forward) = the coarse "
                         "barrier", 1000.0, 1005.0),
        ("device", "schedule stream: W1", 1005.0, 1205.0),
        ("cross_stream", "cross-stream latency: forward.wait_stream(schedule)", 1205.0, 1212.0),
    ]
    # the writes came through the coarse barrier; the sentence says so
    assert gap.segments[1].after == "schedule.wait_stream(forward) = the coarse barrier"
    assert sentence(cp).startswith(
        "forward k waited 212 µs: 200 µs W1 on the schedule stream, which could not start "
        "until forward k-1 ended because of the coarse barrier (schedule.wait_stream(forward))")
    # step 1: forward 1 (1000 µs) and the gap before forward 2, back to back
    assert (step.start_us, step.end_us) == (1212.0, 2424.0)
    assert [(s.kind, s.cause, s.us) for s in step.segments] == [
        ("device", "forward stream: F1", 1000.0),
        ("cross_stream", "cross-stream latency: schedule.wait_stream(forward) = the coarse "
                         "barrier", 5.0),
        ("device", "schedule stream: W2", 200.0),
        ("cross_stream", "cross-stream latency: forward.wait_stream(schedule)", 7.0)]
    assert cp.to_dict()["gap_causes"][0] == {
        "cause": "schedule stream: W1", "kind": "device", "us": 200.0, "share": 200 / 212,
        "after": "schedule.wait_stream(forward) = the coarse barrier",
        "words": "W1 on the schedule stream"}


def test_host_bound_chain_through_a_blocking_sync():
    """The CPU blocks on forward k's end, processes, then launches forward k+1 late.

    F0 launched [0, 10], runs [10, 110]; its record issued [10, 13] fires at 110; the sync
    called at 13 blocks until 110 and wakes at 126; cpu work [126, 176]; F1 launched
    [176, 186], starts at 186: the gap [110, 186] is wake-up 16 + cpu 50 + launch 10.
    """
    ops = []
    for k in range(3):
        ops += [StepMarker(k), Launch("forward", F(f"F{k}", 100), k, host_us=10),
                Record(f"done[{k}]", "forward", k, host_us=3),
                Synchronize(f"done[{k}]", k, "result_copy", host_us=1, wake_us=16),
                CpuWork("process_result", 50, k)]
    cp = critical_path(run(program(ops, barrier="")), (1, 1))
    (gap,) = cp.gaps
    assert causes(gap) == [
        ("wake_up", "synchronize(result_copy): wake-up", 110.0, 126.0),
        ("host", "cpu: process_result", 126.0, 176.0),
        ("host_api", "host API: launch", 176.0, 186.0)]
    assert [s.after for s in gap.segments] == ["synchronize(result_copy)"] * 3
    assert sentence(cp) == (
        "forward k waited 76 µs: 50 µs cpu: process_result, after the CPU blocked in "
        "synchronize(result_copy), + 16 µs synchronize(result_copy): wake-up, + 10 µs host "
        "API: launch")
    # the step: forward 1 back to its start, through the sync and the host
    (step,) = cp.periods
    assert step.us == 176.0 and [s.kind for s in step.segments] == [
        "device", "wake_up", "host", "host_api"]


def test_host_call_binds_on_a_tie_only_if_later():
    # F1's launch returns at 10 + 5 = 15 exactly when F0 ends: the stream predecessor binds
    ops = [StepMarker(0), Launch("forward", F("F0", 5), 0, host_us=10),
           StepMarker(1), Launch("forward", F("F1", 5), 1, host_us=5),
           StepMarker(2), CpuWork("slow", 100, 2), Launch("forward", F("F2", 5), 2, host_us=1)]
    cp = critical_path(run(program(ops, barrier="")), (0, 2))
    assert causes(cp.periods[0]) == [("device", "forward stream: F0", 10.0, 15.0)]
    # F2's launch returns at 116, after 100 µs of cpu from 15: F1 ends at 20, so the gap
    # [20, 116] is host work (clipped at 20) and the launch
    assert causes(cp.gaps[1]) == [("host", "cpu: slow", 20.0, 115.0),
                                  ("host_api", "host API: launch", 115.0, 116.0)]


def test_fine_barrier_names_the_in_graph_read_done():
    ops = []
    for k in range(3):
        ops += [StepMarker(k),
                GraphLaunch("forward", "verify.graph",
                            (F("verify.prep", 20, "verify"), GraphRecord("verify.read_done"),
                             F("verify.body", 1000, "verify")), k, "verify"),
                WaitEvent("schedule", "verify.read_done", k, latency_us=3.0),
                Launch("schedule", Kernel("writes", 1500), k),
                WaitStream("forward", "schedule", k, latency_us=3.0)]
    cp = critical_path(run(program(ops, barrier="fine")), (1, 1))
    (gap,) = cp.gaps
    # read-done fires at forward k's in-graph node (20 µs in), the 1500 µs writes outlast the
    # 1000 µs body by 483 µs (+3 latency each side)
    assert [(s.kind, s.cause) for s in gap.segments] == [
        ("device", "schedule stream: writes"),
        ("cross_stream", "cross-stream latency: forward.wait_stream(schedule)")]
    assert gap.segments[0].after == \
        "schedule.wait_event(read_done@verify) = the fine barrier"
    assert gap.us == pytest.approx(1500 + 3 + 3 + 20 - 1020)


def measured_trace() -> Trace:
    """A measured-like trace: launch latency, untraced host time, a wait with no record.

    host: launch A [0, 5]; (untraced 5..20); launch B [20, 22]; forward: A [8, 50] (launch
    latency 3); a wait on forward held [50, 60] with no record; B [61, 90] (1 µs slack
    after the wait); step 1: launch C [100, 101], C [101, 120].
    """
    rec = Recorder()
    for step, (t0, t1, kernel, ks, ke) in enumerate([(0, 5, "A", 8, 50), (20, 22, "B", 61, 90),
                                                     (100, 101, "C", 101, 120)]):
        rec.marker("step", step, t0)
        if kernel == "B":
            call = rec.host(Call.WAIT_EVENT, 0, 18, 19, "wait", op=rec.next_op)
            rec.op(OpKind.WAIT, "forward", 0, "wait", issue=19, start=50, end=60, call=call)
        call = rec.host(Call.LAUNCH, step, t0, t1, kernel, op=rec.next_op)
        rec.op(OpKind.KERNEL, "forward", step, kernel, issue=t1, start=ks, end=ke, phase="p",
               call=call)
    return rec.finish({"forward_stream": "forward", "warmup_steps": 0})


def test_measured_slack_is_attributed_and_the_sum_holds():
    cp = critical_path(measured_trace(), (0, 2))
    assert [(s.kind, s.cause, s.start_us, s.end_us) for s in cp.periods[0].segments] == [
        ("device", "forward stream: A", 8.0, 50.0),
        ("unexplained", "forward held by a wait on an unknown record", 50.0, 60.0),
        ("unexplained", "forward stream idle after its predecessor", 60.0, 61.0)]
    assert causes(cp.gaps[0]) == [
        ("unexplained", "forward held by a wait on an unknown record", 50.0, 60.0),
        ("unexplained", "forward stream idle after its predecessor", 60.0, 61.0)]
    # C waits on nothing but its launch, called 10 µs after B ended (untraced host time)
    assert causes(cp.gaps[1]) == [("unexplained", "host: untraced time", 90.0, 100.0),
                                  ("host_api", "host API: launch", 100.0, 101.0)]
    step0 = critical_path(measured_trace(), (0, 0)).periods[0]
    assert step0.total_us() == step0.us == 53.0
    # the chain from B back past the trace's start: launch latency, then nothing before
    first = critical_path(measured_trace(), (0, 0))
    assert {s.kind for c in first.gaps + first.periods for s in c.segments} <= set(KINDS)


# --------------------------------------------------------------------------- shipped configs
@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_sum_rule_on_every_shipped_config(path):
    # 300 steps (warm-up 20) of each config: the chains of every measured step add up to the
    # step's forward gap and step time, as the metrics compute them, within 1 µs
    result = simulate(path, {"steps": 300})
    cp = critical_path(result.trace)
    frame = result.steps.set_index("step")
    assert len(cp.periods) == result.summary["steps_measured"]
    for chain in cp.gaps:
        assert abs(chain.total_us() - chain.us) <= 1.0
        assert abs(chain.us - frame.fwd_gap_us[chain.step]) <= 1e-6
    for chain in cp.periods:
        assert abs(chain.total_us() - chain.us) <= 1.0
        assert abs(chain.us - frame.step_us[chain.step]) <= 1e-6
        segs = chain.segments
        assert all(a.end_us == b.start_us for a, b in zip(segs, segs[1:]))  # contiguous
        assert all(s.kind in KINDS and s.us > 0 for s in segs)
    assert cp.fwd_gap_us == pytest.approx(result.summary["fwd_gap_us_mean"], abs=1e-6)
    assert cp.step_us == pytest.approx(result.summary["step_us_mean"], abs=1e-6)
    # nothing on a simulated trace is unexplained
    assert not {s.kind for c in cp.periods for s in c.segments} & {"unexplained",
                                                                    "launch_latency"}


def test_stochastic_and_cpu_bound_runs_keep_the_sum():
    result = simulate(ROOT / "configs" / "dflash_coarse.yaml", {
        "steps": 200, "cpu.schedule_us": {"dist": "lognormal", "mean": 3500, "std": 1500},
        "gpu.schedule_writes_us": {"dist": "normal", "mean": 300, "std": 100},
        "policy.plan_stream": True, "policy.needs_cpu_seq_lens": True})
    cp = critical_path(result.trace)
    for chain in cp.gaps + cp.periods:
        assert abs(chain.total_us() - chain.us) <= 1e-6
    kinds = {c["kind"] for c in cp.gap_causes()}
    assert {"host", "device", "cross_stream"} <= kinds


def test_dspark_coarse_top_cause_is_the_writes_behind_the_coarse_barrier():
    cp = critical_path(simulate(ROOT / "configs" / "dspark_coarse.yaml", {"steps": 100}).trace)
    top = cp.gap_causes()[0]
    assert (top["cause"], top["us"], top["after"]) == (
        "schedule stream: schedule_writes", 300.0,
        "schedule.wait_stream(forward) = the coarse barrier")
    assert cp.fwd_gap_us == 356.0
    assert sum(c["us"] for c in cp.gap_causes()) == pytest.approx(356.0)


def test_legacy_dflash_gap_comes_after_the_host_sync():
    cp = critical_path(simulate(ROOT / "configs" / "dflash_legacy_host_sync.yaml",
                                {"steps": 100}).trace)
    gate = "synchronize(verify_done) = the host_sync barrier"
    assert cp.gap_causes()[0]["after"] == gate
    assert any(c["kind"] == "wake_up" and c["after"] == gate for c in cp.step_causes())


def test_no_forward_and_out_of_range_steps():
    with pytest.raises(NoForward, match="no forward work"):
        critical_path(Trace.empty())
    trace = coarse_loop()
    with pytest.raises(ValueError, match="outside the run"):
        critical_path(trace, (0, 5))
    # a trace of one step is explained alone: its chain runs from its start to its forward's
    # end, and there is no gap (it needs a second forward)
    one = critical_path(run(program([StepMarker(0), Launch("forward", F("F0", 5), 0)])), (0, 0))
    assert one.one_step and one.n_steps == 1 and one.n_gaps == 0
    chain = one.periods[0]
    assert chain.total_us() == pytest.approx(chain.us) and chain.us >= 5
    assert one.step_causes()[0]["cause"] == "forward stream: F0"
    assert "forward gap" in one.to_dict()["needs_more_steps"][0]


# --------------------------------------------------------------------------- command line
def test_cli_explain_text_json_and_saved_trace(capsys, tmp_path):
    cfg = ROOT / "configs" / "dspark_coarse.yaml"
    assert main(["explain", str(cfg), "--set", "steps=120", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["steps"] == [20, 118] and d["step_us"] == 6196.0 and d["fwd_gap_us"] == 356.0
    assert {"cause", "kind", "us", "share"} <= set(d["gap_causes"][0])
    assert d["gap_causes"][0]["cause"] == "schedule stream: schedule_writes"
    assert sum(c["share"] for c in d["step_causes"]) == pytest.approx(1.0)
    # the same run saved as a trace gives the same answer
    saved = tmp_path / "t.json.gz"
    simulate(cfg, {"steps": 120}).trace.save(saved)
    assert main(["explain", str(saved), "--json"]) == 0
    d2 = json.loads(capsys.readouterr().out)
    assert d2["gap_causes"] == d["gap_causes"] and d2["step_causes"] == d["step_causes"]
    png = tmp_path / "chain.png"
    assert main(["explain", str(saved), "--steps", "30:32", "--timeline", str(png)]) == 0
    out = capsys.readouterr().out
    assert "forward k waited 356 µs: 300 µs schedule_writes on the schedule stream" in out
    assert "steps               30..32 (3 explained" in out
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("argv, fragment", [
    (["explain", "nope.yaml"], "nope.yaml: file not found"),
    (["explain", "{cfg}", "--set", "steps=60", "--steps", "50:70"], "outside the run"),
    (["explain", "{cfg}", "--set", "steps=60", "--steps", "7"], "expected A:B"),
    (["explain", "{empty}"], "no forward work"),
    (["explain", "{empty}", "--set", "steps=3"], "--set: only for a config"),
    (["explain", "{cfg}", "--timeline", "/no/such/dir/x.png"], "does not exist"),
])
def test_cli_explain_errors_are_one_line(capsys, tmp_path, argv, fragment):
    empty = tmp_path / "empty.json"
    Trace.empty({"name": "empty"}).save(empty)
    cfg = str(ROOT / "configs" / "dspark_fine.yaml")
    argv = [a.format(cfg=cfg, empty=empty) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1, err


# --------------------------------------------------------------------------- H200 captures
def _capture_trace(case: str) -> Trace:
    """Import an H200 capture with its step ranges and warm-up."""
    from simwar.capture.to_trace import import_kineto

    config = yaml.safe_load((REAL / f"{case}.config.yaml").read_text())
    imp = import_kineto(REAL / f"{case}.kineto.json.gz",
                        {"steps": r"^step#\d+$", "warmup_steps": config["warmup_steps"]})
    return imp.trace


@pytest.mark.capture
@pytest.mark.parametrize("case", ["dspark-fine-gpu", "dspark-none-gpu"])
def test_capture_gpu_bound_agrees_with_the_simulation(case):
    measured = critical_path(_capture_trace(case))
    sim = critical_path(simulate(REAL / f"{case}.config.yaml").trace)
    for chain in measured.gaps + measured.periods:
        assert abs(chain.total_us() - chain.us) <= 1.0
    # the same top cause: device work on the forward stream (the capture's kernels are
    # spin kernels without phase names, so causes are compared by kind and stream role)
    for cp in (measured, sim):
        fwd = cp.trace.meta["forward_stream"]
        top = cp.step_causes()[0]
        assert top["kind"] == "device" and top["cause"].startswith(f"{fwd} stream: ")

    def forward_device_us(cp):
        fwd = cp.trace.meta["forward_stream"]
        return sum(c["us"] for c in cp.step_causes()
                   if c["kind"] == "device" and c["cause"].startswith(f"{fwd} stream: "))

    # within the calibration's error on device-paced cases (4 % step time, max(25 µs, 10 %)
    # on the forward gap)
    assert forward_device_us(measured) == pytest.approx(forward_device_us(sim), rel=0.04)
    assert measured.step_us == pytest.approx(sim.step_us, rel=0.04)
    assert abs(measured.fwd_gap_us - sim.fwd_gap_us) <= 25.0


@pytest.mark.capture
def test_capture_cpu_bound_gap_is_host_time_as_simulated():
    measured = critical_path(_capture_trace("eagle-coarse-cpu"))
    sim = critical_path(simulate(REAL / "eagle-coarse-cpu.config.yaml").trace)
    for chain in measured.gaps + measured.periods:
        assert abs(chain.total_us() - chain.us) <= 1.0
    # the top cause of the gap is the CPU thread in both: simulated cpu work, and in the
    # capture the host time the profiler does not trace (the replay's CPU work is a plain
    # Python wait). The µs differ: the profiler slows the host loop (tests/data/kineto).
    by_lane = {}
    for cp in (measured, sim):
        top = cp.gap_causes()[0]
        seg = next(s for c in cp.gaps for s in c.segments if s.cause == top["cause"])
        by_lane[cp is sim] = seg.lane
    assert by_lane == {True: "cpu", False: "cpu"}


# --------------------------------------------------------------------------- HTA
# tests/data/hta/reference.json: HTA 0.5.0's critical_path_analysis on Kineto captures of three
# simulated runs (made by tests/data/hta/make_reference.py, in a pandas<3 environment). HTA's
# nodes carry no simwar ids, so its path's last node is found here by event name and time.
HTA = json.loads((ROOT / "tests" / "data" / "hta" / "reference.json").read_text())


def _hta_node_op(trace: Trace, node: dict) -> int:
    ops = trace.ops
    times = ops.start_us if node["is_start"] else ops.end_us
    found = [o for o in range(len(ops)) if trace.text(ops.label[o]) == node["name"]
             and abs(times[o] - node["ts"]) < 0.5]
    assert len(found) == 1, node
    return found[0]


def _hta_by_name(edges: dict, edge_type: str) -> dict:
    out: dict = {}
    for key, us in edges.items():
        name, kind, _ = key.split("|")
        if kind == edge_type and us > 0:
            out[name] = out.get(name, 0.0) + us
    return out


@pytest.mark.parametrize("case", sorted(HTA["cases"]))
def test_critical_path_agrees_with_hta(case):
    from simwar.analysis.critical_path import Walker

    ref = HTA["cases"][case]
    trace = simulate(None, ref["overrides"]).trace
    walker = Walker(trace)
    for step in ref["steps"].values():
        assert step["ok"]  # HTA succeeded on every step asked (its captures have sync events)
        chain = walker.chain(_hta_node_op(trace, step["last"]), step["first"]["ts"],
                             from_end=not step["last"]["is_start"])
        # the same length, except that HTA weighs its sync edges 0: our cross-stream latency
        latency = sum(s.us for s in chain.segments if s.kind == "cross_stream")
        assert chain.us == pytest.approx(step["length"] + latency, abs=1.0)
        mine: dict = {}
        for s in chain.segments:
            if s.kind == "device":
                mine[s.what] = mine.get(s.what, 0.0) + s.us
        theirs = _hta_by_name(step["edges"], "critical_path_operator")
        overhead = _hta_by_name(step["edges"], "critical_path_kernel_kernel_delay")
        if case.startswith("eager"):  # no CUDA graphs: the same kernels, the same µs
            assert theirs == pytest.approx(mine) and not overhead
        else:
            # with graphs HTA counts the in-graph prep kernels as kernel-kernel overhead of
            # the kernel before them; the critical path names them as device work
            graph_kernels = {k: v for k, v in mine.items() if k not in theirs}
            assert graph_kernels == {"draft.prep": 20.0, "verify.prep": 60.0}
            assert sum(overhead.values()) == pytest.approx(sum(graph_kernels.values()))


def test_hta_path_of_a_cpu_bound_step_misses_the_host():
    # HTA's path per ProfilerStep is GPU-bound on the CPU-bound case: a capture has no event
    # for the scheduler's python work, so HTA's graph has no node for the time the forward
    # stream waits on the host; the critical path of the step names it
    ref = HTA["cases"]["eager-fine-cpu"]
    for step in ref["steps"].values():
        assert _hta_by_name(step["edges"], "critical_path_operator").keys() >= {"verify.body"}
        assert not any("cpu_bound" in key for key in step["edges"])
    cp = critical_path(simulate(None, ref["overrides"]).trace, (4, 8))
    host = sum(c["us"] for c in cp.gap_causes() if c["kind"] == "host")
    assert host > 1000 and cp.gap_causes()[0]["cause"] == "cpu: schedule"


# --------------------------------------------------------------------------- streamed
def _streamed(cfg, steps=None, chunk=7, margin=4):
    from simwar.analysis.critical_stream import critical_path_stream
    from simwar.api import trace_windows

    parts, _, _ = trace_windows(cfg, chunk=chunk, margin=margin)
    return critical_path_stream(parts, steps)


def _same(a, b) -> None:
    assert a.to_dict() == b.to_dict()
    assert sentence(a) == sentence(b)
    assert a.gates == b.gates
    assert a.n_gaps == len(b.gaps) and a.n_steps == len(b.periods)


STREAMED = [("dspark_coarse", {}), ("dflash_legacy_host_sync", {}),
            ("none_coarse_loop_top", {}), ("eagle_fine", {"policy.plan_stream": True}),
            ("dspark_fine_bimodal", {}),
            ("dspark_fine", {"policy.needs_cpu_seq_lens": True,
                             "cpu.schedule_us": {"dist": "lognormal", "mean": 900, "std": 600},
                             "costs.cross_stream_us": {"dist": "uniform", "low": 0, "high": 30}})]


@pytest.mark.parametrize("name,over", STREAMED, ids=[n for n, _ in STREAMED])
def test_a_streamed_run_explains_as_its_whole_trace(name, over):
    from simwar.config import load_config

    cfg = load_config(ROOT / "configs" / f"{name}.yaml", {"steps": 90, "warmup_steps": 6,
                                                          **over})
    whole = simulate(cfg, engine="simpy").trace
    _same(_streamed(cfg), critical_path(whole))
    _same(_streamed(cfg, (30, 40), chunk=3), critical_path(whole, (30, 40)))
    _same(_streamed(cfg, (0, 89), chunk=50), critical_path(whole, (0, 89)))
    kept = _streamed(cfg)  # the first step's chains and the window they were walked in
    first = critical_path(whole)
    assert [c.step for c in kept.periods] == [first.periods[0].step]
    assert [(s.kind, s.cause, s.start_us, s.end_us, s.after)
            for s in kept.periods[0].segments] == [
        (s.kind, s.cause, s.start_us, s.end_us, s.after) for s in first.periods[0].segments]


def test_a_walk_past_its_window_is_refused():
    from simwar.analysis.critical_path import Truncated, Walker
    from simwar.api import trace_windows
    from simwar.config import load_config

    cfg = load_config(ROOT / "configs" / "dspark_coarse.yaml", {"steps": 60})
    parts = list(trace_windows(cfg, chunk=10, margin=2)[0])
    first, later = parts[0], next(w for w in parts if not w.first)
    # back to the run's start: the first window has it, a later one must not pretend to
    assert Walker(first).chain(len(first.ops) - 1, 0.0).total_us() > 0
    with pytest.raises(Truncated):
        Walker(later).chain(len(later.ops) - 1, 0.0)


def test_streamed_errors_match_the_whole_traces():
    from simwar.config import load_config

    cfg = load_config(ROOT / "configs" / "dspark_fine.yaml", {"steps": 60, "warmup_steps": 5})
    whole = simulate(cfg, engine="simpy").trace
    for steps in ((50, 70), (7, 5), (-3, 4)):
        with pytest.raises(ValueError, match="outside the run") as streamed:
            _streamed(cfg, steps)
        with pytest.raises(ValueError, match="outside the run") as reference:
            critical_path(whole, steps)
        assert str(streamed.value) == str(reference.value)


# ------------------------------------------------------------ captures in their own words
def _synthetic(tmp_path, config, overrides, name="cap.json.gz", **style):
    """A simulated run written as an SGLang server's profile, and its simulated trace."""
    from simwar.capture.synthetic import Style, write_kineto

    sim = simulate(config, {"steps": 60, "warmup_steps": 5, **overrides}, engine="simpy")
    path = write_kineto(sim.trace, tmp_path / name, style=Style(names="sglang", **style))
    return sim, path


def _explained(path, *args):
    from simwar.cli.explain import load_source

    src = load_source(str(path), *args)
    return critical_path(src.trace, None, src.host_ranges, src.device_info), src


def test_capture_host_time_is_its_ranges_work_not_untraced(tmp_path):
    sim, path = _synthetic(tmp_path, ROOT / "configs" / "dspark_fine_bimodal.yaml", {},
                           batch_ranges=True)
    cp, src = _explained(path)
    assert any("preset sglang" in n for n in src.notes)
    for chain in cp.gaps + cp.periods:
        assert abs(chain.total_us() - chain.us) <= 1e-6
    for found in (cp.gap_causes(), cp.step_causes()):
        untraced = sum(c["share"] for c in found if c["cause"] == "host: untraced time")
        assert untraced < 0.03
    top = [c["cause"] for c in cp.gap_causes()[:2]]
    assert top == ["cpu: scheduler.get_next_batch_to_run (schedule)",
                   "cpu: scheduler.prepare_for_decode"]
    # without its ranges the same time is untraced (what explain said before)
    bare = critical_path(src.trace)
    assert bare.gap_causes()[0]["cause"] == "host: untraced time"
    assert bare.gap_causes()[0]["share"] > 0.9
    # the simulation says the same, in its own CPU work's names
    sim_cp = critical_path(sim.trace)
    assert cp.fwd_gap_us == pytest.approx(sim_cp.fwd_gap_us, abs=1e-6)
    assert {c["cause"]: c["us"] for c in sim_cp.gap_causes()}["cpu: schedule"] == \
        pytest.approx(cp.gap_causes()[0]["us"], rel=0.01)


def test_a_hidden_host_sync_is_named_with_what_it_waited_for(tmp_path):
    # a D2H into memory torch copies synchronously: a cudaMemcpyAsync that blocks until the
    # forward it queued behind ends (the host_sync barrier written as that copy)
    overrides = {"policy.barrier": "host_sync", "phases.sample.reads": ["req_to_token"],
                 "phases.sample.read_ends": "post_replay", "cpu.process_result_us": 1500}
    sim, path = _synthetic(tmp_path, ROOT / "configs" / "none_fine.yaml", overrides,
                           blocking_sites=("barrier",))
    cp, _ = _explained(path)
    gate = ("cudaMemcpyAsync (4096 B, DtoH (Device -> Pinned) copy) until stream7: "
            "sample.body ended")
    assert gate in cp.gates
    found = cp.gap_causes()
    assert found[0]["cause"] == "cpu: scheduler.process_batch_result (process_result)"
    assert found[0]["after"] == gate
    assert f"after the CPU blocked in {gate}" in sentence(cp)
    launch = sum(c["us"] for c in found if c["cause"] == "host API: launch")
    assert launch < 50  # the blocking copy is not "host API: launch"
    assert any(c["cause"] == f"host blocked in {gate}: return" for c in found)
    assert sum(c["share"] for c in found if c["cause"] == "host: untraced time") < 0.03
    assert cp.fwd_gap_us == pytest.approx(critical_path(sim.trace).fwd_gap_us, abs=5.0)


def test_a_sync_whose_record_the_capture_does_not_bind_says_so(tmp_path):
    _, path = _synthetic(tmp_path, ROOT / "configs" / "dspark_fine.yaml",
                         {"cpu.schedule_us": 6000, "gpu.schedule_writes_us": 5},
                         record_ids=False, fresh_events=("copy_done",))
    cp, _ = _explained(path)
    causes_ = {c["cause"] for c in cp.step_causes()}
    # named with the range the call was made in (a Python frame, in a with_stack capture)
    assert ("host blocked in cudaEventSynchronize from scheduler.process_batch_result "
            "(process_result) (its record is not bound in this trace)") in causes_


def test_explain_per_bucket_on_a_varying_workload(tmp_path, capsys):
    cfg = ROOT / "configs" / "dspark_fine_bimodal.yaml"
    sim = simulate(cfg, {"steps": 200})
    cp = critical_path(simulate(cfg, {"steps": 200}, engine="simpy").trace)
    per = cp.by_bucket()
    assert sorted(per) == [8, 64]
    for b, sub in per.items():
        assert sub.step_us == pytest.approx(sim.summary["by_bucket"][b]["step_us_mean"])
        assert sub.fwd_gap_us == pytest.approx(sim.summary["by_bucket"][b]["fwd_gap_us_mean"])
    # host-bound small batches, device-bound large ones: apart, not averaged into one
    assert per[8].gap_causes()[0]["kind"] == "host"
    assert per[64].step_causes()[0]["kind"] == "device"
    assert main(["explain", str(cfg), "--set", "steps=200"]) == 0
    out = capsys.readouterr().out
    assert "  bucket 8 " in out and "  bucket 64 " in out
    _, path = _synthetic(tmp_path, cfg, {}, batch_ranges=True)
    assert main(["explain", str(path), "--preset", "sglang", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert sorted(d["by_bucket"]) == ["6", "64"]  # the largest batch seen with each graph
    assert any(n.startswith("preset sglang (--preset)") for n in d["read_with"])
