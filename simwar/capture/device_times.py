"""When a capture's records fired and its waits released: inferred on the measured streams.

A Kineto capture times device work (kernels, memcpys, memsets) but not the
records and stream waits between them. :func:`infer_device_times` places them
by :mod:`simwar.core.rules` on each stream's measured tail
(:class:`MeasuredLanes`), once :class:`simwar.capture.to_trace.CaptureTraceBuilder`
has recorded every measured op.

Imports: the standard library, numpy and :mod:`simwar.core`; never the simulator
(api, executors, build).
"""

from __future__ import annotations

from array import array
from collections import defaultdict
from typing import NamedTuple

import numpy as np

from simwar.core.recorder import Recorder
from simwar.core.rules import begins, fires, released


class PendingRecord(NamedTuple):
    """A record op whose firing is inferred once every measured kernel is known."""

    op: int
    lane: str
    issue: float  # when the host call that issued it returned (a stream sync: its start)
    #: an in-graph node: the end of its graph's last kernel on its lane (None: a host record)
    graph_end: float | None = None


class PendingWait(NamedTuple):
    """A stream-wait op whose reach and release are inferred once every kernel is known."""

    op: int
    lane: str
    issue: float
    bound: int  # the record op it waits for, -1: none


class Issued(NamedTuple):
    """Measured device work: when its host call issued it and when it started."""

    issue: float
    start: float


class MeasuredLanes:
    """Per stream, the measured device work in issue order.

    :meth:`tails` gives the running tail of each ``(lane, t)`` asked: the latest measured end
    of the work issued strictly before host time ``t`` (-inf: none), what a record or wait
    issued at ``t`` queues behind; :meth:`next_issued` the first work issued at or after
    ``t``. Work is ordered by (issue, end, start); the lookups index it once it is complete,
    and answer every question of a lane with one search.
    """

    def __init__(self) -> None:
        # per lane, the work's issue, end and start times: three typed columns (24 bytes a
        # device op, where a tuple of three floats costs five times that)
        self._work: dict[str, tuple[array, array, array]] = defaultdict(
            lambda: (array("d"), array("d"), array("d")))
        self._index: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None

    def add(self, lane: str, issue: float, start: float, end: float) -> None:
        issues, ends, starts = self._work[lane]
        issues.append(issue)
        ends.append(end)
        starts.append(start)
        self._index = None

    def appends(self, lane: str) -> tuple:
        """The ``append`` of ``lane``'s issue, end and start columns: :meth:`add` for a caller
        that adds much work to one lane (no method call per op)."""
        self._index = None
        issues, ends, starts = self._work[lane]
        return issues.append, ends.append, starts.append

    def _lane(self, lane: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._index is None:
            self._index = {}
            for name, cols in self._work.items():
                issue, end, start = (np.frombuffer(c, dtype=np.float64) for c in cols)
                order = np.lexsort((start, end, issue))  # by (issue, end, start)
                self._index[name] = (issue[order], np.maximum.accumulate(end[order]),
                                     start[order])
        return self._index.get(lane, _NONE)

    def tails(self, lanes: list[str], times: list[float]) -> list[float]:
        """``tail(lane, t)`` of each ``(lane, t)``: the running tail, the latest measured end of
        the work issued strictly before ``t`` (-inf: none); one search per lane."""
        out = np.full(len(times), -np.inf)
        for lane, at, pos in self._search(lanes, times):
            hit = pos > 0
            out[at[hit]] = self._lane(lane)[1][pos[hit] - 1]
        return out.tolist()

    def next_issued(self, lanes: list[str], times: list[float]) -> list[Issued | None]:
        """Of each ``(lane, t)``, the first work issued at or after ``t`` (None: none)."""
        out: list[Issued | None] = [None] * len(times)
        for lane, at, pos in self._search(lanes, times):
            issue, _, start = self._lane(lane)
            hit = pos < len(issue)
            got = pos[hit]
            for i, a, b in zip(at[hit].tolist(), issue[got].tolist(), start[got].tolist()):
                out[i] = Issued(a, b)
        return out

    def _search(self, lanes: list[str], times: list[float]):
        """Per lane with work: the indices of its queries (an array) and where each time
        falls."""
        by_lane: dict[str, list[int]] = defaultdict(list)
        for i, lane in enumerate(lanes):
            by_lane[lane].append(i)
        times = np.asarray(times, dtype=np.float64)
        for lane, at in by_lane.items():
            issue = self._lane(lane)[0]
            if len(issue):
                at = np.asarray(at, dtype=np.int64)
                yield lane, at, np.searchsorted(issue, times[at], "left")


_NONE = (np.zeros(0), np.zeros(0), np.zeros(0))


def infer_device_times(rec: Recorder, measured: MeasuredLanes, records: list[PendingRecord],
                       waits: list[PendingWait]) -> None:
    """Set when each record fired and how long each wait held its stream.

    Records and waits are placed by :mod:`simwar.core.rules` on each stream's
    measured tail (the latest end of the device work issued before the host call
    returned):

    - a record fires at ``fires(tail, issue)``: when its stream drains the
      work issued before it;
    - a wait is reached at ``begins(tail, issue)`` and released, by the
      rule, at ``released(reach, record firing, 0, ...)`` (unbound: at its
      reach): the capture does not show the cross-stream latency, so this
      is a lower bound. A bound wait whose record fired (at the latest) before the
      wait was reached did not hold: released at its reach. Otherwise the next
      device op issued on the stream after the
      wait bounds it from the measurement: if that op was issued by the
      rule's release, it was queued behind the wait and ran as soon as the
      wait let it go, so its measured start *is* the release (dependency
      plus latency); if it was issued later, the wait had let go by the
      time it started, so the release is at most its start.

    A wait that held its stream becomes a ``wait`` span (dependency idle).

    An in-graph record node fires somewhere inside its graph's run, where the capture
    does not say: no earlier than the rule's firing above (its stream's tail at the
    launch), no later than the graph's last kernel on its stream, and no later than the
    release of any wait bound to it. It is placed at the latest of these bounds that the
    measurement allows: min(graph end, earliest release), never before the rule's firing.
    """
    lane_of_record = {r.op: r.lane for r in records}
    for r, tail in zip(records, measured.tails([r.lane for r in records],
                                               [r.issue for r in records])):
        t = fires(tail, r.issue)
        rec.set_times(r.op, t, t)
    fired = rec.op_end
    latest = {r.op: max(fired[r.op], r.graph_end) for r in records if r.graph_end is not None}
    released_at: dict[int, float] = {}
    lanes, issues = [w.lane for w in waits], [w.issue for w in waits]
    for w, tail, nxt in zip(waits, measured.tails(lanes, issues),
                            measured.next_issued(lanes, issues)):
        reach = begins(tail, w.issue)
        release = reach
        if w.bound >= 0:
            release = released(reach, fired[w.bound], 0.0, lane_of_record[w.bound] == w.lane)
            if latest.get(w.bound, fired[w.bound]) <= reach:
                # its record had fired (at the latest) when the stream reached it: the wait
                # did not hold; a later start of the next op is that op's own gap
                rec.set_times(w.op, reach, reach)
                released_at[w.bound] = min(released_at.get(w.bound, reach), reach)
                continue
        if nxt is not None and nxt.start >= reach:
            if nxt.issue <= release:  # queued behind the wait: held until it ran
                release = nxt.start
            else:  # it ran then, so the wait was released by then
                release = min(release, nxt.start)
        rec.set_times(w.op, reach, release)  # held (release > reach): a wait span
        released_at[w.bound] = min(released_at.get(w.bound, release), release)
    for r in records:
        if r.graph_end is not None:
            t = fired[r.op]
            t = max(t, min(r.graph_end, released_at.get(r.op, r.graph_end)))
            rec.set_times(r.op, t, t)
