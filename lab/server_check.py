"""Fit the mini-server's sweeping-load capture, predict its other loads and barriers, compare.

``python -m lab.server_check DIR`` reads what ``python -m lab.server OUT
--suite fit,loads`` wrote on the GPU machine (committed under ``tests/data/server``):

- ``fit_ramp_profiled.kineto.json.gz``: the capture the fit is made from, a load that sweeps
  the batch through every graph bucket (a triangular arrival rate), profiled; it is read with
  ``--preset sglang`` and no mapping (:func:`simwar.capture.open.open_capture`), fitted
  with :func:`simwar.fit.from_capture.fit_model` (policy from the capture's event ids, the
  durations affine in the batch or bucket, its own batch sequence as the workload);
- ``fit_ramp.metrics.json`` (or ``.json.gz``, as every metrics file): the same load
  un-profiled; its per-bucket mean step times rescale the fit's device and host time
  (``--unprofiled-step-us BUCKET=US,...``: the profiler makes graph kernels a few percent longer
  and the host's ranges and API calls slower);
- ``loads_<light|medium|saturated>_<fine|coarse|none>_r<i>.metrics.json``: each load and
  barrier, measured without the profiler, repeated (``r0``, ``r1``, ...).

The H200 machine's host ran at two speeds about 2x apart for seconds at a time (the server's
padded ranges hold their time targets, the rest does not), and a load near the host's limit
then settles in another state: each repeat's host speed is measured against the sweep's
(:func:`lab.check.host_speed`: its unpadded host work per step over the sweep's at the same
batch), and a repeat whose host ran more than :data:`lab.check.HOST_SPEED_MAX` times slower
is reported with its own error but not judged (the fit knows the sweep's host only).

For each load and barrier the fitted config is asked what-if (:func:`what_if`): the case's
Poisson arrivals (its ``rate_per_s``, output lengths, the 64-request cap and its initial
requests), its accepted tokens, its barrier and length; the simulation is compared with the
repeats' mean, figure by figure, against :data:`TARGETS`: mean step time within 4 %, mean
batch and request latency (arrival to the end of the forward that produced the last token, of
the requests that finished in the measured steps, on both sides) within 8 % widened by the
repeats' own spread (reported), forward gap within max(25 µs, 25 %),
each graph bucket's mean step time within 4 % (buckets that ran at least
:data:`BUCKET_MIN_STEPS` measured steps on both sides), and with no barrier a latent race
flagged. Prints a Markdown table (``--json``: the numbers); exits 1 when a figure misses.

The data, the fit, the host-speed rule, the rows and the command line are
:mod:`lab.check`'s (shared with :mod:`lab.prefill_check`); the cases, what-if and figures are
this module's. Runs where simulation runs (simwar's full stack), not on the GPU machine.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path

import numpy as np

from lab import check
from simwar.api import simulate

CASE = re.compile(r"^loads_(?P<load>[a-z]+)_(?P<barrier>[a-z_]+)_r(?P<r>\d+)\.metrics\.json"
                  r"(\.gz)?$")
#: the requests each named load starts with (the mini-server's own rule for its loads)
INITIAL = {"light": 5, "medium": 20, "saturated": 64}
#: (relative, or µs) bounds of each figure
TARGETS = {"step_rel": 0.04, "batch_rel": 0.08, "latency_rel": 0.08, "gap_us": 25.0,
           "gap_rel": 0.25, "bucket_rel": 0.04}
BUCKET_MIN_STEPS = 20


def what_if(fit_config: dict, metrics: dict) -> dict:
    """The ``--set`` overrides that turn the fitted config into one measured case."""
    case = metrics["case"]
    arrivals = metrics.get("arrivals") or {}
    if "rate_per_s" not in arrivals:
        raise check.ServerDataError(f"{case.get('name', '?')}: no arrival rate in its metrics "
                              f"(a closed or ramp load is not a what-if of arrivals)")
    wl = {"arrivals": {"rate_per_s": float(arrivals["rate_per_s"])}, "max_batch": check.MAX_BATCH,
          "initial_batch": INITIAL.get(case.get("load"), 1),
          "output_tokens": check.output_tokens(case.get("output_tokens", "16..128"))}
    return check.what_if(fit_config, metrics, wl, default_steps=400)


def _measured(repeats: list[dict]) -> dict:
    """The repeats' means and spreads (max - min) of the figures compared."""
    def col(key):
        return [float(r["summary"][key]) for r in repeats
                if isinstance(r["summary"].get(key), (int, float))
                and math.isfinite(r["summary"][key])]

    out = {"latency_dev_us_mean": check.mean_spread(
        [x for x in (_latency(r) for r in repeats) if math.isfinite(x)])}
    for key in ("step_us_mean", "gap_us_mean", "batch_mean"):
        out[key] = check.mean_spread(col(key))
    buckets: dict[int, list[tuple[int, float]]] = {}
    for r in repeats:
        for b, v in (r["summary"].get("per_bucket") or {}).items():
            if v.get("step_us_mean") is not None:
                buckets.setdefault(int(b), []).append((int(v["steps"]), float(v["step_us_mean"])))
    out["per_bucket"] = {b: (sum(n for n, _ in v), float(np.average([x for _, x in v],
                                                                     weights=[n for n, _ in v])))
                         for b, v in sorted(buckets.items())}
    out["racy_steps"] = sum(int(r["summary"].get("racy_steps", 0)) for r in repeats)
    out["repeats"] = len(repeats)
    return out


def _latency(metrics: dict) -> float:
    """Mean request latency, arrival to the end of the forward that produced the last token,
    of the requests that finished in the measured steps (warm-up to the second-last step: the
    simulation's own rule); the summary's mean over every finished request without the
    per-request arrays."""
    req = metrics.get("requests")
    if not req:
        return float(metrics["summary"].get("latency_dev_us_mean", math.nan))
    keep = check.finished_requests(metrics)
    if not keep.any():
        return math.nan
    return float(np.mean(np.asarray(req["finish_dev_us"], dtype=float)[keep]
                         - np.asarray(req["arrival_us"], dtype=float)[keep]))


def _predicted(summary: dict) -> dict:
    latency = summary.get("request_latency_us_mean", math.nan) + summary.get(
        "request_queue_us_mean", math.nan)
    return {"step_us_mean": summary.get("step_us_mean", math.nan),
            "gap_us_mean": summary.get("fwd_gap_us_mean", math.nan),
            "batch_mean": summary.get("batch_size_mean", math.nan),
            "latency_dev_us_mean": latency,
            "per_bucket": {int(b): (v["steps"], v["step_us_mean"])
                           for b, v in (summary.get("by_bucket") or {}).items()},
            "races": summary.get("races", 0)}


def compare(measured: dict, predicted: dict, barrier: str) -> dict:
    """Each figure's error and whether it is within :data:`TARGETS` (see the module)."""
    rows = {}
    for key, bound_key in (("step_us_mean", "step_rel"), ("batch_mean", "batch_rel"),
                           ("latency_dev_us_mean", "latency_rel")):
        m, spread = measured[key]
        # the repeats' own spread widens every bound but the step time's
        widen = spread / m if m and bound_key != "step_rel" else 0.0
        rows[key] = check.relative_row(m, predicted[key], TARGETS[bound_key] + widen, spread)
    m, spread = measured["gap_us_mean"]
    p = predicted["gap_us_mean"]
    bound = max(TARGETS["gap_us"], TARGETS["gap_rel"] * abs(m)) if math.isfinite(m) else \
        TARGETS["gap_us"]
    rows["gap_us_mean"] = check.row(m, p, p - m, bound, spread)
    buckets = {}
    for b, (n, mean) in measured["per_bucket"].items():
        sim = predicted["per_bucket"].get(b)
        judged = sim is not None and min(n, sim[0]) >= BUCKET_MIN_STEPS
        err = (sim[1] - mean) / mean if sim is not None and mean else math.nan
        buckets[b] = {"steps": n, "steps_predicted": sim[0] if sim else 0, "measured": mean,
                      "predicted": sim[1] if sim else math.nan, "error": err,
                      "ok": bool(abs(err) <= TARGETS["bucket_rel"]) if judged else None}
    rows["per_bucket"] = buckets
    flagged = predicted["races"] > 0
    rows["races"] = {"predicted_latent": predicted["races"], "measured_racy_steps":
                     measured["racy_steps"], "ok": flagged if barrier == "none" else not flagged}
    rows["ok"] = all(r["ok"] for k, r in rows.items() if k not in ("per_bucket", "ok")) and all(
        b["ok"] is not False for b in buckets.values())
    return rows


def evaluate(folder: Path | None = None, keep_profiler_cost: bool = False) -> dict:
    """Fit, predict every measured load and barrier, compare (see the module docstring);
    ``keep_profiler_cost``: the fit with the profiler's host cost kept."""
    folder = Path(folder or check.DEFAULT_DIR)
    sw = check.sweep(folder, CASE, ("load", "barrier"), "loads_*.metrics.json[.gz] (the "
                     "measured loads)", keep_profiler_cost)
    fit = sw.fit
    out = {"fit": {"policy": fit.policy.__dict__, "roles": dict(fit.roles),
                   "scale": fit.scale, "host_scale": fit.host_scale,
                   "unprofiled_step_us": sw.unprofiled,
                   "graph_buckets": (fit.config.get("workload") or {}).get("graph_buckets"),
                   "warnings": fit.warnings, "header": fit.header}, "cases": {}}
    for (load, barrier), repeats in sw.cases.items():
        change = what_if(fit.config, repeats[0])
        sim = simulate(fit.config, change)
        speeds, judged = check.judged_repeats(repeats, sw.line)
        measured, predicted = _measured(judged), _predicted(sim.summary)
        out["cases"][f"{load}_{barrier}"] = {
            "load": load, "barrier": barrier, "what_if": change,
            "host_speed": speeds, "repeats": [{
                "step_us_mean": r["summary"]["step_us_mean"], "host_speed": v,
                "judged": any(r is j for j in judged),
                "step_error": predicted["step_us_mean"] / r["summary"]["step_us_mean"] - 1}
                for r, v in zip(repeats, speeds)],
            "measured": measured, "predicted": predicted,
            "compare": compare(measured, predicted, barrier)}
    out["ok"] = all(c["compare"]["ok"] for c in out["cases"].values())
    return out


def markdown(result: dict) -> str:
    f = result["fit"]
    head = (f"Fitted from `{check.FIT_CAPTURE}` only (`--preset sglang`, no mapping): policy "
            f"{f['policy']['barrier']} ({f['policy']['source']}); graph buckets "
            f"{f['graph_buckets']}")
    if f["unprofiled_step_us"]:
        head += (f"; device time x {f['scale']:.4f}, host time x {f['host_scale']:.4f} (to the "
                 f"un-profiled sweep's step time per bucket)")
    rows = []
    for c in result["cases"].values():
        k = c["compare"]
        s, b, lat, g = k["step_us_mean"], k["batch_mean"], k["latency_dev_us_mean"], \
            k["gap_us_mean"]
        per = ", ".join(f"{bk}: {check.pct(v['error'])}{'' if v['ok'] is not False else ' MISS'}"
                        for bk, v in k["per_bucket"].items())
        reps = ", ".join(("" if r["judged"] else "(") + (f"x{r['host_speed']:.2f} " if
                                                          math.isfinite(r["host_speed"]) else "")
                         + check.pct(r["step_error"]) + ("" if r["judged"] else ")")
                         for r in c["repeats"])
        rows.append([
            c["load"], c["barrier"], reps,
            f"{s['measured']:.1f} / {s['predicted']:.1f} ({check.pct(s['error'])})",
            f"{b['measured']:.1f} / {b['predicted']:.1f} ({check.pct(b['error'])}, "
            f"{100 * b['bound']:.0f}%)",
            f"{lat['measured'] / 1e3:.1f} / {lat['predicted'] / 1e3:.1f} "
            f"({check.pct(lat['error'])}, {100 * lat['bound']:.0f}%)",
            f"{g['measured']:.1f} / {g['predicted']:.1f}", per,
            f"{k['races']['measured_racy_steps']} / {k['races']['predicted_latent']}",
            "yes" if k["ok"] else "no"])
    return "\n".join([head + ".", "", *check.table(
        ["load", "barrier", "repeats: host speed, step err", "step µs meas. / pred. (err)",
         "batch meas. / pred. (err, bound)", "latency ms meas. / pred. (err, bound)",
         "gap µs meas. / pred.", "per bucket step err", "races meas. / latent pred.",
         "within targets"], rows)])


def main(argv: list[str] | None = None) -> int:
    return check.command(argv, "python -m lab.server_check", __doc__.split("\n\n")[0],
                         evaluate, markdown, status_is_verdict=True)


if __name__ == "__main__":
    sys.exit(main())
