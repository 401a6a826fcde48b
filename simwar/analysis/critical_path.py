"""The critical path behind each forward: what bound its start, link by link, in µs.

Every operation's start is bound by one constraint, read from the Trace's
relations (never from labels or matched times):

- a device op (kernel, record, wait) begins at the **later** of its stream
  predecessor's end (the previous op on its lane, in issue order) and its
  issue time (the end of its host call, ``spans.end_us[ops.call]``); on a
  tie the stream predecessor binds;
- a stream wait that was released after it was reached is bound at its end
  by the record it bound to (``ops.bound``) firing; the stretch from the
  firing to the release is **cross-stream latency** when the record is on
  another lane;
- a host span begins when the previous host span ends (host program order:
  host spans by start time, ties by id);
- a host ``synchronize`` that really blocked (its record fired inside it)
  ends at the firing plus the **wake-up**; otherwise its length is the
  call's own cost.

Walking back from forward k's first kernel to the end of forward k-1 gives the
chain that set the forward-stream gap before forward k; walking back from
forward k+1's first kernel to forward k's start gives the chain of step k. The
walk emits contiguous :class:`Segment` s, each with a cause in words and a
kind, so a chain's segments add up to the interval exactly. On measured
traces a binding constraint may end before the op starts (launch latency,
clock skew, untraced host time): that slack is a segment of its own kind
(``launch_latency`` or ``unexplained``), so the sum rule still holds.

Kinds (:class:`SegmentKind`, whose values are the words the JSON output uses):
``device`` (device work, by stream and label), ``cross_stream`` (a wait's release
after its record fired, named after the wait), ``host`` (cpu work by site),
``host_api`` (host API calls by kind), ``wake_up`` (the end of a blocking
synchronize, named after its site), ``launch_latency`` and ``unexplained``
(slack on measured traces; none on simulated ones), ``rank`` (below).
The records are named the way HTA names its critical-path graph (``CPEdge``,
``CPEdgeType``): :class:`Segment` with a :class:`SegmentKind`, :class:`Chain`
with a :class:`ChainKind`, :class:`Gate` and :class:`GateLanes`.

**A measured trace in its code's own words.** A capture has no CPU-work spans:
the host's time between two traced calls is untraced unless the code named it.
Given the host's ``record_function`` ranges (:class:`HostRanges`), that time is
the innermost range's work (``cpu: scheduler.get_next_batch_to_run``); only what
no range covers stays ``host: untraced time``. A host call that **blocked** is
named with what it waited for: a launch whose own op ran and ended inside the
call, queued behind other work (a ``cudaMemcpyAsync`` into memory torch copies
synchronously: a hidden host sync) is ``host blocked in cudaMemcpyAsync (4096 B,
DtoH (Device -> Pinned) copy) until <stream>: <the op before it> ended``, and the
chain goes on through that copy into the work it waited for, as through a
synchronize; a synchronize whose record the capture does not bind says so.
``device_info`` (per op: bytes and copy kind, from the importer) gives a copy's
size and kind.

**Per bucket.** A run whose batch changes every step (``meta.workload``) runs
host-bound and device-bound steps side by side; :meth:`CriticalPath.by_bucket`
gives each graph bucket's chains, explained apart.

Each segment also names ``after``: the gate (a held wait or a blocking
synchronize) that the part of the chain it lies in came through, e.g. the
schedule-stream writes of a coarse run come ``after`` the coarse barrier.

**Tensor-parallel ranks.** Given a rank's collectives (``ranks``: op id -> the late rank,
this rank's wait, the name), the time a collective held this rank for the late one is a
``rank`` segment ("rank 1's host work arrived late at the broadcast"), the rest of it the
collective's own (docs/design.md, "Tensor-parallel ranks").

Chains are tallied as they come (:class:`CauseTally`: the sums in the same order, so a
:class:`CriticalPath` need not keep them), and a walk on a window of a trace
(:class:`~simwar.core.trace.TraceWindow`) raises :class:`Truncated` rather than take what
lies before the window for absent; :mod:`.critical_stream` walks a streamed run.

The module is longer than most: the walk, the names it gives its causes and their
tally are one rule, read together.

Imports: numpy and simwar's trace module (pandas only in :func:`explain`'s
step table, through :mod:`.metrics`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from simwar.analysis.cause_tally import CauseTally, causes
from simwar.analysis.chain_records import (
    KINDS,
    Chain,
    ChainKind,
    Gate,
    GateLanes,
    Segment,
    SegmentKind,
)
from simwar.analysis.chain_words import sentence
from simwar.analysis.host_ranges import HostRanges
from simwar.analysis.views import forward_kernels
from simwar.core.trace import HOST, Call, OpKind, Trace, TraceWindow

__all__ = ["KINDS", "NEEDS_STEPS", "CauseTally", "Chain", "ChainKind", "CriticalPath", "Gate",
           "GateLanes", "NoForward", "Segment", "SegmentKind", "Truncated", "Walker", "causes",
           "critical_path", "forward_extents", "measured_steps", "sentence"]


class _At(Enum):
    """Where the walk stands at its time ``t``; the item is an op or a host span."""

    OP_START = "op"  # bind op ``item``'s start
    OP_END = "end"  # op ``item`` ended
    SPAN_END = "span"  # host span ``item`` ended
    SPAN_START = "host"  # host span ``item`` began: bound by the previous host span's end


_CALL_NAMES = {Call.CPU: "cpu", Call.LAUNCH: "launch", Call.GRAPH_LAUNCH: "graph_launch",
               Call.RECORD: "record", Call.WAIT_EVENT: "wait_event",
               Call.WAIT_STREAM: "wait_stream", Call.SYNCHRONIZE: "synchronize",
               Call.OTHER: "other", Call.NONE: ""}
_MAX_LINKS = 1_000_000  # a walk never needs more; guards a malformed measured trace


@dataclass
class CriticalPath:
    """Gap and step chains of the steps asked for, and their causes aggregated.

    ``gaps`` and ``periods`` hold every chain when it was computed on a whole Trace
    (:func:`critical_path`); from a run streamed in windows (:func:`critical_path_stream`)
    only the first step's, with ``trace`` the window they were walked in. The figures and
    causes come from the tallies of every chain either way.
    """

    trace: Trace
    steps: tuple[int, int]
    gaps: list[Chain] = field(default_factory=list)
    periods: list[Chain] = field(default_factory=list)
    #: each gate's name -> the lane that waited or blocked and the lane it waited for
    gates: dict[str, GateLanes] = field(default_factory=dict)
    gap_tally: CauseTally = field(default_factory=lambda: CauseTally())
    step_tally: CauseTally = field(default_factory=lambda: CauseTally())
    #: per graph bucket of a run whose batch changes, the same of its steps' chains
    buckets: dict[int, CriticalPath] = field(default_factory=dict)
    #: False for one bucket's own CriticalPath (it is not split again)
    split: bool = True
    #: a trace of one step: its chain runs from the step's start to its forward's end (there
    #: is no next forward to run to, and no gap before it); :data:`NEEDS_STEPS` says what
    #: cannot be had from it
    one_step: bool = False
    #: a trace of one step: its launches and copies (:func:`_launch_facts`)
    launches: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._bucket_of = self.trace.run.graph_bucket if self.split else None  # per step

    def add(self, chain: Chain, keep: bool = True) -> None:
        """Count a chain (``what``: gap or step) and keep it unless ``keep`` is False; a
        step's gap and period chains count for its own graph bucket too."""
        gap = chain.what == ChainKind.GAP
        (self.gap_tally if gap else self.step_tally).add(chain.us, chain.segments)
        if keep:
            (self.gaps if gap else self.periods).append(chain)
        of = self._bucket_of
        if of is not None and 0 <= chain.step < len(of):
            b = int(of[chain.step])
            sub = self.buckets.get(b)
            if sub is None:
                sub = self.buckets[b] = CriticalPath(self.trace, self.steps, gates=self.gates,
                                                     split=False)
            sub.add(chain, keep)

    @property
    def n_gaps(self) -> int:
        return self.gap_tally.n

    @property
    def n_steps(self) -> int:
        return self.step_tally.n

    @property
    def fwd_gap_us(self) -> float:
        return self.gap_tally.mean_us()

    @property
    def step_us(self) -> float:
        return self.step_tally.mean_us()

    def gap_causes(self) -> list[dict]:
        return self.gap_tally.causes()

    def step_causes(self) -> list[dict]:
        return self.step_tally.causes()

    def by_bucket(self) -> dict[int, CriticalPath]:
        """Per graph bucket of a run whose batch changes (``meta.workload``): the chains of
        the steps that ran it (a step's gap and period chains go with its own bucket), tallied
        as they were added; empty for a run of one size."""
        if len(self.buckets) < 2:
            return {}
        return dict(sorted(self.buckets.items()))

    def to_dict(self) -> dict:
        """``{"steps", "step_us", "fwd_gap_us", "gap_causes", "step_causes", ...}``, and
        ``by_bucket`` (the same per graph bucket) for a run whose batch changes."""
        out = {"steps": list(self.steps), "steps_explained": self.n_steps,
               "step_us": self.step_us, "fwd_gap_us": self.fwd_gap_us,
               "gap_causes": self.gap_causes(), "step_causes": self.step_causes()}
        if self.one_step:
            out["one_step"] = True
            out["needs_more_steps"] = list(NEEDS_STEPS)
            out["launches"] = dict(self.launches)
        per = self.by_bucket()
        if per:
            out["by_bucket"] = {b: {"steps_explained": cp.n_steps, "step_us": cp.step_us,
                                    "fwd_gap_us": cp.fwd_gap_us, "gap_causes": cp.gap_causes(),
                                    "step_causes": cp.step_causes(), "sentence": sentence(cp)}
                                for b, cp in per.items()}
        return out


# --------------------------------------------------------------------------- the walk
class Walker:
    """The binding constraint of every op and host span of one trace, and the walk back.

    Built once per trace (per-lane predecessors and the host program order are numpy
    indexes); :meth:`chain` walks back from an op to a stop time.
    """

    def __init__(self, trace: Trace, host_ranges=None, device_info: dict | None = None,
                 ranks: dict | None = None):
        self.trace = trace
        # a tensor-parallel rank's collectives: op id -> LateArrival (simwar.analysis.ranks)
        self.ranks = ranks or {}
        self.ranges = HostRanges(host_ranges) if host_ranges else None
        self.device_info = device_info or {}
        ops, spans = trace.ops, trace.spans
        n_ops = len(ops)
        ids = np.arange(n_ops)
        # stream predecessor: the previous op on the same lane in issue order
        order = np.lexsort((ids, ops.lane))
        pred = np.full(n_ops, -1, dtype=np.int64)
        same = ops.lane[order][1:] == ops.lane[order][:-1]
        pred[order[1:][same]] = order[:-1][same]
        self.pred = pred.tolist()
        # host program order: host spans by start, ties by id
        host = np.flatnonzero(spans.lane == trace.code(HOST))
        host = host[np.lexsort((host, spans.start_us[host]))]
        hpred = np.full(len(spans), -1, dtype=np.int64)
        hpred[host[1:]] = host[:-1]
        self.hpred = hpred.tolist()
        self.kind = ops.kind.tolist()
        self.lane = ops.lane.tolist()
        self.start = ops.start_us.tolist()
        self.end = ops.end_us.tolist()
        self.call = ops.call.tolist()
        self.bound = ops.bound.tolist()
        self.span_start = spans.start_us.tolist()
        self.span_end = spans.end_us.tolist()
        self.span_call = spans.call.tolist()
        self.span_op = spans.op.tolist()
        self.texts = list(trace.strings) + [""]  # by code; -1 is the empty text
        self.op_label = ops.label.tolist()
        if isinstance(trace, TraceWindow) and not trace.first:
            # a window after the run's start: what came before it is not there, and a walk
            # that needs it must not take its absence for a fact
            cut = pred.copy()
            cut[pred == -1] = _CUT
            self.pred = cut.tolist()
            if len(host):
                self.hpred[int(host[0])] = _CUT
        self._names: dict[int, str] = {}
        self.gates: dict[str, GateLanes] = {}
        # per host span, the device ops it issued (a graph launch's fan-out: _launch_facts)
        issued = ops.call[ops.call >= 0]
        self.fan_out = np.bincount(issued, minlength=len(spans)).tolist() if len(issued) else []
        run = trace.run
        self.forward = run.forward_stream
        self.barrier = run.barrier_effective or ""
        self.schedule = "schedule"

    # ---- words
    def _text(self, code: int) -> str:
        return self.texts[code]

    def lane_name(self, op: int) -> str:
        return self._text(self.lane[op])

    def label(self, op: int) -> str:
        return self._text(self.trace.ops.label[op])

    def wait_name(self, op: int) -> str:
        """A wait in words: ``schedule.wait_stream(forward) = the coarse barrier``, ...

        From data only: the wait's lane, its host call's kind, the lane of the record it
        bound to, and the run's effective barrier (``meta.barrier_effective``) for the role.
        """
        name = self._names.get(op)
        if name is not None:
            return name
        lane = self.lane_name(op)
        rec = self.bound[op]
        if rec == _CUT:
            raise Truncated(op)
        other = self.lane_name(rec) if rec >= 0 else "?"
        c = self.call[op]
        call = self.span_call[c] if c >= 0 else Call.NONE
        role = ""
        if call == Call.WAIT_STREAM:
            name = f"{lane}.wait_stream({other})"
            if (lane == self.schedule and other == self.forward
                    and self.barrier in ("coarse", "fine")):
                role = " = the coarse barrier"
        elif call == Call.WAIT_EVENT:
            fine = lane == self.schedule and other == self.forward and self.barrier == "fine"
            name = f"{lane}.wait_event({self.event_name(rec, 'read_done' if fine else 'event')})"
            role = " = the fine barrier" if fine else ""
        else:
            name = f"{lane} waits on {other}"
        name += role
        self._names[op] = name
        self.gates[name] = GateLanes(lane, other)
        return name

    def event_name(self, rec: int, what: str = "event") -> str:
        """A record by where it sits: ``read_done@verify``, the phase of the work before it
        (an in-graph node: its graph launch's phase; else the kernel issued before it on its
        stream: its phase, or its label when it has none)."""
        if rec < 0:
            return "?"
        spans = self.trace.spans
        c = self.call[rec]
        if c >= 0 and self.span_call[c] == Call.GRAPH_LAUNCH:
            return f"{what}@{self._text(spans.phase[c]) or self._text(spans.label[c])}"
        p = self.pred[rec]
        while p >= 0 and self.kind[p] != OpKind.KERNEL:
            p = self.pred[p]
        if p == _CUT:
            raise Truncated(rec)
        if p < 0:
            return f"{what}@{self.lane_name(rec)}"
        return f"{what}@{self._text(self.trace.ops.phase[p]) or self.label(p)}"

    def sync_name(self, span: int) -> str:
        """``synchronize(<site>)``; a sync without a site is named by its record."""
        site = self._text(self.trace.spans.site[span])
        if not site:
            op = self.span_op[span]
            site = self.event_name(self.bound[op] if op >= 0 else -1)
        name = f"synchronize({site})"
        if self.barrier == "host_sync" and site in ("barrier", "verify_done"):
            name += " = the host_sync barrier"
        op = self.span_op[span]
        rec = self.bound[op] if op >= 0 else -1
        self.gates[name] = GateLanes(HOST, self.lane_name(rec) if rec >= 0 else "?")
        return name

    def host_cause(self, span: int) -> tuple[SegmentKind, str, str]:
        """(kind, cause, what) of a host span's own time."""
        call = self.span_call[span]
        if call == Call.CPU:
            label = self._text(self.trace.spans.label[span])
            return SegmentKind.HOST, f"cpu: {label}", label
        if call == Call.SYNCHRONIZE:
            op = self.span_op[span]
            if op < 0 or self.bound[op] < 0:  # it may have blocked: on what, the trace lacks
                label = self._text(self.trace.spans.label[span])
                frame = self.caller(span)
                return (SegmentKind.HOST_API, f"host blocked in {label}"
                        + (f" from {frame}" if frame else "")
                        + " (its record is not bound in this trace)", label)
        what = _CALL_NAMES.get(call, "other") or "call"
        return SegmentKind.HOST_API, f"host API: {what}", what

    def caller(self, span: int) -> str:
        """The innermost host range around a host call's start (the Python frame that made
        it, in a ``with_stack`` capture), '' where none is known."""
        if self.ranges is None:
            return ""
        a = self.span_start[span]
        pieces = self.ranges.split(a, a + 1e-3)
        return (pieces[0][2] or "") if pieces else ""

    def blocking_op(self, span: int) -> int:
        """The op a launch call blocked on (-1: none): its own first op, when that ran and
        ended inside the call, queued behind work on its stream that ended after the call
        began (the host waited for the device)."""
        if self.span_call[span] != Call.LAUNCH:
            return -1
        o = self.span_op[span]
        if o < 0 or self.kind[o] != OpKind.KERNEL:
            return -1
        a, b = self.span_start[span], self.span_end[span]
        p = self.pred[o]
        if not (a <= self.start[o] and self.end[o] <= b + 1e-6) or p < 0 or self.end[p] <= a:
            return -1
        return o

    def block_name(self, span: int, op: int) -> str:
        """``cudaMemcpyAsync (4096 B, DtoH (Device -> Pinned) copy) until forward: sample.body
        ended``: a blocking call, what it moved and the op it waited for."""
        label = self._text(self.trace.spans.label[span])
        info = self.device_info.get(op)
        what = []
        if info is not None and getattr(info, "bytes", -1) >= 0:
            what.append(f"{info.bytes} B")
        if info is not None and getattr(info, "copy", ""):
            what.append(f"{info.copy} copy")
        p = self.pred[op]
        while p >= 0 and self.kind[p] != OpKind.KERNEL:
            p = self.pred[p]
        waited = (f"{self.lane_name(op)}: {_clip(self.label(p))}" if p >= 0
                  else self.lane_name(op))
        size = f" ({', '.join(what)})" if what else ""
        frame = self.caller(span)
        name = f"{label}{size}" + (f" from {frame}" if frame else "") + f" until {waited} ended"
        self.gates[name] = GateLanes(HOST, self.lane_name(op))
        return name

    # ---- the walk
    def chain(self, target: int, stop: float, what: ChainKind = ChainKind.GAP, step: int = -1,
              root_horizon_us: float = 0.0, from_end: bool = False) -> Chain:
        """The chain that bound op ``target``'s start (``from_end``: its end), back to ``stop``.

        With ``root_horizon_us`` > 0 the walk goes on past ``stop`` (emitting nothing) until
        it meets a gate, at most that far back, so the earliest segments name the gate the
        chain entered the interval through (e.g. the host sync that held the CPU before
        it issued the work that filled a gap).
        """
        end, segs = self.walk(target, stop, root_horizon_us, from_end)
        return Chain(what, step, stop, end, target, tuple(segs))

    def walk(self, target: int, stop: float, root_horizon_us: float = 0.0,
             from_end: bool = False) -> tuple[float, list[Segment]]:
        """:meth:`chain`'s walk: ``(end, segments)``, in time order. Raises
        :class:`Truncated` where a window of a trace lacks what came before it."""
        segs: list[Segment] = []
        gates: list[Gate] = []  # in walk order
        t = self.end[target] if from_end else self.start[target]
        end = t
        limit = stop - max(root_horizon_us, 0.0)
        pred, call, kind, bound = self.pred, self.call, self.kind, self.bound
        start, fin = self.start, self.end
        span_start, span_end = self.span_start, self.span_end
        texts, lanes, labels = self.texts, self.lane, self.op_label
        add = segs.append

        def emit(a: float, b: float, k: SegmentKind, cause: str, lane: str, op=-1, span=-1,
                 what="") -> None:
            lo = a if a > stop else stop  # clipped at stop: nothing is emitted past it
            if b > lo:  # its gate (``after``) is known once the walk is done
                add(_new(Segment, (lo, b, k, cause, lane, op, span, "", what or cause)))

        state, item = (_At.OP_END if from_end else _At.OP_START), target
        blocked_in: tuple = ()  # the last call that blocked on the device: (name, start, end)
        for _ in range(_MAX_LINKS):
            if t <= stop and (t <= limit or (gates and gates[-1].opened_us <= stop)):
                break
            if state is _At.OP_START:
                p, c = pred[item], call[item]
                if p == _CUT:
                    raise Truncated(item)
                if p < 0 and c < 0:
                    emit(stop, t, SegmentKind.UNEXPLAINED, "before the first traced operation",
                         texts[lanes[item]], item)
                    break
                pe = fin[p] if p >= 0 else -np.inf
                ie = span_end[c] if c >= 0 else -np.inf
                # a launch that began inside its own call (a call that blocked until it ended)
                # is bound by the work before it on its stream, or else by the call's start
                inside = c >= 0 and span_start[c] <= t < ie
                lim = span_start[c] if inside else ie
                lane = texts[lanes[item]]
                if pe >= lim:  # on a tie the stream predecessor binds
                    b, nxt = pe, (_At.OP_END, p)
                    slack = (SegmentKind.UNEXPLAINED, f"{lane} stream idle after its predecessor")
                else:
                    b, nxt = lim, (_At.SPAN_START if inside else _At.SPAN_END, c)
                    slack = (SegmentKind.LAUNCH_LATENCY, f"launch latency ({lane})" if p >= 0
                             else f"launch latency ({lane}'s first op in the trace: work issued "
                                  f"before the trace began may have held it)")
                    if not inside and p >= 0 and kind[p] == OpKind.WAIT and bound[p] < 0:
                        if bound[p] == _CUT:  # bound before the window: not known here
                            raise Truncated(p)
                        # after a wait the trace does not bind: what held it is not known
                        slack = (SegmentKind.UNEXPLAINED,
                                 f"{lane} held by a wait on an unknown record")
                if b < t:
                    if (slack[0] == SegmentKind.LAUNCH_LATENCY and blocked_in
                            and b < blocked_in[2] and t > blocked_in[1]):
                        # the work a blocking call waited for started late: the host's wait
                        slack = (slack[0], f"host blocked in {blocked_in[0]}: {slack[1]} of "
                                 f"the work it waited for")
                    emit(b, t, slack[0], slack[1], lane, item)
                    t = b
                state, item = nxt
            elif state is _At.OP_END:
                k = kind[item]
                r = bound[item]
                if r == _CUT:
                    raise Truncated(item)
                if k == OpKind.KERNEL:
                    s0 = min(start[item], t)
                    lane, label = texts[lanes[item]], texts[labels[item]]
                    joined = self.ranks.get(item)
                    if joined is not None:  # a collective: first waiting for the late rank
                        late, name = joined.rank, joined.collective
                        w = min(s0 + joined.wait_us, t)
                        emit(w, t, SegmentKind.DEVICE, f"{lane} stream: {label}", lane, item,
                             -1, label)
                        emit(s0, w, SegmentKind.RANK, f"rank {late}'s {lane} stream arrived "
                             f"late at {name}", lane, item, -1, name)
                    else:
                        emit(s0, t, SegmentKind.DEVICE, f"{lane} stream: {label}", lane, item,
                             -1, label)
                    t, state = s0, _At.OP_START
                elif k == OpKind.WAIT and r >= 0 and fin[item] > start[item]:
                    f = min(fin[r], t)  # held: released by its record's firing
                    name = self.wait_name(item)
                    gates.append(Gate(f, name))
                    if t > f:
                        if lanes[r] != lanes[item]:
                            emit(f, t, SegmentKind.CROSS_STREAM, f"cross-stream latency: {name}",
                                 texts[lanes[item]], item, -1, name)
                        else:
                            emit(f, t, SegmentKind.UNEXPLAINED, f"{name}: released after its "
                                 "record fired", texts[lanes[item]], item, -1, name)
                        t = f
                    item = r
                else:  # a record, a wait that did not hold: bound like any op at its start
                    s0 = min(start[item], t)
                    if s0 < t:  # held by a wait whose record the trace does not have
                        lane = texts[lanes[item]]
                        emit(s0, t, SegmentKind.UNEXPLAINED, f"{lane} held by a wait on an "
                             "unknown record", lane, item)
                    t, state = s0, _At.OP_START
            elif state is _At.SPAN_END:
                s0 = min(span_start[item], t)
                if self.span_call[item] == Call.SYNCHRONIZE:
                    op = self.span_op[item]
                    r = bound[op] if op >= 0 else -1
                    if r == _CUT:
                        raise Truncated(op)
                    f = fin[r] if r >= 0 else -np.inf
                    if r >= 0 and s0 < f <= t:  # really blocked: woken by the record's firing
                        name = self.sync_name(item)
                        gates.append(Gate(f, name))
                        emit(f, t, SegmentKind.WAKE_UP, f"{name}: wake-up", HOST, -1, item, name)
                        t, state, item = f, _At.OP_END, r
                        continue
                joined = self.ranks.get(self.span_op[item])
                if joined is not None and self.span_call[item] == Call.SYNCHRONIZE:
                    # a host collective: waiting for the late rank, then its own cost
                    late, name = joined.rank, joined.collective
                    w = min(s0 + joined.wait_us, t)
                    emit(w, t, SegmentKind.HOST_API, f"host collective: {name}", HOST, -1, item,
                         name)
                    emit(s0, w, SegmentKind.RANK, f"rank {late}'s host work arrived late at the "
                         f"{name}", HOST, -1, item, name)
                    t, state = s0, _At.SPAN_START
                    continue
                blocked = self.blocking_op(item)
                if blocked >= 0 and fin[blocked] <= t:  # a call that waited for the device
                    name = self.block_name(item, blocked)
                    blocked_in = (name.split(" until ")[0], span_start[item], span_end[item])
                    f = fin[blocked]
                    gates.append(Gate(f, name))
                    emit(f, t, SegmentKind.WAKE_UP, f"host blocked in {name}: return", HOST, -1,
                         item, name)
                    t, state, item = f, _At.OP_END, blocked
                    continue
                k_, cause, name = self.host_cause(item)
                emit(s0, t, k_, cause, HOST, -1, item, name)
                t, state = s0, _At.SPAN_START
            else:  # _At.SPAN_START: bound by the previous host span's end
                q = self.hpred[item]
                if q == _CUT:
                    raise Truncated(item)
                if q < 0:
                    emit(stop, t, SegmentKind.UNEXPLAINED, "before the first traced host call",
                         HOST)
                    break
                e = min(span_end[q], t)
                if e < t:
                    self._host_gap(emit, e, t)
                    t = e
                state, item = _At.SPAN_END, q
        segs.reverse()
        return end, _with_gates(segs, gates)

    def _host_gap(self, emit, a: float, b: float) -> None:
        """Host time between two traced calls: the innermost range's work where the code
        named it, untraced time elsewhere (emitted latest first, as the walk goes)."""
        pieces = self.ranges.split(a, b) if self.ranges is not None else [(a, b, None)]
        for x, y, name in reversed(pieces):
            if name is None:
                emit(x, y, SegmentKind.UNEXPLAINED, "host: untraced time", HOST)
            else:
                emit(x, y, SegmentKind.HOST, f"cpu: {name}", HOST, -1, -1, name)


def _with_gates(segs: list[Segment], gates: list[Gate]) -> list[Segment]:
    """The segments with their ``after``: the latest gate that opened at or before each
    one's start."""
    if not gates:
        return segs
    opened = sorted(gates, key=lambda g: g.opened_us)
    i, current = 0, ""
    out = []
    for s in segs:
        while i < len(opened) and opened[i].opened_us <= s.start_us:
            current = opened[i].name
            i += 1
        out.append(s if s.after == current else s._replace(after=current))
    return out


def _clip(text: str, width: int = 60) -> str:
    """A long kernel name shortened for a cause's words (its start says what it is)."""
    return text if len(text) <= width else text[:width - 1] + "…"


_new = tuple.__new__  # a named tuple from its fields, without its keyword-checking __new__
_CUT = -2  # a predecessor or record before a window's start (see Walker)


class Truncated(Exception):
    """A walk on a window of a trace reached back past the window's start (a signal to walk
    again with more context, not an error: not a RuntimeError, which a bug raises)."""


# --------------------------------------------------------------------------- per step
class NoForward(ValueError):
    """The trace has no forward work (no phased kernels on the forward stream)."""


def forward_extents(trace: Trace):
    """Per step with forward work: (steps, first kernel op id, start, end), numpy arrays."""
    kern = forward_kernels(trace)
    if len(kern) == 0:
        raise NoForward("no forward work: the trace has no phased kernels on the forward "
                        f"stream '{trace.run.forward_stream}'")
    ops = trace.ops
    order = np.lexsort((kern, ops.start_us[kern], ops.step[kern]))
    kern = kern[order]
    steps, first = np.unique(ops.step[kern], return_index=True)
    start = ops.start_us[kern[first]]
    end = np.full(len(steps), -np.inf)
    np.maximum.at(end, np.searchsorted(steps, ops.step[kern]), ops.end_us[kern])
    return steps, kern[first], start, end


def measured_steps(trace: Trace) -> tuple[int, int]:
    """The steps a summary counts: after warm-up, with a successor (inclusive range)."""
    steps, _, _, _ = forward_extents(trace)
    warm = trace.run.warmup_steps
    usable = steps[:-1][steps[:-1] >= warm]
    if len(usable) == 0:
        raise NoForward(f"no measured steps: need two steps with forward work after warm-up "
                        f"({warm}); the trace has forward work in {len(steps)} step(s)")
    return int(usable[0]), int(usable[-1])


#: what a trace of one step cannot give (:func:`_one_step`), in the words ``explain`` prints
NEEDS_STEPS = ("the forward gap (between two forwards)", "the step period (forward to forward)",
               "the figures per graph bucket", "a fit (simwar import --fit)")


def _one_step(trace: Trace, k: int, walker: Walker) -> CriticalPath:
    """The critical path of a trace's only step with forward work: back from its forward's
    last kernel's end to the step's first host call (or its first op), a ``step`` chain.

    Profilers and trace splitters often hand out one step; what bound it (a copy that
    blocked the host, the graph launch and its fan-out, launch overhead) is in that step
    alone. What needs a second step is not made up (:data:`NEEDS_STEPS`)."""
    ops, spans = trace.ops, trace.spans
    kern = forward_kernels(trace)
    kern = kern[ops.step[kern] == k]
    last = int(kern[np.argmax(ops.end_us[kern])])
    mine = spans.step == k
    host_start = float(spans.start_us[mine].min()) if mine.any() else np.inf
    op_start = float(ops.start_us[ops.step == k].min())
    stop = min(host_start, op_start)
    out = CriticalPath(trace, (k, k), gates=walker.gates, split=False, one_step=True,
                       launches=_launch_facts(trace, k, walker))
    out.add(walker.chain(last, stop, ChainKind.STEP, k, from_end=True))
    return out


def _launch_facts(trace: Trace, k: int, walker: Walker) -> dict:
    """Step ``k``'s launches and copies, counted from the Trace's calls and ops: graph
    launches with the device ops each fanned out to and the host time in them, eager
    launches and theirs, copies and their bytes."""
    spans, ops = trace.spans, trace.ops
    mine = np.flatnonzero(spans.step == k)
    calls = spans.call[mine]
    took = spans.end_us[mine] - spans.start_us[mine]
    graph, eager = calls == Call.GRAPH_LAUNCH, calls == Call.LAUNCH
    fan = walker.fan_out
    copies = [walker.device_info[o] for o in np.flatnonzero(ops.step == k).tolist()
              if getattr(walker.device_info.get(o), "copy", "")]
    return {"graph_launches": int(graph.sum()),
            "graph_ops": [int(fan[i]) if i < len(fan) else 0 for i in mine[graph].tolist()],
            "graph_launch_us": float(took[graph].sum()),
            "launches": int(eager.sum()), "launch_us": float(took[eager].sum()),
            "copies": len(copies),
            "copy_bytes": int(sum(max(getattr(c, "bytes", 0), 0) for c in copies))}


def critical_path(trace: Trace, steps: tuple[int, int] | None = None, host_ranges=None,
                  device_info: dict | None = None, ranks: dict | None = None,
                  one_step: bool = True, progress=None) -> CriticalPath:
    """Gap and step chains of steps ``a..b`` (inclusive; default: the measured steps).

    Step k's gap chain runs from forward k-1's end to forward k's start (none for the
    first forward); its step chain from forward k's start to forward k+1's start (none
    for the last). Raises :class:`NoForward` without forward work, ValueError for a range
    outside the steps with forward work. A trace with forward work in one step only gives that
    step's chain, from its start to its forward's end (:func:`_one_step`), unless
    ``one_step`` is False (a capture whose steps were not found, read whole as one step: its
    one "step" is no step of the loop).
    ``host_ranges`` and ``device_info``: a measured
    trace's host ranges and device facts (see the module docstring). ``ranks``: a
    tensor-parallel rank's collectives, op id -> :class:`~simwar.analysis.ranks.LateArrival`
    (:meth:`simwar.analysis.ranks.Collectives.late_of`): the time a collective held this
    rank for the late one is that rank's ("rank 1's host work arrived late at the broadcast").
    ``progress(done, total)``: called after each step walked (the CLI's bar on a terminal).
    """
    all_steps, first, start, end = forward_extents(trace)
    if one_step and len(all_steps) == 1 and (steps is None
                                             or steps == (int(all_steps[0]),) * 2):
        return _one_step(trace, int(all_steps[0]), Walker(trace, host_ranges, device_info,
                                                          ranks))
    if steps is None:
        steps = measured_steps(trace)
    a, b = steps
    lo_ok, hi_ok = int(all_steps[0]), int(all_steps[-1])
    if a > b or a < lo_ok or b > hi_ok:
        raise ValueError(f"steps {a}:{b} are outside the run: steps with forward work are "
                         f"{lo_ok}..{hi_ok}")
    walker = Walker(trace, host_ranges, device_info, ranks)
    out = CriticalPath(trace, (int(a), int(b)), gates=walker.gates)
    index = {int(s): i for i, s in enumerate(all_steps.tolist())}
    for k in range(a, b + 1):
        i = index.get(k)
        if i is None:
            continue
        if i > 0:
            period = float(start[i] - start[i - 1])
            out.add(walker.chain(int(first[i]), float(end[i - 1]), ChainKind.GAP, k, period))
        if i + 1 < len(all_steps):
            out.add(walker.chain(int(first[i + 1]), float(start[i]), ChainKind.STEP, k))
        if progress is not None:
            progress(k - a + 1, b - a + 1)
    if not out.n_gaps and not out.n_steps:
        raise ValueError(f"steps {a}:{b}: nothing to explain (the first forward has no gap "
                         "before it and the last no step after it)")
    return out
