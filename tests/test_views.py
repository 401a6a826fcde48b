"""Trace views: windows of steps, launch links, lookups by id and display text."""

from __future__ import annotations

import pytest

from simwar.analysis import views
from simwar.api import simulate
from simwar.core.recorder import Recorder
from simwar.core.trace import HOST, Call, OpKind


@pytest.fixture(scope="module")
def fine():
    return simulate(None, {"steps": 12, "warmup_steps": 2})


def test_window_holds_the_ids_of_its_steps(fine):
    trace = fine.trace
    w = views.window(trace, 4, 6)
    spans = list(trace.spans)
    ops = list(trace.ops)
    assert [spans[i] for i in w.spans] == [s for s in spans if 4 <= s.step <= 6]
    assert w.ops.tolist() == [op.op_id for op in ops if 4 <= op.step <= 6]
    # the records its waits and syncs bound to, from earlier steps (a sync of copy_done[3])
    bound = {ops[i].bound for i in w.ops if ops[i].bound >= 0}
    assert set(w.bound_ops.tolist()) == {b for b in bound if not 4 <= ops[b].step <= 6}
    assert w.bound_ops.size and all(ops[b].kind == "record" for b in w.bound_ops)
    markers = list(trace.markers)
    assert {markers[i] for i in w.markers} == {m for m in markers if 4 <= m.step <= 6}
    # an op's span: the span whose op is it (kernel, wait, host block)
    for op in (ops[i] for i in w.ops):
        want = [s.span_id for s in spans if s.op == op.op_id and s.kind in ("kernel", "wait",
                                                                             "blocked")]
        assert w.span_of([op.op_id]).tolist() == (want or [-1])
        assert views.op_spans(trace)[op.op_id] == (want or [-1])[0]


def test_window_of_a_trace_whose_op_steps_are_not_sorted():
    rec = Recorder()
    for step in (2, 0, 1, 2):
        call = rec.host(Call.LAUNCH, step, 0.0, 1.0, f"k{step}", op=rec.next_op)
        rec.op(OpKind.KERNEL, "forward", step, f"k{step}", issue=1.0, start=1.0, end=2.0,
               call=call)
    trace = rec.finish()
    assert views.window(trace, 2, 2).ops.tolist() == [0, 3]
    assert views.window(trace, 0, 1).ops.tolist() == [1, 2]
    # the issuing calls were reordered by step with the spans; ops.call follows them
    assert [trace.text(int(trace.spans.label[c])) for c in trace.ops.call] == \
        ["k2", "k0", "k1", "k2"]


def test_launch_links_and_edges_of_a_window_are_the_traces_restricted(fine):
    trace = fine.trace
    w = views.window(trace, 3, 5)
    steps = trace.ops.step
    every = views.launch_links(trace)
    assert views.launch_links(w) == [link for link in every if 3 <= steps[link.op] <= 5]
    assert all(trace.spans.op[link.span] == link.op for link in every)
    assert views.edges(w) == [e for e in trace.edges() if 3 <= steps[e.dst] <= 5]
    node = trace.graph_node()
    assert views.graph_node(w).tolist() == node[w.ops].tolist()
    assert {trace.text(int(trace.ops.label[link.op])) for link in every if link.graph} == {
        "draft.prep", "draft.body", "verify.prep", "verify.body"}


def test_lane_lookups(fine):
    trace = fine.trace
    ops = list(trace.ops)
    for lane in ("forward", "schedule", "copy", HOST):
        assert views.lane_ops(trace, lane).tolist() == [op.op_id for op in ops if op.lane == lane]
    k = next(op.op_id for op in ops if op.label == "result_copy" and op.step == 5)
    prev = max(op.op_id for op in ops if op.lane == "copy" and op.kind == "kernel"
               and op.op_id < k)
    assert views.previous_kernel(trace, k) == prev and views.next_kernel(trace, prev) == k
    spans = list(trace.spans)
    t0, t1 = spans[100].start_us, spans[100].start_us + 3000.0
    for lane in ("forward", HOST):
        want = sorted(s.span_id for s in spans if s.lane == lane and s.end_us >= t0
                      and s.start_us <= t1)
        assert sorted(views.lane_spans(trace, lane, t0, t1).tolist()) == want
    assert views.spans_between(trace, t0, t1).tolist() == sorted(
        s.span_id for s in spans if s.end_us >= t0 and s.start_us <= t1)


def test_display_text_from_call_kind_label_and_lane(fine):
    trace = fine.trace
    spans = [s for s in trace.spans if s.step == 5]
    calls = {views.call_text(trace, s.span_id) for s in spans if s.kind in ("api", "blocked")}
    assert {"forward.wait_stream(schedule)", "copy.wait_stream(forward)",
            "schedule.wait_event(verify.read_done)", "record copy_done[5]",
            "sync copy_done[4]", "draft.graph", "sample.body"} <= calls
    waits = {views.span_text(trace, s.span_id) for s in spans if s.kind == "wait"}
    assert waits == {"wait for forward", "wait for verify.read_done"}
    kernel = next(s for s in spans if s.kind == "kernel")
    assert views.span_text(trace, kernel.span_id) == kernel.label


def test_lanes_in_display_order(fine):
    assert views.lanes(fine.trace) == ["cpu", "schedule", "forward", "copy"]
    assert views.ordered_lanes({"zeta", "copy", "cpu", "plan"}) == ["cpu", "plan", "copy", "zeta"]
    rec = Recorder()
    rec.op(OpKind.KERNEL, "forward", 0, "k", start=0.0, end=1.0)
    rec.op(OpKind.RECORD, "d2h", 0, "e", event="e")
    trace = rec.finish()
    assert views.lanes(trace) == ["cpu", "forward", "d2h"]
    assert views.lanes(trace, ops=False) == ["cpu", "forward"]
