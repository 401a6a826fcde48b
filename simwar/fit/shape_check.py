"""``simwar import --check`` of a capture whose steps prefill: each shape's figures.

A fitted config that picks its shapes from its own queue cannot replay the capture step for
step, so each shape's figures are compared instead (:func:`simwar.fit.check.shape_rows`):
:func:`shape_frame` of each side (the capture's per-step table with the shapes
:func:`simwar.fit.shapes.classify` read, the simulation's with its picked shapes,
:func:`sim_kinds`), the simulated ones taken at the capture's sizes and after the capture's
shapes (:func:`at_sizes`), the step time (a step's gap plus its forward) within
:data:`SHAPE_STEP_REL`.

Imports: numpy and :mod:`simwar.fit.shapes`; never the simulator.
"""

from __future__ import annotations

import numpy as np

from simwar.fit.shapes import SHAPE_ORDER

#: a shape's step time within this of the capture's (``--check`` of a capture that prefills)
SHAPE_STEP_REL = 0.03
#: a shape is judged where both sides ran it at least this many measured steps
SHAPE_MIN_STEPS = 3
#: the per-step figures compared per shape: (label, column). A shape's step time is its own
#: forward's end less the forward before it (``own_us``: its gap plus its forward), not the
#: table's ``step_us`` (forward start to the next forward's start), which holds the next
#: step's gap: the host work a prefill adds before its forward would be the step before's.
SHAPE_FIGURES = (("step", "own_us"), ("forward", "fwd_us"), ("forward gap", "fwd_gap_us"))


def sim_kinds(meta: dict, n: int) -> tuple[list[str], np.ndarray]:
    """A simulated run's per-step shapes and prompt tokens (``meta.workload``): its picked
    shapes, else mixed where the step prefilled tokens; decode where it prefilled none; idle
    where it picked an idle step."""
    wl = meta.get("workload") or {}
    tokens = np.asarray(wl.get("prefill_tokens") or [0] * n, dtype=float)[:n]
    picked = wl.get("shape")
    out = []
    for k in range(n):
        t = tokens[k] if k < len(tokens) else 0.0
        s = picked[k] if picked is not None and k < len(picked) else "mixed"
        out.append("idle" if s == "idle" else "decode" if t <= 0 else
                   ("prefill" if s == "prefill" else "mixed"))
    return out, tokens


#: the sizes a shape's figures follow (:func:`at_sizes`): a decode step's batch; a prefill
#: step's tokens and the batch of the step before it, whose result it processes and whose
#: requests it pauses; a mixed step's batch and tokens; an idle step's batch before it (whose
#: result it processes); and for each, the prompt tokens the step before prefilled
#: (``before_tokens``): a step's time is its forward's end less the one before's, so the
#: longer the forward before, the more of this step's host work runs under it (on the H200's
#: mixed captures the simulated queue ran the mixed step before a mixed step 130 tokens
#: larger than the capture did: 1 % of the mixed step's time)
SIZES = {"decode": ("batch", "before_tokens"), "prefill": ("tokens", "before", "before_tokens"),
         "mixed": ("batch", "tokens", "before_tokens"), "idle": ("before", "before_tokens")}


def sim_waits(meta: dict) -> set[int]:
    """The steps of a simulated run of arriving requests whose iteration waited for a request
    (the host idle at its top: the capture's ``idle`` steps, which the check leaves out): the
    admission steps of the requests admitted at their own arrival time."""
    req = (meta.get("workload") or {}).get("requests") or {}
    return {int(k) for k, a, t in zip(req.get("admit_step") or [], req.get("admit_us") or [],
                                      req.get("arrival_us") or []) if k >= 0 and a == t}


def shape_frame(table, shapes: dict[int, str], tokens: dict[int, float], drop=()) -> dict:
    """Per shape, the measured steps' columns (``step``, ``step_us``, the
    :data:`SHAPE_FIGURES`, ``batch``, ``bucket``, ``tokens``, the batch of the step before,
    ``before``, the prompt tokens of the step before, ``before_tokens``, and the shape of
    the step before, ``after``: its index in
    :data:`SHAPE_ORDER`, -1 none) of a per-step table (the capture's or a simulation's),
    without ``drop`` (the steps left out and those around them) and the steps without a
    step time."""
    cols = {c: np.asarray(table[c], dtype=float) for c in ("step", "step_us", "fwd_us",
                                                          "fwd_gap_us") if c in table}
    cols["own_us"] = cols["fwd_gap_us"] + cols["fwd_us"]
    step = cols["step"].astype(int)
    batch = np.asarray(table["batch_size"], dtype=float) if "batch_size" in table \
        else np.zeros(len(step))
    bucket = np.asarray(table["graph_bucket"], dtype=float) if "graph_bucket" in table \
        else batch
    prev = dict(zip(step.tolist(), batch.tolist()))
    out: dict[str, dict] = {}
    for i, k in enumerate(step.tolist()):
        if k in drop or not np.isfinite(cols["step_us"][i]) \
                or not np.isfinite(cols["own_us"][i]):
            continue
        s = shapes.get(k)
        if s not in SHAPE_ORDER:
            continue
        d = out.setdefault(s, {c: [] for c in (*cols, "batch", "bucket", "tokens", "before",
                                                "before_tokens", "after")})
        for c in cols:
            d[c].append(cols[c][i])
        d["batch"].append(batch[i])
        d["bucket"].append(bucket[i])
        d["before"].append(prev.get(k - 1, batch[i]))
        last = shapes.get(k - 1)
        d["after"].append(SHAPE_ORDER.index(last) if last in SHAPE_ORDER else -1)
        d["tokens"].append(tokens.get(k, 0.0))
        d["before_tokens"].append(tokens.get(k - 1, 0.0))
    return {s: {c: np.asarray(v, dtype=float) for c, v in d.items()} for s, d in out.items()}


def at_sizes(sim: dict, cap: dict, column: str, shape: str) -> float:
    """The simulation's mean of ``column`` over a shape's steps, taken at the capture's sizes
    and after the capture's shapes: the two runs' queues differ, so the capture's steps are
    not the simulation's one for one.

    The steps are grouped by the shape of the step before (a prefill step right after another
    waits for the host longer than one after a decode step) and by graph bucket (a graph's
    time is its bucket's, not a line in the batch). Each group the capture ran counts with
    its capture steps, at the simulated group's mean moved to the capture group's mean sizes
    (:data:`SIZES`, those that vary on the simulated side) along the slopes of a least-squares
    fit within the simulated groups (one slope per size for every group, each group its own
    level). A group the simulation ran fewer than :data:`SHAPE_MIN_STEPS` times takes the
    simulated steps after the same shape, else all of the shape's.
    """
    y_all = sim[column]
    ok = np.isfinite(y_all)
    if not ok.any():
        return float("nan")
    sizes = [c for c in SIZES[shape] if c in sim and np.ptp(sim[c][ok]) > 0
             and len(cap.get(c, ())) and np.all(cap[c] >= 0)]
    group = sim["after"] * 1_000_000 + sim["bucket"]
    slopes = np.zeros(len(sizes))
    if sizes:  # within-group least squares: each group's mean taken out
        y, xs = y_all[ok].copy(), np.column_stack([sim[c][ok] for c in sizes]).astype(float)
        for g in np.unique(group[ok]).tolist():
            m = group[ok] == g
            y[m] -= y[m].mean()
            xs[m] -= xs[m].mean(axis=0)
        if len(y) > len(sizes) + 1 and np.any(xs):
            slopes, *_ = np.linalg.lstsq(xs, y, rcond=None)
    total, weight = 0.0, 0
    for after, bucket in np.unique(np.column_stack([cap["after"], cap["bucket"]]),
                                   axis=0).tolist():
        mine = (cap["after"] == after) & (cap["bucket"] == bucket)
        theirs = ok
        for cand in ((sim["after"] == after) & (sim["bucket"] == bucket),
                     sim["after"] == after):
            if int((cand & ok).sum()) >= SHAPE_MIN_STEPS:
                theirs = cand & ok
                break
        v = float(y_all[theirs].mean()) + sum(
            float(b) * (float(cap[c][mine].mean()) - float(sim[c][theirs].mean()))
            for b, c in zip(slopes, sizes))
        total += int(mine.sum()) * v
        weight += int(mine.sum())
    return total / weight if weight else float(y_all[ok].mean())


__all__ = ["SHAPE_FIGURES", "SHAPE_MIN_STEPS", "SHAPE_STEP_REL", "SIZES", "at_sizes",
           "shape_frame", "sim_kinds", "sim_waits"]
