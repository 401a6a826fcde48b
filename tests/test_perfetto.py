"""The Chrome trace-event export: the rules Perfetto needs, checked on the written file itself."""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from programs import programs

from simwar.analysis.views import launch_links, ordered_lanes
from simwar.api import simulate
from simwar.cli.app import main
from simwar.core.recorder import Recorder
from simwar.core.trace import HOST, Call, OpKind, Trace
from simwar.executors.engine import Engine
from simwar.plots.jsoncols import (
    Text,
    compose,
    escaped,
    int_text,
    number_text,
    rows,
    write_rows,
)
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


# --------------------------------------------------------------------------- equivalence
def canonical(doc: dict):
    """A document's content, whatever the order of its events and the ids of its flows:
    every non-flow event, and every flow as its start and end without the id."""
    events = doc["traceEvents"]
    plain = Counter(json.dumps(e, sort_keys=True) for e in events if e["ph"] not in "sf")
    pairs: dict = defaultdict(dict)
    for e in events:
        if e["ph"] in "sf":
            pairs[e["id"]][e["ph"]] = {k: v for k, v in e.items() if k != "id"}
    flows = Counter(json.dumps([p.get("s"), p.get("f")], sort_keys=True)
                    for p in pairs.values())
    return plain, flows, doc["otherData"], doc["displayTimeUnit"]


def streamed(cfg, chunk: int, margin: int = 2, steps=None) -> dict:
    import io

    from simwar.api import resolve_sizes
    from simwar.executors.fast import trace as T
    from simwar.executors.fast.plan import plan_config
    from simwar.plots.perfetto import ChromeTraceWriter

    plan = plan_config(cfg, resolve_sizes(cfg))
    out = io.BytesIO()
    writer = ChromeTraceWriter(out, T.lanes(plan), T.meta(plan), steps)
    for w in T.windows(plan, chunk=chunk, margin=margin, steps=steps):
        writer.add(w)
    writer.close()
    return json.loads(out.getvalue())


EQUIVALENCE = [
    ("dspark_coarse", {}), ("dspark_fine", {"policy.needs_cpu_seq_lens": True}),
    ("dflash_legacy_host_sync", {}), ("eagle_fine", {"policy.plan_stream": True}),
    ("none_coarse_loop_top", {}), ("dspark_fine_bimodal", {}),
    ("dspark_fine", {"cpu.schedule_us": {"dist": "lognormal", "mean": 900, "std": 300},
                     "costs.host_call_us": {"dist": "normal", "mean": 2, "std": 3},
                     "costs.cross_stream_us": {"dist": "uniform", "low": 0, "high": 30}}),
]


@pytest.mark.parametrize("name,over", EQUIVALENCE, ids=[n for n, _ in EQUIVALENCE])
def test_the_export_holds_the_events_of_simwar_0_1s(name, over):
    from perfetto_reference import chrome_trace as reference

    from simwar.config import load_config

    cfg = load_config(f"configs/{name}.yaml", {"steps": 50, "warmup_steps": 5, **over})
    trace = simulate(cfg, engine="simpy").trace
    want = canonical(reference(trace))
    assert canonical(chrome_trace(trace)) == want  # a whole Trace, one window
    for chunk in (3, 16):  # the run streamed by the fast executor's trace mode
        assert canonical(streamed(cfg, chunk)) == want


def test_a_window_of_steps_exports_those_steps_only():
    from simwar.config import load_config

    cfg = load_config("configs/dspark_coarse.yaml", {"steps": 200, "warmup_steps": 5})
    doc = streamed(cfg, 16, steps=(40, 60))
    xs = [e for e in doc["traceEvents"] if e["ph"] in "Xi"]
    assert {e["args"]["step"] for e in xs} == set(range(40, 61))
    flows = [e for e in doc["traceEvents"] if e["ph"] in "sf"]
    assert flows and all(40 <= e["args"]["step"] <= 60 for e in flows)
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert len([e for e in counters if e["name"] == "launch_ahead"]) == 21


@settings(max_examples=60, deadline=None)
@given(programs(max_ops=40, max_steps=6))
def test_random_programs_export_as_simwar_0_1_did(program):
    from perfetto_reference import chrome_trace as reference

    trace = Engine(program).run()
    assert canonical(chrome_trace(trace)) == canonical(reference(trace))


@pytest.mark.slow
@pytest.mark.parametrize("written_mb", [1, 40])
def test_ctrl_c_during_the_export_exits_130_and_leaves_nothing(tmp_path, written_mb):
    # the export is the run simulated again in trace mode and written as it goes; SIGINT
    # sent once that much of the file is written must stop it (it was lost 4 times in 11
    # when numpy swallowed the KeyboardInterrupt), remove the temporary and exit 130
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "t.json"
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from simwar.cli import main; "
                             "sys.exit(main())", "run", "--set", "steps=600000", "--trace",
                             str(out), "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        temps = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
        if temps and temps[0].stat().st_size >= written_mb << 20:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the export ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.decode().strip() == "simwar: interrupted"
    assert os.listdir(tmp_path) == []


def test_run_trace_shows_its_writing_on_a_terminal(tmp_path, monkeypatch, capsys):
    import io
    import sys

    import simwar.cli.common as common
    import simwar.cli.run as cli_run

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    # the run's bar (the file written in its pass) and the writer's (written after a run)
    monkeypatch.setattr(common, "BAR_DELAY_S", 0)
    monkeypatch.setattr(cli_run, "PROGRESS_DELAY_S", 0.0)
    out = tmp_path / "x.json.gz"
    for quiet, shown in (([], True), (["--quiet"], False)):
        monkeypatch.setattr(sys, "stderr", Terminal())
        assert main(["run", "--set", "steps=400", "--set", "warmup_steps=5", "--engine", "fast",
                     "--trace", str(out), *quiet]) == 0
        assert ("writing x.json.gz" in sys.stderr.getvalue()) is shown
        assert "100%" in sys.stderr.getvalue() or not shown
    capsys.readouterr()


@settings(max_examples=60, deadline=None)
@given(ints=st.lists(st.integers(-10**12, 10**15), min_size=1, max_size=40),
       names=st.lists(st.text(max_size=6), min_size=1, max_size=40),
       ns=st.lists(st.integers(-10**9, 10**15), min_size=1, max_size=40))
def test_fixed_width_rows_parse_as_json_dumps_writes(ints, names, ns):
    # every field padded to its column's widest value: the text parses to json.dumps's;
    # written a piece at a time, the same bytes
    n = min(len(ints), len(names), len(ns))
    ints, names, ns = ints[:n], names[:n], np.asarray(ns[:n], dtype=np.int64)
    table = escaped(sorted(set(names)))
    code = {s: i for i, s in enumerate(sorted(set(names)))}
    name = Text(table, [code[s] for s in names])
    x = ns / 1000.0
    parts = (',{"n":"', name.inside(), '","i":', int_text(ints), ',"t":',
             *number_text(ns, x, ',"w":"'), compose("<", name, ">").inside(), '"}')
    block = rows(*parts)
    assert len({len(r) for r in block}) == 1  # one width
    for piece in (1, len(block[0]) * 3 - 1, 1 << 20):  # a row, two, all: the same bytes
        written = []
        write_rows(lambda b, kept=written: kept.append(bytes(b)), *parts, piece=piece)
        assert b"".join(written) == block.tobytes()
        assert len(written) == -(-n // max(1, piece // len(block[0])))
    got = json.loads("[" + block.tobytes().decode()[1:] + "]")
    want = [{"n": s, "i": i, "t": round(float(v), 3), "w": f"<{s}>"}
            for s, i, v in zip(names, ints, x)]
    assert got == want
    assert json.dumps(got) == json.dumps(want)  # the same floats, to the last digit


@pytest.mark.parametrize("values", [
    [7] * 5, [123456789] * 3, [0, 0], [0, 9, 10, 9999, 10000, 10001, 100000000, 1],
    [10 ** 8, 99999999 + 10 ** 8, 123456789], [10000, 99999], [1000, 9999], [0, 10 ** 12],
    [5, 10 ** 8 + 5, 10 ** 4 * 7], [10 ** 17, 10 ** 18 - 1],
])
def test_integer_columns_of_one_value_one_width_or_many(values):
    # the ways a column of integers is made (one value repeated; every value of the widest
    # width, so each quad below the first is all digits; widths mixed, zeros and all)
    got = json.loads("[" + rows(",[", int_text(values), "]").tobytes().decode()[1:] + "]")
    assert got == [[v] for v in values]


@pytest.mark.parametrize("ns", [[1000, 2000, 123456000], [999, 1999, 10 ** 12 + 999],
                                [500, 1500], [1000, 1500, 1999], [0, 0]])
def test_times_of_one_fraction_or_many_write_as_json_dumps(ns):
    # a column whose digits after the point are one text (whole µs, or all one inset from
    # them) is written in the rows' constant text: the same text as json.dumps's
    ns = np.asarray(ns, dtype=np.int64)
    x = ns / 1000.0
    text = rows(",[", *number_text(ns, x, "]")).tobytes().decode()
    assert text.replace(" ", "") == "".join(f",[{json.dumps(v)}]" for v in x.tolist())


def test_windows_of_one_structure_share_their_shape_and_write_the_same_bytes(monkeypatch):
    # a steady run streams windows whose span and op columns are equal, codes and all (only
    # times, steps and the texts of step-named strings differ): the writer derives their
    # groups, names' recipes and flows' bindings once, and must write the bytes of a writer
    # that derives them window by window
    import dataclasses
    import io

    from simwar.api import resolve_sizes
    from simwar.config import load_config
    from simwar.executors.fast import trace as T
    from simwar.executors.fast.plan import plan_config
    from simwar.plots import perfetto
    from simwar.plots.perfetto_shape import WindowShape

    cfg = load_config("configs/dspark_fine.yaml", {"steps": 120, "warmup_steps": 5})
    plan = plan_config(cfg, resolve_sizes(cfg))
    windows = list(T.windows(plan, chunk=8, margin=2))
    made = []

    class Counted(WindowShape):
        def __init__(self, w, pid_of):
            made.append(w)
            super().__init__(w, pid_of)

    def export() -> bytes:
        out = io.BytesIO()
        writer = perfetto.ChromeTraceWriter(out, T.lanes(plan), T.meta(plan))
        for w in windows:
            writer.add(w)
        writer.close()
        return out.getvalue()

    monkeypatch.setattr(perfetto, "WindowShape", Counted)
    shared = export()
    # 17 windows: the first three (the run's start, the margin growing), twelve of one
    # structure, the last two
    assert len(windows) == 17 and len(made) == 5
    made.clear()
    monkeypatch.setattr(Counted, "matches", lambda self, w: False)
    assert export() == shared and len(made) == len(windows)
    # a window of the same codes whose lane is another stream is not of the shape
    a, b = windows[4], windows[5]
    shape = WindowShape(a, {})
    assert shape.matches(b)
    lane = int(b.ops.lane[b.core_op])
    strings = list(b.strings)
    strings[lane] = strings[lane] + "_other"
    assert not shape.matches(dataclasses.replace(b, strings=strings))


@settings(max_examples=300, deadline=None)
@given(st.integers(-(2 ** 43) + 3, 2 ** 43 - 3), st.integers(0, 10 ** 9),
       st.sampled_from([0, 1, 2, 3, 999, 1000, 1001]))
def test_a_flow_sits_one_ns_inside_a_span_of_two_ns_or_more(start, span, small):
    """The writer's flow times in integer arithmetic: for times below 2**43 ns, ``round(x,
    3)`` of a rounded time moved in by ``min(0.001, dur / 2)`` µs is 1 ns in from its end
    (or start) once the span is 2 ns or more; shorter spans take the float formula."""
    from simwar.plots.jsoncols import round_ns

    end = min(start + (span if span % 3 else small), 2 ** 43 - 1)
    a, b = np.array([start / 1000.0]), np.array([end / 1000.0])
    inset = np.minimum(10 ** -3, (b - a) / 2)
    at_end, at_start = int(round_ns(b - inset)[0]), int(round_ns(a + inset)[0])
    assert at_end == int(f"{round(end / 1000.0 - float(inset[0]), 3):.3f}".replace(".", ""))
    if end - start >= 2:
        assert (at_end, at_start) == (end - 1, start + 1)


@pytest.mark.parametrize("piece", [1, 200, 1 << 20])
def test_rows_made_in_a_direct_writers_buffer_are_the_rows(tmp_path, monkeypatch, piece):
    # write_rows_into makes each piece where a DirectWriter gathers the file's bytes: pieces
    # cut at the buffer's end, a row across it written; the file is rows()'s bytes
    import fcntl

    from simwar.core import direct_io
    from simwar.plots.jsoncols import write_rows_into

    monkeypatch.setattr(direct_io, "CHUNK", 2 * direct_io.ALIGN)  # many buffers' ends
    ints = np.arange(5000) * 7919 % 100003
    table = escaped(["a", "bcd", 'e"f'])
    parts = (',{"n":"', Text(table, ints % 3).inside(), '","i":', int_text(ints), ',"t":',
             *number_text(ints * 1001, ints * 1.001, "}"))
    path = tmp_path / "rows.bin"
    with open(path, "wb") as handle:
        handle.write(b"[")  # an offset that is no whole row
        handle.flush()
        out = direct_io.DirectWriter(handle.fileno(), fcntl.fcntl(handle.fileno(),
                                                                  fcntl.F_GETFL))
        try:
            out.write(b"x" * 100)
            write_rows_into(out, *parts, piece=piece)
            write_rows_into(out, *parts[:2], '"}', piece=piece)
            out.finish()
        finally:
            out.close()
    want = b"[" + b"x" * 100 + rows(*parts).tobytes() + rows(*parts[:2], '"}').tobytes()
    assert path.read_bytes() == want


def test_a_failure_while_rows_are_made_in_the_buffer_is_that_failure(tmp_path, monkeypatch):
    # an interrupt while a piece is made in a DirectWriter's buffer: the interrupt reaches the
    # caller (no BufferError for the views its traceback holds), and the writer still closes
    import fcntl

    from simwar.core import direct_io
    from simwar.plots import jsoncols

    real, calls = jsoncols._fill, []

    def fill(*args):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        real(*args)

    monkeypatch.setattr(jsoncols, "_fill", fill)
    with open(tmp_path / "rows.bin", "wb") as handle:
        out = direct_io.DirectWriter(handle.fileno(), fcntl.fcntl(handle.fileno(),
                                                                  fcntl.F_GETFL))
        with pytest.raises(KeyboardInterrupt):
            try:
                jsoncols.write_rows_into(out, ",", int_text(np.arange(5000)), piece=100)
            finally:
                out.close()
