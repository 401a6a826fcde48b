"""Overlap on or off with prompts: the mini-server's prefill cases, predicted and compared.

``python -m lab.prefill_check DIR`` reads what ``python -m lab.server OUT
--suite fit,prefill`` wrote on the GPU machine (committed under ``tests/data/server``):
``prefill_<light|medium|closed8>_<overlap|normal>_r<i>.metrics.json[.gz]``, requests with
64..512-token prompts in 256-token chunks at two Poisson loads and a closed loop of 8, each
with SGLang's overlap loop and its normal loop, timed without the profiler and repeated.

**The model** (nothing of these cases is fitted to them):

- the decode loop: the sweeping capture's fit (:func:`lab.check.fit_sweep`,
  ``fit_ramp_profiled``: the same fit that predicts the decode loads), rescaled to the
  un-profiled sweep;
- the prefill (``prefill:``, chunked prefill mixed into decode, 256 tokens per step): the
  server's eager prefill launches a kernel per operation of every layer, so it is as long as
  the host takes to launch it. Its host cost is the server's own set-up measurement of one
  chunk without the profiler (``server_device.json``'s ``prefill_us`` at 64 and 256 tokens,
  a line through both: ``host_us``); what the device still runs after the host's last launch
  (``forward_us``) is read from the one prefill capture, ``prefill_light_overlap_profiled``:
  per step, the ``prefill`` range on the GPU (``gpu_user_annotation``) past the end of the
  same range on the host (tied by their External id), against the step's prefill tokens. The
  capture's own host range is not the model's host cost: under CUPTI each eager launch costs
  more, and the capture's prefill took 2.3x the un-profiled one (the sweep's host factor,
  0.88, is that of graph launches); it is the yardstick of each repeat's prefill speed
  (below), and where it is used, each range is first less the profiler's own host cost
  in it, by the capture's event counts (:func:`lab.host_speed.profiler_cost_of`: the sweep's
  fit takes it out of its host times the same way, and its host factor is then 0.95);
- each case: its arrivals (a Poisson repeat's own requests, run on with its seed's later ones,
  :func:`trace`; a closed loop's own requests in order, :func:`closed_lengths`), lengths,
  chunk, loop (``policy.overlap``), barrier and length;
- **each repeat at its own host speeds** (the default; :mod:`lab.host_speed`, the shapes
  checker's rule): the model's host durations times the repeat's host speed on its steps
  that prefill nothing (:func:`lab.check.host_speed`: its unpadded host work over the
  un-profiled sweep's at the same batches, the host the fit is rescaled to), but for the work
  the server pads (:data:`lab.host_speed.PADDED`), and the prefill's host time times its speed
  on its steps that prefill (:func:`lab.host_speed.prefill_speed`, over the prefill capture's
  such steps as the model's prefill holds them: less the profiler's cost, x the sweep's host
  factor); every repeat judged, each with its two factors shown.

**Compared** (the repeats' mean, per-request figures over the requests whose last token's
step is measured, as the simulator's summary takes them): TPOT (first to last token's
forward end per further token), throughput (decode tokens per second of measured steps:
batch x accepted tokens over the step time), request throughput, TTFT to the first token's
forward end and to its result processed on the host, mean step time. Targets
(:data:`TARGETS`): TPOT and throughput within 5 %, TTFT mean within 10 %, and for each load
the sign of every on-vs-off difference as measured. ``--as-captured``: the table before,
every repeat at the sweep's host speed, and one whose host ran more than
:data:`lab.check.HOST_SPEED_MAX` times slower than the sweep's (:func:`lab.check.host_speed`
on its steps without a prefill) reported, not judged.

The data, the fit, the host-speed measure, the rows and the command line are
:mod:`lab.check`'s (shared with :mod:`lab.server_check`); a repeat at its host speeds and the
readers of a capture's steps and of the profiler's cost in its host ranges are
:mod:`lab.host_speed`'s (shared with :mod:`lab.shapes_check`); the prefill model, the cases'
what-if, the figures and the on-vs-off signs are this module's (:mod:`lab.shapes_check` asks
and compares its cases with :func:`what_if`, :func:`measured`, :func:`predicted` and
:func:`cell`). Runs where
simulation runs (simwar's full stack), not on the GPU machine.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import sys
from pathlib import Path

import numpy as np

from lab import check
from lab.host_speed import (
    host_at,
    open_steps,
    prefill_line,
    prefill_speed,
    profiler_cost_of,
)
from lab.server_requests import Arrivals, Dist
from simwar.api import simulate

CASE = re.compile(r"^prefill_(?P<load>light|medium|closed8)_(?P<loop>overlap|normal)"
                  r"_r(?P<r>\d+)\.metrics\.json(\.gz)?$")
PREFILL_CAPTURE = "prefill_light_overlap_profiled.kineto.json.gz"
PREFILL_METRICS = "prefill_light_overlap_profiled.metrics.json"
DEVICE = "server_device.json"
#: relative bounds per figure (TTFT: both ways)
TARGETS = {"tpot_us": 0.05, "tokens_per_s": 0.05, "ttft_us": 0.10, "ttft_forward_us": 0.10}
#: the figures compared, in table order (measured key = predicted key)
FIGURES = ("step_us", "tpot_us", "tokens_per_s", "requests_per_s", "ttft_forward_us",
           "ttft_us")


def _lengths(text: str) -> dict:
    lo, _, hi = str(text).partition("..")
    return {"dist": "uniform", "low": int(lo) - 1, "high": int(hi or lo)}


def _step_ranges(events: list, steps, name: str, less=None) -> dict:
    """Step -> the duration of the host range ``name`` in that step (by the step of
    ``steps``, :class:`lab.host_speed.CaptureSteps`, holding its start); ``less(ts, dur)``:
    the duration it becomes."""
    out = {}
    for e in events:
        if e.get("cat") == "user_annotation" and e.get("name") == name:
            k = steps.at(e["ts"])
            if k is not None:
                dur = float(e["dur"])
                out[k] = less(float(e["ts"]), dur) if less is not None else dur
    return out


def _token_line(x: list, y: list) -> dict:
    """``{base, per_token}`` by least squares; the mean where the line has a negative part."""
    a, b = check.rising_line(x, y)
    if a < 0:
        a, b = float(np.mean(y)), 0.0
    return {"base": a, "per_token": b}


def prefill_model(folder: Path, host_scale: float, device_scale: float,
                  warmup: int = 5, profiler_cost: bool = True) -> dict:
    """The ``prefill:`` section (see the module docstring), with what it was read from;
    ``profiler_cost``: the host ranges less the profiler's own cost in them (as the sweep's
    fit takes it out of its host times: :func:`profiler_cost_of`)."""
    capture = folder / PREFILL_CAPTURE
    if not capture.exists():
        raise check.ServerDataError(f"{capture}: not found (the profiled prefill case)")
    events = json.loads(gzip.decompress(capture.read_bytes()))["traceEvents"]
    cap, steps = open_steps(capture)
    path = check.metrics_file(folder, PREFILL_METRICS) or folder / PREFILL_METRICS
    tokens = check.read_metrics(path)["steps"]["prefill_tokens"]
    less = profiler_cost_of(cap) if profiler_cost else None
    run = _step_ranges(events, steps, "scheduler.run_batch", less=less)
    prep = _step_ranges(events, steps, "scheduler.prepare_for_decode", less=less)
    ks = [k for k in sorted(run) if k >= warmup and k in prep and k < len(tokens)]
    plain = [run[k] + prep[k] for k in ks if tokens[k] == 0]
    with_prefill = [k for k in ks if tokens[k] > 0]
    if len(with_prefill) < 3 or not plain:
        raise check.ServerDataError(f"{capture}: fewer than 3 prefill steps, or none without")
    x = [float(tokens[k]) for k in with_prefill]
    # the host time a prefill adds to its step: preparing it (its metadata in the staging
    # buffer) and launching it, over the steps without one
    host = [host_scale * (run[k] + prep[k] - float(np.mean(plain))) for k in with_prefill]
    # the device work left once the host has launched the prefill's last kernel (the eager
    # prefill is launch-bound: the GPU range ends with the host's)
    cpu = {}
    for e in events:
        if e.get("name") == "prefill" and e.get("cat") in ("user_annotation",
                                                          "gpu_user_annotation"):
            cpu.setdefault((e.get("args") or {}).get("External id"), {})[e["cat"]] = e
    tail_x, tail = [], []
    for pair in cpu.values():
        h, g = pair.get("user_annotation"), pair.get("gpu_user_annotation")
        k = steps.at(h["ts"]) if h is not None else None
        if g is None or k is None or k < warmup:
            continue
        tail_x.append(float(tokens[k]))
        tail.append(device_scale * max(0.0, g["ts"] + g["dur"] - (h["ts"] + h["dur"])))
    return {"section": {"chunk_tokens": 256, "forward_us": _token_line(tail_x, tail),
                        "host_us": _token_line(x, host), "graph": "eager"},
            "from": f"{PREFILL_CAPTURE}: {len(x)} prefill steps; host: run_batch + "
                    f"prepare over the {len(plain)} steps without prefill, mean "
                    f"{np.mean(host):.0f} µs (x {host_scale:.3f}, the sweep's host factor); "
                    f"device after the host's last launch: mean {np.mean(tail):.1f} µs"}


def _seed_arrivals(case: dict, seed: int, **how) -> Arrivals:
    """The mini-server's client of a case (:class:`lab.server_requests.Arrivals`): the
    requests its ``seed`` makes, their lengths drawn as the case says; ``how``: its rate or
    its closed loop's concurrency."""
    return Arrivals(seed=seed, output=Dist.parse(case["output_tokens"]),
                    prompt=Dist.parse(case["prompt_tokens"]), **how)


def closed_lengths(metrics: dict, longer: float = 4.0) -> dict:
    """A closed-loop repeat's requests as ``workload.closed_loop.lengths``: the server's own
    lengths in the order its client sent them (:class:`lab.server_requests.Arrivals` of the
    case's seed and concurrency: the i-th request sent has the seed's i-th lengths, whatever
    the timing), ``longer`` x as many as the repeat sent, whose first are the repeat's own
    (checked). Drawn afresh instead, a closed loop predicts the first tokens of other
    requests (which request comes when decides how long each waits behind the others'
    prompts): on the shapes suite's third run the ``sglang`` closed loop of 16 with the
    normal loop went 20.9-27.5 ms of TTFT over ten seeds against 28.0 measured
    (calibration/README.md, "Why the closed loops' TTFT was short")."""
    case, req = metrics["case"], metrics["requests"]
    arr = _seed_arrivals(case, int(case.get("seed", 0)),
                         concurrency=int(metrics["arrivals"]["concurrency"]))
    n = len(req["arrival_us"])
    while len(arr.made) < longer * n:
        arr.finished(0.0)  # one more sent: its lengths are the seed's next
    made = arr.made
    if any(r.prompt_tokens != p or r.output_tokens != o for r, p, o in
           zip(made, req["prompt_tokens"], req["output_tokens"])):
        raise check.ServerDataError(f"{case['name']}: its requests are not its seed's")
    return {"output_tokens": [r.output_tokens for r in made],
            "prompt_tokens": [r.prompt_tokens for r in made]}


def trace(metrics: dict, longer: float = 4.0) -> dict:
    """A Poisson repeat's requests as ``workload.arrivals.trace``, run on past its end: the
    server's own arrivals of the case's seed (:class:`lab.server_requests.Arrivals`: the gaps
    and lengths come from the seed, whatever the timing), ``longer`` x as long as the
    measured ones, whose first requests are the repeat's own (checked). The repeat's own
    alone end where the server stopped: a predicted run slower than the server's (a repeat
    at a slower host) needs requests the repeat never received, and without them its loop
    ran out of requests to wait for (simwar now says so: ``workload.arrivals.trace``)."""
    case, req = metrics["case"], metrics["requests"]
    arr = _seed_arrivals(case, int(case["seed"]), rate=float(metrics["arrivals"]["rate_per_s"]))
    made = arr.due(longer * max(req["arrival_us"]) * 1e-6)
    n = len(req["arrival_us"])
    if len(made) < n or any(abs(r.arrival * 1e6 - t) > 1.0 or r.prompt_tokens != p
                            for r, t, p in zip(made, req["arrival_us"], req["prompt_tokens"])):
        raise check.ServerDataError(f"{case['name']}: its requests are not its seed's")
    return {"trace": {"arrival_us": [r.arrival * 1e6 for r in made],
                      "output_tokens": [r.output_tokens for r in made],
                      "prompt_tokens": [r.prompt_tokens for r in made]}}


def what_if(fit_config: dict, prefill: dict, metrics: dict) -> dict:
    """The overrides that turn the fitted config into one measured prefill case: a Poisson
    load replays the requests the repeat received, run on with its seed's later ones
    (:func:`trace`; a repeat of 250 steps sees 20-140 requests, too few for another draw of
    the same rate to give its throughput), a closed loop is a closed loop sending the
    repeat's own requests in order (:func:`closed_lengths`)."""
    case, arrivals = metrics["case"], metrics.get("arrivals") or {}
    wl: dict = {"max_batch": check.MAX_BATCH,
                "output_tokens": check.output_tokens(case.get("output_tokens", "16..128")),
                "prompt_tokens": _lengths(case.get("prompt_tokens", "64..512"))}
    if "rate_per_s" in arrivals:
        del wl["output_tokens"], wl["prompt_tokens"]
        wl["arrivals"] = trace(metrics)
    elif "concurrency" in arrivals:  # the repeat's own requests, in the order sent
        wl["closed_loop"] = {"concurrency": int(arrivals["concurrency"]),
                             "lengths": closed_lengths(metrics)}
    else:
        raise check.ServerDataError(f"{case.get('name', '?')}: neither a rate nor a concurrency")
    chunk = int(case.get("chunk_tokens", prefill["chunk_tokens"]))
    return check.what_if(fit_config, metrics, wl, default_steps=250,
                         prefill={**prefill, "chunk_tokens": chunk},
                         overlap=bool(case.get("overlap", True)))


def measured(metrics: dict) -> dict:
    """One repeat's figures, by the simulator's rules (measured steps: warm-up to the
    second-last; requests whose last token's step is measured). The TTFT to the result on
    the host ends where the simulator's does (``request_ttft_us``: the first token's step's
    result processed) and SGLang's client sees it (``stream_output``, at the end of
    ``process_batch_result``): at the end of that step's processing, ``proc_end_us``
    (:func:`first_token_processed`), not the server's ``first_token_host_us``."""
    st, req, steps = metrics["steps"], metrics["requests"], check.measured_steps(metrics)
    start = np.asarray(st["fwd_start_us"], dtype=float)
    step_us = (start[1:] - start[:-1])[steps]
    batch = np.asarray(st["batch"], dtype=float)[steps]
    accept = float(metrics.get("accept_tokens", 1.0))
    keep = check.finished_requests(metrics)
    arr = np.asarray(req["arrival_us"], dtype=float)[keep]
    out_tokens = np.asarray(req["output_tokens"], dtype=float)[keep]
    f_dev = np.asarray(req["first_token_dev_us"], dtype=float)[keep]
    f_host = first_token_processed(metrics)[keep]
    last = np.asarray(req["finish_dev_us"], dtype=float)[keep]
    multi = out_tokens > 1
    total = float(step_us.sum())
    return {"step_us": float(step_us.mean()),
            "tpot_us": float(np.mean((last - f_dev)[multi] / (out_tokens[multi] - 1))),
            "tokens_per_s": float((batch * accept).sum() / total * 1e6),
            "requests_per_s": float(keep.sum() / total * 1e6),
            "ttft_forward_us": float(np.mean(f_dev - arr)),
            "ttft_us": float(np.mean(f_host - arr)), "requests": int(keep.sum())}


def first_token_processed(metrics: dict) -> np.ndarray:
    """Per request: the host instant its first token's step's result had been processed,
    ``steps.proc_end_us`` of its ``first_token_step`` (NaN where none). The server stamps
    ``first_token_host_us`` when that processing begins (right after the result's
    synchronize, before the per-request work the server pads to ``process_us``), 0.6-0.9 ms
    before the end on the shapes runs, where the simulator's ``request_ttft_us`` and a
    client's first token are: against the server's stamp, the predicted wait from the
    forward's end to the result exceeded the measured one by that much in every case
    (calibration/README.md, "Why the TTFT to the first token's forward was short")."""
    k = np.asarray(metrics["requests"]["first_token_step"], dtype=np.int64)
    end = np.asarray(metrics["steps"]["proc_end_us"], dtype=float)
    ok = (k >= 0) & (k < len(end))
    out = np.full(len(k), np.nan)
    out[ok] = end[k[ok]]
    return out


def predicted(summary: dict) -> dict:
    return {"step_us": summary["step_us_mean"], "tpot_us": summary["request_tpot_us_mean"],
            "tokens_per_s": summary["tokens_per_s"], "requests_per_s": summary["requests_per_s"],
            "ttft_forward_us": summary["request_ttft_forward_us_mean"],
            "ttft_us": summary["request_ttft_us_mean"],
            "requests": summary["requests_completed"]}


def evaluate(folder: Path | None = None, keep_profiler_cost: bool = False,
             as_captured: bool = False) -> dict:
    """Fit, predict every prefill case, compare (see the module docstring);
    ``keep_profiler_cost``: the fit and the prefill's host time with the profiler's host cost
    kept; ``as_captured``: every repeat at the sweep's host speed, those slower by more than
    :data:`lab.check.HOST_SPEED_MAX` not judged (the table before each repeat's host speed
    was an input)."""
    folder = Path(folder or check.DEFAULT_DIR)
    sw = check.sweep(folder, CASE, ("load", "loop"), "prefill_*.metrics.json[.gz] (the "
                     "prefill cases: python -m lab.server OUT --suite prefill)",
                     keep_profiler_cost)
    fit = sw.fit
    pf = prefill_model(folder, fit.host_scale, fit.scale,
                       profiler_cost=not keep_profiler_cost)
    # the fit's lines are clamped >= 0 at batch 0 by the fit (prefill-only steps)
    config = {**fit.config, "prefill": pf["section"]}
    # the host speed the model's prefill describes: the capture's steps that prefill, as the
    # prefill's host time is read from them (less the profiler's cost, x the sweep's factor)
    path = check.metrics_file(folder, PREFILL_METRICS) or folder / PREFILL_METRICS
    line = prefill_line(folder / PREFILL_CAPTURE, check.read_metrics(path),
                        net=not keep_profiler_cost, scale=fit.host_scale)
    out = {"fit": {"scale": fit.scale, "host_scale": fit.host_scale, "prefill": pf,
                   "prefill_line": line,
                   "clamped": sorted(k for k, f in fit.fits.items() if f.clamped)},
           "cases": {}, "signs": {}}
    for (load, loop), repeats in sw.cases.items():
        # each repeat's host speed (lab.check.host_speed: its unpadded host work on the steps
        # that prefill nothing, over the un-profiled sweep's at the same batches: the host the
        # fit is rescaled to), from its own host stamps: an input about the machine
        speeds = [check.host_speed(r, sw.line, decode_only=True) for r in repeats]
        prefill_speeds: list = [None] * len(repeats)
        if as_captured:  # the sweep's host speed; a repeat slower by more than
            # HOST_SPEED_MAX is reported, not judged (all judged where none is)
            configs = [config] * len(repeats)
            kept = check.judged_repeats(repeats, sw.line, decode_only=True)[1]
            judged = [any(r is j for j in kept) for r in repeats]
        else:  # the model's host at each repeat's speeds (lab.host_speed): all judged
            prefill_speeds = [prefill_speed(r, line) for r in repeats]
            configs = [host_at(config, v, p) for v, p in zip(speeds, prefill_speeds)]
            judged = [True] * len(repeats)
        use = [i for i, ok in enumerate(judged) if ok]
        seeds = [int(repeats[i]["case"].get("seed", 0)) for i in use]
        # each repeat is predicted with its own requests (a closed loop: its own seed)
        sims = [predicted(simulate(configs[i], {
            **what_if(configs[i], configs[i]["prefill"], repeats[i]), "seed": sd}).summary)
            for i, sd in zip(use, seeds)]
        change = what_if(config, pf["section"], repeats[0])
        reps = [measured(repeats[i]) for i in use]
        meas = {k: check.mean_spread([r[k] for r in reps]) for k in reps[0]}
        pred = {k: float(np.mean([s[k] for s in sims])) for k in sims[0]}
        rows = {k: check.relative_row(meas[k][0], pred[k], TARGETS.get(k), meas[k][1])
                for k in FIGURES}
        change = {k: v for k, v in change.items() if k != "workload"}  # (the trace is long)
        out["cases"][f"{load}_{loop}"] = {"load": load, "loop": loop, "what_if": change,
                                          "by_seed": {sd: (m, p) for sd, m, p in
                                                      zip(seeds, reps, sims)},
                                          "repeats": len(repeats), "host_speed": speeds,
                                          "prefill_host_speed": prefill_speeds,
                                          "scaled": not as_captured, "judged": judged,
                                          "rows": rows,
                                          "requests": (meas["requests"][0], pred["requests"])}
    for load in sorted({c["load"] for c in out["cases"].values()}):
        on, off = out["cases"].get(f"{load}_overlap"), out["cases"].get(f"{load}_normal")
        if on is None or off is None:
            continue
        # paired: the repeats of the same seed (the same requests) judged in both loops
        common = sorted(set(on["by_seed"]) & set(off["by_seed"]))
        if not common:
            continue
        out["signs"][load] = {"seeds": common, **paired_signs(on, off, common)}
    out["ok"] = all(r["ok"] is not False for c in out["cases"].values()
                    for r in c["rows"].values()) and \
        all(v[k]["ok"] is not False for v in out["signs"].values() for k in FIGURES)
    return out


LABELS = {"step_us": "step µs", "tpot_us": "TPOT µs", "tokens_per_s": "tokens/s",
          "requests_per_s": "req/s", "ttft_forward_us": "TTFT fwd ms", "ttft_us": "TTFT ms"}


def cell(row: dict, key: str) -> str:
    scale = 1e-3 if key.startswith("ttft") else 1.0
    m, p, e = row["measured"] * scale, row["predicted"] * scale, row["error"]
    fmt = ".1f" if key in ("requests_per_s",) or scale != 1.0 else ".0f"
    mark = "" if row["ok"] is not False else " MISS"
    return f"{m:{fmt}} / {p:{fmt}} ({100 * e:+.1f}%){mark}"


def speeds(case: dict) -> str:
    """A case's repeats' host speeds, those not judged in brackets, each with its steps'
    that prefill where it was predicted at it (``x1.97/1.30``: decode steps / steps that
    prefill)."""
    pre = case.get("prefill_host_speed") or [None] * len(case["host_speed"])
    out = []
    for v, p, ok in zip(case["host_speed"], pre, case["judged"]):
        text = f"x{v:.2f}" + (f"/{p:.2f}" if p is not None and math.isfinite(p) else "")
        out.append(text if ok else f"({text})")
    return ", ".join(out)


def settled(diffs: list[float]) -> bool:
    """Whether paired repeats measure a difference's direction: every seed's difference (the
    same requests on both sides) has one sign. Where they disagree the measurement cannot
    tell which side is the larger (a mean of +1 ms over seeds of -0.9, +9.0 and -4.1 ms says
    nothing the next repeat would not overturn), so a sign or a recommendation resting on it
    is reported, not judged: too close to call. The one rule both checkers judge by."""
    signs = {float(np.sign(d)) for d in diffs}
    return len(diffs) > 0 and len(signs) == 1 and 0.0 not in signs


def paired_signs(on: dict, off: dict, common: list, judge: bool = True) -> dict:
    """Per figure, the on-vs-off difference measured and predicted, each the mean over the
    ``common`` seeds (the same requests in both loops), and whether their signs agree (None:
    not judged; ``settled`` False: the seeds' measured differences disagree in sign, too
    close to call, :func:`settled`)."""
    signs = {}
    for k in FIGURES:
        diffs = [on["by_seed"][sd][0][k] - off["by_seed"][sd][0][k] for sd in common]
        m = float(np.mean(diffs))
        p = float(np.mean([on["by_seed"][sd][1][k] - off["by_seed"][sd][1][k] for sd in common]))
        ok = settled(diffs)
        signs[k] = {"measured": m, "predicted": p, "settled": ok,
                    "ok": bool(np.sign(m) == np.sign(p)) if judge and ok else None}
    return signs


def sign_mark(sign: dict) -> str:
    """What a sign's cell says after its values: nothing where it is right."""
    if sign["ok"] is None:
        return " (too close to call)" if sign.get("settled") is False else " (not judged)"
    return "" if sign["ok"] else " WRONG SIGN"


def sign_values(sign: dict, key: str) -> str:
    """An on-vs-off difference, measured / predicted (TTFTs in ms)."""
    s = sign[key]
    scale = 1e-3 if key.startswith("ttft") else 1.0
    return f"{s['measured'] * scale:+.1f} / {s['predicted'] * scale:+.1f}"


def markdown(result: dict) -> str:
    pf = result["fit"]["prefill"]
    sec = pf["section"]
    head = (f"Decode: the sweeping capture's fit (device x {result['fit']['scale']:.4f}, host x "
            f"{result['fit']['host_scale']:.4f}); prefill: host {sec['host_us']['base']:.1f} + "
            f"{sec['host_us']['per_token']:.4f} x tokens µs, device "
            f"{sec['forward_us']['base']:.1f} + {sec['forward_us']['per_token']:.4f} x tokens "
            f"µs, in chunks of {sec['chunk_tokens']} ({pf['from']}).")
    if all(c.get("scaled") for c in result["cases"].values()):  # (--as-captured: as before)
        a, b = result["fit"]["prefill_line"]
        head += ("\n\nEach repeat predicted at its own host speeds (the factors shown: its "
                 "unpadded host work over the un-profiled sweep's, on the steps that prefill "
                 "nothing / over the prefill capture's on those that prefill, "
                 f"{a:.0f} {b:+.3f} x tokens µs; the model's host durations x the first, "
                 "its prefill's x the second), every repeat judged.")
    cases = []
    for c in result["cases"].values():
        m, p = c["requests"]
        cases.append([c["load"], c["loop"], speeds(c), f"{m:.1f} / {p:.1f}",
                      *(cell(c["rows"][k], k) for k in FIGURES)])
    signs = []
    for load, sign in result["signs"].items():
        cells = [sign_values(sign, k) + sign_mark(sign[k]) for k in FIGURES]
        signs.append([load, ", ".join(map(str, sign["seeds"])), *cells])
    return "\n".join([
        head, "",
        *check.table(["load", "loop", "repeats: host speed", "requests meas. / pred.",
                      *(f"{LABELS[k]} meas. / pred. (err)" for k in FIGURES)], cases), "",
        *check.table(["load", "seeds", "on - off, meas. / pred.: " + LABELS[FIGURES[0]],
                      *(LABELS[k] for k in FIGURES[1:])], signs)])


def main(argv: list[str] | None = None) -> int:
    # the listed misses are the comparison's findings (tests/test_prefill_check.py), not a
    # failure of the command: it exits 0 whatever the verdict
    return check.command(argv, "python -m lab.prefill_check", __doc__.split("\n\n")[0],
                         evaluate, markdown, status_is_verdict=False,
                         flags={"--as-captured": ("as_captured", AS_CAPTURED_HELP)})


AS_CAPTURED_HELP = (f"predict every repeat at the sweep's host speed and leave out those "
                    f"whose host ran more than {check.HOST_SPEED_MAX}x slower (the table "
                    f"before each repeat's measured host speed was an input)")


if __name__ == "__main__":
    sys.exit(main())
