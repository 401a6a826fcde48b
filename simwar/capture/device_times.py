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

    ``tail(lane, t)`` is the running tail: the latest measured end of the work
    issued strictly before host time ``t`` (-inf: none), what a record or wait
    issued at ``t`` queues behind. ``next_issued(lane, t)`` is the first work
    issued at or after ``t``. Work is ordered by (issue, end, start); the
    lookups index it once it is complete.
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

    def _lane(self, lane: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._index is None:
            self._index = {}
            for name, cols in self._work.items():
                issue, end, start = (np.frombuffer(c, dtype=np.float64) for c in cols)
                order = np.lexsort((start, end, issue))  # by (issue, end, start)
                self._index[name] = (issue[order], np.maximum.accumulate(end[order]),
                                     start[order])
        return self._index.get(lane, _NONE)

    def tail(self, lane: str, t: float) -> float:
        issue, tail, _ = self._lane(lane)
        i = int(np.searchsorted(issue, t, "left"))
        return float(tail[i - 1]) if i > 0 else float("-inf")

    def next_issued(self, lane: str, t: float) -> Issued | None:
        issue, _, start = self._lane(lane)
        i = int(np.searchsorted(issue, t, "left"))
        return Issued(float(issue[i]), float(start[i])) if i < len(issue) else None


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
    for r in records:
        t = fires(measured.tail(r.lane, r.issue), r.issue)
        rec.set_times(r.op, t, t)
    fired = rec.op_end
    latest = {r.op: max(fired[r.op], r.graph_end) for r in records if r.graph_end is not None}
    released_at: dict[int, float] = {}
    for w in waits:
        reach = begins(measured.tail(w.lane, w.issue), w.issue)
        release = reach
        if w.bound >= 0:
            release = released(reach, fired[w.bound], 0.0, lane_of_record[w.bound] == w.lane)
            if latest.get(w.bound, fired[w.bound]) <= reach:
                # its record had fired (at the latest) when the stream reached it: the wait
                # did not hold; a later start of the next op is that op's own gap
                rec.set_times(w.op, reach, reach)
                released_at[w.bound] = min(released_at.get(w.bound, reach), reach)
                continue
        nxt = measured.next_issued(w.lane, w.issue)
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
