"""What a capture measured in each fitted step: the samples a fitted config is made of.

Per measured step (:class:`simwar.fit.layout.StepLayout`), into :class:`Samples`
(config key → one value per step):

- **phases** (:func:`sample_device_and_costs`): the forward's units in order (a
  phase's launches, one CUDA graph each), each with its device time per step
  (kernel lengths plus the device-side gaps between queued kernels: between a
  graph's own nodes, before the next unit), split into ``load_batch_us`` (eager
  kernels before the graph), ``prep_us`` (a reading phase's first graph node, or
  first kernel when eager: where its shared reads are taken to be, with its
  load_batch, as a capture cannot show reads; the mapping's ``reads`` says which
  phases read) and ``body_us``;
- **the schedule-stream work** before the forward (``gpu.schedule_prep_us``: all
  but the last op, ``gpu.schedule_writes_us``: the last, the write), the
  schedule-stream work after it (``gpu.result_writes_us``) and the result copy;
- **host costs** per call kind, the graph launch per graph (the caller takes the
  cheapest graph's as ``costs.graph_launch_us``; a costlier graph's difference is
  host time before its launch, ``phases.NAME.host_us``, where the device also
  waits for it), ``sync_us``/``sync_wake_us`` and the cross-stream latency;
- **CPU work** (:func:`sample_cpu_work`): the host time of each region between
  the loop's anchors (:func:`simwar.fit.layout.regions`, synchronize calls
  left out) less what the fitted config's own API calls take there (measured by
  simulating the fitted loop with no CPU work), so that the fitted host loop adds
  up to the captured one, step by step. The mapping's ``cpu`` ranges split the
  regions into ``ingest``/``schedule``/``prepare``/``process_result`` (net of the
  API calls and blocking inside them); what no range explains is the region's
  residual. Regions: loop top → ``cpu.ingest_us`` (the residual; ``schedule_us``
  and ``prepare_us`` from their ranges), after a loop-top barrier sync →
  ``prepare_us``, schedule launches → forward and between units →
  ``phases.NAME.host_us``, forward → result sync → ``cpu.post_launch_us``, result
  sync → step end → ``cpu.process_result_us``.

**The profiler's own cost**: given a :class:`simwar.fit.profiler_cost.ProfilerCost`
(``prof``, the fit's default), every host duration read here (each API call's cost but
``sync_wake_us``, a device-side latency; each region; each mapped range) is less the
events the profiler recorded in it times their measured cost, never below zero; without
one (``--keep-profiler-cost``) every figure is the capture's as it stands.

Imports: numpy, the standard library and simwar (the simulation of the fitted
loop with no CPU work runs the simulator).
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from simwar.analysis.views import ops_of_call
from simwar.api import simulate
from simwar.capture.mapping import CPU_ITEMS, Mapping
from simwar.core.trace import Call, OpKind, Trace
from simwar.fit.layout import (
    Roles,
    StepLayout,
    columns,
    merged,
    queued_gap,
    regions,
    step_layouts,
    work_us,
)

#: a step's regions and the CPU work each becomes (phase regions: ``host_i``)
REGION_ITEM = {"A": "ingest", "A2": "prepare", "tail": "post_launch", "tail2": "post_launch",
               "P": "process_result"}
#: host costs written when the capture has no sample of them (the config's defaults)
COST_DEFAULTS = {"launch_us": 6.0, "event_record_us": 9.0, "wait_event_us": 2.0,
                 "graph_launch_us": 5.0, "sync_us": 1.0, "sync_wake_us": 16.0,
                 "cross_stream_us": 3.0}


class Samples(dict):
    """Config key → per-step samples (a list), in the order first added; :meth:`steps_of`
    gives the step each sample was measured in (what its size is read from)."""

    def __init__(self) -> None:
        super().__init__()
        self._steps: dict[str, list[int]] = {}

    def add(self, key: str, value: float, step: int = -1) -> None:
        self.setdefault(key, []).append(float(value))
        self._steps.setdefault(key, []).append(int(step))

    def steps_of(self, key: str) -> list[int]:
        return self._steps.get(key, [])

    def keep(self, key: str, keep) -> None:
        """Keep only the samples of ``key`` whose index ``keep(i)`` is true (in order)."""
        idx = [i for i in range(len(self.get(key, []))) if keep(i)]
        self[key] = [self[key][i] for i in idx]
        self._steps[key] = [self._steps[key][i] for i in idx]

    def mean(self, key: str, default: float = 0.0) -> float:
        v = self.get(key)
        return float(np.mean(v)) if v else default


def sample_device_and_costs(trace: Trace, lays, names, mapping: Mapping, s: Samples,
                            prof=None) -> dict:
    """Device time per unit and stream, host costs per call kind; per-graph launch costs:
    ``{"cost": {unit: [µs per step]}, "nodes": {unit: [graph nodes per step]}}``. ``prof``
    (a :class:`simwar.fit.profiler_cost.ProfilerCost`): every host cost less the profiler's
    own in its call (:func:`_span_us`)."""
    op_call, op_start, op_end = columns(trace, "ops", "call", "start_us", "end_us")
    span_start, = columns(trace, "spans", "start_us")
    graph_cost: dict[int, list[float]] = {}
    graph_nodes: dict[int, list[int]] = {}
    for k, lay in lays.items():
        units = lay.units
        for i, u in enumerate(units):
            name = names[i]
            nxt = units[i + 1].ops[0] if i + 1 < len(units) and units[i + 1].ops else None
            tail_gap = queued_gap(trace, u.ops[-1] if u.ops else None, nxt)
            reads = name in mapping.reads
            if u.graph is not None:
                g_start = span_start[u.graph]
                before = [o for o in u.ops if span_start[op_call[o]] < g_start]
                early = set(before)
                rest = [o for o in u.ops if o not in early]
                graph_ops = [o for o in rest if op_call[o] == u.graph]
                lb = work_us(trace, before) + (queued_gap(trace, before[-1], rest[0])
                                               if before and rest else 0.0)
                body = work_us(trace, rest) + tail_gap
                prep = 0.0
                if reads and rest:  # a reading graph re-reads in its first node
                    prep = op_end[rest[0]] - op_start[rest[0]]
                    body -= prep
                graph_cost.setdefault(i, []).append(_span_us(trace, u.graph, prof))
                graph_nodes.setdefault(i, []).append(len(graph_ops))
            else:
                lb = 0.0
                body = work_us(trace, u.ops) + tail_gap
                prep = 0.0
                if reads and u.ops:
                    prep = op_end[u.ops[0]] - op_start[u.ops[0]]
                    body -= prep
            s.add(f"phases.{name}.load_batch_us", lb, k)
            s.add(f"phases.{name}.prep_us", prep, k)
            s.add(f"phases.{name}.body_us", max(0.0, body), k)
        sched = lay.sched_ops
        if sched:
            last = sched[-1]
            s.add("gpu.schedule_writes_us", op_end[last] - op_start[last], k)
            s.add("gpu.schedule_prep_us", work_us(trace, sched[:-1])
                  + (queued_gap(trace, sched[-2], last) if len(sched) > 1 else 0.0), k)
        else:
            s.add("gpu.schedule_writes_us", 0.0, k)
            s.add("gpu.schedule_prep_us", 0.0, k)
        s.add("gpu.result_writes_us", work_us(trace, lay.result_ops), k)
        s.add("gpu.result_copy_us", work_us(trace, lay.copy_ops), k)
    _call_costs(trace, lays, s, prof)
    _sync_costs(trace, lays, s, prof)
    _cross_stream(trace, lays, s)
    return {"cost": graph_cost, "nodes": graph_nodes}


def _span_us(trace: Trace, span: int, prof=None) -> float:
    """A host call's length, less the profiler's own cost in it (with ``prof``)."""
    s0, e0 = columns(trace, "spans", "start_us", "end_us")
    a, b = s0[span], e0[span]
    return b - a if prof is None else prof.less(b - a, a, b)


_RECORD, _WAIT_EVENT, _GRAPH_LAUNCH = int(Call.RECORD), int(Call.WAIT_EVENT), \
    int(Call.GRAPH_LAUNCH)
_WAIT, _SYNC = int(OpKind.WAIT), int(OpKind.SYNC)
#: the host cost each call kind samples (a record and wait paired: ``wait_stream_us``)
_CALL_COST = {int(Call.LAUNCH): "costs.launch_us", _RECORD: "costs.event_record_us",
              _WAIT_EVENT: "costs.wait_event_us", int(Call.WAIT_STREAM): "costs.wait_stream_us"}


def _call_costs(trace: Trace, lays, s: Samples, prof=None) -> None:
    """Host cost per call kind over the measured steps. A record immediately followed by
    a stream wait (what torch's ``wait_stream`` issues: a fresh event, recorded and waited
    on) is one ``wait_stream_us`` sample, from the record's start to the wait's end."""
    call, s0, e0 = columns(trace, "spans", "call", "start_us", "end_us")
    for k, lay in lays.items():
        calls = lay.calls
        paired = set()
        for a, b in zip(calls, calls[1:]):
            if call[a] == _RECORD and call[b] == _WAIT_EVENT \
                    and a not in paired and _binds(trace, b, a):
                paired.update((a, b))
                t0, t1 = s0[a], e0[b]
                s.add("costs.wait_stream_us",
                      t1 - t0 if prof is None else prof.less(t1 - t0, t0, t1), k)
        for c in calls:
            key = _CALL_COST.get(call[c])
            if key is not None and c not in paired:
                s.add(key, _span_us(trace, c, prof), k)


def _binds(trace: Trace, wait_call: int, record_call: int) -> bool:
    """The wait issued by ``wait_call`` binds to the record of ``record_call``; a wait bound
    to no record (record correlation ids -1) pairs with the record right before it when its
    event is fresh (no other wait waits on it: torch's wait_stream records a new event)."""
    kind, bound, event, op_call = columns(trace, "ops", "kind", "bound", "event", "call")
    waits = [o for o in ops_of_call(trace, wait_call) if kind[o] == _WAIT]
    if not waits:
        return False
    b = bound[waits[0]]
    if b < 0:
        ev = event[waits[0]]
        return ev != trace.code("") and _wait_counts(trace).get(ev, 0) == 1
    return op_call[b] == record_call


def _wait_counts(trace: Trace) -> dict[int, int]:
    """Per event (code): how many wait ops wait on it (kept on the Trace, built once)."""
    counts = trace.__dict__.get("_simwar_wait_counts")
    if counts is None:
        ops = trace.ops
        waits = ops.event[ops.kind == OpKind.WAIT]
        codes, n = np.unique(waits, return_counts=True)
        counts = dict(zip(codes.tolist(), n.tolist()))
        trace.__dict__["_simwar_wait_counts"] = counts
    return counts


def _sync_costs(trace: Trace, lays, s: Samples, prof=None) -> None:
    """``sync_us`` (syncs that did not block), ``sync_wake_us`` (those that did): from the
    record each sync bound to, else from the previous step's result copy it waited for.
    ``prof``: ``sync_us`` less the profiler's cost in the call; ``sync_wake_us`` is a
    device-side latency (the wake after the device fired) and is kept."""
    span_start, span_end, span_op = columns(trace, "spans", "start_us", "end_us", "op")
    kind, bound, op_end = columns(trace, "ops", "kind", "bound", "end_us")
    for k, lay in lays.items():
        for sp in lay.syncs:
            start, end = span_start[sp], span_end[sp]
            op = span_op[sp]
            fired = None
            if op >= 0 and kind[op] == _SYNC and bound[op] >= 0:
                fired = op_end[bound[op]]
            elif sp == lay.result_sync and k - 1 in lays and lays[k - 1].copy_ops:
                fired = op_end[lays[k - 1].copy_ops[-1]]
            if fired is None:
                continue
            if fired <= start:
                s.add("costs.sync_us", end - start if prof is None
                      else prof.less(end - start, start, end), k)
            elif end >= fired:
                s.add("costs.sync_wake_us", end - fired, k)


def _cross_stream(trace: Trace, lays, s: Samples) -> None:
    """Cross-stream latency: from waits bound to another stream's record (release minus the
    record's firing, when the wait held its stream); else from the forward's first kernel
    held behind the schedule stream's last write (and the writes behind the forward)."""
    ops = trace.ops
    found = False
    # the measured steps' waits bound to a record, each with the next kernel on its stream
    # (the first kernel of its lane after it, by binary search over that lane's kernels)
    waits = np.flatnonzero((ops.kind == OpKind.WAIT) & (ops.bound >= 0)
                           & np.isin(ops.step, np.fromiter(lays, dtype=ops.step.dtype)))
    nxt = np.full(len(waits), -1, dtype=np.int64)
    kernels = np.flatnonzero(ops.kind == OpKind.KERNEL)
    k_lanes = ops.lane[kernels]
    for ln in np.unique(ops.lane[waits]).tolist():
        on = kernels[k_lanes == ln]
        at = np.flatnonzero(ops.lane[waits] == ln)
        i = np.searchsorted(on, waits[at], side="right")
        nxt[at] = np.where(i < len(on), on[np.minimum(i, len(on) - 1)], -1)
    by_step: dict[int, list[tuple[int, int]]] = {}
    for w, k, n in zip(waits.tolist(), ops.step[waits].tolist(), nxt.tolist()):
        by_step.setdefault(k, []).append((w, n))
    lane, bound, op_call, start, end, issued = columns(
        trace, "ops", "lane", "bound", "call", "start_us", "end_us", "issue_us")
    span_call, = columns(trace, "spans", "call")
    for k in lays:
        for w, n in by_step.get(k, ()):
            b = bound[w]
            c = op_call[b]
            if lane[b] == lane[w] or (c >= 0 and span_call[c] == _GRAPH_LAUNCH):
                continue  # an in-graph record's firing is not in a capture
            fired, reach = end[b], start[w]
            # the next work on the waiting stream, if it was queued behind the wait before
            # the record fired: its start is the release (a capture shows nothing else)
            if n < 0 or fired <= reach:
                continue
            if issued[n] <= fired and start[n] >= fired:
                s.add("costs.cross_stream_us", start[n] - fired, k)
                found = True
    if found:
        return
    keys = sorted(lays)
    for k in keys:
        lay, prev = lays[k], lays.get(k - 1)
        if not lay.sched_ops or not lay.units[0].ops or prev is None or not prev.units[-1].ops:
            continue
        w_end = end[lay.sched_ops[-1]]
        f = lay.units[0].ops[0]
        prev_end = end[prev.units[-1].ops[-1]]
        if issued[f] < w_end and prev_end < w_end:  # the forward was held by the writes
            s.add("costs.cross_stream_us", start[f] - w_end, k)
        # the schedule stream's first work held behind the forward (a barrier's): the previous
        # result's writes (issued after the barrier) or this step's writes
        held = [o for o in prev.result_ops + lay.sched_ops
                if issued[o] < prev_end < start[o]]
        if held:
            w0 = min(held, key=lambda o: start[o])
            s.add("costs.cross_stream_us", start[w0] - prev_end, k)


def _constant_costs(s: Samples, graph_cost) -> dict:
    """Mean host costs (the fit's constants); wait_stream = record + wait when unmeasured."""
    costs = {k: s.mean(f"costs.{k}", v) for k, v in COST_DEFAULTS.items()}
    if graph_cost["cost"]:
        costs["graph_launch_us"] = min(float(np.mean(v)) for v in graph_cost["cost"].values())
    costs["wait_stream_us"] = s.mean("costs.wait_stream_us",
                                     costs["event_record_us"] + costs["wait_event_us"])
    costs["host_call_us"] = 0.0
    return costs


def sample_cpu_work(trace, imp, lays, mapping: Mapping, names, cfg, s: Samples, graph_cost,
                    warnings, prof=None, held=None) -> dict:
    """CPU work per step: each region's host time less the fitted loop's own API calls.

    ``cfg`` is the fitted config so far (its device times and costs still unfitted: their
    per-step means are taken from ``s``); returns, per CPU item, the mapped and residual
    µs per step the header reports. ``prof`` (a
    :class:`simwar.fit.profiler_cost.ProfilerCost`): every region and mapped range less the
    profiler's own host cost in it (the API calls' costs in ``s`` are already net of it).
    ``held``: per step, host work another key holds (``(start, end, µs)``: the receive
    ranges, :mod:`simwar.fit.receive`), out of its region and of the mapped range around it.
    """
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

    ranges = _MappedRanges(imp.annotations, mapping.cpu_item_of())
    mapped_items = set(mapping.cpu.values())
    notes: dict[str, dict[str, list[float]]] = {}
    clipped = Counter()
    n_units = len(names)
    for k, lay in lays.items():
        own = held.get(k, ()) if held else ()
        cap = regions(trace, lay, prof, own)
        cpu = _merge(cap, dict(model_r))
        # a costlier graph launch: its extra host time goes before it (where the device
        # waits for it), out of the region that holds the launch
        for i, u in enumerate(lay.units):
            if u.graph is None:
                continue
            extra = _span_us(trace, u.graph, prof) - graph_mean
            holder = f"host_{i + 1}" if i + 1 < n_units else "tail"
            cpu[f"host_{i}"] = cpu.get(f"host_{i}", 0.0) + extra
            cpu[holder] = cpu.get(holder, 0.0) - extra
        nets = _mapped_nets(trace, ranges, lay, prof, own)
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
            s.add(f"cpu.{it}_us", v, k)
        for i, v in enumerate(host):
            s.add(f"phases.{names[i]}.host_us", v, k)
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


class _MappedRanges:
    """The capture's annotation ranges a ``cpu`` rule maps to an item, found per step.

    Each range's item is its name's by the mapping's ``cpu`` rules (``item_of``:
    :meth:`simwar.capture.mapping.Mapping.cpu_item_of`, each name searched once), and a
    step's ranges come from its window by binary search over the ranges sorted by start,
    with the running maximum of their ends bounding the search from below: per step the
    work is the ranges near it, not the whole capture (which made the fit quadratic in
    steps). :meth:`overlapping` keeps the capture's order, so sums over them are the same
    to the last bit as a scan of every range.
    """

    def __init__(self, annotations, item_of):
        self.mapped: list[tuple[float, float, str]] = []
        if item_of.rules:
            for name, a, b in annotations:
                item = item_of[name]
                if item is not None:
                    self.mapped.append((a, b, item))
        starts = np.array([m[0] for m in self.mapped], dtype=float)
        ends = np.array([m[1] for m in self.mapped], dtype=float)
        self._order = np.argsort(starts, kind="stable")
        self._starts = starts[self._order]
        self._ends = ends
        # a range can reach a step only if some range starting no later ends after its start
        self._reach = np.maximum.accumulate(ends[self._order]) if len(ends) else ends

    def overlapping(self, lo: float, hi: float) -> list[tuple[float, float, str]]:
        """The mapped ranges that overlap ``(lo, hi)`` (end > lo, start < hi), in the
        capture's order."""
        first = int(np.searchsorted(self._reach, lo, side="right"))
        last = int(np.searchsorted(self._starts, hi, side="left"))
        if last <= first:
            return []
        idx = self._order[first:last]
        idx = np.sort(idx[self._ends[idx] > lo])
        return [self.mapped[i] for i in idx.tolist()]


def _mapped_nets(trace: Trace, ranges: _MappedRanges, lay: StepLayout,
                 prof=None, held=()) -> dict[str, float]:
    """Per CPU item: the step's mapped ranges, net of the API calls (and blocking), of
    other mapped ranges and of the ``held`` ranges (``(start, end, µs)``) inside them, clipped
    to the item's region; with ``prof``, also net of the profiler's own cost in what is left
    (the events outside those calls and ranges)."""
    if not ranges.mapped:
        return {}
    s0, e0 = columns(trace, "spans", "start_us", "end_us")
    sched0 = s0[lay.sched_calls[0]] if lay.sched_calls else s0[lay.first_forward]
    top = lay.top_sync
    a_end = s0[top] if top is not None else sched0
    windows = {"ingest": (lay.start, a_end), "schedule": (lay.start, a_end),
               "prepare": (e0[top], sched0) if top is not None else (lay.start, a_end),
               "process_result": (s0[lay.result_sync], lay.end)
               if lay.result_sync is not None else (lay.end, lay.end)}
    mapped = ranges.overlapping(lay.start, lay.end)
    calls = [(s0[c], e0[c]) for c in lay.calls]
    out: dict[str, float] = {}
    for a, b, item in mapped:
        lo, hi = windows[item]
        a2, b2 = max(a, lo), min(b, hi)
        if b2 <= a2:
            continue
        inner = calls + [(x, y) for x, y, it in mapped if (x, y, it) != (a, b, item)
                         and x >= a and y <= b] + [(x, y) for x, y, _ in held]
        net = (b2 - a2) - _covered(inner, a2, b2)
        if prof is not None:
            net = prof.less_outside(net, a2, b2, merged(inner, a2, b2))
        out[item] = out.get(item, 0.0) + net
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
