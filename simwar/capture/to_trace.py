"""A read capture and its mapping → :class:`simwar.core.trace.Trace` (:class:`KinetoImport`).

:func:`import_kineto` reads a capture (:func:`simwar.capture.reader.read_capture`)
and builds its Trace with :class:`CaptureTraceBuilder` through
:class:`simwar.core.recorder.Recorder`. The Trace has lane ``cpu`` (the
scheduler thread: the thread that issued most launches unless the mapping
names one) and one lane per stream:

- every runtime call on that thread is a host span labelled with the call's
  name, with a typed ``call`` kind (:func:`simwar.capture.reader.call_kind`):
  ``launch`` (``cudaLaunchKernel`` & co, and any call that issued device work:
  a ``cudaMemcpyAsync`` or ``cudaMemsetAsync`` whose memcpy/memset is in the
  capture is a launch), ``graph_launch`` (``cudaGraphLaunch``), ``record``,
  ``wait_event``, ``synchronize`` (a ``blocked`` span with its site) and
  ``other``;
- device work (kernels, memcpys, memsets) becomes ``kernel`` ops whose
  ``ops.call`` is the span of the runtime call with the same correlation id
  (-1 for device work whose call is not on the host thread or not in the
  capture); a call's span names the first op it issued (``spans.op``; a
  stream sync names its sync op, not the tail record it implies);
- records, stream waits and syncs become ``record``/``wait``/``sync`` ops,
  bound (``ops.bound``) by the ``cuda_sync`` events' correlation data. Their
  device times are inferred by :mod:`simwar.core.rules` on each stream's measured
  tail (:func:`simwar.capture.device_times.infer_device_times`); a wait that held
  its stream becomes a ``wait`` span, which :mod:`simwar.analysis.metrics` counts
  as dependency idle.

Imports: the standard library and simwar's capture and core modules (numpy through
them); never the simulator (api, executors, build) and no pandas (the caller runs
:mod:`simwar.analysis.metrics` on the result). Nothing prints: progress goes to an
optional callback.
"""

from __future__ import annotations

import bisect
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from simwar.capture.device_times import (
    MeasuredLanes,
    PendingRecord,
    PendingWait,
    infer_device_times,
)
from simwar.capture.mapping import Mapping, load_mapping
from simwar.capture.reader import (
    Annotation,
    Capture,
    DeviceEvent,
    ProgressFn,
    RuntimeCall,
    SyncEvent,
    call_kind,
    copy_kind,
    read_capture,
)
from simwar.core.recorder import Recorder
from simwar.core.trace import HOST, Call, OpKind, Trace


class DeviceInfo(NamedTuple):
    """What a capture says of one device op beyond its times: the kind of work, a kernel's
    launch dims, a copy's or memset's bytes (-1: not in the capture)."""

    kind: str  # kernel | memcpy | memset
    grid: tuple
    block: tuple
    bytes: int
    copy: str = ""  # a memcpy's kind (DtoH (Device -> Pinned), ...): reader.copy_kind


@dataclass
class KinetoImport:
    """An imported capture: the Trace plus what was counted, ignored and inferred."""

    trace: Trace
    counts: dict
    ignored: dict
    warnings: list[str]
    #: the host thread's annotation ranges (``record_function``), ``(name, start_us, end_us)``
    #: on the trace's clock, by start; what ``simwar import --fit`` maps to CPU work
    annotations: list[tuple[str, float, float]] = field(default_factory=list)
    #: the names of the device work in the capture (what ``phases`` rules are tried on)
    device_names: list[str] = field(default_factory=list)
    #: the profiler's own stalls (Kineto ``overhead`` events), ``(name, start_us, end_us)``
    #: on the trace's clock: what ``simwar import --fit`` leaves out with their steps
    overhead: list[tuple[str, float, float]] = field(default_factory=list)
    #: per device op id: its kind (kernel, memcpy, memset), launch dims and bytes
    device_info: dict[int, DeviceInfo] = field(default_factory=dict)

    @property
    def ignored_total(self) -> int:
        return int(sum(self.ignored.values()))


def import_kineto(path: str | Path, mapping: Mapping | dict | str | Path | None = None,
                  progress: ProgressFn | None = None) -> KinetoImport:
    """Read a Kineto capture and build its Trace (see the module docstring)."""
    mapping = load_mapping(mapping)
    cap = read_capture(path, progress)
    result = build_trace(cap, mapping)
    result.trace.meta.setdefault("file", Path(path).name)
    return result


def build_trace(cap: Capture, mapping: Mapping) -> KinetoImport:
    """The Trace of a read capture under a mapping (see the module docstring)."""
    return CaptureTraceBuilder(cap, mapping).build()


class CaptureTraceBuilder:
    """Builds one capture's Trace: :meth:`build` once, after construction.

    Holds what the pass infers along the way (the host thread, the lane of each
    device stream, the step ranges, the clock origin and GPU offset) and the counts
    and warnings that :class:`KinetoImport` reports.
    """

    def __init__(self, cap: Capture, mapping: Mapping):
        self.cap = cap
        self.m = mapping
        self.warnings: list[str] = []
        self.device_info: dict[int, DeviceInfo] = {}
        self.counts: Counter = Counter()
        self.ignored: Counter = Counter(cap.ignored)
        self.phase_rules = mapping.phase_rules()
        self.site_rules = mapping.site_rules()
        self.steps_re = re.compile(mapping.steps)
        self.run_batch_re = re.compile(mapping.run_batch) if mapping.run_batch else None

    # ------------------------------------------------------------------ entry
    def build(self) -> KinetoImport:
        cap, m = self.cap, self.m
        self.counts.update({k: cap.counts.get(k, 0) for k in
                            ("kernel", "memcpy", "memset", "cuda_sync", "runtime",
                             "annotation")})
        # waits and event syncs that name the cudaEventRecord they bind to (torch builds
        # whose profiler reports no record correlation write -1: nothing to bind)
        self.counts["sync_with_record"] = sum(
            1 for e in cap.sync_events if e.record_correlation is not None)
        devices = {d.device for d in cap.device_events}
        multi = len(devices) > 1
        self.lane_of = {}
        for d in cap.device_events:
            key = (d.device, d.stream)
            if key not in self.lane_of:
                self.lane_of[key] = m.lane_for(d.device, d.stream, multi)
        self._check_mapping_streams()

        by_corr: dict[int, list[DeviceEvent]] = defaultdict(list)
        for d in cap.device_events:
            if d.correlation >= 0:
                by_corr[d.correlation].append(d)
        self.host = self._host_thread(by_corr)
        host_calls = sorted((c for c in cap.runtime_calls if (c.pid, c.tid) == self.host),
                            key=lambda c: c.ts)
        calls_by_corr = {c.correlation: c for c in cap.runtime_calls if c.correlation >= 0}
        self.counts["host_runtime_calls"] = len(host_calls)
        self.ignored["runtime_other_threads"] += len(cap.runtime_calls) - len(host_calls)

        self.origin = self._origin()
        self.gpu_offset = self._gpu_offset(calls_by_corr)
        host_ann = sorted((a for a in cap.annotations if (a.pid, a.tid) == self.host)
                          if self.host else cap.annotations, key=lambda a: (a.ts, -a.dur))
        self.steps = self._steps(host_ann)
        enclosing = self._enclosing(host_calls, host_ann)

        trace = self._assemble(host_calls, by_corr, calls_by_corr, enclosing, host_ann)
        annotations = [(a.name, a.ts - self.origin, a.ts + a.dur - self.origin)
                       for a in host_ann]
        names = sorted({d.name for d in cap.device_events})
        overhead = [(a.name, a.ts - self.origin, a.ts + a.dur - self.origin)
                    for a in sorted(cap.overhead, key=lambda a: a.ts)]
        return KinetoImport(trace, dict(self.counts), dict(self.ignored), self.warnings,
                            annotations, names, overhead, self.device_info)

    # ------------------------------------------------------------------ setup
    def _check_mapping_streams(self) -> None:
        present = {str(s) for _, s in self.lane_of} | {f"{d}:{s}" for d, s in self.lane_of}
        missing = [k for k in self.m.streams if k not in present]
        if missing:
            self.warnings.append(f"mapping names streams with no device work in the capture: "
                                 f"{', '.join(missing)}")

    def _host_thread(self, by_corr) -> tuple[int, int] | None:
        calls = self.cap.runtime_calls
        if self.m.host_thread is not None:
            for c in calls:
                if c.tid == self.m.host_thread:
                    return (c.pid, c.tid)
            for a in self.cap.annotations:
                if a.tid == self.m.host_thread:
                    return (a.pid, a.tid)
            self.warnings.append(f"mapping host_thread {self.m.host_thread}: no runtime call or "
                                 f"annotation on that thread")
            return None
        launches = Counter((c.pid, c.tid) for c in calls if c.correlation in by_corr)
        if launches:
            return launches.most_common(1)[0][0]
        any_calls = Counter((c.pid, c.tid) for c in calls)
        if any_calls:
            return any_calls.most_common(1)[0][0]
        steps = Counter((a.pid, a.tid) for a in self.cap.annotations
                        if self.steps_re.search(a.name))
        return steps.most_common(1)[0][0] if steps else None

    def _origin(self) -> float:
        cap = self.cap
        starts = [min((e.ts for e in seq), default=float("inf"))
                  for seq in (cap.device_events, cap.runtime_calls, cap.annotations,
                              cap.sync_events)]
        origin = min(starts)
        return 0.0 if origin == float("inf") else origin

    def _gpu_offset(self, calls_by_corr) -> float:
        """Device-clock correction; 'auto' shifts so no kernel starts before its launch."""
        off = self.m.gpu_clock_offset_us
        lead = [d.ts - calls_by_corr[d.correlation].ts for d in self.cap.device_events
                if d.correlation in calls_by_corr]
        early = [x for x in lead if x < 0]
        if off == "auto":
            off = -min(early) if early else 0.0
        else:
            off = float(off)
            still = sum(1 for x in lead if x + off < 0)
            if still:
                self.warnings.append(f"{still} device ops start before their host call: the "
                                     f"GPU clock looks offset (try gpu_clock_offset_us: auto)")
        self.counts["device_before_launch"] = sum(1 for x in lead if x + off < 0)
        return float(off)

    def _steps(self, host_ann: list[Annotation]) -> list[tuple[float, float, str]]:
        """Top-level step ranges (relative µs): annotations matching the steps pattern."""
        rx = self.steps_re
        cand = [a for a in host_ann if rx.search(a.name)]
        if not cand and self.host is not None:
            cand = sorted((a for a in self.cap.annotations if rx.search(a.name)),
                          key=lambda a: (a.ts, -a.dur))
        out: list[tuple[float, float, str]] = []
        for a in cand:
            s, e = a.ts - self.origin, a.ts + a.dur - self.origin
            if out and e <= out[-1][1]:  # nested in the previous step: keep the outer range
                continue
            out.append((s, e, a.name))
        if not out and (self.cap.device_events or self.cap.runtime_calls):
            self.warnings.append(f"no annotation matches the steps pattern '{self.m.steps}': "
                                 f"the whole capture is one step")
        return out

    def step_at(self, t: float) -> int:
        """Step of a host time: the last step started at or before t (−1 outside)."""
        if not self.steps:
            return 0
        i = bisect.bisect_right(self._step_starts, t) - 1
        if i < 0:
            return -1
        if i == len(self.steps) - 1 and t > self.steps[-1][1]:
            return -1
        return i

    def _enclosing(self, calls: list[RuntimeCall], ann: list[Annotation]) -> dict:
        """For each host call: (phase from annotations or None, site or None)."""
        phase_cache: dict[str, str | None] = {}
        site_cache: dict[str, str | None] = {}

        def first(rules, name, cache):
            if name not in cache:
                cache[name] = next((v for rx, v in rules if rx.search(name)), None)
            return cache[name]

        out = {}
        stack: list[Annotation] = []
        j = 0
        for c in calls:
            while j < len(ann) and ann[j].ts <= c.ts:
                stack.append(ann[j])
                j += 1
            stack = [a for a in stack if a.ts + a.dur >= c.ts]
            phase = site = None
            for a in reversed(stack):  # innermost first
                if phase is None and self.phase_rules:
                    phase = first(self.phase_rules, a.name, phase_cache)
                if site is None and self.site_rules:
                    site = first(self.site_rules, a.name, site_cache)
                if phase is not None and (site is not None or not self.site_rules):
                    break
            out[id(c)] = (phase, site)
        return out

    def kernel_phase(self, name: str, from_annotation: str | None) -> str:
        for rx, phase in self.phase_rules:
            if rx.search(name):
                return phase
        if from_annotation is not None:
            return from_annotation
        return self.m.unmatched_phase()

    # ------------------------------------------------------------------ assembly
    def _assemble(self, host_calls, by_corr, calls_by_corr, enclosing, host_ann) -> Trace:
        o, g = self.origin, self.gpu_offset
        self._step_starts = [s for s, _, _ in self.steps]
        syncs_by_corr: dict[int, SyncEvent] = {}
        for s in self.cap.sync_events:
            if s.correlation >= 0:
                syncs_by_corr[s.correlation] = s
        record_streams: dict[int, tuple[int, int]] = {}  # record call corr -> (device, stream)
        record_events: dict[int, str] = {}  # record call corr -> the event it recorded
        for s in self.cap.sync_events:
            if s.record_correlation is not None:
                if s.wait_on_stream is not None:
                    record_streams[s.record_correlation] = (s.device, s.wait_on_stream)
                if s.event_id is not None:
                    record_events.setdefault(s.record_correlation, f"event{s.event_id}")

        # issue-ordered host items: (issue_us, order, index, payload)
        items: list[tuple] = []
        host_corrs = set()
        for i, c in enumerate(host_calls):
            host_corrs.add(c.correlation)
            items.append((c.ts - o, 0, i, c))
        orphans = 0
        for corr, devs in by_corr.items():
            if corr in host_corrs:
                continue
            call = calls_by_corr.get(corr)
            if call is None:
                orphans += len(devs)
            for d in devs:
                issue = (call.ts + call.dur - o) if call is not None else d.ts + g - o
                items.append((issue, 1, -1, d))
        uncorrelated = [d for d in self.cap.device_events if d.correlation < 0]
        for d in uncorrelated:
            items.append((d.ts + g - o, 1, -1, d))
        self.counts["device_without_launch"] = orphans + len(uncorrelated)
        if orphans + len(uncorrelated):
            self.warnings.append(f"{orphans + len(uncorrelated)} device ops have no host call in "
                                 f"the capture (step from their start time)")
        items.sort(key=lambda x: (x[0], x[1], x[2]))

        rec = Recorder()
        measured = MeasuredLanes()
        record_op: dict[int, int] = {}  # record call correlation -> op id
        records: list[PendingRecord] = []
        waits: list[PendingWait] = []
        outside = 0
        unbound = Counter()
        first_launch: dict[int, float] = {}  # step -> first forward-kernel launch start
        fwd = self.forward_lane_hint

        def place_record(corr: int | None, lane: str, step: int, label: str, event: str,
                         issue: float, call: int) -> int:
            op = rec.op(OpKind.RECORD, lane, step, label, event=event, issue=issue, call=call)
            records.append(PendingRecord(op, lane, issue))
            if corr is not None:
                record_op[corr] = op
            return op

        for issue, _, _, item in items:
            if isinstance(item, DeviceEvent):
                # device work whose host call is not on the host thread or not in the capture
                step = self.step_at(issue)
                if step < 0:
                    outside += 1
                    continue
                self._device_op(rec, measured, item, step, issue,
                                self.kernel_phase(item.name, None), -1)
                continue
            c: RuntimeCall = item
            start, end = c.ts - o, c.ts + c.dur - o
            step = self.step_at(start)
            if step < 0:
                outside += 1
                continue
            ann_phase, site = enclosing[id(c)]
            devs = by_corr.get(c.correlation)
            name = c.name
            kind = call_kind(name, bool(devs))
            if devs:
                devs = sorted(devs, key=lambda d: d.ts)
                phases = [self.kernel_phase(d.name, ann_phase) for d in devs]
                phase = next((p for p in phases if p), "")
                call = rec.host(kind, step, start, end, name, phase=phase, op=rec.next_op)
                for d, p in zip(devs, phases):
                    self._device_op(rec, measured, d, step, end, p, call)
                where = record_streams.get(c.correlation)
                if where is not None:
                    # an event recorded by a node inside the launched graph (where in the graph
                    # is not in the capture): it fires when its stream drains the work issued
                    # before the launch returned, the earliest the node can fire
                    place_record(c.correlation, self._lane(*where), step, f"{name} record",
                                 record_events.get(c.correlation, ""), end, call)
                if step not in first_launch and phase and any(
                        self.lane_of[(d.device, d.stream)] == fwd for d in devs):
                    first_launch[step] = start
            elif kind is Call.SYNCHRONIZE:
                sev = syncs_by_corr.get(c.correlation)
                tail = sev is not None and sev.kind == "Stream Sync" and sev.stream is not None
                # the span names the sync op (after the stream's tail record, if any)
                call = rec.host(kind, step, start, end, name, site=site or "sync",
                                op=rec.next_op + (1 if tail else 0))
                bound, event = -1, ""
                if tail:
                    # a stream sync waits for the stream's tail: a fresh record at the call
                    lane = self._lane(sev.device, sev.stream)
                    event = f"{lane}.tail"
                    bound = place_record(None, lane, step, event, event, start, call)
                elif sev is not None and sev.record_correlation is not None:
                    bound = record_op.get(sev.record_correlation, -1)
                    event = f"event{sev.event_id}" if sev.event_id is not None else ""
                if bound < 0:
                    unbound["sync"] += 1
                rec.op(OpKind.SYNC, HOST, step, name, event=event, bound=bound, issue=start,
                       start=start, end=end, call=call)
            elif kind is Call.RECORD:
                where = record_streams.get(c.correlation)
                call = rec.host(kind, step, start, end, name,
                                op=rec.next_op if where is not None else -1)
                if where is None:
                    unbound["record"] += 1
                    continue
                place_record(c.correlation, self._lane(*where), step, name,
                             record_events.get(c.correlation, ""), end, call)
            elif kind is Call.WAIT_EVENT:
                sev = syncs_by_corr.get(c.correlation)
                placed = sev is not None and sev.stream is not None
                call = rec.host(kind, step, start, end, name, op=rec.next_op if placed else -1)
                if not placed:
                    unbound["wait"] += 1
                    continue
                lane = self._lane(sev.device, sev.stream)
                bound = record_op.get(sev.record_correlation, -1) \
                    if sev.record_correlation is not None else -1
                if bound < 0:
                    unbound["wait"] += 1
                event = f"event{sev.event_id}" if sev.event_id is not None else ""
                label = f"wait {event}".strip()
                op = rec.op(OpKind.WAIT, lane, step, label, event=event, bound=bound, issue=end,
                            call=call)
                waits.append(PendingWait(op, lane, end, bound))
            else:
                rec.host(kind, step, start, end, name)

        self.counts["outside_steps"] = outside
        self.counts["records_unplaced"] = unbound["record"]
        self.counts["waits_unbound"] = unbound["wait"]
        self.counts["syncs_unbound"] = unbound["sync"]
        infer_device_times(rec, measured, records, waits)
        self._markers(rec, first_launch, host_ann)
        meta = {
            "source": "kineto", "name": self.m.name, "forward_stream": fwd,
            "warmup_steps": self.m.warmup_steps, "batch_size": self.m.batch_size,
            "accept_tokens": self.m.accept_tokens, "gpu_clock_offset_us": self.gpu_offset,
            "host_thread": list(self.host) if self.host else None,
            "lanes": {lane: f"{d}:{s}" for (d, s), lane in self.lane_of.items()},
            "step_names": [n for _, _, n in self.steps],
            **self.cap.meta,
        }
        return rec.finish(meta)

    def _lane(self, device: int, stream: int) -> str:
        key = (device, stream)
        if key not in self.lane_of:
            multi = len({d for d, _ in self.lane_of} | {device}) > 1
            self.lane_of[key] = self.m.lane_for(device, stream, multi)
        return self.lane_of[key]

    @property
    def forward_lane_hint(self) -> str:
        if not hasattr(self, "_forward"):
            self._forward = self._forward_lane()
        return self._forward

    def _forward_lane(self) -> str:
        fwd = self.m.forward_stream
        lanes = set(self.lane_of.values())
        if fwd is not None:
            if fwd in lanes:
                return fwd
            by_id = [lane for (d, s), lane in self.lane_of.items() if str(s) == fwd
                     or f"{d}:{s}" == fwd]
            if by_id:
                return by_id[0]
            self.warnings.append(f"mapping forward_stream '{fwd}': no device work on it")
            return fwd
        if "forward" in lanes:
            return "forward"
        busy: Counter = Counter()
        for d in self.cap.device_events:
            busy[self.lane_of[(d.device, d.stream)]] += d.dur
        return busy.most_common(1)[0][0] if busy else "forward"

    def _device_op(self, rec: Recorder, measured: MeasuredLanes, d: DeviceEvent, step: int,
                   issue: float, phase: str, call: int) -> int:
        """A measured kernel, memcpy or memset: a kernel op (``call``: its launch); the
        recorder derives its span."""
        lane = self.lane_of[(d.device, d.stream)]
        start = d.ts + self.gpu_offset - self.origin
        end = start + d.dur
        op = rec.op(OpKind.KERNEL, lane, step, d.name, issue=issue, start=start, end=end,
                    phase=phase, call=call)
        self.device_info[op] = DeviceInfo(d.kind, d.grid, d.block, d.bytes, copy_kind(d.name))
        measured.add(lane, issue, start, end)
        return op

    def _markers(self, rec: Recorder, first_launch: dict[int, float], host_ann) -> None:
        for i, (s, _, _) in enumerate(self.steps):
            rec.marker("step", i, s)
        if not self.steps and (first_launch or self.cap.device_events):
            rec.marker("step", 0, 0.0)
        run_batch: dict[int, float] = {}
        if self.run_batch_re is not None:
            for a in host_ann:
                if self.run_batch_re.search(a.name):
                    t = a.ts - self.origin
                    k = self.step_at(t)
                    if k >= 0 and k not in run_batch:
                        run_batch[k] = t
            if not run_batch:
                self.warnings.append(f"no annotation matches run_batch '{self.m.run_batch}': "
                                     f"using the first forward launch of each step")
        if not run_batch:
            run_batch = first_launch
        for k, t in sorted(run_batch.items()):
            rec.marker("run_batch", k, t)
        if self.steps:
            rec.marker("end", -1, self.steps[-1][1])
