"""Read a Kineto (torch.profiler) Chrome-trace capture into a :class:`Capture`.

``torch.profiler.profile(...).export_chrome_trace(path)`` writes Kineto's
Chrome-trace JSON: an object with ``traceEvents`` (and ``schemaVersion``,
``deviceProperties``, ``baseTimeNanoseconds``, ...). The events kept are
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
  sync sites;
- ``overhead`` (the profiler's own stalls, e.g. ``Activity Buffer Request``):
  kept as ranges (:attr:`Capture.overhead`) so that a fit can leave out the
  steps they fell in.

A kernel keeps its launch dims (``args.grid``, ``args.block``: what tells two
captured graphs of one phase apart), a memcpy or memset its ``args.bytes``.

Every other event (``cpu_op``, ``python_function``, ``ac2g`` flows, metadata,
instants, ...) is counted and ignored. The file is read with a streaming
JSON parser, so memory grows with the number of *used* events, not the file.
:func:`call_kind` types a runtime call by its name (and whether it issued
device work); :mod:`simwar.capture.to_trace` builds the Trace from the result.

Imports: ijson, the standard library and :mod:`simwar.core.trace`; never the
simulator (api, executors, build) and no pandas. Nothing prints: progress goes
to an optional callback.
"""

from __future__ import annotations

import gzip
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import ijson

from simwar.core.trace import Call

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

#: ``progress(done_bytes, total_bytes)``, called as the file is read
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


def copy_kind(name: str) -> str:
    """A memcpy's kind as Kineto names it (``Memcpy DtoH (Device -> Pinned)``:
    ``DtoH (Device -> Pinned)``); '' for anything else."""
    return name[len("Memcpy "):] if name.startswith("Memcpy ") else ""


class KinetoFormatError(ValueError):
    """The file is not a readable Kineto capture; the message is one line."""


# --------------------------------------------------------------------------- raw records
class DeviceEvent(NamedTuple):
    """A kernel, memcpy or memset (µs on the device clock)."""

    kind: str  # kernel | memcpy | memset
    name: str
    device: int
    stream: int
    ts: float
    dur: float
    correlation: int
    grid: tuple = ()  # a kernel's launch dims (empty: not in the capture)
    block: tuple = ()
    bytes: int = -1  # a memcpy's or memset's size (-1: not in the capture)


class RuntimeCall(NamedTuple):
    """A CUDA runtime or driver API call on a host thread."""

    name: str
    pid: int
    tid: int
    ts: float
    dur: float
    correlation: int


class SyncEvent(NamedTuple):
    """A ``cuda_sync`` event: a stream wait or host sync, and the record it binds to."""

    kind: str  # Stream Wait Event | Event Sync | Stream Sync | Context Sync
    device: int
    stream: int | None
    ts: float
    correlation: int
    wait_on_stream: int | None
    event_id: int | None
    record_correlation: int | None


class Annotation(NamedTuple):
    """A ``record_function`` range (or a ProfilerStep) on a host thread."""

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
    #: the profiler's own stalls (category ``overhead``), as ranges
    overhead: list[Annotation] = field(default_factory=list)
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
        size = _int(args.get("bytes"))
        cap.device_events.append(DeviceEvent(kind, intern(name), device, stream, ts, dur,
                                             -1 if corr is None else corr,
                                             _dims(args.get("grid")), _dims(args.get("block")),
                                             -1 if size is None else size))
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
    elif cat == "overhead":
        cap.overhead.append(Annotation(intern(name), _int(ev.get("pid")) or 0,
                                       _int(ev.get("tid")) or 0, ts, dur))
        cap.counts["overhead"] += 1
    else:
        cap.ignored[cat or "uncategorized"] += 1


def _dims(v) -> tuple:
    """A launch dim (``[x, y, z]``) as a tuple of ints; () when absent or malformed."""
    if not isinstance(v, list):
        return ()
    out = tuple(_int(x) for x in v)
    return () if None in out else out
