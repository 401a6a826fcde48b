"""Random valid Programs (tests/programs.py) through every executor and the race detector.

- the fake-backend replay (each call costing its op's own ``host_us``, with the op's own
  wake-up and cross-stream latencies) reproduces the SimPy engine's Trace: every op row,
  span, access and marker, times within ``TOL`` µs; and its value check flags a read only
  on a buffer where the engine observed an overlap;
- no stream runs two operations at once; every stream wait holds its stream until its
  record fired (plus the latency across streams) and every host synchronize returns no
  earlier than its record fired;
- ``simwar.analysis.hazards`` finds exactly the latent races of an independent happens-before
  oracle (ancestor sets over stream order, record→wait edges and host syncs);
- a program whose every conflicting pair is ordered (built constructively) has no latent
  race (and every read of its replay sees the write it should), and dropping one
  ``wait_event`` that was the only path for a pair makes exactly the races through that
  link appear.

Times are compared within ``TOL`` = 1e-9 µs, not exactly: both compute every time with
``simwar.core.rules``, but the replay places a timed graph's nodes by interpolating the graph's
measured span with the nodes' nominal durations (a scale of 1 up to rounding), so a node's
end can differ in the last place; the times themselves are below 2e4 µs.

Every access to the Trace is in the helpers at the top, which return this module's own
row types (the Trace's layout will change; those helpers are all there is to port).
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from hypothesis import event, given, settings
from programs import ordering_links, programs

from simwar.analysis.hazards import detect
from simwar.core.program import Program, WaitEvent, WaitStream
from simwar.core.trace import HOST
from simwar.executors.engine import run
from simwar.harness import make_plan, replay
from simwar.harness.fake import FakeBackend

TOL = 1e-9
WINDOW = 2  # hazards.detect's default step window

RANDOM = settings(max_examples=500, deadline=None, derandomize=True)


# --------------------------------------------------------------------------- Trace access
# The only functions that read a Trace; the tests see these local row types.
class OpRow(NamedTuple):
    """A device-visible op (kernel, record, stream wait, host sync), in issue order."""

    op_id: int
    lane: str
    kind: str
    step: int
    label: str
    event: str
    bound: int  # op id of the record a wait or sync bound to, -1 if none
    issue: float
    start: float
    end: float
    phase: str


class SpanRow(NamedTuple):
    lane: str
    label: str
    kind: str
    step: int
    start: float
    end: float
    phase: str
    site: str


class AccessRow(NamedTuple):
    op_id: int
    buffer: str
    mode: str
    step: int
    phase: str


class MarkerRow(NamedTuple):
    name: str
    step: int
    time: float


def op_rows(trace) -> list[OpRow]:
    return [OpRow(o.op_id, o.lane, o.kind, o.step, o.label, o.event, o.bound, o.issue_us,
                  o.start_us, o.end_us, o.phase) for o in trace.ops]


def span_rows(trace) -> list[SpanRow]:
    """In no set order (the executors emit them in different orders)."""
    return [SpanRow(s.lane, s.label, s.kind, s.step, s.start_us, s.end_us, s.phase, s.site)
            for s in trace.spans]


def access_rows(trace) -> list[AccessRow]:
    return [AccessRow(a.op_id, a.buffer, a.mode, a.step, a.phase) for a in trace.accesses]


def marker_rows(trace) -> list[MarkerRow]:
    return [MarkerRow(m.name, m.step, m.time_us) for m in trace.markers]


def measured_race_buffers(trace) -> set[str]:
    """Buffers of the reads the replay's value check flagged (snapshot != expected stamp)."""
    return {r["buffer"] for r in trace.meta["measured_races"]}


def kernel_intervals(trace) -> dict[str, list[tuple[float, float]]]:
    """Lane -> (start, end) of its kernels, in start order."""
    out: dict[str, list] = {}
    for o in op_rows(trace):
        if o.kind == "kernel":
            out.setdefault(o.lane, []).append((o.start, o.end))
    return {lane: sorted(v) for lane, v in out.items()}


def stream_ops(trace) -> dict[str, list[OpRow]]:
    """Lane -> its stream ops (kernels, records, waits) in issue order."""
    out: dict[str, list] = {}
    for o in op_rows(trace):
        if o.lane != HOST:
            out.setdefault(o.lane, []).append(o)
    return out


def by_id(trace) -> dict[int, OpRow]:
    return {o.op_id: o for o in op_rows(trace)}


# --------------------------------------------------------------------------- helpers
def close(a: float, b: float) -> bool:
    return abs(a - b) <= TOL


OP_TIMES = ("issue", "start", "end")
SPAN_TIMES = ("start", "end")
MARKER_TIMES = ("time",)


def same_row(a: NamedTuple, b: NamedTuple, times: tuple[str, ...]) -> bool:
    """Equal in every field, the ``times`` fields within TOL."""
    return type(a) is type(b) and all(
        close(getattr(a, f), getattr(b, f)) if f in times else getattr(a, f) == getattr(b, f)
        for f in a._fields)


def assert_same_rows(sim: list, real: list, times: tuple[str, ...], what: str) -> None:
    assert len(sim) == len(real), (what, len(sim), len(real))
    for a, b in zip(sim, real):
        assert same_row(a, b, times), (what, a, b)


def assert_same_spans(sim: list[SpanRow], real: list[SpanRow]) -> None:
    """Equal as multisets, times within TOL."""
    assert len(sim) == len(real), (len(sim), len(real))
    left = list(real)
    for a in sim:
        match = next((i for i, b in enumerate(left) if same_row(a, b, SPAN_TIMES)), None)
        assert match is not None, ("span not replayed", a)
        left.pop(match)


def fake_replay(program: Program):
    return replay(make_plan(program), FakeBackend("program"))


class RaceKey(NamedTuple):
    buffer: str
    kind: str  # WAR | RAW | WAW
    first_lane: str
    first_label: str
    first_step: int
    second_lane: str
    second_label: str
    second_step: int


def latent_keys(report) -> Counter:
    """A hazards report's latent races, as a multiset of RaceKeys."""
    return Counter(RaceKey(r.buffer, r.kind, r.first_lane, r.first_label, r.first_step,
                           r.second_lane, r.second_label, r.second_step)
                   for r in report.races if r.latent)


def ancestors(trace) -> dict[int, int]:
    """Op id -> bitmask of the op ids that happen before it (itself included).

    An op's ancestors: itself, its lane predecessor's ancestors, for a wait its bound
    record's, and everything the host had synchronized with when it was issued."""
    anc: dict[int, int] = {}
    last: dict[str, int] = {}
    host = 0
    for o in op_rows(trace):
        if o.kind == "sync":
            if o.bound >= 0:
                host |= anc[o.bound]
            continue
        m = (1 << o.op_id) | host
        if o.lane in last:
            m |= anc[last[o.lane]]
        if o.kind == "wait" and o.bound >= 0:
            m |= anc[o.bound]
        anc[o.op_id] = m
        last[o.lane] = o.op_id
    return anc


def oracle_latent(trace, window: int = WINDOW) -> Counter:
    """Latent races by explicit ancestor sets (bitmasks of op ids), not vector clocks."""
    anc = ancestors(trace)
    ops = by_id(trace)
    per_buffer: dict[str, list[AccessRow]] = {}
    for a in sorted(access_rows(trace)):
        per_buffer.setdefault(a.buffer, []).append(a)
    out: Counter = Counter()
    kinds = {("read", "write"): "WAR", ("write", "read"): "RAW", ("write", "write"): "WAW"}
    for buf, accs in per_buffer.items():
        for j, b in enumerate(accs):
            for a in accs[:j]:
                oa, ob = ops[a.op_id], ops[b.op_id]
                if (a.mode, b.mode) not in kinds or oa.lane == ob.lane:
                    continue
                if abs(a.step - b.step) > window or anc[b.op_id] >> a.op_id & 1:
                    continue
                out[RaceKey(buf, kinds[(a.mode, b.mode)], oa.lane, oa.label, a.step, ob.lane,
                            ob.label, b.step)] += 1
    return out


# --------------------------------------------------------------------------- executors agree
@RANDOM
@given(programs())
def test_fake_replay_reproduces_the_engine(program):
    sim = run(program)
    real = fake_replay(program)
    assert_same_rows(op_rows(sim), op_rows(real), OP_TIMES, "ops")
    assert access_rows(sim) == access_rows(real)
    assert_same_rows(marker_rows(sim), marker_rows(real), MARKER_TIMES, "markers")
    assert_same_spans(span_rows(sim), span_rows(real))
    # a read that saw another stamp than the latest earlier-issued write's was overtaken:
    # the engine observed an overlap on that buffer (any step distance)
    observed = {r.buffer for r in detect(sim, window=10**6).races if r.observed}
    assert measured_race_buffers(real) <= observed


# --------------------------------------------------------------------------- CUDA rules
@RANDOM
@given(programs())
def test_streams_run_one_op_at_a_time_and_waits_and_syncs_are_honoured(program):
    trace = run(program)
    for lane, iv in kernel_intervals(trace).items():
        assert all(a[1] <= b[0] + TOL for a, b in zip(iv, iv[1:])), lane
    ops = by_id(trace)
    lanes = stream_ops(trace)
    # the k-th wait row is the k-th WaitEvent/WaitStream of the program (host issue order)
    latency = iter(op.latency_us for op in program.ops if type(op) in (WaitEvent, WaitStream))
    for o in op_rows(trace):
        assert o.end >= o.start - TOL
        if o.kind != "sync":
            assert o.start >= o.issue - TOL  # nothing runs before its host call returned
            # FIFO: it starts no earlier than the previous op on its stream ended
            prev = [p for p in lanes[o.lane] if p.op_id < o.op_id]
            if prev:
                assert o.start >= prev[-1].end - TOL
        lat = next(latency) if o.kind == "wait" else 0.0
        if o.bound < 0:
            continue
        rec = ops[o.bound]
        assert rec.kind == "record" and rec.op_id < o.op_id
        if o.kind == "wait":
            # held until the record fired (plus the latency across streams) ...
            assert o.end >= rec.end + (lat if rec.lane != o.lane else 0.0) - TOL
            # ... and nothing ran on the stream between reaching the wait and its release
            assert all(p.start >= o.end - TOL for p in lanes[o.lane] if p.op_id > o.op_id)
        else:  # a host sync returns no earlier than the record fired
            assert o.end >= rec.end - TOL
    assert next(latency, None) is None


# --------------------------------------------------------------------------- races
@RANDOM
@given(programs())
def test_hazards_find_exactly_the_oracles_latent_races(program):
    trace = run(program)
    assert latent_keys(detect(trace)) == oracle_latent(trace)


def kernel_ids(trace) -> dict[str, int]:
    """Kernel label -> op id (labels unique)."""
    return {o.label: o.op_id for o in op_rows(trace) if o.kind == "kernel"}


def wait_id(trace, stream: str, event: str) -> int:
    return next(o.op_id for o in op_rows(trace)
                if o.kind == "wait" and o.lane == stream and o.event == event)


@settings(RANDOM, max_examples=500)
@given(programs(max_ops=24, max_steps=3, graphs=False, ordered=True))
def test_ordered_programs_have_no_latent_race_until_a_link_is_dropped(program):
    trace = run(program)
    assert not latent_keys(detect(trace))
    assert not oracle_latent(trace)
    assert not measured_race_buffers(fake_replay(program))  # every read saw its write
    anc = ancestors(trace)
    kid = kernel_ids(trace)
    for index, first, second in ordering_links(program):
        wait = program.ops[index]
        assert type(wait) is WaitEvent
        cut = Program(program.ops[:index] + program.ops[index + 1:], program.streams,
                      program.meta)
        cut_trace = run(cut)
        found = latent_keys(detect(cut_trace))
        assert found == oracle_latent(cut_trace)
        if (first, second) not in {(k.first_label, k.second_label) for k in found}:
            # another path still orders the pair: the link was not its only one
            cut_kid = kernel_ids(cut_trace)
            assert ancestors(cut_trace)[cut_kid[second]] >> cut_kid[first] & 1
            continue
        races = ("1 race", "2 races", "3+ races")[min(len(found), 3) - 1]
        event(f"dropped an only-path link: {races}")
        # every race that appeared went through the dropped link: in the full program its
        # first access happens before the link's record and the link before its second
        w = wait_id(trace, wait.stream, wait.event)
        rec = by_id(trace)[w].bound
        for k in found:
            a, b = kid[k.first_label], kid[k.second_label]
            assert anc[rec] >> a & 1 and anc[b] >> w & 1, k


def test_dropping_the_one_link_makes_exactly_its_race_appear():
    from simwar.core.program import Kernel, Launch, Record, StepMarker

    ops = [StepMarker(0), Launch("s1", Kernel("w", 5.0, writes=("b",)), 0),
           Record("after_w", "s1", 0), WaitEvent("s2", "after_w", 0),
           Launch("s2", Kernel("r", 1.0, reads=("b",)), 0)]
    program = Program(ops, streams=("s1", "s2"))
    assert not latent_keys(detect(run(program)))
    cut = run(Program(ops[:3] + ops[4:], program.streams))
    assert latent_keys(detect(cut)) == Counter({RaceKey("b", "RAW", "s1", "w", 0, "s2", "r", 0): 1})
    assert oracle_latent(cut) == latent_keys(detect(cut))
