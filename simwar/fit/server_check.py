"""Fit the mini-server's sweeping-load capture, predict its other loads and barriers, compare.

``python -m simwar.fit.server_check DIR`` reads what ``python -m simwar.harness.server OUT
--suite fit,loads`` wrote on the GPU machine (committed under ``tests/data/server``):

- ``fit_ramp_profiled.kineto.json.gz``: the capture the fit is made from, a load that sweeps
  the batch through every graph bucket (a triangular arrival rate), profiled; it is read with
  ``--preset sglang`` and no mapping (:func:`simwar.capture.presets.import_capture`), fitted
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
(:func:`host_speed`: its unpadded host work per step over the sweep's at the same batch), and
a repeat whose host ran more than :data:`HOST_SPEED_MAX` times slower is reported with its own
error but not judged (the fit knows the sweep's host only).

For each load and barrier the fitted config is asked what-if (:func:`what_if`): the case's
Poisson arrivals (its ``rate_per_s``, output lengths, the 64-request cap and its initial
requests), its accepted tokens, its barrier and length; the simulation is compared with the
repeats' mean, figure by figure, against :data:`TARGETS`: mean step time within 4 %, mean
batch and request latency (arrival to the end of the forward that produced the last token, of
the requests that finished in the measured steps, on both sides) within 8 % widened by the
repeats' own spread (reported), forward gap within max(25 µs, 25 %),
each graph bucket's mean step time within 4 % (buckets that ran at least
:data:`BUCKET_MIN_STEPS` measured steps on both sides), and with no barrier a latent race
flagged. Prints a Markdown table (``--json``: the numbers).

Runs where simulation runs (simwar's full stack), not on the GPU machine: it reads the captures
through :mod:`simwar.capture`, never through :mod:`simwar.harness`.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import re
import sys
from pathlib import Path

import numpy as np

from simwar.api import simulate
from simwar.capture.presets import import_capture
from simwar.fit.from_capture import fit_model

#: the committed captures and measurements (a source checkout's; elsewhere pass the folder)
DEFAULT_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "server"
FIT_CAPTURE = "fit_ramp_profiled.kineto.json.gz"
FIT_TIMED = "fit_ramp.metrics.json"
CASE = re.compile(r"^loads_(?P<load>[a-z]+)_(?P<barrier>[a-z_]+)_r(?P<r>\d+)\.metrics\.json"
                  r"(\.gz)?$")
#: the requests each named load starts with (the mini-server's own rule for its loads)
INITIAL = {"light": 5, "medium": 20, "saturated": 64}
MAX_BATCH = 64
#: (relative, or µs) bounds of each figure
TARGETS = {"step_rel": 0.04, "batch_rel": 0.08, "latency_rel": 0.08, "gap_us": 25.0,
           "gap_rel": 0.25, "bucket_rel": 0.04}
BUCKET_MIN_STEPS = 20
#: a repeat whose host ran this much slower than the sweep's (its unpadded host work per step
#: against the sweep's at the same batch) is reported, not judged: the fit knows one host speed
HOST_SPEED_MAX = 1.15


class ServerDataError(ValueError):
    """The folder lacks what the comparison needs; the message says what."""


def _output_tokens(text: str):
    lo, _, hi = str(text).partition("..")
    lo, hi = int(lo), int(hi or lo)
    return lo if lo == hi else {"dist": "uniform", "low": lo, "high": hi}


def read_metrics(path: Path) -> dict:
    """A metrics file, ``.json`` or gzipped ``.json.gz`` (as the server's run is committed)."""
    data = path.read_bytes()
    if data[:2] == b"\x1f\x8b":
        data = gzip.decompress(data)
    return json.loads(data)


def _metrics_file(folder: Path, name: str) -> Path | None:
    for path in (folder / name, folder / f"{name}.gz"):
        if path.exists():
            return path
    return None


def load_cases(folder: Path) -> dict[tuple[str, str], list[dict]]:
    """``(load, barrier)`` -> the repeats' metrics, in repeat order."""
    out: dict[tuple[str, str], list[tuple[int, dict]]] = {}
    for path in sorted(folder.glob("loads_*.metrics.json*")):
        m = CASE.match(path.name)
        if m is None:
            continue
        out.setdefault((m["load"], m["barrier"]), []).append((int(m["r"]), read_metrics(path)))
    return {k: [m for _, m in sorted(v, key=lambda x: x[0])] for k, v in sorted(out.items())}


def what_if(fit_config: dict, metrics: dict) -> dict:
    """The ``--set`` overrides that turn the fitted config into one measured case."""
    case = metrics["case"]
    arrivals = metrics.get("arrivals") or {}
    if "rate_per_s" not in arrivals:
        raise ServerDataError(f"{case.get('name', '?')}: no arrival rate in its metrics "
                              f"(a closed or ramp load is not a what-if of arrivals)")
    wl = {"arrivals": {"rate_per_s": float(arrivals["rate_per_s"])}, "max_batch": MAX_BATCH,
          "initial_batch": INITIAL.get(case.get("load"), 1),
          "output_tokens": _output_tokens(case.get("output_tokens", "16..128"))}
    buckets = (fit_config.get("workload") or {}).get("graph_buckets")
    if buckets:
        wl["graph_buckets"] = list(buckets)
    steps = int(case.get("steps", 400))
    warm = case.get("warmup")
    warm = steps // 10 if warm is None else int(warm)
    return {"workload": wl, "policy.barrier": case.get("barrier", "fine"),
            "accept.tokens": float(metrics.get("accept_tokens", 1.0)),
            "steps": steps, "warmup_steps": warm}


def host_line(timed: dict) -> tuple[float, float] | None:
    """``(a, b)``: the sweep's unpadded host work per step (prepare, launch and barrier: the
    host work the server does not pad to a time target) as ``a + b x batch``, least squares
    over its measured steps; None without per-step arrays."""
    x, y = _unpadded(timed)
    if len(x) < 3 or np.ptp(x) == 0:
        return None
    b, a = np.polyfit(x, y, 1)
    return float(a), float(b)


def _unpadded(metrics: dict) -> tuple[np.ndarray, np.ndarray]:
    st, s = metrics.get("steps"), metrics.get("summary", {})
    if not st or "t_barrier_us" not in st:
        return np.zeros(0), np.zeros(0)
    lo, hi = int(s.get("warmup", 0)), int(s.get("steps", len(st["batch"]))) - 1
    batch = np.asarray(st["batch"], dtype=float)[lo:hi]
    other = (np.asarray(st["t_barrier_us"], dtype=float)
             - np.asarray(st["t_batch_us"], dtype=float))[lo:hi]
    ok = np.isfinite(other) & (batch > 0)
    return batch[ok], other[ok]


def host_speed(metrics: dict, line: tuple[float, float] | None) -> float:
    """How much slower the repeat's host ran than the sweep's (1: the same; NaN: unknown):
    its unpadded host work over the sweep's line at the same batches."""
    x, y = _unpadded(metrics)
    if line is None or not len(x):
        return math.nan
    return float(y.sum() / (line[0] + line[1] * x).sum())


def _measured(repeats: list[dict]) -> dict:
    """The repeats' means and spreads (max - min) of the figures compared."""
    def col(key):
        return [float(r["summary"][key]) for r in repeats
                if isinstance(r["summary"].get(key), (int, float))
                and math.isfinite(r["summary"][key])]

    out = {}
    lat = [x for x in (_latency(r) for r in repeats) if math.isfinite(x)]
    out["latency_dev_us_mean"] = (float(np.mean(lat)) if lat else math.nan,
                                  float(np.ptp(lat)) if len(lat) > 1 else 0.0)
    for key in ("step_us_mean", "gap_us_mean", "batch_mean"):
        v = col(key)
        out[key] = (float(np.mean(v)) if v else math.nan, float(np.ptp(v)) if len(v) > 1
                    else 0.0)
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
    s, req = metrics["summary"], metrics.get("requests")
    if not req:
        return float(s.get("latency_dev_us_mean", math.nan))
    lo, hi = int(s["warmup"]), int(s["steps"]) - 2
    fin = np.asarray(req["finish_step"], dtype=np.int64)
    keep = (fin >= lo) & (fin <= hi)
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

    def rel(key, bound_key):
        m, spread = measured[key]
        p = predicted[key]
        err = (p - m) / m if m else math.nan
        bound = TARGETS[bound_key] + (spread / m if m and bound_key != "step_rel" else 0.0)
        rows[key] = {"measured": m, "spread": spread, "predicted": p, "error": err,
                     "bound": bound, "ok": bool(math.isfinite(err) and abs(err) <= bound)}

    rel("step_us_mean", "step_rel")
    rel("batch_mean", "batch_rel")
    rel("latency_dev_us_mean", "latency_rel")
    m, spread = measured["gap_us_mean"]
    p = predicted["gap_us_mean"]
    bound = max(TARGETS["gap_us"], TARGETS["gap_rel"] * abs(m)) if math.isfinite(m) else \
        TARGETS["gap_us"]
    rows["gap_us_mean"] = {"measured": m, "spread": spread, "predicted": p, "error": p - m,
                           "bound": bound, "ok": bool(math.isfinite(p - m)
                                                      and abs(p - m) <= bound)}
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


def unprofiled_step_us(timed: dict) -> dict[int, float] | float:
    """The un-profiled sweep's step time per graph bucket (its mean without per-bucket
    figures): what ``--unprofiled-step-us`` rescales the fit's device and host time to."""
    per = {int(b): float(v["step_us_mean"]) for b, v in (timed.get("per_bucket") or {}).items()
           if v.get("step_us_mean") is not None and v.get("steps", 0) > 0}
    return dict(sorted(per.items())) if per else float(timed["step_us_mean"])


def _capture(folder: Path) -> Path:
    capture = folder / FIT_CAPTURE
    if not capture.exists():
        raise ServerDataError(f"{capture}: not found (the mini-server's sweeping-load capture: "
                              f"python -m simwar.harness.server OUT --suite fit,loads)")
    return capture


def fit_sweep(folder: Path):
    """``(fit, timed, unprofiled)``: the sweeping capture's fit
    (:class:`simwar.fit.from_capture.ModelFit`), rescaled to the un-profiled sweep's step
    time per bucket; the un-profiled sweep's path (None if absent); the step times used."""
    capture = _capture(folder)
    imp, mapping = import_capture(capture, preset="sglang")
    timed = _metrics_file(folder, FIT_TIMED)
    unprofiled = None
    if timed is not None:
        unprofiled = unprofiled_step_us(read_metrics(timed)["summary"])
    fit = fit_model(imp, mapping, capture=capture.name, unprofiled_step_us=unprofiled)
    return fit, timed, unprofiled


def evaluate(folder: Path | None = None) -> dict:
    """Fit, predict every measured load and barrier, compare (see the module docstring)."""
    folder = Path(folder or DEFAULT_DIR)
    _capture(folder)
    cases = load_cases(folder)
    if not cases:
        raise ServerDataError(f"{folder}: no loads_*.metrics.json[.gz] (the measured loads)")
    fit, timed, unprofiled = fit_sweep(folder)
    out = {"fit": {"policy": fit.policy.__dict__, "roles": dict(fit.roles),
                   "scale": fit.scale, "host_scale": fit.host_scale,
                   "unprofiled_step_us": unprofiled,
                   "graph_buckets": (fit.config.get("workload") or {}).get("graph_buckets"),
                   "warnings": fit.warnings, "header": fit.header}, "cases": {}}
    line = host_line(read_metrics(timed)) if timed is not None else None
    for (load, barrier), repeats in cases.items():
        change = what_if(fit.config, repeats[0])
        sim = simulate(fit.config, change)
        speeds = [host_speed(r, line) for r in repeats]
        judged = [r for r, v in zip(repeats, speeds) if not v > HOST_SPEED_MAX] or repeats
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


def _pct(x: float) -> str:
    return "-" if not math.isfinite(x) else f"{100 * x:+.1f}%"


def markdown(result: dict) -> str:
    f = result["fit"]
    lines = [f"Fitted from `{FIT_CAPTURE}` only (`--preset sglang`, no mapping): policy "
             f"{f['policy']['barrier']} ({f['policy']['source']}); graph buckets "
             f"{f['graph_buckets']}; device time x {f['scale']:.4f}, host time x "
             f"{f['host_scale']:.4f} (to the un-profiled sweep's step time per bucket)."
             if f["unprofiled_step_us"] else
             f"Fitted from `{FIT_CAPTURE}` only (`--preset sglang`, no mapping): policy "
             f"{f['policy']['barrier']} ({f['policy']['source']}); graph buckets "
             f"{f['graph_buckets']}.", "",
             "| load | barrier | repeats: host speed, step err | step µs meas. / pred. (err) | "
             "batch meas. / pred. (err, bound) | latency ms meas. / pred. (err, bound) | gap µs "
             "meas. / pred. | per bucket step err | races meas. / latent pred. | within "
             "targets |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for c in result["cases"].values():
        k = c["compare"]
        s, b, lat, g = k["step_us_mean"], k["batch_mean"], k["latency_dev_us_mean"], \
            k["gap_us_mean"]
        per = ", ".join(f"{bk}: {_pct(v['error'])}{'' if v['ok'] is not False else ' MISS'}"
                        for bk, v in k["per_bucket"].items())
        reps = ", ".join(("" if r["judged"] else "(") + (f"x{r['host_speed']:.2f} " if
                                                          math.isfinite(r["host_speed"]) else "")
                         + _pct(r["step_error"]) + ("" if r["judged"] else ")")
                         for r in c["repeats"])
        lines.append(
            f"| {c['load']} | {c['barrier']} | {reps} | {s['measured']:.1f} / "
            f"{s['predicted']:.1f} "
            f"({_pct(s['error'])}) | {b['measured']:.1f} / {b['predicted']:.1f} "
            f"({_pct(b['error'])}, {100 * b['bound']:.0f}%) | {lat['measured'] / 1e3:.1f} / "
            f"{lat['predicted'] / 1e3:.1f} ({_pct(lat['error'])}, {100 * lat['bound']:.0f}%) | "
            f"{g['measured']:.1f} / {g['predicted']:.1f} | {per} | "
            f"{k['races']['measured_racy_steps']} / {k['races']['predicted_latent']} | "
            f"{'yes' if k['ok'] else 'no'} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m simwar.fit.server_check")
    ap.add_argument("folder", type=Path, nargs="?", default=DEFAULT_DIR)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        result = evaluate(args.folder)
    except ServerDataError as e:
        print(f"simwar: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(result, indent=1, default=str))
    else:
        print(markdown(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
