"""The Chrome trace-event export: the rules Perfetto needs, checked on the written file itself."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict

import pytest

from simwar.analysis.views import launch_links, ordered_lanes
from simwar.api import simulate
from simwar.cli.app import main
from simwar.core.recorder import Recorder
from simwar.core.trace import HOST, Call, OpKind, Trace
from simwar.plots.perfetto import chrome_trace, write_chrome_trace

SMALL = {"steps": 12, "warmup_steps": 2}


@pytest.fixture(scope="module")
def coarse():
    return simulate(None, {**SMALL, "policy.barrier": "coarse"})


@pytest.fixture(scope="module")
def seq_lens():
    # adds the d2h stream and a seq_lens host block: five lanes
    return simulate(None, {**SMALL, "policy.needs_cpu_seq_lens": True})


def _load(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as fh:
        return json.load(fh)


def check_chrome_trace(doc: dict, trace: Trace) -> None:
    """Every rule the export promises, on a parsed file."""
    events = doc["traceEvents"]
    assert isinstance(events, list) and events

    # one process for the host, one per stream, each named once
    names = {e["pid"]: e["args"]["name"] for e in events
             if e["ph"] == "M" and e["name"] == "process_name"}
    streams = {s.lane for s in trace.spans if s.lane != HOST}
    assert sorted(names.values()) == sorted(["host"] + [f"stream {s}" for s in streams])
    assert len(set(names)) == len(names)
    host_pid = next(p for p, n in names.items() if n == "host")
    pid_of = {("cpu" if n == "host" else n[len("stream "):]): p for p, n in names.items()}
    assert {e["pid"] for e in events} <= set(names)

    # complete slices: float µs timestamps, every span exported on its lane's process
    slices = [e for e in events if e["ph"] == "X"]
    assert len(slices) == len(trace.spans)
    for e in slices:
        assert type(e["ts"]) is float and type(e["dur"]) is float
        assert e["dur"] >= 0
    per_lane = Counter(s.lane for s in trace.spans)
    assert Counter(e["pid"] for e in slices) == Counter({pid_of[k]: v for k, v in per_lane.items()})

    # no overlapping slices on one track
    tracks = defaultdict(list)
    for e in slices:
        tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
    for key, spans in tracks.items():
        spans.sort()
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end - 1e-9, f"overlap on track {key}: {end} > {start}"

    def enclosing(e) -> bool:
        return any(lo <= e["ts"] <= hi for lo, hi in tracks[(e["pid"], e["tid"])])

    # flows: one start and one end per id, each bound inside a slice of its track
    flows = defaultdict(dict)
    for e in events:
        if e["ph"] in ("s", "f"):
            assert e["ph"] not in flows[e["id"]], f"flow {e['id']} has two '{e['ph']}' events"
            flows[e["id"]][e["ph"]] = e
    assert flows
    by_cat = Counter()
    for fid, pair in flows.items():
        assert set(pair) == {"s", "f"}, f"flow {fid} is not a start/end pair"
        assert pair["f"]["bp"] == "e" and pair["s"]["cat"] == pair["f"]["cat"]
        assert enclosing(pair["s"]) and enclosing(pair["f"]), f"flow {fid} binds to no slice"
        assert pair["s"]["ts"] <= pair["f"]["ts"] + 1e-9, f"flow {fid} goes back in time"
        by_cat[pair["s"]["cat"]] += 1
        if pair["s"]["cat"] == "launch":
            assert pair["s"]["pid"] == host_pid and pair["f"]["pid"] != host_pid
        if pair["s"]["cat"] == "record_wait":
            assert pair["s"]["pid"] != host_pid and pair["f"]["pid"] != host_pid
        if pair["s"]["cat"] == "record_sync":
            assert pair["f"]["pid"] == host_pid
    # every kernel was launched by a host call; every stream wait that blocked was released
    assert by_cat["launch"] == sum(1 for s in trace.spans if s.kind == "kernel")
    assert by_cat["record_wait"] >= sum(1 for s in trace.spans if s.kind == "wait")
    assert by_cat["record_sync"] >= 1

    # counter tracks for launch-ahead depth
    counters = [e for e in events if e["ph"] == "C"]
    ahead = [e for e in counters if e["name"] == "launch_ahead"]
    inflight = [e for e in counters if e["name"] == "forwards_in_flight"]
    assert ahead and inflight
    assert all(e["pid"] == host_pid and type(e["ts"]) is float for e in counters)
    assert all(e["args"]["forwards"] >= 0 for e in inflight)


def test_run_trace_option_writes_a_valid_file(tmp_path, coarse):
    out = tmp_path / "run.json"
    rc = main(["run", "--set", "steps=12", "--set", "warmup_steps=2",
               "--set", "policy.barrier=coarse", "--trace", str(out), "--json"])
    assert rc == 0
    doc = _load(out)
    check_chrome_trace(doc, coarse.trace)
    assert doc["otherData"]["barrier_effective"] == "coarse"


def test_gzip_file_with_five_lanes(tmp_path, seq_lens):
    out = write_chrome_trace(seq_lens.trace, tmp_path / "run.json.gz")
    doc = _load(out)
    check_chrome_trace(doc, seq_lens.trace)
    names = [e["args"]["name"] for e in doc["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"]
    assert "stream d2h" in names


def test_launch_ahead_counter_matches_the_metric(coarse):
    doc = chrome_trace(coarse.trace)
    got = {e["ts"]: e["args"]["depth"] for e in doc["traceEvents"]
           if e["ph"] == "C" and e["name"] == "launch_ahead"}
    steps = coarse.steps.dropna(subset=["launch_ahead"])
    want = dict(zip(steps.launch_us.round(3), steps.launch_ahead.astype(int)))
    assert want and {t: got[t] for t in want} == want


def test_launch_links_pair_each_kernel_with_its_call(coarse):
    trace = coarse.trace
    links = launch_links(trace)
    spans = {s.span_id: s for s in trace.spans}
    kernels = [s for s in trace.spans if s.kind == "kernel"]
    assert sorted(spans[link.span] for link in links) == sorted(kernels)
    for link in links:
        api, kernel = spans[link.call], spans[link.span]
        assert kernel.op == link.op
        assert api.lane == HOST and api.kind == "api"
        assert api.call == ("graph_launch" if link.graph else "launch")
        assert api.step == kernel.step
        assert api.end_us <= kernel.start_us
        if link.graph:  # DSPARK's draft and verify are CUDA graphs: prep and body are nodes
            assert api.label == kernel.phase + ".graph"
        else:
            assert api.label == kernel.label
    assert {spans[link.span].label for link in links if link.graph} == {
        "draft.prep", "draft.body", "verify.prep", "verify.body"}


def test_host_calls_and_waits_are_named_by_call_kind_label_and_lane(coarse):
    doc = chrome_trace(coarse.trace)
    names = {e["name"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert {"forward.wait_stream(schedule)", "schedule.wait_stream(forward)",
            "copy.wait_stream(forward)", "record copy_done[5]", "sync copy_done[4]",
            "wait for forward", "wait for schedule"} <= names
    flows = {(e["cat"], e["name"]) for e in doc["traceEvents"] if e["ph"] == "s"}
    assert ("record_sync", "copy_done[4]") in flows and ("launch", "draft.graph") in flows


def _trace(device=(), host=()) -> Trace:
    """A trace of bare kernels: ``device`` (lane, label, start, end) kernel ops with no launch
    call (as a capture can have), ``host`` cpu work."""
    rec = Recorder()
    for lane, label, start, end in device:
        rec.op(OpKind.KERNEL, lane, 0, label, issue=start, start=start, end=end)
    for label, start, end in host:
        rec.host(Call.CPU, 0, start, end, label)
    return rec.finish()


def test_overlapping_spans_are_split_onto_extra_tracks():
    trace = _trace(device=[("forward", "a", 0.0, 10.0),
                           ("forward", "b", 5.0, 12.0),  # overlaps a
                           ("forward", "c", 10.0, 11.0)],  # fits after a on the first track
                   host=[("w", 0.0, 1.0)])
    doc = chrome_trace(trace)
    check_tracks = defaultdict(list)
    for e in doc["traceEvents"]:
        if e["ph"] == "X":
            check_tracks[(e["pid"], e["tid"])].append(e["name"])
    assert sorted(check_tracks.values()) == [["a", "c"], ["b"], ["w"]]
    threads = [e["args"]["name"] for e in doc["traceEvents"]
               if e["ph"] == "M" and e["name"] == "thread_name"]
    assert "forward (overlapping 1)" in threads


def test_timestamps_are_rounded_to_ns_without_creating_overlaps():
    # back-to-back spans whose float ends are not exactly representable
    t = [0.1 * i for i in range(40)]
    doc = chrome_trace(_trace(device=[("forward", f"k{i}", t[i], t[i + 1]) for i in range(39)]))
    xs = sorted((e["ts"], e["dur"]) for e in doc["traceEvents"] if e["ph"] == "X")
    tids = {e["tid"] for e in doc["traceEvents"] if e["ph"] == "X"}
    assert tids == {1}  # nothing needed splitting
    for (ts, dur), (nxt, _) in zip(xs, xs[1:]):
        assert nxt >= ts + dur - 1e-9


def test_lane_order_is_host_then_known_streams():
    assert ordered_lanes({"copy", "zeta", "forward", "cpu", "schedule", "d2h", "plan"}) == [
        "cpu", "schedule", "plan", "forward", "copy", "d2h", "zeta"]
