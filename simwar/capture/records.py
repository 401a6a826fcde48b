"""The records a capture is read into: the decoded events and what the reader keeps of them.

:mod:`simwar.capture.reader` decodes each trace event into a :class:`RawEvent` (msgspec
builds only these fields) and keeps the used ones as records, one per event: device work
(:class:`DeviceEvent`), runtime calls (:class:`RuntimeCall`), ``cuda_sync`` events
(:class:`SyncEvent`) and ranges (:class:`Annotation`), gathered with the counts of what
was seen in one :class:`CaptureEvents`. The records are msgspec structs, frozen and outside
the cyclic garbage collector (they hold numbers, strings and tuples of ints: no cycle): a
third less memory than named tuples (64 bytes for a runtime call's six fields, against 96),
and made by a constructor in C (half the time of ``tuple.__new__`` from a tuple); a record
is copied with a field changed by ``msgspec.structs.replace``. The binding, the sanity
checks, the ranks and the Trace's assembly (:mod:`simwar.capture.to_trace`) read these
records; the reader's rules for each field are in :mod:`simwar.capture.reader`.

Imports: msgspec and the standard library.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgspec


# --------------------------------------------------------------------------- decoded events
class RawArgs(msgspec.Struct, gc=False):
    """The ``args`` fields the reader uses; msgspec skips every other one."""

    stream: Any = None
    device: Any = None
    correlation: Any = None
    cuda_sync_kind: Any = None
    wait_on_stream: Any = None
    wait_on_cuda_event_id: Any = None
    wait_on_cuda_event_record_corr_id: Any = None
    name: Any = None
    grid: Any = None
    block: Any = None
    bytes: Any = None


class RawEvent(msgspec.Struct, gc=False):
    """One trace event as decoded (values untyped: the reader checks them)."""

    ph: Any = None
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    args: RawArgs | None = None


# --------------------------------------------------------------------------- raw records
class DeviceEvent(msgspec.Struct, frozen=True, gc=False):
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


def launches_by_corr(events: list[DeviceEvent]) -> tuple[dict, dict]:
    """Each launch's device work by correlation id, and the ``(device, stream)`` of the
    events in order of first appearance, in one pass. A launch of one op (most launches)
    is held as the record itself, of several as a tuple in file order: no list or tuple is
    made for one op (a tuple of one took 48 bytes a launch, and the lists it was built from
    as many again, at the import's peak); :func:`launch_work` reads either."""
    by_corr: dict[int, DeviceEvent | tuple[DeviceEvent, ...]] = {}
    streams: dict[tuple[int, int], None] = {}
    several: list[int] = []
    get = by_corr.get
    for d in events:
        streams[d.device, d.stream] = None
        corr = d.correlation
        if corr >= 0:
            work = get(corr)
            if work is None:
                by_corr[corr] = d
            elif type(work) is list:
                work.append(d)
            else:
                by_corr[corr] = [work, d]
                several.append(corr)
    for corr in several:  # fixed from here
        by_corr[corr] = tuple(by_corr[corr])
    return by_corr, streams


def launch_work(work: DeviceEvent | tuple | list) -> tuple | list:
    """A launch's device work as a sequence, from an entry of :func:`launches_by_corr`
    (or a list of records)."""
    return (work,) if type(work) is DeviceEvent else work


class RuntimeCall(msgspec.Struct, frozen=True, gc=False):
    """A CUDA (or HIP) runtime or driver API call on a host thread."""

    name: str
    pid: int
    tid: int
    ts: float
    dur: float
    correlation: int


class SyncEvent(msgspec.Struct, frozen=True, gc=False):
    """A ``cuda_sync`` event: a stream wait or host sync, and the record it binds to."""

    kind: str  # Stream Wait Event | Event Sync | Stream Sync | Context Sync
    device: int
    stream: int | None
    ts: float
    correlation: int
    wait_on_stream: int | None
    event_id: int | None
    record_correlation: int | None


class Annotation(msgspec.Struct, frozen=True, gc=False):
    """A ``record_function`` range (or a ProfilerStep) on a host thread."""

    name: str
    pid: int
    tid: int
    ts: float
    dur: float


class KeptColumns(NamedTuple):
    """Columns the reader took of one list of records as it read them: ``cols`` (field ->
    array, None: dropped) hold the values of the first ``n`` records of ``of``, the list
    itself. They are that list's while it is the same list object holding ``n`` records
    (after reading, a list is only appended to, or replaced): see
    :meth:`fit`."""

    of: list
    n: int
    cols: dict

    def fit(self, records: list) -> bool:
        """Whether the columns are ``records``' values: taken of this very list, which
        holds just the records they were taken of."""
        return records is self.of and len(records) == self.n


@dataclass
class CaptureEvents:
    """The used events of one capture, plus counts of everything seen.

    ``problems`` counts dropped events by (kind, problem) (:func:`problem_lines`);
    ``unmodelled`` device events of kinds simwar does not model, by category;
    ``thread_names`` the metadata's names of each ``(pid, tid)`` and ``process_names``
    of each pid.
    """

    device_events: list[DeviceEvent] = field(default_factory=list)
    runtime_calls: list[RuntimeCall] = field(default_factory=list)
    sync_events: list[SyncEvent] = field(default_factory=list)
    annotations: list[Annotation] = field(default_factory=list)
    #: the profiler's own stalls (category ``overhead``), as ranges
    overhead: list[Annotation] = field(default_factory=list)
    #: host events kept only to be counted (``cpu_op``, ``python_function``): per category,
    #: ``(pid, tid, ts)`` of each (what the profiler's per-event host cost is charged by)
    host_events: dict = field(default_factory=dict)
    #: False when the file says it was not profiled (``"simwar": {"profiled": false}``, what
    #: :mod:`simwar.capture.synthetic` writes): no profiler's cost to take out of it
    profiled: bool = True
    counts: Counter = field(default_factory=Counter)
    ignored: Counter = field(default_factory=Counter)
    problems: Counter = field(default_factory=Counter)
    unmodelled: Counter = field(default_factory=Counter)
    thread_names: dict = field(default_factory=dict)
    process_names: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    #: the name of every Python frame (``python_function`` event) of the capture
    frame_names: set = field(default_factory=set)
    #: as ranges, in file order, the frames whose name matches the reader's ``frames``
    #: pattern (none without one), with a numeric time and length (ids that are not
    #: integers, as some exporters write them, become 0)
    frames: list[Annotation] = field(default_factory=list)
    #: columns of the lists as the reader kept them (``{list name: KeptColumns}``,
    #: :data:`simwar.capture.reader.COLUMNS`), for the sanity checks; a list's are used
    #: only while they fit it (:meth:`KeptColumns.fit`), dropped once read (None: none)
    columns: dict | None = field(default=None, repr=False, compare=False)


def problem_lines(cap: CaptureEvents) -> list[str]:
    """The capture's dropped and implausible events as warning sentences, one per kind and
    problem, each with its count."""
    out = []
    for (kind, problem), n in sorted(cap.problems.items()):
        if kind == "capture":
            out.append(f"the capture {problem}")
        else:
            out.append(f"{n} {kind} event{'s' if n != 1 else ''} {problem}")
    return out
