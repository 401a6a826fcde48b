"""A read capture and its mapping → :class:`simwar.core.trace.Trace` (:class:`KinetoImport`).

:func:`import_kineto` reads a capture (:func:`simwar.capture.reader.read_capture`)
and builds its Trace with :class:`CaptureTraceBuilder` through
:class:`simwar.core.recorder.Recorder`. The Trace has lane ``cpu`` (the
scheduler thread: the mapping's ``host_thread``, else the thread with the step
ranges, else the one that issued most launches), a lane ``thread<tid>`` per other
thread that launched device work, and one lane per stream:

- every runtime call on the scheduler thread is a host span labelled with the call's
  name, with a typed ``call`` kind (:func:`simwar.capture.reader.call_kind`):
  ``launch`` (``cudaLaunchKernel`` & co, and any call that issued device work:
  a ``cudaMemcpyAsync`` or ``cudaMemsetAsync`` whose memcpy/memset is in the
  capture is a launch), ``graph_launch`` (``cudaGraphLaunch``), ``record``,
  ``wait_event``, ``synchronize`` (a ``blocked`` span with its site) and
  ``other``;
- on the other threads, the calls that launched device work (autograd's backward
  thread, a communication thread, ...), the records a wait or sync binds to and the
  stream waits are host spans on the thread's own lane (never ``blocked``: the
  scheduler's CPU blocked time is the scheduler thread's);
- device work (kernels, memcpys, memsets) becomes ``kernel`` ops whose
  ``ops.call`` is the span of the runtime call with the same correlation id
  *in the same process*, whichever thread issued it (-1 when that call is not in
  the capture); a call's span names the first op it issued (``spans.op``; a
  stream sync names its sync op, not the tail record it implies);
- records, stream waits and syncs become ``record``/``wait``/``sync`` ops,
  bound (``ops.bound``) by :func:`simwar.capture.binding.bind` (the one place the
  binding rules live, for captures that name the record and for PyTorch 2.11's,
  which write -1). Their
  device times are inferred by :mod:`simwar.core.rules` on each stream's measured
  tail (:func:`simwar.capture.device_times.infer_device_times`); a wait that held
  its stream becomes a ``wait`` span, which :mod:`simwar.analysis.metrics` counts
  as dependency idle.

Several processes (in one file, or several per-rank files given together) import as
ranks (:mod:`simwar.capture.ranks`): one Trace per rank, the primary rank's (the
mapping's ``process``, else the one with the step ranges) as :attr:`KinetoImport.trace`,
and all of them side by side in :attr:`KinetoImport.combined`.

:class:`CaptureTraceBuilder`'s assembly is one pass over the host items that needs every
piece it infers (host thread, steps, phases, lanes, binding); the rules that stand alone
live in binding, device_times, ranks, threads (which thread is the scheduler's) and
host_items (the host items' issue order, the ranges each call lies in), and what an import
returns in :mod:`simwar.capture.imported`. Where :func:`bind_capture` owns the records
(``consume``: :func:`simwar.capture.open.open_capture` and :func:`import_kineto`), the
assembly drops each one once it has passed it, so that the records and the Trace made of
them are not all held at once.

Imports: numpy, the standard library and simwar's capture and core modules; never the
simulator (api, executors, build) and no pandas (the caller runs
:mod:`simwar.analysis.metrics` on the result). Nothing prints: progress goes to an
optional callback.
"""

from __future__ import annotations

import re
from array import array
from collections import Counter
from operator import attrgetter
from pathlib import Path

import numpy as np

from simwar.capture.binding import Binding, bind
from simwar.capture.device_times import (
    MeasuredLanes,
    PendingRecord,
    PendingWait,
    infer_device_times,
)
from simwar.capture.host_items import enclosing_ranges, indices, issue_order
from simwar.capture.imported import DeviceInfo, DeviceInfos, KinetoImport, RankImport
from simwar.capture.mapping import Mapping, load_mapping
from simwar.capture.rank_files import align
from simwar.capture.ranks import (
    RankCapture,
    clock_offsets,
    primary_rank,
    split_processes,
    step_skew,
)
from simwar.capture.reader import (
    ProgressFn,
    call_kind,
    copy_kind,
    read_capture,
)
from simwar.capture.records import (
    Annotation,
    CaptureEvents,
    DeviceEvent,
    RuntimeCall,
    SyncEvent,
    launch_work,
    launches_by_corr,
    problem_lines,
)
from simwar.capture.sanity import check_capture
from simwar.capture.threads import ThreadNames, host_thread, launch_threads
from simwar.core.collector import gc_off
from simwar.core.program import tail_event
from simwar.core.ranks import side_by_side
from simwar.core.recorder import Recorder
from simwar.core.trace import HOST, Call, OpKind, Trace


@gc_off()
def import_kineto(path: str | Path | list, mapping: Mapping | dict | str | Path | None = None,
                  progress: ProgressFn | None = None) -> KinetoImport:
    """Read a Kineto capture (or several per-rank captures, a list of paths) and build its
    Trace (see the module docstring)."""
    mapping = load_mapping(mapping)
    paths = [Path(p) for p in path] if isinstance(path, (list, tuple)) else [Path(path)]
    caps = [read_capture(p, progress) for p in paths]
    return bind_capture(caps, mapping, [p.name for p in paths], consume=True)


@gc_off()
def bind_capture(caps: list[CaptureEvents], mapping: Mapping, names: list[str],
                 consume: bool = False) -> KinetoImport:
    """The import of one or more read captures (files) under a mapping: one Trace per rank,
    the primary one and all side by side (see the module docstring).

    ``consume``: the import owns the captures' records (the callers that read the files
    themselves): each record is dropped once the assembly has passed it, and the captures'
    device events, runtime calls and sync events are left empty, so that the records and
    the Trace built from them are not all held at once (the import's peak memory)."""
    given = list(caps)
    checked = [check_capture(c) for c in caps]
    caps = [c for c, _ in checked]
    sane = [w if len(caps) == 1 else f"{names[i]}: {w}"
            for i, (_, ws) in enumerate(checked) for w in ws]
    ranks, how = split_processes(caps)
    _, clock_note = clock_offsets(caps)
    firsts = [(_first_ts(r.cap), r.clock_offset_us) for r in ranks]
    origin = min((t + off for t, off in firsts if t is not None), default=0.0)
    primary = primary_rank(ranks, mapping)
    if consume:  # the records live on in the ranks' captures alone
        own = {id(r.cap) for r in ranks}
        for c in given + caps:
            if id(c) not in own:
                c.device_events, c.runtime_calls, c.sync_events = [], [], []
    del given
    built: list[tuple[RankCapture, KinetoImport, RankImport]] = []
    for r in ranks:
        builder = CaptureTraceBuilder(r.cap, mapping, origin - r.clock_offset_us, consume)
        imp = builder.build()
        imp.trace.meta.setdefault("file", names[r.file])
        if len(ranks) > 1:
            imp.trace.meta.update(rank=r.rank, process=r.pid, clock_offset_us=r.clock_offset_us)
        info = RankImport(r.rank, r.pid, names[r.file], imp.trace, imp.counts, imp.warnings,
                          builder.host, builder.host_name, builder.host_reason,
                          builder.launch_threads, r.clock_offset_us)
        built.append((r, imp, info))
    if len(built) > 1:  # tensor-parallel ranks: one clock, aligned on their collectives
        traces, ranges, collectives, shifts = align(
            [b[2].trace for b in built], [b[1].annotations for b in built],
            [names[b[0].file] for b in built])
        for (_, imp, info), t, a, d in zip(built, traces, ranges, shifts):
            if d:
                info.clock_offset_us += d
                imp.origin_us -= d  # the trace moved by d: its 0 is d earlier in the file
                imp.trace = info.trace = t
                if imp.annotations and a:  # the counted events move with the ranges
                    shift = a[0][1] - imp.annotations[0][1]
                    imp.profiler_events = {k: v + shift
                                           for k, v in imp.profiler_events.items()}
                imp.annotations = a
    else:
        collectives, shifts = None, [0.0]
    main_r, main, _ = built[primary]
    infos = [b[2] for b in built]
    warnings = list(main.warnings)
    for r, imp, _ in built:
        if r is not main_r:
            warnings += [f"rank {r.rank} (pid {r.pid}): {w}" for w in imp.warnings]
    warnings = sane + warnings
    if clock_note:
        warnings.append(clock_note)
    if how.get("collision_by_lane"):
        warnings.append(f"{how['collision_by_lane']} device or sync events have a "
                        f"correlation id that several processes use: given to the process "
                        f"that owns most work on their stream")
    result = KinetoImport(main.trace, main.counts, main.ignored, warnings, main.annotations,
                          main.device_names, overhead=main.overhead,
                          device_info=main.device_info, ranks=infos,
                          device_syncs=main.device_syncs,
                          profiler_events=main.profiler_events, origin_us=main.origin_us)
    result.unmodelled = dict(sum((Counter(c.unmodelled) for c in caps), Counter()))
    result.collectives, result.collective_shift_us = collectives, shifts
    if len(infos) > 1:
        result.combined = side_by_side([i.trace for i in infos], [
            {"rank": i.rank, "process": i.pid, "file": i.file,
             "clock_offset_us": i.clock_offset_us,
             "host_thread": list(i.host_thread) if i.host_thread else None,
             "name": i.host_thread_name} for i in infos])
        result.skew = step_skew([i.trace for i in infos])
    else:
        result.combined = main.trace
    return result


_ts = attrgetter("ts")
_NO_ID = object()  # equal to no thread id (no host thread)


def _first_ts(cap: CaptureEvents) -> float | None:
    starts = [min(map(_ts, seq)) for seq in (cap.device_events, cap.runtime_calls,
                                             cap.annotations, cap.sync_events) if seq]
    return min(starts) if starts else None


class CaptureTraceBuilder:
    """Builds one process's Trace: :meth:`build` once, after construction.

    Holds what the pass infers along the way (the host thread, the lane of each
    device stream, the step ranges, the clock origin and GPU offset) and the counts
    and warnings that :class:`KinetoImport` reports. ``origin`` is the capture time
    that becomes 0 (default: the capture's first event).
    """

    def __init__(self, cap: CaptureEvents, mapping: Mapping, origin: float | None = None,
                 consume: bool = False):
        self.cap = cap
        #: the build owns the capture's records: each is dropped once the assembly has passed
        #: it, and the capture's device events, runtime calls and sync events are emptied
        #: (:func:`bind_capture` ``consume``)
        self.consume = consume
        self._busy: Counter | None = None
        self._had_device = False
        self.m = mapping
        self.warnings: list[str] = problem_lines(cap)
        self.device_info = DeviceInfos()
        self._infos: dict[tuple, int] = {}  # equal facts, one DeviceInfo (its code)
        self.device_syncs: list[int] = []
        self.counts: Counter = Counter()
        self.ignored: Counter = Counter(cap.ignored)
        #: a name's phase by the mapping's rules (None: none matches), and a range's site
        self.phase_of = mapping.phase_of()
        self.site_of = mapping.site_of()
        #: whether a range is a step's (the mapping's one step test)
        self.is_step = mapping.step_test()
        self.run_batch_re = re.compile(mapping.run_batch) if mapping.run_batch else None
        self._given_origin = origin
        self.host_name = ""
        self.host_reason = ""
        self.launch_threads: list[tuple[str, int, int]] = []

    # ------------------------------------------------------------------ entry
    def build(self) -> KinetoImport:
        cap, m = self.cap, self.m
        self.counts.update({k: cap.counts.get(k, 0) for k in
                            ("kernel", "memcpy", "memset", "cuda_sync", "runtime",
                             "annotation")})
        # the device events' streams and each launch's work, in one pass
        by_corr, streams = launches_by_corr(cap.device_events)
        multi = len({dev for dev, _ in streams}) > 1
        self.lane_of = {key: m.lane_for(*key, multi) for key in streams}
        del streams
        self._check_mapping_streams()

        self.host, self.host_reason, note = host_thread(cap, m, self.is_step, by_corr)
        if note:
            self.warnings.append(note)
        names = ThreadNames(cap.thread_names)
        self.launch_threads = launch_threads(cap, by_corr, names)
        if self.host is not None:
            self.host_name = names(self.host)
        calls = sorted(cap.runtime_calls, key=_ts)
        syncs_by_corr: dict[int, SyncEvent] = {}
        for s in cap.sync_events:
            if s.correlation >= 0:
                syncs_by_corr[s.correlation] = s
        self.binding = bind(calls, by_corr, syncs_by_corr)
        # the host thread's calls, and of the other threads': their launches, the records a
        # use binds to, their stream waits (one pass over the calls)
        bound_records = self.binding.bound_records
        host_calls: list[RuntimeCall] = []
        other_calls: list[RuntimeCall] = []
        to_host, to_other = host_calls.append, other_calls.append
        pid, tid = self.host if self.host is not None else (_NO_ID, _NO_ID)
        for c in calls:
            if c.pid == pid and c.tid == tid:
                to_host(c)
            elif c.correlation in by_corr or c.correlation in bound_records \
                    or call_kind(c.name, False) is Call.WAIT_EVENT:
                to_other(c)
        self.counts["host_runtime_calls"] = len(host_calls)
        self.counts["other_thread_calls"] = len(other_calls)
        self.ignored["runtime_other_threads"] += (len(cap.runtime_calls) - len(host_calls)
                                                  - len(other_calls))

        self.origin = self._origin()
        self.gpu_offset = self._gpu_offset(by_corr)
        host_ann = sorted((a for a in cap.annotations if (a.pid, a.tid) == self.host)
                          if self.host else cap.annotations, key=lambda a: (a.ts, -a.dur))
        self.steps = self._steps(host_ann)
        enclosing = enclosing_ranges(host_calls, host_ann, self.phase_of, self.site_of)

        # what is read of the records after the assembly, taken before it (a consuming
        # build frees each record as the assembly passes it)
        names = sorted({d.name for d in cap.device_events})
        profiler_events = self._profiler_events(host_calls, host_ann, by_corr)
        self._had_device = bool(cap.device_events)
        self._busy = self._stream_busy() if self._busy_needed() else None
        held = [host_calls, other_calls]
        del calls, host_calls, other_calls, bound_records
        if self.consume:
            cap.runtime_calls = []
        trace = self._assemble(held, by_corr, enclosing, host_ann, syncs_by_corr)
        annotations = [(a.name, a.ts - self.origin, a.ts + a.dur - self.origin)
                       for a in host_ann]
        overhead = [(a.name, a.ts - self.origin, a.ts + a.dur - self.origin)
                    for a in sorted(cap.overhead, key=lambda a: a.ts)]
        return KinetoImport(trace, dict(self.counts), dict(self.ignored), self.warnings,
                            annotations, names, overhead=overhead, device_info=self.device_info,
                            device_syncs=self.device_syncs, profiler_events=profiler_events,
                            origin_us=self.origin)

    def _profiler_events(self, host_calls, host_ann, by_corr) -> dict:
        """:attr:`KinetoImport.profiler_events`: the host thread's recorded events by kind,
        each at its start; device activities at the start of the host call that issued them
        (its correlation id), where their cost is paid (a graph's kernels at its launch).
        Empty for a file that says it was not profiled (:attr:`CaptureEvents.profiled`)."""
        o, cap = self.origin, self.cap
        if not cap.profiled:  # a simulation written as a capture: no profiler recorded it
            return {}
        out: dict[str, list[float]] = {"user_annotation": [a.ts - o for a in host_ann],
                                       "cuda_runtime": [c.ts - o for c in host_calls]}
        for cat, evs in cap.host_events.items():
            out[cat] = [ts - o for pid, tid, ts in evs if (pid, tid) == self.host]
        device = {"kernel": "kernel", "memcpy": "gpu_memcpy", "memset": "gpu_memset"}
        syncs = Counter(s.correlation for s in cap.sync_events if s.correlation >= 0)
        # the loop runs once per host call: lookups bound once, each kind's list found once
        get_devs, get_syncs, of_kind = by_corr.get, syncs.get, {}
        for c in host_calls:
            devs = get_devs(c.correlation)
            if devs is not None:
                t = c.ts - o
                for d in launch_work(devs):
                    starts = of_kind.get(d.kind)
                    if starts is None:
                        starts = of_kind[d.kind] = out.setdefault(device[d.kind], [])
                    starts.append(t)
            n = get_syncs(c.correlation)
            if n:
                out.setdefault("cuda_sync", []).extend([c.ts - o] * n)
        return {k: np.sort(np.asarray(v, dtype=float)) for k, v in out.items() if v}

    # ------------------------------------------------------------------ setup
    def _check_mapping_streams(self) -> None:
        present = {str(s) for _, s in self.lane_of} | {f"{d}:{s}" for d, s in self.lane_of}
        missing = [k for k in self.m.streams if k not in present]
        if missing:
            self.warnings.append(f"mapping names streams with no device work in the capture: "
                                 f"{', '.join(missing)}")

    def _origin(self) -> float:
        if self._given_origin is not None:
            return self._given_origin
        first = _first_ts(self.cap)
        return 0.0 if first is None else first

    def _gpu_offset(self, by_corr) -> float:
        """Device-clock correction; 'auto' shifts so no kernel starts before its launch."""
        off = self.m.gpu_clock_offset_us
        lead = array("d")  # each launched op's start less its call's, one lookup a call
        add, get = lead.append, by_corr.get
        for c in self.cap.runtime_calls:
            work = get(c.correlation)
            if work is not None:
                t = c.ts
                for d in launch_work(work):
                    add(d.ts - t)
        lead = np.frombuffer(lead, np.float64) if len(lead) else np.zeros(0)
        if off == "auto":
            early = lead[lead < 0]
            off = -float(early.min()) if len(early) else 0.0
        else:
            off = float(off)
            still = int(np.count_nonzero(lead + off < 0))
            if still:
                self.warnings.append(f"{still} device ops start before their host call: the "
                                     f"GPU clock looks offset (try gpu_clock_offset_us: auto)")
        self.counts["device_before_launch"] = int(np.count_nonzero(lead + off < 0))
        return float(off)

    def _steps(self, host_ann: list[Annotation]) -> list[tuple[float, float, str]]:
        """Top-level step ranges (relative µs): annotations matching the steps pattern."""
        is_step = self.is_step
        cand = [a for a in host_ann if is_step(a.name)]
        if not cand and self.host is not None:
            cand = sorted((a for a in self.cap.annotations if is_step(a.name)),
                          key=lambda a: (a.ts, -a.dur))
        out: list[tuple[float, float, str]] = []
        for a in cand:
            s, e = a.ts - self.origin, a.ts + a.dur - self.origin
            if out and e <= out[-1][1]:  # nested in the previous step: keep the outer range
                continue
            out.append((s, e, a.name))
        if not out and (self.cap.device_events or self.cap.runtime_calls):
            self.warnings.append(f"no annotation matches the steps pattern '{self.m.steps}': "
                                 f"the whole capture is one step{self._preset_hint()}")
        return out

    def _preset_hint(self) -> str:
        """``; its 'step#3' ranges are --preset sglang's steps``: a shipped preset whose
        steps pattern the capture's ranges match, when its own pattern matched none."""
        # lazy: presets read the mapping files (and import this module's neighbours)
        from simwar.capture.presets import load_preset, preset_names

        names = {a.name for a in self.cap.annotations}
        for preset in preset_names():
            pattern = load_preset(preset).get("steps")
            if not isinstance(pattern, str) or pattern == self.m.steps:
                continue
            hit = next((n for n in sorted(names) if re.search(pattern, n)), None)
            if hit is not None:
                return (f"; its ranges like '{hit}' are the steps of --preset {preset} (give "
                        f"--preset {preset}, or steps: in a mapping)")
        return ""

    def steps_at(self, times: np.ndarray) -> np.ndarray:
        """The step of each of ``times`` (µs, host clock), by one search: the last step
        started at or before it (-1: before the first, or after the last one's end; 0 of
        each where there are no steps)."""
        if not self.steps:
            return np.zeros(len(times), np.int64)
        step = np.searchsorted(np.asarray(self._step_starts, float), times, side="right") - 1
        step[(step == len(self.steps) - 1) & (times > self.steps[-1][1])] = -1
        return step

    def kernel_phase(self, name: str, from_annotation: str | None) -> str:
        """A device op's phase: the first phase rule its name matches, else the range it was
        launched in, else the mapping's unmatched phase (the rules are tried once a name:
        :class:`~simwar.capture.mapping.FirstMatch`)."""
        phase = self.phase_of[name]
        if phase is not None:
            return phase
        if from_annotation is not None:
            return from_annotation
        return self.m.unmatched_phase()

    # ------------------------------------------------------------------ assembly
    def _assemble(self, held: list, by_corr, enclosing, host_ann, syncs_by_corr) -> Trace:
        """The Trace from ``held`` (``[host calls, other threads' calls]``, emptied: the
        assembly owns the calls) and the launches' device work by correlation id."""
        o, g = self.origin, self.gpu_offset
        self._step_starts = [s for s, _, _ in self.steps]
        bnd: Binding = self.binding
        host_calls, other_calls = held
        held.clear()
        # the host items in issue order: every call (host thread's, then other threads'),
        # then device work with no call in the capture; ordered by (issue time, calls before
        # device work, index), ties in that order, by one stable sort of three columns
        payload: list = host_calls + other_calls
        n_host = len(host_calls)
        del host_calls, other_calls
        n_calls = len(payload)
        issued = {c.correlation for c in payload}
        # a consuming build drops each record once passed: a launch's device work is taken
        # out of by_corr by its call (each id is one call's here), and the rest now
        consume = self.consume and len(issued) == n_calls
        orphans = []
        for corr, devs in by_corr.items():
            if corr not in issued:  # the launch is not in the capture (or not a runtime call)
                payload += launch_work(devs)
                orphans.append(corr)
        del issued
        payload += (d for d in self.cap.device_events if d.correlation < 0)
        if consume:
            for corr in orphans:
                del by_corr[corr]
            self.cap.device_events = []
            self.cap.sync_events = []
        del orphans
        n_dev = len(payload) - n_calls
        self.counts["device_without_launch"] = n_dev
        if n_dev:
            self.warnings.append(f"{n_dev} device ops have no host call in "
                                 f"the capture (step from their start time)")
        order, issue_times = issue_order(payload, n_calls, o, g)
        # every item's step by one search over the step starts, in issue order (a bisect per
        # item was a twentieth of the import's CPU time)
        item_steps = self.steps_at(issue_times)[order]
        del issue_times
        if len(order) < 2**31:  # held through the loop, at the import's peak: half as wide
            order, item_steps = order.astype(np.int32), item_steps.astype(np.int32)

        rec = Recorder()
        measured = MeasuredLanes()
        record_op: dict[int, int] = {}  # record call correlation -> op id
        records: list[PendingRecord] = []
        waits: list[PendingWait] = []
        outside = 0
        unbound = Counter()
        launches_by_lane: Counter = Counter()
        first_launch: dict[int, float] = {}  # step -> first forward-kernel launch start
        fwd = self.forward_lane_hint

        def place_record(corr: int | None, lane: str, step: int, label: str, event: str,
                         issue: float, call: int, graph_end: float | None = None) -> int:
            op = rec.op(OpKind.RECORD, lane, step, label, event=event, issue=issue, call=call)
            records.append(PendingRecord(op, lane, issue, graph_end))
            if corr is not None:
                record_op[corr] = op
            return op

        def event_name(corr: int) -> str:
            e = bnd.event.get(corr)
            return f"event{e}" if e is not None else ""

        lane_of, add_op, infos = self.lane_of, rec.op, self._infos
        new_info = self.device_info.new
        info_ops, info_codes = array("q"), array("i")  # each device op's facts, added at the end
        add_info_op, add_info_code = info_ops.append, info_codes.append
        work_of: dict[str, tuple] = {}  # lane -> the appends of its measured work's columns
        KERNEL = OpKind.KERNEL

        def device_op(d: DeviceEvent, step: int, issue: float, phase: str, call: int) -> None:
            """A measured kernel, memcpy or memset: a kernel op (``call``: its launch); the
            recorder derives its span."""
            lane = lane_of[(d.device, d.stream)]
            start = d.ts + g - o
            end = start + d.dur
            op = add_op(KERNEL, lane, step, d.name, "", -1, issue, start, end, phase, call)
            key = (d.kind, d.name, d.grid, d.block, d.bytes)
            code = infos.get(key)
            if code is None:  # one record for equal facts: most ops repeat a few kernels' facts
                code = infos[key] = new_info(DeviceInfo(d.kind, d.grid, d.block, d.bytes,
                                                        copy_kind(d.name)))
            add_info_op(op)
            add_info_code(code)
            work = work_of.get(lane)
            if work is None:
                work = work_of[lane] = measured.appends(lane)
            work[0](issue)
            work[1](end)
            work[2](start)

        # the loop's lookups, bound once (it runs once per host call and device op)
        kernel_phase, host = self.kernel_phase, rec.host
        in_graph, bound_stream, record_of = bnd.in_graph, bnd.stream, bnd.record_of
        thread_lane: dict[int, str] = {}
        bound_records = bnd.bound_records
        take_devs = by_corr.pop if consume else by_corr.get
        take_sync = syncs_by_corr.pop if consume else syncs_by_corr.get
        for index, step in zip(indices(order), indices(item_steps)):
            item = payload[index]
            if consume:
                payload[index] = None
            if index >= n_calls:
                # device work whose host call is not in the capture
                issue = item.ts + g - o
                if step < 0:
                    outside += 1
                    continue
                device_op(item, step, issue, kernel_phase(item.name, None), -1)
                continue
            c: RuntimeCall = item
            if index < n_host:
                host_lane = HOST
            else:
                host_lane = thread_lane.get(c.tid)
                if host_lane is None:
                    host_lane = thread_lane[c.tid] = f"thread{c.tid}"
            start, end = c.ts - o, c.ts + c.dur - o
            if step < 0:
                outside += 1
                continue
            ann_phase, site = enclosing[index] if 0 <= index < n_host else (None, None)
            devs = take_devs(c.correlation, None)
            name = c.name
            issued = devs is not None
            kind = call_kind(name, issued)
            if issued:
                devs = launch_work(devs)
                if len(devs) > 1:  # several ops (a graph launch)
                    devs = sorted(devs, key=_ts)
                    phases = [kernel_phase(d.name, ann_phase) for d in devs]
                    phase = next((p for p in phases if p), "")
                else:  # most launches: one op
                    phase = kernel_phase(devs[0].name, ann_phase)
                    phases = (phase,)
                    phase = phase or ""
                call = host(kind, step, start, end, name, phase, "", rec.next_op, host_lane)
                launches_by_lane[host_lane] += 1
                if c.correlation in in_graph and c.correlation in bound_stream:
                    # an event recorded by a node inside the launched graph (where in the graph
                    # is not in the capture): first in the launch's stream order, and it fires
                    # no earlier than when its stream drains the work issued before the launch
                    # returned, no later than the graph's end (device_times)
                    lane = self._lane(*bound_stream[c.correlation])
                    ends = [d.ts + d.dur + g - o for d in devs
                            if lane_of[(d.device, d.stream)] == lane]
                    place_record(c.correlation, lane, step, f"{name} record",
                                 event_name(c.correlation), end, call,
                                 max(ends) if ends else None)
                for d, p in zip(devs, phases):
                    device_op(d, step, end, p, call)
                if host_lane == HOST and step not in first_launch and phase and any(
                        lane_of[(d.device, d.stream)] == fwd for d in devs):
                    first_launch[step] = start
            elif kind is Call.SYNCHRONIZE:
                sev = take_sync(c.correlation, None)
                tail = sev is not None and sev.kind == "Stream Sync" and sev.stream is not None
                # the span names the sync op (after the stream's tail record, if any)
                call = host(kind, step, start, end, name, site=site or "sync",
                                op=rec.next_op + (1 if tail else 0))
                bound, event = -1, ""
                if tail:
                    # a stream sync waits for the stream's tail: a fresh record at the call
                    lane = self._lane(sev.device, sev.stream)
                    event = tail_event(lane)
                    bound = place_record(None, lane, step, event, event, start, call)
                elif c.correlation in record_of:
                    bound = record_op.get(record_of[c.correlation], -1)
                    event = f"event{sev.event_id}" if sev.event_id is not None else ""
                if bound < 0:
                    unbound["sync"] += 1
                sync = rec.op(OpKind.SYNC, HOST, step, name, event=event, bound=bound,
                              issue=start, start=start, end=end, call=call)
                if sev is not None and sev.kind == "Context Sync":  # waited for every stream
                    self.device_syncs.append(sync)
            elif kind is Call.RECORD:
                where = bound_stream.get(c.correlation) \
                    if c.correlation in bound_records else None
                call = host(kind, step, start, end, name, "", "",
                            rec.next_op if where is not None else -1, host_lane)
                if where is None:
                    unbound["record"] += 1
                    continue
                place_record(c.correlation, self._lane(*where), step, name,
                             event_name(c.correlation), end, call)
            elif kind is Call.WAIT_EVENT:
                sev = take_sync(c.correlation, None)
                placed = sev is not None and sev.stream is not None
                call = host(kind, step, start, end, name, "", "", rec.next_op if placed else -1,
                            host_lane)
                if not placed:
                    unbound["wait"] += 1
                    continue
                lane = self._lane(sev.device, sev.stream)
                rc = record_of.get(c.correlation)
                bound = record_op.get(rc, -1) if rc is not None else -1
                if bound < 0:
                    unbound["wait"] += 1
                event = f"event{sev.event_id}" if sev.event_id is not None else ""
                label = f"wait {event}".strip()
                op = rec.op(OpKind.WAIT, lane, step, label, event=event, bound=bound, issue=end,
                            call=call)
                waits.append(PendingWait(op, lane, end, bound))
            else:
                host(kind, step, start, end, name, "", "", -1, host_lane)

        del payload, order, item_steps  # what follows holds no more than the Trace it finishes
        self.device_info.extend(info_ops, info_codes)
        del info_ops, info_codes
        if consume:  # emptied by the loop, but a dict keeps its table until cleared
            by_corr.clear()
            syncs_by_corr.clear()
            enclosing.clear()
        self.counts["outside_steps"] = outside
        self.counts["records_unplaced"] = unbound["record"]
        self.counts["waits_unbound"] = unbound["wait"]
        self.counts["syncs_unbound"] = unbound["sync"]
        # waits and event syncs that name the cudaEventRecord they bind to (PyTorch 2.11's
        # profiler writes -1: the other rules of simwar.capture.binding bind those)
        rules = bnd.rules()
        self.counts["sync_with_record"] = rules.get("named", 0)
        for rule, n in sorted(rules.items()):
            self.counts[f"bound_{rule}"] = n
        self.binding_unbound = dict(bnd.unbound)
        if consume:  # the binding's tables have served: only its counts are read from here
            for table in (bnd.record_of, bnd.stream, bnd.event, bnd.rule, bnd.in_graph,
                          bound_records, record_op):
                table.clear()
        self.counts["launches_other_threads"] = sum(
            n for lane, n in launches_by_lane.items() if lane != HOST)
        infer_device_times(rec, measured, records, waits)
        self._markers(rec, first_launch, host_ann)
        meta = {
            "source": "kineto", "name": self.m.name, "forward_stream": fwd,
            "warmup_steps": self.m.warmup_steps, "batch_size": self.m.batch_size,
            "accept_tokens": self.m.accept_tokens, "gpu_clock_offset_us": self.gpu_offset,
            "host_thread": list(self.host) if self.host else None,
            "host_thread_name": self.host_name, "host_thread_reason": self.host_reason,
            "launch_threads": [list(t) for t in self.launch_threads],
            "lanes": {lane: f"{d}:{s}" for (d, s), lane in self.lane_of.items()},
            "step_names": [n for _, _, n in self.steps],
            "binding": {"rules": dict(rules), "unbound": dict(bnd.unbound)},
            **{k: v for k, v in self.cap.meta.items() if k != "first_event_ts"},
            **self._hta_facts(),
        }
        return rec.finish(meta)

    def _hta_facts(self) -> dict:
        """What HTA's idle rule reads of the file and a Trace would not keep
        (:func:`simwar.analysis.idle.capture_idle`): the file's first complete event on the
        host clock (``first_event_us``) and how many ``ProfilerStep`` ranges it has."""
        first = self.cap.meta.get("first_event_ts")
        steps = {a.name for a in self.cap.annotations if a.name.startswith("ProfilerStep")}
        out = {"profiler_steps": len(steps)}
        if first is not None:
            out["first_event_us"] = first - self.origin
        return out

    def _lane(self, device: int, stream: int) -> str:
        key = (device, stream)
        if key not in self.lane_of:
            multi = len({d for d, _ in self.lane_of} | {device}) > 1
            self.lane_of[key] = self.m.lane_for(device, stream, multi)
        return self.lane_of[key]

    @property
    def forward_lane_hint(self) -> str:  # noqa: D401 - a lazily computed attribute
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
        busy = self._busy if self._busy is not None else self._stream_busy()
        return busy.most_common(1)[0][0] if busy else "forward"

    def _busy_needed(self) -> bool:
        """Whether :meth:`_forward_lane` picks the busiest stream (no forward stream named
        or called ``forward``)."""
        return self.m.forward_stream is None and "forward" not in set(self.lane_of.values())

    def _stream_busy(self) -> Counter:
        """The measured device time of each lane."""
        busy: Counter = Counter()
        for d in self.cap.device_events:
            busy[self.lane_of[(d.device, d.stream)]] += d.dur
        return busy

    def _markers(self, rec: Recorder, first_launch: dict[int, float], host_ann) -> None:
        for i, (s, _, _) in enumerate(self.steps):
            rec.marker("step", i, s)
        if not self.steps and (first_launch or self._had_device):
            rec.marker("step", 0, 0.0)
        run_batch: dict[int, float] = {}
        if self.run_batch_re is not None:
            search, hit = self.run_batch_re.search, {}  # the pattern tried once a name
            times = []
            for a in host_ann:
                h = hit.get(a.name)
                if h is None:
                    h = hit[a.name] = search(a.name) is not None
                if h:
                    times.append(a.ts - self.origin)
            for k, t in zip(self.steps_at(np.asarray(times, float)).tolist(), times):
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

