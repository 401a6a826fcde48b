"""The run summary's one spec: its keys in order, the column and statistic of each, the
meta keys copied, and which per-step rows are measured.

Every summary of a run is an evaluation of this table:
:func:`simwar.analysis.metrics.summarize` on the whole per-step table (exact),
:class:`simwar.analysis.streaming.StreamingSummary` on chunks of it (``--summary-only``).
Each of them maps every statistic named here to its own way of computing it; a key is
added here once and both summaries have it (``tests/test_summary_spec.py`` holds them to
the same keys, and their values within the streaming summary's stated accuracy).

A summary is, in order:

1. ``name`` (the run's) and ``steps_measured`` (the measured rows: :func:`measured_mask`);
2. :data:`STEP_KEYS` over the measured rows, with ``cpu_blocked_<site>_us_mean`` for each
   site column of the table in place of the :data:`SITE_PATTERN` entry (sorted by name);
3. a run with a varying workload (``meta.workload``): :data:`WORKLOAD_KEYS`, then
   :data:`SHAPE_KEYS` when its steps' shapes were picked (``meta.workload.shape``); when requests
   arrived (``meta.workload.requests``) :data:`REQUEST_KEYS` over the requests finished in
   the measured steps (their decode latency and queueing time:
   :func:`simwar.analysis.metrics.request_latencies`);
4. the race counts :data:`HAZARD_KEYS` within the measured steps (with a race report);
5. :data:`META_KEYS` copied from the run's meta where present.

The statistics (``valid``: NaN values are dropped first, and the key is NaN, or an empty
histogram, when none is left; otherwise a mean skips NaN as pandas' does and a quantile of
a column with a NaN is NaN):

- ``mean``: the mean of ``column``;
- ``percentile``: numpy's ``percentile(column, arg)`` (method ``linear``);
- ``median``: numpy's ``median(column)``;
- ``positive_fraction``: the fraction of the values that are > 0;
- ``histogram``: ``{int(value): fraction of the values}``, ascending;
- ``busy_fraction``: ``sum(column) / (sum(column) + sum(arg))`` (busy over busy and idle of
  the same windows), NaN where the sum is 0;
- ``rate``: ``sum(column) / sum(arg) * 1e6`` (per second, ``arg`` in µs), NaN where
  ``sum(arg)`` is 0 (steps that take no time have no throughput);
- ``count``: the number of values;
- ``count_rate``: that number over ``sum(arg)``, per second;
- ``by_bucket``: per value of ``column`` (ascending): ``steps`` (its rows) and the mean of
  each column of ``arg`` over them, as ``<column>_mean``;
- ``shares``: per value of ``column`` (a name, ascending): its share of the rows, or with
  ``arg`` its rows' share of ``sum(arg)``.

Imports: numpy and :mod:`simwar.core.run_meta`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simwar.core.run_meta import RunMeta


class Key(NamedTuple):
    """One summary key: the statistic ``stat`` of the per-step ``column`` (see the module
    docstring for ``arg`` and ``valid``)."""

    name: str
    stat: str
    column: str
    arg: object = None
    valid: bool = False


#: the per-site entry of :data:`STEP_KEYS`: one key per ``cpu_blocked_<site>_us`` column
SITE_PATTERN = "cpu_blocked_<site>_us"

#: per graph bucket: the means of these per-step columns (the ``by_bucket`` statistic)
BUCKET_METRICS = ("step_us", "fwd_gap_us", "gpu_idle_us", "cpu_blocked_us", "launch_lead_us")

STEP_KEYS: tuple[Key, ...] = (
    Key("step_us_mean", "mean", "step_us"),
    Key("step_us_p50", "percentile", "step_us", 50),
    Key("step_us_p99", "percentile", "step_us", 99),
    Key("fwd_us_mean", "mean", "fwd_us"),
    Key("fwd_gap_us_mean", "mean", "fwd_gap_us"),
    Key("fwd_gap_us_p50", "percentile", "fwd_gap_us", 50),
    Key("gpu_idle_us_mean", "mean", "gpu_idle_us"),
    Key("gpu_idle_dep_us_mean", "mean", "gpu_idle_dep_us"),
    Key("gpu_idle_host_us_mean", "mean", "gpu_idle_host_us"),
    Key("gpu_busy_fraction", "busy_fraction", "gpu_busy_us", "gpu_idle_us"),
    Key("cpu_blocked_us_mean", "mean", "cpu_blocked_us"),
    Key(SITE_PATTERN + "_mean", "mean", SITE_PATTERN),
    Key("launch_lead_us_mean", "mean", "launch_lead_us", valid=True),
    Key("launch_lead_us_p50", "median", "launch_lead_us", valid=True),
    Key("run_ahead_fraction", "positive_fraction", "launch_lead_us", valid=True),
    Key("launch_ahead_mean", "mean", "launch_ahead", valid=True),
    Key("launch_ahead_hist", "histogram", "launch_ahead", valid=True),
    Key("tokens_per_s", "rate", "tokens", "step_us"),
)

WORKLOAD_KEYS: tuple[Key, ...] = (
    Key("batch_size_mean", "mean", "batch_size"),
    Key("accepted_tokens_mean", "mean", "accepted_tokens"),
    Key("by_bucket", "by_bucket", "graph_bucket", BUCKET_METRICS),
)

#: a run whose scheduler picks each step's shape (``meta.workload.shape``): per shape
#: (decode, prefill, mixed), its share of the measured steps and of their time
SHAPE_KEYS: tuple[Key, ...] = (
    Key("shape_steps", "shares", "shape"),
    Key("shape_time", "shares", "shape", "step_us"),
)

#: over the requests finished in the measured steps (columns of requests, not of steps;
#: ``step_us`` is the measured steps' column)
REQUEST_KEYS: tuple[Key, ...] = (
    Key("requests_completed", "count", "request_latency_us"),
    Key("requests_per_s", "count_rate", "request_latency_us", "step_us"),
    Key("request_latency_us_mean", "mean", "request_latency_us", valid=True),
    Key("request_latency_us_p50", "percentile", "request_latency_us", 50, valid=True),
    Key("request_latency_us_p99", "percentile", "request_latency_us", 99, valid=True),
    Key("request_queue_us_mean", "mean", "request_queue_us", valid=True),
    *(Key(f"request_{m}_us_{s}", stat, f"request_{m}_us", arg, valid=True)
      for m in ("ttft", "ttft_forward", "tpot", "itl")
      for s, stat, arg in (("mean", "mean", None), ("p50", "percentile", 50),
                           ("p99", "percentile", 99))),
    # the TTFT's mean in parts: queueing, prefill, the result's wait (they add up to it)
    *(Key(f"ttft_{part}_us_mean", "mean", f"ttft_{part}_us", valid=True)
      for part in ("queue", "prefill", "result_wait")),
)

#: with an SLO (``meta.slo``): the requests/s meeting every bound, and their share
SLO_KEYS: tuple[Key, ...] = (
    Key("goodput_per_s", "rate", "request_slo_met", "step_us"),
    Key("slo_attainment", "mean", "request_slo_met", valid=True),
)

HAZARD_KEYS = ("races", "overlaps", "race_steps")

#: copied from the run's meta, where present
META_KEYS = ("barrier", "barrier_effective", "placement", "publish_phase", "publish_position")


def site_columns(columns) -> list[str]:
    """The table's per-site blocked-time columns (``cpu_blocked_<site>_us``), sorted."""
    return sorted(c for c in columns if c.startswith("cpu_blocked_") and c.endswith("_us")
                  and c != "cpu_blocked_us")


def step_keys(columns) -> list[Key]:
    """:data:`STEP_KEYS` for a table with these columns (the site entry expanded)."""
    out: list[Key] = []
    for key in STEP_KEYS:
        if key.column == SITE_PATTERN:
            out += [key._replace(name=f"{col}_mean", column=col) for col in site_columns(columns)]
        else:
            out.append(key)
    return out


def summary_keys(columns, run: RunMeta) -> list[Key]:
    """The keys a run's summary evaluates, in order (items 2 and 3 of the module
    docstring): ``columns`` are its table's column names."""
    keys = step_keys(columns)
    if run.workload:
        keys += WORKLOAD_KEYS
        if "shape" in run.workload:
            keys += SHAPE_KEYS
        if run.requests is not None:
            keys += REQUEST_KEYS
            if run.slo:
                keys += SLO_KEYS
    return keys


def assemble(name: str, measured: int, columns, meta: dict, value, hazards: dict) -> dict:
    """A summary in the spec's order: ``value(key)`` evaluates one :class:`Key` (each
    summary its own way), ``columns`` are the table's column names, ``hazards`` the race
    counts (empty without a race report)."""
    out: dict = {"name": name, "steps_measured": measured}
    if not measured:
        return out
    for key in summary_keys(columns, RunMeta.from_meta(meta)):
        out[key.name] = value(key)
    return _tail(out, hazards, meta)


def _tail(out: dict, hazards: dict, meta: dict) -> dict:
    out.update(hazards)
    # copied as the run wrote them, None included: a key the run did not write stays out
    for key in META_KEYS:
        if key in meta:
            out[key] = meta[key]
    return out


def assemble_many(names: list[str], measured: int, keys: list[Key], values: list[list],
                  metas: list[dict], hazards: list[dict]) -> list[dict]:
    """:func:`assemble` of runs with the same ``keys`` (:func:`summary_keys`) and
    ``measured`` steps (at least one): ``values[i]`` is key ``i``'s value for every run, in
    the runs' order. The same dicts, built a run at a time from rows instead of a key at a
    time."""
    heads = [k.name for k in keys]
    return [_tail({"name": name, "steps_measured": measured, **dict(zip(heads, row))},
                  counts, meta)
            for name, row, meta, counts in zip(names, zip(*values), metas, hazards)]


def measured_mask(step: np.ndarray, step_us: np.ndarray, warmup: int) -> np.ndarray:
    """The rows of a per-step table that count: after the warm-up (``step >= warmup``) and
    with a successor (a step time that is not NaN). The one definition: every summary, the
    CLI's race listing and the plots take their rows from it."""
    return (step >= warmup) & ~np.isnan(step_us)
