"""Write a simulated Trace as a Kineto (torch.profiler) Chrome-trace capture.

The round trip simulate → Kineto JSON → :func:`simwar.capture.import_kineto`
checks the importer against a timeline whose every figure is known, and the
import benchmark uses it to make captures of any size. The capture has what
``export_chrome_trace`` writes for a run profiled with CPU and CUDA activities
and ``_ExperimentalConfig(enable_cuda_sync_events=True)``:

- ``cuda_runtime`` calls on one host thread: ``cudaLaunchKernel`` per kernel,
  ``cudaGraphLaunch`` per graph (its kernels share the correlation id),
  ``cudaEventRecord``, ``cudaStreamWaitEvent`` (a ``wait_stream`` is a record
  plus a wait, as torch issues it), ``cudaEventSynchronize``;
- ``kernel`` events on numbered streams, with ``ac2g`` flow pairs;
- ``cuda_sync`` events (``Stream Wait Event``, ``Event Sync``) carrying
  ``wait_on_stream`` and ``wait_on_cuda_event_record_corr_id``; a record node
  inside a CUDA graph is reported against the graph launch's correlation id;
- ``user_annotation`` ranges: ``ProfilerStep#k`` per step, ``run_batch`` from
  each run_batch marker, and one range named after each sync's site around it;
  with ``cpu_ranges`` (the default), the scheduler's CPU work under SGLang's
  names (:data:`SGLANG_RANGES`): ``recv_requests`` around ingest,
  ``get_next_batch_to_run`` from schedule to the end of the schedule-stream
  launches, ``prepare_for_decode`` nested in it from prepare, and
  ``process_batch_result`` from the result-copy synchronize to the end of the
  step's host work (the synchronize inside it, as in SGLang);
- process/thread metadata and one ``cpu_op`` per step (ignored on import).

A :class:`Style` changes what is written, to stand for other servers and profilers:
``names`` (``bare``: the names above; ``sglang``: SGLang's ``scheduler.<stage>`` ranges,
``scheduler.run_batch`` and one range per phase named after it, as a real SGLang server and
the mini-server write them; ``vllm``: vLLM's ``gpu_model_runner: <stage>`` ranges);
``batch_ranges`` (a ``decode bs=<B>`` range around each step's phases, B the step's batch, or
with prompts ``prefill bs=<N> toks=<T>`` and ``mixed bs=<B> toks=<T>``: :func:`shape_range`;
with ``sglang`` names, an arrivals run's wait for requests is ``scheduler.wait_requests``);
``record_ids=False`` (as PyTorch 2.11 writes CUDA sync events: no record correlation id and
no ``wait_on_stream``, only the event id, with torch's reuse: a ``wait_stream`` records a
fresh event every time, an in-graph node is one event per captured graph, a per-step event
of the simulator (``copy_done[k]``) is one of two events used in turn, or, named in
``fresh_events``, a new event each step; the one place a 2.11-style capture is written);
``copies`` (device ops of these labels written as ``gpu_memcpy``: a real capture's result
D2H, ``result_copy``, is a copy, not a kernel); ``receives`` (a ``recv reqs=<N> toks=<T>``
range around the named steps' receive work, the mini-server's name); ``overhead`` (Kineto
``overhead`` events at given host times); ``blocking_sites`` (the host synchronizes of
those sites written as a ``cudaMemcpyAsync`` that blocks until its copy, issued on the
record's stream, ends: a hidden host sync). In a trace whose batch changes every step, each
graph's kernels carry its bucket in their launch dims (``grid``), as the kernels of graphs
captured at different batch sizes do.

A host call is tied to the ops it issued by ``ops.call`` and written
according to its typed ``spans.call`` kind.

Imports: the standard library, numpy and :mod:`simwar.core.trace`; never the simulator
(it writes a Trace it is given).

The file is over 600 lines because every profiler's way of writing a relation (record ids or
none, launch threads, processes, copies, blocking calls, graph launch dims, NCCL names) is a
style of the one writer, and the tests' captures are only as true as it is.
"""

from __future__ import annotations

import gzip
import itertools
import json
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from simwar.core.trace import HOST, Call, OpKind, SpanKind, Trace

#: CUDA stream ids given to simwar's stream names (others get ids from 30 up)
STREAM_IDS = {"forward": 7, "schedule": 13, "copy": 20, "plan": 22, "d2h": 24}
#: the kernel names NCCL gives the simulator's device collectives (others keep their label)
NCCL_KERNELS = {"allreduce": "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                "allgather": "ncclDevKernel_AllGather_RING_LL",
                "reduce_scatter": "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL"}
#: CUPTI runtime callback ids of the calls written here
CBID = {"cudaLaunchKernel": 211, "cudaGraphLaunch": 311, "cudaEventRecord": 135,
        "cudaStreamWaitEvent": 147, "cudaEventSynchronize": 137, "cudaMemcpyAsync": 41}
#: record_function ranges written around the simulator's CPU work (SGLang's names)
SGLANG_RANGES = {"ingest": "recv_requests", "schedule": "get_next_batch_to_run",
                 "prepare": "prepare_for_decode", "process_result": "process_batch_result"}
#: the import mapping's ``cpu`` rules for those ranges
SGLANG_CPU_MAPPING = {f"^{name}$": item for item, name in SGLANG_RANGES.items()}
#: per :attr:`Style.names`: the range of each CPU item (None: no range), of run_batch, and
#: of each phase (``"*"``: any phase not named; None: no phase ranges)
RANGE_NAMES = {
    "bare": {"cpu": SGLANG_RANGES, "run_batch": "run_batch", "phases": None},
    "sglang": {"cpu": {**{item: f"scheduler.{name}" for item, name in SGLANG_RANGES.items()},
                       "wait_requests": "scheduler.wait_requests"},
               "run_batch": "scheduler.run_batch", "phases": {"*": None}},
    "vllm": {"cpu": {"prepare": "gpu_model_runner: preprocess"}, "run_batch": None,
             "phases": {"draft": "gpu_model_runner: draft", "sample": "gpu_model_runner: sample",
                        "*": "gpu_model_runner: forward"}},
}


@dataclass(frozen=True)
class Style:
    """What a synthetic capture holds besides the trace (see the module docstring)."""

    names: str = "bare"
    cpu_ranges: bool = True
    batch_ranges: bool = False
    record_ids: bool = True
    overhead: tuple = ()  # ((start_us, end_us), ...) on the trace's clock
    blocking_sites: tuple = ()  # sync sites written as a blocking cudaMemcpyAsync
    #: without record ids: events (by name, ``copy_done`` for ``copy_done[k]``) that torch
    #: allocates afresh each step, so each id is synced once and no rule can bind it
    fresh_events: tuple = ()
    copies: tuple = ()  # labels of device ops written as gpu_memcpy (the result D2H)
    #: ((step, requests, prompt tokens), ...): a ``recv reqs=N toks=T`` range around each of
    #: those steps' receive work (``cpu.receive_us``), as the mini-server names it
    receives: tuple = ()

    def __post_init__(self):
        if self.names not in RANGE_NAMES:
            raise ValueError(f"names: '{self.names}' is not one of {', '.join(RANGE_NAMES)}")
PID, TID = 4242, 4242
DEVICE = 0
ORIGIN_US = 1_000_000.0  # ts of the trace's time zero (Kineto writes ts relative to a base)


def stream_ids(trace: Trace) -> dict[str, int]:
    ids = {}
    nxt = 30
    for lane in trace.lanes():
        if lane == HOST:
            continue
        if lane in STREAM_IDS:
            ids[lane] = STREAM_IDS[lane]
        else:
            ids[lane] = nxt
            nxt += 1
    return ids


class _Op(NamedTuple):
    """The fields of one op the writer needs (text decoded)."""

    op_id: int
    kind: OpKind
    lane: str
    label: str
    event: str
    bound: int
    start_us: float
    end_us: float


def _op_rows(trace: Trace) -> list[_Op]:
    ops = trace.ops
    return [_Op(i, OpKind(k), lane, label, event, b, s, e) for i, (k, lane, label, event, b, s, e)
            in enumerate(zip(ops.kind.tolist(), ops.decoded("lane").tolist(),
                             ops.decoded("label").tolist(), ops.decoded("event").tolist(),
                             ops.bound.tolist(), ops.start_us.tolist(), ops.end_us.tolist()))]


def _by_call(trace: Trace, ops: list[_Op]) -> Iterator[tuple[int, list[_Op]]]:
    """Ops grouped by the host call that issued them (``ops.call``), in issue order."""
    calls = trace.ops.call.tolist()
    group: list[_Op] = []
    current = None
    for op, call in zip(ops, calls):
        if group and (call != current or call < 0):
            yield current, group
            group = []
        current = call
        group.append(op)
    if group:
        yield current, group


def kineto_events(trace: Trace, origin_us: float = ORIGIN_US, cpu_ranges: bool = True,
                  style: Style | None = None) -> Iterator[dict]:
    """The capture's ``traceEvents``, in an order Kineto could have written them.

    Each host call's ops come from ``ops.call`` and what the call was from its
    span's ``call`` kind: a launch writes ``cudaLaunchKernel`` and its kernel
    under one correlation id, a graph launch ``cudaGraphLaunch`` and every
    kernel of the graph under one, ... A kernel with no host call in the
    trace is written as device work with a correlation id no runtime call has.
    """
    style = style or Style(cpu_ranges=cpu_ranges)
    streams = stream_ids(trace)
    ops = _op_rows(trace)
    for op in ops:
        if op.lane != HOST and op.lane not in streams:
            streams[op.lane] = 30 + len(streams)
    spans = trace.spans
    span_kind, span_start, span_end = spans.call, spans.start_us, spans.end_us

    def ts(t: float) -> float:
        return round(origin_us + t, 3)

    yield {"name": "process_name", "ph": "M", "ts": ts(0), "pid": PID, "tid": 0,
           "args": {"name": "python3"}}
    yield {"name": "thread_name", "ph": "M", "ts": ts(0), "pid": PID, "tid": TID,
           "args": {"name": "thread 4242 (python3)"}}
    yield {"name": "process_name", "ph": "M", "ts": ts(0), "pid": DEVICE, "tid": 0,
           "args": {"name": "python3"}}
    for sid in streams.values():
        yield {"name": "thread_name", "ph": "M", "ts": ts(0), "pid": DEVICE, "tid": sid,
               "args": {"name": f"stream {sid}"}}

    yield from _annotations(trace, ts, style)
    for a, b in style.overhead:
        yield {"ph": "X", "cat": "overhead", "name": "Activity Buffer Request", "pid": -1,
               "tid": 0, "ts": ts(a), "dur": round(b - a, 3)}

    # a tensor-parallel rank's collectives (meta["collectives"]): a host collective is a
    # range (written with the annotations), a device collective an NCCL kernel
    coll = trace.meta.get("collectives") or {"op": [], "device": []}
    host_coll = {o for o, d in zip(coll["op"], coll["device"]) if not d}
    device_coll = {o for o, d in zip(coll["op"], coll["device"]) if d}
    corr = 100
    record_corr: dict[int, int] = {}  # record op id -> correlation of the call that placed it
    event_id = _event_ids(trace, ops, style.record_ids, style.fresh_events)
    grids = _graph_grids(trace)
    if not style.record_ids:  # PyTorch 2.11: the sync events name no record nor its stream
        record_corr = _Unknown()
    for call, group in _by_call(trace, ops):
        if call < 0:  # device work with no host call in the trace
            for o in group:
                if o.kind is not OpKind.KERNEL:
                    raise ValueError(f"op {o.op_id}: a {o.kind.name.lower()} with no host call")
                corr += 1
                yield _kernel(o, streams[o.lane], ts(o.start_us), corr, copies=style.copies)
            continue
        kind = Call(int(span_kind[call]))
        start, end = float(span_start[call]), float(span_end[call])
        dur = end - start
        if kind is Call.SYNCHRONIZE:
            op = group[-1]  # after the tail record of a stream sync, if any
            if op.op_id in host_coll:  # no CUDA call: the range alone
                continue
            corr += 1
            if op.bound >= 0 and trace.text(int(spans.site[call])) in style.blocking_sites:
                rec = ops[op.bound]
                tail = max((o.end_us for o in ops[:op.op_id] if o.lane == rec.lane
                            and o.kind is OpKind.KERNEL), default=rec.start_us)
                yield from _blocking_copy(rec, op, streams, ts, corr, tail)
                continue
            yield _runtime("cudaEventSynchronize", ts(op.start_us), op.end_us - op.start_us, corr)
            if op.bound >= 0:
                rec = ops[op.bound]
                yield _sync("Event Sync", ts(op.start_us), op.end_us - op.start_us, corr,
                            _stream_of(streams, rec, style), record_corr.get(op.bound, -1),
                            event_id[op.bound], stream=-1)
        elif kind in (Call.LAUNCH, Call.GRAPH_LAUNCH):
            corr += 1
            name = "cudaGraphLaunch" if kind is Call.GRAPH_LAUNCH else "cudaLaunchKernel"
            yield _runtime(name, ts(start), dur, corr)
            yield _flow("s", corr, PID, TID, ts(start))
            grid = grids.get(call) if kind is Call.GRAPH_LAUNCH else None
            for o in group:
                if o.kind is OpKind.KERNEL:
                    if o.op_id in device_coll:
                        o = o._replace(label=NCCL_KERNELS.get(o.label, o.label))
                    yield _kernel(o, streams[o.lane], ts(o.start_us), corr, grid, style.copies)
                    yield _flow("f", corr, DEVICE, streams[o.lane], ts(o.start_us))
                else:  # an in-graph record node: reported against the launch
                    record_corr[o.op_id] = corr
        else:
            # records and waits; a wait_stream is one simwar call = a record, then a wait
            share = dur / len(group)
            for i, o in enumerate(group):
                corr += 1
                t0 = start + i * share
                if o.kind is OpKind.RECORD:
                    record_corr[o.op_id] = corr
                    yield _runtime("cudaEventRecord", ts(t0), share, corr)
                elif o.kind is OpKind.WAIT:
                    yield _runtime("cudaStreamWaitEvent", ts(t0), share, corr)
                    rec = ops[o.bound] if o.bound >= 0 else None
                    yield _sync("Stream Wait Event", ts(t0), share, corr,
                                _stream_of(streams, rec, style) if rec else -1,
                                record_corr.get(o.bound, -1),
                                event_id[o.bound] if rec else event_id[-1],
                                stream=streams[o.lane])
                else:
                    raise ValueError(f"op {o.op_id}: unexpected {o.kind.name.lower()} in a "
                                     f"{kind.name.lower()} call")
    markers = trace.markers
    end = float(markers.time_us.max()) if len(markers) else 0.0
    yield {"name": "Record Window End", "ph": "i", "s": "g", "pid": "", "tid": "",
           "ts": ts(end + 1.0)}


def _annotations(trace: Trace, ts, style: Style) -> Iterator[dict]:
    markers, spans = trace.markers, trace.spans
    names = RANGE_NAMES[style.names]
    kinds, times, marker_steps = markers.name, markers.time_us.tolist(), markers.step.tolist()

    def named(name: str) -> list[int]:
        return np.flatnonzero(kinds == trace.code(name)).tolist()

    steps = sorted((times[i], marker_steps[i]) for i in named("step"))
    end = max((times[i] for i in named("end")), default=None)
    bounds = [t for t, _ in steps[1:]] + [end if end is not None else steps[-1][0]] \
        if steps else []
    pick = np.flatnonzero((spans.lane == trace.code(HOST)) & (spans.kind == SpanKind.BLOCKED))
    blocked = sorted(zip(spans.start_us[pick].tolist(), spans.end_us[pick].tolist(),
                         spans.decoded("site")[pick].tolist()))
    ext = 1
    for (t, k), t_end in zip(steps, bounds):
        ext += 1
        yield _annotation(f"ProfilerStep#{k}", ts(t), t_end - t, ext)
        yield {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": PID, "tid": TID,
               "ts": ts(t), "dur": 0.0, "args": {"External id": ext, "Sequence number": k}}
    starts = [t for t, _ in steps]
    for t in sorted(times[i] for i in named("run_batch")) if names["run_batch"] else ():
        nxt = next((b for b in starts if b > t), None)
        stop = next((a for a, _, _ in blocked if a >= t), None)
        cands = [x for x in (nxt, stop) if x is not None]
        ext += 1
        yield _annotation(names["run_batch"], ts(t), (min(cands) if cands else t) - t, ext)
    if style.names == "bare":
        for a, b, site in blocked:
            ext += 1
            yield _annotation(site or "sync", ts(a), b - a, ext)
    else:  # a host collective's range whatever the names (bare names write it above)
        coll = trace.meta.get("collectives") or {"op": [], "device": []}
        host_coll = [o for o, d in zip(coll["op"], coll["device"]) if not d]
        ops = trace.ops
        for o in host_coll:
            ext += 1
            yield _annotation(trace.text(ops.label[o]), ts(float(ops.start_us[o])),
                              float(ops.end_us[o] - ops.start_us[o]), ext)
    if style.cpu_ranges:
        for name, a, b in sglang_cpu_ranges(trace, names["cpu"]):
            ext += 1
            yield _annotation(name, ts(a), b - a, ext)
    if style.receives:
        for name, a, b in received_ranges(trace, style.receives):
            ext += 1
            yield _annotation(name, ts(a), b - a, ext)
    if names["phases"] is not None or style.batch_ranges:
        for name, a, b in phase_ranges(trace, names["phases"], style.batch_ranges):
            ext += 1
            yield _annotation(name, ts(a), b - a, ext)


def sglang_cpu_ranges(trace: Trace, names: dict | None = None) -> list[tuple[str, float, float]]:
    """``(name, start_us, end_us)``: SGLang-named ranges around the CPU work of each step,
    as the capture writes them (see the module docstring); ``names``: the range of each CPU
    item (default :data:`SGLANG_RANGES`; an item it lacks gets none)."""
    names = SGLANG_RANGES if names is None else names
    spans = trace.spans
    host = np.flatnonzero(spans.lane == trace.code(HOST))
    rows = sorted(zip(spans.step[host].tolist(), spans.start_us[host].tolist(),
                      spans.end_us[host].tolist(), spans.call[host].tolist(),
                      spans.decoded("label")[host].tolist(),
                      spans.decoded("site")[host].tolist()))
    markers = trace.markers
    rb = markers.name == trace.code("run_batch")
    launch_at = dict(zip(markers.step[rb].tolist(), markers.time_us[rb].tolist()))
    by_step: dict[int, list] = {}
    for row in rows:
        by_step.setdefault(row[0], []).append(row[1:])
    out = []
    for k, items in sorted(by_step.items()):
        cpu = {label: (a, b) for a, b, call, label, _ in items if call == Call.CPU}
        for a, b, call, label, _ in items:
            if call == Call.CPU and label in ("ingest", "wait_requests") and names.get(label):
                if label == "ingest" and "ingest.requests" in cpu:  # the requests received:
                    b = cpu["ingest.requests"][1]  # SGLang's recv_requests takes them too
                out.append((names[label], a, b))
        if "ingest.requests" in cpu and "ingest" not in cpu and names.get("ingest"):
            out.append((names["ingest"], *cpu["ingest.requests"]))
        rb_t = launch_at.get(k)
        if rb_t is not None:
            end = max((b for a, b, *_ in items if a < rb_t), default=None)
            for item in ("schedule", "prepare"):
                if item in cpu and end is not None and names.get(item):
                    out.append((names[item], cpu[item][0], end))
        sync = next(((a, b) for a, b, call, _, site in items
                     if call == Call.SYNCHRONIZE and site == "result_copy"), None)
        if sync is not None and names.get("process_result"):
            end = max(b for a, b, *_ in items if a >= sync[0])
            out.append((names["process_result"], sync[0], end))
    return out


def received_ranges(trace: Trace, receives) -> list[tuple[str, float, float]]:
    """``(name, start_us, end_us)``: ``recv reqs=<N> toks=<T>`` around the receive work
    (the host's ``ingest.requests`` span) of each step ``receives`` names as ``(step, N,
    T)``."""
    named = {int(k): (int(n), int(t)) for k, n, t in receives}
    spans = trace.spans
    pick = np.flatnonzero((spans.lane == trace.code(HOST)) & (spans.call == Call.CPU)
                          & (spans.label == trace.code("ingest.requests")))
    out = []
    for k, a, b in zip(spans.step[pick].tolist(), spans.start_us[pick].tolist(),
                       spans.end_us[pick].tolist()):
        if k in named:
            out.append((f"recv reqs={named[k][0]} toks={named[k][1]}", a, b))
    return out


def phase_ranges(trace: Trace, names: dict | None, batch: bool) -> list[tuple[str, float, float]]:
    """``(name, start_us, end_us)``: per step, one range per phase (from the host work right
    before its first launch to its last launch's end; ``names`` maps a phase to its range,
    ``"*"`` any other, a None value the phase's own name; None: no phase ranges) and, with
    ``batch``, a ``decode bs=<B>`` range around them all (B: the step's batch)."""
    spans = trace.spans
    host = np.flatnonzero(spans.lane == trace.code(HOST))
    host = host[np.lexsort((host, spans.start_us[host]))]
    wl = trace.meta.get("workload") or {}
    batches = wl.get("batch_size")
    out = []
    empty = trace.code("")
    by_step: dict[int, list[int]] = {}
    for sp in host.tolist():
        by_step.setdefault(int(spans.step[sp]), []).append(sp)
    for k, items in sorted(by_step.items()):
        runs: list[list] = []  # [phase, start, end]
        for i, sp in enumerate(items):
            ph = int(spans.phase[sp])
            if ph == empty or spans.call[sp] not in (Call.LAUNCH, Call.GRAPH_LAUNCH):
                continue
            start = float(spans.start_us[sp])
            if i and spans.call[items[i - 1]] == Call.CPU:  # its dispatch
                start = float(spans.start_us[items[i - 1]])
            if runs and runs[-1][0] == ph:
                runs[-1][2] = float(spans.end_us[sp])
            else:
                runs.append([ph, start, float(spans.end_us[sp])])
        if not runs:
            continue
        if names is not None:
            for ph, a, b in runs:
                phase = trace.text(ph)
                name = names.get(phase, names.get("*"))
                out.append((name or phase, a, b))
        if batch:
            size = int(batches[k]) if batches is not None and k < len(batches) else \
                int(trace.meta.get("batch_size", 1))
            out.append((shape_range(wl, k, size), runs[0][1], runs[-1][2]))
    return out


def shape_range(wl: dict, k: int, batch: int) -> str:
    """The name of step ``k``'s range around its forward (``wl``: the trace's
    ``meta.workload``; ``batch``: its decoding requests): ``decode bs=B``, ``prefill bs=N
    toks=T`` for a prefill step of its own (N requests in its chunk, T prompt tokens) or
    ``mixed bs=B toks=T`` for a chunk mixed into a decode step (a mixed rule's step that
    prefills nothing is a decode step)."""
    tokens = wl.get("prefill_tokens")
    if tokens is None or k >= len(tokens):
        return f"decode bs={batch}"
    toks = int(tokens[k])
    shapes = wl.get("shape")
    # (no shapes: a trace of a simulator that launched a chunk, empty too, in every step)
    if shapes is None or shapes[k] == "mixed":
        return f"mixed bs={batch} toks={toks}"
    if shapes[k] == "prefill":
        req = wl.get("requests") or {}
        first, last = req.get("prefill_step") or [], req.get("first_step") or []
        n = sum(1 for a, b in zip(first, last) if 0 <= a <= k <= b)
        return f"prefill bs={n} toks={toks}"
    return f"decode bs={batch}"


class _Unknown(dict):
    """Record correlation ids as PyTorch 2.11 writes them: every one is -1."""

    def __setitem__(self, key, value) -> None:
        pass

    def get(self, key, default=None):
        return -1


def _stream_of(streams: dict, rec: _Op, style: Style) -> int:
    """The ``wait_on_stream`` of a sync event: the record's stream (-1 as 2.11 writes it)."""
    return streams[rec.lane] if style.record_ids else -1


def _event_ids(trace: Trace, ops: list[_Op], record_ids: bool,
               fresh_events: tuple = ()) -> dict[int, int]:
    """Per record op, the ``wait_on_cuda_event_id`` of the syncs bound to it (-1: key of an
    unbound wait). With ``record_ids`` a hash of the event's name; without, torch's reuse
    (see the module docstring)."""
    if record_ids:
        out = {o.op_id: zlib.crc32(o.event.encode()) % 100000 for o in ops
               if o.kind is OpKind.RECORD}
        out[-1] = zlib.crc32(b"") % 100000
        return out
    spans = trace.spans
    calls = trace.ops.call
    buckets = (trace.meta.get("workload") or {}).get("graph_bucket")
    fresh = itertools.count(1000)
    stable: dict[tuple, int] = {}
    out = {-1: next(fresh)}
    for o in ops:
        if o.kind is not OpKind.RECORD:
            continue
        c = int(calls[o.op_id])
        kind = Call(int(spans.call[c])) if c >= 0 else Call.NONE
        step = int(trace.ops.step[o.op_id])
        if kind is Call.WAIT_STREAM:  # torch records a new event each time
            out[o.op_id] = next(fresh)
            continue
        if kind is Call.GRAPH_LAUNCH:  # an external event captured in this bucket's graph
            key = (o.event, int(buckets[step]) if buckets is not None else 0)
        else:
            base = re.sub(r"\[\d+\]$", "", o.event)  # copy_done[k]: one of two events in turn
            if base in fresh_events:
                out[o.op_id] = next(fresh)
                continue
            key = (base, step % 2) if base != o.event else (o.event,)
        if key not in stable:
            stable[key] = next(fresh)
        out[o.op_id] = stable[key]
    return out


def _graph_grids(trace: Trace) -> dict[int, list[int]]:
    """Per graph launch span of a trace whose batch changes every step, its kernels' grid
    (the bucket's batch in x: a graph captured at another batch size launches other dims)."""
    buckets = (trace.meta.get("workload") or {}).get("graph_bucket")
    if buckets is None:
        return {}
    spans = trace.spans
    graphs = np.flatnonzero(spans.call == Call.GRAPH_LAUNCH)
    return {int(g): [4 * int(buckets[int(spans.step[g])]), 1, 1] for g in graphs.tolist()
            if 0 <= int(spans.step[g]) < len(buckets)}


def _blocking_copy(rec: _Op, sync: _Op, streams: dict, ts, corr: int,
                   tail: float) -> Iterator[dict]:
    """A host synchronize written as the call that hides one: a ``cudaMemcpyAsync`` into a
    pinned buffer that torch performs synchronously, issued on the record's stream and
    returning when it ends. ``tail``: the end of the work issued on that stream before the
    call, which the copy queues behind; it must be the record's firing (the trace must be
    one where the record is its stream's tail at the sync, or the copy could not end
    inside the call)."""
    start = max(tail, rec.start_us, sync.start_us)
    if start > sync.end_us:
        raise ValueError(f"op {sync.op_id}: its record is not the tail of {rec.lane} at the "
                         f"sync (work runs there until {tail}): not a blocking copy")
    yield _runtime("cudaMemcpyAsync", ts(sync.start_us), sync.end_us - sync.start_us, corr)
    yield _flow("s", corr, PID, TID, ts(sync.start_us))
    dur = min(2.0, max(0.0, (sync.end_us - start) / 2))
    stream = streams[rec.lane]
    yield {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)",
           "pid": DEVICE, "tid": stream, "ts": ts(start), "dur": round(dur, 3),
           "args": {"device": DEVICE, "context": 1, "stream": stream, "correlation": corr,
                    "bytes": 4096, "memory bandwidth (GB/s)": 2.0}}
    yield _flow("f", corr, DEVICE, stream, ts(start))


def _annotation(name: str, t: float, dur: float, ext: int) -> dict:
    return {"ph": "X", "cat": "user_annotation", "name": name, "pid": PID, "tid": TID,
            "ts": t, "dur": round(dur, 3), "args": {"External id": ext, "Record function id": 0,
                                                    "Ev Idx": ext}}


def _runtime(name: str, t: float, dur: float, corr: int) -> dict:
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "pid": PID, "tid": TID, "ts": t,
            "dur": round(dur, 3), "args": {"cbid": CBID[name], "correlation": corr}}


def _kernel(op: _Op, stream: int, t: float, corr: int, grid: list | None = None,
            copies: tuple = ()) -> dict:
    cat = "gpu_memcpy" if op.label in copies else "kernel"
    return {"ph": "X", "cat": cat, "name": op.label, "pid": DEVICE, "tid": stream,
            "ts": t, "dur": round(op.end_us - op.start_us, 3),
            "args": {"queued": 0, "device": DEVICE, "context": 1, "stream": stream,
                     "correlation": corr, "registers per thread": 32, "shared memory": 0,
                     "blocks per SM": 1.0, "warps per SM": 4.0, "grid": grid or [132, 1, 1],
                     "block": [128, 1, 1], "est. achieved occupancy %": 6}}


def _sync(kind: str, t: float, dur: float, corr: int, wait_on_stream: int, record_corr: int,
          event_id: int, stream: int) -> dict:
    return {"ph": "X", "cat": "cuda_sync", "name": kind, "pid": DEVICE,
            "tid": abs(stream) if stream >= 0 else 1, "ts": t, "dur": round(dur, 3),
            "args": {"cuda_sync_kind": kind, "wait_on_stream": wait_on_stream,
                     "wait_on_cuda_event_record_corr_id": record_corr,
                     "wait_on_cuda_event_id": event_id,
                     "stream": stream if stream >= 0 else 4294967295, "correlation": corr,
                     "device": DEVICE, "context": 1}}


def _flow(ph: str, corr: int, pid, tid, t: float) -> dict:
    ev = {"ph": ph, "id": corr, "pid": pid, "tid": tid, "ts": t, "cat": "ac2g", "name": "ac2g"}
    if ph == "f":
        ev["bp"] = "e"
    return ev


def as_captured(events: Iterator[dict], pid: int | None = None,
                launch_threads: dict[str, int] | None = None, device: int | None = None,
                correlation_offset: int = 0) -> Iterator[dict]:
    """The events of :func:`kineto_events` as another process or thread layout writes them
    (what the capture's sync events and device ops hold is :class:`Style`'s).

    - ``pid``: the host process id (default ``PID``);
    - ``launch_threads``: kernel-name prefix → thread id: a launch whose kernels' names
      start with a prefix is issued from that thread (as autograd's backward thread or a
      communication thread issues its own launches), its records and waits stay on the
      main thread;
    - ``device``: the GPU the work runs on (default ``DEVICE``);
    - ``correlation_offset``: added to every correlation id (another process's CUPTI
      counts from elsewhere).
    """
    pending: list[dict] = []

    def flush() -> Iterator[dict]:
        if launch_threads and pending and pending[0].get("cat") == "cuda_runtime":
            names = [e["name"] for e in pending if e.get("cat") in ("kernel", "gpu_memcpy")]
            tid = next((t for prefix, t in launch_threads.items()
                        if any(n.startswith(prefix) for n in names)), None)
            if tid is not None:
                for e in pending:
                    if e.get("cat") == "cuda_runtime" or (e.get("ph") == "s"):
                        e["tid"] = tid
        yield from pending
        pending.clear()

    for ev in events:
        ev = dict(ev)
        if pid is not None and ev.get("pid") == PID:
            ev["pid"] = pid
        if "args" in ev and (correlation_offset or device is not None):
            args = ev["args"] = dict(ev["args"])
            if correlation_offset and "correlation" in args:
                args["correlation"] += correlation_offset
                if args.get("wait_on_cuda_event_record_corr_id", -1) >= 0:
                    args["wait_on_cuda_event_record_corr_id"] += correlation_offset
            if device is not None and "device" in args:
                args["device"] = device
                ev["pid"] = device
        if correlation_offset and ev.get("cat") == "ac2g":
            ev["id"] += correlation_offset
        if ev.get("cat") in ("kernel", "gpu_memcpy", "ac2g") and pending:
            pending.append(ev)
            continue
        yield from flush()
        if ev.get("cat") == "cuda_runtime" and ev["name"] in ("cudaLaunchKernel",
                                                              "cudaGraphLaunch"):
            pending.append(ev)
            continue
        yield ev
    yield from flush()


def _write_events(path: Path, events: Iterator[dict],
                  base_time_ns: int = 1700000000000000000, profiled: bool = False) -> Path:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "wt") as fh:
        fh.write('{\n  "schemaVersion": 1,\n'
                 + ('' if profiled else '  "simwar": {"profiled": false},\n')
                 + '  "deviceProperties": [\n    {"id": 0, '
                 '"name": "NVIDIA H200", "totalGlobalMem": 150000000000, "computeMajor": 9, '
                 '"computeMinor": 0, "numSms": 132}\n  ],\n  "displayTimeUnit": "ms",\n'
                 '  "baseTimeNanoseconds": ' + str(base_time_ns) + ',\n  "traceEvents": [\n')
        first = True
        for ev in events:
            fh.write(("  " if first else ",\n  ") + json.dumps(ev, separators=(", ", ": ")))
            first = False
        fh.write('\n  ],\n  "traceName": "' + path.name + '"\n}\n')
    return path


def write_kineto(trace: Trace, path: str | Path, origin_us: float = ORIGIN_US,
                 cpu_ranges: bool = True, style: Style | None = None,
                 base_time_ns: int = 1700000000000000000, profiled: bool = False,
                 **captured) -> Path:
    """Write the capture (``.gz`` compresses); events are streamed, one per line.

    The header says ``"simwar": {"profiled": false}``: a simulation's timeline holds no
    profiler's cost, and the fit subtracts none from it (:mod:`simwar.fit.profiler_cost`);
    ``profiled=True`` leaves that out, so that the capture reads as a profiled run's.

    ``cpu_ranges``: write SGLang-named ranges around the CPU work (see the module
    docstring); ``style`` (which holds its own ``cpu_ranges``) more: :class:`Style` (PyTorch
    2.11's sync events, copies, ...); ``captured``: :func:`as_captured`'s options (another
    pid, launches from other threads, another device).
    """
    events = kineto_events(trace, origin_us, cpu_ranges, style)
    if captured:
        events = as_captured(events, **captured)
    return _write_events(Path(path), events, base_time_ns, profiled)


def write_kineto_processes(traces: list[Trace], path: str | Path, pids: list[int],
                           origin_us: float = ORIGIN_US, devices: list[int] | None = None,
                           offsets: list[int] | None = None, style: Style | None = None,
                           **captured) -> Path:
    """Several simulated runs as the processes of one capture file: process ``pids[i]``
    runs ``traces[i]`` on GPU ``devices[i]`` (default: all on one) with the same stream
    ids, its correlation ids shifted by ``offsets[i]`` (default 0: the same ids), as
    per-rank captures merged into one file or processes sharing a GPU; ``style``: what
    each process's events hold (:class:`Style`)."""
    devices = devices or [None] * len(traces)
    offsets = offsets or [0] * len(traces)

    def events() -> Iterator[dict]:
        for trace, pid, dev, off in zip(traces, pids, devices, offsets):
            for ev in as_captured(kineto_events(trace, origin_us, style=style), pid=pid,
                                  device=dev, correlation_offset=off, **captured):
                if ev.get("ph") == "i":  # one window-end instant per file
                    continue
                yield ev
    return _write_events(Path(path), events())
