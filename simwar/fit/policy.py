"""Which stream is which, and the barrier policy, of an imported capture's loop.

The first two things :func:`simwar.fit.from_capture.fit_model` reads from a capture:

- **streams** (:func:`detect_roles`): the forward stream (the importer's), the
  schedule stream (the mapping's ``schedule`` lane, else the stream whose
  record the forward waits on before each step, else the stream with work
  issued before the forward), the copy stream (``copy``, else the stream with
  work issued after the forward's last launch) and a ``plan`` lane when the
  mapping names one;
- **the barrier policy** (:func:`infer_policy`), from the CUDA sync events that
  bind the schedule stream's waits (and the host's synchronizes) to records on
  the forward stream, and where in the forward each record was issued; when a
  capture binds none (PyTorch 2.11 writes every record correlation id as -1), from
  the structure of the waits' event ids (:class:`EventIds`).

Imports: numpy and simwar's capture and core modules; never the simulator.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

from simwar.capture.layout import Roles, StepLayout, ops_of_call
from simwar.capture.mapping import Mapping
from simwar.core.trace import Call, OpKind, Trace

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
    sync) bound to a record on the forward stream: a record issued by a graph launch (an
    in-graph node) → ``fine`` published in-replay at that unit; an eager record right
    before the wait (``wait_stream``) → ``coarse``; another eager record → ``fine``
    published at its position (before a unit's graph: pre-replay, after it: post-replay);
    a host synchronize on such a record → ``host_sync``; nothing → ``none``. A wait
    before the step's schedule launches is a loop-top barrier. A wait bound to no record
    is read from its event id (:class:`EventIds`; ``readers``: the indexes of the units that
    read shared buffers). The most common answer wins.
    """
    ops, spans = trace.ops, trace.spans
    fwd = trace.code(roles["forward"])
    sched = {trace.code(x) for x in (roles.get("schedule"), roles.get("plan")) if x}
    votes: Counter = Counter()
    unbound = 0
    steps = sorted(lays)
    ids = EventIds(trace, lays, readers)
    misfit: list[str] = []
    for k in steps:
        lay = lays[k]
        first_sched = spans.start_us[lay.sched_calls[0]] if lay.sched_calls else \
            spans.start_us[lay.first_forward]
        found = []
        waits = [o for c in lay.calls for o in ops_of_call(trace, c)
                 if ops.kind[o] == OpKind.WAIT and ops.lane[o] in sched]
        for w in waits:
            b = int(ops.bound[w])
            if b < 0:
                unbound += 1
                vote = ids.vote(k, w, spans.start_us[ops.call[w]] < first_sched)
                if isinstance(vote, str):
                    misfit.append(vote)
                elif vote is not None:
                    found.append(vote)
                continue
            if ops.lane[b] != fwd:
                continue
            found.append(_classify(trace, lays, b, int(ops.call[w]), "wait",
                                   spans.start_us[ops.call[w]] < first_sched))
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
                continue
            if ops.lane[b] == fwd:
                found.append(_classify(trace, lays, b, s, "sync",
                                       spans.start_us[s] < first_sched))
        if found:
            votes[found[0]] += 1
        elif sync_events and not misfit:
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
    (barrier, placement, unit, position, how), n = votes.most_common(1)[0]
    total = sum(votes.values())
    if how in ("event id", "place"):
        if how == "event id" and position == "in_replay" \
                and len(ids.seen.get("fine", ())) > ids.buckets:
            position = "post_replay"  # more ids than captured graphs: an eager record
        evidence = ids.evidence(barrier, unit, position, how, n, total, placement == "loop_top")
        if placement == "loop_top":
            evidence += "; at the top of the next iteration (loop_top)"
        return PolicyInference(barrier, placement, unit, position, "capture", evidence)
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
    if placement == "loop_top":
        evidence += "; at the top of the next iteration (loop_top)"
    return PolicyInference(barrier, placement, unit, position, "capture", evidence)


class EventIds:
    """The barrier read from the event ids of waits that no record binds (PyTorch 2.11).

    torch's profiler writes each stream wait's event id (``wait_on_cuda_event_id``, the wait
    op's ``event``) even where it names no record. The structure is plain in them:

    - ``wait_stream(forward)`` (**coarse**) records a fresh event on the forward stream, by
      the host call right before the wait (a ``cudaEventRecord``), and waits on it: an id no
      other step waits on;
    - a **fine** barrier waits again and again on the same few ids: ``read_done``, recorded by
      a node inside the publishing phase's graph (an external event, one per captured graph,
      so one id per bucket), or by an eager record of a reused event. Which: a host record
      right after exactly one graph launch of the step is that eager record, after that
      unit's replay (``post_replay``; this also finds a read-done recorded too early, before
      a later phase's reads: the fitted loop then shows the race); otherwise the last unit
      that reads shared buffers (the publish rule; none declared: the last graph) publishes
      ``in_replay``, if the ids are no more than the buckets the steps ran (one per
      captured graph), else ``post_replay``;
    - a fresh id with no record call right before the wait fits no policy (and is said so).

    What the ids cannot say: *which* graph's node an in-graph read-done is (every phase's
    graph changes with the bucket alike), so it is taken to be the last reading phase's, as the
    publish rule has it; a read-done captured in an earlier phase's graph (published too early:
    a race) needs the binding of waits to records.

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
        self.seen: dict[str, set] = {}  # barrier -> event ids its votes waited on

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

    def publisher_is_graph(self, k: int) -> bool:
        unit = self.publisher(k)
        return unit is not None and self.lays[k].units[unit].graph is not None

    def recorded(self, k: int) -> tuple[int | None, str]:
        """``(unit, position)`` of step ``k``'s read-done: a host record right after one
        graph launch (not a wait_stream's record, and no other graph launch of the step is
        followed by one: an instrumented loop records after every launch) is an eager record
        after that unit's replay (``post_replay``); otherwise the publishing unit's in-graph
        node (``in_replay``; an eager unit: ``post_replay``)."""
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

    def _previous_call(self, lay: StepLayout, call: int) -> int | None:
        """The host call right before ``call`` (calls of no known kind, such as
        ``cudaStreamIsCapturing``, skipped)."""
        spans = self.trace.spans
        i = lay.calls.index(call) if call in lay.calls else -1
        for c in reversed(lay.calls[:max(i, 0)]):
            if spans.call[c] != Call.OTHER:
                return c
        return None

    def vote(self, k: int, wait: int, top: bool) -> tuple | str | None:
        """The vote of one unbound barrier wait (None: it has no event id), or a sentence
        when its ids fit no policy."""
        trace = self.trace
        ops, spans = trace.ops, trace.spans
        ev = int(ops.event[wait])
        if ev == trace.code(""):
            return None
        lay = self.lays[k]
        placement = "loop_top" if top else "after_launch"
        prev = self._previous_call(lay, int(ops.call[wait]))
        recorded = prev is not None and spans.call[prev] in (Call.RECORD, Call.WAIT_STREAM)
        name = trace.text(ev)
        lane = trace.text(int(ops.lane[wait]))
        if len(self.steps_of.get(ev, ())) <= 1:
            if recorded:
                self.seen.setdefault("coarse", set()).add(name)
                return ("coarse", placement, None, None, "event id")
            return (f"step {k}: {lane} waits on {name}, which no other step waits "
                    f"on (not an in-graph node, whose id recurs) and which no record call "
                    f"right before the wait recorded (not wait_stream): an event-id pattern "
                    f"of no barrier policy")
        if self.publisher(k) is None:
            return f"step {k}: {lane} waits on {name} before any phase launched"
        self.seen.setdefault("fine", set()).add(name)
        unit, position = self.recorded(k)
        return ("fine", placement, unit, position, "event id")

    def evidence(self, barrier: str, unit, position, how: str, n: int, total: int,
                 top: bool = False) -> str:
        """The header's sentence for a policy read from event ids (or a sync's place;
        ``top``: at the loop top)."""
        first = self.lays[min(self.lays)]
        name = first.units[unit].phase if unit is not None and unit < len(first.units) else ""
        tail = (f", in {n} of {total} steps (the record correlation ids are -1: read from the "
                f"event ids)")
        if how == "place":
            where = ("at the top of the iteration, before the schedule launches" if top
                     else "between the forward's launches and the result sync")
            return (f"the host synchronizes {where}, on a record this capture does not bind "
                    f"(taken as read-done of {name}, {position}: "
                    + ("a host record follows its graph launch)" if position == "post_replay"
                       else "no host record follows its graph launch)")
                    + tail.replace("event ids", "sync's place"))
        if barrier == "coarse":
            return ("the schedule stream waits on a fresh event each step (a new id), recorded "
                    "by the call right before the wait (wait_stream(forward))" + tail)
        ids = sorted(self.seen.get("fine", ()), key=lambda x: (len(x), x))
        shown = ", ".join(ids[:4]) + (" ..." if len(ids) > 4 else "")
        n = f"{len(ids)} id{'s' if len(ids) != 1 else ''} for {self.buckets} " \
            f"bucket{'s' if self.buckets != 1 else ''}"
        where = (f"one per captured graph of {name} ({n}): its in-graph record node"
                 if position == "in_replay" else
                 f"an eager record after {name}'s replay (a host record follows its graph "
                 f"launch and no other's, or {name} is eager, or the ids are more than one per "
                 f"captured graph: {n})")
        return (f"the schedule stream's wait_event waits step after step on the same event "
                f"ids ({shown}), {where} (a wait_stream waits on a fresh event each step)"
                + tail)


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
    if ck == Call.WAIT_STREAM or (kind == "wait" and call != waiter and _adjacent(lay, call,
                                                                                    waiter)):
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


def _adjacent(lay: StepLayout, record_call: int, wait_call: int) -> bool:
    """The record was the host call right before the wait (torch's wait_stream)."""
    calls = lay.calls
    if record_call not in calls or wait_call not in calls:
        return False
    return calls.index(wait_call) == calls.index(record_call) + 1
