"""Read a Kineto (torch.profiler) Chrome-trace capture into a :class:`CaptureEvents`, in one pass.

``torch.profiler.profile(...).export_chrome_trace(path)`` writes Kineto's
Chrome-trace JSON: an object with ``traceEvents`` (and ``schemaVersion``,
``deviceProperties``, ``baseTimeNanoseconds``, ...). The events kept are
complete events (``ph: X``, ``ts``/``dur`` in µs; ``B``/``E`` pairs are paired
into complete events per thread) of these categories:

- ``kernel``, ``gpu_memcpy``, ``gpu_memset``: device work; ``pid`` is the
  device, ``tid`` the stream, ``args`` carry ``stream``, ``device`` and the
  ``correlation`` id of the host call that issued it (a ``cudaGraphLaunch``
  shares its correlation id with every kernel of the graph);
- ``cuda_runtime`` / ``cuda_driver``: host API calls on a CPU thread
  (``args.correlation``, unique within the process): launches,
  ``cudaEventRecord``, ``cudaStreamWaitEvent``, ``cudaEventSynchronize``, ...,
  and their HIP counterparts (:data:`HIP_TO_CUDA`, the table of what each HIP
  name means in CUDA terms);
- ``cuda_sync`` (with ``_ExperimentalConfig(enable_cuda_sync_events=True)``):
  ``Stream Wait Event``, ``Event Sync``, ``Stream Sync``, ``Context Sync`` with
  ``args.stream``, ``correlation`` (the host call), ``wait_on_stream``,
  ``wait_on_cuda_event_id`` and ``wait_on_cuda_event_record_corr_id`` (the
  record call; -1 in PyTorch 2.11: :mod:`simwar.capture.binding` binds those);
- ``user_annotation`` (``record_function`` ranges, ``ProfilerStep#N``; older
  captures file ProfilerStep under ``cpu_op``): step segmentation, phases,
  sync sites;
- ``overhead`` (the profiler's own stalls, e.g. ``Activity Buffer Request``):
  kept as ranges (:attr:`CaptureEvents.overhead`) so that a fit can leave out the
  steps they fell in;
- metadata (``ph: M``): thread and process names, which the report uses to name
  the threads that launch.

A kernel keeps its launch dims (``args.grid``, ``args.block``: what tells two
captured graphs of one phase apart), a memcpy or memset its ``args.bytes``.

Device activity of a kind simwar does not model (MTIA's ``mtia_*`` categories,
:data:`UNMODELLED_DEVICE`) is counted per category; every other event
(``cpu_op``, ``python_function``, ``ac2g`` flows, instants, ...) is counted and
ignored, except that the start of each complete ``cpu_op`` and ``python_function``
event is kept, with its thread (:attr:`CaptureEvents.host_events`): the profiler's own
host cost is paid per recorded event, and the fit subtracts it by these counts
(:mod:`simwar.fit.profiler_cost`). A ``with_stack`` capture's Python frames
(``python_function``, :mod:`simwar.capture.frames`) are read in the same pass: every
frame's name (:attr:`CaptureEvents.frame_names`, what preset detection reads) and, as
ranges, the frames whose name matches the ``frames`` pattern given
(:attr:`CaptureEvents.frames`: the engines' own source files).

**Malformed events** are never read silently: an event of a used kind without a
numeric ``ts``, without a numeric ``dur`` or with a negative one, device work
with neither ``args.stream`` nor ``tid``, an unmatched ``B``/``E``, is dropped and
counted in ``CaptureEvents.problems`` by (kind, problem); :func:`problem_lines` words
them as the importer's warnings (``simwar import --strict`` makes them errors).
A UTF-8 byte-order mark is skipped; ``displayTimeUnit`` is kept in the meta and
never scales ``ts`` (the Chrome format's times are µs whatever the display unit).
A missing, empty or non-list ``traceEvents``, or one with no event object in it, is a
:class:`KinetoFormatError`.

**One pass** (:func:`read_capture`): the file (gzip or not) is read in blocks by
:class:`simwar.capture.trace_json.TraceJSON`, which hands the events over in batches,
decoded by msgspec into :class:`RawEvent` structs that keep only the fields used here
(msgspec skips the rest without building them), and reads exactly what ``json.load``
reads: where blocks fall never changes the result, and a file ``json.load`` refuses is a
one-line :class:`KinetoFormatError` with the byte offset in the file. Memory is the used
events, the columns of them that the checks read (:attr:`CaptureEvents.columns`, taken
batch by batch while the records are fresh in memory) and one block.

The file is over 600 lines because the check of every field it reads (the malformed-event
rules above) is one unit: split, each half would restate the other.

The records (the decoded :class:`RawEvent` and the kept :class:`DeviceEvent`,
:class:`RuntimeCall`, :class:`SyncEvent`, :class:`Annotation` in a :class:`CaptureEvents`)
are :mod:`simwar.capture.records`': msgspec structs, whose constructor is C code (no
Python-level call per event) and which take a third less memory than named tuples.

Imports: numpy, the standard library, :mod:`simwar.capture.records`,
:mod:`simwar.capture.trace_json`, :mod:`simwar.core.trace` and :mod:`simwar.core.collector`
(the collector off while a capture is read); never the
simulator (api, executors, build) and no pandas. Nothing prints: progress goes
to an optional callback.
"""

from __future__ import annotations

import functools
import gzip
import math
import re
import sys
import zlib
from array import array
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import fields
from operator import attrgetter
from pathlib import Path

import numpy as np

from simwar.capture.records import (
    Annotation,
    CaptureEvents,
    DeviceEvent,
    KeptColumns,
    RawArgs,
    RawEvent,
    RuntimeCall,
    SyncEvent,
)
from simwar.capture.trace_json import KinetoFormatError, TraceJSON
from simwar.core.collector import gc_off
from simwar.core.trace import Call

#: categories of device work (older captures spell some differently)
DEVICE_CATS = {"kernel": "kernel", "Kernel": "kernel", "gpu_memcpy": "memcpy",
               "Memcpy": "memcpy", "gpu_memset": "memset", "Memset": "memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime", "Driver"}
#: a Python frame of a ``with_stack`` capture (:mod:`simwar.capture.frames`)
FRAME_CAT = "python_function"
#: host events that are otherwise ignored but whose starts are kept, to be counted
COUNTED_HOST_CATS = ("cpu_op", FRAME_CAT)
#: device activity simwar does not model: counted and reported in one line
UNMODELLED_DEVICE = re.compile(r"^mtia")
RECORD_CALLS = {"cudaEventRecord", "cudaEventRecordWithFlags", "cuEventRecord",
                "cuEventRecordWithFlags"}
WAIT_CALLS = {"cudaStreamWaitEvent", "cuStreamWaitEvent"}
SYNC_CALLS = {"cudaEventSynchronize", "cudaStreamSynchronize", "cudaDeviceSynchronize",
              "cuEventSynchronize", "cuStreamSynchronize", "cuCtxSynchronize"}
LAUNCH_CALLS = {"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
                "cudaLaunchCooperativeKernel"}
GRAPH_CALLS = {"cudaGraphLaunch", "cuGraphLaunch"}
#: HIP runtime names and the CUDA call each one means (ROCm's Kineto writes HIP names
#: under the same categories). A HIP call is typed by its CUDA meaning; its label stays
#: the HIP name. Memory calls are launches when their copy is in the capture, like CUDA's.
HIP_TO_CUDA = {
    "hipLaunchKernel": "cudaLaunchKernel",
    "hipExtLaunchKernel": "cudaLaunchKernel",
    "hipModuleLaunchKernel": "cuLaunchKernel",
    "hipExtModuleLaunchKernel": "cuLaunchKernel",
    "hipHccModuleLaunchKernel": "cuLaunchKernel",
    "hipLaunchCooperativeKernel": "cudaLaunchCooperativeKernel",
    "hipExtLaunchMultiKernelMultiDevice": "cudaLaunchKernel",
    "hipGraphLaunch": "cudaGraphLaunch",
    "hipMemcpyAsync": "cudaMemcpyAsync",
    "hipMemcpyWithStream": "cudaMemcpyAsync",
    "hipMemcpy": "cudaMemcpy",
    "hipMemsetAsync": "cudaMemsetAsync",
    "hipMemset": "cudaMemset",
    "hipEventRecord": "cudaEventRecord",
    "hipEventRecordWithFlags": "cudaEventRecordWithFlags",
    "hipStreamWaitEvent": "cudaStreamWaitEvent",
    "hipEventSynchronize": "cudaEventSynchronize",
    "hipStreamSynchronize": "cudaStreamSynchronize",
    "hipDeviceSynchronize": "cudaDeviceSynchronize",
}
#: the typed call kind of a runtime call, by name (see :func:`call_kind`)
CALL_KINDS: dict[str, Call] = {
    **dict.fromkeys(LAUNCH_CALLS, Call.LAUNCH), **dict.fromkeys(GRAPH_CALLS, Call.GRAPH_LAUNCH),
    **dict.fromkeys(RECORD_CALLS, Call.RECORD), **dict.fromkeys(WAIT_CALLS, Call.WAIT_EVENT),
    **dict.fromkeys(SYNC_CALLS, Call.SYNCHRONIZE)}
CALL_KINDS.update({hip: CALL_KINDS[cuda] for hip, cuda in HIP_TO_CUDA.items()
                   if cuda in CALL_KINDS})
#: CUPTI writes an invalid stream id as uint32 -1
_INVALID_STREAMS = {-1, 4294967295}
#: a capture spanning longer than this is implausible for a profile (ts written in ns?)
PLAUSIBLE_SPAN_US = 600e6
#: a single device op longer than this is implausible (µs)
PLAUSIBLE_DUR_US = 60e6

#: ``progress(done_bytes, total_bytes)``, called as the file is read
ProgressFn = Callable[[int, int], None]


@functools.lru_cache(maxsize=4096)  # a few names recur: the kind found once a (name, issued)
def call_kind(name: str, issued_work: bool) -> Call:
    """The call kind of a host runtime call named ``name`` (CUDA, driver or HIP).

    A call that issued device work in the capture (its correlation id is on a
    kernel, memcpy or memset) is a launch: ``cudaGraphLaunch`` (``hipGraphLaunch``)
    a graph launch, anything else (``cudaLaunchKernel``, ``cudaMemcpyAsync``, ...)
    a kernel launch. Otherwise the name decides (a launch that issued nothing in
    the capture, e.g. during stream capture, is still a launch); calls of no known
    kind are ``Call.OTHER``.
    """
    kind = CALL_KINDS.get(name)
    if issued_work:
        return Call.GRAPH_LAUNCH if kind is Call.GRAPH_LAUNCH else Call.LAUNCH
    return Call.OTHER if kind is None else kind


def copy_kind(name: str) -> str:
    """A memcpy's kind as Kineto names it (``Memcpy DtoH (Device -> Pinned)``:
    ``DtoH (Device -> Pinned)``); '' for anything else."""
    return name[len("Memcpy "):] if name.startswith("Memcpy ") else ""



# --------------------------------------------------------------------------- reading
#: the object's keys besides ``traceEvents`` that the reader keeps (:func:`_meta`)
META_KEYS = ("baseTimeNanoseconds", "displayTimeUnit", "deviceProperties", "distributedInfo",
             "simwar")


@gc_off()  # the records make no cycles: see simwar.core.collector
def read_capture(path: str | Path, progress: ProgressFn | None = None,
                 chunk_bytes: int = 1 << 20, frames: str | None = None) -> CaptureEvents:
    """Read a ``.json`` or ``.json.gz`` Kineto capture into a :class:`CaptureEvents` in one pass.

    ``progress(done_bytes, total_bytes)`` is called after each block (bytes of the
    file on disk, compressed for ``.gz``). ``chunk_bytes`` is the block size (any size
    gives the same result: the tests read with blocks of a few bytes). ``frames``: a regular
    expression; the Python frames whose name it matches are kept as ranges
    (:attr:`CaptureEvents.frames`; ``""`` keeps every frame, None none).
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: file not found")
    total = path.stat().st_size
    cap = CaptureEvents()
    classify = _Classifier(cap, frames)
    with open(path, "rb") as raw:
        gz = _is_gzip(raw)
        fh = gzip.GzipFile(fileobj=raw) if gz else raw
        tick = (lambda: progress(raw.tell(), total)) if progress is not None else (lambda: None)
        text = TraceJSON(fh, name=str(path), event_type=RawEvent, meta_keys=META_KEYS,
                         on_events=classify.feed, on_reset=classify.reset,
                         block=chunk_bytes, tick=tick, compressed=gz)
        try:
            meta = text.read()
        except (OSError, EOFError, zlib.error) as e:
            raise KinetoFormatError(f"{path}: cannot decompress: {_one_line(e)}") from None
    if classify.n == 0:
        raise KinetoFormatError(f"{path}: 'traceEvents' is empty (no events: nothing was "
                                f"profiled)")
    if cap.ignored["not an object"] == classify.n:
        what = "the file is a JSON list" if text.bare else "'traceEvents' is a list"
        raise KinetoFormatError(f"{path}: {what} of {classify.n:,} values and no event object "
                                f"(expected a list of trace events)")
    classify.finish()
    _meta(cap, meta)
    bad = _not_finite(cap)
    if bad:
        raise KinetoFormatError(f"{path}: {bad} (expected finite times in µs)")
    _check_plausible(cap)
    if progress is not None:
        progress(total, total)
    return cap


def _meta(cap: CaptureEvents, meta: dict) -> None:
    """The kept top-level keys (:data:`META_KEYS`) into ``cap.meta``."""
    base = meta.get("baseTimeNanoseconds")
    if isinstance(base, (int, float)) and not isinstance(base, bool):
        cap.meta["base_time_ns"] = int(base)
    unit = meta.get("displayTimeUnit")
    if isinstance(unit, str):
        cap.meta["display_time_unit"] = unit
    props = meta.get("deviceProperties")
    if isinstance(props, list):
        cap.meta["devices"] = [{k: p.get(k) for k in ("id", "name", "computeMajor",
                                                       "computeMinor", "numSms") if k in p}
                               for p in props if isinstance(p, dict)]
    own = meta.get("simwar")
    if isinstance(own, dict) and own.get("profiled") is False:
        cap.profiled = False
    dist = meta.get("distributedInfo")
    if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        cap.meta["rank"] = dist["rank"]


def _is_gzip(fh) -> bool:
    magic = fh.read(2)
    fh.seek(0)
    return magic == b"\x1f\x8b"


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


def _kind_of(cat) -> str | None:
    """The used kind of an event category (None: not used)."""
    if cat in DEVICE_CATS:
        return DEVICE_CATS[cat]
    if cat in RUNTIME_CATS:
        return "runtime"
    if cat == "cuda_sync":
        return "cuda_sync"
    if cat == "user_annotation":
        return "annotation"
    return None


class _Classifier:
    """Sorts decoded events into the :class:`CaptureEvents`, checking each used field."""

    def __init__(self, cap: CaptureEvents, frames: str | None = None):
        self.cap = cap
        self.frames_re = frames
        #: whether a frame's name is kept (the ``frames`` pattern, searched once per name)
        self.keep_frame: dict[str, bool] = {}
        self.frame_rx = re.compile(frames) if frames is not None else None
        self.open: dict[tuple, list] = defaultdict(list)  # (pid, tid) -> open B events
        self.device, self.runtime = cap.device_events, cap.runtime_calls
        self.annotations = cap.annotations
        self.other: Counter = Counter()  # (cat, ph) of events of other phases
        #: Kineto's flow arrows (``ac2g``, most of a capture's other events) by phase, counted
        #: apart (no key tuple, no hash of a fresh category string per arrow); into ``other``
        #: at the end, where the first of each phase put its key
        self.flows: dict[str, int] = {}
        self.n = 0  # events fed
        self.kept_columns = _KeptColumns(cap)  # the records' columns, batch by batch
        #: equal values kept as one object (thread ids, launch dims): memory, not meaning
        self.same = {}.setdefault

    def feed(self, events: list) -> None:
        self.n += len(events)
        if "first_event_ts" not in self.cap.meta:
            _first_complete(events, self.cap.meta)
        fast, read, other, flows = self.fast, self.read, self.other, self.flows
        for ev in events:
            if type(ev) is not RawEvent:
                read(ev)
                continue
            ph = ev.ph
            if ph == "X":
                if not fast(ev):
                    read(ev)
            elif type(ph) is str and ph in _FLOWS and type(ev.cat) is str \
                    and ev.cat != FRAME_CAT:  # a flow arrow: counted, as read() would
                if ph in flows and ev.cat == "ac2g":
                    flows[ph] += 1
                else:
                    other[(ev.cat, ph)] += 1
                    if ev.cat == "ac2g":
                        flows[ph] = 0
            else:
                read(ev)
        self.kept_columns.add()

    def reset(self) -> None:
        """Forget every event fed (a later top-level ``traceEvents`` replaces them)."""
        fresh = CaptureEvents()
        for f in fields(CaptureEvents):
            setattr(self.cap, f.name, getattr(fresh, f.name))
        self.__init__(self.cap, self.frames_re)

    def read(self, ev) -> None:
        """One event, every field checked (:meth:`feed` tries :meth:`fast` first)."""
        if type(ev) is RawEvent:
            ph, cat, name, pid, tid, ts, dur, args = (ev.ph, ev.cat, ev.name, ev.pid, ev.tid,
                                                      ev.ts, ev.dur, ev.args)
        elif isinstance(ev, dict):
            ph, cat, name, pid, tid, ts, dur = (ev.get(k) for k in ("ph", "cat", "name", "pid",
                                                                   "tid", "ts", "dur"))
            raw = ev.get("args")
            args = RawArgs(*map(raw.get, _ARG_FIELDS)) if isinstance(raw, dict) else None
        else:
            self.cap.ignored["not an object"] += 1
            return
        cat = cat if isinstance(cat, str) else ""
        if cat == FRAME_CAT and type(name) is str:
            self.frame(name, pid, tid, ts, dur)
        if ph == "X":
            self.complete(cat, name, pid, tid, ts, dur, args)
        elif ph == "B" or ph == "E":
            self.pair(ph, cat, name, pid, tid, ts, args)
        elif ph == "M":
            self.metadata(name, pid, tid, args)
        else:  # flows (ac2g: s/f), instants, counters, ...
            self.other[(cat, ph if isinstance(ph, str) or ph is None else repr(ph))] += 1

    def fast(self, ev: RawEvent) -> bool:
        """The common case, read without the checks' function calls: a kernel, memcpy,
        memset, runtime call, range, ``cuda_sync`` event or Python frame whose fields all
        have their usual types. False: not that case (:meth:`complete` reads it, checking
        every field)."""
        cat = ev.cat
        if type(cat) is not str:
            return False
        kind = _FAST_KINDS.get(cat)
        ts, dur, name = ev.ts, ev.dur, ev.name
        if kind is None or type(ts) is not float or type(dur) is not float or dur < 0 \
                or type(name) is not str:
            return False
        if kind == "frame":  # a with_stack capture's Python frame: most of its events
            pid, tid = ev.pid, ev.tid
            if type(pid) is not int or type(tid) is not int:
                return False
            self.frame(name, pid, tid, ts, dur)
            starts = self.cap.host_events.get(FRAME_CAT)
            if starts is None:
                starts = self.cap.host_events[FRAME_CAT] = []
            starts.append((pid, tid, ts))  # counted, as complete() counts it
            self.cap.ignored[FRAME_CAT] += 1
            return True
        if kind == "annotation":
            pid, tid = ev.pid, ev.tid
            if type(pid) is not int or type(tid) is not int:
                return False
            same = self.same
            self.annotations.append(Annotation(_intern(name), same(pid, pid), same(tid, tid),
                                               ts, dur))
            return True
        args = ev.args
        if args is None:
            return False
        corr = args.correlation
        if type(corr) is not int:
            return False
        # one int object per correlation id: a launch and its device work share it (an int
        # past 256 is an object of 32 bytes)
        corr = self.same(corr, corr)
        if kind == "runtime":
            pid, tid = ev.pid, ev.tid
            if type(pid) is not int or type(tid) is not int:
                return False
            same = self.same  # one int object per thread id, not one per call
            self.runtime.append(RuntimeCall(_intern(name), same(pid, pid), same(tid, tid), ts,
                                            dur, corr))
            return True
        if kind == "cuda_sync":
            return self.fast_sync(ev, args, name, ts, corr)
        stream, device = args.stream, args.device
        if type(stream) is not int or type(device) is not int:
            return False
        size = args.bytes
        self.device.append(DeviceEvent(kind, _intern(name), device, stream, ts, dur, corr,
                                       _dims(args.grid, self.same), _dims(args.block, self.same),
                                       size if type(size) is int else -1))
        return True

    def fast_sync(self, ev: RawEvent, args: RawArgs, name: str, ts: float, corr: int) -> bool:
        """A ``cuda_sync`` event whose ids are all integers or absent, read as
        :meth:`complete` reads it; False: another case (``complete`` reads it)."""
        device = args.device if args.device is not None else ev.pid
        kind = args.cuda_sync_kind if args.cuda_sync_kind is not None else name
        stream, wait_on = args.stream, args.wait_on_stream
        event, record = args.wait_on_cuda_event_id, args.wait_on_cuda_event_record_corr_id
        if type(device) is not int or type(kind) is not str:
            return False
        for v in (stream, wait_on, event, record):
            if v is not None and type(v) is not int:
                return False
        self.cap.sync_events.append(SyncEvent(
            _intern(kind), device, None if stream in _INVALID_STREAMS else stream, ts, corr,
            None if wait_on in _INVALID_STREAMS else wait_on, event,
            None if record is None or record < 0 else record))
        return True

    def frame(self, name: str, pid, tid, ts, dur) -> None:
        """A Python frame (any phase): its name, and the frame as a range where the
        ``frames`` pattern keeps it and it has a numeric time and length."""
        self.cap.frame_names.add(name)
        rx = self.frame_rx
        if rx is None or type(ts) not in _NUM or type(dur) not in _NUM or dur < 0:
            return
        keep = self.keep_frame.get(name)
        if keep is None:
            keep = self.keep_frame[name] = rx.search(name) is not None
        if keep:
            self.cap.frames.append(Annotation(name, pid if type(pid) is int else 0,
                                              tid if type(tid) is int else 0,
                                              _float_or_inf(ts), _float_or_inf(dur)))

    def metadata(self, name, pid, tid, args) -> None:
        cap = self.cap
        cap.ignored["metadata"] += 1
        label = args.name if args is not None else None
        if not isinstance(label, str):
            return
        if name == "thread_name":
            # torch writes a thread's generic name ("thread 684 (python)") and its own
            # ("thread 684 (pt_autograd_0)"), in either order: all are kept
            names = cap.thread_names.setdefault((_int(pid), _int(tid)), [])
            if label not in names:
                names.append(label)
        elif name == "process_name":
            cap.process_names[_int(pid)] = label

    def pair(self, ph, cat, name, pid, tid, ts, args) -> None:
        key = (_hashable(pid), _hashable(tid))
        if ph == "B":
            self.open[key].append((cat, name, ts, args))
            return
        stack = self.open.get(key)
        if not stack:
            kind = _kind_of(cat)
            if kind is not None:
                self.cap.problems[(kind, "with an 'E' that closes no 'B' (dropped)")] += 1
            else:
                self.cap.ignored[f"{cat or 'ph'}:E"] += 1
            return
        bcat, bname, bts, bargs = stack.pop()
        if not isinstance(ts, (int, float)) or not isinstance(bts, (int, float)) \
                or isinstance(ts, bool) or isinstance(bts, bool):
            kind = _kind_of(bcat)
            if kind is not None:
                self.cap.problems[(kind, "'B'/'E' pairs without a numeric 'ts' (dropped)")] += 1
            return
        self.complete(bcat, bname, pid, tid, bts, ts - bts, bargs)

    def finish(self) -> None:
        cap = self.cap
        for ph, n in self.flows.items():
            self.other[("ac2g", ph)] += n
        for (cat, ph), n in self.other.items():
            cap.ignored[f"{cat if isinstance(cat, str) and cat else 'ph'}:{ph}"] += n
        cap.counts.update(Counter(d.kind for d in cap.device_events))
        cap.counts.update(runtime=len(cap.runtime_calls), cuda_sync=len(cap.sync_events),
                          annotation=len(cap.annotations))
        if cap.overhead:
            cap.counts["overhead"] = len(cap.overhead)
        for stack in self.open.values():
            for cat, *_ in stack:
                kind = _kind_of(cat)
                if kind is not None:
                    self.cap.problems[(kind, "with a 'B' that no 'E' closes (dropped)")] += 1
        cap.columns = self.kept_columns.columns()

    def complete(self, cat, name, pid, tid, ts, dur, args) -> None:
        cap = self.cap
        kind = _kind_of(cat)
        if kind is None:
            if cat == "cpu_op" and isinstance(name, str) and name.startswith("ProfilerStep#"):
                kind = "annotation"  # older captures file ProfilerStep under cpu_op
            elif UNMODELLED_DEVICE.match(cat):
                cap.unmodelled[cat] += 1
                return
            elif cat == "overhead":
                if _number(ts) and _number(dur) and isinstance(name, str):
                    cap.overhead.append(Annotation(sys.intern(name), _int(pid) or 0,
                                                   _int(tid) or 0, _float_or_inf(ts),
                                                   _float_or_inf(dur)))
                else:
                    cap.ignored["overhead"] += 1
                return
            else:
                if cat in COUNTED_HOST_CATS and _number(ts):
                    cap.host_events.setdefault(cat, []).append((_int(pid) or 0,
                                                                _int(tid) or 0, _float_or_inf(ts)))
                cap.ignored[cat or "uncategorized"] += 1
                return
        if isinstance(ts, bool) or not isinstance(ts, (int, float)):
            cap.problems[(_word(kind), f"with {_what(ts)} 'ts' (dropped)")] += 1
            return
        if isinstance(dur, bool) or not isinstance(dur, (int, float)):
            cap.problems[(_word(kind), f"with {_what(dur)} 'dur' (dropped)")] += 1
            return
        if dur < 0:
            cap.problems[(_word(kind), "with a negative 'dur' (dropped)")] += 1
            return
        if not isinstance(name, str):
            cap.problems[(_word(kind), "without a 'name' (dropped)")] += 1
            return
        try:
            ts, dur = float(ts), float(dur)
        except OverflowError:  # an integer beyond a float: an infinity, refused after reading
            ts, dur = _float_or_inf(ts), _float_or_inf(dur)
        intern = sys.intern
        if args is None:
            args = _NO_ARGS
        if kind in ("kernel", "memcpy", "memset"):
            stream = _int(args.stream if args.stream is not None else tid)
            device = _int(args.device if args.device is not None else pid)
            if stream is None or device is None:
                cap.problems[(kind, "with neither 'args.stream' nor a numeric 'tid' "
                                    "(dropped)")] += 1
                return
            corr = _int(args.correlation)
            size = _int(args.bytes)
            cap.device_events.append(DeviceEvent(kind, intern(name), device, stream, ts, dur,
                                                 -1 if corr is None else corr,
                                                 _dims(args.grid, self.same),
                                                 _dims(args.block, self.same),
                                                 -1 if size is None else size))
        elif kind == "runtime":
            corr = _int(args.correlation)
            cap.runtime_calls.append(RuntimeCall(intern(name), _int(pid) or 0, _int(tid) or 0,
                                                 ts, dur, -1 if corr is None else corr))
        elif kind == "cuda_sync":
            skind = args.cuda_sync_kind if args.cuda_sync_kind is not None else name
            corr = _int(args.correlation)
            stream = _int(args.stream)
            wait_on = _int(args.wait_on_stream)
            rec = _int(args.wait_on_cuda_event_record_corr_id)
            cap.sync_events.append(SyncEvent(
                intern(str(skind)), _int(args.device if args.device is not None else pid) or 0,
                None if stream in _INVALID_STREAMS else stream, ts,
                -1 if corr is None else corr,
                None if wait_on in _INVALID_STREAMS else wait_on,
                _int(args.wait_on_cuda_event_id),
                None if rec is None or rec < 0 else rec))
        else:
            cap.annotations.append(Annotation(intern(name), _int(pid) or 0, _int(tid) or 0,
                                              ts, dur))


_NO_ARGS = RawArgs()
_NUM = (int, float)  # by exact type: a bool is no time
#: RawArgs' fields in order (an event decoded as a dict gets its args by them)
_ARG_FIELDS = RawArgs.__struct_fields__


def _first_complete(events: list, meta: dict) -> None:
    """``meta["first_event_ts"]``: the start of the file's first complete event with a numeric
    ``ts``, whatever its kind, in file order (HTA's row 0: what its idle breakdown joins as
    the launch of device work whose launch is not in the capture, simwar.analysis.idle)."""
    for ev in events:
        if type(ev) is RawEvent:
            ph, ts = ev.ph, ev.ts
        elif isinstance(ev, dict):
            ph, ts = ev.get("ph"), ev.get("ts")
        else:
            continue
        if ph == "X" and _number(ts):
            try:
                meta["first_event_ts"] = float(ts)
            except OverflowError:  # beyond a float: refused with the records' times
                continue
            return


def _hashable(v):
    """``v`` as a dict key: itself, or its repr when it is a list or an object."""
    return repr(v) if isinstance(v, (list, dict)) else v


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _dims(v, same) -> tuple:
    """A launch dim (``[x, y, z]``) as a tuple of ints; () when absent or malformed.
    ``same`` (``dict.setdefault``) returns one tuple for equal dims."""
    if type(v) is not list:
        return ()
    out = tuple(v)
    if len(out) != 3 or type(out[0]) is not int or type(out[1]) is not int \
            or type(out[2]) is not int:  # not the usual three ints: each one checked
        out = tuple(_int(x) for x in v)
        if None in out:
            return ()
    return same(out, out)

#: the phases of flow events (``ac2g``: a launch's arrow to its kernel), only counted
_FLOWS = frozenset(("s", "t", "f"))
_FAST_KINDS = {**DEVICE_CATS, **dict.fromkeys(RUNTIME_CATS, "runtime"),
               "user_annotation": "annotation", "cuda_sync": "cuda_sync", FRAME_CAT: "frame"}
_intern = sys.intern


def _word(kind: str) -> str:
    return {"runtime": "runtime call", "cuda_sync": "cuda_sync",
            "annotation": "annotation"}.get(kind, kind)


def _what(v) -> str:
    if v is None:
        return "no"
    if isinstance(v, str):
        return "a string"
    return "a non-numeric"


#: the columns the reader keeps of each list of records (:class:`_KeptColumns`), for the
#: plausibility check and the sanity checks (:func:`simwar.capture.sanity.check_capture`)
COLUMNS = {"device_events": ("ts", "dur", "device", "stream"),
           "runtime_calls": ("ts", "dur", "pid", "correlation"),
           "sync_events": ("ts",), "annotations": ("ts", "dur")}
_FLOAT_FIELDS = ("ts", "dur")


class _KeptColumns:
    """Columns of the kept records, taken batch by batch while the records are fresh in
    memory (a pass over every record after reading, with each record's memory long out of
    the cache, cost about a tenth of the reader's time and as much again in the sanity
    checks): :data:`COLUMNS` of each list, each one typed array grown in place (numpy chunks
    joined at the end left their holes in the heap: a higher peak later); an integer column
    with a value beyond int64 (the reader keeps any JSON integer) is dropped (None), and its
    readers then take the records' own values. :meth:`columns` hands them over as numpy
    arrays on the same memory, each list's with the list they were taken of
    (:class:`~simwar.capture.records.KeptColumns`)."""

    def __init__(self, cap: CaptureEvents):
        self.seqs = {name: getattr(cap, name) for name in COLUMNS}
        self.done = dict.fromkeys(COLUMNS, 0)  # records already taken, per list
        self.cols: dict[str, dict[str, array | None]] = {
            name: {f: array("d" if f in _FLOAT_FIELDS else "q") for f in fs}
            for name, fs in COLUMNS.items()}

    def add(self) -> None:
        """Take the records appended since the last call."""
        for name, seq in self.seqs.items():
            lo = self.done[name]
            if len(seq) == lo:
                continue
            part = seq[lo:]
            cols = self.cols[name]
            for f, col in cols.items():
                if col is None:
                    continue
                try:
                    col.fromlist(list(map(attrgetter(f), part)))
                except (OverflowError, TypeError):
                    cols[f] = None
            self.done[name] = len(seq)

    def columns(self) -> dict[str, KeptColumns]:
        """Every list's columns as numpy arrays (None: dropped), with the list and how many
        of its records they hold."""
        self.add()
        return {name: KeptColumns(self.seqs[name], self.done[name], {
            f: None if c is None else np.frombuffer(c, c.typecode) if len(c) else
            np.zeros(0, c.typecode) for f, c in cols.items()})
            for name, cols in self.cols.items()}


def _float_or_inf(v: int | float) -> float:
    """``v`` as a float, an integer beyond a float's range as the infinity of its sign."""
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf


def _not_finite(cap: CaptureEvents) -> str | None:
    """What of the kept records' times is not a finite number, or None: an infinity (JSON's
    ``1e400``, or an integer beyond a float's range, :func:`_float_or_inf`) or a NaN; from the
    columns, one numpy pass each (the per-event loop checks types only)."""
    for name, kept in cap.columns.items():
        cols = kept.cols
        for f in _FLOAT_FIELDS:
            if f not in cols:
                continue
            col = cols[f]
            if col is None or not np.isfinite(col).all():
                kind = name.removesuffix("s").replace("_", " ")
                return f"a {kind}'s '{f}' is not a finite number"
    return None


def _check_plausible(cap: CaptureEvents) -> None:
    """Implausible times (a capture written in ns where µs are expected): counted problems,
    from the columns taken as the records were read (:attr:`CaptureEvents.columns`)."""
    lists = [cap.columns[name].cols for name in ("device_events", "runtime_calls",
                                                  "annotations")]
    long = int(np.count_nonzero(lists[0]["dur"] > PLAUSIBLE_DUR_US))
    if long:
        cap.problems[("device", f"longer than {PLAUSIBLE_DUR_US / 1e6:.0f} s (implausible: "
                                f"are 'ts'/'dur' in ns, not µs?)")] += long
    starts = [float(c["ts"].min()) for c in lists if len(c["ts"])]
    ends = [float((c["ts"] + c["dur"]).max()) for c in lists if len(c["ts"])]
    if starts and ends and max(ends) - min(starts) > PLAUSIBLE_SPAN_US:
        span = (max(ends) - min(starts)) / 1e6
        cap.problems[("capture", f"spans {span:.0f} s (implausible for a profile: are "
                                 f"'ts'/'dur' in ns, not µs?)")] += 1
