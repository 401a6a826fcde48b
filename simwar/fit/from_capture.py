"""Fit a complete, runnable config from an imported capture: the whole overlap loop.

``simwar import CAPTURE --mapping M --fit -o fitted.yaml`` writes what
:func:`fit_model` returns for the capture :func:`simwar.capture.open.open_capture` opened
(its sizes already read): a config (``algorithm: custom``) that the builder
turns into the capture's own loop, so that ``simwar run fitted.yaml``
reproduces the capture and ``--set`` asks what-if questions of it.

:mod:`simwar.fit.layout` finds each step's pieces (schedule calls, the
forward's units, syncs, host regions); :mod:`simwar.capture.sizes` read each step's batch
and graph bucket when the capture was opened; :mod:`simwar.fit.policy` reads which stream
is which and the barrier policy; :mod:`simwar.fit.samples` measures, per step, the
phases' device time, the schedule-stream work, the host costs and the CPU work;
:mod:`simwar.fit.receive` the host's work of receiving requests where the capture names it in
ranges (``cpu.receive_us``, out of the other host figures).
This module checks the capture and mapping, leaves out the steps the profiler stalled
(:mod:`simwar.fit.profiler`), reads each step's shape and takes the prefill's units out of
the steps that prefill (:mod:`simwar.fit.shapes`: a capture whose steps prefill gets the
``prefill`` and ``scheduling`` sections and a workload of requests with prompts), keeps the
steps that share one structure, assembles the
config (its phases, policy and streams) and fits every per-step sample set: against the
step's size where the batch changes (:func:`simwar.fit.affine.fit_sized`: affine in the
real batch, or for a graph phase's device time in its bucket, or a constant where the
slope is not significant), else as :func:`simwar.fit.durations.fit_values` does
(``--dist``). A capture whose batch changes gets a ``workload:`` section, its own batch
sequence and graph buckets, so that the fitted config replays it step by step. The header
says where each figure came from. Errors a user can cause are :class:`FitError`, one line.

Imports: numpy, the standard library and simwar (the samples' CPU work runs the
simulator).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from simwar.capture.accesses import capture_accesses
from simwar.capture.mapping import CPU_ITEMS, Mapping, unmatched_keys
from simwar.capture.open import Capture
from simwar.capture.sizes import CaptureSizes, SizesError
from simwar.config import ConfigError, load_config
from simwar.config.schema import RULE_SHAPES
from simwar.core.trace import Mode, OpKind, Trace
from simwar.fit.affine import SizedFit, fit_per_bucket, fit_sized
from simwar.fit.durations import fit_values
from simwar.fit.layout import Roles, drop_columns, step_layouts
from simwar.fit.policy import POLICIES, PolicyInference, detect_roles, infer_policy
from simwar.fit.profiler import (
    CUPTI_NOTE,
    RescaleError,
    left_out_line,
    left_out_steps,
    rescale_buckets,
    rescale_to,
)
from simwar.fit.profiler_cost import KINDS as PROFILED_KINDS
from simwar.fit.profiler_cost import CostTable, ProfilerCost, for_capture
from simwar.fit.receive import held_by_step, receive_line, receive_lines, receive_ranges
from simwar.fit.samples import COST_DEFAULTS, Samples, sample_cpu_work, sample_device_and_costs
from simwar.fit.shape_workload import shape_workload
from simwar.fit.shapes import (
    SHAPE_ORDER,
    ShapeError,
    classify,
    give_back,
    idle_samples,
    idle_section,
    prefill_section,
    prefill_step_host,
    rule_of,
    split_host,
    split_prefill,
)

#: steps of a fitted config, and its warm-up
FIT_STEPS, FIT_WARMUP = 300, 20


class FitError(ValueError):
    """The capture cannot be fitted as asked; the message is one line."""


@dataclass
class ModelFit:
    """``config``: the runnable config; ``header``: the comment lines written above it.

    A capture whose batch changes: ``config["workload"]["batch_sizes"]`` is its batch
    sequence, which :meth:`config_for_file` moves into a CSV file (``batch_sizes_file``)
    that the CLI writes beside the config; ``left_out``: the steps the profiler stalled,
    which a check leaves out on both sides.
    """

    config: dict
    header: list[str]
    details: dict[str, dict]
    policy: PolicyInference
    roles: Roles
    warnings: list[str] = field(default_factory=list)
    sizes: CaptureSizes | None = None
    fits: dict[str, SizedFit] = field(default_factory=dict)
    left_out: dict[int, str] = field(default_factory=dict)
    scale: float = 1.0  # every device time x this (--unprofiled-step-us)
    host_scale: float = 1.0  # every host time x this (--unprofiled-step-us per bucket)

    @property
    def batches(self) -> list[int] | None:
        wl = self.config.get("workload")
        return list(wl["batch_sizes"]) if wl and "batch_sizes" in wl else None

    def config_for_file(self, batches_file: str) -> dict:
        """The config as written beside ``batches_file`` (its batch sequence in that CSV)."""
        cfg = dict(self.config)
        if self.batches is not None:
            wl = {k: v for k, v in cfg["workload"].items() if k != "batch_sizes"}
            cfg["workload"] = {"batch_sizes_file": batches_file, **wl}
        return cfg


def batches_csv(batches: list[int]) -> str:
    """The CSV text of a batch sequence (``batch_size`` column, one row per step)."""
    return "step,batch_size\n" + "".join(f"{k},{b}\n" for k, b in enumerate(batches))


#: the fit's walks over the steps a progress bar counts (:func:`fit_model`): the layouts,
#: the policy, the device times and costs, the CPU work, the fits and the header
FIT_STAGES = 5


def fit_model(cap: Capture, *, capture: str = "",
              mapping_name: str = "", dist: str = "best", policy: str | None = None,
              steps: int = FIT_STEPS, warmup: int = FIT_WARMUP, version: str = "",
              where: str = "", unprofiled_step_us: float | dict | None = None,
              profiler_cost: CostTable | str | bool | None = True,
              extrapolate_buckets: bool = False, launch_shares: bool = False,
              progress=None) -> ModelFit:
    """The whole loop of an opened capture (a :class:`simwar.capture.open.Capture`) as a
    config.

    ``capture`` and ``mapping_name`` are the names the header cites (default: the capture's
    file and mapping file), ``where`` the name errors start with (default: ``capture``).
    ``unprofiled_step_us``: rescale the device time to this mean step time, or device and
    host time to these per-bucket step times (``{bucket: µs}``:
    :func:`simwar.fit.profiler.rescale_buckets`). ``profiler_cost``: True (the default)
    subtracts the profiler's own host cost by the capture's event counts with the shipped
    table (:mod:`simwar.fit.profiler_cost`), a :class:`~simwar.fit.profiler_cost.CostTable`
    or a table file with that one; False or None keeps it (``--keep-profiler-cost``: the fit
    of the capture's host times as they stand). ``extrapolate_buckets``: a graph phase's
    per-bucket table gives the graph buckets the capture never ran too, from the line over
    the measured ones (else they are left out, and warned of). ``launch_shares``: an eager
    prefill's launches each take their measured share of its host and device time
    (``prefill.host_shares``, ``device_shares``: :mod:`simwar.fit.launches`), else equal
    shares (the default: calibration/README.md, "Each launch its own share", says why). A
    capture bound by other means (a
    :class:`simwar.capture.to_trace.KinetoImport` and its mapping) is finished with
    :func:`simwar.capture.open.finish_capture` first. ``progress(done, total)``: called after
    each of the fit's walks over the steps (``FIT_STAGES`` in all: the CLI's bar on a
    terminal).
    """
    done = iter(range(1, FIT_STAGES + 1))

    def stage() -> None:
        if progress is not None:
            progress(next(done), FIT_STAGES)

    imp, mapping = cap.bound, cap.mapping
    capture = capture or (cap.paths[0].name if cap.paths else "")
    mapping_name = mapping_name or cap.mapping_file or ""
    trace: Trace = imp.trace
    warnings: list[str] = []
    where = where or capture or trace.meta.get("file", "capture")
    if len(trace.ops) == 0 or not np.any(trace.ops.kind == OpKind.KERNEL):
        raise FitError(f"{where}: no device work in the capture (nothing to fit)")
    mname = mapping_name or cap.label
    check_mapping(imp, mapping, mname)
    try:
        sizes = cap.sized()
    except SizesError as e:
        raise FitError(str(e)) from None
    left_out = left_out_steps(imp, mapping)
    roles, role_notes = detect_roles(trace, mapping)
    all_lays = step_layouts(trace, roles)
    stage()
    warm = int(trace.meta.get("warmup_steps", 0))
    lays = {k: v for k, v in all_lays.items() if k >= warm and k - 1 in all_lays
            and k not in left_out}
    prof = None
    if profiler_cost is not None and profiler_cost is not False:
        prof = for_capture(imp, None if profiler_cost is True else profiler_cost)
    try:
        kinds = classify(cap, where)
    except ShapeError as e:
        raise FitError(str(e)) from None
    # the receive ranges' time is cpu.receive_us alone: out of the other host figures
    received = receive_ranges(imp, mapping.receive, lays, prof)
    held = held_by_step(received)
    fitted, (lays, prefills) = lays, split_prefill(trace, lays, kinds, prof)
    idle = idle_samples(trace, fitted, kinds, prof)
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
    mapping = _regex_reads(imp, mapping, names)
    optional = mapping.soft.get("reads", set())
    unknown = [p for p in mapping.reads if p not in names and p not in optional]
    if unknown:
        raise FitError(f"{mname}: reads: '{unknown[0]}' is not a phase of "
                       f"the capture ({', '.join(names)})")
    if any(p not in names for p in mapping.reads):  # a preset's reads of absent phases
        mapping = _with_reads(mapping, {p: b for p, b in mapping.reads.items() if p in names})

    readers = tuple(i for i, n in enumerate(names) if n in mapping.reads)
    inferred = infer_policy(trace, lays, roles, imp.counts.get("cuda_sync", 0), readers)
    stage()
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

    s = Samples()
    graph_cost = sample_device_and_costs(trace, lays, names, mapping, s, prof)
    stage()
    cfg = _config(trace, lays, roles, names, mapping, pol, steps, warmup, capture)
    cpu_notes = sample_cpu_work(trace, imp, lays, mapping, names, cfg, s, graph_cost, warnings,
                                prof, held)
    give_back(s, names, prefills)
    excess = split_host(s, prefills, names[0] if names else None) + prefill_step_host(
        trace, fitted, lays, prefills, prof, sizes.batch if sizes.varying else None, held)
    stage()
    details: dict[str, dict] = {}
    if graph_cost["cost"]:  # the cheapest graph's launches sample costs.graph_launch_us
        cheapest = min(graph_cost["cost"], key=lambda i: float(np.mean(graph_cost["cost"][i])))
        for k, v in zip(sorted(lays), graph_cost["cost"][cheapest]):
            s.add("costs.graph_launch_us", v, k)
    fits: dict[str, SizedFit] = {}
    buckets = graph_buckets(sizes)
    _fill(cfg, s, dist, details, sizes if sizes.varying else None, fits, extrapolate_buckets,
          buckets)
    shape_lines = _shapes(cfg, kinds, prefills, lays, sizes, mapping, warnings, excess, idle,
                          buckets, launch_shares)
    if sizes.varying and not shape_lines:
        _workload(cfg, sizes, warm, warnings, buckets)
    receive, how_r = receive_line(received)
    if receive is not None:
        cfg["cpu"]["receive_us"] = receive
    try:
        load_config(cfg)
    except ConfigError as e:  # pragma: no cover - the fit writes only valid values
        raise FitError(f"{where}: the fitted config is invalid: {e}") from None
    scale, host_scale = 1.0, 1.0
    if unprofiled_step_us is not None:
        try:
            if isinstance(unprofiled_step_us, dict):
                cfg, scale, host_scale, _ = rescale_buckets(cfg, unprofiled_step_us)
            else:
                cfg, scale, _ = rescale_to(cfg, unprofiled_step_us)
        except RescaleError as e:
            raise FitError(f"{where}: {e}") from None
    for key, f in fits.items():
        if f.left_out:
            warnings.append(f"{key}: {_buckets(f.left_out)} ran in no fitted step of the "
                            f"capture: the fitted config refuses a run that reaches "
                            f"{'them' if len(f.left_out) > 1 else 'it'} (fit with "
                            f"--extrapolate-buckets to extrapolate from the measured buckets)")
        if f.extrapolated:
            line = ("the line over the measured buckets" if len(f.sizes) > 1
                    else f"the one measured bucket ({f.sizes[0]}), as a constant")
            warnings.append(f"{key}: {_buckets(f.extrapolated)} ran in no fitted step of the "
                            f"capture: extrapolated from {line}"
                            + (" (--extrapolate-buckets)" if extrapolate_buckets else
                               " (the capture's own batches reach them)"))
    header = _header(trace, lays, all_lays, roles, role_notes, names, pol, s, graph_cost,
                     cpu_notes, capture, mapping_name, version, warm, mapping)
    header.append(profiler_cost_line(prof, lays))
    wl = cfg.get("workload") or {}
    header += receive_lines(receive, how_r, received, len(fitted),
                            replay=not ({"arrivals", "closed_loop"} & set(wl)))
    header += shape_lines
    header += _sized_header(sizes, fits, left_out, set(all_lays), warm, (scale, host_scale),
                            unprofiled_step_us, cfg.get("workload"))
    stage()
    drop_columns(trace)  # the walks' views of the trace's columns: not kept past the fit
    return ModelFit(cfg, header, details, pol, roles, warnings, sizes, fits, left_out, scale,
                    host_scale)


def profiler_cost_line(prof: ProfilerCost | None, lays) -> str:
    """The header's line on the profiler's own host cost: what was subtracted (events
    counted per fitted step, µs per step), or that it was kept."""
    if prof is None:
        return ("Profiler cost kept (--keep-profiler-cost): host times are the profiled "
                "run's as captured.")
    if not prof.times:
        return ("Profiler cost: none subtracted (no profiler-recorded events in the import: "
                "the capture says it was not profiled, e.g. a simulation written as one).")
    n = len(lays)
    counts: Counter = Counter()
    for lay in lays.values():
        counts.update(prof.counts(lay.start, lay.end))
    removed = sum(prof.us(lay.start, lay.end) for lay in lays.values()) / max(n, 1)
    per = ", ".join(f"{k} {counts[k] / max(n, 1):.1f}" for k in PROFILED_KINDS if counts[k])
    return (f"Profiler cost subtracted from host times: per fitted step the profiler recorded "
            f"{per or 'no events'} on the host thread, {removed:.1f} µs at the measured µs "
            f"per event ({prof.table.describe()}, docs/profiler-cost.md), taken out of the "
            f"host durations that hold them, never below zero; --keep-profiler-cost keeps it.")


def _shapes(cfg: dict, kinds, prefills: dict, lays, sizes: CaptureSizes, mapping: Mapping,
            warnings: list[str], excess: float = 0.0, idle=None, buckets: list[int] = (),
            launch_shares: bool = False) -> list[str]:
    """A capture whose steps prefill: the config's ``prefill`` and ``scheduling`` sections
    (with ``idle``, the capture's idle steps, :func:`simwar.fit.shapes.idle_samples`:
    ``scheduling.idle``) and a workload of requests with prompts (:mod:`simwar.fit.shapes`);
    the header's lines (none for a capture that prefills nothing)."""
    fitted = {k: p for k, p in prefills.items() if p.shape in ("prefill", "mixed")}
    if idle and not fitted:
        warnings.append(f"{len(idle)} idle steps (a forward with no request) not fitted: "
                        f"scheduling.idle needs requests that arrive, and the capture "
                        f"prefills none (its batches are replayed)")
    if not fitted:
        mixed = len(kinds.steps("mixed"))
        if mixed:  # its prefill's kernels are the decode phases' (no phase named prefill)
            warnings.append(f"{mixed} mixed steps, but no forward kernel of theirs is of the "
                            f"phase 'prefill': fitted as decode steps (name the prefill's "
                            f"kernels or range in the mapping's phases: {{'^prefill$': "
                            f"prefill}})")
        return []
    steps = sorted(set(lays) | set(fitted))
    for k, p in fitted.items():  # the decoding requests its launches run at (0: a prefill
        p.batch = 0 if p.shape == "prefill" else (  # step of its own decodes none)
            int(sizes.batch[k]) if sizes.varying and k < len(sizes.batch)
            else int(cfg["batch_size"]))
    section, lines = prefill_section(fitted, sorted({b for r in mapping.reads.values()
                                                     for b in r}) or ["req_to_token"], excess,
                                     lambda batch: launch_cost(cfg["costs"], batch), kinds,
                                     launch_shares)
    rule = rule_of(kinds, steps)
    cfg["prefill"] = section
    cfg["scheduling"] = {"rule": rule}
    idle_lines: list[str] = []
    if idle:
        cfg["scheduling"]["idle"], idle_lines = idle_section(idle)
        steps = sorted(set(steps) | set(idle))
    seen = kinds.counts(steps)
    batch = {k: int(sizes.batch[k]) for k in steps if k < len(sizes.batch)} \
        if sizes.varying else {k: int(cfg["batch_size"]) for k in steps}
    accept = float(cfg["accept"]["tokens"])
    bounds = [(lays[k].start, lays[k].end) for k in lays]
    span = (max(b for _, b in bounds) - min(a for a, _ in bounds)) if bounds else 1.0
    wl, wl_line = shape_workload(kinds, steps, batch, accept, span, buckets,
                                 section["chunk_tokens"])
    cfg["workload"] = wl
    never = [s for s in ("decode", "prefill", "mixed") if s not in seen
             and s in RULE_SHAPES[rule]]
    if never:
        warnings.append(f"the capture ran no {' or '.join(never)} step: the fitted "
                        f"{' and '.join(never)} costs are the other shapes' (scheduling.rule "
                        f"{rule} runs {' and '.join(never)} steps)")
    rule_why = ("prefill steps of their own between decode steps" if rule == "sglang" else
                "prefill chunks inside decode steps")
    return ["Shapes: " + ", ".join(f"{seen[s]} {s}" for s in SHAPE_ORDER if seen.get(s))
            + f" steps fitted; scheduling.rule {rule} ({rule_why}); the decode phases from "
            f"the decode and mixed steps, the prefill from the steps that prefill.", *lines,
            *idle_lines, wl_line]


def _regex_reads(imp, mapping: Mapping, names: list[str]) -> Mapping:
    """A mapping file's ``reads`` key that is no phase but a regex of kernels or ranges
    (simwar.capture.accesses) read by the phases of the device ops it maps; one that maps
    none is left for the check of phase names."""
    optional = mapping.soft.get("reads", set())
    keys = [k for k in mapping.reads if k not in names and k not in optional]
    if not keys:
        return mapping
    sub = mapping.model_copy(update={"reads": {k: mapping.reads[k] for k in keys},
                                     "writes": {}})
    sub._soft, sub._origin = {}, mapping.origin
    try:
        implied = _phase_reads(imp, sub)
    except ConfigError:
        return mapping
    reads = {k: list(v) for k, v in mapping.reads.items() if k not in keys}
    for phase, buffers in implied.items():
        reads[phase] = reads.get(phase, []) + [b for b in buffers if b not in reads.get(phase, [])]
    return _with_reads(mapping, reads)


def _phase_reads(imp, mapping: Mapping) -> dict[str, list[str]]:
    """Per phase of the capture, the buffers its device ops read by the mapping's ``reads``
    (phase keys and regexes alike: :func:`simwar.capture.accesses.capture_accesses`)."""
    acc = capture_accesses(imp, mapping).accesses
    ops, trace = imp.trace.ops, imp.trace
    out: dict[str, list[str]] = {}
    for op, b, m in zip(acc.op, acc.buffer, acc.mode):
        if m != Mode.READ:
            continue
        phase = trace.text(int(ops.phase[op]))
        if phase and b not in out.setdefault(phase, []):
            out[phase].append(b)
    return out


def _with_reads(mapping: Mapping, reads: dict) -> Mapping:
    out = mapping.model_copy(update={"reads": reads})
    out._soft, out._origin = mapping.soft, mapping.origin
    return out


def _workload(cfg: dict, sizes: CaptureSizes, warm: int, warnings: list[str],
              buckets: list[int]) -> None:
    """The fitted config replays the capture's own batches, step by step (its own length, to
    its last step with forward work: the drain after it runs no batch)."""
    ran = np.flatnonzero(sizes.batch > 0)
    batch = [int(b) for b in sizes.batch[:int(ran[-1]) + 1].tolist()] if len(ran) else [1]
    filled = 0
    last = next((b for b in batch if b > 0), 1)
    for k, b in enumerate(batch):  # a step without device work keeps the batch before it
        if b <= 0:
            batch[k] = last
            filled += 1
        last = batch[k]
    if filled:
        warnings.append(f"{filled} steps without a batch (no device work) replay the batch "
                        f"before them")
    wl: dict = {"batch_sizes": batch}
    if buckets:
        wl["graph_buckets"] = buckets
    cfg["workload"] = wl
    if len(batch) >= warm + 3:  # replay the capture's steps one for one
        cfg["steps"] = len(batch)
        cfg["warmup_steps"] = warm


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


def _config(trace, lays, roles, names, mapping: Mapping, pol: PolicyInference, steps, warmup,
            capture) -> dict:
    """The fitted config's skeleton: its phases, policy and streams, every duration 0."""
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


def graph_buckets(sizes: CaptureSizes) -> list[int]:
    """The graph buckets the capture's decode steps ran (an idle step's graph of batch 0, as
    a graph launched for no request reads, is none: the config's buckets are batches >= 1)."""
    return [int(b) for b in sizes.buckets or () if b > 0]


#: keys whose size is the batch of the step whose result is processed (k-1 in step k)
PREVIOUS_STEP = ("cpu.process_result_us", "gpu.result_writes_us")


def _size_of(key: str, cfg: dict, sizes: CaptureSizes, steps: list[int]):
    """``(size name, sizes)`` one sample of ``key`` ran at: the config's rule (a graph
    phase's prep/body the bucket, everything else the real batch; result processing the
    previous step's)."""
    parts = key.split(".")
    graph = parts[0] == "phases" and parts[2] in ("prep_us", "body_us") and any(
        p["name"] == parts[1] and p["graph"] != "eager" for p in cfg["phases"])
    shift = 1 if key in PREVIOUS_STEP else 0
    idx = np.clip(np.asarray(steps, dtype=np.int64) - shift, 0, len(sizes.batch) - 1)
    return ("bucket", sizes.bucket[idx]) if graph else ("batch", sizes.batch[idx])


def _fit_key(key: str, values, cfg: dict, s: Samples, dist: str,
             sizes: CaptureSizes | None, fits: dict, extrapolate: bool = False,
             buckets: list[int] = ()):
    if sizes is None:
        return _fit(values, dist)
    size, x = _size_of(key, cfg, sizes, s.steps_of(key))
    if size == "bucket" and buckets:  # a graph phase's device time: its bucket's
        reached = {int(v) for v in sizes.bucket[sizes.batch > 0].tolist()}  # by the replay
        f = fit_per_bucket(values, x, dist, buckets, extrapolate, reached)
    else:  # a line, clamped >= 0 from batch 0 up (it never falls)
        f = fit_sized(values, x, dist, size)
    fits[key] = f
    return f.value, f.detail


def _fill(cfg: dict, s: Samples, dist: str, details: dict,
          sizes: CaptureSizes | None = None, fits: dict | None = None,
          extrapolate: bool = False, buckets: list[int] = ()) -> None:
    """Write each sampled key into the config as a fitted distribution (or a constant);
    with ``sizes`` (a capture whose batch changes), against each sample's size (a graph
    phase's device time per bucket of ``buckets``, :func:`graph_buckets`; ``extrapolate``:
    its buckets the capture never ran too)."""
    fits = {} if fits is None else fits
    for key, values in s.items():
        if not values:
            continue
        parts = key.split(".")
        if parts[0] == "costs":
            continue
        value, detail = _fit_key(key, values, cfg, s, dist, sizes, fits, extrapolate, buckets)
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
            costs[name], details[f"costs.{name}"] = _fit_key(f"costs.{name}", values, cfg, s,
                                                            dist, sizes, fits,
                                                            buckets=buckets)
        else:
            costs[name] = _r(float(np.mean(values))) if values else default
    values = s.get("costs.wait_stream_us")
    if values and len(values) >= 3:
        costs["wait_stream_us"], details["costs.wait_stream_us"] = _fit_key(
            "costs.wait_stream_us", values, cfg, s, dist, sizes, fits, buckets=buckets)
    else:
        costs["wait_stream_us"] = _r(duration_mean(costs["event_record_us"])
                                     + duration_mean(costs["wait_event_us"]))
    costs["host_call_us"] = 0.0
    cfg["costs"] = {k: costs[k] for k in ("launch_us", "event_record_us", "wait_event_us",
                                          "wait_stream_us", "graph_launch_us", "sync_us",
                                          "sync_wake_us", "cross_stream_us", "host_call_us")}


def launch_cost(costs: dict, batch: int) -> float:
    """A kernel launch's host cost in a fitted config at a step's batch: ``launch_us`` (an
    affine one at that batch, its noise's mean included) plus ``host_call_us``."""
    v = costs["launch_us"]
    at = duration_mean(v)
    if isinstance(v, dict) and "base" in v:
        at += float(v.get("per_seq", 0.0)) * batch
    return at + duration_mean(costs.get("host_call_us", 0.0))


def duration_mean(v) -> float:
    """A fitted duration's mean (an affine one's at size 0, its noise's mean included; a
    per-bucket table's over its buckets), as fitted or as a loaded config dumps it (its
    unused keys None)."""
    if isinstance(v, dict):
        if v.get("mean") is not None:
            return float(v["mean"])
        if v.get("per_bucket"):
            return float(np.mean(list(v["per_bucket"].values())))
        if v.get("low") is not None and v.get("high") is not None:
            return (float(v["low"]) + float(v["high"])) / 2
        if v.get("base") is not None:
            return float(v["base"]) + (duration_mean(v["noise"]) if v.get("noise") else 0.0)
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
def _header(trace, lays, all_lays, roles, role_notes, names, pol, s, graph_cost, cpu_notes,
            capture, mapping_name, version, warm, mapping=None) -> list[str]:
    n_steps = len(trace.meta.get("step_names") or []) or len(all_lays)
    preset, how = mapping.origin if mapping is not None else ("", "")
    via = (f" with the mapping {mapping_name}" if mapping_name else "") + (
        f"{' on' if mapping_name else ' with'} the preset {preset} ({how})" if preset else "")
    args = (f"--preset {preset} " if preset and how == "--preset" else "") + (
        f"--mapping {mapping_name} " if mapping_name else "")
    lines = [f"Fitted by simwar {version} (`simwar import --fit`) from {capture or 'a capture'}"
             + (via or " (no mapping)") + ".",
             f"{n_steps} steps in the capture; {len(lays)} fitted (after the warm-up of "
             f"{warm}). `simwar import {capture or 'CAPTURE'} {args}"
             "--check THIS_FILE` compares a simulation of this file with the capture."]
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


def _sized_header(sizes: CaptureSizes, fits: dict, left_out: dict, counted: set, warm: int,
                  scales: tuple, unprofiled, workload: dict | None) -> list[str]:
    """The header's lines on sizes, what each key was fitted on, and the profiler."""
    lines = []
    left = left_out_line(left_out, {k for k in counted if k >= warm})
    if left:
        lines.append(f"Left out: {left} (--check leaves them out too).")
    lines.append(f"Profiler: {CUPTI_NOTE}.")
    if isinstance(unprofiled, dict):
        given = ",".join(f"{b}={us:.1f}" for b, us in unprofiled.items())
        lines.append(f"  --unprofiled-step-us {given}: every device time x {scales[0]:.4f} and "
                     f"every host time x {scales[1]:.4f}, so that each bucket's simulated mean "
                     f"step time is the one given (least squares).")
    elif unprofiled is not None:
        lines.append(f"  --unprofiled-step-us {unprofiled:g}: every device time x "
                     f"{scales[0]:.4f}, so that the simulated mean step time is "
                     f"{unprofiled:g} µs.")
    if not sizes.varying or not workload:
        return lines
    buckets = workload.get("graph_buckets")  # the fit's own (graph_buckets)
    wl_buckets = f", graph_buckets {buckets}" if buckets else ""
    if "batch_sizes" in workload:  # else requests with prompts: the shapes' header says
        n = len(workload["batch_sizes"])
        lines.append(f"Workload: the capture's own {n} batches (batch_sizes_file)"
                     f"{wl_buckets}: `--check` replays them step by step and reports each "
                     f"bucket; `--set 'workload={{arrivals: {{rate_per_s: R}}, max_batch: N, "
                     f"...}}'` asks another load.")
    lines += [f"  {note}" for note in sizes.notes]
    lines.append("Durations that follow the step's size (a graph phase's device time per "
                 "bucket, each bucket's measured mean; else least squares: a slope counts when "
                 "|t| >= 3, else the samples' distribution; the residual is the noise):")
    for key, f in fits.items():
        lines.append(f"  {key}: {f.text()}")
    clamped = [key for key, f in fits.items() if f.clamped]
    if clamped:
        lines.append(f"Clamped: {', '.join(clamped)}: each line's base raised so that it is "
                     f">= 0 at every batch the config can run (0, a prefill-only step, to the "
                     f"largest graph bucket or batch seen).")
    extrapolated = {key: f.extrapolated for key, f in fits.items() if f.extrapolated}
    missing = {key: f.left_out for key, f in fits.items() if f.left_out}
    if extrapolated:
        lines.append("Extrapolated (in no fitted step; --extrapolate-buckets, or reached by the "
                     "capture's own batches): "
                     + "; ".join(f"{key} at {_buckets(b)}" for key, b in extrapolated.items())
                     + ", from the line over the measured buckets.")
    if missing:
        lines.append("Not in the per-bucket tables (in no fitted step; a run that reaches one "
                     "is refused, --extrapolate-buckets fills them): "
                     + "; ".join(f"{key} {_buckets(b)}" for key, b in missing.items()) + ".")
    return lines


def _buckets(sizes: list[int]) -> str:
    return f"graph bucket{'s' if len(sizes) > 1 else ''} {', '.join(map(str, sizes))}"


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
