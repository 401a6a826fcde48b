"""When a capture's records fired and its waits released: inferred on the measured streams.

A Kineto capture times device work (kernels, memcpys, memsets) but not the
records and stream waits between them. :func:`infer_device_times` places them
by :mod:`simwar.core.rules` on each stream's measured tail
(:class:`MeasuredLanes`), once :class:`simwar.capture.to_trace.CaptureTraceBuilder`
has recorded every measured op.

Imports: the standard library, msgspec, numpy and :mod:`simwar.core`; never the simulator
(api, executors, build).
"""

from __future__ import annotations

from array import array
from collections import defaultdict

import msgspec
import numpy as np

from simwar.core.recorder import Recorder
from simwar.core.rules import begins_where, released_where


class PendingRecord(msgspec.Struct, frozen=True, gc=False):
    """A record op whose firing is inferred once every measured kernel is known (a msgspec
    struct, as the capture's records: a third smaller than a named tuple, and these are held
    at the import's peak)."""

    op: int
    lane: str
    issue: float  # when the host call that issued it returned (a stream sync: its start)
    #: an in-graph node: the end of its graph's last kernel on its lane (None: a host record)
    graph_end: float | None = None


class PendingWait(msgspec.Struct, frozen=True, gc=False):
    """A stream-wait op whose reach and release are inferred once every kernel is known."""

    op: int
    lane: str
    issue: float
    bound: int  # the record op it waits for, -1: none


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

    def tails(self, lanes: list[str], times: list[float]) -> np.ndarray:
        """``tail(lane, t)`` of each ``(lane, t)``: the running tail, the latest measured end of
        the work issued strictly before ``t`` (-inf: none); one search per lane."""
        out = np.full(len(times), -np.inf)
        for lane, at, pos in self._search(lanes, times):
            hit = pos > 0
            out[at[hit]] = self._lane(lane)[1][pos[hit] - 1]
        return out

    def next_issued(self, lanes: list[str],
                    times: list[float]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Of each ``(lane, t)``, the first work issued at or after ``t``: its issue and start
        times, and whether there is one (where there is none, both are NaN)."""
        issue_at, start_at = np.full(len(times), np.nan), np.full(len(times), np.nan)
        found = np.zeros(len(times), dtype=bool)
        for lane, at, pos in self._search(lanes, times):
            issue, _, start = self._lane(lane)
            hit = pos < len(issue)
            got, at = pos[hit], at[hit]
            issue_at[at], start_at[at], found[at] = issue[got], start[got], True
        return issue_at, start_at, found

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
    # every record and wait at once, by the rules' array forms (each the scalar form's own
    # comparison, element by element) and numpy's where for Python's min and max (the
    # second value where it is less, or greater), so NaN and ties go as they go one by one
    rec_ops = np.fromiter((r.op for r in records), np.int64, len(records))
    issue = np.fromiter((r.issue for r in records), np.float64, len(records))
    tail = measured.tails([r.lane for r in records], issue)
    fired_at = begins_where(tail, issue)  # fires(tail, issue): a record's rule is begins'
    rec.set_times_many(rec_ops, fired_at, fired_at)
    graph_end = np.fromiter((np.nan if r.graph_end is None else r.graph_end for r in records),
                            np.float64, len(records))
    in_graph = np.fromiter((r.graph_end is not None for r in records), bool, len(records))
    # the latest a record fired: an in-graph node's, max(fired, graph end)
    latest = np.where(in_graph & (graph_end > fired_at), graph_end, fired_at)
    lane_code: dict[str, int] = {}
    record_lane = np.fromiter((lane_code.setdefault(r.lane, len(lane_code)) for r in records),
                              np.int64, len(records))

    n = len(waits)
    ops = np.fromiter((w.op for w in waits), np.int64, n)
    issue = np.fromiter((w.issue for w in waits), np.float64, n)
    bound = np.fromiter((w.bound for w in waits), np.int64, n)
    lanes = [w.lane for w in waits]
    wait_lane = np.fromiter((lane_code.get(lane, -1) for lane in lanes), np.int64, n)
    tail = measured.tails(lanes, issue)
    nxt_issue, nxt_start, has_next = measured.next_issued(lanes, issue)
    reach = begins_where(tail, issue)
    is_bound = bound >= 0
    # the bound record of each wait, by its place in ``records`` (ops in increasing order)
    at = np.searchsorted(rec_ops, bound) if len(rec_ops) else np.zeros(n, np.int64)
    at = np.where(is_bound, np.minimum(at, max(len(rec_ops) - 1, 0)), 0)
    if len(rec_ops) and bool((rec_ops[at][is_bound] != bound[is_bound]).any()):
        raise ValueError("a wait is bound to an op that is no record")
    fired = fired_at[at] if len(rec_ops) else np.zeros(n)
    same = record_lane[at] == wait_lane if len(rec_ops) else np.zeros(n, bool)
    release = np.where(is_bound, released_where(reach, fired, 0.0, same), reach)
    # its record had fired (at the latest) when the stream reached it: the wait did not hold;
    # a later start of the next op is that op's own gap
    free = is_bound & ((latest[at] if len(rec_ops) else fired) <= reach)
    # otherwise the next op issued on its stream bounds it: queued behind the wait (issued by
    # the rule's release), it ran as soon as the wait let go; issued later, the wait had let
    # go by the time it started
    nxt = ~free & has_next & (nxt_start >= reach)
    queued = nxt_issue <= release
    release = np.where(nxt & queued, nxt_start, release)
    release = np.where(nxt & ~queued & (nxt_start < release), nxt_start, release)
    release = np.where(free, reach, release)
    rec.set_times_many(ops, reach, release)  # held (release > reach): a wait span
    released_at: dict[int, float] = {}  # a record's earliest release of a wait bound to it
    for b, v in zip(bound.tolist(), release.tolist()):
        old = released_at.get(b)
        if old is None or v < old:  # min(old, v), wait by wait
            released_at[b] = v
    fired = rec.op_end
    for r in records:
        if r.graph_end is not None:
            t = fired[r.op]
            t = max(t, min(r.graph_end, released_at.get(r.op, r.graph_end)))
            rec.set_times(r.op, t, t)
