"""Trace → per-step DataFrame → summary. The same code for simulated and measured traces.

Per step k (forward = the kernels of the algorithm's phases on the forward
stream, i.e. forward-lane kernel ops with a non-empty ``phase``):

- ``step_us``: forward k+1 start minus forward k start;
- ``fwd_gap_us``: forward k start minus forward k-1 end (the bubble between forwards);
- ``gpu_idle_us``: time the forward stream is idle in [start k, start k+1),
  split HTA-style into ``gpu_idle_dep_us`` (held by a cross-stream wait:
  "kernel-wait") and ``gpu_idle_host_us`` (nothing enqueued: "host-wait");
- ``cpu_blocked_us`` and ``cpu_blocked_<site>_us``: host time inside
  synchronize calls issued in iteration k, by site (result_copy,
  verify_done, seq_lens, barrier);
- ``launch_us``: host time of iteration k's ``run_batch`` marker;
- ``launch_lead_us``: forward k end minus launch k+1, i.e. how far ahead of
  the GPU the next forward was launched (positive = run-ahead, the sign used
  in SGLang #31468);
- ``launch_ahead``: forwards launched but unfinished when forward k is launched.

The summary drops warm-up steps (``meta.warmup_steps``) and the last step
(it has no successor).

Everything is computed on the Trace's columns (numpy); the only DataFrame is
the per-step table itself. Imports: numpy, pandas.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..trace import OpKind, SpanKind, Trace
from .hazards import HazardReport, detect
from .views import forward_kernels, forwards

SITES = ("result_copy", "verify_done", "seq_lens", "barrier")


def step_frame(trace: Trace) -> pd.DataFrame:
    ops, spans = trace.ops, trace.spans
    fwd = trace.code(trace.meta.get("forward_stream", "forward"))
    if len(forward_kernels(trace)) == 0:
        return pd.DataFrame(columns=["step"])
    fw = forwards(trace)  # the same extents the bubble walk uses
    steps, start, end = fw.steps, fw.start_us, fw.end_us
    nxt = np.append(start[1:], np.nan)
    df = pd.DataFrame({"fwd_start_us": start, "fwd_end_us": end},
                      index=pd.Index(steps, name="step"))
    df["fwd_us"] = end - start
    df["step_us"] = nxt - start
    df["fwd_gap_us"] = start - np.insert(end[:-1], 0, np.nan)

    # idle on the forward stream within [start_k, start_{k+1})
    on_lane = (ops.kind == OpKind.KERNEL) & (ops.lane == fwd)
    busy = _busy_in_windows(ops.start_us[on_lane], ops.end_us[on_lane], start, nxt)
    held = (spans.kind == SpanKind.WAIT) & (spans.lane == fwd)
    dep = _busy_in_windows(spans.start_us[held], spans.end_us[held], start, nxt)
    df["gpu_idle_us"] = df.step_us - busy
    df["gpu_idle_dep_us"] = np.minimum(dep, df.gpu_idle_us)
    df["gpu_idle_host_us"] = df.gpu_idle_us - df.gpu_idle_dep_us

    blocked = np.flatnonzero(spans.kind == SpanKind.BLOCKED)
    site_codes = spans.site[blocked]
    sites = sorted(set(SITES) | {trace.text(c) for c in np.unique(site_codes)})
    row = np.searchsorted(steps, spans.step[blocked])
    inside = (row < len(steps)) & (steps[np.minimum(row, len(steps) - 1)] == spans.step[blocked])
    length = spans.end_us[blocked] - spans.start_us[blocked]
    df["cpu_blocked_us"] = 0.0
    for site in sites:
        pick = inside & (site_codes == trace.code(site))
        vals = np.zeros(len(steps))
        np.add.at(vals, row[pick], length[pick])
        df[f"cpu_blocked_{site}_us"] = vals
        df["cpu_blocked_us"] += vals

    markers = trace.markers
    rb = markers.name == trace.code("run_batch")
    launch = pd.Series(markers.time_us[rb], index=markers.step[rb])
    launch = launch[~launch.index.duplicated(keep="last")]
    df["launch_us"] = launch.reindex(df.index)
    lau = df.launch_us.to_numpy()
    df["launch_lead_us"] = end - np.append(lau[1:], np.nan)
    df["launch_ahead"] = _launch_ahead(end, lau)
    tok = float(trace.meta.get("accept_tokens", 1.0)) * int(trace.meta.get("batch_size", 1))
    df["tokens"] = tok
    return df.reset_index()


def _launch_ahead(end: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """Per forward k: forwards before k still unfinished at launch k (NaN without a launch)."""
    index = np.arange(len(end))
    if np.all(end[1:] >= end[:-1]):  # forward ends in FIFO order: one search for all
        done = np.minimum(np.searchsorted(end, launch, side="right"), index)
    else:  # a measured trace need not be FIFO: search each prefix
        done = np.array([np.searchsorted(end[:i], t, side="right") for i, t in enumerate(launch)])
    return np.where(np.isnan(launch), np.nan, index - done)


def _busy_in_windows(s: np.ndarray, e: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per window [lo_i, hi_i): total length of intervals [s, e) inside it (no overlaps)."""
    out = np.zeros(len(lo))
    out[np.isnan(hi)] = np.nan
    if len(s) == 0:
        return out
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    cum = np.concatenate([[0.0], np.cumsum(e - s)])
    ok = ~np.isnan(hi)
    a, b = lo[ok], hi[ok]
    i0 = np.searchsorted(e, a, side="right")  # first interval ending after a
    i1 = np.searchsorted(s, b, side="left")  # intervals starting before b
    has = i1 > i0
    j0, j1 = np.where(has, i0, 0), np.where(has, i1 - 1, 0)
    total = cum[i1] - cum[i0]
    total = total - np.maximum(0.0, a - s[j0])  # clip the first
    total = total - np.maximum(0.0, e[j1] - b)  # clip the last
    out[ok] = np.where(has, np.maximum(0.0, total), 0.0)
    return out


def measured(df: pd.DataFrame, warmup: int) -> pd.DataFrame:
    """Steps that count: after warm-up, with a successor."""
    if "step_us" not in df.columns:  # a trace with no forward kernels has no steps
        return df.iloc[0:0]
    return df[(df.step >= warmup) & df.step_us.notna()]


def summarize(df: pd.DataFrame, meta: dict, hazards: HazardReport | None = None) -> dict:
    warm = int(meta.get("warmup_steps", 0))
    m = measured(df, warm)
    out: dict = {"name": meta.get("name", ""), "steps_measured": int(len(m))}
    if m.empty:
        return out

    def q(col, p):
        return float(np.percentile(m[col], p))

    out.update({
        "step_us_mean": float(m.step_us.mean()),
        "step_us_p50": q("step_us", 50),
        "step_us_p99": q("step_us", 99),
        "fwd_us_mean": float(m.fwd_us.mean()),
        "fwd_gap_us_mean": float(m.fwd_gap_us.mean()),
        "fwd_gap_us_p50": q("fwd_gap_us", 50),
        "gpu_idle_us_mean": float(m.gpu_idle_us.mean()),
        "gpu_idle_dep_us_mean": float(m.gpu_idle_dep_us.mean()),
        "gpu_idle_host_us_mean": float(m.gpu_idle_host_us.mean()),
        "gpu_busy_fraction": float(1 - m.gpu_idle_us.sum() / m.step_us.sum()),
        "cpu_blocked_us_mean": float(m.cpu_blocked_us.mean()),
    })
    for col in sorted(c for c in m.columns if c.startswith("cpu_blocked_") and c.endswith("_us")
                      and c != "cpu_blocked_us"):
        out[f"{col}_mean"] = float(m[col].mean())
    lead = m.launch_lead_us.dropna()
    ahead = m.launch_ahead.dropna()
    out.update({
        "launch_lead_us_mean": float(lead.mean()) if len(lead) else float("nan"),
        "launch_lead_us_p50": float(lead.median()) if len(lead) else float("nan"),
        "run_ahead_fraction": float((lead > 0).mean()) if len(lead) else float("nan"),
        "launch_ahead_mean": float(ahead.mean()) if len(ahead) else float("nan"),
        "launch_ahead_hist": {int(k): float(v) for k, v in
                              ahead.value_counts(normalize=True).sort_index().items()},
        "tokens_per_s": float(m.tokens.sum() / m.step_us.sum() * 1e6),
    })
    if hazards is not None:
        h = hazards.within(m.step)  # the steps measured, as every other figure
        out["races"] = len(h.latent)
        out["overlaps"] = len(h.observed)
        out["race_steps"] = len({r.second_step for r in h.latent})
    for key in ("barrier", "barrier_effective", "placement", "publish_phase",
                "publish_position"):
        if key in meta:
            out[key] = meta[key]
    return out


def analyze(trace: Trace, window: int = 2) -> tuple[pd.DataFrame, dict, HazardReport]:
    """Per-step frame, summary and hazard report of any Trace."""
    df = step_frame(trace)
    hz = detect(trace, window=window)
    return df, summarize(df, trace.meta, hz), hz
