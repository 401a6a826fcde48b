"""Fit a complete, runnable config from an imported capture: the whole overlap loop.

``simwar import CAPTURE --mapping M --fit -o fitted.yaml`` writes what
:func:`fit_model` returns: a config (``algorithm: custom``) that the builder
turns into the capture's own loop, so that ``simwar run fitted.yaml``
reproduces the capture and ``--set`` asks what-if questions of it.

What is read from the capture (:mod:`.layout` finds the pieces):

- **streams**: the forward stream (the importer's), the schedule stream (the
  mapping's ``schedule`` lane, else the stream whose record the forward waits
  on before each step, else the stream with work issued before the forward),
  the copy stream (``copy``, else the stream with work issued after the
  forward's last launch) and a ``plan`` lane when the mapping names one;
- **phases**: the forward's units in order (a phase's launches, one CUDA graph
  each: ``graph: full``; only eager launches: ``eager``), each with its device
  time per step (kernel lengths plus the device-side gaps between queued
  kernels: between a graph's own nodes, before the next unit), split into
  ``load_batch_us`` (eager kernels before the graph), ``prep_us`` (a reading
  phase's first graph node, or first kernel when eager: where its shared reads
  are taken to be, with its load_batch, as a capture cannot show reads; the
  mapping's ``reads`` says which phases read) and ``body_us``;
- **the policy**, from the CUDA sync events (:func:`infer_policy`);
- **the schedule-stream work** before the forward (``gpu.schedule_prep_us``:
  all but the last op, ``gpu.schedule_writes_us``: the last, the write), the
  schedule-stream work after it (``gpu.result_writes_us``) and the result copy;
- **host costs** per call kind (means over the measured steps), the graph
  launch per graph: ``costs.graph_launch_us`` is the cheapest graph's, and a
  costlier graph's difference is host time before its launch
  (``phases.NAME.host_us``), where the device also waits for it;
- **CPU work**: the host time of each region between the loop's anchors
  (:func:`simwar.capture.layout.regions`, synchronize calls left out) less
  what the fitted config's own API calls take there (measured by simulating
  the fitted loop with no CPU work), so that the fitted host loop adds up to
  the captured one, step by step. The mapping's ``cpu`` ranges split the
  regions into ``ingest``/``schedule``/``prepare``/``process_result`` (net of
  the API calls and blocking inside them); what no range explains is the
  region's residual. Regions: loop top → ``cpu.ingest_us`` (the residual;
  ``schedule_us`` and ``prepare_us`` from their ranges), after a loop-top
  barrier sync → ``prepare_us``, schedule launches → forward and between
  units → ``phases.NAME.host_us``, forward → result sync → ``cpu.post_launch_us``,
  result sync → step end → ``cpu.process_result_us``.

Every per-step sample set is fitted as :func:`simwar.fit.durations.fit_values`
does (``--dist``). Errors a user can cause are :class:`FitError`, one line.

Imports: numpy, the standard library and simwar (the simulation of the fitted
loop uses the engine).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from simwar.capture.layout import Roles, StepLayout, queued_gap, regions, step_layouts, work_us
from simwar.capture.mapping import CPU_ITEMS, Mapping, unmatched_keys
from simwar.core.trace import Call, OpKind, Trace
from simwar.fit.durations import fit_values

#: the barrier policies a capture can show (and ``--policy`` may name)
POLICIES = ("fine", "coarse", "none", "host_sync")
#: steps of a fitted config, and its warm-up
FIT_STEPS, FIT_WARMUP = 300, 20
#: a step's regions and the CPU work each becomes (phase regions: ``host_i``)
REGION_ITEM = {"A": "ingest", "A2": "prepare", "tail": "post_launch", "tail2": "post_launch",
               "P": "process_result"}


class FitError(ValueError):
    """The capture cannot be fitted as asked; the message is one line."""


@dataclass
class PolicyInference:
    barrier: str
    placement: str = "after_launch"
    unit: int | None = None  # index of the publishing unit
    position: str | None = None  # pre_replay | in_replay | post_replay
    source: str = "capture"  # capture | command line
    evidence: str = ""


@dataclass
class ModelFit:
    """``config``: the runnable config; ``header``: the comment lines written above it."""

    config: dict
    header: list[str]
    details: dict[str, dict]
    policy: PolicyInference
    roles: Roles
    warnings: list[str] = field(default_factory=list)


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
                 sync_events: int) -> PolicyInference | str:
    """The barrier the capture shows, or a sentence saying why it cannot be inferred.

    Per measured step, the schedule stream's waits (and host syncs other than the result
    sync) bound to a record on the forward stream: a record issued by a graph launch (an
    in-graph node) → ``fine`` published in-replay at that unit; an eager record right
    before the wait (``wait_stream``) → ``coarse``; another eager record → ``fine``
    published at its position (before a unit's graph: pre-replay, after it: post-replay);
    a host synchronize on such a record → ``host_sync``; nothing → ``none``. A wait
    before the step's schedule launches is a loop-top barrier. The most common answer wins.
    """
    ops, spans = trace.ops, trace.spans
    fwd = trace.code(roles["forward"])
    sched = {trace.code(x) for x in (roles.get("schedule"), roles.get("plan")) if x}
    votes: Counter = Counter()
    unbound = 0
    steps = sorted(lays)
    for k in steps:
        lay = lays[k]
        first_sched = spans.start_us[lay.sched_calls[0]] if lay.sched_calls else \
            spans.start_us[lay.first_forward]
        found = []
        waits = [o for c in lay.calls for o in _ops_of_call(trace, c)
                 if ops.kind[o] == OpKind.WAIT and ops.lane[o] in sched]
        for w in waits:
            b = int(ops.bound[w])
            if b < 0:
                unbound += 1
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
                continue
            if ops.lane[b] == fwd:
                found.append(_classify(trace, lays, b, s, "sync",
                                       spans.start_us[s] < first_sched))
        if found:
            votes[found[0]] += 1
        elif sync_events:
            votes[("none", "after_launch", None, None)] += 1
    if unbound and not any(v[0] != "none" for v in votes):
        return (f"its {sync_events} CUDA sync events bind no wait to a record (the record "
                f"correlation ids are -1: this profiler does not report which "
                f"cudaEventRecord a wait binds to)")
    if not sync_events:
        return "it has no CUDA sync events (profile with experimental_config=" \
               "_ExperimentalConfig(enable_cuda_sync_events=True))"
    if not votes:
        return "no measured step to read it from"
    (barrier, placement, unit, position), n = votes.most_common(1)[0]
    total = sum(votes.values())
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


def _is_graph(lays, steps, unit) -> bool:
    return unit is not None and lays[steps[0]].units[unit].graph is not None


def _ops_of_call(trace: Trace, call: int) -> list[int]:
    index = trace.__dict__.get("_simwar_ops_of_call")
    if index is None:
        index = {}
        for o, c in enumerate(trace.ops.call.tolist()):
            if c >= 0:
                index.setdefault(c, []).append(o)
        trace.__dict__["_simwar_ops_of_call"] = index
    return index.get(call, [])


def _classify(trace: Trace, lays, rec: int, waiter: int, kind: str, top: bool) -> tuple:
    """``(barrier, placement, unit, position)`` of one barrier wait/sync on record ``rec``."""
    ops, spans = trace.ops, trace.spans
    placement = "loop_top" if top else "after_launch"
    barrier = "host_sync" if kind == "sync" else "fine"
    call = int(ops.call[rec])
    lay = lays.get(int(ops.step[rec]))
    if call < 0 or lay is None:
        return (barrier, placement, None, None)
    ck = spans.call[call]
    if ck == Call.WAIT_STREAM or (kind == "wait" and call != waiter and _adjacent(lay, call,
                                                                                    waiter)):
        return ("coarse", placement, None, None)
    if ck == Call.GRAPH_LAUNCH:
        for i, u in enumerate(lay.units):
            if u.graph == call:
                return (barrier, placement, i, "in_replay")
        return (barrier, placement, None, None)
    t = spans.start_us[call]
    unit = None
    for i, u in enumerate(lay.units):
        if spans.start_us[u.calls[0]] < t:
            unit = i
    if unit is None:
        return (barrier, placement, None, None)
    u = lay.units[unit]
    if u.graph is not None:
        position = "pre_replay" if t < spans.start_us[u.graph] else "post_replay"
    else:
        position = "post_replay" if t > spans.start_us[u.calls[-1]] else "in_replay"
    return (barrier, placement, unit, position)


def _adjacent(lay: StepLayout, record_call: int, wait_call: int) -> bool:
    """The record was the host call right before the wait (torch's wait_stream)."""
    calls = lay.calls
    if record_call not in calls or wait_call not in calls:
        return False
    return calls.index(wait_call) == calls.index(record_call) + 1


# --------------------------------------------------------------------------- the fit
def fit_model(imp, mapping: Mapping, *, capture: str = "", mapping_name: str = "",
              dist: str = "best", policy: str | None = None, steps: int = FIT_STEPS,
              warmup: int = FIT_WARMUP, version: str = "", where: str = "") -> ModelFit:
    """The whole loop of an imported capture (a :class:`KinetoImport`) as a config.

    ``capture`` and ``mapping_name`` are the names the header cites, ``where`` the name
    errors start with (default: ``capture``).
    """
    trace: Trace = imp.trace
    warnings: list[str] = []
    where = where or capture or trace.meta.get("file", "capture")
    if len(trace.ops) == 0 or not np.any(trace.ops.kind == OpKind.KERNEL):
        raise FitError(f"{where}: no device work in the capture (nothing to fit)")
    check_mapping(imp, mapping, mapping_name or "mapping")
    roles, role_notes = detect_roles(trace, mapping)
    all_lays = step_layouts(trace, roles)
    warm = int(trace.meta.get("warmup_steps", 0))
    lays = {k: v for k, v in all_lays.items() if k >= warm and k - 1 in all_lays}
    if len(lays) < 2:
        raise FitError(f"{where}: {len(all_lays)} steps with forward work, {len(lays)} after "
                       f"the warm-up ({warm}) with a predecessor and a successor: need at "
                       f"least 2 to fit")
    shapes = Counter(v.signature() for v in lays.values())
    shape, n_shape = shapes.most_common(1)[0]
    if n_shape < len(lays):
        warnings.append(f"{len(lays) - n_shape} of {len(lays)} steps have another structure "
                        f"than the rest (units, syncs): fitted from the {n_shape} alike")
    lays = {k: v for k, v in lays.items() if v.signature() == shape}
    names = _unit_names([u.phase for u in next(iter(lays.values())).units])
    unknown = [p for p in mapping.reads if p not in names]
    if unknown:
        raise FitError(f"{mapping_name or 'mapping'}: reads: '{unknown[0]}' is not a phase of "
                       f"the capture ({', '.join(names)})")

    inferred = infer_policy(trace, lays, roles, imp.counts.get("cuda_sync", 0))
    if isinstance(inferred, str):
        if policy is None:
            raise FitError(f"{where}: cannot infer the barrier policy: {inferred}; name it "
                           f"with --policy ({', '.join(POLICIES)})")
        pol = _fallback_policy(policy, lays, names, mapping, inferred)
    else:
        pol = inferred
        if policy is not None and policy != pol.barrier:
            warnings.append(f"--policy {policy} not used: the capture shows {pol.barrier} "
                            f"({pol.evidence})")

    s = _Samples()
    graph_cost = _device_and_costs(trace, lays, roles, names, mapping, s)
    cfg = _config(trace, lays, roles, names, mapping, pol, s, graph_cost, steps, warmup,
                  capture)
    cpu_notes = _cpu(trace, imp, lays, mapping, names, cfg, s, shape, graph_cost, warnings)
    details: dict[str, dict] = {}
    if graph_cost["cost"]:  # the cheapest graph's launches sample costs.graph_launch_us
        cheapest = min(graph_cost["cost"], key=lambda i: float(np.mean(graph_cost["cost"][i])))
        for v in graph_cost["cost"][cheapest]:
            s.add("costs.graph_launch_us", v)
    _fill(cfg, s, dist, details)
    from simwar.config.schema import ConfigError, load_config

    try:
        load_config(cfg)
    except ConfigError as e:  # pragma: no cover - the fit writes only valid values
        raise FitError(f"{where}: the fitted config is invalid: {e}") from None
    header = _header(trace, imp, lays, all_lays, roles, role_notes, names, pol, cfg, s,
                     graph_cost, cpu_notes, capture, mapping_name, version, warm)
    return ModelFit(cfg, header, details, pol, roles, warnings)


def check_mapping(imp, mapping: Mapping, name: str = "mapping") -> None:
    """A mapping key that matches nothing in the capture is an error (:class:`FitError`)."""
    bad = unmatched_keys(mapping, imp.device_names, [a[0] for a in imp.annotations])
    bad += _absent_streams(imp.trace, mapping)
    if bad:
        raise FitError(f"{name}: {bad[0]}" + (f" (and {len(bad) - 1} more)"
                                               if len(bad) > 1 else ""))


def _absent_streams(trace: Trace, mapping: Mapping) -> list[str]:
    lanes = trace.meta.get("lanes") or {}
    present = {v.split(":")[-1] for v in lanes.values()} | set(lanes.values())
    out = []
    for key in mapping.streams:
        if key not in present:
            ids = sorted({v.split(":")[-1] for v in lanes.values()}, key=_num_key)
            out.append(f"streams '{key}' names no stream of the capture (streams with "
                       f"device work: {', '.join(ids)})")
    return out


def _num_key(text: str):
    return (0, int(text)) if text.isdigit() else (1, text)


def _unit_names(phases: list[str]) -> list[str]:
    seen: Counter = Counter()
    out = []
    for p in phases:
        seen[p] += 1
        out.append(p if seen[p] == 1 else f"{p}_{seen[p]}")
    return out


def _fallback_policy(name: str, lays, names, mapping: Mapping, why: str) -> PolicyInference:
    if name not in POLICIES:
        raise FitError(f"--policy: '{name}' is not a barrier policy ({', '.join(POLICIES)})")
    unit = position = None
    readers = [i for i, n in enumerate(names) if n in mapping.reads]
    if name in ("fine", "host_sync"):
        if not readers:
            raise FitError(f"--policy {name}: no phase reads shared buffers (declare them in "
                           f"the mapping's reads: {{PHASE: [req_to_token]}})")
        unit = readers[-1]
        graph = next(iter(lays.values())).units[unit].graph is not None
        position = "in_replay" if graph else "post_replay"
    where = f" at {names[unit]} ({position})" if unit is not None else ""
    return PolicyInference(name, "after_launch", unit, position, "command line",
                           f"--policy {name}{where}: the capture cannot show it ({why})")


class _Samples(dict):
    """Config key → per-step samples (a list), in the order first added."""

    def add(self, key: str, value: float) -> None:
        self.setdefault(key, []).append(float(value))

    def mean(self, key: str, default: float = 0.0) -> float:
        v = self.get(key)
        return float(np.mean(v)) if v else default


def _device_and_costs(trace: Trace, lays, roles, names, mapping, s: _Samples) -> dict:
    """Device time per unit and stream, host costs per call kind; per-graph launch costs."""
    ops, spans = trace.ops, trace.spans
    graph_cost: dict[int, list[float]] = {}
    graph_nodes: dict[int, list[int]] = {}
    for lay in lays.values():
        units = lay.units
        for i, u in enumerate(units):
            name = names[i]
            nxt = units[i + 1].ops[0] if i + 1 < len(units) and units[i + 1].ops else None
            tail_gap = queued_gap(trace, u.ops[-1] if u.ops else None, nxt)
            reads = name in mapping.reads
            if u.graph is not None:
                g_start = spans.start_us[u.graph]
                before = [o for o in u.ops if spans.start_us[ops.call[o]] < g_start]
                rest = [o for o in u.ops if o not in set(before)]
                graph_ops = [o for o in rest if ops.call[o] == u.graph]
                lb = work_us(trace, before) + (queued_gap(trace, before[-1], rest[0])
                                               if before and rest else 0.0)
                body = work_us(trace, rest) + tail_gap
                prep = 0.0
                if reads and rest:  # a reading graph re-reads in its first node
                    prep = float(ops.end_us[rest[0]] - ops.start_us[rest[0]])
                    body -= prep
                graph_cost.setdefault(i, []).append(float(spans.end_us[u.graph]
                                                          - spans.start_us[u.graph]))
                graph_nodes.setdefault(i, []).append(len(graph_ops))
            else:
                lb = 0.0
                body = work_us(trace, u.ops) + tail_gap
                prep = 0.0
                if reads and u.ops:
                    prep = float(ops.end_us[u.ops[0]] - ops.start_us[u.ops[0]])
                    body -= prep
            s.add(f"phases.{name}.load_batch_us", lb)
            s.add(f"phases.{name}.prep_us", prep)
            s.add(f"phases.{name}.body_us", max(0.0, body))
        sched = lay.sched_ops
        if sched:
            last = sched[-1]
            s.add("gpu.schedule_writes_us", float(ops.end_us[last] - ops.start_us[last]))
            s.add("gpu.schedule_prep_us", work_us(trace, sched[:-1])
                  + (queued_gap(trace, sched[-2], last) if len(sched) > 1 else 0.0))
        else:
            s.add("gpu.schedule_writes_us", 0.0)
            s.add("gpu.schedule_prep_us", 0.0)
        s.add("gpu.result_writes_us", work_us(trace, lay.result_ops))
        s.add("gpu.result_copy_us", work_us(trace, lay.copy_ops))
    _call_costs(trace, lays, s)
    _sync_costs(trace, lays, roles, s)
    _cross_stream(trace, lays, roles, s)
    return {"cost": graph_cost, "nodes": graph_nodes}


def _call_costs(trace: Trace, lays, s: _Samples) -> None:
    """Host cost per call kind over the measured steps. A record immediately followed by
    a stream wait (what torch's ``wait_stream`` issues: a fresh event, recorded and waited
    on) is one ``wait_stream_us`` sample, from the record's start to the wait's end."""
    spans = trace.spans
    kinds = {Call.LAUNCH: "costs.launch_us", Call.RECORD: "costs.event_record_us",
             Call.WAIT_EVENT: "costs.wait_event_us", Call.WAIT_STREAM: "costs.wait_stream_us"}
    for lay in lays.values():
        calls = lay.calls
        paired = set()
        for a, b in zip(calls, calls[1:]):
            if spans.call[a] == Call.RECORD and spans.call[b] == Call.WAIT_EVENT \
                    and a not in paired and _binds(trace, b, a):
                paired.update((a, b))
                s.add("costs.wait_stream_us", float(spans.end_us[b] - spans.start_us[a]))
        for c in calls:
            key = kinds.get(Call(int(spans.call[c])))
            if key is not None and c not in paired:
                s.add(key, float(spans.end_us[c] - spans.start_us[c]))


def _binds(trace: Trace, wait_call: int, record_call: int) -> bool:
    """The wait issued by ``wait_call`` binds to the record of ``record_call`` (a capture
    whose waits name no record pairs nothing: ``wait_stream_us`` is then record + wait)."""
    ops = trace.ops
    waits = [o for o in _ops_of_call(trace, wait_call) if ops.kind[o] == OpKind.WAIT]
    if not waits:
        return False
    b = int(ops.bound[waits[0]])
    return b >= 0 and int(ops.call[b]) == record_call


def _sync_costs(trace: Trace, lays, roles, s: _Samples) -> None:
    """``sync_us`` (syncs that did not block), ``sync_wake_us`` (those that did): from the
    record each sync bound to, else from the previous step's result copy it waited for."""
    ops, spans = trace.ops, trace.spans
    for k, lay in lays.items():
        for sp in lay.syncs:
            start, end = float(spans.start_us[sp]), float(spans.end_us[sp])
            op = int(spans.op[sp])
            fired = None
            if op >= 0 and ops.kind[op] == OpKind.SYNC and ops.bound[op] >= 0:
                fired = float(ops.end_us[ops.bound[op]])
            elif sp == lay.result_sync and k - 1 in lays and lays[k - 1].copy_ops:
                fired = float(ops.end_us[lays[k - 1].copy_ops[-1]])
            if fired is None:
                continue
            if fired <= start:
                s.add("costs.sync_us", end - start)
            elif end >= fired:
                s.add("costs.sync_wake_us", end - fired)


def _cross_stream(trace: Trace, lays, roles, s: _Samples) -> None:
    """Cross-stream latency: from waits bound to another stream's record (release minus the
    record's firing, when the wait held its stream); else from the forward's first kernel
    held behind the schedule stream's last write (and the writes behind the forward)."""
    ops = trace.ops
    found = False
    kernel = ops.kind == OpKind.KERNEL
    for k in lays:
        for w in np.flatnonzero((ops.step == k) & (ops.kind == OpKind.WAIT)
                                & (ops.bound >= 0)).tolist():
            b = int(ops.bound[w])
            c = int(ops.call[b])
            if ops.lane[b] == ops.lane[w] or (c >= 0 and trace.spans.call[c]
                                              == Call.GRAPH_LAUNCH):
                continue  # an in-graph record's firing is not in a capture
            fired, reach = float(ops.end_us[b]), float(ops.start_us[w])
            # the next work on the waiting stream, if it was queued behind the wait before
            # the record fired: its start is the release (a capture shows nothing else)
            nxt = np.flatnonzero(kernel[w + 1:] & (ops.lane[w + 1:] == ops.lane[w]))
            if not len(nxt) or fired <= reach:
                continue
            n = w + 1 + int(nxt[0])
            if ops.issue_us[n] <= fired and ops.start_us[n] >= fired:
                s.add("costs.cross_stream_us", float(ops.start_us[n]) - fired)
                found = True
    if found:
        return
    keys = sorted(lays)
    for k in keys:
        lay, prev = lays[k], lays.get(k - 1)
        if not lay.sched_ops or not lay.units[0].ops or prev is None or not prev.units[-1].ops:
            continue
        w_end = float(ops.end_us[lay.sched_ops[-1]])
        f = lay.units[0].ops[0]
        prev_end = float(ops.end_us[prev.units[-1].ops[-1]])
        if ops.issue_us[f] < w_end and prev_end < w_end:  # the forward was held by the writes
            s.add("costs.cross_stream_us", float(ops.start_us[f]) - w_end)
        w0 = lay.sched_ops[0]
        if ops.issue_us[w0] < prev_end and ops.start_us[w0] > prev_end:  # writes held
            s.add("costs.cross_stream_us", float(ops.start_us[w0]) - prev_end)


def _config(trace, lays, roles, names, mapping: Mapping, pol: PolicyInference, s: _Samples,
            graph_cost, steps, warmup, capture) -> dict:
    first = next(iter(lays.values()))
    phases = []
    for i, (name, u) in enumerate(zip(names, first.units)):
        reads = list(mapping.reads.get(name, []))
        graph = u.graph is not None
        if pol.unit == i and pol.position:
            ends = pol.position
        elif reads:
            ends = "in_replay" if graph else "post_replay"
        else:
            ends = "unknown"
        phases.append({"name": name, "runner": "target", "graph": "full" if graph else "eager",
                       "read_ends": ends, "load_batch_us": 0.0, "prep_us": 0.0, "body_us": 0.0,
                       "host_us": 0.0, "reads": reads, "future_publish": False})
    buffers = sorted({b for r in mapping.reads.values() for b in r}) or ["req_to_token"]
    plan = bool(roles.get("plan")) and bool(first.sched_ops) and any(
        trace.ops.lane[o] == trace.code(roles["plan"]) for o in first.sched_ops)
    stem = re.sub(r"(\.kineto)?\.json(\.gz)?$", "", capture or "capture")
    return {
        "name": f"fitted-{stem}", "seed": 0, "steps": steps, "warmup_steps": warmup,
        "algorithm": "custom", "phases": phases,
        "policy": {"barrier": pol.barrier, "placement": pol.placement,
                   "external_events": True, "in_replay_fallback": "post_replay",
                   "plan_stream": plan, "needs_cpu_seq_lens": False,
                   "publish_phase": names[pol.unit] if pol.unit is not None else "auto"},
        "cpu": {item + "_us": 0.0 for item in (*CPU_ITEMS, "post_launch")},
        "gpu": {"schedule_prep_us": 0.0, "schedule_writes_us": 0.0, "result_writes_us": 0.0,
                "result_copy_us": 0.0, "seq_lens_copy_us": 0.0,
                "result_copy_stream": "copy", "writes": buffers},
        "costs": {},
        "accept": {"tokens": float(mapping.accept_tokens)},
        "batch_size": int(mapping.batch_size),
    }


#: host costs written when the capture has no sample of them (the config's defaults)
COST_DEFAULTS = {"launch_us": 6.0, "event_record_us": 9.0, "wait_event_us": 2.0,
                 "graph_launch_us": 5.0, "sync_us": 1.0, "sync_wake_us": 16.0,
                 "cross_stream_us": 3.0}


def _constant_costs(s: _Samples, graph_cost) -> dict:
    """Mean host costs (the fit's constants); wait_stream = record + wait when unmeasured."""
    costs = {k: s.mean(f"costs.{k}", v) for k, v in COST_DEFAULTS.items()}
    if graph_cost["cost"]:
        costs["graph_launch_us"] = min(float(np.mean(v)) for v in graph_cost["cost"].values())
    costs["wait_stream_us"] = s.mean("costs.wait_stream_us",
                                     costs["event_record_us"] + costs["wait_event_us"])
    costs["host_call_us"] = 0.0
    return costs


def _cpu(trace, imp, lays, mapping: Mapping, names, cfg, s: _Samples, shape, graph_cost,
         warnings) -> dict:
    """CPU work per step: each region's host time less the fitted loop's own API calls."""
    from simwar.api import simulate

    costs = _constant_costs(s, graph_cost)
    base = {**cfg, "costs": costs, "steps": 8, "warmup_steps": 0, "name": "zero-cpu"}
    base["phases"] = [dict(p) for p in cfg["phases"]]
    for p in base["phases"]:
        for key in ("load_batch_us", "prep_us", "body_us"):
            p[key] = s.mean(f"phases.{p['name']}.{key}")
    base["gpu"] = dict(cfg["gpu"])
    for key in ("schedule_prep_us", "schedule_writes_us", "result_writes_us", "result_copy_us"):
        base["gpu"][key] = s.mean(f"gpu.{key}")
    zero = simulate(base).trace
    zroles = Roles(forward="forward", schedule="plan" if cfg["policy"]["plan_stream"]
                   else "schedule", copy="copy")
    zlays = step_layouts(zero, zroles)
    model: dict[str, list[float]] = {}
    for k in range(3, 7):
        if k in zlays:
            for name, v in regions(zero, zlays[k]).items():
                model.setdefault(name, []).append(v)
    model_r = {name: float(np.median(v)) for name, v in model.items()}
    graph_mean = costs["graph_launch_us"]

    rules = mapping.cpu_rules()
    mapped_items = set(mapping.cpu.values())
    notes: dict[str, dict[str, list[float]]] = {}
    clipped = Counter()
    spans = trace.spans
    n_units = len(names)
    for lay in lays.values():
        cap = regions(trace, lay)
        cpu = _merge(cap, dict(model_r))
        # a costlier graph launch: its extra host time goes before it (where the device
        # waits for it), out of the region that holds the launch
        for i, u in enumerate(lay.units):
            if u.graph is None:
                continue
            extra = float(spans.end_us[u.graph] - spans.start_us[u.graph]) - graph_mean
            holder = f"host_{i + 1}" if i + 1 < n_units else "tail"
            cpu[f"host_{i}"] = cpu.get(f"host_{i}", 0.0) + extra
            cpu[holder] = cpu.get(holder, 0.0) - extra
        nets = _mapped_nets(trace, imp, lay, rules)
        items = {it: 0.0 for it in (*CPU_ITEMS, "post_launch")}
        host = [0.0] * n_units
        for region, value in cpu.items():
            if value < 0:
                clipped[region] += -value
                value = 0.0
            if region.startswith("host_"):
                host[int(region.split("_")[1])] += value
                continue
            if region == "A":
                parts = {it: nets.get(it, 0.0) for it in ("ingest", "schedule", "prepare")
                         if it in mapped_items and not (it == "prepare" and "A2" in cpu)}
                total = sum(parts.values())
                if total > value > 0:
                    parts = {it: v * value / total for it, v in parts.items()}
                elif total > value:
                    parts = {it: 0.0 for it in parts}
                residual = value - sum(parts.values())
                target = next((it for it in ("ingest", "schedule", "prepare")
                               if it not in mapped_items), "ingest")
                for it, v in parts.items():
                    items[it] += v
                    notes.setdefault(it, {}).setdefault("mapped", []).append(v)
                items[target] += residual
                notes.setdefault(target, {}).setdefault("residual", []).append(residual)
            else:
                item = REGION_ITEM[region]
                items[item] += value
                if item in mapped_items:
                    net = min(nets.get(item, 0.0), value)
                    notes.setdefault(item, {}).setdefault("mapped", []).append(net)
                    notes[item].setdefault("residual", []).append(value - net)
                else:
                    notes.setdefault(item, {}).setdefault("residual", []).append(value)
        for it, v in items.items():
            s.add(f"cpu.{it}_us", v)
        for i, v in enumerate(host):
            s.add(f"phases.{names[i]}.host_us", v)
    for region, us in clipped.items():
        if us / len(lays) > 0.5:
            warnings.append(f"host region {region}: the fitted loop's API calls take "
                            f"{us / len(lays):.1f} µs/step more than the capture's there "
                            f"(its CPU work is clipped at 0)")
    return notes


def _merge(cap: dict, model: dict) -> dict:
    """Capture regions less the model's; a model region the capture lacks joins the one
    before it (e.g. the model's schedule launches when the capture has none)."""
    order = ["A", "A2", "host_0"] + sorted(
        (r for r in set(cap) | set(model) if r.startswith("host_") and r != "host_0"),
        key=lambda r: int(r.split("_")[1])) + ["tail", "tail2", "P"]
    prev = None
    for r in order:
        if r in model and r not in cap:
            if prev is not None:
                model[prev] = model.get(prev, 0.0) + model.pop(r)
            continue
        if r in cap:
            prev = r
    return {r: cap[r] - model.get(r, 0.0) for r in cap}


def _mapped_nets(trace: Trace, imp, lay: StepLayout, rules) -> dict[str, float]:
    """Per CPU item: the step's mapped ranges, net of the API calls (and blocking) and of
    other mapped ranges inside them, clipped to the item's region."""
    if not rules:
        return {}
    spans = trace.spans
    sched0 = float(spans.start_us[lay.sched_calls[0]]) if lay.sched_calls else \
        float(spans.start_us[lay.first_forward])
    top = lay.top_sync
    a_end = float(spans.start_us[top]) if top is not None else sched0
    windows = {"ingest": (lay.start, a_end), "schedule": (lay.start, a_end),
               "prepare": (float(spans.end_us[top]), sched0) if top is not None
               else (lay.start, a_end),
               "process_result": (float(spans.start_us[lay.result_sync]), lay.end)
               if lay.result_sync is not None else (lay.end, lay.end)}
    mapped = []
    for name, a, b in imp.annotations:
        if b <= lay.start or a >= lay.end:
            continue
        item = next((it for rx, it in rules if rx.search(name)), None)
        if item is not None:
            mapped.append((a, b, item))
    calls = [(float(spans.start_us[c]), float(spans.end_us[c])) for c in lay.calls]
    out: dict[str, float] = {}
    for a, b, item in mapped:
        lo, hi = windows[item]
        a2, b2 = max(a, lo), min(b, hi)
        if b2 <= a2:
            continue
        inner = calls + [(x, y) for x, y, it in mapped if (x, y, it) != (a, b, item)
                         and x >= a and y <= b]
        out[item] = out.get(item, 0.0) + (b2 - a2) - _covered(inner, a2, b2)
    return out


def _covered(intervals, lo: float, hi: float) -> float:
    clipped = sorted((max(a, lo), min(b, hi)) for a, b in intervals if b > lo and a < hi)
    total, cur_a, cur_b = 0.0, None, None
    for a, b in clipped:
        if cur_b is None or a > cur_b:
            if cur_b is not None:
                total += cur_b - cur_a
            cur_a, cur_b = a, b
        else:
            cur_b = max(cur_b, b)
    if cur_b is not None:
        total += cur_b - cur_a
    return total


def _fill(cfg: dict, s: _Samples, dist: str, details: dict) -> None:
    """Write each sampled key into the config as a fitted distribution (or a constant)."""
    for key, values in s.items():
        if not values:
            continue
        parts = key.split(".")
        if parts[0] == "costs":
            continue
        value, detail = _fit(values, dist)
        details[key] = detail
        if parts[0] == "phases":
            entry = next(p for p in cfg["phases"] if p["name"] == parts[1])
            entry[parts[2]] = value
        else:
            cfg[parts[0]][parts[1]] = value
    costs = {}
    for name, default in COST_DEFAULTS.items():
        values = s.get(f"costs.{name}")
        if values and len(values) >= 3:
            costs[name], details[f"costs.{name}"] = _fit(values, dist)
        else:
            costs[name] = _r(float(np.mean(values))) if values else default
    values = s.get("costs.wait_stream_us")
    if values and len(values) >= 3:
        costs["wait_stream_us"], details["costs.wait_stream_us"] = _fit(values, dist)
    else:
        costs["wait_stream_us"] = _r(_mean(costs["event_record_us"])
                                     + _mean(costs["wait_event_us"]))
    costs["host_call_us"] = 0.0
    cfg["costs"] = {k: costs[k] for k in ("launch_us", "event_record_us", "wait_event_us",
                                          "wait_stream_us", "graph_launch_us", "sync_us",
                                          "sync_wake_us", "cross_stream_us", "host_call_us")}


def _mean(v) -> float:
    if isinstance(v, dict):
        if "mean" in v:
            return float(v["mean"])
        return float(np.mean(v.get("values") or [0.0]))
    return float(v)


def _fit(values, dist: str):
    x = np.asarray(values, dtype=float)
    if np.ptp(x) < 1e-6 * max(1.0, float(np.abs(x).max())):  # constant up to rounding
        return _r(float(x.mean())), {"n": len(x), "mean": _r(float(x.mean())),
                                     "chosen": "constant"}
    return fit_values(np.maximum(x, 0.0), dist)


def _r(v: float) -> float:
    return round(float(v), 3)


# --------------------------------------------------------------------------- header
def _header(trace, imp, lays, all_lays, roles, role_notes, names, pol, cfg, s, graph_cost,
            cpu_notes, capture, mapping_name, version, warm) -> list[str]:
    n_steps = len(trace.meta.get("step_names") or []) or len(all_lays)
    lines = [f"Fitted by simwar {version} (`simwar import --fit`) from {capture or 'a capture'}"
             + (f" with the mapping {mapping_name}" if mapping_name else " (no mapping)") + ".",
             f"{n_steps} steps in the capture; {len(lays)} fitted (after the warm-up of "
             f"{warm}). `simwar import {capture or 'CAPTURE'} "
             + (f"--mapping {mapping_name} " if mapping_name else "")
             + "--check THIS_FILE` compares a simulation of this file with the capture."]
    lines.append(f"Streams: forward '{roles['forward']}'"
                 + "".join(f", {r} '{roles[r]}'" for r in ("schedule", "plan", "copy")
                           if roles.get(r)) + ".")
    lines += [f"  {n}" for n in role_notes]
    src = "inferred from the capture's CUDA sync events" if pol.source == "capture" \
        else "named on the command line"
    at = f", read-done at {names[pol.unit]} ({pol.position})" if pol.unit is not None else ""
    lines.append(f"Policy: {pol.barrier} ({pol.placement}{at}), {src}: {pol.evidence}.")
    units = ", ".join(f"{n} ({'graph' if u.graph is not None else 'eager'}, "
                      f"{len(u.ops)} kernels)" for n, u in
                      zip(names, next(iter(lays.values())).units))
    lines.append(f"Phases (forward units, device time per step incl. gaps between queued "
                 f"kernels): {units}.")
    if graph_cost["cost"]:
        per = ", ".join(f"{names[i]} {np.mean(v):.1f} µs ({int(np.mean(graph_cost['nodes'][i]))}"
                        f" nodes)" for i, v in sorted(graph_cost["cost"].items()))
        cheapest = min(float(np.mean(v)) for v in graph_cost["cost"].values())
        lines.append(f"cudaGraphLaunch host time: {per}; costs.graph_launch_us is the "
                     f"cheapest ({cheapest:.1f}), the difference of a costlier graph is in its "
                     f"phase's host_us (before the launch, where the device waits for it).")
    lines.append("CPU work per step (mean µs; mapped ranges net of API calls and blocking + "
                 "the residual no range or call explains):")
    for item in (*CPU_ITEMS, "post_launch"):
        n = cpu_notes.get(item, {})
        m = float(np.mean(n["mapped"])) if n.get("mapped") else None
        r = float(np.mean(n["residual"])) if n.get("residual") else 0.0
        total = s.mean(f"cpu.{item}_us")
        parts = (f"mapped {m:.1f} + residual {r:.1f}" if m is not None
                 else f"residual {r:.1f} (no range)")
        lines.append(f"  cpu.{item}_us {total:.1f} = {parts}")
    for name in names:
        lines.append(f"  phases.{name}.host_us {s.mean(f'phases.{name}.host_us'):.1f} "
                     f"(host time before its launch: dispatch, residual)")
    why = {"sync_us": "every synchronize blocked", "sync_wake_us": "no synchronize blocked",
           "cross_stream_us": "no wait held its stream behind another stream's work"}
    unseen = [f"{k} {v} ({why.get(k, 'no such call')})" for k, v in COST_DEFAULTS.items()
              if not s.get(f"costs.{k}") and k != "graph_launch_us"]
    if unseen:
        lines.append("Not in the capture, so the config's defaults: " + "; ".join(unseen) + ".")
    ignored = _unmodeled(trace, lays, roles)
    if ignored:
        lines.append("Not modeled: " + "; ".join(ignored) + ".")
    return lines


def _unmodeled(trace: Trace, lays, roles) -> list[str]:
    ops = trace.ops
    known = {trace.code(v) for v in roles.values() if v}
    steps = np.array(sorted(lays))
    pick = np.flatnonzero((ops.kind == OpKind.KERNEL) & np.isin(ops.step, steps)
                          & ~np.isin(ops.lane, list(known)))
    out = []
    for code in np.unique(ops.lane[pick]).tolist():
        on = pick[ops.lane[pick] == code]
        us = float((ops.end_us[on] - ops.start_us[on]).sum()) / len(steps)
        out.append(f"stream '{trace.text(code)}' ({len(on) / len(steps):.1f} ops, "
                   f"{us:.1f} µs per step)")
    return out
