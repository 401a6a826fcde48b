"""Which stream is which, and the barrier policy, of an imported capture's loop.

The first two things :func:`simwar.fit.from_capture.fit_model` reads from a capture:

- **streams** (:func:`detect_roles`): the forward stream (the importer's), the
  schedule stream (the mapping's ``schedule`` lane, else the stream whose
  record the forward waits on before each step, else the stream with work
  issued before the forward), the copy stream (``copy``, else the stream with
  work issued after the forward's last launch) and a ``plan`` lane when the
  mapping names one;
- **the barrier policy** (:func:`infer_policy`), from the records that the schedule
  stream's waits (and the host's synchronizes) bind to on the forward stream, and
  where in the forward each record was issued. Which record a wait binds to is
  :mod:`simwar.capture.binding`'s decision alone (from the record correlation ids, or
  where PyTorch 2.11 writes them as -1, from the event ids and the call order); what it
  leaves unbound is said in the words of the event ids (:class:`EventIds`).

Imports: numpy and simwar's capture and core modules; never the simulator.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from simwar.analysis.views import ops_of_call
from simwar.capture.mapping import Mapping
from simwar.core.trace import Call, OpKind, Trace
from simwar.fit.layout import Roles, StepLayout, columns

_WAIT = int(OpKind.WAIT)

#: the barrier policies a capture can show (and ``--policy`` may name)
POLICIES = ("fine", "coarse", "none", "host_sync")


@dataclass
class PolicyInference:
    """The barrier policy of a capture and what it was read from (``evidence``)."""

    barrier: str
    placement: str = "after_launch"
    unit: int | None = None  # index of the publishing unit
    position: str | None = None  # pre_replay | in_replay | post_replay
    source: str = "capture"  # capture | command line
    evidence: str = ""


# --------------------------------------------------------------------------- roles
def detect_roles(trace: Trace, mapping: Mapping) -> tuple[Roles, list[str]]:
    """The lane of each builder stream, and one note per auto-detected lane."""
    ops = trace.ops
    fwd = trace.meta.get("forward_stream", "forward")
    kernel = ops.kind == OpKind.KERNEL
    lanes = {trace.text(int(c)) for c in np.unique(ops.lane[kernel])}
    roles = Roles(forward=fwd)
    notes = []
    for role in ("schedule", "plan", "copy"):
        lane = mapping.lane_of_role(role)
        if lane is not None and lane in lanes:
            roles[role] = lane
    # per step: when the forward's first and last launch calls returned
    fcode = trace.code(fwd)
    fk = np.flatnonzero(kernel & (ops.lane == fcode) & (ops.phase != trace.code("")))
    first: dict[int, float] = {}
    last: dict[int, float] = {}
    for k, t in zip(ops.step[fk].tolist(), ops.issue_us[fk].tolist()):
        first[k] = min(first.get(k, t), t)
        last[k] = max(last.get(k, t), t)
    if "schedule" not in roles:
        votes: Counter = Counter()
        how = "the stream the forward waits on before each step"
        waits = np.flatnonzero((ops.kind == OpKind.WAIT) & (ops.lane == fcode) & (ops.bound >= 0))
        for w in waits.tolist():
            k = int(ops.step[w])
            if k in first and ops.issue_us[w] <= first[k]:
                lane = trace.text(int(ops.lane[ops.bound[w]]))
                if lane != fwd and lane != roles.get("plan"):
                    votes[lane] += 1
        if not votes:
            how = "the stream with work issued before each forward"
            for o in np.flatnonzero(kernel & (ops.lane != fcode)).tolist():
                k = int(ops.step[o])
                if k in first and ops.issue_us[o] <= first[k]:
                    lane = trace.text(int(ops.lane[o]))
                    if lane != roles.get("plan"):
                        votes[lane] += 1
        if votes:
            roles["schedule"] = votes.most_common(1)[0][0]
            notes.append(f"schedule stream '{roles['schedule']}': {how}")
    if "copy" not in roles:
        votes = Counter()
        for o in np.flatnonzero(kernel & (ops.lane != fcode)).tolist():
            k = int(ops.step[o])
            lane = trace.text(int(ops.lane[o]))
            if k in last and ops.issue_us[o] > last[k] and lane not in (
                    roles.get("schedule"), roles.get("plan")):
                votes[lane] += 1
        if votes:
            roles["copy"] = votes.most_common(1)[0][0]
            notes.append(f"copy stream '{roles['copy']}': the stream with work issued after "
                         f"the forward's last launch")
    return roles, notes


# --------------------------------------------------------------------------- policy
def infer_policy(trace: Trace, lays: dict[int, StepLayout], roles: Roles,
                 sync_events: int, readers: tuple[int, ...] = ()) -> PolicyInference | str:
    """The barrier the capture shows, or a sentence saying why it cannot be inferred.

    Per measured step, the schedule stream's waits (and host syncs other than the result
    sync) bound to a record on the forward stream (``ops.bound``: which record each binds to
    is :mod:`simwar.capture.binding`'s decision, with record correlation ids or, as PyTorch
    2.11 writes them, -1, from the event ids and call order): a record issued by a graph
    launch (an in-graph node) → ``fine`` published in-replay at that unit; an eager record
    right before the wait (``wait_stream``; calls of no known kind, such as
    ``cudaStreamIsCapturing``, between them do not count) → ``coarse``; another eager record →
    ``fine`` published at its position (before a unit's graph: pre-replay, after it:
    post-replay); a host synchronize on such a record → ``host_sync``; nothing → ``none``. A
    wait before the step's schedule launches is a loop-top barrier. A barrier wait bound to no
    record gives no vote: where no step votes, its event id says why no policy fits
    (:meth:`EventIds.misfit`); a host sync bound to none is read from its place (the loop top,
    or between the forward's launches and the result sync; ``readers``: the indexes of the
    units that read shared buffers). The most common answer wins.
    """
    ops, spans = trace.ops, trace.spans
    fwd = trace.code(roles["forward"])
    sched = {trace.code(x) for x in (roles.get("schedule"), roles.get("plan")) if x}
    votes: Counter = Counter()
    waited: dict[tuple, set] = {}  # vote -> the event ids of the waits that gave it
    unbound = 0
    steps = sorted(lays)
    ids = EventIds(trace, lays, readers)
    kind, lane = columns(trace, "ops", "kind", "lane")
    misfit: list[str] = []
    for k in steps:
        lay = lays[k]
        first_sched = spans.start_us[lay.sched_calls[0]] if lay.sched_calls else \
            spans.start_us[lay.first_forward]
        found = []
        events = []
        unread = False
        waits = [o for c in lay.calls for o in ops_of_call(trace, c)
                 if kind[o] == _WAIT and lane[o] in sched]
        for w in waits:
            b = int(ops.bound[w])
            if b < 0:
                unbound += 1
                why = ids.misfit(k, w)
                if why is not None:
                    unread = True
                    misfit.append(why)
                continue
            if ops.lane[b] != fwd:
                continue
            found.append(_classify(trace, lays, b, int(ops.call[w]), "wait",
                                   spans.start_us[ops.call[w]] < first_sched))
            events.append(trace.text(int(ops.event[w])))
        for s in lay.syncs:
            if s == lay.result_sync:
                continue
            op = int(spans.op[s])
            if op < 0 or ops.kind[op] != OpKind.SYNC:
                continue
            b = int(ops.bound[op])
            if b < 0:
                unbound += 1
                if s in (lay.top_sync, lay.post_sync):  # a barrier sync by its place
                    found.append(("host_sync", "loop_top" if s == lay.top_sync
                                  else "after_launch", *ids.recorded(k), "place"))
                    events.append("")
                continue
            if ops.lane[b] == fwd:
                found.append(_classify(trace, lays, b, s, "sync",
                                       spans.start_us[s] < first_sched))
                events.append(trace.text(int(ops.event[op])))
        if found:
            votes[found[0]] += 1
            waited.setdefault(found[0], set()).add(events[0])
        elif sync_events and not unread:
            votes[("none", "after_launch", None, None, "bound")] += 1
    if misfit and not votes:
        return misfit[0]
    if unbound and not any(v[0] != "none" for v in votes):
        return (f"its {sync_events} CUDA sync events bind no wait to a record (the record "
                f"correlation ids are -1: this profiler does not report which "
                f"cudaEventRecord a wait binds to) and carry no event ids to read it from")
    if not sync_events:
        return "it has no CUDA sync events (profile with experimental_config=" \
               "_ExperimentalConfig(enable_cuda_sync_events=True))"
    if not votes:
        return "no measured step to read it from"
    key, n = votes.most_common(1)[0]
    barrier, placement, unit, position, how = key
    total = sum(votes.values())
    named = (trace.meta.get("binding") or {}).get("rules", {}).get("named", 0) > 0
    top = placement == "loop_top"
    if how == "place":
        evidence = ids.evidence_place(unit, position, n, total, top)
    elif not named and barrier != "none" and (trace.meta.get("binding") or {}).get("rules"):
        evidence = ids.evidence(barrier, unit, position, sorted(waited.get(key, ()) - {""},
                                                                key=lambda x: (len(x), x)),
                                n, total)
    else:
        what = {"none": "no stream waits on the forward before the schedule stream's work",
                "coarse": "the schedule stream waits on a record issued right before the wait "
                          "(wait_stream(forward))",
                "fine": "the schedule stream's wait_event binds to ",
                "host_sync": "the host synchronizes on "}[barrier]
        if barrier in ("fine", "host_sync"):
            what += ("an event recorded by the graph launch (an in-graph node)"
                     if position == "in_replay" and _is_graph(lays, steps, unit)
                     else f"an eager record ({position})")
        evidence = f"{what}, in {n} of {total} steps"
    if top:
        evidence += "; at the top of the next iteration (loop_top)"
    return PolicyInference(barrier, placement, unit, position, "capture", evidence)


class EventIds:
    """What the event ids of a capture's waits say where the binding leaves them unbound, and
    the words for a policy read from bindings made without record ids (PyTorch 2.11).

    torch's profiler writes each stream wait's event id (``wait_on_cuda_event_id``, the wait
    op's ``event``) even where it names no record, and :mod:`simwar.capture.binding` binds the
    waits from them: ``wait_stream(forward)`` (**coarse**) records a fresh event by the call
    right before the wait (an id no other step waits on); a **fine** barrier waits again and
    again on the same few ids: read-done recorded by a node inside a graph (an external event,
    one per captured graph, so one id per bucket) or by a host record right after one graph's
    launch (post-replay). This class reads none of that again; it says:

    - why a barrier wait that the binding left unbound fits no policy (:meth:`misfit`): a fresh
      id with no record call right before the wait (neither wait_stream nor an in-graph node,
      whose id recurs), or a recurring id with nothing before it that could record it;
    - where a host sync bound to no record publishes (:meth:`recorded`): read-done after the
      one graph launch of the step that a host record follows (post-replay), else the last
      reading unit's (none declared: the last graph's) in-graph node;
    - the header's words (:meth:`evidence`, :meth:`evidence_place`).

    Waits on other streams (``forward.wait_stream(schedule)``, ``copy.wait_stream(forward)``)
    are not barriers and are not read here.
    """

    def __init__(self, trace: Trace, lays: dict[int, StepLayout], readers=()):
        self.trace, self.lays, self.readers = trace, lays, tuple(readers)
        ops = trace.ops
        empty = trace.code("")
        waits = np.flatnonzero((ops.kind == OpKind.WAIT) & (ops.event != empty))
        self.steps_of: dict[int, set] = {}
        for ev, k in zip(ops.event[waits].tolist(), ops.step[waits].tolist()):
            self.steps_of.setdefault(ev, set()).add(k)
        wl = trace.meta.get("workload") or {}
        buckets = wl.get("graph_bucket")
        self.buckets = len({int(buckets[k]) for k in lays if k < len(buckets)}) \
            if buckets else 1

    def publisher(self, k: int) -> int | None:
        """The unit that publishes read-done in step ``k``: the last reading unit (when no
        unit is declared to read: the last graph, which an in-graph node needs, else the last
        unit)."""
        units = self.lays[k].units
        if not units:
            return None
        reading = [i for i in self.readers if i < len(units)]
        if reading:
            return max(reading)
        graphs = [i for i, u in enumerate(units) if u.graph is not None]
        return graphs[-1] if graphs else len(units) - 1

    def recorded(self, k: int) -> tuple[int | None, str]:
        """``(unit, position)`` of step ``k``'s read-done, for a host sync bound to no record:
        a host record right after one graph launch (not a wait_stream's record, and no other
        graph launch of the step is followed by one: an instrumented loop records after every
        launch) is an eager record after that unit's replay (``post_replay``); otherwise the
        publishing unit's in-graph node (``in_replay``; an eager unit: ``post_replay``)."""
        lay = self.lays[k]
        spans = self.trace.spans
        calls = [c for c in lay.calls if spans.call[c] != Call.OTHER]

        def record_after(g: int) -> bool:
            i = calls.index(g) if g in calls else -1
            if not 0 <= i < len(calls) - 1 or spans.call[calls[i + 1]] != Call.RECORD:
                return False
            after = calls[i + 2] if i + 2 < len(calls) else None
            # a wait_stream's record: a fresh event, waited on by the next call
            return not (after is not None and spans.call[after] == Call.WAIT_EVENT
                        and _binds_fresh(self.trace, after, self.steps_of))

        followed = [i for i, u in enumerate(lay.units)
                    if u.graph is not None and record_after(u.graph)]
        if len(followed) == 1:
            return followed[0], "post_replay"
        unit = self.publisher(k)
        if unit is None or lay.units[unit].graph is None:
            return unit, "post_replay"
        return unit, "in_replay"

    def misfit(self, k: int, wait: int) -> str | None:
        """Why the barrier wait ``wait`` of step ``k``, which no record binds, fits no policy
        (None: it has no event id, and says nothing)."""
        trace = self.trace
        ops = trace.ops
        ev = int(ops.event[wait])
        if ev == trace.code(""):
            return None
        name = trace.text(ev)
        lane = trace.text(int(ops.lane[wait]))
        if len(self.steps_of.get(ev, ())) <= 1:
            return (f"step {k}: {lane} waits on {name}, which no other step waits "
                    f"on (not an in-graph node, whose id recurs) and which no record call "
                    f"right before the wait recorded (not wait_stream): an event-id pattern "
                    f"of no barrier policy")
        return (f"step {k}: {lane} waits on {name}, which recurs (not wait_stream), but no "
                f"graph launch precedes the wait (not an in-graph node) and the host records "
                f"since the previous wait are not exactly one: an event-id pattern of no "
                f"barrier policy")

    def _phase(self, unit) -> str:
        first = self.lays[min(self.lays)]
        return first.units[unit].phase if unit is not None and unit < len(first.units) else ""

    def evidence(self, barrier: str, unit, position, ids: list[str], n: int,
                 total: int) -> str:
        """The header's sentence for a policy read from waits bound without record ids
        (``ids``: the event ids the voting waits waited on)."""
        name = self._phase(unit)
        tail = (f", in {n} of {total} steps (the record correlation ids are -1: bound by the "
                f"event ids and the call order)")
        if barrier == "coarse":
            return ("the schedule stream waits on a fresh event each step (a new id), recorded "
                    "by the call right before the wait (wait_stream(forward))" + tail)
        shown = ", ".join(ids[:4]) + (" ..." if len(ids) > 4 else "")
        count = f"{len(ids)} id{'s' if len(ids) != 1 else ''} for {self.buckets} " \
                f"bucket{'s' if self.buckets != 1 else ''}"
        if barrier == "host_sync":
            return (f"the host synchronizes on event ids ({shown}) recorded "
                    + (f"in {name}'s graph (in_replay)" if position == "in_replay"
                       else f"by the host around {name} ({position})") + tail)
        if position == "in_replay":
            where = ((f"one per captured graph of {name}" if len(ids) <= self.buckets
                      else f"recorded in {name}'s graph")
                     + f" ({count}): its in-graph record node, the last graph launched before "
                       f"each wait")
        elif position == "post_replay":
            where = (f"recorded by the host right after {name}'s "
                     + ("graph launch" if self._is_graph(unit) else "launches")
                     + f" ({count}): an eager record after its replay")
        else:
            where = f"recorded by the host before {name}'s graph launch ({count}): pre-replay"
        return (f"the schedule stream's wait_event waits step after step on the same event "
                f"ids ({shown}), {where} (a wait_stream waits on a fresh event each step)"
                + tail)

    def _is_graph(self, unit) -> bool:
        first = self.lays[min(self.lays)]
        return unit is not None and unit < len(first.units) and \
            first.units[unit].graph is not None

    def evidence_place(self, unit, position, n: int, total: int, top: bool) -> str:
        """The header's sentence for a host sync read from its place (bound to no record)."""
        name = self._phase(unit)
        where = ("at the top of the iteration, before the schedule launches" if top
                 else "between the forward's launches and the result sync")
        return (f"the host synchronizes {where}, on a record this capture does not bind "
                f"(taken as read-done of {name}, {position}: "
                + ("a host record follows its graph launch)" if position == "post_replay"
                   else "no host record follows its graph launch)")
                + f", in {n} of {total} steps (the record correlation ids are -1: read from "
                  f"the sync's place)")


def _binds_fresh(trace: Trace, wait_call: int, steps_of: dict) -> bool:
    """The wait issued by ``wait_call`` waits on an event no other step waits on."""
    ops = trace.ops
    for o in ops_of_call(trace, wait_call):
        if ops.kind[o] == OpKind.WAIT:
            return len(steps_of.get(int(ops.event[o]), ())) <= 1
    return False


def _is_graph(lays, steps, unit) -> bool:
    return unit is not None and lays[steps[0]].units[unit].graph is not None


def _classify(trace: Trace, lays, rec: int, waiter: int, kind: str, top: bool) -> tuple:
    """``(barrier, placement, unit, position)`` of one barrier wait/sync on record ``rec``."""
    ops, spans = trace.ops, trace.spans
    placement = "loop_top" if top else "after_launch"
    barrier = "host_sync" if kind == "sync" else "fine"
    call = int(ops.call[rec])
    lay = lays.get(int(ops.step[rec]))
    if call < 0 or lay is None:
        return (barrier, placement, None, None, "bound")
    ck = spans.call[call]
    if ck == Call.WAIT_STREAM or (kind == "wait" and call != waiter
                                  and _previous_call(trace, lay, waiter) == call):
        return ("coarse", placement, None, None, "bound")
    if ck == Call.GRAPH_LAUNCH:
        for i, u in enumerate(lay.units):
            if u.graph == call:
                return (barrier, placement, i, "in_replay", "bound")
        return (barrier, placement, None, None, "bound")
    t = spans.start_us[call]
    unit = None
    for i, u in enumerate(lay.units):
        if spans.start_us[u.calls[0]] < t:
            unit = i
    if unit is None:
        return (barrier, placement, None, None, "bound")
    u = lay.units[unit]
    if u.graph is not None:
        position = "pre_replay" if t < spans.start_us[u.graph] else "post_replay"
    else:
        position = "post_replay" if t > spans.start_us[u.calls[-1]] else "in_replay"
    return (barrier, placement, unit, position, "bound")


def _previous_call(trace: Trace, lay: StepLayout, call: int) -> int | None:
    """The host call of step ``lay`` right before ``call`` (torch's ``wait_stream`` is a
    record right before its wait); calls of no known kind (``Call.OTHER``, such as the
    ``cudaStreamIsCapturing`` torch issues before each record and wait) are skipped."""
    spans = trace.spans
    calls = lay.calls
    i = calls.index(call) if call in calls else -1
    for c in reversed(calls[:max(i, 0)]):
        if spans.call[c] != Call.OTHER:
            return c
    return None
