"""What an import of a capture returns: :class:`KinetoImport`, a :class:`RankImport` per rank.

:func:`simwar.capture.to_trace.bind_capture` builds them (the Trace of each host process and
what was counted, ignored and inferred on the way); ``simwar import``, ``explain``,
``races``, the size stage and the fit read them (through
:class:`simwar.capture.open.Capture`).

Imports: the standard library, numpy and :mod:`simwar.core.trace`.
"""

from __future__ import annotations

import bisect
from array import array
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from simwar.core.trace import Trace


class DeviceInfo(NamedTuple):
    """What a capture says of one device op beyond its times: the kind of work, a kernel's
    launch dims, a copy's or memset's bytes (-1: not in the capture)."""

    kind: str  # kernel | memcpy | memset
    grid: tuple
    block: tuple
    bytes: int
    copy: str = ""  # a memcpy's kind (DtoH (Device -> Pinned), ...): reader.copy_kind


_ABSENT = object()


class DeviceInfos(Mapping):
    """Op id → :class:`DeviceInfo` of an import's device ops, read-only as a dict is read.

    The op ids are one typed column (in increasing order: ops are added as they are issued)
    and each has a code into the distinct facts (most ops repeat a few kernels' facts): 12
    bytes an op, where a dict's entry and its int key took about 90 (a tenth of a large
    import's peak memory was this table). A lookup is one bisection.
    """

    def __init__(self) -> None:
        self._ops = array("q")
        self._codes = array("i")
        self._facts: list[DeviceInfo] = []

    def new(self, info: DeviceInfo) -> int:
        """The code of a new distinct fact."""
        self._facts.append(info)
        return len(self._facts) - 1

    def add(self, op: int, code: int) -> None:
        """Op ``op`` has the facts of ``code`` (ops come in increasing order)."""
        ops = self._ops
        if ops and op <= ops[-1]:
            raise ValueError(f"device op {op} added after op {ops[-1]}")
        ops.append(op)
        self._codes.append(code)

    def extend(self, ops: array, codes: array) -> None:
        """Ops ``ops`` (increasing, after every op added so far) have the facts of ``codes``:
        :meth:`add` of each, in one step (the first ones' columns are kept as given: the
        caller hands them over)."""
        if len(ops) != len(codes):
            raise ValueError(f"{len(ops)} device ops and {len(codes)} codes")
        if ops.typecode != "q" or codes.typecode != "i":
            raise TypeError("device ops come as array('q'), their codes as array('i')")
        new = np.frombuffer(ops, np.int64) if len(ops) else np.zeros(0, np.int64)
        if (len(new) and self._ops and new[0] <= self._ops[-1]) or bool((np.diff(new) <= 0).any()):
            raise ValueError("device ops added out of increasing order")
        if not self._ops:  # the first ops: their columns taken as they are (no copy)
            self._ops, self._codes = ops, codes
            return
        self._ops.extend(ops)
        self._codes.extend(codes)

    def of_ops(self, ops: list[int]) -> list[DeviceInfo | None]:
        """:meth:`get` of each of ``ops`` (None: not a device op), by one search."""
        if not self._ops:
            return [None] * len(ops)
        mine = np.frombuffer(self._ops, np.int64)
        want = np.asarray(ops, dtype=np.int64)
        at = np.minimum(np.searchsorted(mine, want), len(mine) - 1)
        codes = np.frombuffer(self._codes, np.int32)[at]
        facts = self._facts
        return [facts[c] if hit else None
                for c, hit in zip(codes.tolist(), (mine[at] == want).tolist())]

    def get(self, op: int, default=None):
        ops = self._ops
        i = bisect.bisect_left(ops, op)
        if i == len(ops) or ops[i] != op:
            return default
        return self._facts[self._codes[i]]

    def __getitem__(self, op: int) -> DeviceInfo:
        info = self.get(op, _ABSENT)
        if info is _ABSENT:
            raise KeyError(op)
        return info

    def __contains__(self, op) -> bool:
        return self.get(op, _ABSENT) is not _ABSENT

    def __iter__(self) -> Iterator[int]:
        return iter(self._ops)

    def __len__(self) -> int:
        return len(self._ops)

    def __repr__(self) -> str:
        return f"DeviceInfos({len(self)} ops, {len(self._facts)} distinct)"


@dataclass
class RankImport:
    """One rank (host process) of an import: its Trace and what was counted for it."""

    rank: int
    pid: int
    file: str
    trace: Trace
    counts: dict
    warnings: list[str]
    #: the scheduler thread ``(pid, tid)``, its name, and why it was chosen
    host_thread: tuple | None = None
    host_thread_name: str = ""
    host_thread_reason: str = ""
    #: every thread that launched device work: ``(name, tid, launches)``, most first
    launch_threads: list[tuple[str, int, int]] = field(default_factory=list)
    clock_offset_us: float = 0.0


@dataclass
class KinetoImport:
    """An imported capture: the Trace plus what was counted, ignored and inferred.

    ``trace`` is the primary rank's (the one with the scheduler thread); with several
    ranks ``ranks`` holds each one and ``combined`` all of them side by side
    (:func:`simwar.capture.ranks.side_by_side`; with one rank it is ``trace``).
    """

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
    device_info: DeviceInfos = field(default_factory=DeviceInfos)
    ranks: list[RankImport] = field(default_factory=list)
    combined: Trace | None = None
    #: device events of kinds simwar does not model, by category (e.g. MTIA's)
    unmodelled: dict = field(default_factory=dict)
    #: the cross-rank spread of step starts (:func:`simwar.capture.ranks.step_skew`)
    skew: dict = field(default_factory=dict)
    #: tensor-parallel ranks: the collectives common to every rank, on the clock aligned on
    #: them (:mod:`simwar.capture.rank_files`; None: no collectives), and each rank's shift
    collectives: object = None
    collective_shift_us: list = field(default_factory=list)
    #: the sync ops of ``cudaDeviceSynchronize`` calls (CUPTI's "Context Sync"): the host
    #: waited for every stream (what the race analysis joins, simwar.capture.accesses)
    device_syncs: list[int] = field(default_factory=list)
    #: what the profiler recorded on the host thread, per event kind (the trace's ``cat``:
    #: ``cpu_op``, ``user_annotation``, ``python_function``, ``cuda_runtime``, and the device
    #: activities ``kernel``, ``gpu_memcpy``, ``cuda_sync`` charged to the host call that
    #: issued them), as sorted host times on the trace's clock: what the fit counts in each
    #: host interval to subtract the profiler's own cost (:mod:`simwar.fit.profiler_cost`)
    profiler_events: dict = field(default_factory=dict)
    #: the capture's own time (its files' ``ts``, µs) that is the trace's 0: a capture time
    #: ``ts`` is ``ts - origin_us`` on the trace's clock (what places the file's raw events,
    #: which the import does not keep, in the trace's steps)
    origin_us: float = 0.0

    @property
    def ignored_total(self) -> int:
        return int(sum(self.ignored.values()))

    @property
    def primary(self) -> RankImport:
        return next(r for r in self.ranks if r.trace is self.trace)
