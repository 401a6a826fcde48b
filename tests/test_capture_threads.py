"""The importer on any real capture: launches from every thread, the binding rules for
PyTorch 2.11's -1 record ids, processes as ranks, HIP and MTIA, malformed events.

Real captures: tests/data/probe (PyTorch 2.11, one thread), tests/data/threads (PyTorch
2.11, three launching threads, see its README). Synthetic ones are simulated runs written
by ``simwar.capture.synthetic`` (``Style``: 2.11's sync events; ``as_captured``: other pids,
launch threads), so the truth of every relation is the simulator's.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from msgspec.structs import replace

from simwar.analysis.metrics import analyze
from simwar.api import simulate
from simwar.capture.binding import bind
from simwar.capture.reader import read_capture
from simwar.capture.records import DeviceEvent, launch_work, launches_by_corr
from simwar.capture.stalls import import_report
from simwar.capture.synthetic import Style, write_kineto, write_kineto_processes
from simwar.capture.to_trace import import_kineto
from simwar.cli.app import main
from simwar.core.trace import Call, OpKind

DATA = Path(__file__).parent / "data"
PROBE = DATA / "probe"
THREADS = DATA / "threads"
SYNTH = DATA / "kineto_synthetic"
STEPS = {"steps": r"^step#\d+$"}


def _waits(trace, kind=OpKind.WAIT):
    """Per wait (or sync): (its lane, step, the bound record's lane, step, issuing call)."""
    ops, spans = trace.ops, trace.spans
    lane, call = ops.decoded("lane"), spans.decoded("label")
    out = []
    for i in np.flatnonzero(ops.kind == kind):
        b = int(ops.bound[i])
        out.append((lane[i], int(ops.step[i]), lane[b] if b >= 0 else None,
                    int(ops.step[b]) if b >= 0 else None,
                    call[ops.call[b]] if b >= 0 else None, b))
    return out


# --------------------------------------------------------------------------- binding, 2.11
def test_probe_fine_binds_every_schedule_wait_to_the_verify_graphs_node():
    imp = import_kineto(PROBE / "probe_fine.kineto.json.gz", PROBE / "mapping.yaml")
    t = imp.trace
    assert imp.counts["sync_with_record"] == 0  # the profiler named no record: all -1
    sched = [w for w in _waits(t) if w[0] == "stream37"]  # the schedule stream's barrier
    assert len(sched) == 60
    spans = t.spans
    for _lane, step, rlane, rstep, call, b in sched:
        assert (rlane, rstep, call) == ("stream41", step, "cudaGraphLaunch")
        launch = int(t.ops.call[b])
        assert spans.decoded("phase")[launch] == "verify"  # the verify graph, not the draft
    # forward.wait_stream(schedule) and copy.wait_stream(forward): the record just before
    others = Counter((w[0], w[2], w[4]) for w in _waits(t) if w[0] != "stream37")
    assert others == {("stream41", "stream37", "cudaEventRecordWithFlags"): 60,
                      ("stream45", "stream41", "cudaEventRecordWithFlags"): 60}
    # the result copy's copy_done: a ring of two host events, synced a step later
    syncs = _waits(t, OpKind.SYNC)
    assert len(syncs) == 60 and {(s[2], s[3] - s[1]) for s in syncs} == {("stream45", -1)}
    assert t.meta["binding"]["rules"] == {"wait_stream": 120, "in_graph": 60, "ring": 60}
    assert imp.counts["waits_unbound"] == imp.counts["syncs_unbound"] == 0


def test_probe_coarse_binds_its_barrier_to_the_record_just_before_it_on_forward():
    imp = import_kineto(PROBE / "probe_coarse.kineto.json.gz", PROBE / "mapping.yaml")
    t = imp.trace
    barrier = [w for w in _waits(t) if w[0] == "stream49"]  # schedule.wait_stream(forward)
    assert len(barrier) == 60
    ops, spans = t.ops, t.spans
    for _lane, step, rlane, rstep, call, b in barrier:
        assert (rlane, rstep, call) == ("stream53", step, "cudaEventRecordWithFlags")
        wait_call = int(ops.call[np.flatnonzero((ops.kind == OpKind.WAIT)
                                                & (ops.bound == b))[0]])
        rec_call = int(ops.call[b])
        host = np.flatnonzero((spans.lane == t.code("cpu")) & (spans.call != Call.OTHER))
        i = int(np.flatnonzero(host == wait_call)[0])
        assert host[i - 1] == rec_call  # the record call right before the wait
    assert "in_graph" not in t.meta["binding"]["rules"]


@pytest.mark.parametrize("barrier", ["fine", "coarse", "none"])
def test_minus_one_ids_bind_waits_as_the_named_ids_do(tmp_path, barrier):
    sim = simulate(None, {"steps": 20, "warmup_steps": 2, "policy.barrier": barrier},
                   engine="simpy")
    named = import_kineto(write_kineto(sim.trace, tmp_path / "n.json",
                                       style=Style(copies=("result_copy",))))
    blind = import_kineto(write_kineto(sim.trace, tmp_path / "b.json", style=Style(
        record_ids=False, fresh_events=("copy_done",), copies=("result_copy",))))
    strip = [w[:5] for w in _waits(named.trace)]
    assert strip == [w[:5] for w in _waits(blind.trace)]
    assert all(w[2] is not None for w in strip)
    rules = blind.trace.meta["binding"]["rules"]
    assert "named" not in rules and rules["wait_stream"] > 0
    assert ("in_graph" in rules) == (barrier == "fine")
    # fresh copy_done events synced once: which record is theirs the capture does not say
    assert blind.trace.meta["binding"]["unbound"] == {
        "sync: its event is synced once (no ring): its record is not named": 20}
    assert blind.counts["syncs_unbound"] == 20


def test_side_stream_ring_binds_syncs_and_waits_to_the_same_record():
    t = import_kineto(THREADS / "side.kineto.json.gz").trace
    syncs, waits = _waits(t, OpKind.SYNC), _waits(t)
    bound_syncs = [s for s in syncs if s[5] >= 0]
    assert len(bound_syncs) == 7  # the first syncs an event recorded before the capture
    assert {(s[2], s[3] - s[1]) for s in bound_syncs} == {("stream14", -1)}
    main = [w for w in waits if w[0] == "stream7" and w[5] >= 0]
    assert len(main) == 7
    # the main stream waits on the previous step's done, the very record the host syncs
    assert {w[5] for w in main} == {s[5] for s in bound_syncs}
    assert t.meta["binding"]["rules"] == {"wait_stream": 8, "ring": 7, "recorded_event": 7}


def test_binding_uses_only_relations(tmp_path):
    # the same capture with every time shifted by a different amount per event kind binds
    # the same way: no rule reads a time
    cap = read_capture(PROBE / "probe_fine.kineto.json.gz")
    by_corr = {}
    for d in cap.device_events:
        by_corr.setdefault(d.correlation, []).append(d)
    syncs = {s.correlation: s for s in cap.sync_events}
    calls = sorted(cap.runtime_calls, key=lambda c: c.ts)
    a = bind(calls, by_corr, syncs)
    shifted = {c: [replace(d, ts=d.ts + 1e6) for d in ds] for c, ds in by_corr.items()}
    b = bind(calls, shifted, {c: replace(s, ts=-s.ts) for c, s in syncs.items()})
    assert a.record_of == b.record_of and a.rule == b.rule and a.stream == b.stream
    # the record calls bound to are kept with the binding (the values of record_of)
    assert a.bound_records == set(a.record_of.values()) and len(a.bound_records) > 1


def test_launches_by_corr_hold_one_op_as_its_record_and_several_in_file_order():
    def dev(corr, stream, ts):
        return DeviceEvent("kernel", f"k{ts}", 0, stream, float(ts), 1.0, corr)

    events = [dev(5, 7, 3), dev(9, 7, 1), dev(-1, 13, 2), dev(5, 20, 0), dev(5, 7, 4)]
    by_corr, streams = launches_by_corr(events)
    assert list(streams) == [(0, 7), (0, 13), (0, 20)]  # in order of first appearance
    assert list(by_corr) == [5, 9]  # no entry for device work without a launch
    assert by_corr[9] is events[1]  # one op: the record itself, no tuple
    assert by_corr[5] == (events[0], events[3], events[4])  # several: a tuple, file order
    assert launch_work(by_corr[9]) == (events[1],)
    assert launch_work(by_corr[5]) is by_corr[5]


# --------------------------------------------------------------------------- threads
def test_launches_from_every_thread_are_tied_to_their_kernels():
    imp = import_kineto(THREADS / "all.kineto.json.gz")
    t = imp.trace
    kern = np.flatnonzero(t.ops.kind == OpKind.KERNEL)
    assert (t.ops.call[kern] >= 0).all()
    lanes = Counter(t.spans.decoded("lane")[t.ops.call[kern]].tolist())
    assert set(lanes) == {"cpu", "thread535", "thread1581455680"}
    calls = t.ops.call[kern]
    assert set(t.spans.call[calls].tolist()) == {Call.LAUNCH}
    # the scheduler is the thread with the step ranges, though autograd's launched more
    threads = imp.primary.launch_threads
    assert threads[0][0] == "pt_autograd_0" and threads[0][2] > dict(
        (n, k) for n, _, k in threads)["python"]
    assert t.meta["host_thread_name"] == "python"
    assert t.meta["host_thread_reason"] == "the thread with the step ranges"
    assert len(t.meta["step_names"]) == 8
    # no other thread's host call is CPU blocked time of the scheduler
    blocked = t.spans.kind == 2
    assert set(t.spans.decoded("lane")[blocked].tolist()) <= {"cpu"}
    # --fit maps the scheduler thread's ranges
    assert {a[0] for a in imp.annotations} >= {"forward", "backward", "optimizer"}


def test_report_names_the_threads_that_launch(capsys):
    assert main(["import", str(THREADS / "all.kineto.json.gz"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert ("  launching threads   pt_autograd_0 176 launches, thread 1581455680 152 launches, "
            "python 144 launches") in out
    assert "  scheduler thread    python (tid 510: the thread with the step ranges)" in out


def test_synthetic_other_thread_launches_are_host_wait_as_hta_says(tmp_path):
    sim = simulate(None, {"steps": 20, "warmup_steps": 2}, engine="simpy")
    one = import_kineto(write_kineto(sim.trace, tmp_path / "one.json"))
    two = import_kineto(write_kineto(sim.trace, tmp_path / "two.json",
                                     launch_threads={"verify": 5555}))
    _, r1 = import_report(one)
    _, r2 = import_report(two)
    assert r1["idle"] == r2["idle"]  # who launched does not change when it launched
    # per step the verify graph launch and its eager load_batch launch
    assert two.counts["launches_other_threads"] == 40 and two.counts["device_without_launch"] == 0
    np.testing.assert_array_equal(analyze(one.trace)[0].step_us, analyze(two.trace)[0].step_us)


# --------------------------------------------------------------------------- ranks
def _two_runs():
    a = simulate(None, {"steps": 20, "warmup_steps": 2}, engine="simpy")
    b = simulate(None, {"steps": 20, "warmup_steps": 2, "policy.barrier": "coarse",
                        "cpu.schedule_us": 2700}, engine="simpy")
    return a, b


def test_two_processes_in_one_file_import_as_two_ranks(tmp_path):
    a, b = _two_runs()
    # two ranks on GPUs 0 and 1 with the same stream ids, their correlation ids overlapping
    path = write_kineto_processes([a.trace, b.trace], tmp_path / "two.json", [100, 200],
                                  devices=[0, 1], offsets=[0, 37])
    imp = import_kineto(path, {"process": 200})
    assert [r.pid for r in imp.ranks] == [100, 200] and imp.trace is imp.ranks[1].trace
    for run, rank, single in ((a, imp.ranks[0], "a.json"), (b, imp.ranks[1], "b.json")):
        alone = import_kineto(write_kineto(run.trace, tmp_path / single))
        # the same device and stream ids, the same correlation ids: still each its own
        assert rank.counts["kernel"] == alone.counts["kernel"]
        got, want = analyze(rank.trace)[0], analyze(alone.trace)[0]
        np.testing.assert_allclose(got.step_us, want.step_us)
        np.testing.assert_allclose(got.fwd_gap_us, want.fwd_gap_us)
    combined = imp.combined
    assert {m["process"] for m in combined.meta["ranks"]} == {100, 200}
    assert "r0.cpu" in combined.lanes() and "r1.stream7" in combined.lanes()
    assert imp.ranks[1].trace.meta["lanes"]["stream7"] == "1:7"
    assert len(combined.ops) == sum(len(r.trace.ops) for r in imp.ranks)
    kern = combined.ops.kind == OpKind.KERNEL
    assert (combined.ops.call[kern] >= 0).all()
    lanes = combined.spans.decoded("lane")[combined.ops.call[kern]]
    klanes = combined.ops.decoded("lane")[kern]
    assert all(x.split(".")[0] == y.split(".")[0] for x, y in zip(lanes, klanes))
    n_steps = int((imp.ranks[0].trace.markers.name == imp.ranks[0].trace.code("step")).sum())
    assert imp.skew["steps"] == n_steps and imp.skew["max_us"] > 0


def test_per_rank_files_given_together_with_their_clock_offset(tmp_path, capsys):
    a, b = _two_runs()
    pa = write_kineto(a.trace, tmp_path / "x-TP-0.trace.json")
    pb = write_kineto(b.trace, tmp_path / "x-TP-1.trace.json")
    text = pb.read_text().replace('"baseTimeNanoseconds": 1700000000000000000',
                                  '"baseTimeNanoseconds": 1700000000000500000')
    pb.write_text(text)  # rank 1's clock origin is 500 µs later
    imp = import_kineto([pa, pb])
    assert [r.clock_offset_us for r in imp.ranks] == [0.0, 500.0]
    starts = [r.trace.markers.time_us[r.trace.markers.name == r.trace.code("step")][0]
              for r in imp.ranks]
    assert starts[1] - starts[0] == pytest.approx(500.0)
    assert imp.skew["steps"] == 21 and imp.skew["max_us"] >= 500.0
    assert main(["import", str(pa), str(pb), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "  rank 1              pid 4242 (x-TP-1.trace.json)" in out
    assert "  step-start skew     mean" in out and "over 21 steps" in out


# --------------------------------------------------------------------------- reading
def test_bom_begin_end_pairs_and_display_unit_read_correctly(tmp_path):
    base = import_kineto(SYNTH / "three_steps.json")
    raw = json.loads((SYNTH / "three_steps.json").read_text())
    bom = tmp_path / "bom.json"
    bom.write_bytes(b"\xef\xbb\xbf" + json.dumps({**raw, "displayTimeUnit": "ns"}).encode())
    got = import_kineto(bom)
    assert list(got.trace.ops) == list(base.trace.ops)  # ns display: times stay µs
    assert got.trace.meta["display_time_unit"] == "ns"
    pairs = []
    for e in raw["traceEvents"]:
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            b = {k: v for k, v in e.items() if k != "dur"}
            pairs += [{**b, "ph": "B"}, {"ph": "E", "pid": e["pid"], "tid": e["tid"],
                                         "ts": e["ts"] + e["dur"]}]
        else:
            pairs.append(e)
    be = tmp_path / "be.json"
    be.write_text(json.dumps({**raw, "traceEvents": pairs}))
    got = import_kineto(be)
    assert got.counts["kernel"] == 12 and list(got.trace.ops) == list(base.trace.ops)


def test_hip_runtime_names_mean_their_cuda_calls(tmp_path):
    from simwar.capture.reader import HIP_TO_CUDA

    text = (SYNTH / "three_steps.json").read_text()
    for hip, cuda in (("hipLaunchKernel", "cudaLaunchKernel"), ("hipGraphLaunch",
                      "cudaGraphLaunch"), ("hipEventRecord", "cudaEventRecord"),
                      ("hipStreamWaitEvent", "cudaStreamWaitEvent"),
                      ("hipEventSynchronize", "cudaEventSynchronize"),
                      ("hipMemcpyAsync", "cudaMemcpyAsync"), ("hipMemsetAsync", "cudaMemsetAsync")):
        assert HIP_TO_CUDA[hip] == cuda
        text = text.replace(f'"{cuda}"', f'"{hip}"')
    hip = tmp_path / "hip.json"
    hip.write_text(text)
    a, b = import_kineto(SYNTH / "three_steps.json"), import_kineto(hip)
    assert b.trace.spans.call.tolist() == a.trace.spans.call.tolist()
    strip = [(w[0], w[1], w[2], w[3], w[5]) for w in _waits(b.trace)]
    assert strip == [(w[0], w[1], w[2], w[3], w[5]) for w in _waits(a.trace)]
    assert "hipGraphLaunch" in set(b.trace.spans.decoded("label").tolist())


def test_mtia_device_activity_is_said_in_one_line(tmp_path, capsys):
    events = [{"ph": "X", "cat": "mtia_ccp_events", "name": f"op{i}", "pid": 0, "tid": 3,
               "ts": 10.0 * i, "dur": 5.0} for i in range(4)]
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1,
                   "ts": 0.0, "dur": 40.0})
    path = tmp_path / "mtia.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert main(["import", str(path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out == ("mtia.json: 4 device events of a kind simwar does not model "
                   "(mtia_ccp_events 4: MTIA); simwar reads CUDA and HIP device work only\n")


def test_cuts_between_blocks_never_change_what_is_read(tmp_path):
    raw = json.loads((SYNTH / "three_steps.json").read_text())
    # a name holding the cut pattern, and nested objects in args: false cuts
    raw["traceEvents"][5]["name"] = 'weird}, {"name": "x'
    raw["traceEvents"].insert(3, {"ph": "X", "cat": "cpu_op", "name": "nested", "pid": 1,
                                  "tid": 1, "ts": 1.0, "dur": 1.0,
                                  "args": {"a": [{"b": 1}, {"c": [2, {"d": 3}]}]}})
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(raw, separators=(",", ":")))
    whole = read_capture(path)
    for block in (64, 97, 300, 1000):
        cap = read_capture(path, chunk_bytes=block)
        assert cap.device_events == whole.device_events
        assert cap.runtime_calls == whole.runtime_calls and cap.ignored == whole.ignored
