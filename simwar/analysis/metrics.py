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

The summary (its keys, the column and statistic of each: :mod:`simwar.analysis.summary`)
drops warm-up steps (``meta.warmup_steps``) and the last step (it has no successor). A run
with a ``meta.workload`` also gets its mean batch and accepted tokens, step time, forward
gap, GPU idle, CPU blocked time and launch lead per graph bucket (``by_bucket``), and, when
requests arrived (``meta.workload.requests``), the request throughput and each request's
decode latency: from the start of the iteration that admitted it to the end of the forward
of the step that produced its last token (mean, p50, p99), and its queueing time before
admission; the TTFT's mean in parts (queueing, prefill, the result's wait:
:func:`request_columns`), and per request its prefill chunks (:mod:`simwar.analysis.prefill`).

Everything is computed on the Trace's columns (numpy); the only DataFrame is
the per-step table itself. Imports: numpy (pandas only to build that DataFrame).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from simwar.analysis.hazards import HazardReport, detect
from simwar.analysis.summary import Key, assemble, measured_mask
from simwar.core.kinds import OpKind, SpanKind
from simwar.core.run_meta import RunMeta

if TYPE_CHECKING:
    import pandas as pd

    from simwar.core.trace import Trace  # annotations only: a run keeps no Trace

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
    # lazy: start-up time of `simwar run`, whose fast executor makes no Trace
    from simwar.analysis.views import forward_kernels, forwards

    fwd = trace.code(trace.run.forward_stream)
    if len(forward_kernels(trace)) == 0:
        return {"step": np.zeros(0, dtype=np.int32)}
    fw = forwards(trace)  # the same extents the bubble walk uses
    steps, start, end = fw.steps, fw.start_us, fw.end_us
    lo, hi = idle_windows(end)

    # time on the forward stream within [end_{k-1}, end_k): kernels, and waits that held it
    on_lane = (ops.kind == OpKind.KERNEL) & (ops.lane == fwd)
    busy = busy_in_windows(*merged(ops.start_us[on_lane], ops.end_us[on_lane]), lo, hi)
    held = (spans.kind == SpanKind.WAIT) & (spans.lane == fwd)
    dep = busy_in_windows(*merged(spans.start_us[held], spans.end_us[held]), lo, hi)

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
    done = None
    rd = np.flatnonzero(markers.name == trace.code("result_done"))
    if len(rd):  # a run with requests: the host instant each result was processed
        done = np.full(len(steps), np.nan)
        row = np.searchsorted(steps, markers.step[rd])
        ok = (row < len(steps)) & (steps[np.minimum(row, len(steps) - 1)] == markers.step[rd])
        done[row[ok]] = markers.time_us[rd][ok]
    return columns_from_arrays(steps, start, end, busy, dep, by_site, launch,
                               StepFacts(trace.run), done)


def tokens(meta: dict | RunMeta) -> float:
    """Tokens produced per step of a constant run: accepted tokens per request times the
    batch size."""
    run = RunMeta.of(meta)
    return run.accept_tokens * int(run.batch_size)


class StepFacts:
    """Per-step batch, graph bucket, accepted tokens and tokens of a run, from its meta.

    ``meta.workload`` holds one value per step (a run whose steps differ); otherwise every
    step has the constants ``batch_size`` and ``accept_tokens``.
    """

    def __init__(self, meta: dict | RunMeta):
        run = RunMeta.of(meta)
        wl = run.workload
        self.varying = bool(wl)
        #: the steps' shapes, when the run picked them (a column of names)
        self.shape = np.asarray(wl["shape"]) if self.varying and "shape" in wl else None
        if self.varying:
            self.batch = np.asarray(wl["batch_size"], dtype=np.int64)
            self.bucket = np.asarray(wl["graph_bucket"], dtype=np.int64)
            self.accept = np.asarray(wl["accepted_tokens"], dtype=np.float64)
        else:
            self.batch_size = int(run.batch_size)
            self.accept_tokens = run.accept_tokens

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
        out = {"tokens": accept * batch, "batch_size": batch, "graph_bucket": self.bucket[idx],
               "accepted_tokens": accept}
        if self.shape is not None:
            out["shape"] = self.shape[idx]
        return out


def idle_windows(end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The window of each step's GPU idle, ``[end k-1, end k)``, as ``(lo, hi)``; both NaN
    for the first forward (no predecessor). Forward ends in issue order: on the FIFO
    forward stream no kernel straddles a forward's end, so each kernel falls in one window.
    Along the last axis (a row per run of the same steps, in lockstep)."""
    lo = _previous(end)
    return lo, np.where(np.isnan(lo), np.nan, end)


def columns_from_arrays(steps: np.ndarray, start: np.ndarray, end: np.ndarray,
                        busy: np.ndarray, dep: np.ndarray, blocked: dict[str, np.ndarray],
                        launch: np.ndarray, facts: StepFacts,
                        done: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """The per-step columns from per-step facts; every executor's table is assembled here.

    Per row (a step with forward kernels, ascending): forward start and end, the time the
    forward stream was busy (``busy``) and held by waits (``dep``) in its idle window
    [end_{k-1}, end_k) (:func:`idle_windows`), host time blocked in synchronize calls per
    site, and the ``run_batch`` instant (NaN: none); ``facts`` gives each step's batch,
    bucket and accepted tokens. The facts may be 2-d, a row per run of the same steps (runs in
    lockstep): each row is then the table that run's own facts give.
    """
    nxt = _next(start)
    step_us = nxt - start
    lo, hi = idle_windows(end)  # lo: each forward's predecessor's end
    first = np.isnan(lo)
    busy = np.where(first, np.nan, busy)
    dep = np.where(first, np.nan, dep)
    idle = (hi - lo) - busy
    idle_dep = np.minimum(dep, idle)
    out = {
        "step": np.asarray(steps, dtype=np.int32),
        "fwd_start_us": start,
        "fwd_end_us": end,
        "fwd_us": end - start,
        "step_us": step_us,
        "fwd_gap_us": start - lo,
        "gpu_idle_us": idle,
        "gpu_idle_dep_us": idle_dep,
        "gpu_idle_host_us": idle - idle_dep,
        "gpu_busy_us": busy,
    }
    total = np.zeros(start.shape)
    sites = {}
    for site in sorted(blocked):
        vals = blocked[site]
        sites[f"cpu_blocked_{site}_us"] = vals
        if not _zeros(vals):  # +0.0 added to a total begun at +0.0 changes nothing
            total = total + vals
    out["cpu_blocked_us"] = total
    out.update(sites)
    out["launch_us"] = launch
    out["launch_lead_us"] = end - _next(launch)
    out["launch_ahead"] = launch_ahead_depth(end, launch)
    if done is not None:  # a run with requests: when the host had processed each result
        out["result_done_us"] = done
    per_step = facts(np.asarray(steps))
    if start.ndim == 2:  # the same for every run of a lockstep group
        per_step = {k: np.broadcast_to(v, start.shape) for k, v in per_step.items()}
    out.update(per_step)
    return out


def _zeros(x: np.ndarray) -> bool:
    """Whether ``x`` is +0.0 broadcast (a site no op of runs in lockstep syncs at)."""
    return x.size > 0 and not any(x.strides) and x.flat[0] == 0 and not np.signbit(x.flat[0])


def _next(x: np.ndarray) -> np.ndarray:
    """Each step's successor (NaN after the last), along the last axis."""
    return np.concatenate([x[..., 1:], np.full(x.shape[:-1] + (1,), np.nan)], axis=-1)


def _previous(x: np.ndarray) -> np.ndarray:
    """Each step's predecessor (NaN before the first), along the last axis."""
    return np.concatenate([np.full(x.shape[:-1] + (1,), np.nan), x[..., :-1]], axis=-1)


def launch_ahead_depth(end: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """Per forward k: forwards before k still unfinished at launch k (NaN without a launch).
    2-d: per row (runs in lockstep)."""
    if end.ndim == 2:
        return _launch_ahead_columns(end, launch)
    index = np.arange(len(end))
    if np.all(end[1:] >= end[:-1]):  # forward ends in FIFO order: one search for all
        done = np.minimum(np.searchsorted(end, launch, side="right"), index)
    else:  # a measured trace need not be FIFO: search each prefix
        done = np.array([np.searchsorted(end[:i], t, side="right") for i, t in enumerate(launch)])
    return np.where(np.isnan(launch), np.nan, index - done)


def _launch_ahead_columns(end: np.ndarray, launch: np.ndarray) -> np.ndarray:
    """:func:`launch_ahead_depth` of each row. Where forward ends are in FIFO order, the
    forwards before k unfinished at launch k are the last ones before it: count them back
    from k - 1 until one ended by the launch (the same count as the search; counted in
    floats, which hold these counts exactly)."""
    fifo = np.all(end[:, 1:] >= end[:, :-1], axis=1)
    if fifo.all():  # every row: the arrays as they are, no copies
        return _counted_back(end, launch)
    out = np.zeros(end.shape)
    for j in np.flatnonzero(~fifo).tolist():
        out[j] = launch_ahead_depth(end[j], launch[j])
    rows = np.flatnonzero(fifo)
    if len(rows):
        out[rows] = _counted_back(end[rows], launch[rows])
    return out


def _counted_back(e: np.ndarray, la: np.ndarray) -> np.ndarray:
    ahead = np.zeros(e.shape)
    for d in range(1, e.shape[1]):
        late = e[:, :-d] > la[:, d:]  # forward k - d still running at launch k
        if not late.any():
            break
        ahead[:, d:] += late
    nan = np.isnan(la)
    if nan.any():
        ahead[nan] = np.nan
    return ahead


def merged(s: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Intervals [s, e) as :func:`busy_in_windows` takes them: without overlaps. A simulated
    stream runs one op at a time, so its intervals are returned as they are (the same sums,
    in the same order, as every executor's); a capture's can overlap (an event recorded
    twice, kernels one stream ran at once by the profiler's clock), and are merged into
    their union, so a stream is never busy longer than the time that passed (an idle time
    is never negative)."""
    if len(s) < 2:
        return s, e
    order = np.argsort(s, kind="stable")
    ss, ee = s[order], e[order]
    reach = np.maximum.accumulate(ee)
    if not (ss[1:] < reach[:-1]).any():
        return s, e
    new = np.concatenate(([True], ss[1:] >= reach[:-1]))  # starts a run of overlaps
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(ss) - 1)
    return ss[first], reach[last]


def busy_in_windows(s: np.ndarray, e: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Per window [lo_i, hi_i): total length of intervals [s, e) inside it (no overlaps).

    Each interval's part inside a window, ``min(e, hi) - max(s, lo)``, is added to the
    window's total one by one in order of start (ties: given order), from 0. No prefix sums:
    a difference of two large running totals would lose the low digits of a long run, and
    this order is the one a fast executor adds the same parts in, so both agree exactly.
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
    """Rows of the per-step columns that count (:func:`simwar.analysis.summary.measured_mask`)."""
    if "step_us" not in columns:  # a trace with no forward kernels has no steps
        return np.zeros(0, dtype=np.intp)
    return np.flatnonzero(measured_mask(columns["step"], columns["step_us"], warmup))


def measured(df: pd.DataFrame, warmup: int) -> pd.DataFrame:
    """Steps that count (:func:`simwar.analysis.summary.measured_mask`)."""
    if "step_us" not in df.columns:  # a trace with no forward kernels has no steps
        return df.iloc[0:0]
    return df[measured_mask(df.step.to_numpy(), df.step_us.to_numpy(), warmup)]


def summarize(df, meta: dict, hazards=None) -> dict:
    """The run's summary from its per-step table (a DataFrame or a mapping of numpy columns):
    the keys of :mod:`simwar.analysis.summary`, each computed exactly on the measured rows.

    Computed with numpy exactly as pandas would (means skip NaN, percentiles do not), so the
    summary needs no pandas. ``hazards``: a :class:`HazardReport`, or anything with
    ``counts(first_step, last_step) -> (races, overlaps, race_steps)``.
    """
    cols = _columns(df)
    run = RunMeta.of(meta)
    keep = measured_rows(cols, run.warmup_steps)
    name = run.name
    if len(keep) == 0:
        return assemble(name, 0, cols, meta, None, {})
    if keep[-1] - keep[0] + 1 == len(keep):  # one run of rows (the usual case): views
        keep = slice(int(keep[0]), int(keep[-1]) + 1)
    m = {name: col[keep] for name, col in cols.items()}
    req = run.requests
    if req is not None:
        # first tokens may come from any step (the warm-up's too): the whole table
        first = first_tokens(req, cols["step"], cols["fwd_end_us"], cols.get("result_done_us"))
        m.update(request_columns(req, m["step"], m["fwd_end_us"], first, run.slo))
    valid: dict[str, np.ndarray] = {}

    def value(key: Key):
        col = m[key.column]
        if key.valid:
            if key.column not in valid:
                valid[key.column] = col[~np.isnan(col)]
            col = valid[key.column]
        return _EXACT[key.stat](col, key, m)

    with np.errstate(divide="ignore", invalid="ignore"):
        return assemble(name, len(m["step"]), cols, meta, value,
                        hazard_counts(hazards, m["step"]))


def _percentile(x: np.ndarray, key: Key, m: dict) -> float:
    if key.valid and not len(x):
        return float("nan")
    return percentile(x, key.arg)


def percentile(x: np.ndarray, q: float) -> float:
    """``numpy.percentile(x, q)`` (method ``linear``) of a 1-d array, bit for bit.

    Written out rather than called: numpy's own ``percentile`` calls ``np.unique``, which
    imports ``numpy.ma`` (about 5 ms of a short ``simwar run``'s start-up). The steps are
    numpy's: the two order statistics around the virtual index found by ``np.partition``,
    then :func:`numpy_lerp`; NaN when a value is NaN (``tests/test_percentile.py``
    holds it to ``numpy.percentile``).
    """
    n = len(x)
    if n == 0:  # numpy's own error or value
        return float(np.percentile(x, q))
    lo, hi, gamma = _virtual_index(n, q)
    part = np.partition(x, sorted({0, n - 1, lo, hi}))
    if part.dtype.kind in "fc" and np.isnan(part[-1]):  # a NaN sorts last: numpy gives it
        return float(part[-1])
    return float(numpy_lerp(part[lo], part[hi], gamma))


def median(x: np.ndarray) -> float:
    """``numpy.median(x)`` of a 1-d array, bit for bit, written out for the reason
    :func:`percentile` is (numpy's checks its NaNs with ``numpy.ma``): numpy's steps, the
    middle one or two values found by ``np.partition`` and their ``np.mean``, or the NaN
    that sorts last."""
    n = len(x)
    if n == 0:  # numpy's own warning and value
        return float(np.median(x))
    mid = slice(n // 2, n // 2 + 1) if n % 2 else slice(n // 2 - 1, n // 2 + 1)
    part = np.partition(x, sorted({mid.start, mid.stop - 1, n - 1}))
    if part.dtype.kind in "fc" and np.isnan(part[-1]):
        return float(part[-1])
    return float(np.mean(part[mid]))


def numpy_percentile(at, n: int, q: float) -> float:
    """``numpy.percentile`` (method ``linear``) of ``n`` values, ``at(i)`` the i-th smallest
    (no NaN among them): numpy's own arithmetic, without the array."""
    lo, hi, gamma = _virtual_index(n, q)
    return float(numpy_lerp(at(lo), at(hi), gamma))


def _virtual_index(n: int, q: float) -> tuple[int, int, float]:
    """numpy's ``linear`` method: the order statistics interpolated and the weight of the
    upper one. Past the last value both are the last and the weight is the virtual index's
    distance from index -1, as numpy computes it (``_get_indexes``, ``_get_gamma``)."""
    virtual = (n - 1) * float(np.true_divide(q, 100))
    if virtual >= n - 1:
        return n - 1, n - 1, virtual + 1
    lo = math.floor(virtual)
    return lo, lo + 1, virtual - lo


def numpy_lerp(a, b, t: float):
    """numpy's two-sided linear interpolation (``_lerp``): from ``a`` below one half, from
    ``b`` above, each exact at its end."""
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def _median(x: np.ndarray, key: Key, m: dict) -> float:
    return median(x) if len(x) else float("nan")


def _positive_fraction(x: np.ndarray, key: Key, m: dict) -> float:
    return _fraction(x > 0) if len(x) else float("nan")


def _shares(x: np.ndarray, key: Key, m: dict) -> dict:
    names = np.unique(x).tolist()
    if key.arg is None:
        return {name: float(np.count_nonzero(x == name) / len(x)) for name in names}
    col = m[key.arg]
    total = _sum(col)
    return {name: float(_ratio(_sum(col[x == name]), total)) for name in names}


def _histogram(x: np.ndarray, key: Key, m: dict) -> dict:
    values, counts = np.unique(x, return_counts=True)
    return {int(k): float(c / len(x)) for k, c in zip(values.tolist(), counts.tolist())}


def _by_bucket(x: np.ndarray, key: Key, m: dict) -> dict:
    by = {}
    for b in np.unique(x).tolist():
        rows = x == b
        by[int(b)] = {"steps": int(np.count_nonzero(rows)),
                      **{f"{c}_mean": _mean(m[c][rows]) for c in key.arg}}
    return by


def _count_rate(x: np.ndarray, key: Key, m: dict) -> float:
    time_us = _sum(m[key.arg])
    return float(len(x) / time_us * 1e6) if time_us else float("nan")


#: each statistic of the spec (:mod:`simwar.analysis.summary`), exactly: ``f(values, key,
#: measured columns)``
_EXACT = {
    "mean": lambda x, key, m: _mean(x.astype(np.float64, copy=False)),
    "percentile": _percentile,
    "median": _median,
    "positive_fraction": _positive_fraction,
    "histogram": _histogram,
    "busy_fraction": lambda x, key, m: _ratio(_sum(x), _sum(x) + _sum(m[key.arg])),
    "rate": lambda x, key, m: _ratio(_sum(x), _sum(m[key.arg])) * 1e6,
    "count": lambda x, key, m: int(len(x)),
    "count_rate": _count_rate,
    "by_bucket": _by_bucket,
    "shares": _shares,
}


def request_latencies(req: dict, steps: np.ndarray, fwd_end: np.ndarray) -> \
        tuple[np.ndarray, np.ndarray]:
    """Decode latency and queueing time of the requests finished in ``steps`` (in request
    order)."""
    finish = np.asarray(req["finish_step"], dtype=np.int64)
    if len(steps) == 0 or len(finish) == 0:
        return np.zeros(0), np.zeros(0)
    ok, row = _rows_of(finish, steps)
    admit = np.asarray(req["admit_us"], dtype=np.float64)[ok]
    lat = fwd_end[row[ok]] - admit
    queue = admit - np.asarray(req["arrival_us"], dtype=np.float64)[ok]
    return lat, queue


def _rows_of(step_of: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per request, whether its step (``step_of``) is a row of ``steps``, and the row."""
    row = np.searchsorted(steps, step_of)
    ok = (step_of >= 0) & (row < len(steps))
    ok[ok] = steps[row[ok]] == step_of[ok]
    return ok, row


def first_tokens(req: dict, steps: np.ndarray, fwd_end: np.ndarray, done: np.ndarray | None,
                 into: tuple[np.ndarray, np.ndarray] | None = None) -> tuple[np.ndarray, ...]:
    """Per request (all of them, in request order): the end of the forward that produced its
    first token and the host instant its result was processed, for the requests whose first
    token's step is one of ``steps`` (NaN for the others; ``into``: arrays to fill)."""
    first = np.asarray(req.get("first_step", req["admit_step"]), dtype=np.int64)
    if into is None:
        into = (np.full(len(first), np.nan), np.full(len(first), np.nan))
    if len(steps) and len(first):
        ok, row = _rows_of(first, steps)
        into[0][ok] = fwd_end[row[ok]]
        if done is not None:
            into[1][ok] = done[row[ok]]
    return into


def request_columns(req: dict, steps: np.ndarray, fwd_end: np.ndarray,
                    first: tuple[np.ndarray, np.ndarray], slo: dict | None = None) -> dict:
    """The per-request columns of the requests finished in ``steps`` (in request order):
    ``request_latency_us`` (admission to the last token's forward end), ``request_queue_us``
    (arrival to admission), ``request_ttft_forward_us`` (arrival to the end of the forward
    that produced the first token), ``request_ttft_us`` (arrival to that step's result
    processed on the host: what a client sees), ``request_tpot_us`` (first to last token's
    forward end, per further output token), ``request_itl_us`` (the same per decode step:
    the gap between two emissions), the TTFT's parts ``ttft_queue_us`` (arrival to
    admission), ``ttft_prefill_us`` (admission to the end of the forward that produced the
    first token: its prefill chunks and whatever ran between) and ``ttft_result_wait_us``
    (that forward's end to the host having processed its result: one step later under
    overlap), which add up to ``request_ttft_us`` (the last is the rest, so exactly), and
    with an ``slo`` (metric -> µs bound,
    :data:`simwar.config.schema.SLO_METRICS`) ``request_slo_met`` (1.0 when every bound
    holds). ``first``: :func:`first_tokens` of every request."""
    finish = np.asarray(req["finish_step"], dtype=np.int64)
    if len(steps) == 0 or len(finish) == 0:
        out = {c: np.zeros(0) for c in REQUEST_COLUMNS}
        if slo:
            out["request_slo_met"] = np.zeros(0)
        return out
    ok, row = _rows_of(finish, steps)
    last = fwd_end[row[ok]]
    arrival = np.asarray(req["arrival_us"], dtype=np.float64)[ok]
    admit = np.asarray(req["admit_us"], dtype=np.float64)[ok]
    f_end, f_done = first[0][ok], first[1][ok]
    first_step = np.asarray(req.get("first_step", req["admit_step"]), dtype=np.int64)[ok]
    tokens = np.asarray(req["output_tokens"], dtype=np.float64)[ok]
    if "decode_steps" in req:  # steps of other shapes between (prefill steps: decodes pause)
        decode_steps = np.asarray(req["decode_steps"], dtype=np.float64)[ok]
    else:
        decode_steps = (finish[ok] - first_step).astype(np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        tpot = np.where(tokens > 1, (last - f_end) / (tokens - 1), np.nan)
        itl = np.where(decode_steps > 0, (last - f_end) / decode_steps, np.nan)
    ttft = f_done - arrival
    queue, prefill = admit - arrival, f_end - admit
    out = {"request_latency_us": last - admit, "request_queue_us": queue,
           "request_ttft_forward_us": f_end - arrival, "request_ttft_us": ttft,
           "request_tpot_us": tpot, "request_itl_us": itl,
           # the TTFT in three parts that add up to it exactly: the result's wait is the
           # rest (the first token's forward end to the host having processed its result)
           "ttft_queue_us": queue, "ttft_prefill_us": prefill,
           "ttft_result_wait_us": ttft - (queue + prefill)}
    if slo:
        met = np.ones(len(last), dtype=bool)
        for metric, bound in slo.items():
            x = out[SLO_COLUMNS[metric]]
            met &= ~(x > bound)  # NaN (no such figure, e.g. TPOT of one token) meets it
        out["request_slo_met"] = met.astype(np.float64)
    return out


def request_table(columns: dict, meta: dict | RunMeta) -> dict[str, np.ndarray]:
    """One row per request finished in the measured steps (the summary's requests): its
    arrival, lengths, admission, first-token and last-token steps, and the columns of
    :func:`request_columns`; empty without requests."""
    run = RunMeta.of(meta)
    req = run.requests
    if req is None or "step_us" not in columns:
        return {}
    keep = measured_rows(columns, run.warmup_steps)
    steps, fwd_end = columns["step"][keep], columns["fwd_end_us"][keep]
    first = first_tokens(req, columns["step"], columns["fwd_end_us"],
                         columns.get("result_done_us"))
    finish = np.asarray(req["finish_step"], dtype=np.int64)
    ok, _ = _rows_of(finish, steps) if len(steps) else (np.zeros(len(finish), bool), None)
    out = {k: np.asarray(req[k])[ok] for k in ("arrival_us", "admit_us", "prompt_tokens",
                                                "output_tokens", "admit_step", "prefill_step",
                                                "first_step", "finish_step") if k in req}
    out.update(request_columns(req, steps, fwd_end, first, run.slo))
    if "prefill_step" in req:  # prompts: each request's chunks
        # lazy: start-up time of a run without prompts
        from simwar.analysis.prefill import chunk_columns

        out.update(chunk_columns(out, columns, run))
    return out


#: the per-request columns of :func:`request_columns` (without the SLO's)
REQUEST_COLUMNS = ("request_latency_us", "request_queue_us", "request_ttft_forward_us",
                   "request_ttft_us", "request_tpot_us", "request_itl_us", "ttft_queue_us",
                   "ttft_prefill_us", "ttft_result_wait_us")
#: an SLO's metric -> its column (:data:`simwar.config.schema.SLO_METRICS`, repeated here:
#: analysis does not import config; tests/test_prefill.py holds them equal)
SLO_COLUMNS = {"ttft": "request_ttft_us", "ttft_forward": "request_ttft_forward_us",
               "tpot": "request_tpot_us", "itl": "request_itl_us",
               "latency": "request_latency_us"}


def hazard_counts(hazards, steps: np.ndarray) -> dict:
    """``races``, ``overlaps`` and ``race_steps`` among races whose two accesses both belong
    to ``steps`` (the measured steps, ascending, as every other figure: an array or a
    ``range``; empty without a report)."""
    if hazards is None:
        return {}
    if isinstance(steps, range):  # a run of steps (the streaming summary's)
        lo, hi = steps.start, steps.stop - 1
    else:
        lo, hi = int(steps.min()), int(steps.max())
    if hasattr(hazards, "counts") and hi - lo + 1 == len(steps):
        # the fast executor's races, counted over a run of steps without a list
        races, overlaps, race_steps = hazards.counts(lo, hi)
    else:
        if hasattr(hazards, "report"):  # steps with holes (hand-made programs): the list
            hazards = hazards.report()
        h = hazards.within(list(steps))
        latent = h.latent
        races, overlaps = len(latent), len(h.observed)
        race_steps = len({r.second_step for r in latent})
    return {"races": races, "overlaps": overlaps, "race_steps": race_steps}


def _columns(df) -> dict[str, np.ndarray]:
    if isinstance(df, dict):
        return df
    return {str(c): df[c].to_numpy() for c in df.columns}


def _ratio(a: float, b: float) -> float:
    """``a / b``; NaN where ``b`` is 0 (steps that take no time: no rate, no share)."""
    return float(a / b) if b else float("nan")


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
