"""Trace → per-step DataFrame → summary. The same code for simulated and measured traces.

Per step k (forward = the kernels of the algorithm's phases on the forward
stream, i.e. forward-lane kernel ops with a non-empty ``phase``):

- ``step_us``: forward k+1 start minus forward k start;
- ``fwd_gap_us``: forward k start minus forward k-1 end (the bubble between forwards);
- ``gpu_idle_us``: time the forward stream is idle from forward k-1's end to forward k's
  end, [end k-1, end k): the gap before forward k (``fwd_gap_us``, the same step's) and any
  idle inside forward k, so that a row's gap and idle are about the same forward; split
  HTA-style into ``gpu_idle_dep_us`` (held by a cross-stream wait: "kernel-wait") and
  ``gpu_idle_host_us`` (nothing enqueued: "host-wait"); ``gpu_busy_us``: the time the
  stream runs kernels in that window (busy + idle = end k - end k-1; NaN for the first
  forward, which has no predecessor);
- ``cpu_blocked_us`` and ``cpu_blocked_<site>_us``: host time inside
  synchronize calls issued in iteration k, by site (result_copy,
  verify_done, seq_lens, barrier);
- ``launch_us``: host time of iteration k's ``run_batch`` marker;
- ``launch_lead_us``: forward k end minus launch k+1, i.e. how far ahead of
  the GPU the next forward was launched (positive = run-ahead, the sign used
  in SGLang #31468);
- ``launch_ahead``: forwards launched but unfinished when forward k is launched;
- ``tokens``, ``batch_size``, ``graph_bucket``, ``accepted_tokens``: step k's tokens
  (batch x accepted tokens per request), its batch, the graph bucket its graph phases ran
  at, its accepted tokens per request: from ``meta.workload`` (per-step arrays) or the
  run's constants (:class:`StepFacts`).

The summary drops warm-up steps (``meta.warmup_steps``) and the last step
(it has no successor). A run with a ``meta.workload`` also gets its mean batch and accepted
tokens, step time, forward gap, GPU idle, CPU blocked time and launch lead per graph bucket
(``by_bucket``), and, when requests arrived (``meta.workload.requests``), the request
throughput and each request's decode latency: from the start of the iteration that admitted
it to the end of the forward of the step that produced its last token (mean, p50, p99), and
its queueing time before admission.

Everything is computed on the Trace's columns (numpy); the only DataFrame is
the per-step table itself. Imports: numpy (pandas only to build that DataFrame).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simwar.analysis.hazards import HazardReport, detect
from simwar.analysis.views import forward_kernels, forwards
from simwar.core.trace import OpKind, SpanKind, Trace

if TYPE_CHECKING:
    import pandas as pd

SITES = ("result_copy", "verify_done", "seq_lens", "barrier")


def step_frame(trace: Trace) -> pd.DataFrame:
    return frame(step_columns(trace))


def frame(columns: dict) -> pd.DataFrame:
    """The per-step DataFrame of :func:`step_columns` (or :func:`columns_from_arrays`)."""
    import pandas as pd

    return pd.DataFrame(columns)


def step_columns(trace: Trace) -> dict[str, np.ndarray]:
    """The per-step table of a Trace as numpy columns (see the module docstring)."""
    ops, spans = trace.ops, trace.spans
    fwd = trace.code(trace.meta.get("forward_stream", "forward"))
    if len(forward_kernels(trace)) == 0:
        return {"step": np.zeros(0, dtype=np.int32)}
    fw = forwards(trace)  # the same extents the bubble walk uses
    steps, start, end = fw.steps, fw.start_us, fw.end_us
    lo, hi = idle_windows(end)

    # time on the forward stream within [end_{k-1}, end_k): kernels, and waits that held it
    on_lane = (ops.kind == OpKind.KERNEL) & (ops.lane == fwd)
    busy = busy_in_windows(ops.start_us[on_lane], ops.end_us[on_lane], lo, hi)
    held = (spans.kind == SpanKind.WAIT) & (spans.lane == fwd)
    dep = busy_in_windows(spans.start_us[held], spans.end_us[held], lo, hi)

    blocked = np.flatnonzero(spans.kind == SpanKind.BLOCKED)
    site_codes = spans.site[blocked]
    sites = sorted(set(SITES) | {trace.text(c) for c in np.unique(site_codes)})
    row = np.searchsorted(steps, spans.step[blocked])
    inside = (row < len(steps)) & (steps[np.minimum(row, len(steps) - 1)] == spans.step[blocked])
    length = spans.end_us[blocked] - spans.start_us[blocked]
    by_site = {}
    for site in sites:
        pick = inside & (site_codes == trace.code(site))
        vals = np.zeros(len(steps))
        np.add.at(vals, row[pick], length[pick])
        by_site[site] = vals

    markers = trace.markers
    rb = np.flatnonzero(markers.name == trace.code("run_batch"))
    launch = np.full(len(steps), np.nan)
    # the last run_batch marker of a step wins
    last = len(rb) - 1 - np.unique(markers.step[rb][::-1], return_index=True)[1]
    rb = rb[last]
    row = np.searchsorted(steps, markers.step[rb])
    ok = (row < len(steps)) & (steps[np.minimum(row, len(steps) - 1)] == markers.step[rb])
    launch[row[ok]] = markers.time_us[rb][ok]
    return columns_from_arrays(steps, start, end, busy, dep, by_site, launch,
                               StepFacts(trace.meta))


def tokens(meta: dict) -> float:
    """Tokens produced per step of a constant run: accepted tokens per request times the
    batch size."""
    return float(meta.get("accept_tokens", 1.0)) * int(meta.get("batch_size", 1))


class StepFacts:
    """Per-step batch, graph bucket, accepted tokens and tokens of a run, from its meta.

    ``meta.workload`` holds one value per step (a run whose steps differ); otherwise every
    step has the constants ``batch_size`` and ``accept_tokens``.
    """

    def __init__(self, meta: dict):
        wl = meta.get("workload")
        self.varying = bool(wl)
        if self.varying:
            self.batch = np.asarray(wl["batch_size"], dtype=np.int64)
            self.bucket = np.asarray(wl["graph_bucket"], dtype=np.int64)
            self.accept = np.asarray(wl["accepted_tokens"], dtype=np.float64)
        else:
            self.batch_size = int(meta.get("batch_size", 1))
            self.accept_tokens = float(meta.get("accept_tokens", 1.0))

    def __call__(self, steps: np.ndarray) -> dict[str, np.ndarray]:
        n = len(steps)
        if not self.varying:
            return {"tokens": np.full(n, self.accept_tokens * self.batch_size),
                    "batch_size": np.full(n, self.batch_size, dtype=np.int64),
                    "graph_bucket": np.full(n, self.batch_size, dtype=np.int64),
                    "accepted_tokens": np.full(n, self.accept_tokens)}
        if len(self.batch) == 0:
            idx = np.zeros(n, dtype=np.intp)
            return {"tokens": np.zeros(n), "batch_size": np.zeros(n, dtype=np.int64),
                    "graph_bucket": np.zeros(n, dtype=np.int64),
                    "accepted_tokens": np.zeros(n)}
        idx = np.clip(np.asarray(steps, dtype=np.int64), 0, len(self.batch) - 1)
        batch = self.batch[idx]
        accept = self.accept[idx]
        return {"tokens": accept * batch, "batch_size": batch, "graph_bucket": self.bucket[idx],
                "accepted_tokens": accept}


def idle_windows(end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The window of each step's GPU idle, ``[end k-1, end k)``, as ``(lo, hi)``; both NaN
    for the first forward (no predecessor). Forward ends in issue order: on the FIFO
    forward stream no kernel straddles a forward's end, so each kernel falls in one window."""
    lo = np.insert(end[:-1], 0, np.nan)
    return lo, np.where(np.isnan(lo), np.nan, end)


def columns_from_arrays(steps: np.ndarray, start: np.ndarray, end: np.ndarray,
                        busy: np.ndarray, dep: np.ndarray, blocked: dict[str, np.ndarray],
                        launch: np.ndarray, facts: StepFacts) -> dict[str, np.ndarray]:
    """The per-step columns from per-step facts; every executor's table is assembled here.

    Per row (a step with forward kernels, ascending): forward start and end, the time the
    forward stream was busy (``busy``) and held by waits (``dep``) in its idle window
    [end_{k-1}, end_k) (:func:`idle_windows`), host time blocked in synchronize calls per
    site, and the ``run_batch`` instant (NaN: none); ``facts`` gives each step's batch,
    bucket and accepted tokens.
    """
    nxt = np.append(start[1:], np.nan)
    step_us = nxt - start
    lo, hi = idle_windows(end)
    busy = np.where(np.isnan(lo), np.nan, busy)
    dep = np.where(np.isnan(lo), np.nan, dep)
    idle = (hi - lo) - busy
    idle_dep = np.minimum(dep, idle)
    out = {
        "step": np.asarray(steps, dtype=np.int32),
        "fwd_start_us": start,
        "fwd_end_us": end,
        "fwd_us": end - start,
        "step_us": step_us,
        "fwd_gap_us": start - np.insert(end[:-1], 0, np.nan),
        "gpu_idle_us": idle,
        "gpu_idle_dep_us": idle_dep,
        "gpu_idle_host_us": idle - idle_dep,
        "gpu_busy_us": busy,
    }
    total = np.zeros(len(start))
    sites = {}
    for site in sorted(blocked):
        vals = blocked[site]
        sites[f"cpu_blocked_{site}_us"] = vals
        total = total + vals
    out["cpu_blocked_us"] = total
    out.update(sites)
    out["launch_us"] = launch
    out["launch_lead_us"] = end - np.append(launch[1:], np.nan)
    out["launch_ahead"] = launch_ahead_depth(end, launch)
    out.update(facts(np.asarray(steps)))
    return out


def launch_ahead_depth(end: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """Per forward k: forwards before k still unfinished at launch k (NaN without a launch)."""
    index = np.arange(len(end))
    if np.all(end[1:] >= end[:-1]):  # forward ends in FIFO order: one search for all
        done = np.minimum(np.searchsorted(end, launch, side="right"), index)
    else:  # a measured trace need not be FIFO: search each prefix
        done = np.array([np.searchsorted(end[:i], t, side="right") for i, t in enumerate(launch)])
    return np.where(np.isnan(launch), np.nan, index - done)


def busy_in_windows(s: np.ndarray, e: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per window [lo_i, hi_i): total length of intervals [s, e) inside it (no overlaps).

    Each interval's part inside a window, ``min(e, hi) - max(s, lo)``, is added to the
    window's total one by one in order of start (ties: given order), from 0. No prefix sums:
    a difference of two large running totals would lose the low digits of a long run, and
    this order is the one a one-pass executor adds the same parts in, so both agree exactly.
    Windows with NaN ``hi`` get NaN.
    """
    out = np.zeros(len(lo))
    out[np.isnan(hi)] = np.nan
    if len(s) == 0:
        return out
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    ok = np.flatnonzero(~np.isnan(hi))
    a, b = lo[ok], hi[ok]
    # intervals [i0, i1) may touch window i: ending after its start, starting before its end
    emax = np.maximum.accumulate(e)
    i0 = np.searchsorted(emax, a, side="right")
    i1 = np.searchsorted(s, b, side="left")
    count = np.maximum(i1 - i0, 0)
    win = np.repeat(np.arange(len(ok)), count)
    if len(win) == 0:
        out[ok] = 0.0
        return out
    first = np.repeat(i0, count)
    idx = first + (np.arange(len(win)) - np.repeat(np.cumsum(count) - count, count))
    part = np.minimum(e[idx], b[win]) - np.maximum(s[idx], a[win])
    keep = part > 0
    total = np.bincount(win[keep], weights=part[keep], minlength=len(ok))
    out[ok] = total
    return out


def measured_rows(columns: dict, warmup: int) -> np.ndarray:
    """Rows of the per-step columns that count (after warm-up, with a successor)."""
    if "step_us" not in columns:  # a trace with no forward kernels has no steps
        return np.zeros(0, dtype=np.intp)
    return np.flatnonzero((columns["step"] >= warmup) & ~np.isnan(columns["step_us"]))


def measured(df: pd.DataFrame, warmup: int) -> pd.DataFrame:
    """Steps that count: after warm-up, with a successor."""
    if "step_us" not in df.columns:  # a trace with no forward kernels has no steps
        return df.iloc[0:0]
    return df[(df.step >= warmup) & df.step_us.notna()]


def summarize(df, meta: dict, hazards=None) -> dict:
    """The run's summary from its per-step table (a DataFrame or a mapping of numpy columns).

    Computed with numpy exactly as pandas would (means skip NaN, percentiles do not), so the
    summary needs no pandas. ``hazards``: a :class:`HazardReport`, or anything with
    ``counts(first_step, last_step) -> (races, overlaps, race_steps)``.
    """
    cols = _columns(df)
    warm = int(meta.get("warmup_steps", 0))
    keep = measured_rows(cols, warm)
    out: dict = {"name": meta.get("name", ""), "steps_measured": int(len(keep))}
    if len(keep) == 0:
        return out
    if keep[-1] - keep[0] + 1 == len(keep):  # one run of rows (the usual case): views
        keep = slice(int(keep[0]), int(keep[-1]) + 1)
    m = {name: col[keep] for name, col in cols.items()}

    def q(col, p):
        return float(np.percentile(m[col], p))

    with np.errstate(divide="ignore", invalid="ignore"):
        _summary_values(out, m, q)
        if meta.get("workload"):
            _workload_values(out, m, meta["workload"])
    out.update(hazard_counts(hazards, m["step"]))
    for key in ("barrier", "barrier_effective", "placement", "publish_phase",
                "publish_position"):
        if key in meta:
            out[key] = meta[key]
    return out


def _summary_values(out: dict, m: dict, q) -> None:
    out.update({
        "step_us_mean": _mean(m["step_us"]),
        "step_us_p50": q("step_us", 50),
        "step_us_p99": q("step_us", 99),
        "fwd_us_mean": _mean(m["fwd_us"]),
        "fwd_gap_us_mean": _mean(m["fwd_gap_us"]),
        "fwd_gap_us_p50": q("fwd_gap_us", 50),
        "gpu_idle_us_mean": _mean(m["gpu_idle_us"]),
        "gpu_idle_dep_us_mean": _mean(m["gpu_idle_dep_us"]),
        "gpu_idle_host_us_mean": _mean(m["gpu_idle_host_us"]),
        # the forward stream's busy share of the same windows as its idle
        "gpu_busy_fraction": float(_sum(m["gpu_busy_us"])
                                   / (_sum(m["gpu_busy_us"]) + _sum(m["gpu_idle_us"]))),
        "cpu_blocked_us_mean": _mean(m["cpu_blocked_us"]),
    })
    for col in sorted(c for c in m if c.startswith("cpu_blocked_") and c.endswith("_us")
                      and c != "cpu_blocked_us"):
        out[f"{col}_mean"] = _mean(m[col])
    lead = m["launch_lead_us"]
    lead = lead[~np.isnan(lead)]
    ahead = m["launch_ahead"]
    ahead = ahead[~np.isnan(ahead)]
    nan = float("nan")
    values, counts = np.unique(ahead, return_counts=True)
    out.update({
        "launch_lead_us_mean": _mean(lead) if len(lead) else nan,
        "launch_lead_us_p50": float(np.median(lead)) if len(lead) else nan,
        "run_ahead_fraction": _fraction(lead > 0) if len(lead) else nan,
        "launch_ahead_mean": _mean(ahead) if len(ahead) else nan,
        "launch_ahead_hist": {int(k): float(c / len(ahead)) for k, c in
                              zip(values.tolist(), counts.tolist())},
        # steps that take no time (every duration 0) have no throughput: NaN, not infinity
        "tokens_per_s": (float(_sum(m["tokens"]) / _sum(m["step_us"]) * 1e6)
                         if _sum(m["step_us"]) else nan),
    })


#: per graph bucket: the summary's means of these per-step columns
BUCKET_METRICS = ("step_us", "fwd_gap_us", "gpu_idle_us", "cpu_blocked_us", "launch_lead_us")


def _workload_values(out: dict, m: dict, workload: dict) -> None:
    """Mean batch and accepted tokens, per-bucket means, and the requests' figures."""
    out["batch_size_mean"] = _mean(m["batch_size"].astype(np.float64))
    out["accepted_tokens_mean"] = _mean(m["accepted_tokens"])
    buckets = m["graph_bucket"]
    by = {}
    for b in np.unique(buckets).tolist():
        rows = buckets == b
        by[int(b)] = {"steps": int(np.count_nonzero(rows)),
                      **{f"{c}_mean": _mean(m[c][rows]) for c in BUCKET_METRICS}}
    out["by_bucket"] = by
    req = workload.get("requests")
    if req is not None:
        out.update(request_values(req, m["step"], m["fwd_end_us"], _sum(m["step_us"])))


def request_values(req: dict, steps: np.ndarray, fwd_end: np.ndarray, time_us: float) -> dict:
    """Requests completed in ``steps`` (a run of the measured steps, ascending, with their
    forward ends): their count and rate over ``time_us``, and their decode latency and
    queueing time (see the module docstring)."""
    lat, queue = request_latencies(req, steps, fwd_end)
    nan = float("nan")
    return {
        "requests_completed": int(len(lat)),
        "requests_per_s": float(len(lat) / time_us * 1e6) if time_us else nan,
        "request_latency_us_mean": _mean(lat) if len(lat) else nan,
        "request_latency_us_p50": float(np.percentile(lat, 50)) if len(lat) else nan,
        "request_latency_us_p99": float(np.percentile(lat, 99)) if len(lat) else nan,
        "request_queue_us_mean": _mean(queue) if len(queue) else nan,
    }


def request_latencies(req: dict, steps: np.ndarray, fwd_end: np.ndarray) -> \
        tuple[np.ndarray, np.ndarray]:
    """Decode latency and queueing time of the requests finished in ``steps`` (in request
    order)."""
    finish = np.asarray(req["finish_step"], dtype=np.int64)
    if len(steps) == 0 or len(finish) == 0:
        return np.zeros(0), np.zeros(0)
    row = np.searchsorted(steps, finish)
    ok = (finish >= 0) & (row < len(steps))
    ok[ok] = steps[row[ok]] == finish[ok]
    admit = np.asarray(req["admit_us"], dtype=np.float64)[ok]
    lat = fwd_end[row[ok]] - admit
    queue = admit - np.asarray(req["arrival_us"], dtype=np.float64)[ok]
    return lat, queue


def hazard_counts(hazards, steps: np.ndarray) -> dict:
    """``races``, ``overlaps`` and ``race_steps`` among races whose two accesses both belong
    to ``steps`` (the measured steps, as every other figure; empty without a report)."""
    if hazards is None:
        return {}
    lo, hi = int(steps.min()), int(steps.max())
    if hasattr(hazards, "counts") and hi - lo + 1 == len(steps):
        # the one-pass executor's races, counted over a run of steps without a list
        races, overlaps, race_steps = hazards.counts(lo, hi)
    else:
        if hasattr(hazards, "report"):  # steps with holes (hand-made programs): the list
            hazards = hazards.report()
        h = hazards.within(steps.tolist())
        latent = h.latent
        races, overlaps = len(latent), len(h.observed)
        race_steps = len({r.second_step for r in latent})
    return {"races": races, "overlaps": overlaps, "race_steps": race_steps}


def _columns(df) -> dict[str, np.ndarray]:
    if isinstance(df, dict):
        return df
    return {str(c): df[c].to_numpy() for c in df.columns}


def _sum(x: np.ndarray) -> float:
    """pandas' sum: NaN skipped (as zeros, so the pairwise summation is the same)."""
    nan = np.isnan(x)
    return (np.where(nan, 0.0, x) if nan.any() else x).sum()


def _mean(x: np.ndarray) -> float:
    """pandas' mean: the sum above over the count of values that are not NaN."""
    n = len(x) - int(np.count_nonzero(np.isnan(x)))
    return float(_sum(x) / n) if n else float("nan")


def _fraction(flags: np.ndarray) -> float:
    return float(np.sum(flags, dtype=np.float64) / len(flags))


def analyze(trace: Trace, window: int = 2) -> tuple[pd.DataFrame, dict, HazardReport]:
    """Per-step frame, summary and hazard report of any Trace."""
    df = step_frame(trace)
    hz = detect(trace, window=window)
    return df, summarize(df, trace.meta, hz), hz
