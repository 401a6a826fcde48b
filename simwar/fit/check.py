"""Capture against simulation: the figures ``simwar import --check`` prints side by side.

:func:`check_rows` takes the capture's summary (:func:`simwar.capture.stalls.import_report`'s
``metrics``) and a simulation's summary (:func:`simwar.analysis.metrics.summarize`, the
same code) and returns one :class:`Row` per figure with its error. Three figures carry the
acceptance bounds a fitted config must meet on the capture it was fitted from
(:data:`ACCEPTANCE`): the mean step time within 2 %, the mean forward gap within
max(10 µs, 10 %) and the mean launch-ahead depth within 0.05. The others are shown with
their errors for reading, not judged.

A capture whose batch changes every step (``meta.workload``: :mod:`simwar.capture.sizes`)
and a simulation of its fitted config (which replays the capture's batches) are also
compared per graph bucket (:func:`bucket_rows`): each bucket's mean step time within 2 % and
mean forward gap within max(10 µs, 10 %), judged where both sides ran the bucket at least
:data:`BUCKET_MIN_STEPS` times.

A capture whose steps prefill (:mod:`simwar.fit.shapes`: prefill steps of their own, or
chunks mixed into decode steps) is fitted to a config whose run picks each step's shape from
its own queue of arriving requests, so its steps are not the capture's one for one: the rows
above are shown but not judged, and each shape is compared instead (:func:`shape_rows`): its
step time (the step's gap plus its forward), forward and gap, the simulated ones at the
capture's sizes and after the capture's shapes, the step time within 3 % for every shape
the capture ran (a shape the simulation never ran misses). The simulation's steps that waited
for a request are left out as the capture's ``idle`` steps are. One run's shape figures move
with its seed (its queue picks which steps are mixed and at what sizes) by more than that
bound, so the config is run :data:`SHAPE_SEEDS` times, seeds ``seed`` onwards, and each
shape judged on their steps together (:func:`pool_frames`); each run's own error is printed
beside it (:func:`seed_spread_line`).

**The profiler's cost**: the default fit takes the profiler's own host cost out of the
capture's host times (:mod:`simwar.fit.profiler_cost`), so the fitted config is the
unprofiled server; the check compares it with the profiled capture after adding that cost
back to each host duration (:func:`profiler_back`: the fit that keeps it, made with the
arguments the checked one was made with, less the checked fit, per key;
:func:`with_profiler`). ``--keep-profiler-cost`` says the checked config holds it already
(fitted with that flag): nothing is added.

Steps that are not the loop's own (the profiler's stalls, the loop waiting for requests:
:func:`simwar.fit.profiler.left_out_steps`) are left out of both sides, with the steps before
and after each (a stall in iteration k delays forward k or k+1: the step time of k-1 or k, the
forward gap of k or k+1): :func:`summary_without`.

A capture whose mapping names no ``run_batch`` annotation times each launch at the
forward's first launch call (the importer's rule); :func:`relaunch` re-times a
simulation's launch figures the same way, so that both sides are measured alike.

:func:`check_fit` is the whole check: it simulates a fitted config, compares it with the
capture (a :class:`simwar.capture.open.Capture`) by the rows above and words the verdict;
``simwar import --check`` prints what it returns.

Imports: numpy, pandas (through :mod:`simwar.analysis.metrics`), the standard library, the
simulator (:func:`simwar.api.simulate`) and the fit's own modules.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from simwar.analysis.metrics import launch_ahead_depth, measured, step_frame, summarize
from simwar.analysis.views import forward_kernels
from simwar.api import simulate
from simwar.config import load_config
from simwar.config.load import get_dotted
from simwar.fit.compare import compare_figure, figure
from simwar.fit.durations import shift
from simwar.fit.from_capture import FitError, check_mapping, duration_mean, fit_model
from simwar.fit.profiler import host_keys, left_out_line, left_out_steps
from simwar.fit.profiler_cost import for_capture
from simwar.fit.shape_check import (
    SHAPE_FIGURES,
    SHAPE_MIN_STEPS,
    SHAPE_STEP_REL,
    at_sizes,
    shape_frame,
    sim_kinds,
    sim_waits,
)
from simwar.fit.shapes import SHAPE_ORDER, ShapeError, classify

#: (step time relative error, forward gap µs, forward gap relative error, launch-ahead)
ACCEPTANCE = {"step_rel": 0.02, "gap_us": 10.0, "gap_rel": 0.10, "ahead": 0.05}
#: a bucket is judged where both sides ran it at least this many measured steps
BUCKET_MIN_STEPS = 3
#: runs of a fitted config whose steps prefill, seeds ``seed`` .. ``seed + SHAPE_SEEDS - 1``,
#: whose shapes' steps are judged together: a run's queue picks its shapes, so one run's shape
#: figures move with its seed (the H200's mixed captures, 300 steps: the mixed step -7.9 to
#: -0.3 % over seeds 0-3, more than the 3 % bound); eight runs' steps together move by a few
#: tenths of a percent (docs/guide-your-server.md, step 4)
SHAPE_SEEDS = 8


class Row(NamedTuple):
    """One figure of ``simwar import --check``: the capture's, the simulation's, the error."""

    label: str
    key: str
    capture: float
    simulated: float
    error: float  # simulated - capture (relative for "rel" rows)
    kind: str  # rel | abs
    bound: float | None  # the acceptance bound on |error|, None: shown only
    ok: bool | None

    def error_text(self) -> str:
        if not (math.isfinite(self.error)):
            return "-"
        if self.kind == "rel":
            return _plain(f"{100 * self.error:+.2f}") + "%"
        if self.kind == "count":
            return _plain(f"{self.error:+.3f}")
        return _plain(f"{self.error:+.1f}") + " µs"

    def bound_text(self) -> str:
        if self.bound is None:
            return ""
        if self.kind == "rel":
            return f"{100 * self.bound:.0f}%"
        if self.kind == "count":
            return f"{self.bound:.2f}"
        return f"{self.bound:.1f} µs"


def _plain(text: str, signed: bool = True) -> str:
    """A number's text, never a negative zero (``+0.0`` where signed, else ``0.0``)."""
    if text.startswith("-") and not any(c in "123456789" for c in text):
        return ("+" if signed else "") + text[1:]
    return text


def check_rows(capture: dict, simulated: dict) -> list[Row]:
    """One row per figure (see the module docstring), acceptance rows first judged."""
    rows: list[Row] = []

    def rel(label, key, bound=None):
        c = compare_figure(key, figure(capture, key), figure(simulated, key))
        ok = None if bound is None else (math.isfinite(c.relative) and abs(c.relative) <= bound)
        rows.append(Row(label, key, c.measured, c.simulated, c.relative, "rel", bound, ok))

    def ab(label, key, bound=None, kind="abs"):
        c = compare_figure(key, figure(capture, key), figure(simulated, key))
        ok = None if bound is None else (math.isfinite(c.error) and abs(c.error) <= bound + 1e-9)
        rows.append(Row(label, key, c.measured, c.simulated, c.error, kind, bound, ok))

    rel("step time mean", "step_us_mean", ACCEPTANCE["step_rel"])
    rel("step time p50", "step_us_p50")
    rel("step time p99", "step_us_p99")
    ab("forward", "fwd_us_mean")
    gap = figure(capture, "fwd_gap_us_mean")
    ab("forward gap", "fwd_gap_us_mean",
       max(ACCEPTANCE["gap_us"], ACCEPTANCE["gap_rel"] * abs(gap)) if math.isfinite(gap)
       else ACCEPTANCE["gap_us"])
    ab("GPU idle", "gpu_idle_us_mean")
    ab("  on a dependency", "gpu_idle_dep_us_mean")
    ab("  on the host", "gpu_idle_host_us_mean")
    ab("CPU blocked", "cpu_blocked_us_mean")
    sites = sorted({k for d in (capture, simulated) for k in d
                    if k.startswith("cpu_blocked_") and k.endswith("_us_mean")
                    and k != "cpu_blocked_us_mean"
                    and (figure(capture, k) > 0 or figure(simulated, k) > 0)})
    for key in sites:
        ab(f"  {key[len('cpu_blocked_'):-len('_us_mean')]}", key)
    ab("launch lead", "launch_lead_us_mean")
    ab("launch-ahead", "launch_ahead_mean", ACCEPTANCE["ahead"], kind="count")
    ab("run-ahead fraction", "run_ahead_fraction", kind="count")
    return rows


def bucket_rows(capture: dict, simulated: dict, bounds: dict | None = None) -> list[Row]:
    """Per graph bucket (of either side's ``by_bucket``): step time and forward gap, each
    judged against ``bounds`` (default :data:`ACCEPTANCE`) where both sides ran the bucket
    at least :data:`BUCKET_MIN_STEPS` measured steps."""
    bounds = bounds or ACCEPTANCE
    cap, sim = capture.get("by_bucket") or {}, simulated.get("by_bucket") or {}
    rows: list[Row] = []
    for b in sorted({int(x) for x in cap} | {int(x) for x in sim}):
        c, s = cap.get(b, cap.get(str(b), {})), sim.get(b, sim.get(str(b), {}))
        judged = min(c.get("steps", 0), s.get("steps", 0)) >= BUCKET_MIN_STEPS
        cs, ss = figure(c, "step_us_mean"), figure(s, "step_us_mean")
        step = compare_figure("step_us_mean", cs, ss)
        ok = (math.isfinite(step.relative) and abs(step.relative) <= bounds["step_rel"]) \
            if judged else None
        rows.append(Row(f"bucket {b} step", f"by_bucket.{b}.step_us_mean",
                        cs, ss, step.relative, "rel", bounds["step_rel"] if judged else None,
                        ok))
        cg, sg = figure(c, "fwd_gap_us_mean"), figure(s, "fwd_gap_us_mean")
        gap = compare_figure("fwd_gap_us_mean", cg, sg)
        bound = max(bounds["gap_us"], bounds["gap_rel"] * abs(cg)) if math.isfinite(cg) \
            else bounds["gap_us"]
        ok = (math.isfinite(gap.error) and abs(gap.error) <= bound + 1e-9) if judged else None
        rows.append(Row("  forward gap", f"by_bucket.{b}.fwd_gap_us_mean", cg, sg, gap.error,
                        "abs", bound if judged else None, ok))
    return rows


def shape_rows(cap: dict, sim: dict) -> list[Row]:
    """Per step shape (:func:`simwar.fit.shape_check.shape_frame` of each side): its step time,
    forward (device) and forward gap (host), the simulation's at the capture's sizes
    (:func:`simwar.fit.shape_check.at_sizes`); the step time judged within
    :data:`~simwar.fit.shape_check.SHAPE_STEP_REL` where the capture ran the shape at least
    :data:`~simwar.fit.shape_check.SHAPE_MIN_STEPS` measured steps (a miss where the simulation
    ran it fewer times: a config that never runs a shape the capture shows)."""
    rows: list[Row] = []
    for shape in SHAPE_ORDER:
        c, s = cap.get(shape), sim.get(shape)
        if c is None and s is None:
            continue
        nc = len(c["step"]) if c is not None else 0
        ns = len(s["step"]) if s is not None else 0
        judged = nc >= SHAPE_MIN_STEPS  # a shape the simulation never ran is a miss
        for label, col in SHAPE_FIGURES:
            cv = float(np.nanmean(c[col])) if nc and col in c else float("nan")
            sv = at_sizes(s, c, col, shape) if ns and nc and col in s else float("nan")
            if col == "own_us":
                cmp = compare_figure("step_us_mean", cv, sv)
                ok = (ns >= SHAPE_MIN_STEPS and math.isfinite(cmp.relative)
                      and abs(cmp.relative) <= SHAPE_STEP_REL) if judged else None
                rows.append(Row(f"{shape} step", f"by_shape.{shape}.own_us_mean",
                                cv, sv, cmp.relative, "rel",
                                SHAPE_STEP_REL if judged else None, ok))
            else:
                cmp = compare_figure(f"{col}_mean", cv, sv)
                rows.append(Row(f"  {label}", f"by_shape.{shape}.{col}_mean", cv, sv,
                                cmp.error, "abs", None, None))
    return rows


def bucket_steps_line(capture: dict, simulated: dict) -> str:
    """``per bucket steps 8: 55/55, 64: 59/59`` (capture/simulated), '' without buckets."""
    cap, sim = capture.get("by_bucket") or {}, simulated.get("by_bucket") or {}
    keys = sorted({int(x) for x in cap} | {int(x) for x in sim})
    if not keys:
        return ""
    return "  steps per bucket    " + ", ".join(
        f"{b}: {cap.get(b, {}).get('steps', 0)}/{sim.get(b, {}).get('steps', 0)}"
        for b in keys) + " (capture/simulated)"


def summary_without(columns, meta: dict, hazards, steps) -> dict:
    """A run's summary (:func:`simwar.analysis.metrics.summarize`) with the rows of
    ``steps``, and of the steps before and after each, left out (see the module docstring)."""
    drop = set(steps)
    if not drop:
        return summarize(columns, meta, hazards)
    cols = {k: np.array(v, copy=True) for k, v in _columns(columns).items()}
    if "step_us" in cols:
        gone = np.isin(cols["step"], sorted(_around(drop)))
        cols["step_us"] = cols["step_us"].astype(np.float64)
        cols["step_us"][gone] = np.nan
    return summarize(cols, meta, hazards)


def _around(steps) -> set[int]:
    return {k + d for k in steps for d in (-1, 0, 1)}


def _columns(table) -> dict:
    if isinstance(table, dict):
        return table
    return {c: table[c].to_numpy() for c in table.columns}


def accepted(rows: list[Row]) -> bool:
    return all(r.ok for r in rows if r.ok is not None)


def format_rows(rows: list[Row], races: dict) -> str:
    def num(v: float, kind: str) -> str:
        if not math.isfinite(v):
            return "-"
        return _plain(f"{v:.3f}" if kind == "count" else f"{v:.1f}", signed=False)

    lines = [f"  {'':<22}{'capture':>12}{'simulated':>12}{'error':>12}  {'bound':<9}"]
    for r in rows:
        unit = "" if r.kind == "count" else " µs"
        verdict = "" if r.ok is None else ("ok" if r.ok else "MISS")
        lines.append(f"  {r.label + unit:<22}{num(r.capture, r.kind):>12}"
                     f"{num(r.simulated, r.kind):>12}{r.error_text():>12}  "
                     f"{r.bound_text():<9}{verdict}".rstrip())
    lines.append(f"  {'races':<22}{'-':>12}{races.get('latent', 0):>12}  latent "
                 f"(simulated; {races.get('overlaps', 0)} observed overlaps; a capture "
                 f"shows no reads)")
    return "\n".join(lines)


def relaunch(trace, summary: dict, drop=()) -> dict:
    """``summary`` with the launch figures re-timed at each forward's first launch call.

    The builder marks ``run_batch`` before the forward's stream wait and first phase's
    dispatch; a capture without a ``run_batch`` annotation can only time the first forward
    launch. Launch lead, run-ahead fraction and launch-ahead depth are recomputed on the
    measured steps with that launch time (without the rows of ``drop`` and the steps around
    each, as :func:`summary_without`).
    """
    df = step_frame(trace)
    if "step_us" not in df.columns:
        return summary
    ops, spans = trace.ops, trace.spans
    fk = forward_kernels(trace)
    fk = fk[ops.call[fk] >= 0]
    first: dict[int, float] = {}
    for k, t in zip(ops.step[fk].tolist(), spans.start_us[ops.call[fk]].tolist()):
        first[k] = min(first.get(k, t), t)
    launch = np.array([first.get(k, np.nan) for k in df.step.tolist()])
    end = df.fwd_end_us.to_numpy()
    df["launch_lead_us"] = end - np.append(launch[1:], np.nan)
    df["launch_ahead"] = launch_ahead_depth(end, launch)
    m = measured(df, int(trace.meta.get("warmup_steps", 0)))
    if drop:
        m = m[~m.step.isin(sorted(_around(drop)))]
    lead, ahead = m.launch_lead_us.dropna(), m.launch_ahead.dropna()
    out = dict(summary)
    out.update({"launch_lead_us_mean": float(lead.mean()) if len(lead) else float("nan"),
                "run_ahead_fraction": float((lead > 0).mean()) if len(lead) else float("nan"),
                "launch_ahead_mean": float(ahead.mean()) if len(ahead) else float("nan")})
    return out


#: the receive (``{per_request, per_prompt_token}``): its profiler cost is per request
RECEIVE = "cpu.receive_us"


def profiler_back(cap, fitted, fit_args: dict | None = None) -> dict[str, float]:
    """The profiler's own host cost the fit took out of a profiled capture, per host duration
    of the fitted config ``fitted`` (a loaded config or its mapping: the default fit's, the
    profiler's cost taken out; µs per step or per call, the receive's per request received;
    the keys :func:`simwar.fit.profiler.host_keys` names): the mean of the fit that keeps it
    less ``fitted``'s.
    The fit that keeps it is made with ``fit_args`` (:func:`~simwar.fit.from_capture.fit_model`'s
    keyword arguments ``fitted`` was made with: ``dist``, ``policy``, ``unprofiled_step_us``,
    ``extrapolate_buckets``; None: its defaults), so that the two differ by the profiler's
    cost alone. Empty for a capture the profiler recorded no event of (a simulation written
    as a capture)."""
    prof = for_capture(cap.bound)
    if not prof.times:
        return {}
    args = {k: v for k, v in (fit_args or {}).items() if k != "profiler_cost"}
    kept = load_config(fit_model(cap, **args, profiler_cost=False).config).model_dump()
    net = load_config(fitted).model_dump()
    out: dict[str, float] = {}
    for key in host_keys(net):  # the host durations, as a host at another speed scales them
        try:
            if key == RECEIVE:  # the profiler's cost in each range (its own event): per request
                d = get_dotted(kept, key)["per_request"] - get_dotted(net, key)["per_request"]
            else:
                d = duration_mean(get_dotted(kept, key)) - duration_mean(get_dotted(net, key))
        except (KeyError, TypeError):  # a key the fit that keeps it has not (edited by hand)
            continue
        if d > 1e-3:
            out[key] = round(d, 3)
    return out


def with_profiler(cfg, back: dict[str, float]):
    """``cfg`` (a loaded config) with each of ``back``'s host durations raised by its µs: the
    fitted (unprofiled) config as the profiled capture ran it."""
    if not back:
        return cfg
    data = cfg.model_dump()
    items = {}
    for key, us in back.items():
        try:
            value = get_dotted(data, key)
            items[key] = ({**value, "per_request": value["per_request"] + us} if key == RECEIVE
                          else shift(value, us))
        except (KeyError, TypeError):  # a key the checked config does not have (edited)
            continue
    return load_config(cfg, items)


def check_fit(cap, cfg, label: str, steps, file: str, profiler_cost: bool = True,
              fitted=None, fit_args: dict | None = None) -> dict:
    """Simulate the fitted config ``cfg`` (named ``label``) and compare it with the capture
    ``cap`` (``steps``: its per-step table, :func:`simwar.capture.stalls.import_report`'s;
    ``file``: its name in the head line), the steps the profiler stalled left out of both.
    ``profiler_cost``: the fitted config is the unprofiled server's (the fit's default), so
    the profiler's own host cost is added back to it before the comparison
    (:func:`profiler_back`); False: the config holds it already (``--keep-profiler-cost``).
    ``fitted``: the config as fitted, before what-if overrides (default ``cfg``) and
    ``fit_args``: the fit's keyword arguments it was made with (default: the fit's defaults),
    which the profiler's cost is measured against (:func:`profiler_back`).

    A mapping key that matches nothing in the capture is a
    :class:`simwar.fit.from_capture.FitError`. Returns the figures, the verdict (``ok``) and
    the ``text`` ``simwar import --check`` prints.
    """
    imp, mapping = cap.bound, cap.mapping
    check_mapping(imp, mapping, cap.label)
    back = profiler_back(cap, cfg if fitted is None else fitted, fit_args) \
        if profiler_cost else {}
    checked = with_profiler(cfg, back)  # every run's config (the seeds' runs: its copies)
    sim = simulate(checked)
    warm = int(imp.trace.meta.get("warmup_steps", 0))
    left = {k: v for k, v in left_out_steps(imp, mapping).items() if k >= warm}
    captured = summary_without(steps, imp.trace.meta, None, left)
    summary = summary_without(sim.columns if sim.columns is not None else sim.steps, sim.meta,
                              sim.hazards, left)
    if mapping.run_batch is None:  # the capture's launches are its first forward launches
        summary = relaunch(sim.trace, summary, left)
    try:
        kinds = classify(cap, cap.label)
    except ShapeError as e:
        raise FitError(str(e)) from None
    rows = check_rows(captured, summary) + bucket_rows(captured, summary)
    seeds_line = ""
    if kinds.prefills:  # shapes follow each run's queue: judged per shape, at its sizes
        drop = _around(left) | set(range(warm))
        cf = shape_frame(steps, kinds.shape, {k: float(t) for k, t in kinds.tokens.items()},
                         drop)
        runs = [sim_shape_frame(sim, left)] + [
            sim_shape_frame(simulate(checked.model_copy(update={"seed": cfg.seed + i})), left)
            for i in range(1, SHAPE_SEEDS)]
        sf = pool_frames(runs)
        rows = [r._replace(bound=None, ok=None) for r in rows] + shape_rows(cf, sf)
        seeds_line = seed_spread_line(cf, runs, cfg.seed)
    ok = accepted(rows)
    races = {"latent": summary.get("races", 0), "overlaps": summary.get("overlaps", 0)}
    head = (f"check: {label} (simulated {summary.get('steps_measured', 0)} steps) against "
            f"{file} ({captured.get('steps_measured', 0)} steps measured)")
    lines = [head]
    if back:
        lines.append("  profiler cost       added back to the fitted host times (the fit took "
                     "it out; --keep-profiler-cost: the config holds it): "
                     + ", ".join(f"{k} +{v:g} µs" for k, v in list(back.items())[:6])
                     + (f", ... ({len(back)} keys)" if len(back) > 6 else ""))
    note = left_out_line(left)
    if note:
        lines.append(f"  left out            {note}, and the steps around each, on both sides")
    per = bucket_steps_line(captured, summary)
    if per:
        lines.append(per)
    if seeds_line:
        lines.append(seeds_line)
    judged_text = ("step time per shape 3% at the capture's sizes"
                   if kinds.prefills else
                   "step time 2%, forward gap max(10 µs, 10%), launch-ahead 0.05"
                   + ("; per bucket: step time, forward gap"
                      if any(r.key.startswith("by_bucket") for r in rows) else ""))
    if kinds.prefills:
        lines.append("  shapes              "
                     + ", ".join(f"{s}: {_count(cf, s)}/{_count(sf, s)}" for s in SHAPE_ORDER
                                 if s in cf or s in sf)
                     + " steps (capture/simulated); each run's queue picks its shapes, so the "
                       "whole-run figures are shown, not judged; a shape's step is its gap "
                       "plus its forward, the simulation's at the capture's sizes and after "
                       "its shapes")
    verdict = ("  verdict             within the bounds (" + judged_text + ")" if ok else
               "  verdict             MISSED: " + ", ".join(
                   _row_name(r) for r in rows if r.ok is False))
    text = "\n".join(lines + [format_rows(rows, races), verdict])
    return {"name": label, "ok": ok, "text": text, "races": races,
            "rows": [r._asdict() for r in rows], "simulated": summary, "captured": captured,
            "left_out": left, "profiler_back": back}


def sim_shape_frame(sim, left: dict) -> dict:
    """A simulated run's :func:`~simwar.fit.shape_check.shape_frame`: its picked shapes, its
    warm-up, the steps that waited for a request (as the capture's idle steps) and the
    capture's left-out steps (``left``) left out with the steps around each."""
    table = sim.columns if sim.columns is not None else sim.steps
    shapes, tokens = sim_kinds(sim.meta, len(table["step"]))
    sim_warm = int(sim.meta.get("warmup_steps", 0))
    return shape_frame(table, dict(enumerate(shapes)), dict(enumerate(tokens.tolist())),
                       _around(left) | _around(sim_waits(sim.meta)) | set(range(sim_warm)))


def pool_frames(runs: list[dict]) -> dict:
    """The shape frames of several runs as one: each shape's columns concatenated."""
    out: dict[str, dict] = {}
    for shape in SHAPE_ORDER:
        have = [r[shape] for r in runs if shape in r]
        if have:
            out[shape] = {c: np.concatenate([h[c] for h in have]) for c in have[0]}
    return out


def seed_spread_line(cf: dict, runs: list[dict], seed: int) -> str:
    """``seeds ... mixed step -4.0..-0.3%``: each judged shape's step error in each seed's run
    alone (the spread the pooled figure averages out)."""
    parts = []
    for shape in SHAPE_ORDER:
        c = cf.get(shape)
        if c is None or len(c["step"]) < SHAPE_MIN_STEPS:
            continue
        cv = float(np.nanmean(c["own_us"]))
        errs = [at_sizes(r[shape], c, "own_us", shape) / cv - 1 for r in runs
                if shape in r and len(r[shape]["step"]) >= SHAPE_MIN_STEPS]
        if errs:
            parts.append(f"{shape} step {min(errs):+.2%}..{max(errs):+.2%}")
    if not parts:
        return ""
    return (f"  seeds               {len(runs)} runs pooled (seeds {seed}-{seed + len(runs) - 1}, "
            f"the shapes judged on their steps together); each run alone: " + ", ".join(parts))


def _count(frames: dict, shape: str) -> int:
    return len(frames[shape]["step"]) if shape in frames else 0


def _row_name(row: Row) -> str:
    """A missed row's name: ``bucket 8 step time``, ``bucket 8 forward gap``, ``step time mean``."""
    if row.key.startswith("by_shape."):
        return f"{row.key.split('.')[1]} step time"
    if row.key.startswith("by_bucket."):
        b = row.key.split(".")[1]
        return f"bucket {b} " + ("step time" if row.key.endswith("step_us_mean") else
                                 "forward gap")
    return row.label
