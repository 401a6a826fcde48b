"""Trace → per-step DataFrame → summary. The same code for simulated and measured traces.

Per step k (forward = the kernels of the algorithm's phases on the forward
stream, i.e. forward-lane kernel spans with a non-empty ``phase``):

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
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .hazards import HazardReport, detect
from .trace import Trace

SITES = ("result_copy", "verify_done", "seq_lens", "barrier")


def step_frame(trace: Trace) -> pd.DataFrame:
    fwd = trace.meta.get("forward_stream", "forward")
    spans = pd.DataFrame(trace.spans, columns=["lane", "label", "kind", "step", "start_us",
                                               "end_us", "phase", "site"])
    lane = spans[spans.lane == fwd]
    kern = lane[(lane.kind == "kernel") & (lane.phase != "")]
    if kern.empty:
        return pd.DataFrame(columns=["step"])
    g = kern.groupby("step")
    df = pd.DataFrame({"fwd_start_us": g.start_us.min(), "fwd_end_us": g.end_us.max()})
    df.index.name = "step"
    df = df.sort_index()
    start = df.fwd_start_us.to_numpy()
    end = df.fwd_end_us.to_numpy()
    nxt = np.append(start[1:], np.nan)
    df["fwd_us"] = end - start
    df["step_us"] = nxt - start
    df["fwd_gap_us"] = start - np.insert(end[:-1], 0, np.nan)

    # idle on the forward stream within [start_k, start_{k+1})
    busy = _busy_in_windows(lane[lane.kind == "kernel"], start, nxt)
    dep = _busy_in_windows(lane[lane.kind == "wait"], start, nxt)
    df["gpu_idle_us"] = df.step_us - busy
    df["gpu_idle_dep_us"] = np.minimum(dep, df.gpu_idle_us)
    df["gpu_idle_host_us"] = df.gpu_idle_us - df.gpu_idle_dep_us

    blocked = spans[spans.kind == "blocked"]
    per_site = blocked.assign(d=blocked.end_us - blocked.start_us).pivot_table(
        index="step", columns="site", values="d", aggfunc="sum")
    df["cpu_blocked_us"] = 0.0
    for site in sorted(set(SITES) | set(per_site.columns)):
        col = per_site[site] if site in per_site.columns else None
        vals = col.reindex(df.index).fillna(0.0) if col is not None else 0.0
        df[f"cpu_blocked_{site}_us"] = vals
        df["cpu_blocked_us"] += vals

    markers = pd.DataFrame(trace.markers, columns=["name", "step", "time_us"])
    launch = markers[markers.name == "run_batch"].set_index("step").time_us
    df["launch_us"] = launch.reindex(df.index)
    launch_next = np.append(df.launch_us.to_numpy()[1:], np.nan)
    df["launch_lead_us"] = end - launch_next
    # forwards issued before k and still unfinished at launch k (forward ends are in FIFO order)
    lau = df.launch_us.to_numpy()
    ahead = np.array([i - np.searchsorted(end[:i], t, side="right") if not np.isnan(t) else np.nan
                      for i, t in enumerate(lau)], dtype=float)
    df["launch_ahead"] = ahead
    tok = float(trace.meta.get("accept_tokens", 1.0)) * int(trace.meta.get("batch_size", 1))
    df["tokens"] = tok
    return df.reset_index()


def _busy_in_windows(spans: pd.DataFrame, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per window [lo_i, hi_i): total length of ``spans`` inside it (spans do not overlap)."""
    out = np.zeros(len(lo))
    if spans.empty:
        return out
    s = spans.start_us.to_numpy()
    e = spans.end_us.to_numpy()
    order = np.argsort(s)
    s, e = s[order], e[order]
    cum = np.concatenate([[0.0], np.cumsum(e - s)])
    for i, (a, b) in enumerate(zip(lo, hi)):
        if np.isnan(b):
            out[i] = np.nan
            continue
        i0 = np.searchsorted(e, a, side="right")  # first span ending after a
        i1 = np.searchsorted(s, b, side="left")  # spans starting before b
        if i1 <= i0:
            continue
        total = cum[i1] - cum[i0]
        total -= max(0.0, a - s[i0])  # clip the first
        total -= max(0.0, e[i1 - 1] - b)  # clip the last
        out[i] = max(0.0, total)
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
