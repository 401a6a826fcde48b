"""Fit the probe's fine capture, predict the other variants, compare with their captures.

``python -m lab.probe_check DIR`` reads what ``python -m
lab.probe`` wrote (``DIR/probe_<variant>.kineto.json.gz``,
``DIR/probe_metrics.json``) with the mapping ``DIR/mapping.yaml`` (default: the
one in ``tests/data/probe``), fits the **fine** capture only
(:func:`simwar.fit.from_capture.fit_model`; the policy from the capture's sync
events, or ``fine`` when they name no record), then asks the fitted config
what-if for every other variant (``policy.barrier=coarse``, ``none``; the
process_result CPU work plus the variant's known extra µs) and compares each
prediction with that variant's own capture (:func:`simwar.fit.check.check_rows`).
Each capture is also fitted from itself (its own barrier named when it cannot
be read) as the fit's own check. Every fit keeps the profiler's own host cost
(``profiler_cost=False``): its targets are profiled captures. Races: the probe's
value check (a gather that read a later step's stamp) in the profiled and the
un-profiled run, against the simulation's latent races and the steps where it
observes an overlap.

Prints a Markdown table (``--json`` for the numbers). Runs where simulation
runs (simwar's full stack), not on the GPU machine: it reads the captures through
:mod:`simwar.capture`, never through :mod:`simwar.harness` (the GPU side, which does
not import the capture reader).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from simwar.analysis.metrics import measured
from simwar.api import simulate
from simwar.capture.mapping import load_mapping
from simwar.capture.open import finish_capture
from simwar.capture.stalls import import_report
from simwar.capture.to_trace import import_kineto
from simwar.fit.check import accepted, check_rows
from simwar.fit.from_capture import FitError, fit_model

#: The probe on the GPU machine writes captures and metrics but no mapping: the mapping for
#: its SGLang range names is committed with the code, beside the committed captures in
#: tests/data/probe, and a folder fresh from the GPU machine is read with it. It exists in a
#: source checkout only (an installed simwar has no tests/): elsewhere pass ``--mapping`` or
#: put a mapping.yaml in the folder.
DEFAULT_MAPPING = Path(__file__).resolve().parents[1] / "tests" / "data" / "probe" / \
    "mapping.yaml"
BARRIER = {"fine": "fine", "coarse": "coarse", "none": "none", "fine_host1000": "fine"}


def _shift(value, us: float):
    if isinstance(value, dict):
        d = dict(value)
        if d["dist"] in ("normal", "lognormal"):
            d["mean"] += us
        elif d["dist"] == "uniform":
            d["low"], d["high"] = d["low"] + us, d["high"] + us
        else:
            d["values"] = [v + us for v in d["values"]]
        return d
    return float(value) + us


def _fit(imp, mapping, name: str, barrier: str):
    cap = finish_capture(imp, mapping)  # imported with the probe's own mapping, then sized
    # the profiler's own host cost is kept: every prediction is compared with a capture,
    # which holds it too (docs/profiler-cost.md)
    try:
        return fit_model(cap, capture=name, profiler_cost=False)
    except FitError as e:
        if "cannot infer the barrier policy" not in str(e):
            raise
        return fit_model(cap, capture=name, policy=barrier, profiler_cost=False)


def what_if(metrics: dict, variant: str) -> dict:
    """``(changes, extra_us)``: the ``--set`` changes that turn the fine probe into
    ``variant`` (as the probe ran it), and the µs of CPU work it adds to process_result."""
    v = metrics["variants"][variant]
    change = {}
    if v["barrier"] != "fine":
        change["policy.barrier"] = v["barrier"]
    extra = float(v["host_work_us"].get("extra", 0.0))
    return change, extra


def _observed_steps(result) -> int:
    steps = set(measured(result.steps, result.config.warmup_steps).step.tolist())
    return len({r.second_step for r in result.hazards.observed if r.second_step in steps})


def evaluate(folder: Path, mapping_path: Path | None = None) -> dict:
    folder = Path(folder)
    mapping = load_mapping(mapping_path or (folder / "mapping.yaml"
                                            if (folder / "mapping.yaml").exists()
                                            else DEFAULT_MAPPING))
    metrics = json.loads((folder / "probe_metrics.json").read_text())
    imports = {}
    for variant in metrics["variants"]:
        path = folder / f"probe_{variant}.kineto.json.gz"
        imports[variant] = import_kineto(path, mapping)
    fine = _fit(imports["fine"], mapping, "probe_fine.kineto.json.gz", "fine")
    out = {"fit": {"policy": fine.policy.__dict__, "roles": dict(fine.roles),
                   "config": fine.config, "warnings": fine.warnings},
           "device": metrics.get("device"), "shape": metrics.get("shape"), "variants": {}}
    for variant, imp in imports.items():
        captured = import_report(imp)[1]["metrics"]
        change, extra = what_if(metrics, variant)
        cfg = dict(fine.config)
        overrides = dict(change)
        if extra:
            overrides["cpu.process_result_us"] = _shift(fine.config["cpu"]["process_result_us"],
                                                        extra)
        predicted = simulate(cfg, overrides)
        rows = check_rows(captured, predicted.summary)
        own = _fit(imp, mapping, f"probe_{variant}.kineto.json.gz", BARRIER[variant])
        own_sim = simulate(own.config)
        own_rows = check_rows(captured, own_sim.summary)
        v = metrics["variants"][variant]
        out["variants"][variant] = {
            "what_if": {**change, **({"add cpu.process_result_us": extra} if extra else {})},
            "capture": {k: captured.get(k) for k in ("step_us_mean", "step_us_p99",
                                                     "fwd_gap_us_mean", "launch_ahead_mean",
                                                     "steps_measured")},
            "predicted": {k: predicted.summary.get(k) for k in (
                "step_us_mean", "step_us_p99", "fwd_gap_us_mean", "launch_ahead_mean",
                "races", "overlaps")} | {"overlap_steps": _observed_steps(predicted),
                                         "steps_measured": predicted.summary["steps_measured"]},
            "prediction_ok": accepted(rows),
            "rows": [r._asdict() for r in rows],
            "self_fit_ok": accepted(own_rows),
            "self_fit_policy": own.policy.__dict__,
            "self_rows": [r._asdict() for r in own_rows],
            "measured_unprofiled": v["measured"],
            "races_measured": {"profiled_racy_steps": v["profiled"]["racy_steps_all"],
                               "profiled_steps": v["profiled"]["steps"],
                               "unprofiled_racy_steps": v["measured"]["racy_steps"],
                               "unprofiled_steps": v["measured"].get("steps_measured")},
        }
    return out


def markdown(result: dict) -> str:
    pol = result["fit"]["policy"]
    lines = [f"Fitted from `probe_fine` only: policy {pol['barrier']} ({pol['source']}); "
             f"streams {result['fit']['roles']}.", "",
             "| variant | what-if asked of the fine fit | step measured | step predicted | "
             "error | gap measured | gap predicted | launch-ahead meas./pred. | races measured "
             "(profiled / un-profiled) | races predicted (latent; overlap steps) | within "
             "bounds | own fit within bounds |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for variant, v in result["variants"].items():
        c, p = v["capture"], v["predicted"]
        r = v["races_measured"]
        err = (p["step_us_mean"] - c["step_us_mean"]) / c["step_us_mean"]
        asked = ", ".join(f"{k}={val}" for k, val in v["what_if"].items()) or "(itself)"
        lines.append(
            f"| {variant} | {asked} | {c['step_us_mean']:.1f} | {p['step_us_mean']:.1f} | "
            f"{100 * err:+.2f}% | {c['fwd_gap_us_mean']:.1f} | {p['fwd_gap_us_mean']:.1f} | "
            f"{c['launch_ahead_mean']:.2f} / {p['launch_ahead_mean']:.2f} | "
            f"{r['profiled_racy_steps']}/{r['profiled_steps']} / "
            f"{r['unprofiled_racy_steps']}/{r['unprofiled_steps']} | "
            f"{p['races']}; {p['overlap_steps']}/{p['steps_measured']} | "
            f"{'yes' if v['prediction_ok'] else 'no'} | {'yes' if v['self_fit_ok'] else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.probe_check")
    ap.add_argument("folder", type=Path)
    ap.add_argument("--mapping", type=Path)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    result = evaluate(args.folder, args.mapping)
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
