"""One repeat of the shapes suite step by step: measured and simulated, by shape and bucket.

``python -m lab.shapes_steps DIR CASE SEED`` (``CASE``: ``mixed_medium_normal``; ``SEED``:
the repeat's seed, 300..) reads that repeat's metrics (``DIR/shapes_<CASE>_r<i>.metrics.json
[.gz]``, the one with that seed), predicts it as :mod:`lab.shapes_check` does (the mode's
model from its one capture, :func:`lab.shapes_check.model`, at the repeat's own host speeds,
:func:`lab.host_speed.host_at`; the same what-if, :func:`lab.shapes_check.what_if_change`),
keeps the simulated run's per-step table and sets each measured step beside the simulated
ones, grouped by the step's shape (``decode``, ``prefill``, ``mixed``) and graph bucket: the
number of steps, their mean batch and prompt tokens, the step time (forward start to the
next's), the forward on the device, the gap before it (the previous forward's end to this
one's start: the host's part of a step the host paces) in three parts, and each group's
share of the run's time (steps x mean step) measured and simulated.

The gap's parts, one definition for both sides (a simulated step's ``result_done_us`` and
``launch_us`` markers; the server's host stamps):

- ``result``: the previous forward's end to its result processed on the host (the server's
  ``proc_end_us``, the simulator's ``result_done``): the copy's wake and the processing;
- ``prepare``: that instant to the launch of this step's forward (the server's
  ``t_scheduled_us``, where its ``run_batch`` range opens; the simulator's ``run_batch``
  marker): receiving, scheduling, the batch's preparation;
- ``launch``: the launch to the forward's first kernel.

In the normal loop (``policy.overlap: false``) the three add up to the gap; with overlap a
step is launched before the previous result is processed, so ``result`` can outrun the gap
and ``prepare`` is negative: those columns then say where the host was, not what the
step waited for. Reported too, for a host-paced loop: ``host_period``, one launch to the
next (the host's own iteration time).

The figures are what the summary's rules take: the measured steps (warm-up to the
second-last; :func:`lab.check.measured_steps`, :func:`simwar.analysis.summary.measured_mask`).
A group present on one side only (a bucket one side never ran) shows ``-`` on the other.
Imports numpy, :mod:`lab.check`, :mod:`lab.host_speed` and :mod:`lab.shapes_check` (the
model and the what-if), :func:`simwar.api.simulate`; runs where simulation runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

from lab import check, shapes_check
from simwar.analysis.summary import measured_mask
from simwar.api import simulate

#: the per-step columns compared, in table order (µs but for the counts)
COLUMNS = ("batch", "prefill_tokens", "step_us", "fwd_us", "gap_us", "result_us",
           "prepare_us", "launch_us", "host_period_us")


def _gap_parts(start, end, done, launch) -> dict:
    """Per step the gap before its forward and its parts (see the module docstring), from
    per-step arrays of forward start and end, result processed and launch (all µs, one
    clock); the first step has no predecessor (NaN)."""
    prev_end = np.concatenate([[np.nan], end[:-1]])
    prev_done = np.concatenate([[np.nan], done[:-1]])
    nxt_launch = np.concatenate([launch[1:], [np.nan]])
    return {"gap_us": start - prev_end, "result_us": prev_done - prev_end,
            "prepare_us": launch - prev_done, "launch_us": start - launch,
            "host_period_us": nxt_launch - launch}


def measured_table(metrics: dict) -> dict[str, np.ndarray]:
    """A repeat's measured steps as columns (:data:`COLUMNS` with ``shape`` and ``bucket``),
    from the server's own stamps."""
    st = metrics["steps"]

    def col(k):
        return np.asarray([math.nan if v is None else v for v in st[k]], dtype=float)

    start, end = col("fwd_start_us"), col("fwd_end_us")
    out = {"shape": np.asarray(st["shape"]), "bucket": np.asarray(st["bucket"], dtype=int),
           "batch": col("batch"), "prefill_tokens": col("prefill_tokens"),
           "step_us": np.concatenate([start[1:] - start[:-1], [np.nan]]),
           "fwd_us": end - start,
           **_gap_parts(start, end, col("proc_end_us"), col("t_scheduled_us"))}
    keep = measured_steps_mask(len(start), check.measured_steps(metrics))
    return {k: v[keep] for k, v in out.items()}


def measured_steps_mask(n: int, steps: slice) -> np.ndarray:
    keep = np.zeros(n, dtype=bool)
    keep[steps] = True
    return keep


def simulated_table(result) -> dict[str, np.ndarray]:
    """A simulated run's measured steps as the same columns as :func:`measured_table`
    (``result``: :func:`simwar.api.simulate`'s, with its per-step table kept)."""
    c, wl = result.columns, result.meta.get("workload") or {}
    step = np.asarray(c["step"], dtype=np.int64)
    n = len(step)
    tokens = np.asarray(wl.get("prefill_tokens") or [0] * (int(step.max()) + 1 if n else 0))
    shape = (np.asarray(c["shape"]) if "shape" in c
             else np.where(tokens[step] > 0, "mixed", "decode"))
    done = np.asarray(c.get("result_done_us", np.full(n, np.nan)), dtype=float)
    start, end = np.asarray(c["fwd_start_us"]), np.asarray(c["fwd_end_us"])
    batch = np.asarray(c["batch_size"], dtype=float)
    # a step that decodes nothing runs no graph: bucket 0, as the server logs it
    out = {"shape": shape, "bucket": np.where(batch > 0, c["graph_bucket"], 0).astype(int),
           "batch": batch,
           "prefill_tokens": tokens[step].astype(float), "step_us": np.asarray(c["step_us"]),
           "fwd_us": end - start, **_gap_parts(start, end, done, np.asarray(c["launch_us"]))}
    keep = measured_mask(step, out["step_us"], int(result.meta.get("warmup_steps",
                                                                    result.config.warmup_steps)))
    return {k: v[keep] for k, v in out.items()}


def repeat_metrics(folder: Path, case: str, seed: int) -> dict:
    """The metrics of ``case``'s repeat with ``seed`` (``shapes_<case>_r<i>``)."""
    for path in sorted(Path(folder).glob(f"shapes_{case}_r*.metrics.json*")):
        if shapes_check.CASE.match(path.name) is None:
            continue
        m = check.read_metrics(path)
        if int(m["case"].get("seed", -1)) == int(seed):
            return m
    raise check.ServerDataError(f"{folder}: no shapes_{case}_r<i>.metrics.json[.gz] with seed "
                                f"{seed}")


def predict(folder: Path, metrics: dict, rule: str | None = None, m: dict | None = None):
    """The repeat ``metrics`` simulated as :mod:`lab.shapes_check` predicts it: its mode's
    model (``m``: :func:`lab.shapes_check.model`, fitted here where not given) at the repeat's
    own host speeds, the same what-if; returns ``(result, speeds)``."""
    mode = metrics["case"]["schedule"]
    m = m if m is not None else shapes_check.model(folder, mode)
    config, speed, parts, tail = shapes_check.at_repeat(m, metrics)
    result = simulate(config, shapes_check.what_if_change(config, metrics, rule))
    return result, {"decode": float(speed), **{k: float(v) for k, v in parts.items()},
                    "loop tail µs": float(tail)}


def groups(table: dict[str, np.ndarray]) -> dict[tuple[str, int], dict]:
    """Per (shape, bucket): the steps and each column's mean; ``time_us``, their total."""
    out = {}
    for key in sorted({(str(s), int(b)) for s, b in zip(table["shape"], table["bucket"])}):
        pick = (table["shape"] == key[0]) & (table["bucket"] == key[1])
        row = {"steps": int(pick.sum())}
        for k in COLUMNS:
            vals = table[k][pick]
            vals = vals[np.isfinite(vals)]
            row[k] = float(vals.mean()) if len(vals) else math.nan
        row["time_us"] = float(np.nansum(table["step_us"][pick]))
        out[key] = row
    return out


def compare(measured: dict, simulated: dict) -> dict:
    """Both sides' groups (:func:`groups`) and totals: per group, the measured and simulated
    rows; ``total``: the steps, their time and mean step on each side."""
    gm, gs = groups(measured), groups(simulated)
    rows = {f"{s} {b}": {"measured": gm.get((s, b)), "simulated": gs.get((s, b))}
            for s, b in sorted(set(gm) | set(gs))}
    total = {side: {"steps": int(len(t["step_us"])),
                    "time_us": float(np.nansum(t["step_us"])),
                    **{k: float(np.nanmean(t[k])) for k in COLUMNS}}
             for side, t in (("measured", measured), ("simulated", simulated))}
    return {"groups": rows, "total": total}


def evaluate(folder: Path, case: str, seed: int, rule: str | None = None) -> dict:
    """One repeat measured against its simulation, step by step (see the module docstring)."""
    metrics = repeat_metrics(folder, case, seed)
    result, speeds = predict(Path(folder), metrics, rule)
    return {"case": case, "seed": int(seed), "host_speed": speeds,
            **compare(measured_table(metrics), simulated_table(result))}


def _cell(row: dict | None, key: str) -> str:
    if row is None:
        return "-"
    v = row[key]
    return "-" if not math.isfinite(v) else f"{v:.0f}" if abs(v) >= 10 else f"{v:.1f}"


def markdown(out: dict) -> str:
    """The comparison as a table: per group and column, measured / simulated."""
    heads = ["shape bucket", "steps", "time ms", *COLUMNS]
    rows = []
    for name, pair in [*out["groups"].items(), ("all", out["total"])]:
        m, s = pair["measured"], pair["simulated"]
        cells = [f"{_cell(m, k)} / {_cell(s, k)}" for k in ("steps",)]
        cells.append(" / ".join("-" if r is None else f"{r['time_us'] / 1e3:.0f}"
                                for r in (m, s)))
        cells += [f"{_cell(m, k)} / {_cell(s, k)}" for k in COLUMNS]
        rows.append([name, *cells])
    speeds = ", ".join(f"{k} {v:+.0f}" if k == "loop tail µs" else f"{k} x{v:.2f}"
                       for k, v in out["host_speed"].items())
    return "\n".join([f"shapes_{out['case']}, seed {out['seed']} (host speeds: {speeds}): "
                      f"measured / simulated, means per step (µs) but steps and time", "",
                      *check.table(heads, rows)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m lab.shapes_steps",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path)
    ap.add_argument("case", help="<sglang|mixed>_<light|medium|closed16>_<overlap|normal>")
    ap.add_argument("seed", type=int)
    ap.add_argument("--json", action="store_true", help="the numbers as JSON")
    args = ap.parse_args(argv)
    try:
        out = evaluate(args.folder, args.case, args.seed)
    except check.ServerDataError as e:
        print(f"simwar: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(out, indent=1) if args.json else markdown(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
