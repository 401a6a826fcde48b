"""The records of a critical path: what the walk (:mod:`.critical_path`) emits and tallies.

A chain is a run of contiguous :class:`Segment` s, each of a :class:`SegmentKind`; a
:class:`Chain` is of a :class:`ChainKind` (the gap before a forward, or a step); the walk
notes each :class:`Gate` it comes through and the :class:`GateLanes` on either side of it.
The kinds are string enums whose values are the words ``simwar explain`` prints and writes
in its JSON (a member equals its value), so the output reads as before they were named.
The records follow HTA's critical-path graph (``CPEdge``, ``CPEdgeType``).

They live apart from the walk so that :mod:`.chain_words` (which the walk's module imports)
can name them too.

Imports: the standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

__all__ = ["KINDS", "Chain", "ChainKind", "Gate", "GateLanes", "Segment", "SegmentKind"]


class SegmentKind(StrEnum):
    """What a segment's time was spent on; the values are the words ``simwar explain`` prints
    and writes (a member equals its value, so JSON and text output are those words)."""

    DEVICE = "device"  # device work, by stream and label
    CROSS_STREAM = "cross_stream"  # a wait's release after its record fired
    HOST = "host"  # cpu work, by site or by the host range that covers it
    HOST_API = "host_api"  # a host API call's own cost
    WAKE_UP = "wake_up"  # the end of a call that blocked until the device got there
    LAUNCH_LATENCY = "launch_latency"  # slack between a launch's return and its op's start
    RANK = "rank"  # a collective held this rank for a late one
    UNEXPLAINED = "unexplained"  # slack the trace does not account for


KINDS = tuple(SegmentKind)


class ChainKind(StrEnum):
    """Which interval a chain explains: the forward gap before a step, or the step."""

    GAP = "gap"  # back from forward k's start to forward k-1's end
    STEP = "step"  # back from forward k+1's start to forward k's start


class Gate(NamedTuple):
    """A held wait or a blocking call the walk came through, and when it opened."""

    opened_us: float
    name: str


class GateLanes(NamedTuple):
    """The lanes on either side of a gate."""

    waiter: str  # the lane that waited or blocked
    source: str  # the lane of the record (or op) it waited for


class Segment(NamedTuple):
    """One link of a chain: ``[start_us, end_us)`` spent on ``cause``."""

    start_us: float
    end_us: float
    kind: SegmentKind
    cause: str
    lane: str
    op: int = -1  # the op this time belongs to (-1: a host span or slack)
    span: int = -1  # the host span it belongs to (-1: a device op or slack)
    after: str = ""  # the gate this part of the chain came through ('' before any)
    what: str = ""  # the short name in the cause: a kernel label, a wait, a site

    @property
    def us(self) -> float:
        return self.end_us - self.start_us

    def words(self) -> str:
        """The cause as a phrase: ``schedule_writes on the schedule stream``, ..."""
        if self.kind == SegmentKind.DEVICE:
            return f"{self.what} on the {self.lane} stream"
        return self.cause


@dataclass(frozen=True)
class Chain:
    """The chain that set ``end_us`` (a forward's start), back to ``start_us``.

    ``what`` is ``gap`` (back to the previous forward's end) or ``step`` (from
    forward ``step+1``'s start back to forward ``step``'s start). ``segments``
    are in time order and cover ``[start_us, end_us]`` exactly.
    """

    what: ChainKind
    step: int
    start_us: float
    end_us: float
    target: int  # op id of the kernel the walk started from
    segments: tuple[Segment, ...]

    @property
    def us(self) -> float:
        return self.end_us - self.start_us

    def total_us(self) -> float:
        return float(sum(s.us for s in self.segments))
