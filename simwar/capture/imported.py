"""What an import of a capture returns: :class:`KinetoImport`, a :class:`RankImport` per rank.

:func:`simwar.capture.to_trace.bind_capture` builds them (the Trace of each host process and
what was counted, ignored and inferred on the way); ``simwar import``, ``explain``,
``races``, the size stage and the fit read them (through
:class:`simwar.capture.open.Capture`).

Imports: the standard library and :mod:`simwar.core.trace`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from simwar.core.trace import Trace


class DeviceInfo(NamedTuple):
    """What a capture says of one device op beyond its times: the kind of work, a kernel's
    launch dims, a copy's or memset's bytes (-1: not in the capture)."""

    kind: str  # kernel | memcpy | memset
    grid: tuple
    block: tuple
    bytes: int
    copy: str = ""  # a memcpy's kind (DtoH (Device -> Pinned), ...): reader.copy_kind


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
    device_info: dict[int, DeviceInfo] = field(default_factory=dict)
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

    @property
    def ignored_total(self) -> int:
        return int(sum(self.ignored.values()))

    @property
    def primary(self) -> RankImport:
        return next(r for r in self.ranks if r.trace is self.trace)
