"""Latent races of a trace whose accesses come from outside it: a capture's, by its mapping.

:func:`simwar.analysis.hazards.detect` finds the races of a program simwar built, whose
Trace carries its accesses and whose one host thread issued everything. A capture's Trace
holds no accesses (a profile cannot show which buffers a kernel touches: the mapping names
them, :mod:`simwar.capture.accesses`), and its happens-before has more to it, which
:class:`HbFacts` says by op id:

- **host threads**: each op joins the clock of the thread that issued it (the lane of its
  call, ``spans.lane[ops.call]``: ``cpu``, ``thread<tid>``); a thread's syncs advance its
  own clock only. An op whose call is not in the capture joins no host clock;
- **blocking device ops** (``blocking``): the call that issued the op returned only when
  the op ended (a D2H copy into pageable memory, which CUDA performs synchronously): the
  thread then joins the op's clock, as after a synchronize bound to it;
- **device-wide syncs** (``device_syncs``: ``cudaDeviceSynchronize``): the thread joins
  the tail of every stream that has work by then;
- **in-graph record nodes** (``node_after``): a record op issued by a graph launch sits,
  in the Trace, first in its launch's stream order; where in the graph it really sits the
  capture does not say, so the caller names the op of the same launch it follows.

:func:`hb_sequence` writes these facts into the op sequence that
:func:`~simwar.analysis.hazards.candidate_pairs` walks (the one implementation of the
vector clocks: a blocking op is followed by a sync bound to it, a device sync becomes a
tail record on every stream and a sync on each, a node moves after the op it follows), and
:func:`latent_races` lists the races as :func:`~simwar.analysis.hazards.detect` does, in
its order, each with what its later access *is* ordered after on the earlier access's
lane (:attr:`RaceReport.known`), which :func:`missing_edge` puts in words. With no facts and
a simulated trace's own accesses it gives :func:`~simwar.analysis.hazards.detect`'s list.

Imports: numpy and simwar.analysis.hazards, simwar.core.trace.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from simwar.analysis.hazards import (
    HazardReport,
    Race,
    _first_seen,
    candidate_pairs,
    race_kind,
    race_order,
)
from simwar.core.trace import HOST, Call, OpKind, Trace


@dataclass
class HbFacts:
    """What a capture adds to the happens-before of its Trace (see the module docstring)."""

    blocking: tuple[int, ...] = ()
    device_syncs: tuple[int, ...] = ()
    #: in-graph record op -> the op of its graph launch that it follows
    node_after: dict[int, int] = field(default_factory=dict)


class Accesses(NamedTuple):
    """Shared-buffer accesses of a trace's device ops, one per item: the op, the buffer,
    :class:`~simwar.core.trace.Mode` and the rule that named it (words, for reports)."""

    op: list[int]
    buffer: list[str]
    mode: list[int]
    rule: list[str]

    @classmethod
    def of_trace(cls, trace: Trace) -> Accesses:
        """A trace's own accesses (a simulated program's)."""
        acc = trace.accesses
        return cls(acc.op.tolist(), acc.decoded("buffer").tolist(), acc.mode.tolist(),
                   [""] * len(acc))


@dataclass
class HbSequence:
    """The op sequence :func:`candidate_pairs` walks: per item its lane and host thread
    (codes), kind, the item it is bound to (-1 none) and the trace op it stands for (-1: an
    item the facts added); ``pos``: per trace op, its item; ``source``: per added item, the
    trace op it was added for (the blocking op, the device sync)."""

    lane: list[int]
    host: list[int]
    kind: list[int]
    bound: list[int]
    op: list[int]
    pos: np.ndarray
    source: dict[int, int]


def host_lanes(trace: Trace) -> np.ndarray:
    """Per op, the lane code of the host thread whose call issued it (-1: no call)."""
    calls = trace.ops.call
    out = np.full(len(calls), -1, dtype=np.int64)
    has = calls >= 0
    out[has] = trace.spans.lane[calls[has]]
    return out


def hb_sequence(trace: Trace, facts: HbFacts) -> HbSequence:
    """The trace's ops in issue order with ``facts`` written in (see the module docstring)."""
    ops = trace.ops
    n = len(ops)
    lane_of, kind_of, bound_of = ops.lane.tolist(), ops.kind.tolist(), ops.bound.tolist()
    host_of = host_lanes(trace).tolist()
    host_lane = trace.code(HOST)
    follow: dict[int, list[int]] = defaultdict(list)
    for rec, after in sorted(facts.node_after.items(), key=lambda x: (x[1], x[0])):
        follow[after].append(rec)
    moved = set(facts.node_after)
    blocking = set(facts.blocking)
    device = set(facts.device_syncs)
    seq = HbSequence([], [], [], [], [], np.full(n, -1, dtype=np.int64), {})
    streams: dict[int, None] = {}  # lanes with stream work so far, in order

    def emit(lane: int, host: int, kind: int, bound: int, op: int, source: int = -1) -> int:
        p = len(seq.kind)
        seq.lane.append(lane)
        seq.host.append(host)
        seq.kind.append(kind)
        seq.bound.append(bound)
        seq.op.append(op)
        if op >= 0:
            seq.pos[op] = p
        else:
            seq.source[p] = source
        if kind != OpKind.SYNC:
            streams.setdefault(lane, None)
        return p

    def emit_op(o: int) -> None:
        b = bound_of[o]
        emit(lane_of[o], host_of[o], kind_of[o], int(seq.pos[b]) if b >= 0 else -1, o)

    for o in range(n):
        if o in moved:
            continue
        if o in device:  # the tail of every stream, then a sync on each
            tails = [emit(lane, host_of[o], OpKind.RECORD, -1, -1, o) for lane in list(streams)]
            for t in tails:
                emit(lane_of[o], host_of[o], OpKind.SYNC, t, -1, o)
        emit_op(o)
        for rec in follow.get(o, ()):
            emit_op(rec)
        if o in blocking:  # the call returned when the op ended
            emit(host_lane if host_lane >= 0 else lane_of[o], host_of[o], OpKind.SYNC,
                 int(seq.pos[o]), -1, o)
    return seq


class RaceReport(HazardReport):
    """The races of :func:`latent_races` (a :class:`HazardReport`: ``latent``, ``observed``)
    and, per race, ``known``: the trace op of the earlier access's lane that is the latest its
    later access is ordered after (-1: none of that lane's work), and ``known_added``: whether
    that is an item the facts added (the tail of the lane at the device sync ``known``)."""

    _fields = ("races", "known", "known_added", "rules")

    def __init__(self, races: list[Race] | None = None, known: list[int] | None = None,
                 known_added: list[bool] | None = None,
                 rules: list[tuple[str, str]] | None = None):
        super().__init__(races)
        self.known = [] if known is None else known
        self.known_added = [] if known_added is None else known_added
        #: per race, the rules (:attr:`Accesses.rule`) of its earlier and later access
        self.rules = [] if rules is None else rules

    def hazards(self) -> HazardReport:
        return HazardReport(list(self.races))


def latent_races(trace: Trace, accesses: Accesses, facts: HbFacts | None = None,
                 window: int = 2) -> RaceReport:
    """The latent races and observed overlaps among ``accesses`` at most ``window`` steps
    apart, by :func:`~simwar.analysis.hazards.candidate_pairs` over :func:`hb_sequence`, in
    :func:`~simwar.analysis.hazards.race_order` (see the module docstring)."""
    facts = facts or HbFacts()
    seq = hb_sequence(trace, facts)
    ops, strings = trace.ops, trace.strings
    pos = seq.pos[np.asarray(accesses.op, dtype=np.int64)] if accesses.op else \
        np.zeros(0, dtype=np.int64)
    order = np.argsort(pos, kind="stable")
    codes: dict[str, int] = {}
    buf = np.array([codes.setdefault(b, len(codes)) for b in accesses.buffer],
                   dtype=np.int64)[order] if accesses.op else np.zeros(0, dtype=np.int64)
    names = list(codes)
    a_op = np.asarray(accesses.op, dtype=np.int64)[order]
    a_mode = np.asarray(accesses.mode, dtype=np.int64)[order]
    a_step = ops.step[a_op] if len(a_op) else np.zeros(0, dtype=np.int64)
    a_phase = ops.phase[a_op] if len(a_op) else np.zeros(0, dtype=np.int64)
    lane_items: dict[int, list[int]] = defaultdict(list)
    for p, (lane, kind) in enumerate(zip(seq.lane, seq.kind)):
        if kind != OpKind.SYNC:
            lane_items[lane].append(p)
    rank = _first_seen(buf)
    start_of, end_of, lane_of, label_of = ops.start_us, ops.end_us, ops.lane, ops.label
    found = []
    for i, j, latent, known in candidate_pairs(seq.lane, seq.kind, seq.bound, pos[order], buf,
                                               a_mode, a_step, window, host_of=seq.host,
                                               clocks=True):
        first, second = int(a_op[i]), int(a_op[j])
        overlap = float(end_of[first] - start_of[second])
        if not latent and overlap <= 0:
            continue
        item = lane_items[int(lane_of[first])][known - 1] if known > 0 else -1
        k_op = -1 if item < 0 else seq.op[item]
        added = item >= 0 and k_op < 0
        if added:
            k_op = seq.source[item]
        race = Race(names[int(buf[j])], race_kind(a_mode[i], a_mode[j]), int(a_step[i]),
                    _text(strings, a_phase[i]), strings[lane_of[first]],
                    strings[label_of[first]], first, int(a_step[j]), _text(strings, a_phase[j]),
                    strings[lane_of[second]], strings[label_of[second]], second, bool(latent),
                    max(0.0, overlap))
        rules = (accesses.rule[int(order[i])], accesses.rule[int(order[j])])
        found.append((race_order(rank[int(buf[j])], j, i), race, k_op, added, rules))
    found.sort(key=lambda item: item[0])
    return RaceReport([f[1] for f in found], [f[2] for f in found], [f[3] for f in found],
                      [f[4] for f in found])


def _text(strings: list[str], code) -> str:
    return strings[int(code)] if code >= 0 else ""


# --------------------------------------------------------------------------- words
_QUALIFIER = re.compile(r"\(anonymous namespace\)::|\b[A-Za-z_]\w*::")
_LAMBDA = re.compile(r"::\{lambda\([^{}]*\)#\d+\}")


def short_label(label: str, n: int = 80) -> str:
    """A kernel name for a report line: without ``void``, namespaces, lambdas and the
    argument list (``indexSelectSmallIndex<long, long, unsigned int, 2, 2, -2>``), at most
    ``n`` characters; other labels as they are (cut to ``n``)."""
    text = label
    if "::" in text or text.startswith("void "):
        text = _LAMBDA.sub("", _QUALIFIER.sub("", text))
        if text.startswith("void "):
            text = text[5:]
        depth = 0
        for k, ch in enumerate(text):  # the argument list: the first '(' outside <...>
            if ch == "<":
                depth += 1
            elif ch == ">":
                depth -= 1
            elif ch == "(" and depth == 0:
                text = text[:k]
                break
        text = text.strip() or label
    return text if len(text) <= n else text[:n - 1] + "…"


def op_name(trace: Trace, op: int) -> str:
    """The default name of an access's side in words: its phase, else its kernel."""
    return trace.text(int(trace.ops.phase[op])) or short_label(trace.text(int(trace.ops.label[op])),
                                                                 40)


def step_text(step: int, base: int | None = None) -> str:
    """``12``, or relative to ``base`` (``k``, ``k+1``, ``k-1``) when given."""
    if base is None:
        return str(step)
    d = step - base
    return "k" if d == 0 else f"k{d:+d}"


def describe_op(trace: Trace, op: int, base: int | None = None) -> str:
    """An op in a report's words: ``verify: indexSelectSmallIndex<...> of step 12``, ``the
    record of event50437 of step 12, after draft: memcpy32_post``, ``verify's in-graph record
    node of step 12``; steps relative to ``base`` when given (:func:`step_text`), and then
    without event ids (which torch draws afresh for many records)."""
    ops = trace.ops
    step = step_text(int(ops.step[op]), base)
    kind = int(ops.kind[op])
    phase = trace.text(int(ops.phase[op]))
    if kind == OpKind.RECORD:
        call = int(ops.call[op])
        if call >= 0 and trace.spans.call[call] == Call.GRAPH_LAUNCH:
            owner = trace.text(int(trace.spans.phase[call])) or "a graph"
            return f"{owner}'s in-graph record node of step {step}"
        event = trace.text(int(ops.event[op]))
        before = np.flatnonzero((ops.lane[:op] == ops.lane[op])
                                & (ops.kind[:op] == OpKind.KERNEL))
        after = f", after {describe_op(trace, int(before[-1]), base)}" if len(before) else ""
        what = f"the record of {event}" if event and base is None else "an event record"
        return f"{what} of step {step}{after}"
    if kind == OpKind.WAIT:
        return f"its {trace.text(int(ops.label[op]))} of step {step}"
    label = short_label(trace.text(int(ops.label[op])))
    return f"{phase + ': ' if phase else ''}{label} of step {step}"


def missing_edge(trace: Trace, race: Race, known: int, added: bool = False,
                 lane_name=lambda lane: lane, relative: bool = False, name_of=op_name) -> str:
    """Why a latent race is one, in words: ``stream49 (schedule)'s write of step 12 is
    ordered after nothing that follows verify's read of step 11 on stream53 (forward): the
    latest of stream53's work it follows is the record of event50437 of step 11, after draft:
    memcpy32_post`` (``known``, ``added``: :attr:`RaceReport.known`,
    :attr:`RaceReport.known_added`; ``lane_name``: a lane's display name; ``relative``: steps
    as ``k`` (the earlier access's) and ``k+1``; ``name_of(op)``: the name of an access's side,
    ``verify``: :func:`op_name`)."""
    base = race.first_step if relative else None
    first_mode, second_mode = {"WAR": ("read", "write"), "RAW": ("write", "read")}.get(
        race.kind, ("write", "write"))
    who = f"{name_of(race.first_op)}'s {first_mode}"
    a, b = lane_name(race.first_lane), lane_name(race.second_lane)
    head = (f"{b}'s {second_mode} of step {step_text(race.second_step, base)} is ordered after "
            f"nothing that follows {who} of step {step_text(race.first_step, base)} on {a}")
    if known < 0:
        return f"{head}: it follows none of {race.first_lane}'s work"
    if added:
        where = (f"the tail of {race.first_lane} at the device synchronize of step "
                 f"{step_text(int(trace.ops.step[known]), base)}")
    else:
        where = describe_op(trace, known, base)
    return f"{head}: the latest of {race.first_lane}'s work it follows is {where}"


def race_groups(trace: Trace, report: RaceReport, lane_name=lambda lane: lane,
                name_of=op_name) -> list[dict]:
    """The latent races of ``report`` by kind: the same buffer, access kind, lanes, names of
    each side (``name_of(op)``: the phase, else the kernel, :func:`op_name`) and step
    distance; per group, its races (indices into ``report.races``), the steps of their earlier
    accesses, the device ops on each side, and the missing edge in words relative to step k
    with how many races it fits, most first."""
    groups: dict[tuple, dict] = {}
    for i, r in enumerate(report.races):
        if not r.latent:
            continue
        a, b = name_of(r.first_op), name_of(r.second_op)
        key = (r.buffer, r.kind, r.first_lane, a, r.second_lane, b, r.second_step - r.first_step)
        g = groups.get(key)
        if g is None:
            g = groups[key] = {"buffer": r.buffer, "kind": r.kind, "distance": key[-1],
                               "first": {"lane": r.first_lane, "name": a, "ops": {},
                                         "rules": {}},
                               "second": {"lane": r.second_lane, "name": b, "ops": {},
                                          "rules": {}},
                               "races": [], "steps": set(), "observed_steps": set(),
                               "edges": {}}
        g["races"].append(i)
        g["steps"].add(r.first_step)
        if r.observed:
            g["observed_steps"].add(r.first_step)
        rules = report.rules[i] if report.rules else ("", "")
        for side, label, rule in (("first", r.first_label, rules[0]),
                                  ("second", r.second_label, rules[1])):
            ops, by_rule = g[side]["ops"], g[side]["rules"]
            ops[label] = ops.get(label, 0) + 1
            if rule:
                by_rule[rule] = by_rule.get(rule, 0) + 1
        words = missing_edge(trace, r, report.known[i], report.known_added[i], lane_name,
                             relative=True, name_of=name_of)
        g["edges"][words] = g["edges"].get(words, 0) + 1
    out = []
    for g in groups.values():
        g["steps"] = sorted(g["steps"])
        g["observed_steps"] = sorted(g["observed_steps"])
        g["edges"] = sorted(g["edges"].items(), key=lambda x: -x[1])
        out.append(g)
    return out


__all__ = ["Accesses", "HbFacts", "HbSequence", "RaceReport", "describe_op", "hb_sequence",
           "host_lanes", "latent_races", "missing_edge", "op_name", "race_groups", "short_label",
           "step_text"]
