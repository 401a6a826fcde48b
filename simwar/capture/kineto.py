"""Kineto (torch.profiler) Chrome-trace captures → :class:`simwar.core.trace.Trace`.

``torch.profiler.profile(...).export_chrome_trace(path)`` writes Kineto's
Chrome-trace JSON: an object with ``traceEvents`` (and ``schemaVersion``,
``deviceProperties``, ``baseTimeNanoseconds``, ...). The events used here are
complete events (``ph: X``, ``ts``/``dur`` in µs) of these categories:

- ``kernel``, ``gpu_memcpy``, ``gpu_memset``: device work; ``pid`` is the
  device, ``tid`` the stream, ``args`` carry ``stream``, ``device`` and the
  ``correlation`` id of the host call that issued it (a ``cudaGraphLaunch``
  shares its correlation id with every kernel of the graph);
- ``cuda_runtime`` / ``cuda_driver``: host API calls on a CPU thread
  (``args.correlation``): launches, ``cudaEventRecord``,
  ``cudaStreamWaitEvent``, ``cudaEventSynchronize``, ``cudaStreamSynchronize``,
  ``cudaGraphLaunch``, ...;
- ``cuda_sync`` (with ``_ExperimentalConfig(enable_cuda_sync_events=True)``):
  ``Stream Wait Event``, ``Event Sync``, ``Stream Sync``, ``Context Sync`` with
  ``args.stream``, ``correlation`` (the host call), ``wait_on_stream`` and
  ``wait_on_cuda_event_record_corr_id`` (the ``cudaEventRecord`` call that
  last recorded the event): these bind waits and syncs to records;
- ``user_annotation`` (``record_function`` ranges, ``ProfilerStep#N``; older
  captures file ProfilerStep under ``cpu_op``): step segmentation, phases,
  sync sites.

Every other event (``cpu_op``, ``python_function``, ``ac2g`` flows, metadata,
instants, ...) is counted and ignored. The file is read with a streaming
JSON parser, so memory grows with the number of *used* events, not the file.

The Trace is built through :class:`simwar.core.recorder.Recorder`. It has lane
``cpu`` (the scheduler thread: the thread that issued most launches unless
the mapping names one) and one lane per stream:

- every runtime call on that thread is a host span labelled with the call's
  name, with a typed ``call`` kind (:func:`call_kind`): ``launch``
  (``cudaLaunchKernel`` & co, and any call that issued device work: a
  ``cudaMemcpyAsync`` or ``cudaMemsetAsync`` whose memcpy/memset is in the
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
  tail (see ``_Builder._device_times``); a wait that held its stream becomes
  a ``wait`` span, which :mod:`simwar.analysis.metrics` counts as dependency
  idle.

Imports: ijson, numpy, the standard library and simwar's stdlib-only modules;
no pandas (the caller runs :mod:`simwar.analysis.metrics` on the result).
Nothing prints: progress goes to an optional callback.
"""

from __future__ import annotations

import bisect
import gzip
import re
import sys
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import NamedTuple

from simwar.capture.mapping import Mapping, load_mapping
from simwar.core.recorder import Recorder
from simwar.core.rules import begins, fires, released
from simwar.core.trace import HOST, Call, OpKind, Trace

#: categories of device work (older captures spell some differently)
DEVICE_CATS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy",
               "Memcpy": "memcpy", "gpu_memset": "memset", "Memset": "memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "Driver"}
RECORD_CALLS = {"cudaEventRecord", "cudaEventRecordWithFlags", "cuEventRecord",
                "cuEventRecordWithFlags"}
WAIT_CALLS = {"cudaStreamWaitEvent", "cuStreamWaitEvent"}
SYNC_CALLS = {"cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize",
              "cuEventSynchronize", "cuStreamSynchronize", "cuCtxSynchronize"}
LAUNCH_CALLS = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaLaunchCooperativeKernel"}
GRAPH_CALLS = {"cudaGraphLaunch", "cuGraphLaunch"}
#: the typed call kind of a runtime call, by name (see :func:`call_kind`)
CALL_KINDS: dict[str, Call] = {
    **dict.fromkeys(LAUNCH_CALLS, Call.LAUNCH), **dict.fromkeys(GRAPH_CALLS, Call.GRAPH_LAUNCH),
    **dict.fromkeys(RECORD_CALLS, Call.RECORD), **dict.fromkeys(WAIT_CALLS, Call.WAIT_EVENT),
    **dict.fromkeys(SYNC_CALLS, Call.SYNCHRONIZE)}
#: CUPTI writes an invalid stream id as uint32 -1
_INVALID_STREAMS = {-1, 4294967295}

ProgressFn = Callable[[int, int], None]


def call_kind(name: str, issued_work: bool) -> Call:
    """The call kind of a host runtime call named ``name``.

    A call that issued device work in the capture (its correlation id is on a
    kernel, memcpy or memset) is a launch: ``cudaGraphLaunch`` a graph launch,
    anything else (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ``cudaMemsetAsync``,
    ...) a kernel launch. Otherwise the name decides (a launch that issued
    nothing in the capture, e.g. during stream capture, is still a launch);
    calls of no known kind are ``Call.OTHER``.
    """
    kind = CALL_KINDS.get(name)
    if issued_work:
        return Call.GRAPH_LAUNCH if kind is Call.GRAPH_LAUNCH else Call.LAUNCH
    return Call.OTHER if kind is None else kind


class KinetoFormatError(ValueError):
    """The file is not a readable Kineto capture; the message is one line."""


# --------------------------------------------------------------------------- raw records
class DeviceEvent(NamedTuple):
    kind: str  # kernel | memcpy | memset
    name: str
    device: int
    stream: int
    ts: float
    dur: float
    correlation: int


class RuntimeCall(NamedTuple):
    name: str
    pid: int
    tid: int
    ts: float
    dur: float
    correlation: int


class SyncEvent(NamedTuple):
    kind: str  # Stream Wait Event | Event Sync | Stream Sync | Context Sync
    device: int
    stream: int | None
    ts: float
    correlation: int
    wait_on_stream: int | None
    event_id: int | None
    record_correlation: int | None


class Annotation(NamedTuple):
    name: str
    pid: int
    tid: int
    ts: float
    dur: float


@dataclass
class Capture:
    """The used events of one capture, plus counts of everything seen."""

    device_events: list[DeviceEvent] = field(default_factory=list)
    runtime_calls: list[RuntimeCall] = field(default_factory=list)
    sync_events: list[SyncEvent] = field(default_factory=list)
    annotations: list[Annotation] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)
    ignored: Counter = field(default_factory=Counter)
    meta: dict = field(default_factory=dict)


# --------------------------------------------------------------------------- reading
def read_capture(path: str | Path, progress: ProgressFn | None = None,
                 chunk_bytes: int = 1 << 20) -> Capture:
    """Stream a ``.json`` or ``.json.gz`` Kineto capture into a :class:`Capture`.

    ``progress(done_bytes, total_bytes)`` is called after each chunk (bytes of
    the file on disk, compressed for ``.gz``).
    """
    import ijson

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: file not found")
    total = path.stat().st_size
    cap = Capture()
    with open(path, "rb") as raw:
        fh = gzip.GzipFile(fileobj=raw) if _is_gzip(raw) else raw
        try:
            first = _first_byte(fh)
        except (OSError, EOFError) as e:
            raise KinetoFormatError(f"{path}: cannot decompress: {_one_line(e)}") from None
        if first is None:
            raise KinetoFormatError(f"{path}: empty file (expected a Kineto JSON object)")
        if first not in (b"{", b"["):
            raise KinetoFormatError(f"{path}: not JSON (starts with {first!r}; expected a "
                                    f"Kineto trace object)")
        try:
            base, props, seen_key = _stream(fh, first == b"{", cap, chunk_bytes,
                                            lambda: progress(raw.tell(), total)
                                            if progress is not None else None)
        except (OSError, EOFError) as e:
            raise KinetoFormatError(f"{path}: cannot decompress: {_one_line(e)}") from None
        except ijson.JSONError as e:
            raise KinetoFormatError(f"{path}: not valid JSON: {_one_line(e)}") from None
    if first == b"{" and not seen_key:
        raise KinetoFormatError(f"{path}: no 'traceEvents' array (not a Kineto/Chrome trace)")
    if base:
        cap.meta["base_time_ns"] = int(base[0])
    if props:
        cap.meta["devices"] = [{k: p.get(k) for k in ("id", "name", "computeMajor",
                                                       "computeMinor", "numSms") if k in p}
                               for p in props if isinstance(p, dict)]
    if progress is not None:
        progress(total, total)
    return cap


def _stream(fh, is_object: bool, cap: Capture, chunk_bytes: int, tick) -> tuple:
    """Feed the file to ijson's push parsers chunk by chunk, classifying events as they come."""
    import ijson

    # Chrome's JSON Array Format is a bare list of events; Kineto writes the object form
    events = ijson.sendable_list()
    base = ijson.sendable_list()
    props = ijson.sendable_list()
    coros = [ijson.items_coro(events, "traceEvents.item" if is_object else "item",
                              use_float=True)]
    if is_object:
        coros.append(ijson.items_coro(base, "baseTimeNanoseconds", use_float=True))
        coros.append(ijson.items_coro(props, "deviceProperties.item", use_float=True))
    seen_key = not is_object
    tail = b""
    while True:
        chunk = fh.read(chunk_bytes)
        if not chunk:
            break
        if not seen_key:
            # the key may straddle two chunks; an empty array yields no events to prove it
            seen_key = b'"traceEvents"' in tail + chunk
            tail = chunk[-16:]
        for coro in coros:
            coro.send(chunk)
        for ev in events:
            _classify(ev, cap)
        del events[:]
        tick()
    for coro in coros:
        coro.close()
    for ev in events:
        _classify(ev, cap)
    return base, props, seen_key


def _is_gzip(fh) -> bool:
    magic = fh.read(2)
    fh.seek(0)
    return magic == b"\x1f\x8b"


def _first_byte(fh) -> bytes | None:
    """The first non-blank byte; rewinds (gzip streams support seek(0))."""
    while True:
        block = fh.read(4096)
        if not block:
            fh.seek(0)
            return None
        stripped = block.lstrip()
        if stripped:
            fh.seek(0)
            return stripped[:1]


def _one_line(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _int(v) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    if isinstance(v, str):
        try:
            return int(v)
        except ValueError:
            return None
    return None


def _num(v) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    return None


def _classify(ev, cap: Capture) -> None:
    if not isinstance(ev, dict):
        cap.ignored["malformed"] += 1
        return
    ph = ev.get("ph")
    cat = ev.get("cat") or ""
    if ph != "X":
        # flows (ac2g: s/f), metadata (M), instants (i), counters (C), ...
        cap.ignored[f"{cat or 'ph'}:{ph}" if ph != "M" else "metadata"] += 1
        return
    ts = _num(ev.get("ts"))
    dur = _num(ev.get("dur", 0.0))
    name = ev.get("name")
    if ts is None or dur is None or not isinstance(name, str):
        cap.ignored["malformed"] += 1
        return
    args = ev.get("args")
    if not isinstance(args, dict):
        args = {}
    intern = sys.intern
    if cat in DEVICE_CATS:
        kind = DEVICE_CATS[cat]
        stream = _int(args.get("stream", ev.get("tid")))
        device = _int(args.get("device", ev.get("pid")))
        if stream is None or device is None:
            cap.ignored["malformed"] += 1
            return
        corr = _int(args.get("correlation"))
        cap.device_events.append(DeviceEvent(kind, intern(name), device, stream, ts, dur,
                                             -1 if corr is None else corr))
        cap.counts[kind] += 1
    elif cat in RUNTIME_CATS:
        corr = _int(args.get("correlation"))
        cap.runtime_calls.append(RuntimeCall(intern(name), _int(ev.get("pid")) or 0,
                                             _int(ev.get("tid")) or 0, ts, dur,
                                             -1 if corr is None else corr))
        cap.counts["runtime"] += 1
    elif cat == "cuda_sync":
        kind = args.get("cuda_sync_kind", name)
        corr = _int(args.get("correlation"))
        stream = _int(args.get("stream"))
        wait_on = _int(args.get("wait_on_stream"))
        rec = _int(args.get("wait_on_cuda_event_record_corr_id"))
        cap.sync_events.append(SyncEvent(
            intern(str(kind)), _int(args.get("device", ev.get("pid"))) or 0,
            None if stream in _INVALID_STREAMS else stream, ts, -1 if corr is None else corr,
            None if wait_on in _INVALID_STREAMS else wait_on,
            _int(args.get("wait_on_cuda_event_id")),
            None if rec is None or rec < 0 else rec))
        cap.counts["cuda_sync"] += 1
    elif cat == "user_annotation" or (cat == "cpu_op" and name.startswith("ProfilerStep#")):
        cap.annotations.append(Annotation(intern(name), _int(ev.get("pid")) or 0,
                                          _int(ev.get("tid")) or 0, ts, dur))
        cap.counts["annotation"] += 1
    else:
        cap.ignored[cat or "uncategorized"] += 1


# --------------------------------------------------------------------------- building
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
    return _Builder(cap, mapping).build()


class _Builder:
    def __init__(self, cap: Capture, mapping: Mapping):
        self.cap = cap
        self.m = mapping
        self.warnings: list[str] = []
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
        self._check_mapping_streams(devices)

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
        return KinetoImport(trace, dict(self.counts), dict(self.ignored), self.warnings,
                            annotations, names)

    # ------------------------------------------------------------------ setup
    def _check_mapping_streams(self, devices: set[int]) -> None:
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
        measured = _MeasuredLanes()
        record_op: dict[int, int] = {}  # record call correlation -> op id
        records: list[_PendingRecord] = []
        waits: list[_PendingWait] = []
        outside = 0
        unbound = Counter()
        first_launch: dict[int, float] = {}  # step -> first forward-kernel launch start
        fwd = self.forward_lane_hint

        def place_record(corr: int | None, lane: str, step: int, label: str, event: str,
                         issue: float, call: int) -> int:
            op = rec.op(OpKind.RECORD, lane, step, label, event=event, issue=issue, call=call)
            records.append(_PendingRecord(op, lane, issue))
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
                waits.append(_PendingWait(op, lane, step, end, label, bound))
            else:
                rec.host(kind, step, start, end, name)

        self.counts["outside_steps"] = outside
        self.counts["records_unplaced"] = unbound["record"]
        self.counts["waits_unbound"] = unbound["wait"]
        self.counts["syncs_unbound"] = unbound["sync"]
        self._device_times(rec, measured, records, waits)
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

    def _device_op(self, rec: Recorder, measured: _MeasuredLanes, d: DeviceEvent, step: int,
                   issue: float, phase: str, call: int) -> int:
        """A measured kernel, memcpy or memset: a kernel op (``call``: its launch); the
        recorder derives its span."""
        lane = self.lane_of[(d.device, d.stream)]
        start = d.ts + self.gpu_offset - self.origin
        end = start + d.dur
        op = rec.op(OpKind.KERNEL, lane, step, d.name, issue=issue, start=start, end=end,
                    phase=phase, call=call)
        measured.add(lane, issue, start, end)
        return op

    def _device_times(self, rec: Recorder, measured: _MeasuredLanes,
                      records: list[_PendingRecord], waits: list[_PendingWait]) -> None:
        """Infer when records fired and how long waits held their stream.

        The capture measures device work but not records and waits, so they are
        placed by :mod:`simwar.core.rules` on each stream's measured tail (the latest
        end of the device work issued before the host call returned):

        - a record fires at ``fires(tail, issue)``: when its stream drains the
          work issued before it;
        - a wait is reached at ``begins(tail, issue)`` and released, by the
          rule, at ``released(reach, record firing, 0, ...)`` (unbound: at its
          reach): the capture does not show the cross-stream latency, so this
          is a lower bound. The next device op issued on the stream after the
          wait bounds it from the measurement: if that op was issued by the
          rule's release, it was queued behind the wait and ran as soon as the
          wait let it go, so its measured start *is* the release (dependency
          plus latency); if it was issued later, the wait had let go by the
          time it started, so the release is at most its start.

        A wait that held its stream becomes a ``wait`` span (dependency idle).
        """
        lane_of_record = {r.op: r.lane for r in records}
        for r in records:
            t = fires(measured.tail(r.lane, r.issue), r.issue)
            rec.set_times(r.op, t, t)
        fired = rec.op_end
        for w in waits:
            reach = begins(measured.tail(w.lane, w.issue), w.issue)
            release = reach
            if w.bound >= 0:
                release = released(reach, fired[w.bound], 0.0, lane_of_record[w.bound] == w.lane)
            nxt = measured.next_issued(w.lane, w.issue)
            if nxt is not None and nxt.start >= reach:
                if nxt.issue <= release:  # queued behind the wait: held until it ran
                    release = nxt.start
                else:  # it ran then, so the wait was released by then
                    release = min(release, nxt.start)
            rec.set_times(w.op, reach, release)  # held (release > reach): a wait span

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


class _PendingRecord(NamedTuple):
    """A record op whose firing is inferred once every measured kernel is known."""

    op: int
    lane: str
    issue: float  # when the host call that issued it returned (a stream sync: its start)


class _PendingWait(NamedTuple):
    """A stream-wait op whose reach and release are inferred after the pass."""

    op: int
    lane: str
    step: int
    issue: float
    label: str
    bound: int  # the record op it waits for, -1: none


class _Issued(NamedTuple):
    issue: float
    start: float


class _MeasuredLanes:
    """Per stream, the measured device work in issue order.

    ``tail(lane, t)`` is the running tail: the latest measured end of the work
    issued strictly before host time ``t`` (-inf: none), what a record or wait
    issued at ``t`` queues behind. ``next_issued(lane, t)`` is the first work
    issued at or after ``t``. Work is ordered by (issue, end, start); the
    lookups index it once it is complete.
    """

    def __init__(self) -> None:
        self._work: dict[str, list[tuple[float, float, float]]] = defaultdict(list)
        self._index: dict[str, tuple[list[float], list[float], list[float]]] | None = None

    def add(self, lane: str, issue: float, start: float, end: float) -> None:
        self._work[lane].append((issue, end, start))
        self._index = None

    def _lane(self, lane: str) -> tuple[list[float], list[float], list[float]]:
        if self._index is None:
            self._index = {}
            for name, work in self._work.items():
                work.sort()
                self._index[name] = ([w[0] for w in work], list(accumulate(
                    (w[1] for w in work), max)), [w[2] for w in work])
        return self._index.get(lane, ([], [], []))

    def tail(self, lane: str, t: float) -> float:
        issue, tail, _ = self._lane(lane)
        i = bisect.bisect_left(issue, t)
        return tail[i - 1] if i > 0 else float("-inf")

    def next_issued(self, lane: str, t: float) -> _Issued | None:
        issue, _, start = self._lane(lane)
        i = bisect.bisect_left(issue, t)
        return _Issued(issue[i], start[i]) if i < len(issue) else None
