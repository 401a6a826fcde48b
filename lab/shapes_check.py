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
``prefill`` range's kernels are a phase of their own, so the fitted phase table is the decode
steps') and
:func:`simwar.fit.from_capture.fit_model`, the path of ``simwar import --fit``, with the
profiler's own host cost subtracted by the capture's event counts and the graph buckets the
capture never ran extrapolated (the loads reach buckets 32 and 64 that the capture did not).
Where the fit's config has no ``scheduling:`` or ``prefill:`` key (the fit of this version
leaves the prefill steps out), this checker fills them from the same capture
(:func:`filled`, marked ``FILLED`` in the output, to be dropped once the fit writes them):
the rule of the mode (``sglang`` or ``sglang_mixed``), and the prefill's cost as two lines in
the step's prefill tokens, read as :mod:`lab.prefill_check` reads them: the host's extra time
in a step that prefills (``scheduler.run_batch`` and ``prepare_for_decode`` less the profiler's
own cost in them, over the steps without a chunk: their prepare alone for a prefill step,
which runs no decode phase; prepare and run_batch for a mixed step) and the device work left
after the host's last launch of the ``prefill`` range (its GPU end past its host end).

**Each case** is then a what-if of its mode's model: its arrivals (a Poisson repeat replays
its own requests, a closed loop is a closed loop of its seed), lengths, chunk, loop
(``policy.overlap``), barrier and length. Compared, as :mod:`lab.prefill_check` compares
them (its :func:`~lab.prefill_check.measured` and :func:`~lab.prefill_check.predicted`):
TPOT, throughput (decode tokens per second), TTFT mean to the first token's forward end and
to its result on the host, with step time and request rate reported. Targets
(:data:`TARGETS`): TPOT and throughput within 5 %, TTFT means within 10 %; for each mode and
load the sign of every on-vs-off difference (paired by seed); and the **recommendations**,
measured against predicted: overlap on or off, per mode and load, and "should I turn on mixed
chunk?" per load and loop, a what-if of the ``sglang`` model with the rule ``sglang_mixed``
against the measured mixed cases. A recommendation picks the lower mean request time,
TTFT + TPOT x (mean output - 1) (:func:`score`). Exit status 1 when a figure, a sign or a
recommendation misses. Reported, not judged: each repeat's host speed against the capture's
(the unpadded host work of its decode steps), and where ``DIR/twins`` holds them, the
profiler's effect on the host stages of un-profiled and profiled twins (:func:`twins`).

Runs where simulation runs (simwar's full stack), not on the GPU machine.
"""

from __future__ import annotations

import gzip
import json
import re
import sys
from pathlib import Path

import numpy as np

from lab import check, prefill_check
from lab.server_requests import Arrivals, Dist
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
#: the steps a fit leaves out at the start of the capture
WARMUP = 5


def capture_path(folder: Path, mode: str) -> Path:
    return folder / f"shapes_{mode}_medium_overlap_profiled.kineto.json.gz"


def filled(folder: Path, mode: str, fit) -> tuple[dict, str]:
    """FILLED here until simwar's fit reads prefill and mixed steps: the ``prefill:`` section
    of ``mode``'s capture (module docstring) and what it was read from."""
    capture = capture_path(folder, mode)
    events = json.loads(gzip.decompress(capture.read_bytes()))["traceEvents"]
    steps = [e for e in events if e.get("cat") == "user_annotation"
             and str(e.get("name", "")).startswith("ProfilerStep#")]
    name = capture.name.replace(".kineto.json.gz", ".metrics.json")
    st = check.read_metrics(check.metrics_file(folder, name) or folder / name)["steps"]
    tokens = st["prefill_tokens"]
    less = prefill_check.profiler_cost_of(capture, steps)
    run = prefill_check.step_ranges(events, steps, "scheduler.run_batch", less=less)
    prep = prefill_check.step_ranges(events, steps, "scheduler.prepare_for_decode", less=less)
    ks = [k for k in sorted(run) if WARMUP <= k < len(tokens) and k in prep]
    plain = [k for k in ks if tokens[k] == 0]
    with_prefill = [k for k in ks if tokens[k] > 0]
    if len(with_prefill) < 3 or not plain:
        raise check.ServerDataError(f"{capture}: fewer than 3 prefill steps, or none without")
    # what a step without a chunk spends too: its prepare (a prefill step runs no decode
    # phase); its prepare and run_batch (a mixed step runs the decode phases as well)
    base = float(np.mean([prep[k] + (run[k] if mode == "mixed" else 0.0) for k in plain]))
    host = {k: fit.host_scale * (run[k] + prep[k] - base) for k in with_prefill}
    pairs: dict = {}
    for e in events:
        if e.get("name") == "prefill" and e.get("cat") in ("user_annotation",
                                                          "gpu_user_annotation"):
            pairs.setdefault((e.get("args") or {}).get("External id"), {})[e["cat"]] = e
    starts = [(s["ts"], s["ts"] + s["dur"], int(s["name"][len("ProfilerStep#"):]))
              for s in steps]
    tail = {}
    for pair in pairs.values():
        h, g = pair.get("user_annotation"), pair.get("gpu_user_annotation")
        if h is None or g is None:
            continue
        k = next((k for a, b, k in starts if a <= h["ts"] < b), None)
        if k in host:  # the device work left once the host launched the prefill's last kernel
            tail[k] = fit.scale * max(0.0, g["ts"] + g["dur"] - (h["ts"] + h["dur"]))
    ks = sorted(tail)
    if len(ks) < 3:
        raise check.ServerDataError(f"{capture}: fewer than 3 prefill ranges on the GPU")
    x = [float(tokens[k]) for k in ks]
    case = check.read_metrics(check.metrics_file(folder, name) or folder / name)["case"]
    section = {"chunk_tokens": int(case["chunk_tokens"]),
               "forward_us": prefill_check.token_line(x, [tail[k] for k in ks]),
               "host_us": prefill_check.token_line(x, [host[k] for k in ks]), "graph": "eager"}
    return section, (f"{capture.name}: {len(ks)} steps that prefill, {len(plain)} without; "
                     f"host mean {np.mean([host[k] for k in ks]):.0f} µs, device after the "
                     f"last launch mean {np.mean([tail[k] for k in ks]):.0f} µs")



def clamp_lines(node, where: str = "") -> list[str]:
    """CLAMPED here until the fit clamps its lines (issue 28, item 4): every ``{base,
    per_seq}`` line of ``node`` that goes below zero at a batch up to the admission cap is
    bent to reach zero there, in place; returns the keys it changed."""
    out = []
    if isinstance(node, dict):
        if "base" in node and "per_seq" in node:
            top = node["base"] + node["per_seq"] * check.MAX_BATCH
            if node["base"] >= 0 > top:
                node["per_seq"] = -node["base"] / check.MAX_BATCH
                out.append(where)
        for k, v in node.items():
            out += clamp_lines(v, f"{where}.{k}" if where else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += clamp_lines(v, f"{where}[{i}]")
    return out


def extrapolate_buckets(node, buckets, where: str = "") -> list[str]:
    """EXTRAPOLATED here: every ``per_bucket`` table of ``node`` gets the ``buckets`` it lacks
    from the line through its two largest (the fit's own rule with ``extrapolate_buckets``,
    which reaches only the buckets the capture's graphs name: this one ran 8 and 16, the
    loads reach 32 and 64), never below the largest; in place; returns the keys changed."""
    out = []
    if isinstance(node, dict):
        table = node.get("per_bucket")
        if isinstance(table, dict) and len(table) >= 2:
            have = sorted(int(b) for b in table)
            (b0, v0), (b1, v1) = ((b, table[b if b in table else str(b)]) for b in have[-2:])
            slope = (v1 - v0) / (b1 - b0)
            for b in buckets:
                if b not in table and str(b) not in table:
                    table[b] = max(v1, v1 + slope * (b - b1))
                    out.append(f"{where}.per_bucket.{b}")
        for k, v in node.items():
            if k != "per_bucket":
                out += extrapolate_buckets(v, buckets, f"{where}.{k}" if where else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            name = v.get("name", i) if isinstance(v, dict) else i
            out += extrapolate_buckets(v, buckets, f"{where}.{name}")
    return out


def model(folder: Path, mode: str, keep_profiler_cost: bool = False) -> dict:
    """``mode``'s fitted config, with ``scheduling:`` and ``prefill:`` (the fit's or FILLED),
    and what each came from."""
    capture = capture_path(folder, mode)
    if not capture.exists():
        raise check.ServerDataError(f"{capture}: not found (the profiled case of mode {mode}: "
                                    f"python -m lab.server OUT --suite shapes)")
    cap = open_capture(capture, check.SERVER_MAPPING)
    fit = fit_model(cap, capture=capture.name, profiler_cost=not keep_profiler_cost)
    config = json.loads(json.dumps(fit.config))
    notes = {"clamped": clamp_lines(config),
             "extrapolated": extrapolate_buckets(config, SERVER_BUCKETS)}
    config["workload"]["graph_buckets"] = list(SERVER_BUCKETS)
    if "prefill" not in config:
        config["prefill"], notes["prefill"] = filled(folder, mode, fit)
        notes["prefill"] = "FILLED from " + notes["prefill"]
    else:
        notes["prefill"] = "the fit's"
    if "scheduling" not in config:
        config["scheduling"] = {"rule": RULES[mode]}
        notes["scheduling"] = f"FILLED: rule {RULES[mode]} (the mode)"
    else:
        notes["scheduling"] = "the fit's"
    name = capture.name.replace(".kineto.json.gz", ".metrics.json")
    x, y = check._unpadded(check.read_metrics(check.metrics_file(folder, name)
                                              or folder / name), decode_only=True)
    slope, base = np.polyfit(x, y, 1)
    return {"config": config, "notes": notes, "warnings": list(fit.warnings),
            "host_line": (float(base), float(slope)),
            "buckets": list((config.get("workload") or {}).get("graph_buckets") or [])}


def score(figures: dict, mean_output: float) -> float:
    """A request's mean time as a recommendation weighs it: TTFT (to its result on the
    host) + TPOT x (mean output - 1)."""
    return figures["ttft_us"] + figures["tpot_us"] * (mean_output - 1.0)


def trace(metrics: dict, longer: float = 4.0) -> dict:
    """A Poisson repeat's requests as ``workload.arrivals.trace``, run on past its end: the
    server's own arrivals of the case's seed (:class:`lab.server_requests.Arrivals`: the gaps
    and lengths come from the seed, whatever the timing), ``longer`` x as long as the
    measured ones, whose first requests are the repeat's own (checked): a predicted run
    slower than the server's needs requests the repeat never received."""
    case, req = metrics["case"], metrics["requests"]
    arr = Arrivals(seed=int(case["seed"]), output=Dist.parse(case["output_tokens"]),
                   prompt=Dist.parse(case["prompt_tokens"]),
                   rate=float(metrics["arrivals"]["rate_per_s"]))
    made = arr.due(longer * max(req["arrival_us"]) * 1e-6)
    n = len(req["arrival_us"])
    if len(made) < n or any(abs(r.arrival * 1e6 - t) > 1.0 or r.prompt_tokens != p
                            for r, t, p in zip(made, req["arrival_us"], req["prompt_tokens"])):
        raise check.ServerDataError(f"{case['name']}: its requests are not its seed's")
    return {"trace": {"arrival_us": [r.arrival * 1e6 for r in made],
                      "output_tokens": [r.output_tokens for r in made],
                      "prompt_tokens": [r.prompt_tokens for r in made]}}


def _predict(config: dict, metrics: dict, rule: str | None = None) -> dict:
    change = prefill_check.what_if(config, config["prefill"], metrics)
    if "arrivals" in change["workload"]:
        change["workload"]["arrivals"] = trace(metrics)
    if rule is not None:
        change["scheduling.rule"] = rule
    change["seed"] = int(metrics["case"].get("seed", 0))
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


def evaluate(folder: Path | None = None, keep_profiler_cost: bool = False) -> dict:
    """Fit each mode, predict every case, compare (see the module docstring)."""
    folder = Path(folder or DEFAULT_DIR)
    cases = check.load_repeats(folder, CASE, ("mode", "load", "loop"))
    if not cases:
        raise check.ServerDataError(f"{folder}: no shapes_*.metrics.json[.gz] (python -m "
                                    f"lab.server OUT --suite shapes)")
    models = {mode: model(folder, mode, keep_profiler_cost) for mode in MODES}
    out: dict = {"models": {m: {k: v for k, v in d.items() if k != "config"}
                            | {"prefill": d["config"]["prefill"],
                               "phases": d["config"]["phases"]}
                            for m, d in models.items()},
                 "cases": {}, "signs": {}, "overlap": {}, "mixed": {}}
    what_if_mixed: dict = {}
    for (mode, load, loop), repeats in cases.items():
        config = models[mode]["config"]
        reps = [prefill_check.measured(r) for r in repeats]
        sims = [_predict(config, r) for r in repeats]
        meas = {k: check.mean_spread([r[k] for r in reps]) for k in reps[0]}
        pred = {k: float(np.mean([s[k] for s in sims])) for k in sims[0]}
        rows = {k: check.relative_row(meas[k][0], pred[k], TARGETS.get(k), meas[k][1])
                for k in FIGURES}
        out_mean = float(np.mean([np.mean(r["requests"]["output_tokens"]) for r in repeats]))
        # reported, not judged: how much slower each repeat's host ran than the capture's
        # (the H200 machine's vCPU ran at two speeds; nothing pads the prepare and launch)
        speeds = [check.host_speed(r, models[mode]["host_line"], decode_only=True)
                  for r in repeats]
        seeds = [int(r["case"].get("seed", 0)) for r in repeats]
        out["cases"][f"{mode}_{load}_{loop}"] = {
            "mode": mode, "load": load, "loop": loop, "repeats": len(repeats), "rows": rows,
            "host_speed": speeds,
            "requests": (meas["requests"][0], pred["requests"]), "mean_output": out_mean,
            "by_seed": {sd: (m, p) for sd, m, p in zip(seeds, reps, sims)}}
        if mode == "sglang":  # the what-if: the same model, mixed chunk turned on
            mixed = [_predict(config, r, rule=RULES["mixed"]) for r in repeats]
            what_if_mixed[(load, loop)] = {sd: p for sd, p in zip(seeds, mixed)}
    for mode in MODES:
        for load in ("light", "medium", "closed16"):
            on = out["cases"].get(f"{mode}_{load}_overlap")
            off = out["cases"].get(f"{mode}_{load}_normal")
            if on is None or off is None:
                continue
            common = sorted(set(on["by_seed"]) & set(off["by_seed"]))
            signs = {}
            for k in FIGURES:
                m = float(np.mean([on["by_seed"][sd][0][k] - off["by_seed"][sd][0][k]
                                   for sd in common]))
                p = float(np.mean([on["by_seed"][sd][1][k] - off["by_seed"][sd][1][k]
                                   for sd in common]))
                signs[k] = {"measured": m, "predicted": p, "ok": bool(np.sign(m) == np.sign(p))}
            out["signs"][f"{mode}_{load}"] = {"seeds": common, **signs}
            n = on["mean_output"]
            m_on, m_off = (float(np.mean([score(c["by_seed"][sd][0], n) for sd in common]))
                           for c in (on, off))
            p_on, p_off = (float(np.mean([score(c["by_seed"][sd][1], n) for sd in common]))
                           for c in (on, off))
            out["overlap"][f"{mode}_{load}"] = _advice("on", "off", m_on, m_off, p_on, p_off)
    for (load, loop), preds in sorted(what_if_mixed.items()):
        sg = out["cases"][f"sglang_{load}_{loop}"]
        mx = out["cases"].get(f"mixed_{load}_{loop}")
        if mx is None:
            continue
        common = sorted(set(sg["by_seed"]) & set(mx["by_seed"]) & set(preds))
        n = sg["mean_output"]
        m_mx = float(np.mean([score(mx["by_seed"][sd][0], n) for sd in common]))
        m_sg = float(np.mean([score(sg["by_seed"][sd][0], n) for sd in common]))
        p_mx = float(np.mean([score(preds[sd], n) for sd in common]))
        p_sg = float(np.mean([score(sg["by_seed"][sd][1], n) for sd in common]))
        out["mixed"][f"{load}_{loop}"] = _advice("mixed", "separate", m_mx, m_sg, p_mx, p_sg)
    out["ok"] = (all(r["ok"] is not False for c in out["cases"].values()
                     for r in c["rows"].values())
                 and all(v[k]["ok"] for v in out["signs"].values() for k in FIGURES)
                 and all(v["ok"] for v in out["overlap"].values())
                 and all(v["ok"] for v in out["mixed"].values()))
    for c in out["cases"].values():
        del c["by_seed"]
    out["twins"] = twins(folder)  # reported, not judged
    return out


def _advice(yes: str, no: str, m_yes: float, m_no: float, p_yes: float, p_no: float) -> dict:
    """A recommendation, measured and predicted: ``yes`` where its score is the lower."""
    meas, pred = (yes if m_yes < m_no else no), (yes if p_yes < p_no else no)
    return {"measured": meas, "predicted": pred, "ok": meas == pred,
            "measured_us": {yes: m_yes, no: m_no}, "predicted_us": {yes: p_yes, no: p_no}}


def markdown(result: dict) -> str:
    lines = []
    for mode, m in result["models"].items():
        sec = m["prefill"]
        notes = m["notes"]
        lines.append(f"- {mode}: scheduling {notes['scheduling']}; prefill host "
                     f"{sec['host_us']['base']:.0f} + "
                     f"{sec['host_us']['per_token']:.3f} x tokens µs, device "
                     f"{sec['forward_us']['base']:.0f} + {sec['forward_us']['per_token']:.3f} "
                     f"x tokens µs, chunk {sec['chunk_tokens']} ({notes['prefill']}); "
                     f"graph buckets {m['buckets']}, EXTRAPOLATED here: "
                     f"{', '.join(notes['extrapolated']) or 'none'}; CLAMPED here at batch "
                     f"{check.MAX_BATCH}: {', '.join(notes['clamped']) or 'none'}")
    rows = []
    for c in result["cases"].values():
        m, p = c["requests"]
        rows.append([c["mode"], c["load"], c["loop"],
                     ", ".join(f"x{v:.2f}" for v in c["host_speed"]), f"{m:.0f} / {p:.0f}",
                     *(prefill_check.cell(c["rows"][k], k) for k in FIGURES)])
    signs = []
    for key, sign in result["signs"].items():
        cells = []
        for k in FIGURES:
            s = sign[k]
            scale = 1e-3 if k.startswith("ttft") else 1.0
            cells.append(f"{s['measured'] * scale:+.1f} / {s['predicted'] * scale:+.1f}"
                         + ("" if s["ok"] else " WRONG SIGN"))
        signs.append([key.replace("_", " "), *cells])
    advice = []
    for question, table in (("overlap on?", result["overlap"]),
                            ("mixed chunk?", result["mixed"])):
        for key, a in table.items():
            ms = " / ".join(f"{k} {v / 1e3:.1f}" for k, v in a["measured_us"].items())
            ps = " / ".join(f"{k} {v / 1e3:.1f}" for k, v in a["predicted_us"].items())
            advice.append([question, key.replace("_", " "), a["measured"], a["predicted"],
                           ms, ps, "" if a["ok"] else "WRONG"])
    twin_rows = [[str(t["run"]), t["mode"],
                  *(f"{t['unprofiled'][sh][st]:.0f} / {t['profiled'][sh][st]:.0f} "
                    f"(x{t['ratio'][sh][st]:.2f})" for sh in ("prefill", "decode")
                    for st in ("prepare", "launch"))] for t in result.get("twins", [])]
    twin_table = ["", "The profiler on the host (twins, medium load, overlap; un-profiled / "
                  "profiled µs per step, from the host stamps):", "",
                  *check.table(["run", "mode", "prefill prepare", "prefill launch",
                                "decode prepare", "decode launch"], twin_rows)
                  ] if twin_rows else []
    return "\n".join([
        "Models, each from its mode's one capture (simwar's fit; FILLED: by this checker):",
        *lines, "",
        *check.table(["mode", "load", "loop", "repeats: host speed", "requests meas. / pred.",
                      *(f"{LABELS[k]} meas. / pred. (err)" for k in FIGURES)], rows), "",
        *check.table(["mode, load", "on - off, meas. / pred.: " + LABELS[FIGURES[0]],
                      *(LABELS[k] for k in FIGURES[1:])], signs), "",
        *check.table(["question", "case", "measured", "predicted",
                      "measured score ms", "predicted score ms", ""], advice),
        *twin_table])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not any(not a.startswith("-") for a in argv):
        argv.insert(0, str(DEFAULT_DIR))
    return check.command(argv, "python -m lab.shapes_check", __doc__.split("\n\n")[0],
                         evaluate, markdown, status_is_verdict=True)


if __name__ == "__main__":
    sys.exit(main())
