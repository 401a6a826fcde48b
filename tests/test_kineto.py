"""The Kineto (torch.profiler) importer: schema handling, inference, metrics, fitting, CLI.

Hand-made captures live in tests/data/kineto_synthetic (see each test for the
timeline they encode); round trips write simulated runs as Kineto captures and
check that the import gives back the simulator's own figures. Real GPU captures,
when present under tests/data/kineto, are compared with the event-based metrics
recorded beside them.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import yaml

from simwar.analysis.idle import gap_cause, idle_breakdown
from simwar.analysis.metrics import analyze
from simwar.api import simulate
from simwar.capture.mapping import FirstMatch, load_mapping
from simwar.capture.reader import KinetoFormatError, read_capture
from simwar.capture.stalls import import_report
from simwar.capture.synthetic import write_kineto
from simwar.capture.to_trace import import_kineto
from simwar.cli.app import main
from simwar.config import ConfigError, load_config
from simwar.core.trace import Call, OpKind
from simwar.fit.durations import cost_samples, fit_durations, fit_values

DATA = Path(__file__).parent / "data" / "kineto_synthetic"
REAL = Path(__file__).parent / "data" / "kineto"

# three_steps.json: steps at B = 1000, 2000, 3000 µs on the host thread (pid/tid 100).
# Per step: "draft" annotation around a launch at B+12 (kernel gemm_a on stream 7 at
# B+100..B+300); "verify" around a graph launch at B+42 (k_verify_1 B+300..450,
# k_verify_2 B+450..550); cudaEventRecord at B+80; cudaStreamWaitEvent at B+85 (stream 13
# waits on that record); a launch at B+90 of schedule_write on stream 13 at B+560..590;
# "result_copy" around cudaEventSynchronize B+500..560 on the record; memcpy and memset on
# stream 13. Plus a runtime call on another thread, a python_function per step, an unknown
# category, flows, metadata and the window-end instant.
MAPPING = {"streams": {7: "forward", 13: "schedule"},
           "phases": {"^draft$": "draft", "^verify$": "verify"},
           "sites": {"^result_copy$": "result_copy"}}


@pytest.fixture(scope="module")
def three_steps():
    return import_kineto(DATA / "three_steps.json", MAPPING)


# --------------------------------------------------------------------------- schema
def test_counts_and_ignored_kinds(three_steps):
    c = three_steps.counts
    assert (c["kernel"], c["memcpy"], c["memset"], c["cuda_sync"]) == (12, 3, 3, 6)
    assert c["host_runtime_calls"] == 24 and c["runtime"] == 25
    ig = three_steps.ignored
    assert ig["python_function"] == 3
    assert ig["some_future_category"] == 1
    assert ig["ac2g:s"] == 3 and ig["ac2g:f"] == 3
    assert ig["metadata"] == 2 and ig["runtime_other_threads"] == 1
    assert three_steps.ignored_total == 14
    assert three_steps.warnings == []
    assert three_steps.trace.meta["devices"][0]["name"] == "NVIDIA H200"


def test_lanes_steps_and_phases(three_steps):
    t = three_steps.trace
    assert t.meta["forward_stream"] == "forward"
    assert t.meta["step_names"] == ["ProfilerStep#10", "ProfilerStep#11", "ProfilerStep#12"]
    kernels = [s for s in t.spans if s.kind == "kernel"]
    assert {s.lane for s in kernels} == {"forward", "schedule"}
    by_label = {(s.label, s.step): s for s in kernels}
    assert by_label[("gemm_a", 1)].phase == "draft"  # from the enclosing annotation
    assert by_label[("k_verify_2", 2)].phase == "verify"  # graph kernels share the launch
    assert by_label[("schedule_write", 0)].phase == ""  # phase rules given, none matched
    assert (by_label[("gemm_a", 0)].start_us, by_label[("gemm_a", 0)].end_us) == (100.0, 300.0)
    assert [m.time_us for m in t.markers if m.name == "step"] == [0.0, 1000.0, 2000.0]
    # run_batch: the first forward launch of each step
    assert [m.time_us for m in t.markers if m.name == "run_batch"] == [12.0, 1012.0, 2012.0]


def test_records_waits_and_syncs_are_bound_and_timed(three_steps):
    t = three_steps.trace
    ops = list(t.ops)
    waits = [o for o in ops if o.kind == "wait"]
    syncs = [o for o in ops if o.kind == "sync"]
    assert len(waits) == len(syncs) == 3
    for k, (w, s) in enumerate(zip(waits, syncs)):
        rec = ops[w.bound]
        assert rec.kind == "record" and rec.lane == "forward" and s.bound == w.bound
        assert rec.end_us == 1000 * k + 550  # fired when forward drained its work
        assert w.lane == "schedule" and w.event == "event5"
        # reached at the wait call's return, held until the queued kernel ran
        assert (w.start_us, w.end_us) == (1000 * k + 87, 1000 * k + 560)
        assert (s.start_us, s.end_us) == (1000 * k + 500, 1000 * k + 560)
    held = [s for s in t.spans if s.kind == "wait"]
    assert [(s.lane, s.start_us, s.end_us) for s in held] == \
        [("schedule", 1000 * k + 87.0, 1000 * k + 560.0) for k in range(3)]
    blocked = [s for s in t.spans if s.kind == "blocked"]
    assert {s.site for s in blocked} == {"result_copy"}
    bound = [e for e in t.edges() if e.kind != "launch"]
    assert sorted((e.kind, e.src, e.dst) for e in bound) == sorted(
        [("record_wait", w.bound, w.op_id) for w in waits]
        + [("record_sync", s.bound, s.op_id) for s in syncs])
    assert [o.op_id for o in ops] == list(range(len(ops)))
    assert all(a.issue_us <= b.issue_us for a, b in zip(ops, ops[1:]))


def test_host_calls_are_typed_and_tied_to_the_ops_they_issued(three_steps):
    t = three_steps.trace
    spans, ops = list(t.spans), list(t.ops)
    host = [s for s in spans if s.lane == "cpu"]
    kinds = {(s.label, s.call) for s in host}
    # memcpy/memset calls that issued device work are launches
    assert kinds == {("cudaLaunchKernel", "launch"), ("cudaGraphLaunch", "graph_launch"),
                     ("cudaEventRecord", "record"), ("cudaStreamWaitEvent", "wait_event"),
                     ("cudaEventSynchronize", "synchronize"), ("cudaMemcpyAsync", "launch"),
                     ("cudaMemsetAsync", "launch")}
    assert all((s.kind == "blocked") == (s.call == "synchronize") for s in host)
    for o in ops:
        call = spans[o.call]  # every op here was issued by a host call on the host thread
        assert call.lane == "cpu" and call.step == o.step
        # each call names the first op it issued; an op is issued when its call returned
        assert ops[call.op].call == o.call and call.op <= o.op_id
        assert o.issue_us == (call.start_us if o.kind == "sync" else call.end_us)
    for s in spans:  # device spans belong to their op
        if s.lane != "cpu":
            assert ops[s.op].lane == s.lane and ops[s.op].label == s.label
    kernel_calls = {(ops[e.dst].label, spans[e.src].label) for e in t.edges()
                    if e.kind == "launch"}
    assert kernel_calls == {("gemm_a", "cudaLaunchKernel"), ("k_verify_1", "cudaGraphLaunch"),
                            ("k_verify_2", "cudaGraphLaunch"),
                            ("schedule_write", "cudaLaunchKernel"),
                            ("Memcpy DtoH (Device -> Pinned)", "cudaMemcpyAsync"),
                            ("Memset (Device)", "cudaMemsetAsync")}
    assert [o.label for o, g in zip(ops, t.graph_node()) if g] == \
        ["k_verify_1", "k_verify_2"] * 3
    assert _launch_pairs(t) == _correlation_pairs(DATA / "three_steps.json")


def test_step_metrics_match_the_hand_computed_timeline(three_steps):
    steps, summary, hazards = analyze(three_steps.trace)
    assert steps.step_us.tolist()[:2] == [1000.0, 1000.0]
    assert steps.fwd_us.tolist() == [450.0] * 3
    assert steps.fwd_gap_us.tolist()[1:] == [550.0, 550.0]
    assert steps.cpu_blocked_result_copy_us.tolist() == [60.0] * 3
    assert steps.launch_lead_us.tolist()[:2] == [550 - 1012.0, 550 - 1012.0]
    assert steps.launch_ahead.tolist() == [0.0, 0.0, 0.0]
    assert summary["steps_measured"] == 2
    assert summary["gpu_idle_host_us_mean"] == 550.0 and summary["gpu_idle_dep_us_mean"] == 0
    assert hazards.races == []


def test_idle_breakdown_by_hta_categories(three_steps):
    idle = idle_breakdown(three_steps.trace)
    fwd, sched = idle["forward"], idle["schedule"]
    assert fwd["busy_us"] == 3 * 450 and fwd["idle_us"] == fwd["host_wait_us"] == 2 * 550
    # schedule: 120 and 10 µs gaps inside each step, 828 µs between steps. The 10 µs gap
    # before each memset: its launch call (720-723) started when the memcpy ended (720), so by
    # HTA's rule (launch *start* after the previous end) it is not host-wait but kernel-wait
    # (< 30 µs); everything else was launched after the previous op ended: host-wait
    assert sched["idle_us"] == 3 * 130 + 2 * 828
    assert sched["host_wait_us"] == 3 * 120 + 2 * 828 and sched["kernel_wait_us"] == 3 * 10
    assert idle_breakdown(three_steps.trace, from_step=2)["forward"]["idle_us"] == 0.0


def test_idle_breakdown_is_an_analysis_of_any_trace(three_steps):
    import simwar.analysis as analysis

    assert analysis.idle_breakdown is idle_breakdown
    assert idle_breakdown(three_steps.trace) == import_report(three_steps)[1]["idle"]
    # one gap, filed by the launch call's start against the end of the work before it (HTA)
    assert gap_cause(50.0, 12.0, 13.0, 11.0) == "host_wait"
    assert gap_cause(50.0, 10.0, 12.0, 11.0) == "other"  # the launch straddles the end
    assert gap_cause(5.0, 10.0, 12.0, 11.0) == "kernel_wait"  # ... and the gap is < 30 µs
    assert gap_cause(0.02, 1.0, 2.0, 3.0) == "kernel_wait"
    assert gap_cause(50.0, 1.0, 2.0, 3.0) == "other"
    assert gap_cause(50.0, float("nan"), float("nan"), 3.0) == "other"  # no launch call


def test_gzip_and_small_chunks_give_the_same_trace(three_steps):
    gz = import_kineto(DATA / "three_steps.json.gz", MAPPING).trace
    assert list(gz.spans) == list(three_steps.trace.spans)
    assert list(gz.ops) == list(three_steps.trace.ops)
    cap = read_capture(DATA / "three_steps.json", chunk_bytes=97)  # keys straddle chunks
    assert cap.counts == read_capture(DATA / "three_steps.json").counts


def test_progress_reports_bytes_up_to_the_file_size():
    seen = []
    read_capture(DATA / "three_steps.json", progress=lambda d, t: seen.append((d, t)),
                 chunk_bytes=1000)
    size = (DATA / "three_steps.json").stat().st_size
    assert len(seen) > 5 and seen[-1] == (size, size)
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:]))


# --------------------------------------------------------------------------- edge cases
def test_empty_trace_events_is_a_one_line_error():
    with pytest.raises(KinetoFormatError) as info:
        import_kineto(DATA / "empty.json")
    assert "'traceEvents' is empty" in str(info.value) and "\n" not in str(info.value)


def test_absolute_clock_and_skewed_gpu_clock(three_steps):
    # ts since the epoch and a GPU clock 700 µs behind the host's
    skewed = import_kineto(DATA / "clock_offset.json", MAPPING)
    assert skewed.counts["device_before_launch"] == 18
    assert any("GPU clock looks offset" in w for w in skewed.warnings)
    base = analyze(three_steps.trace)[0]
    got = analyze(skewed.trace)[0]
    for col in ("step_us", "fwd_gap_us", "fwd_us", "cpu_blocked_us"):
        np.testing.assert_array_equal(got[col], base[col])
    assert got.launch_lead_us[0] == base.launch_lead_us[0] - 700
    fixed = import_kineto(DATA / "clock_offset.json", {**MAPPING, "gpu_clock_offset_us": "auto"})
    assert fixed.counts["device_before_launch"] == 0 and fixed.warnings == []
    # auto aligns the earliest device op with its launch: 10 µs after it in the unskewed file
    assert fixed.trace.meta["gpu_clock_offset_us"] == 690.0
    explicit = import_kineto(DATA / "clock_offset.json", {**MAPPING, "gpu_clock_offset_us": 700})
    assert analyze(explicit.trace)[0].launch_lead_us.tolist()[:2] == \
        base.launch_lead_us.tolist()[:2]


def test_every_op_of_a_graph_launch_is_its_work(tmp_path):
    """A launch of several device ops (a graph's nodes): each is the launch's work, for the
    clock check (a node that is not the first starting before the launch) as for the ops
    the launch issued (its nodes, in start order)."""
    d = json.loads((DATA / "three_steps.json").read_text())
    for e in d["traceEvents"]:  # step 0's second graph node: on stream 9, 12 µs early
        if e.get("name") == "k_verify_2" and e["args"]["correlation"] == 2:
            e.update(tid=9, ts=1030.0)
            e["args"]["stream"] = 9
    path = tmp_path / "early_node.json"
    path.write_text(json.dumps(d))
    early = import_kineto(path, MAPPING)
    assert early.counts["device_before_launch"] == 1
    assert any("GPU clock looks offset" in w for w in early.warnings)
    fixed = import_kineto(path, {**MAPPING, "gpu_clock_offset_us": "auto"})
    assert fixed.trace.meta["gpu_clock_offset_us"] == 12.0
    assert fixed.counts["device_before_launch"] == 0
    ops = fixed.trace.ops
    graph = [s.span_id for s in fixed.trace.spans if s.call == "graph_launch" and s.step == 0]
    nodes = [o for o in ops if o.call == graph[0]]
    assert [(o.label, o.lane) for o in nodes] == [("k_verify_2", "stream9"),
                                                  ("k_verify_1", "forward")]


def test_missing_stream_args_fall_back_to_the_tid(three_steps):
    imp = import_kineto(DATA / "no_stream_args.json", MAPPING)
    assert list(imp.trace.spans) == list(three_steps.trace.spans)


def test_mapping_naming_absent_streams_warns_and_still_imports():
    imp = import_kineto(DATA / "three_steps.json",
                        {**MAPPING, "streams": {7: "forward", 99: "copy"},
                         "forward_stream": "nowhere"})
    assert any("99" in w for w in imp.warnings)
    assert any("forward_stream 'nowhere'" in w for w in imp.warnings)
    _, report = import_report(imp)
    assert report["metrics"]["steps_measured"] == 0
    assert "stream13" in report["idle"]


def test_kernels_without_a_launch_are_kept_and_stepped_by_time():
    imp = import_kineto(DATA / "kernel_no_launch.json")
    assert imp.counts["device_without_launch"] == 2
    assert any("no host call" in w for w in imp.warnings)
    spans = {s.label: s for s in imp.trace.spans if s.kind == "kernel"}
    assert spans["nccl_from_another_process"].step == 0
    assert spans["nccl_from_another_process"].lane == "stream9"
    assert spans["no_correlation"].step == 1
    assert imp.trace.meta["forward_stream"] == "stream7"  # busiest stream, no mapping


@pytest.mark.parametrize("name, fragment", [
    ("truncated.json", "not valid JSON"),
    ("not_kineto.json", "no 'traceEvents' array"),
])
def test_malformed_files_give_one_clear_error(name, fragment):
    with pytest.raises(KinetoFormatError) as info:
        import_kineto(DATA / name)
    msg = str(info.value)
    assert fragment in msg and name in msg and "\n" not in msg


def test_not_json_and_broken_gzip(tmp_path):
    text = tmp_path / "notes.json"
    text.write_text("hello")
    with pytest.raises(KinetoFormatError, match="not JSON"):
        read_capture(text)
    broken = tmp_path / "cut.json.gz"
    broken.write_bytes((DATA / "three_steps.json.gz").read_bytes()[:600])
    with pytest.raises(KinetoFormatError, match="decompress|not valid JSON"):
        read_capture(broken)
    empty = tmp_path / "zero.json"
    empty.write_text("")
    with pytest.raises(KinetoFormatError, match="empty file"):
        read_capture(empty)


def test_chrome_array_format_is_read(tmp_path):
    events = json.loads((DATA / "three_steps.json").read_text())["traceEvents"]
    path = tmp_path / "array.json"
    path.write_text(json.dumps(events))
    assert import_kineto(path, MAPPING).counts == import_kineto(DATA / "three_steps.json",
                                                                MAPPING).counts


@pytest.mark.parametrize("mapping, fragment", [
    ({"phases": {"(": "draft"}}, "phases: Value error, invalid regex"),
    ({"streams": {"x7": "forward"}}, "streams"),
    ({"stream": {7: "forward"}}, "stream: unknown key"),
    ({"warmup_steps": -1}, "warmup_steps"),
])
def test_mapping_errors_are_one_line(mapping, fragment):
    with pytest.raises(ConfigError) as info:
        load_mapping(mapping)
    assert "\n" not in str(info.value)
    assert fragment.split(":")[0] in str(info.value)


def test_a_mappings_name_rules_give_the_first_match_searched_once_a_name():
    """Steps, phases, sites and CPU items: the first rule whose regex finds the name wins,
    None (False for the step test) where none does; each name is searched once."""
    m = load_mapping({"steps": "^step", "phases": {"^verify": "verify", "verify": "other"},
                      "sites": {"copy": "result_copy"}, "cpu": {"^sched": "schedule"}})
    phase_of = m.phase_of()
    assert [phase_of[n] for n in ("verify_k", "k_verify", "gemm")] == ["verify", "other", None]
    assert m.site_of()["result_copy"] == "result_copy" and m.site_of()["x"] is None
    assert m.cpu_item_of()["sched.next"] == "schedule"
    is_step = m.step_test()
    assert (is_step("step#3"), is_step("ProfilerStep#3")) == (True, False)
    searched = []

    class Rx:
        def search(self, name):
            searched.append(name)
            return name == "b"

    rules = FirstMatch([(Rx(), 1)])
    assert [rules[n] for n in "abab"] == [None, 1, None, 1] and searched == ["a", "b"]


# --------------------------------------------------------------------------- round trips
ROUND_TRIP_MAPPING = {
    "streams": {7: "forward", 13: "schedule", 20: "copy"},
    "phases": {r"^draft\.": "draft", r"^verify\.": "verify", r"^sample\.": "sample",
               r"^materialize\.": "materialize"},
    "run_batch": "^run_batch$", "warmup_steps": 5, "batch_size": 32, "accept_tokens": 3.2,
    "sites": {"^result_copy$": "result_copy", "^barrier$": "barrier",
              "^verify_done$": "verify_done"},
}
VARIED = {"steps": 40, "warmup_steps": 5,
          "phases.verify.body_us": {"dist": "lognormal", "mean": 5100, "std": 400},
          "cpu.process_result_us": {"dist": "normal", "mean": 800, "std": 300},
          "costs.launch_us": {"dist": "normal", "mean": 6, "std": 1, "min": 1}}
COLUMNS = ["fwd_start_us", "fwd_us", "step_us", "fwd_gap_us", "gpu_idle_us", "gpu_idle_dep_us",
           "gpu_idle_host_us", "cpu_blocked_us", "launch_us", "launch_lead_us", "launch_ahead"]


@pytest.mark.parametrize("policy", [
    {},
    {"policy.barrier": "coarse"},
    {"algorithm": "dflash", "policy.barrier": "host_sync", "policy.placement": "loop_top"},
])
def test_round_trip_reproduces_the_simulated_step_table(tmp_path, policy):
    sim = simulate(None, {**VARIED, **policy})
    path = write_kineto(sim.trace, tmp_path / "sim.json.gz")
    imp = import_kineto(path, ROUND_TRIP_MAPPING)
    assert imp.warnings == []
    got = analyze(imp.trace)[0].set_index("step")[COLUMNS]
    want = sim.steps.set_index("step")[COLUMNS]
    assert list(got.index) == list(want.index)
    np.testing.assert_allclose(got.to_numpy(float), want.to_numpy(float), atol=0.01)
    _, report = import_report(imp)
    for key in ("step_us_mean", "fwd_gap_us_mean", "cpu_blocked_us_mean",
                "launch_lead_us_mean", "tokens_per_s"):
        assert report["metrics"][key] == pytest.approx(sim.summary[key], rel=1e-5, abs=0.01)
    for lane, d in report["idle"].items():
        parts = d["host_wait_us"] + d["kernel_wait_us"] + d["dependency_us"] + d["other_us"]
        assert parts == pytest.approx(d["idle_us"]), lane
    # each kernel is tied to its launch: per kernel in issue order, its label, whether it is
    # a graph node and the kind of the call that launched it are the simulator's
    assert _launches(imp.trace) == _launches(sim.trace)
    assert any(_launches(sim.trace)[1]) and not all(_launches(sim.trace)[1])


def _launches(trace) -> tuple[list, list, list]:
    kernels = trace.ops.kind == OpKind.KERNEL
    return (trace.ops.decoded("label")[kernels].tolist(), trace.graph_node()[kernels].tolist(),
            trace.spans.call[trace.ops.call[kernels]].tolist())


def test_round_trip_binds_the_copy_stream_to_forward(tmp_path):
    sim = simulate(None, {"steps": 20, "warmup_steps": 2})
    imp = import_kineto(write_kineto(sim.trace, tmp_path / "s.json"), ROUND_TRIP_MAPPING)
    idle = idle_breakdown(imp.trace, from_step=2)
    # the result copy of step k is issued a step ahead and held by copy.wait_stream(forward)
    assert idle["copy"]["dependency_us"] > 0.9 * idle["copy"]["idle_us"] > 0
    assert imp.counts["waits_unbound"] == 0 and imp.counts["syncs_unbound"] == 0


# --------------------------------------------------------------------------- fitting
def test_fit_values_picks_a_fitting_family_and_rejects_bad_ones():
    rng = np.random.default_rng(1)
    dist, detail = fit_values(rng.normal(500, 20, 400))
    assert detail["chosen"] in ("normal", "lognormal") and dist["mean"] == pytest.approx(500, 0.01)
    dist, detail = fit_values(rng.lognormal(np.log(300), 0.8, 400))
    assert detail["chosen"] == "lognormal"
    assert dist["mean"] == pytest.approx(300 * math.exp(0.32), rel=0.1)
    bimodal = np.concatenate([np.full(100, 10.0), np.full(100, 90.0)])
    dist, detail = fit_values(bimodal, max_values=20)
    assert detail["chosen"] == "empirical" and len(dist["values"]) == 20
    assert fit_values([7.0, 7.0, 7.0])[0] == 7.0
    with pytest.raises(ValueError, match="choose"):
        fit_values([1, 2], choose="gamma")


def test_cost_samples_come_from_call_kinds_and_bound_ops(three_steps):
    samples = cost_samples(three_steps.trace)
    # per step: two kernel launches (5 and 4 µs) and the memcpy and memset calls (5, 3 µs),
    # which issued device work, so they are launches too
    assert sorted(samples["launch_us"]) == sorted([5.0, 4.0, 5.0, 3.0] * 3)
    assert samples["graph_launch_us"] == [8.0] * 3
    assert samples["event_record_us"] == [3.0] * 3 and samples["wait_event_us"] == [2.0] * 3
    # the sync returned 10 µs after its record fired; the wait released 10 µs after it
    assert samples["sync_wake_us"] == [10.0] * 3 and samples["cross_stream_us"] == [10.0] * 3
    assert cost_samples(three_steps.trace, from_step=2)["launch_us"] == [5.0, 4.0, 5.0, 3.0]


def test_fit_recovers_the_simulated_durations_and_loads_as_config(tmp_path):
    sim = simulate(None, {**VARIED, "steps": 120})
    imp = import_kineto(write_kineto(sim.trace, tmp_path / "s.json"), ROUND_TRIP_MAPPING)
    fit = fit_durations(imp.trace, "lognormal")
    verify = next(p for p in fit.config["phases"] if p["name"] == "verify")
    # GPU time = the built-in prep (60) + the drawn body (lognormal mean 5100, std 400)
    assert verify["body_us"]["dist"] == "lognormal"
    assert verify["body_us"]["mean"] == pytest.approx(5160, rel=0.03)
    assert verify["body_us"]["std"] == pytest.approx(400, rel=0.3)
    assert fit.config["costs"]["launch_us"]["mean"] == pytest.approx(6, rel=0.1)
    assert fit.config["costs"]["sync_wake_us"]["mean"] == pytest.approx(16, abs=0.01)
    cfg = load_config(None, {"phases": fit.config["phases"], **{
        f"costs.{k}": v for k, v in fit.config["costs"].items()}})
    assert cfg.phase_table()[1].body_us.dist == "lognormal"


# --------------------------------------------------------------------------- CLI
def test_cli_json_has_counts_and_metrics(capsys, tmp_path):
    mapping = tmp_path / "map.yaml"
    mapping.write_text(yaml.safe_dump(MAPPING))
    assert main(["import", str(DATA / "three_steps.json"), "--mapping", str(mapping),
                 "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["counts"]["kernels"] == 12 and out["counts"]["memcpys"] == 3
    assert out["counts"]["memsets"] == 3 and out["counts"]["sync_events"] == 6
    assert out["counts"]["host_runtime_calls"] == 24 and out["counts"]["ignored_events"] == 14
    assert out["metrics"]["step_us_mean"] == 1000.0
    assert out["metrics"]["fwd_gap_us_mean"] == 550.0
    assert out["idle"]["forward"]["host_wait_us"] == 1100.0


def test_cli_text_fit_and_saved_trace(capsys, tmp_path):
    sim = simulate(None, {**VARIED, "steps": 30})
    trace = write_kineto(sim.trace, tmp_path / "sim.json")
    mapping = tmp_path / "map.yaml"
    mapping.write_text(yaml.safe_dump(ROUND_TRIP_MAPPING))
    fitted, saved = tmp_path / "fitted.yaml", tmp_path / "imported.json.gz"
    # --fit-costs: the costs-only file (--fit writes the whole loop, tests/test_fit_loop.py)
    assert main(["import", str(trace), "--mapping", str(mapping), "--fit-costs", "-o", str(fitted),
                 "--save-trace", str(saved), "--steps-csv", str(tmp_path / "steps.csv"),
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "step time" in out and "stream idle (HTA)" in out and str(fitted) in out
    assert fitted.read_text().startswith("# Durations fitted")
    assert (tmp_path / "steps.csv").read_text().startswith("step,")
    from simwar.core.trace import Trace

    assert len(Trace.load(saved).ops) > 0
    # the fitted costs drive a simulation directly
    assert main(["run", "--costs", str(fitted), "--set", "steps=30", "--set",
                 "warmup_steps=5", "--json"]) == 0


@pytest.mark.parametrize("argv, fragment", [
    (["import", str(DATA / "truncated.json")], "not valid JSON"),
    (["import", str(DATA / "missing.json")], "file not found"),
    (["import", str(DATA / "three_steps.json"), "--fit"], "--fit needs -o"),
])
def test_cli_user_errors_are_one_line(capsys, argv, fragment):
    assert main(argv + ["--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("simwar: error:") and fragment in err and "\n" not in err


def test_reader_does_not_import_pandas():
    code = ("import sys; from simwar.capture.to_trace import import_kineto; "
            f"import_kineto({str(DATA / 'three_steps.json')!r}); "
            "assert 'pandas' not in sys.modules, 'pandas imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_capture_never_imports_the_simulator():
    # capture/ reads; running the simulator (api, executors, builder) is fit/'s and the CLI's
    modules = ("reader", "to_trace", "binding", "ranks", "device_times", "mapping", "presets",
               "sizes", "open", "accesses", "stalls", "synthetic")
    code = ("import sys\n" + "".join(f"import simwar.capture.{m}\n" for m in modules)
            + "bad = [m for m in sys.modules if m.split('.')[:2] in "
              "(['simwar', 'api'], ['simwar', 'executors'], ['simwar', 'builder'])]\n"
              "assert not bad, bad\n")
    subprocess.run([sys.executable, "-c", code], check=True)


# --------------------------------------------------------------------------- real captures
# tests/data/kineto: harness replays profiled on an H200 (see its README). Each host
# iteration k is a record_function("step#<k>") range; <case>.metrics.json holds the
# harness's own CUDA-timing-event metrics of the same run, <case>.config.yaml its config.
def _real_captures():
    if not REAL.is_dir():
        return []
    return sorted(p for p in REAL.iterdir() if p.name.endswith((".json", ".json.gz"))
                  and not p.name.endswith(".metrics.json"))


def _case(capture: Path) -> str:
    return capture.name.removesuffix(".gz").removesuffix(".json").removesuffix(".kineto")


@pytest.mark.skipif(not _real_captures(), reason="no GPU captures under tests/data/kineto")
@pytest.mark.parametrize("capture", _real_captures(), ids=_case)
def test_real_capture_matches_the_replays_event_timing(capture):
    case = _case(capture)
    expected = json.loads((REAL / f"{case}.metrics.json").read_text())["summary"]
    config = yaml.safe_load((REAL / f"{case}.config.yaml").read_text())
    imp = import_kineto(capture, {"steps": r"^step#\d+$",
                                  "warmup_steps": config["warmup_steps"]})
    _, report = import_report(imp)
    got = report["metrics"]
    assert got["steps_measured"] == expected["steps_measured"]
    assert got["step_us_mean"] == pytest.approx(expected["step_us_mean"], rel=0.03)
    # the forward gap within 3%, or 5 µs where the gap itself is a few µs: the harness times a
    # forward with events recorded just before its first and after its last launch, the import
    # with the kernels' own boundaries, ~2 µs inside each event (GPU-bound gaps: 1.5 vs 5 µs)
    assert abs(got["fwd_gap_us_mean"] - expected["fwd_gap_us_mean"]) <= \
        max(0.03 * expected["fwd_gap_us_mean"], 5.0)
    assert got["cpu_blocked_us_mean"] == pytest.approx(expected["cpu_blocked_us_mean"],
                                                       rel=0.03, abs=10.0)
    assert got["launch_ahead_mean"] == expected["launch_ahead_mean"]
    assert report["counts"]["device_before_launch"] == 0


def _correlation_pairs(capture: Path, steps: str = r"^ProfilerStep#\d+$") -> list[tuple]:
    """The capture's launch relation, computed from the raw events: per device op whose
    runtime call (same correlation id) is on the host thread inside the steps,
    ``(call name, call start, device op name, device op start)`` in µs from the capture's
    first event (no GPU clock offset)."""
    cap = read_capture(capture)
    origin = min(e.ts for seq in (cap.device_events, cap.runtime_calls, cap.annotations,
                                  cap.sync_events) for e in seq)
    launched = {d.correlation for d in cap.device_events}
    host = Counter((c.pid, c.tid) for c in cap.runtime_calls
                   if c.correlation in launched).most_common(1)[0][0]
    ranges = [a for a in cap.annotations if (a.pid, a.tid) == host and re.search(steps, a.name)]
    lo, hi = min(a.ts for a in ranges), max(a.ts + a.dur for a in ranges)
    calls = {c.correlation: c for c in cap.runtime_calls
             if (c.pid, c.tid) == host and lo <= c.ts <= hi}
    return sorted((c.name, c.ts - origin, d.name, d.ts - origin) for d in cap.device_events
                  if (c := calls.get(d.correlation)) is not None)


def _launch_pairs(trace) -> list[tuple]:
    """The trace's launch edges as ``(call label, call start, op label, op start)``."""
    spans, ops = list(trace.spans), list(trace.ops)
    return sorted((spans[e.src].label, spans[e.src].start_us, ops[e.dst].label,
                   ops[e.dst].start_us) for e in trace.edges() if e.kind == "launch")


@pytest.mark.skipif(not _real_captures(), reason="no GPU captures under tests/data/kineto")
@pytest.mark.parametrize("capture", _real_captures(), ids=_case)
def test_real_capture_device_ops_point_at_their_launch(capture):
    t = import_kineto(capture, {"steps": r"^step#\d+$"}).trace
    ops, spans = t.ops, t.spans
    device = np.flatnonzero(ops.kind == OpKind.KERNEL)
    calls = ops.call[device]
    # every imported device op was launched by a call on the host thread in the capture
    assert (calls >= 0).all()
    assert set(spans.call[calls].tolist()) == {Call.LAUNCH, Call.GRAPH_LAUNCH}
    # launch edges are the capture's correlation pairs, one per device op
    pairs = _correlation_pairs(capture, r"^step#\d+$")
    assert len(pairs) == len(device)
    assert _launch_pairs(t) == pairs
    # graph nodes: exactly the device ops launched by cudaGraphLaunch (plus, where a wait
    # binds to one, the graph's in-graph record node)
    by_graph = device[spans.decoded("label")[calls] == "cudaGraphLaunch"]
    np.testing.assert_array_equal(np.flatnonzero(t.graph_node() & (ops.kind == OpKind.KERNEL)),
                                  by_graph)
    nodes = np.flatnonzero(t.graph_node() & (ops.kind == OpKind.RECORD))
    assert set(spans.decoded("label")[ops.call[nodes]]) <= {"cudaGraphLaunch"}
    # each launch span names the first op it issued
    set_calls = set(calls.tolist())
    first = {}  # over every op a call issued (an in-graph record node comes first)
    for op, call in enumerate(ops.call.tolist()):
        if call in set_calls:
            first.setdefault(call, op)
    assert {c: int(spans.op[c]) for c in first} == first
    # host calls keep the runtime call's name; the call kind is typed
    host = spans.lane == t.code("cpu")
    kinds = set(zip(spans.decoded("label")[host].tolist(), spans.decoded("call")[host].tolist()))
    assert {k for k in kinds if k[0] in ("cudaLaunchKernel", "cudaGraphLaunch",
                                         "cudaEventRecordWithFlags", "cudaStreamWaitEvent",
                                         "cudaEventSynchronize", "cudaMemcpyAsync",
                                         "cudaEventQuery")} == \
        {("cudaLaunchKernel", "launch"), ("cudaGraphLaunch", "graph_launch"),
         ("cudaEventRecordWithFlags", "record"), ("cudaStreamWaitEvent", "wait_event"),
         ("cudaEventSynchronize", "synchronize"), ("cudaMemcpyAsync", "launch"),
         ("cudaEventQuery", "other")}


@pytest.mark.skipif(not (REAL / "dspark-fine-gpu.kineto.json.gz").exists(),
                    reason="no GPU captures under tests/data/kineto")
def test_dspark_fine_capture_launch_and_graph_counts():
    path = REAL / "dspark-fine-gpu.kineto.json.gz"
    cap = read_capture(path)
    names = {c.correlation: c.name for c in cap.runtime_calls}
    # the capture: 1131 device ops (890 kernels, 241 memcpys), each with its runtime call
    assert Counter(names.get(d.correlation) for d in cap.device_events) == \
        {"cudaLaunchKernel": 490, "cudaGraphLaunch": 400, "cudaMemcpyAsync": 241}
    imp = import_kineto(path, {"steps": r"^step#\d+$"})
    t = imp.trace
    device = np.flatnonzero(t.ops.kind == OpKind.KERNEL)
    launched_by = Counter(t.spans.decoded("label")[t.ops.call[device]].tolist())
    # 9 of the 490 eagerly launched kernels (8 buffer fills and one spin warm-up) are
    # launched before the first step#k range opens: outside the steps, not imported
    assert launched_by == {"cudaLaunchKernel": 481, "cudaGraphLaunch": 400,
                           "cudaMemcpyAsync": 241}
    assert int((t.graph_node() & (t.ops.kind == OpKind.KERNEL)).sum()) == 400
    # and the 40 in-graph read-done nodes the fine barrier's waits bind to (binding.py)
    assert int((t.graph_node() & (t.ops.kind == OpKind.RECORD)).sum()) == 40
    assert sum(e.kind == "launch" for e in t.edges()) == 1122
