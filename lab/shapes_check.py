"""Iteration shapes on the GPU: SGLang's default scheduling and the mixed mode, fitted, predicted.

``python -m lab.shapes_check [DIR]`` reads what ``python -m lab.server OUT --suite shapes``
wrote on the GPU machine (committed under ``tests/data/server/shapes``):
``shapes_<sglang|mixed>_<light|medium|closed16>_<overlap|normal>_r<i>.metrics.json[.gz]``,
requests with 256..4,096-token prompts in a 2,048-token budget (a prompt longer than the
budget is carried over), at two Poisson loads and a closed loop of 16, with SGLang's default
scheduling (``sglang``: a prefill step of its own while prompt tokens wait, decodes paused)
and the mixed mode (``mixed``: the chunk mixed into the decode step), each with the overlap
loop and the normal loop, timed without the profiler and repeated; and one profiled capture
per mode, ``shapes_<mode>_medium_overlap_profiled.kineto.json.gz``.

**The model of a mode** comes from that mode's ONE capture, through simwar's own fit: the
capture opened with the mini-server's mapping (:data:`lab.check.SERVER_MAPPING`: the step
ranges ``decode``/``prefill``/``mixed bs=...`` give each step's batch and shape, and the
``prefill`` range's kernels are the phase ``prefill``, so the fitted phase table is the decode
steps' and a mixed step's chunk is the prefill's) and
:func:`simwar.fit.from_capture.fit_model`, the path of ``simwar import --fit``, with the
profiler's own host cost subtracted by the capture's event counts (but for the eager
prefill's, :data:`simwar.fit.shapes.EAGER_PREFILL_LESS_PROFILER`). Every key of the fit is
used as it writes it: ``scheduling.rule``, and the whole ``prefill:`` section. Two things a
what-if at these loads needs are still done here, marked in the output: the graph buckets
the capture never ran (32 and 64), EXTRAPOLATED (:func:`extrapolate_buckets`), and a line
that goes below zero before the admission cap of 64, CLAMPED (:func:`lab.host_speed.clamp_lines`).
A capture that ran one graph bucket alone gives no line to extrapolate the others on: its
mode's cases are NOT PREDICTED (:func:`_attempt`: measured only, with the reason, in the
Markdown and the JSON's ``not_predicted``; the on-vs-off signs and overlap recommendations
that pair them are not judged either; the mixed-chunk what-if, the ``sglang`` model's, is),
and the exit status is 3 where nothing judged misses.

**Each case** is then a what-if of its mode's model: its arrivals (a Poisson repeat replays
its own requests, run on with its seed's later ones, :func:`lab.prefill_check.trace`; a
closed loop is a closed loop sending the repeat's own requests in order,
:func:`lab.prefill_check.closed_lengths`), lengths, chunk, loop
(``policy.overlap``), barrier and length. Compared, as :mod:`lab.prefill_check` compares
them (its :func:`~lab.prefill_check.measured` and :func:`~lab.prefill_check.predicted`):
TPOT, throughput (decode tokens per second), TTFT mean to the first token's forward end and
to its result on the host, with step time and request rate reported. Targets
(:data:`TARGETS`): TPOT and throughput within 5 %, TTFT means within 10 %; for each mode and
load the sign of every on-vs-off difference (paired by seed); and the **recommendations**,
measured against predicted: overlap on or off, per mode and load, and "should I turn on mixed
chunk?" per load and loop, a what-if of the ``sglang`` model with the rule ``sglang_mixed``
against the measured mixed cases. A recommendation picks the lower mean request time,
TTFT + TPOT x (mean output - 1) (:func:`score`). Exit status 1 when a judged figure, sign
or recommendation misses; else 3 when a case was not predicted (the verdict incomplete).

**Each repeat at its own host speed** (the default; :mod:`lab.host_speed`, the rule
:mod:`lab.prefill_check` applies too). The GPU machine's host runs at speeds 0.4-2x apart
between runs of one session, so a model fitted from one capture is predicted at each
repeat's measured host speed (:func:`~lab.host_speed.host_at`): the repeat's unpadded host
work (prepare, launch, barrier: :func:`lab.check.host_speed`) on its steps that prefill
nothing, over the capture's on its own such steps less the profiler's cost in them
(:func:`~lab.host_speed.net_unpadded`: the host speed the fitted model describes), read from
the repeat's own host stamps, an input about the machine, not an outcome. The model's host
durations (:func:`simwar.fit.profiler.scale_host`: the loop's CPU work, each phase's host
time, the host API calls; nothing on the device) are multiplied by it, a faster repeat
scaled down as a slower one up, but for the work the mini-server pads to a time target
(:data:`~lab.host_speed.PADDED`, kept as captured) and the prefill's host time, its
preparation and its launches, and the fitted receive (:data:`~lab.host_speed.PREFILL_HOST`),
each multiplied instead by the repeat's host speed on its steps that prefill in the stretch of
the stamps that times it (:func:`~lab.host_speed.prefill_part_speeds`: ``prepare_for_decode``
for the preparation and the receive, the launches and barrier for the launches, over the
capture's at the same tokens, as stamped; the data show each apart from the decode steps' and
from each other); every repeat is judged, with its decode steps' factor and its steps' that
prefill over the whole unpadded work shown (:func:`~lab.host_speed.prefill_speed`; the parts in
the JSON's ``prefill_part_speeds``); and the loop's turn from a result processed to the next
iteration (:func:`~lab.host_speed.loop_tail`), which the fit holds in the padded processing,
the repeat's own in place of the capture's, which holds the profiler's bookkeeping of each
step (``loop_tail_us``: the difference). ``--as-captured``: the table before, every repeat at
the capture's host speed, and the host-speed rule (:func:`lab.check.host_speed`, as ``python -m
lab.prefill_check --as-captured`` applies it: a repeat whose host ran more than
:data:`lab.check.HOST_SPEED_MAX` times slower than the capture's stamps is reported, not
judged, its speed in brackets; a case with none judged, and the signs and recommendations
that pair it, reported whole). Reported too: where ``DIR/twins`` holds them, the profiler's
effect on the host stages of un-profiled and profiled twins (:func:`twins`).
**The receive.** A capture that names each iteration's received requests (``recv reqs=N
toks=T``, the shapes runs from ``run10`` on) gives its mode's model ``cpu.receive_us``, fitted
(:mod:`simwar.fit.receive`, its time out of the loop's other host work), and the cases use it
(each mode's line says which). ``--receive``: every case with the server's host work per request
received as MEASURED instead (:data:`RECEIVE_US` as ``cpu.receive_us``, replacing a fitted one;
for the runs before the range, which fit none, added to a model whose prefill host line holds
part of it: calibration/README.md, "Why the TTFT to the first token's forward was short" and
"The receive, fitted").

Runs where simulation runs (simwar's full stack), not on the GPU machine.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import numpy as np

from lab import check, prefill_check
from lab.host_speed import (
    clamp_lines,
    host_at,
    loop_tail,
    net_unpadded,
    prefill_line,
    prefill_lines,
    prefill_part_speeds,
    prefill_speed,
)
from simwar.api import simulate
from simwar.capture.open import open_capture
from simwar.fit.from_capture import fit_model

DEFAULT_DIR = check.DEFAULT_DIR / "shapes"
CASE = re.compile(r"^shapes_(?P<mode>sglang|mixed)_(?P<load>light|medium|closed16)_"
                  r"(?P<loop>overlap|normal)_r(?P<r>\d+)\.metrics\.json(\.gz)?$")
MODES = ("sglang", "mixed")
#: the mode's scheduling rule in simwar's config
RULES = {"sglang": "sglang", "mixed": "sglang_mixed"}
TARGETS = prefill_check.TARGETS
FIGURES = prefill_check.FIGURES
LABELS = prefill_check.LABELS
#: the mini-server's graph buckets (lab.server_model.ModelShape)
SERVER_BUCKETS = (8, 16, 32, 64)


def capture_path(folder: Path, mode: str) -> Path:
    return folder / f"shapes_{mode}_medium_overlap_profiled.kineto.json.gz"


def _per_bucket_tables(node, where: str = ""):
    """Every ``per_bucket`` table of a config's tree, with where it is (``phases.draft.
    prep_us``: a list's items named by their ``name``), parents before children."""
    if isinstance(node, dict):
        table = node.get("per_bucket")
        if isinstance(table, dict):
            yield where, table
        for k, v in node.items():
            if k != "per_bucket":
                yield from _per_bucket_tables(v, f"{where}.{k}" if where else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            name = v.get("name", i) if isinstance(v, dict) else i
            yield from _per_bucket_tables(v, f"{where}.{name}")


def extrapolate_buckets(node, buckets) -> list[str]:
    """EXTRAPOLATED here: every ``per_bucket`` table of ``node`` gets the ``buckets`` it lacks
    from the line through its two largest, never below the largest; in place; returns the
    keys changed. The fit's own ``extrapolate_buckets`` reaches only the buckets the
    capture's graphs name (the loads reach 64; the sglang capture ran 8-32, the mixed
    8-16), and naming the server's buckets in the mapping makes the fit refuse the
    capture's prefill steps (no batch range, no graph): still filled here."""
    out = []
    for where, table in _per_bucket_tables(node):
        if len(table) < 2:
            continue
        have = sorted(int(b) for b in table)
        (b0, v0), (b1, v1) = ((b, table[b if b in table else str(b)]) for b in have[-2:])
        slope = (v1 - v0) / (b1 - b0)
        for b in buckets:
            if b not in table and str(b) not in table:
                table[b] = max(v1, v1 + slope * (b - b1))
                out.append(f"{where}.per_bucket.{b}")
    return out


def unfitted_buckets(node, buckets) -> dict[int, list[str]]:
    """The ``buckets`` some ``per_bucket`` table of ``node`` still lacks after
    :func:`extrapolate_buckets` (a capture that ran one bucket gives no line to extrapolate
    on): each bucket with the keys of the tables that lack it."""
    out: dict[int, list[str]] = {}
    for where, table in _per_bucket_tables(node):
        for b in buckets:
            if b not in table and str(b) not in table:
                out.setdefault(b, []).append(f"{where}.per_bucket")
    return dict(sorted(out.items()))


def model(folder: Path, mode: str, keep_profiler_cost: bool = False) -> dict:
    """``mode``'s fitted config (simwar's fit: ``scheduling:`` and ``prefill:`` its own), its
    graph buckets the capture never ran EXTRAPOLATED here (:func:`extrapolate_buckets`)."""
    capture = capture_path(folder, mode)
    if not capture.exists():
        raise check.ServerDataError(f"{capture}: not found (the profiled case of mode {mode}: "
                                    f"python -m lab.server OUT --suite shapes)")
    cap = open_capture(capture, check.SERVER_MAPPING)
    fit = fit_model(cap, capture=capture.name, profiler_cost=not keep_profiler_cost)
    config = json.loads(json.dumps(fit.config))
    clamped, extrapolated = clamp_lines(config), extrapolate_buckets(config, SERVER_BUCKETS)
    unfitted = unfitted_buckets(config, SERVER_BUCKETS)
    config["workload"]["graph_buckets"] = list(SERVER_BUCKETS)
    for key in ("prefill", "scheduling"):
        if key not in config:
            raise check.ServerDataError(f"{capture}: the fit wrote no {key}: section (a "
                                        f"capture whose steps prefill is expected)")
    name = capture.name.replace(".kineto.json.gz", ".metrics.json")
    metrics = check.read_metrics(check.metrics_file(folder, name) or folder / name)
    base, slope = check.rising_line(*check._unpadded(metrics, decode_only=True))
    net_base, net_slope = check.rising_line(*net_unpadded(capture, metrics, keep_profiler_cost))
    return {"config": config, "warnings": list(fit.warnings),
            "extrapolated": extrapolated, "clamped": clamped,
            "unfitted": {b: keys for b, keys in unfitted.items()},
            "fitted_buckets": [b for b in SERVER_BUCKETS if b not in unfitted],
            "host_line": (float(base), float(slope)),
            "host_line_net": (float(net_base), float(net_slope)),
            "prefill_line": prefill_line(capture, metrics),
            "receive": (config.get("cpu") or {}).get("receive_us"),
            "prefill_lines": prefill_lines(capture, metrics),
            "loop_tail": loop_tail(metrics),
            "buckets": list((config.get("workload") or {}).get("graph_buckets") or [])}


#: ``--receive``: the mini-server's host work per request received (its ``recv_requests``
#: "tokenizes" each prompt), least squares over the sixth run's steps (t_batch - t_begin -
#: wait against the received requests and their prompt tokens: 20-64 µs and 0.14-0.18 µs a
#: token over four repeats), as ``cpu.receive_us``. MEASURED here, not fitted: in place of the
#: fitted one where the capture names its receive; before the range (up to ``run9``) the
#: capture's steps do not say which requests each received, and the fitted prefill's host
#: line, read over every step that prefills, already holds this work on average (so the option
#: also counts part of it twice there: step time +0.6 to +2.2 points on the sixth run).
RECEIVE_US = {"per_request": 40.0, "per_prompt_token": 0.16}


def at_repeat(m: dict, metrics: dict, speed: float | None = None):
    """``(config, speed, parts, tail)``: the mode's model ``m`` (:func:`model`) at the repeat
    ``metrics``'s own host speeds, the one rule of the table's cases, its what-ifs and
    :mod:`lab.shapes_steps`: its decode steps' factor (``speed``, :func:`lab.check.host_speed`
    on the model's host line net of the profiler, computed where not given), each prefill host
    key's on the stretch of the stamps that times it (``parts``,
    :func:`~lab.host_speed.prefill_part_speeds`), and its loop's turn as its stamps show it, not
    with the profiler's bookkeeping (``tail``, µs beyond the capture's,
    :func:`~lab.host_speed.loop_tail`)."""
    if speed is None:
        speed = check.host_speed(metrics, m["host_line_net"], decode_only=True)
    parts = prefill_part_speeds(metrics, m["prefill_lines"])
    tail = loop_tail(metrics) - m["loop_tail"]
    return host_at(m["config"], speed, parts, tail), speed, parts, tail


def _attempt(m: dict, config: dict, metrics: dict, rule: str | None = None,
             receive: bool = False) -> tuple[dict | None, str]:
    """``(figures, "")``: a repeat predicted by the mode's model ``m`` (:func:`model`); or
    ``(None, why)`` where the model lacks a graph bucket the server runs (``m["unfitted"]``:
    its capture ran fewer than two buckets, so :func:`extrapolate_buckets` had no line to
    extrapolate on; a bucket's cost is not copied from another, nor taken from anything but
    the capture). The server admits up to :data:`lab.check.MAX_BATCH` requests in the
    buckets :data:`SERVER_BUCKETS`, and so does the simulation, so no case of that mode can
    be simulated as the server ran it: each is reported "not predicted", not judged, with
    the buckets this repeat ran."""
    if not m["unfitted"]:
        return _predict(config, metrics, rule, receive), ""
    st, steps = metrics["steps"], check.measured_steps(metrics)
    ran = sorted({int(b) for b in np.asarray(st["bucket"])[steps] if int(b) > 0})
    have = ", ".join(map(str, m["fitted_buckets"])) or "none"
    return None, (f"the fit has graph costs for bucket(s) {have} only (its capture ran no "
                  f"other: no line to extrapolate the others on); the server admits up to "
                  f"{check.MAX_BATCH} in buckets {', '.join(map(str, SERVER_BUCKETS))} and "
                  f"ran bucket(s) {', '.join(map(str, ran)) or 'none'} in this repeat")


def score(figures: dict, mean_output: float) -> float:
    """A request's mean time as a recommendation weighs it: TTFT (to its result on the
    host) + TPOT x (mean output - 1)."""
    return figures["ttft_us"] + figures["tpot_us"] * (mean_output - 1.0)


def what_if_change(config: dict, metrics: dict, rule: str | None = None,
                   receive: bool = False) -> dict:
    """The overrides that make ``config`` one repeat (``metrics``) as every case is predicted
    (:func:`lab.prefill_check.what_if`, the repeat's seed; ``rule``: another scheduling rule;
    ``receive``: :data:`RECEIVE_US`); :mod:`lab.shapes_steps` simulates the same."""
    change = prefill_check.what_if(config, config["prefill"], metrics)
    if rule is not None:
        change["scheduling.rule"] = rule
    if receive:  # --receive: RECEIVE_US, in place of a fitted one
        change["cpu.receive_us"] = dict(RECEIVE_US)
    change["seed"] = int(metrics["case"].get("seed", 0))
    return change


def _predict(config: dict, metrics: dict, rule: str | None = None,
             receive: bool = False) -> dict:
    change = what_if_change(config, metrics, rule, receive)
    return prefill_check.predicted(simulate(config, change).summary)


#: the profiled and un-profiled twins: ``twins/run<i>_<case>.metrics.json.gz``
TWIN = re.compile(r"^run(?P<run>\d+)_shapes_(?P<mode>sglang|mixed)_medium_overlap_"
                  r"(?P<kind>r0|profiled)\.metrics\.json(\.gz)?$")


def host_stages(metrics: dict) -> dict:
    """A run's mean host µs per measured step, by shape (``prefill`` for any step with a
    chunk, ``decode`` for the others with a batch): ``prepare`` (prepare_for_decode) and
    ``launch`` (run_batch: the forward's launches), from its host stamps (profiled or not)."""
    st, steps = metrics["steps"], check.measured_steps(metrics)
    tok = np.asarray(st["prefill_tokens"])[steps]
    batch = np.asarray(st["batch"])[steps]

    def span(a, b):
        return (np.asarray(st[b], dtype=float) - np.asarray(st[a], dtype=float))[steps]

    prep, launch = span("t_batch_us", "t_scheduled_us"), span("t_scheduled_us", "t_launched_us")
    out = {}
    for shape, keep in (("prefill", tok > 0), ("decode", (tok == 0) & (batch > 0))):
        out[shape] = {"prepare": float(prep[keep].mean()), "launch": float(launch[keep].mean()),
                      "steps": int(keep.sum())}
    return out


def twins(folder: Path) -> list[dict]:
    """The profiler's effect on the host, from ``folder/twins`` (un-profiled and profiled
    runs of the medium load with overlap, back to back in one process, three processes):
    per run and mode, each shape's profiled over un-profiled prepare and launch."""
    runs: dict = {}
    for path in sorted((folder / "twins").glob("*.metrics.json*")):
        m = TWIN.match(path.name)
        if m is not None:
            runs.setdefault((int(m["run"]), m["mode"]), {})[m["kind"]] = host_stages(
                check.read_metrics(path))
    out = []
    for (run, mode), pair in sorted(runs.items()):
        if set(pair) != {"r0", "profiled"}:
            continue
        plain, prof = pair["r0"], pair["profiled"]
        out.append({"run": run, "mode": mode, "unprofiled": plain, "profiled": prof,
                    "ratio": {sh: {st: prof[sh][st] / plain[sh][st] for st in plain[sh]
                                   if st != "steps"} for sh in plain}})
    return out


def evaluate(folder: Path | None = None, keep_profiler_cost: bool = False,
             as_captured: bool = False, receive: bool = False) -> dict:
    """Fit each mode, predict every case, compare (see the module docstring); ``as_captured``:
    every repeat predicted at the capture's host speed, those slower by more than
    :data:`lab.check.HOST_SPEED_MAX` left out (the table before the host speed was an
    input); ``receive``: every case with the server's host work per request received,
    :data:`RECEIVE_US`."""
    folder = Path(folder or DEFAULT_DIR)
    cases = check.load_repeats(folder, CASE, ("mode", "load", "loop"))
    if not cases:
        raise check.ServerDataError(f"{folder}: no shapes_*.metrics.json[.gz] (python -m "
                                    f"lab.server OUT --suite shapes)")
    models = {mode: model(folder, mode, keep_profiler_cost) for mode in MODES}
    out: dict = {"models": {m: {k: v for k, v in d.items() if k != "config"}
                            | {"prefill": d["config"]["prefill"],
                               "scheduling": d["config"]["scheduling"],
                               "phases": d["config"]["phases"]}
                            for m, d in models.items()},
                 "cases": {}, "signs": {}, "overlap": {}, "mixed": {}, "not_predicted": {}}
    what_if_mixed: dict = {}
    for (mode, load, loop), repeats in cases.items():
        # each repeat's host speed (lab.check.host_speed: its unpadded host work on the steps
        # that prefill nothing, over the capture's at the same batches), measured from its own
        # host stamps: an input about the machine, not an outcome
        # (against the capture's own host work as the model holds it, the profiler's cost
        # out; --as-captured: as stamped, the rule's reference before)
        line = models[mode]["host_line" if as_captured else "host_line_net"]
        speeds = [check.host_speed(r, line, decode_only=True) for r in repeats]
        prefill_speeds: list = [None] * len(repeats)
        parts: list = [None] * len(repeats)
        tails: list = [None] * len(repeats)
        if as_captured:  # the capture's host speed; a repeat slower by more than
            # HOST_SPEED_MAX is reported, not judged; a case without a judged one likewise
            configs = [models[mode]["config"]] * len(repeats)
            judged = [not v > check.HOST_SPEED_MAX for v in speeds]
        else:  # the model's host at each repeat's speed, faster or slower: all judged
            # and its steps that prefill at theirs (PREFILL_HOST says why)
            prefill_speeds = [prefill_speed(r, models[mode]["prefill_line"]) for r in repeats]
            made = [at_repeat(models[mode], r, v) for r, v in zip(repeats, speeds)]
            configs, parts, tails = ([x[i] for x in made] for i in (0, 2, 3))
            judged = [True] * len(repeats)
        reps = [prefill_check.measured(r) for r in repeats]
        seeds = [int(r["case"].get("seed", 0)) for r in repeats]
        tried = [_attempt(models[mode], c, r, receive=receive)
                 for c, r in zip(configs, repeats)]
        sims = [p for p, _ in tried]
        # a repeat the fit cannot predict (a bucket it has no value for): the whole case is
        # reported "not predicted", its figures measured only, none judged
        missing = {sd: why for sd, (p, why) in zip(seeds, tried) if p is None}
        use = [i for i, ok in enumerate(judged) if ok] or list(range(len(repeats)))
        meas = {k: check.mean_spread([reps[i][k] for i in use]) for k in reps[0]}
        pred = {k: float(np.mean([sims[i][k] for i in use])) if not missing else math.nan
                for k in reps[0]}
        rows = {k: check.relative_row(meas[k][0], pred[k], TARGETS.get(k)
                                      if any(judged) and not missing else None, meas[k][1])
                for k in FIGURES}
        out_mean = float(np.mean([np.mean(r["requests"]["output_tokens"]) for r in repeats]))
        name = f"{mode}_{load}_{loop}"
        out["cases"][name] = {
            "mode": mode, "load": load, "loop": loop, "repeats": len(repeats), "rows": rows,
            "host_speed": speeds, "prefill_host_speed": prefill_speeds, "judged": judged,
            "prefill_part_speeds": None if as_captured else parts,
            "loop_tail_us": None if as_captured else tails,
            "scaled": not as_captured,
            "requests": (meas["requests"][0], pred["requests"]), "mean_output": out_mean,
            "by_seed": {sd: (m, p) for sd, m, p in zip(seeds, reps, sims)},
            "judged_seeds": {sd for sd, ok in zip(seeds, judged) if ok}}
        if missing:
            out["cases"][name]["not_predicted"] = missing
            out["not_predicted"][name] = missing
        if mode == "sglang":  # the what-if: the same model, mixed chunk turned on
            mixed = [_attempt(models[mode], c, r, rule=RULES["mixed"], receive=receive)
                     for c, r in zip(configs, repeats)]
            what_if_mixed[(load, loop)] = {sd: p for sd, (p, _) in zip(seeds, mixed)}
            for sd, (p, why) in zip(seeds, mixed):
                if p is None:
                    out["not_predicted"].setdefault(f"what-if mixed {load}_{loop}", {})[sd] = why
    for mode in MODES:
        for load in ("light", "medium", "closed16"):
            on = out["cases"].get(f"{mode}_{load}_overlap")
            off = out["cases"].get(f"{mode}_{load}_normal")
            if on is None or off is None:
                continue
            common, judge = _pairs(on, off)
            lost = _not_predicted(on, off)
            if lost:  # a case of the pair not predicted: measured only, nothing judged
                out["signs"][f"{mode}_{load}"] = {"seeds": common, "judged": False,
                                                  "not_predicted": lost,
                                                  **_measured_signs(on, off, common)}
                out["overlap"][f"{mode}_{load}"] = _unpredicted_advice(
                    "on", "off", [score(c["by_seed"][sd][0], on["mean_output"]) for c in
                                  (on, off) for sd in common], lost)
                continue
            signs = prefill_check.paired_signs(on, off, common, judge)
            out["signs"][f"{mode}_{load}"] = {"seeds": common, "judged": judge, **signs}
            n = on["mean_output"]
            m_on, m_off = ([score(c["by_seed"][sd][0], n) for sd in common] for c in (on, off))
            p_on, p_off = (float(np.mean([score(c["by_seed"][sd][1], n) for sd in common]))
                           for c in (on, off))
            out["overlap"][f"{mode}_{load}"] = _advice("on", "off", m_on, m_off, p_on, p_off,
                                                       judge)
    for (load, loop), preds in sorted(what_if_mixed.items()):
        sg = out["cases"][f"sglang_{load}_{loop}"]
        mx = out["cases"].get(f"mixed_{load}_{loop}")
        if mx is None:
            continue
        common, judge = _pairs(sg, mx)
        common = [sd for sd in common if sd in preds]
        n = sg["mean_output"]
        # the what-if is the sglang model's (the mixed mode's measured only): the mixed
        # model not predicting its own cases does not take this recommendation
        lost = _not_predicted(sg) or [f"the what-if (seed {sd}) not predicted"
                                      for sd in common if preds[sd] is None]
        if lost:
            out["mixed"][f"{load}_{loop}"] = _unpredicted_advice(
                "mixed", "separate", [score(c["by_seed"][sd][0], n) for c in (mx, sg)
                                      for sd in common], lost)
            continue
        m_mx = [score(mx["by_seed"][sd][0], n) for sd in common]
        m_sg = [score(sg["by_seed"][sd][0], n) for sd in common]
        p_mx = float(np.mean([score(preds[sd], n) for sd in common]))
        p_sg = float(np.mean([score(sg["by_seed"][sd][1], n) for sd in common]))
        out["mixed"][f"{load}_{loop}"] = _advice("mixed", "separate", m_mx, m_sg, p_mx, p_sg,
                                                 judge)
    out["ok"] = (all(r["ok"] is not False for c in out["cases"].values()
                     for r in c["rows"].values())
                 and all(v[k]["ok"] is not False for v in out["signs"].values()
                         for k in FIGURES)
                 and all(v["ok"] is not False for v in out["overlap"].values())
                 and all(v["ok"] is not False for v in out["mixed"].values()))
    for c in out["cases"].values():
        del c["by_seed"]
        c["judged_seeds"] = sorted(c["judged_seeds"])
    out["twins"] = twins(folder)  # reported, not judged
    return out


def _not_predicted(*cases: dict) -> list[str]:
    """The cases among ``cases`` that were not predicted, named (empty: all were)."""
    return [f"{c['mode']}_{c['load']}_{c['loop']} not predicted" for c in cases
            if c.get("not_predicted")]


def _measured_signs(on: dict, off: dict, common: list) -> dict:
    """Per figure, the on-vs-off difference measured (mean over the ``common`` seeds), none
    predicted, not judged."""
    return {k: {"measured": float(np.mean([on["by_seed"][sd][0][k] - off["by_seed"][sd][0][k]
                                           for sd in common])),
                "predicted": math.nan, "ok": None} for k in FIGURES}


def _unpredicted_advice(yes: str, no: str, scores: list[float], lost: list[str]) -> dict:
    """A recommendation measured only (``scores``: ``yes``'s per seed, then ``no``'s), its
    prediction missing (``lost`` says why): not judged."""
    half = len(scores) // 2
    m_yes, m_no = float(np.mean(scores[:half])), float(np.mean(scores[half:]))
    return {"measured": yes if m_yes < m_no else no, "predicted": None, "ok": None,
            "measured_us": {yes: m_yes, no: m_no}, "predicted_us": {},
            "not_predicted": lost}


def _pairs(a: dict, b: dict) -> tuple[list[int], bool]:
    """The seeds two cases share, paired (the same requests), and whether they are judged:
    the seeds judged in both where there are some (then only those), else every shared one,
    reported, not judged."""
    both = sorted(set(a["judged_seeds"]) & set(b["judged_seeds"]))
    return (both, True) if both else (sorted(set(a["by_seed"]) & set(b["by_seed"])), False)


def _advice(yes: str, no: str, m_yes: list[float], m_no: list[float], p_yes: float,
            p_no: float, judged: bool = True) -> dict:
    """A recommendation, measured (``m_yes``/``m_no``: each side's score per paired seed) and
    predicted: ``yes`` where its score is the lower. ``ok`` None where it is not judged, and
    where the seeds disagree on which side is lower (``settled`` False: too close to call,
    :func:`lab.prefill_check.settled`, the rule the signs are judged by)."""
    a, b = float(np.mean(m_yes)), float(np.mean(m_no))
    meas, pred = (yes if a < b else no), (yes if p_yes < p_no else no)
    ok = prefill_check.settled([y - x for y, x in zip(m_yes, m_no)])
    return {"measured": meas, "predicted": pred, "settled": ok,
            "ok": meas == pred if judged and ok else None,
            "measured_us": {yes: a, no: b}, "predicted_us": {yes: p_yes, no: p_no}}


def _line(node: dict, unit: str = "tokens") -> str:
    """A ``{base, per_token[, per_token_prefix]}`` line in words (µs)."""
    if not isinstance(node, dict):
        return f"{float(node):.0f}"
    out = f"{node['base']:.0f} + {node['per_token']:.3f} x {unit}"
    if node.get("per_token_prefix"):
        out += f" + {node['per_token_prefix']:.5f} x tokens x prefix"
    return out


def _measured_cell(row: dict, key: str) -> str:
    """A figure measured, not predicted."""
    scale = 1e-3 if key.startswith("ttft") else 1.0
    fmt = ".1f" if key == "requests_per_s" or scale != 1.0 else ".0f"
    return f"{row['measured'] * scale:{fmt}} / not predicted"


def _measured_sign(sign: dict, key: str) -> str:
    """An on-vs-off difference measured, not predicted (TTFTs in ms)."""
    scale = 1e-3 if key.startswith("ttft") else 1.0
    return f"{sign[key]['measured'] * scale:+.1f} / not predicted"


def model_line(m: dict) -> str:
    """A mode's fitted model in one line: its rule, every key of its ``prefill:`` section,
    its fitted receive (``cpu.receive_us``) and the buckets the fit extrapolated."""
    sec = m["prefill"]
    bits = [f"rule {m['scheduling']['rule']}", f"prefill host {_line(sec['host_us'])} µs",
            f"device {_line(sec['forward_us'])} µs"]
    if "host_before_us" in sec:
        bits.append(f"host before its launches {_line(sec['host_before_us'])} µs")
    bits += [f"{k} {v}" for k, v in sec.items()
             if k not in ("host_us", "forward_us", "host_before_us")]
    r = m.get("receive")
    bits.append(f"receive {r['per_request']:g} µs a request + {r['per_prompt_token']:g} µs a "
                f"prompt token (fitted)" if r else "receive none fitted (no recv ranges)")
    return (", ".join(bits) + f"; graph buckets {m['buckets']}, EXTRAPOLATED here: "
            + (", ".join(m["extrapolated"]) or "none") + f"; CLAMPED here at batch "
            f"{check.MAX_BATCH}: " + (", ".join(m["clamped"]) or "none")
            + (f"; NO VALUE for bucket(s) {', '.join(map(str, m['unfitted']))} (the capture "
               f"ran {', '.join(map(str, m['fitted_buckets'])) or 'none'} alone: no line to "
               f"extrapolate on: its cases are NOT PREDICTED)"
               if m.get("unfitted") else ""))


def speed_line(result: dict) -> str:
    """How the repeats' host speeds were used, in words."""
    if all(c.get("scaled") for c in result["cases"].values()):
        return ("Each repeat predicted at its own host speeds (the factors shown: its unpadded "
                "host work over the capture's, on the steps that prefill nothing / on those "
                "that prefill; the model's host durations x the first, its prefill's "
                "preparation and launches each x that ratio on its own stretch of the "
                "stamps), every repeat judged.")
    return (f"Every repeat predicted at the capture's host speed (--as-captured); a repeat "
            f"whose host ran more than {check.HOST_SPEED_MAX}x slower is not judged (its "
            f"speed in brackets).")


def markdown(result: dict) -> str:
    lines = [f"- {mode}: {model_line(m)}" for mode, m in result["models"].items()]
    rows = []
    for c in result["cases"].values():
        m, p = c["requests"]
        if c.get("not_predicted"):  # measured only
            rows.append([c["mode"], c["load"], c["loop"], prefill_check.speeds(c),
                         f"{m:.0f} / -", *(_measured_cell(c["rows"][k], k) for k in FIGURES)])
            continue
        rows.append([c["mode"], c["load"], c["loop"], prefill_check.speeds(c),
                     f"{m:.0f} / {p:.0f}",
                     *(prefill_check.cell(c["rows"][k], k) for k in FIGURES)])
    signs = []
    for key, sign in result["signs"].items():
        if sign.get("not_predicted"):
            signs.append([key.replace("_", " "),
                          *(_measured_sign(sign, k) for k in FIGURES)])
            continue
        cells = [prefill_check.sign_values(sign, k) + prefill_check.sign_mark(sign[k])
                 for k in FIGURES]
        signs.append([key.replace("_", " "), *cells])
    advice = []
    for question, table in (("overlap on?", result["overlap"]),
                            ("mixed chunk?", result["mixed"])):
        for key, a in table.items():
            ms = " / ".join(f"{k} {v / 1e3:.1f}" for k, v in a["measured_us"].items())
            ps = " / ".join(f"{k} {v / 1e3:.1f}" for k, v in a["predicted_us"].items()) or "-"
            verdict = ("not predicted" if a.get("not_predicted") else
                       "too close to call" if a.get("settled") is False else
                       {True: "", False: "WRONG", None: "not judged"}[a["ok"]])
            advice.append([question, key.replace("_", " "), a["measured"],
                           a["predicted"] or "-", ms, ps, verdict])
    twin_rows = [[str(t["run"]), t["mode"],
                  *(f"{t['unprofiled'][sh][st]:.0f} / {t['profiled'][sh][st]:.0f} "
                    f"(x{t['ratio'][sh][st]:.2f})" for sh in ("prefill", "decode")
                    for st in ("prepare", "launch"))] for t in result.get("twins", [])]
    twin_table = ["", "The profiler on the host (twins, medium load, overlap; un-profiled / "
                  "profiled µs per step, from the host stamps):", "",
                  *check.table(["run", "mode", "prefill prepare", "prefill launch",
                                "decode prepare", "decode launch"], twin_rows)
                  ] if twin_rows else []
    lost = [f"- {name}, seed {sd}: {why}" for name, by in result.get("not_predicted", {}).items()
            for sd, why in by.items()]
    lost_lines = (["", "NOT PREDICTED (reported, not judged; so are the on-vs-off signs and "
                   "overlap recommendations that pair them; the mixed-chunk what-if is the "
                   "sglang model's):", *lost] if lost else [])
    return "\n".join([
        "Models, each from its mode's one capture (simwar's fit; EXTRAPOLATED, CLAMPED: by "
        "this checker):",
        *lines, "", speed_line(result), "",
        *check.table(["mode", "load", "loop", "repeats: host speed", "requests meas. / pred.",
                      *(f"{LABELS[k]} meas. / pred. (err)" for k in FIGURES)], rows), "",
        *check.table(["mode, load", "on - off, meas. / pred.: " + LABELS[FIGURES[0]],
                      *(LABELS[k] for k in FIGURES[1:])], signs), "",
        *check.table(["question", "case", "measured", "predicted",
                      "measured score ms", "predicted score ms", ""], advice),
        *lost_lines, *twin_table])


#: the what-if's default case and chunk sizes (``--what-if``)
WHAT_IF_CASE = "shapes_sglang_medium_overlap_r0"
WHAT_IF_CHUNKS = (512, 1024, 2048, 4096)


def what_if_table(folder: Path, case: str = WHAT_IF_CASE,
                  chunks: tuple[int, ...] = WHAT_IF_CHUNKS) -> dict:
    """"Should I turn on mixed chunk?" and "what chunk size?" as what-ifs of the ``sglang``
    capture's model on one repeat's requests, at that repeat's own host speeds (as every case
    of :func:`evaluate`): per rule (``sglang``, ``sglang_mixed``) and ``prefill.chunk_tokens``,
    the predicted figures and score; with what the repeat and its ``mixed`` twin (the same
    seed) measured at the server's own chunk."""
    folder = Path(folder)
    path = check.metrics_file(folder, f"{case}.metrics.json")
    if path is None:
        raise check.ServerDataError(f"{folder}: no {case}.metrics.json[.gz]")
    metrics = check.read_metrics(path)
    m = model(folder, "sglang")
    if m["unfitted"]:  # as evaluate's cases (_attempt): no bucket's cost guessed
        raise check.ServerDataError(
            f"{capture_path(folder, 'sglang')}: the fit has graph costs for bucket(s) "
            f"{', '.join(map(str, m['fitted_buckets'])) or 'none'} only (its capture ran no "
            f"other: no line to extrapolate the others on), and the server admits up to "
            f"{check.MAX_BATCH}: the what-ifs are not predicted")
    config = at_repeat(m, metrics)[0]  # as every case of the table (evaluate)
    n = float(np.mean(metrics["requests"]["output_tokens"]))
    rows = []
    for rule in ("sglang", "sglang_mixed"):
        for chunk in chunks:
            cfg = {**config, "prefill": {**config["prefill"], "chunk_tokens": int(chunk)}}
            m = {**metrics, "case": {**metrics["case"], "chunk_tokens": int(chunk)}}
            p = _predict(cfg, m, rule=rule)
            rows.append({"rule": rule, "chunk_tokens": int(chunk), **p, "score": score(p, n)})
    measured = {}
    for rule, name in (("sglang", case), ("sglang_mixed", case.replace("_sglang_", "_mixed_"))):
        mpath = check.metrics_file(folder, f"{name}.metrics.json")
        if mpath is not None:
            got = prefill_check.measured(check.read_metrics(mpath))
            measured[rule] = {**got, "score": score(got, n)}
    return {"case": case, "chunk_tokens": int(metrics["case"]["chunk_tokens"]), "rows": rows,
            "measured": measured}


def what_if_markdown(result: dict) -> str:
    def cells(f: dict) -> list[str]:
        return [f"{f['ttft_us'] / 1e3:.1f}", f"{f['tpot_us']:.0f}", f"{f['tokens_per_s']:.0f}",
                f"{f['score'] / 1e3:.1f}"]

    rows = [[r["rule"], str(r["chunk_tokens"]), "predicted", *cells(r)] for r in result["rows"]]
    rows += [[rule, str(result["chunk_tokens"]), "measured", *cells(f)]
             for rule, f in result["measured"].items()]
    return "\n".join([f"What-ifs of the sglang capture's model on {result['case']}'s requests "
                      f"(score: TTFT + TPOT x (mean output - 1)):", "",
                      *check.table(["rule", "chunk_tokens", "", "TTFT ms", "TPOT µs",
                                    "tokens/s", "score ms"], rows)])


AS_CAPTURED_HELP = (f"predict every repeat at the capture's host speed and leave out those "
                    f"whose host ran more than {check.HOST_SPEED_MAX}x slower (the table "
                    f"before each repeat's measured host speed was an input)")


RECEIVE_HELP = ("predict every case with the server's host work per request received, "
                "as measured (RECEIVE_US: cpu.receive_us), in place of the fitted one where "
                "the capture names its receive")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--what-if" in argv:
        import argparse

        ap = argparse.ArgumentParser(prog="python -m lab.shapes_check --what-if",
                                     description=what_if_table.__doc__.split("\n\n")[0])
        ap.add_argument("--what-if", action="store_true")
        ap.add_argument("folder", type=Path, nargs="?", default=DEFAULT_DIR)
        ap.add_argument("--case", default=WHAT_IF_CASE)
        ap.add_argument("--chunks", default=",".join(map(str, WHAT_IF_CHUNKS)),
                        help="comma-separated prefill.chunk_tokens")
        args = ap.parse_args(argv)
        try:
            chunks = tuple(int(c) for c in args.chunks.split(","))
            print(what_if_markdown(what_if_table(args.folder, args.case, chunks)))
        except (ValueError, check.ServerDataError) as e:
            print(f"simwar: error: {e}", file=sys.stderr)
            return 2
        return 0
    if not any(not a.startswith("-") for a in argv):
        argv.insert(0, str(DEFAULT_DIR))
    return check.command(argv, "python -m lab.shapes_check", __doc__.split("\n\n")[0],
                         evaluate, markdown, status_is_verdict=True,
                         flags={"--as-captured": ("as_captured", AS_CAPTURED_HELP),
                                "--receive": ("receive", RECEIVE_HELP)})


if __name__ == "__main__":
    sys.exit(main())
