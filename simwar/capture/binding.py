"""Which record each stream wait and event sync of a capture binds to: the rules, in one place.

A CUDA ``cudaStreamWaitEvent`` or ``cudaEventSynchronize`` waits for the most recent
record of its event. Kineto's ``cuda_sync`` events say which event
(``wait_on_cuda_event_id``) and, in the profilers that report it, which record call
(``wait_on_cuda_event_record_corr_id``) and on which stream (``wait_on_stream``).
PyTorch 2.11 writes -1 for both and its ``cudaEventRecord*``/``cudaStreamWaitEvent``
runtime events carry only ``cbid`` and ``correlation``: the capture then names the
event of each wait and sync, but not the call that recorded it nor its stream.
:func:`bind` recovers the record from relations in the capture — event ids,
correlation ids, the order of each thread's calls — never from times, by these
rules, tried in this order (each use is bound by the first rule that applies; the
rule is kept per use, :attr:`Binding.rule`):

1. ``named``: the sync event names its record call (``..._record_corr_id >= 0``):
   that call; a graph launch named so is an in-graph record node of that launch.
2. ``wait_stream``: a stream wait on an event id that no other wait or sync of the
   process uses, whose thread's previous event call (record, wait, sync or launch)
   is a host record: that record. This is torch's ``Stream.wait_stream(other)``,
   which records a fresh event on ``other`` and waits on it.
3. ``ring``: an event sync (``cudaEventSynchronize``; CUPTI's "Event Sync" of a
   ``cudaEventQuery`` waits for nothing and binds nothing) on event E binds to a
   host record of its thread on E's stream (the stream of the newest unclaimed
   record before E's first use). A ring of events used in rotation, as SGLang's
   alternating ``copy_done`` events (recorded at step k, synced at step k+1), finds
   as many records between two uses of E as it has events (its size: the most common
   count between two consecutive uses of E): after E's previous use, the first of
   them, when there are at most that many (more is ambiguous and left unbound; fewer
   happens at the capture's end); at E's first use,
   the record that many back from the newest (none when there are fewer:
   recorded before the capture). An event synced only once (a fresh event per
   step) is left unbound: any record before it could be its own.
4. ``recorded_event``: a stream wait on an event that rules 1-3 found a host record
   of (a ring event the host also syncs, as a side stream's ``done`` event the main
   stream waits on): the most recent such record before the wait.
5. The other stream waits, each in its **window**: its thread's calls since the later
   of the previous use of its event id and the previous wait on its stream (in a loop,
   one iteration: a barrier's wait recurs once per step, whichever ids it uses).

   - ``post_graph``: exactly one graph launch in the window is followed, as its
     thread's next event call, by an unclaimed host record: that record (a read-done
     the host records right after the graph whose reads it ends: post-replay; one
     recorded too early, before a later graph's reads, is found so too). A loop that
     records after every graph launch (timing events) shows two or more and is left to
     ``in_graph``;
   - ``host_record``: no graph launch in the window, and exactly one unclaimed host
     record of its thread there: that one (an eager loop re-records the event before
     each wait);
   - ``in_graph``: a reused event id (an in-graph node's id recurs: one event per
     captured graph, re-armed by every launch): the in-graph record node of the most
     recent graph launch of the wait's thread before it (an ``Event(external=True)``
     recorded during graph capture). Which node of which graph the capture does not
     say: the most recent launch is the rule, so a host record that follows no graph
     launch (one after an eager phase, or before a graph) is not taken for a read-done
     where a graph launch precedes the wait.

A host record is bound by one use under rules 2, 3 and 5 (it is claimed: no other
use takes it), and a record found for an event under rules 1–3 serves every later wait
on that event until the event's next record (rule 4). Whatever no rule
binds is counted in :attr:`Binding.unbound` by kind and reason.

**The stream of a record** when the capture does not name it (rules 2–5): a
``wait_stream`` record (rule 2) is on the stream of the most recent *kernel* its
thread launched before it on a stream other than the waiting one (torch's
``S.wait_stream(T)`` waits for T's work; copies issued in between, such as a
result D2H on a copy stream, are skipped); any other host record is on the stream
of the most recent device work (kernel, memcpy, memset) its thread launched before
it; an in-graph node is on the stream of its launch's first kernel. Limits: a
record on a stream the thread launched nothing on before it (a record on an idle
stream, or work launched by another thread), or a ``wait_stream`` record issued after
a *kernel* on a third stream (a copy there is skipped, a kernel is not), is placed on
the wrong stream or, with no launch before it, left unplaced (counted in ``unbound``).

Rule 5 judges a host record by where it sits, since the runtime events do not say which
event it records: where graphs run, a host record is taken for a wait's record only when
it is the next event call after exactly one graph launch of the window. So a read-done
the host records after an eager phase, or before a graph, is taken for the last graph's
in-graph node, and a record of another event that alone follows one graph launch (a
timing event after one graph) for the wait's record.

Imports: the standard library, msgspec and :mod:`simwar.capture.reader`'s records; never the
simulator (api, executors, build).
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from operator import attrgetter

import msgspec

from simwar.capture.reader import DeviceEvent, RuntimeCall, SyncEvent, call_kind
from simwar.capture.records import launch_work
from simwar.core.trace import Call

WAIT_USE, SYNC_USE = "Stream Wait Event", "Event Sync"
_TS = attrgetter("ts")
_POS = attrgetter("pos")


@dataclass
class Binding:
    """The records of one process's waits and syncs (all keyed by correlation id).

    ``record_of``: a wait's or sync's host call → the call that recorded its event (a
    record call, or a graph launch for an in-graph node); ``stream``: each such record
    call → ``(device, stream)``; ``event``: each record call → the event id; ``rule``:
    each bound use → the rule that bound it; ``bound_records``: the record calls some wait
    or sync binds to (the values of ``record_of``, kept with it by the one function that
    binds a use); ``unbound``: what no rule bound, by ``"<kind>: <reason>"``.
    """

    record_of: dict[int, int] = field(default_factory=dict)
    stream: dict[int, tuple[int, int]] = field(default_factory=dict)
    event: dict[int, int] = field(default_factory=dict)
    rule: dict[int, str] = field(default_factory=dict)
    in_graph: set[int] = field(default_factory=set)
    unbound: Counter = field(default_factory=Counter)
    bound_records: set[int] = field(default_factory=set)

    def rules(self) -> Counter:
        """How many uses each rule bound."""
        return Counter(self.rule.values())


class _Use(msgspec.Struct, frozen=True, gc=False):
    """A wait or sync of the process (a msgspec struct: made by C code, one per use)."""

    pos: int  # position of the host call in the process's calls
    corr: int
    tid: int
    kind: str  # WAIT_USE | SYNC_USE
    event: int | None
    stream: int | None  # the waiting stream (a wait)
    device: int


def bind(calls: list[RuntimeCall], devs_by_corr: dict[int, DeviceEvent | tuple | list],
         syncs_by_corr: dict[int, SyncEvent]) -> Binding:
    """Bind the waits and syncs of one process (``calls``: its runtime calls in issue
    order, every thread; ``devs_by_corr``: each launch's device work, as
    :func:`simwar.capture.records.launch_work` reads it) by the rules of the module
    docstring."""
    b = Binding()
    pos_of = {c.correlation: i for i, c in enumerate(calls) if c.correlation >= 0}
    uses: list[_Use] = []
    for corr, s in syncs_by_corr.items():
        i = pos_of.get(corr)
        if i is None or s.kind not in (WAIT_USE, SYNC_USE):
            continue
        c = calls[i]
        # only a stream wait call waits and only a synchronize call syncs (CUPTI also writes
        # an "Event Sync" for a cudaEventQuery, which waits for nothing)
        if call_kind(c.name, False) is not (Call.WAIT_EVENT if s.kind == WAIT_USE
                                            else Call.SYNCHRONIZE):
            continue
        if s.kind == WAIT_USE and s.stream is None:
            continue  # a wait whose stream is not in the capture: not placed at all
        uses.append(_Use(i, c.correlation, c.tid, s.kind, s.event_id, s.stream, s.device))
    uses.sort(key=_POS)
    n_uses = Counter(u.event for u in uses if u.event is not None)
    if all(syncs_by_corr[u.corr].record_correlation is not None
           and syncs_by_corr[u.corr].wait_on_stream is not None for u in uses):
        kinds = _LazyKinds(calls, devs_by_corr)  # every use names its record: rule 1 only
        work = None
    else:
        kinds = [call_kind(c.name, c.correlation in devs_by_corr) for c in calls]
        work = _Work(calls, kinds, devs_by_corr)
    claimed: set[int] = set()
    left: list[_Use] = []

    # 1. named, 2. wait_stream
    for u in uses:
        s = syncs_by_corr[u.corr]
        rec = s.record_correlation
        if rec is not None:
            if rec not in pos_of:
                b.unbound[f"{_word(u)}: names a record call not in the capture"] += 1
                continue
            where = (s.device, s.wait_on_stream) if s.wait_on_stream is not None else \
                work.stream_before(pos_of[rec], kinds[pos_of[rec]])
            _bound(b, u, rec, "named", where, s.event_id)
            if kinds[pos_of[rec]] is Call.GRAPH_LAUNCH:
                b.in_graph.add(rec)
            continue
        if u.kind == WAIT_USE and u.event is not None and n_uses[u.event] == 1:
            prev = work.previous_event_call(u.pos)
            if prev is not None and kinds[prev] is Call.RECORD:
                r = calls[prev].correlation
                if r not in claimed:
                    where = work.kernel_stream_before(prev, (u.device, u.stream))
                    if where is not None:
                        claimed.add(r)
                        _bound(b, u, r, "wait_stream", where, u.event)
                        continue
        left.append(u)

    if work is None:
        return b
    records = work.host_records(claimed)  # tid -> [(pos, corr, stream)] not yet claimed
    # 3. ring (host syncs)
    syncs = [u for u in left if u.kind == SYNC_USE and u.event is not None]
    _rings(b, syncs, records, claimed)
    # a record known to record event E (rules 1-3) serves every later use of E until E's
    # next known record: "the most recent record of E"
    known: dict[int, list[tuple[int, int]]] = defaultdict(list)  # event -> [(pos, corr)]
    for corr, event in b.event.items():
        if corr in pos_of and kinds[pos_of[corr]] is Call.RECORD:
            known[event].append((pos_of[corr], corr))
    for rows in known.values():
        rows.sort()
    # 4. recorded_event, then 5. post_graph, host_record, in_graph, each wait in its window
    waits = defaultdict(list)
    for u in left:
        if u.kind == WAIT_USE and u.event is not None and u.corr not in b.record_of:
            rows = known.get(u.event)
            if rows:
                i = bisect.bisect_left(rows, (u.pos, -1)) - 1
                if i >= 0:
                    _bound(b, u, rows[i][1], "recorded_event", b.stream.get(rows[i][1]),
                           u.event)
                    continue
            waits[u.event].append(u)
    window = _windows(uses)
    rest = sorted((u for ws in waits.values() for u in ws), key=lambda x: x.pos)
    for u in rest:
        lo = window[u.corr]
        graphs = work.graphs_between(u.pos, lo)
        if graphs:
            after = [r for r in (work.next_event_call(g) for g in graphs)
                     if r is not None and r < u.pos and kinds[r] is Call.RECORD
                     and calls[r].correlation not in claimed]
            if len(after) == 1:
                corr = calls[after[0]].correlation
                claimed.add(corr)
                _bound(b, u, corr, "post_graph", work.last_work.get(after[0]), u.event)
                continue
            free = ()
        else:
            free = records.between(u.tid, lo, u.pos, claimed=claimed)
            if len(free) == 1:
                _, corr, where = free[0]
                claimed.add(corr)
                _bound(b, u, corr, "host_record", where, u.event)
                continue
        if n_uses[u.event] < 2:  # in_graph is for reused ids: an in-graph node's id recurs
            b.unbound[f"{_word(u)}: a fresh event with no record call before it"] += 1
            continue
        g = graphs[-1] if graphs else work.previous_graph(u.pos)
        if g is None:
            b.unbound[f"{_word(u)}: " + ("several host records in its window and no graph "
                                         "launch (which one is ambiguous)" if free else
                                         "no host record and no graph launch before it")] += 1
            continue
        corr = calls[g].correlation
        b.in_graph.add(corr)
        _bound(b, u, corr, "in_graph", work.first_kernel_stream(corr), u.event)
    for u in left:
        if u.event is None:
            b.unbound[f"{_word(u)}: no event id"] += 1
    return b


def _bound(b: Binding, u: _Use, rec: int, rule: str, where, event) -> None:
    """Binds use ``u`` to record call ``rec`` by ``rule``: the one place a binding grows."""
    b.record_of[u.corr] = rec
    b.bound_records.add(rec)
    b.rule[u.corr] = rule
    if where is not None:
        b.stream.setdefault(rec, where)
    if event is not None:
        b.event.setdefault(rec, event)


def _windows(uses: list[_Use]) -> dict[int, int]:
    """Per stream wait (by correlation): where its window of rule 5 starts, the position of
    the later of its event id's previous use and its stream's previous wait (-1: none)."""
    out: dict[int, int] = {}
    last_wait: dict[tuple, int] = {}
    last_use: dict[int, int] = {}
    for u in uses:  # in position order
        if u.kind == WAIT_USE:
            out[u.corr] = max(last_wait.get((u.device, u.stream), -1),
                              last_use.get(u.event, -1) if u.event is not None else -1)
            last_wait[(u.device, u.stream)] = u.pos
        if u.event is not None:
            last_use[u.event] = u.pos
    return out


def _word(u: _Use) -> str:
    return "wait" if u.kind == WAIT_USE else "sync"


def _rings(b: Binding, syncs: list[_Use], records: _Records, claimed: set[int]) -> None:
    """Rule 3 (see the module docstring)."""
    by_event: dict[int, list[_Use]] = defaultdict(list)
    for u in syncs:
        by_event[u.event].append(u)
    ring_stream: dict[int, tuple] = {}
    size: dict[int, int] = {}
    for event, us in by_event.items():
        first = us[0]
        newest = records.newest(first.tid, -1, first.pos, (), placed=True)
        if newest is None:
            continue
        ring_stream[event] = newest[2]
        if len(us) > 1:  # the ring's size: the records its steady state finds between uses
            gaps = Counter(len(records.between(b_.tid, a_.pos, b_.pos, newest[2]))
                           for a_, b_ in zip(us, us[1:]))
            size[event] = max(1, max(gaps, key=lambda g: (gaps[g], g)))
    last_use: dict[int, int] = {}
    for u in sorted(syncs, key=lambda x: x.pos):
        where = ring_stream.get(u.event)
        if where is None:
            b.unbound["sync: no host record before it"] += 1
            continue
        reason = "its record is not in the capture (recorded before it)"
        if u.event in last_use:  # the ring's steady state: as many records as its size
            free = records.between(u.tid, last_use[u.event], u.pos, where, claimed)
            # fewer at the capture's end (the loop stopped recording); more is ambiguous
            pick = free[0] if 1 <= len(free) <= size[u.event] else None
            if free and pick is None:
                reason = f"ambiguous ({len(free)} records since its previous use)"
        elif u.event in size:  # a ring's first use: its size back from the newest
            pick = records.newest(u.tid, -1, u.pos, claimed, stream=where,
                                  back=size[u.event])
        else:  # an event synced once: which record recorded it, the capture does not say
            pick = None
            reason = "its event is synced once (no ring): its record is not named"
        last_use[u.event] = u.pos
        if pick is None:
            b.unbound[f"sync: {reason}"] += 1
            continue
        claimed.add(pick[1])
        _bound(b, u, pick[1], "ring", pick[2], u.event)


class _LazyKinds:
    """``kinds[i]``: the call kind of call i, computed when asked (the named-record path
    asks for a few)."""

    def __init__(self, calls, devs_by_corr):
        self.calls, self.devs = calls, devs_by_corr

    def __getitem__(self, i: int) -> Call:
        c = self.calls[i]
        return call_kind(c.name, c.correlation in self.devs)


class _Work:
    """Per thread, the device work each call launched, for the stream rules."""

    def __init__(self, calls: list[RuntimeCall], kinds: list[Call],
                 devs_by_corr: dict[int, DeviceEvent | tuple | list]):
        self.calls, self.kinds, self.devs = calls, kinds, devs_by_corr
        self.by_thread: dict[int, list[int]] = defaultdict(list)  # event calls, by thread
        self.last_work: dict[int, tuple | None] = {}  # call pos -> stream of the latest work
        self.kernels_seen: dict[int, dict[tuple, int]] = {}  # record pos -> {stream: pos}
        current: dict[int, tuple | None] = defaultdict(lambda: None)
        kernels: dict[int, dict[tuple, int]] = defaultdict(dict)
        event_kinds = (Call.RECORD, Call.WAIT_EVENT, Call.SYNCHRONIZE, Call.LAUNCH,
                       Call.GRAPH_LAUNCH)
        for i, (c, k) in enumerate(zip(calls, kinds)):
            if k in event_kinds:
                self.by_thread[c.tid].append(i)
            if k is Call.RECORD:
                self.last_work[i] = current[c.tid]
                self.kernels_seen[i] = dict(kernels[c.tid])
            devs = devs_by_corr.get(c.correlation) if c.correlation >= 0 else None
            if devs:
                devs = launch_work(devs)
                last = devs[0] if len(devs) == 1 else max(devs, key=_TS)
                current[c.tid] = (last.device, last.stream)
                seen = kernels[c.tid]
                for d in devs:
                    if d.kind == "kernel":
                        seen[(d.device, d.stream)] = i
        self.index = {i: n for t in self.by_thread.values() for n, i in enumerate(t)}

    def previous_event_call(self, pos: int) -> int | None:
        seq = self.by_thread[self.calls[pos].tid]
        n = self.index.get(pos)
        return seq[n - 1] if n else None

    def next_event_call(self, pos: int) -> int | None:
        """The event call its thread issued right after call ``pos``."""
        seq = self.by_thread[self.calls[pos].tid]
        n = self.index.get(pos)
        return seq[n + 1] if n is not None and n + 1 < len(seq) else None

    def graphs_between(self, pos: int, after: int) -> list[int]:
        """The graph launches of call ``pos``'s thread in ``(after, pos)``, in order."""
        seq = self.by_thread[self.calls[pos].tid]
        n = self.index.get(pos, 0)
        lo = bisect.bisect_right(seq, after, 0, n)
        return [i for i in seq[lo:n] if self.kinds[i] is Call.GRAPH_LAUNCH]

    def previous_graph(self, pos: int) -> int | None:
        seq = self.by_thread[self.calls[pos].tid]
        n = self.index.get(pos, 0)
        for i in reversed(seq[:n]):
            if self.kinds[i] is Call.GRAPH_LAUNCH:
                return i
        return None

    def stream_before(self, pos: int, kind: Call) -> tuple | None:
        if kind is Call.GRAPH_LAUNCH:
            return self.first_kernel_stream(self.calls[pos].correlation)
        return self.last_work.get(pos)

    def kernel_stream_before(self, pos: int, waiting: tuple) -> tuple | None:
        seen = {s: i for s, i in self.kernels_seen.get(pos, {}).items() if s != waiting}
        return max(seen, key=seen.get) if seen else None

    def first_kernel_stream(self, corr: int) -> tuple | None:
        devs = self.devs.get(corr)
        if not devs:
            return None
        d = min(launch_work(devs), key=lambda x: x.ts)
        return (d.device, d.stream)

    def host_records(self, claimed: set[int]) -> _Records:
        out: dict[int, list[tuple]] = defaultdict(list)
        for i, k in enumerate(self.kinds):
            if k is Call.RECORD and self.calls[i].correlation not in claimed:
                out[self.calls[i].tid].append((i, self.calls[i].correlation,
                                               self.last_work.get(i)))
        return _Records(out)


class _Records:
    """The host records of each thread, ``(pos, corr, stream)`` by position, with the
    lookups the rules make (each a bisection, then a short scan)."""

    def __init__(self, by_thread: dict[int, list[tuple]]):
        self.rows = by_thread
        self.pos = {t: [r[0] for r in rows] for t, rows in by_thread.items()}

    def between(self, tid: int, after: int, before: int, stream=None,
                claimed=()) -> list[tuple]:
        """The records in (after, before), on ``stream`` if given, not claimed."""
        rows, pos = self.rows.get(tid, ()), self.pos.get(tid, ())
        lo, hi = bisect.bisect_right(pos, after), bisect.bisect_left(pos, before)
        return [r for r in rows[lo:hi] if (stream is None or r[2] == stream)
                and r[1] not in claimed]

    def newest(self, tid: int, after: int, before: int, claimed, stream=None, back: int = 1,
               placed: bool = False):
        """The ``back``-th newest record in (after, before) not claimed (on ``stream``)."""
        rows, pos = self.rows.get(tid, ()), self.pos.get(tid, ())
        lo, i = bisect.bisect_right(pos, after), bisect.bisect_left(pos, before) - 1
        while i >= lo:
            r = rows[i]
            if r[1] not in claimed and (stream is None or r[2] == stream) \
                    and (not placed or r[2] is not None):
                back -= 1
                if back == 0:
                    return r
            i -= 1
        return None
