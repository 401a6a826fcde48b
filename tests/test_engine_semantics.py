"""The CUDA rules of docs/design.md, one hand-built Program each, with exact times; and the
engine's invariants on random single-step programs (tests/programs.py)."""

from __future__ import annotations

import subprocess
import sys

from hypothesis import given, settings
from programs import programs

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
from simwar.executors.engine import run


def K(label, us, **kw):
    return Kernel(label, us, **kw)


def kernels(trace, lane=None):
    return {(s.lane, s.label): (s.start_us, s.end_us) for s in trace.spans
            if s.kind == "kernel" and (lane is None or s.lane == lane)}


def test_streams_are_fifo_and_concurrent():
    t = run(Program([Launch("a", K("a1", 5), 0), Launch("a", K("a2", 3), 0),
                     Launch("b", K("b1", 4), 0)]))
    assert kernels(t) == {("a", "a1"): (0, 5), ("a", "a2"): (5, 8), ("b", "b1"): (0, 4)}


def test_host_call_cost_delays_the_device_and_the_host():
    t = run(Program([Launch("a", K("a1", 5), 0, host_us=2), CpuWork("w", 10, 0),
                     Launch("a", K("a2", 1), 0, host_us=2)]))
    # a1 visible when its launch call returns (2); a2 after 2 + 10 + 2
    assert kernels(t) == {("a", "a1"): (2, 7), ("a", "a2"): (14, 15)}


def test_record_captures_the_tail_at_the_host_call():
    # the record is issued after a1 but before a2: the wait releases at a1's end, not a2's
    t = run(Program([Launch("a", K("a1", 5), 0), Record("e", "a", 0), Launch("a", K("a2", 50), 0),
                     WaitEvent("b", "e", 0), Launch("b", K("b1", 1), 0)]))
    assert kernels(t)[("b", "b1")] == (5, 6)


def test_wait_binds_to_latest_record_issued_before_it_and_rerecord_moves_it():
    ops = [Launch("a", K("a1", 5), 0), Record("e", "a", 0),
           Launch("a", K("a2", 10), 0), Record("e", "a", 0),   # re-record: capture moves to 15
           WaitEvent("b", "e", 0), Launch("b", K("b1", 1), 0),
           Launch("a", K("a3", 100), 0), Record("e", "a", 0),  # issued after the wait: ignored
           ]
    t = run(Program(ops))
    assert kernels(t)[("b", "b1")] == (15, 16)


def test_wait_on_never_recorded_event_is_a_noop():
    t = run(Program([Launch("a", K("a1", 5), 0), WaitEvent("b", "never", 0),
                     Launch("b", K("b1", 1), 0)]))
    assert kernels(t)[("b", "b1")] == (0, 1)
    wait = next(o for o in t.ops if o.kind == "wait")
    assert wait.bound == -1


def test_wait_stream_waits_for_the_tail_at_the_call():
    t = run(Program([Launch("a", K("a1", 5), 0), WaitStream("b", "a", 0),
                     Launch("a", K("a2", 50), 0), Launch("b", K("b1", 1), 0)]))
    assert kernels(t)[("b", "b1")] == (5, 6)


def test_cross_stream_latency_applies_only_across_streams_and_only_when_waiting():
    t = run(Program([Launch("a", K("a1", 5), 0), WaitStream("b", "a", 0, latency_us=3),
                     Launch("b", K("b1", 1), 0)]))
    assert kernels(t)[("b", "b1")] == (8, 9)
    # already satisfied long ago: no added latency
    t = run(Program([Launch("a", K("a1", 5), 0), Record("e", "a", 0), CpuWork("w", 20, 0),
                     WaitEvent("b", "e", 0, latency_us=3), Launch("b", K("b1", 1), 0)]))
    assert kernels(t)[("b", "b1")] == (20, 21)
    # same stream: FIFO already orders it
    t = run(Program([Launch("a", K("a1", 5), 0), Record("e", "a", 0),
                     WaitEvent("a", "e", 0, latency_us=3), Launch("a", K("a2", 1), 0)]))
    assert kernels(t)[("a", "a2")] == (5, 6)


def test_in_graph_node_fires_when_reached_and_is_rearmed_by_each_launch():
    g = (K("prep", 4), GraphRecord("marker"), K("body", 10))
    ops = [GraphLaunch("f", "g", g, 0), WaitEvent("s", "marker", 0), Launch("s", K("w0", 1), 0),
           GraphLaunch("f", "g", g, 1), WaitEvent("s", "marker", 1), Launch("s", K("w1", 1), 1)]
    t = run(Program(ops))
    spans = [(s.label, s.step, s.start_us, s.end_us) for s in t.spans if s.kind == "kernel"]
    assert ("w0", 0, 4, 5) in spans  # after launch 0's prep
    assert ("w1", 1, 18, 19) in spans  # launch 1's node: 14 + 4


def test_synchronize_blocks_until_the_event_plus_wake_latency():
    t = run(Program([Launch("a", K("a1", 100), 0), Record("e", "a", 0),
                     Synchronize("e", 0, "site", host_us=1, wake_us=7), CpuWork("after", 5, 0)]))
    blocked = next(s for s in t.spans if s.kind == "blocked")
    assert (blocked.start_us, blocked.end_us, blocked.site) == (0, 107, "site")
    after = next(s for s in t.spans if s.label == "after")
    assert after.start_us == 107


def test_synchronize_on_a_completed_event_costs_only_the_call():
    t = run(Program([Launch("a", K("a1", 5), 0), Record("e", "a", 0), CpuWork("w", 50, 0),
                     Synchronize("e", 0, "site", host_us=1, wake_us=7)]))
    blocked = next(s for s in t.spans if s.kind == "blocked")
    assert (blocked.start_us, blocked.end_us) == (50, 51)


def test_host_runs_ahead_of_the_gpu_until_a_sync():
    # the host issues three 100 µs kernels in 3 µs, then blocks on the last
    ops = [StepMarker(0)]
    for i in range(3):
        ops += [Launch("f", K(f"k{i}", 100), 0, host_us=1)]
    ops += [Record("e", "f", 0), Synchronize("e", 0, "end")]
    t = run(Program(ops))
    k = kernels(t)
    assert k[("f", "k0")] == (1, 101) and k[("f", "k2")] == (201, 301)
    assert next(s for s in t.spans if s.kind == "blocked").end_us == 301


def test_engine_imports_no_heavy_modules():
    code = ("import sys, simwar.executors.engine; "
            "bad = [m for m in ('pandas', 'yaml', 'matplotlib', 'torch', 'pydantic') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# ---------------------------------------------------------------------------- invariants
@settings(max_examples=150, deadline=None)
@given(programs(max_ops=25, max_steps=1))
def test_invariants_hold_for_random_programs(program):
    trace = run(program)
    # every device op ran, and nothing overlaps on a stream
    assert all(o.start_us >= 0 and o.end_us >= o.start_us for o in trace.ops)
    for lane in program.streams:
        k = sorted((o.start_us, o.end_us) for o in trace.ops if o.lane == lane)
        assert all(a[1] <= b[0] + 1e-9 for a, b in zip(k, k[1:]))
    by_id = {o.op_id: o for o in trace.ops}
    for o in trace.ops:
        if o.kind != "sync":
            assert o.start_us >= o.issue_us - 1e-9  # nothing runs before its host call returned
        if o.bound >= 0:  # waits and syncs release only after the record they bound to
            assert o.end_us >= by_id[o.bound].end_us - 1e-9
            assert by_id[o.bound].op_id < o.op_id  # bound to a record issued before
    # host spans never overlap (one thread)
    host = sorted((s.start_us, s.end_us) for s in trace.spans if s.lane == "cpu")
    assert all(a[1] <= b[0] + 1e-9 for a, b in zip(host, host[1:]))
    # deterministic
    again = run(program)
    assert list(again.ops) == list(trace.ops) and list(again.spans) == list(trace.spans)
