"""The Chrome trace export as simwar 0.1 wrote it (one dict per event, the whole Trace at
once): the oracle of ``tests/test_perfetto.py``, which holds the streaming exporter of
:mod:`simwar.plots.perfetto` to the same events, flows, names and counters."""

from __future__ import annotations

import bisect

import numpy as np

from simwar.analysis import views
from simwar.analysis.views import launch_links
from simwar.core.trace import CALLS, HOST, SPAN_KINDS, Call, OpKind, SpanKind, Trace

HOST_PID = 1
_TS_DIGITS = 3  # ns resolution: Perfetto stores integer ns


def _t(x: float) -> float:
    return float(round(x, _TS_DIGITS))


def _split_tracks(rows: list[tuple[float, float, int]]) -> list[list[tuple[float, float, int]]]:
    """Greedy interval partitioning of ``(start, end, span id)`` rows on their written times:
    each track's slices never overlap."""
    tracks: list[list[tuple[float, float, int]]] = []
    ends: list[float] = []
    for row in sorted(rows):
        for i, end in enumerate(ends):
            if row[0] >= end:
                tracks[i].append(row)
                ends[i] = row[1]
                break
        else:
            tracks.append([row])
            ends.append(row[1])
    return tracks


def _names(trace: Trace) -> list[str]:
    """Each span's slice name: host calls and waits composed (views.span_text), others' labels."""
    spans = trace.spans
    names = spans.decoded("label").tolist()
    calls = spans.call
    compose = np.flatnonzero(((calls != Call.NONE) & (calls != Call.CPU))
                             | (spans.kind == SpanKind.WAIT))
    for s in compose.tolist():
        names[s] = views.span_text(trace, s)
    return names


def chrome_trace(trace: Trace) -> dict:
    """The trace as a Chrome trace-event JSON object (see the module docstring)."""
    spans, ops = trace.spans, trace.ops
    lanes = views.lanes(trace)
    pid = {lane: HOST_PID + i for i, lane in enumerate(lanes)}
    events: list[dict] = []
    names = _names(trace)
    starts = [_t(x) for x in spans.start_us.tolist()]
    ends = [_t(x) for x in spans.end_us.tolist()]
    steps, kinds = spans.step.tolist(), spans.kind.tolist()
    phases, sites, calls = spans.phase.tolist(), spans.site.tolist(), spans.call.tolist()
    text = trace.text
    by_lane: dict[str, list[int]] = {}
    for s, code in enumerate(spans.lane.tolist()):
        by_lane.setdefault(text(code), []).append(s)

    # where each span landed: (pid, tid) by span id; used to bind flows
    where: list[tuple[int, int] | None] = [None] * len(spans)
    for i, lane in enumerate(lanes):
        p = pid[lane]
        pname = "host" if lane == HOST else f"stream {lane}"
        events.append({"ph": "M", "name": "process_name", "pid": p, "tid": 0,
                       "args": {"name": pname}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": p, "tid": 0,
                       "args": {"sort_index": i}})
        rows = [(starts[s], ends[s], s) for s in by_lane.get(lane, [])]
        tracks = _split_tracks(rows) or [[]]
        for j, track in enumerate(tracks):
            tid = j + 1
            tname = lane if j == 0 else f"{lane} (overlapping {j})"
            events.append({"ph": "M", "name": "thread_name", "pid": p, "tid": tid,
                           "args": {"name": tname}})
            for start, end, s in track:
                where[s] = (p, tid)
                kind = SPAN_KINDS[kinds[s]]
                args = {"step": steps[s], "kind": kind}
                phase, site = text(phases[s]), text(sites[s])
                if phase:
                    args["phase"] = phase
                if site:
                    args["site"] = site
                if calls[s] != Call.NONE:
                    args["call"] = CALLS[calls[s]]
                events.append({"ph": "X", "name": names[s], "cat": kind, "pid": p, "tid": tid,
                               "ts": start, "dur": _t(end - start), "args": args})

    records = np.flatnonzero((ops.kind == OpKind.RECORD) & (ops.start_us >= 0))
    for op in records.tolist():
        event = text(int(ops.event[op]))
        events.append({"ph": "i", "s": "t", "name": f"record {event}", "cat": "record",
                       "pid": pid[text(int(ops.lane[op]))], "tid": 1,
                       "ts": _t(float(ops.start_us[op])),
                       "args": {"step": int(ops.step[op]), "event": event}})

    events.extend(_counters(trace))
    events.extend(_flows(trace, where, names))
    meta = {k: v for k, v in trace.meta.items() if isinstance(v, (str, int, float, bool))}
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "simwar", **meta}}


def _counters(trace: Trace) -> list[dict]:
    """forwards_in_flight (+1 at each launch, -1 at each forward end) and launch_ahead."""
    m = trace.markers
    rb = m.name == trace.code("run_batch")
    launches = dict(zip(m.step[rb].tolist(), m.time_us[rb].tolist()))  # the last one wins
    fw = views.forwards(trace)
    ends = dict(zip(fw.steps.tolist(), fw.end_us.tolist()))
    changes = [(t, +1) for k, t in launches.items() if k in ends]
    changes += [(t, -1) for k, t in ends.items() if k in launches]
    # at equal times a forward's end is counted before the next launch, as in metrics
    changes.sort(key=lambda c: (c[0], c[1]))
    out = []
    depth = 0
    for t, d in changes:
        depth += d
        out.append({"ph": "C", "name": "forwards_in_flight", "pid": HOST_PID, "tid": 0,
                    "ts": _t(t), "args": {"forwards": depth}})
    # forward ends are in FIFO (step) order on the forward stream, so a prefix search counts
    # the forwards before k that had finished by launch k
    steps = sorted(k for k in ends if k in launches)
    end_times = [ends[k] for k in steps]
    for k, t in sorted(launches.items()):
        before = bisect.bisect_left(steps, k)
        ahead = before - bisect.bisect_right(end_times[:before], t)
        out.append({"ph": "C", "name": "launch_ahead", "pid": HOST_PID, "tid": 0,
                    "ts": _t(t), "args": {"depth": ahead}})
    return out


def _flows(trace: Trace, where: list, names: list[str]) -> list[dict]:
    spans, ops = trace.spans, trace.ops
    out: list[dict] = []
    flow_id = 0

    def near(s: int, end: bool) -> float:
        # a binding point 1 ns inside the slice (Perfetto binds 'e' flows to the slice
        # enclosing ts), at the end the edge leaves or enters by, so that time runs forward
        start, stop = _t(float(spans.start_us[s])), _t(float(spans.end_us[s]))
        inset = min(10 ** -_TS_DIGITS, (stop - start) / 2)
        return _t(stop - inset) if end else _t(start + inset)

    def add(cat: str, name: str, src: int, dst: int, args: dict) -> None:
        nonlocal flow_id
        if src < 0 or dst < 0 or where[src] is None or where[dst] is None:
            return
        flow_id += 1
        (sp, st), (dp, dt) = where[src], where[dst]
        out.append({"ph": "s", "id": flow_id, "cat": cat, "name": name, "pid": sp, "tid": st,
                    "ts": near(src, end=True), "bp": "e", "args": args})
        # a wait or host block is left at its end; work is entered at its start
        held = spans.kind[dst] in (SpanKind.WAIT, SpanKind.BLOCKED)
        out.append({"ph": "f", "id": flow_id, "cat": cat, "name": name, "pid": dp, "tid": dt,
                    "ts": near(dst, end=held), "bp": "e", "args": args})

    for link in launch_links(trace):
        if link.span >= 0:
            add("launch", names[link.call], link.call, link.span,
                {"step": int(spans.step[link.span]), "graph": link.graph})

    op_span = views.op_spans(trace)
    for e in trace.edges():
        if e.kind == "launch":
            continue
        # the record's source: the work it captured, the last kernel issued before it
        captured = views.previous_kernel(trace, e.src)
        src = int(op_span[captured]) if captured >= 0 else -1
        # its destination: the wait's span or the sync's host block, by op id; a wait that
        # never held its stream releases the next kernel issued there
        dst = int(op_span[e.dst])
        if dst < 0 and e.kind == "record_wait":
            nxt = views.next_kernel(trace, e.dst)
            dst = int(op_span[nxt]) if nxt >= 0 else -1
        event = trace.text(int(ops.event[e.dst]))
        add(e.kind, event, src, dst, {"step": int(ops.step[e.dst]), "event": event})
    return out
