"""Calibration from measured harness replays, and the sim-vs-real error table.

- :func:`measured_summary`: one measured Trace → a small JSON-able record:
  the ``analyze`` summary (the simulator's own metric code), the measured
  races after warm-up and the per-call host costs seen in the run;
- :func:`fit_costs`: the config's ``costs.*`` from measured summaries (and
  the micro-benchmarks). Each host cost is the count-weighted mean of that
  call's measured host time over all cases (every call of a kind makes the
  same host calls in the replay, so one figure fits all); ``sync_wake_us`` and
  ``cross_stream_us`` are device latencies the replay does not time (it times
  each step's forward only), so they come from the micro-benchmarks (a
  summary that carries them, from an older replay, still takes precedence; with
  neither they are left out, not set to 0). No figure is
  fitted to step times, so comparing step times afterwards is a real check.
  ``host_call_us`` then takes up what per-call costs miss: :func:`fit_host_call_us`,
  the per-call overhead of the host loop around each API call (interpreter,
  framework dispatch, bookkeeping). On a CPU-bound loop the step time is linear
  in it, so it is the least-squares slope over the CPU-bound cases, found by
  simulating each case twice;
- :func:`loop_case_config`: one case of the measured overlap-loop replay
  (``tests/data/h200_overlap_run1.json``: a host loop with planning ``P``,
  schedule-stream work ``W`` before a one-element shared write, a forward that
  reads the buffer after ``R`` and computes ``C`` more, a WAR barrier, and
  result processing ``Q``) as a config, with the measured primitive costs for
  the host API calls;
- :func:`error_table`: simulate each case with the calibrated costs and tabulate
  simulated vs measured per metric (abs and relative error, by
  :func:`simwar.fit.compare.compare_figures`, the comparison ``simwar import
  --check`` uses too), race presence included, and for cases whose steps differ
  (a ``workload``) the median over steps of each step's own step-time error
  (``step_us_per_step``); :func:`criteria` and :func:`markdown_table` summarize
  it, ``simwar.plots.plot_compare`` draws step time and forward gap per case;
- :func:`with_host_speed`: the calibrated host costs scaled by one measured
  factor per case, the case's own mean launch cost over the calibrated one
  (:func:`simwar.fit.profiler.scale_host`, the one rule for a host at another speed).
  The GPU machine's host changes speed by up to 2x within a session (see
  calibration/README.md); this factor is measured during the very replay being
  compared, never fitted to its step time, so a comparison that uses it checks
  the model under the host speed the case actually ran at.

Imports: simwar's full stack (pandas). Not for the GPU machine.
"""

from __future__ import annotations

import gzip
import json
import statistics
import tarfile
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from simwar.analysis.metrics import analyze
from simwar.analysis.metrics import measured as measured_steps
from simwar.api import simulate
from simwar.core.files import jsonable
from simwar.core.trace import Trace
from simwar.fit.compare import FigureComparison, compare_figure, compare_figures, relative_error
from simwar.fit.profiler import scale_host
from simwar.harness.replay import COST_KINDS

#: metrics compared per case (summary keys of ``simwar.analysis.metrics``)
METRICS = ("step_us_mean", "step_us_p50", "fwd_us_mean", "fwd_gap_us_mean", "gpu_idle_us_mean",
           "cpu_blocked_us_mean", "launch_lead_us_mean", "launch_ahead_mean", "tokens_per_s")


#: per-step columns a measured record keeps for a run whose steps differ
STEP_COLUMNS = ("step", "batch_size", "graph_bucket", "step_us", "fwd_gap_us", "launch_ahead")


def measured_summary(trace: Trace) -> dict:
    """The compact record of one measured run (what ``calibration/`` keeps).

    A run whose steps differ (``meta.workload``) also keeps its measured steps' own
    figures (:data:`STEP_COLUMNS`, after warm-up), for per-step errors.
    """
    df, summary, _ = analyze(trace)
    warm = int(trace.meta.get("warmup_steps", 0))
    races = [r for r in trace.meta.get("measured_races", []) if r["read_step"] >= warm]
    extra = {}
    if trace.meta.get("workload"):
        rows = measured_steps(df, warm)
        extra["steps"] = {c: rows[c].tolist() for c in STEP_COLUMNS if c in rows.columns}
    return jsonable({
        "summary": summary,
        "measured_races": len(races),
        "measured_race_steps": len({r["read_step"] for r in races}),
        "host_costs": trace.meta.get("host_costs", {}),
        "sync_wake_us": trace.meta.get("sync_wake_us", {}),
        "cross_stream_us": trace.meta.get("cross_stream_us", {}),
        "device": trace.meta.get("device", {}),
        "host_probe_us": trace.meta.get("host_probe_us", {}),
        **extra,
    })


def load_traces(source: str | Path) -> dict[str, Trace]:
    """Measured traces by case: a directory of ``<case>.trace.json.gz`` or a tar of them."""
    source = Path(source)
    out: dict[str, Trace] = {}
    if source.is_dir():
        for f in sorted(source.glob("*.trace.json*")):
            out[f.name.split(".trace.json")[0]] = Trace.load(f)
        return out
    if tarfile.is_tarfile(source):
        with tarfile.open(source) as tar:
            for m in tar.getmembers():
                if ".trace.json" in m.name:
                    raw = tar.extractfile(m).read()
                    if m.name.endswith(".gz"):
                        raw = gzip.decompress(raw)
                    out[Path(m.name).name.split(".trace.json")[0]] = Trace.from_dict(
                        json.loads(raw))
        return out
    name = source.name.split(".trace.json")[0]
    return {name: Trace.load(source)}


def _pooled_mean(summaries: list[dict], kind: str) -> float | None:
    num = den = 0.0
    for s in summaries:
        st = s.get("host_costs", {}).get(kind, {})
        if st.get("n"):
            num += st["mean"] * st["n"]
            den += st["n"]
    return num / den if den else None


def _pooled_median(summaries: list[dict], key: str) -> float | None:
    vals = [s[key]["median"] for s in summaries if s.get(key, {}).get("n")]
    return statistics.median(vals) if vals else None


#: the device latencies the replay does not time, and the micro-benchmark figure of each
DEVICE_LATENCIES = {"sync_wake_us": "sync_wake_after_200us_us",
                    "cross_stream_us": "cross_stream_us"}


def fit_costs(summaries: dict[str, dict], bench: dict | None = None,
              cpu_bound: dict[str, dict] | None = None) -> dict:
    """``costs.*`` from measured summaries; ``cpu_bound``: case configs for ``host_call_us``.

    Micro-benchmark figures fill any kind no replay measured; a cost that neither
    measured is left out (never written as 0), so a config that applies the result
    keeps its own figure for it.
    """
    recs = list(summaries.values())
    prim = (bench or {}).get("primitives", {})
    fallback = {"launch_us": prim.get("launch_sleep_kernel_us"),
                "graph_launch_us": prim.get("graph_launch_20n_host_us"),
                "event_record_us": prim.get("event_record_us"),
                "wait_event_us": prim.get("stream_wait_event_us"),
                "wait_stream_us": prim.get("stream_wait_stream_us"),
                "sync_us": prim.get("event_query_us")}
    costs: dict = {}
    for kind in COST_KINDS:
        v = _pooled_mean(recs, kind)
        if v is None:
            v = fallback.get(kind)
        if v is not None:
            costs[kind] = round(float(v), 3)
    for key, bench_key in DEVICE_LATENCIES.items():
        v = _pooled_median(recs, key)
        if v is None:
            v = prim.get(bench_key)
        if v is not None:  # measured by neither: left out, so a config keeps its own figure
            # clock-alignment noise can put a host return a little before the estimated firing
            costs[key] = round(max(0.0, float(v)), 3)
    costs["host_call_us"] = 0.0
    if cpu_bound:
        configs = []
        measured = []
        for name, cfg in cpu_bound.items():
            if name in summaries:
                configs.append(_with_costs(cfg, costs))
                measured.append(summaries[name]["summary"]["step_us_mean"])
        if configs:
            costs["host_call_us"] = round(fit_host_call_us(configs, measured), 3)
    return costs


def _with_costs(cfg: dict, costs: dict) -> dict:
    out = dict(cfg)
    out["costs"] = dict(cfg.get("costs", {}), **costs)
    return out


def fit_host_call_us(configs: Iterable[dict], measured_step_us: Iterable[float],
                     probe_us: float = 20.0) -> float:
    """Least-squares per-call host overhead from CPU-bound cases.

    ``configs`` are config mappings (their ``costs.host_call_us`` is ignored);
    ``measured_step_us`` the measured step times. Cases whose simulated step
    does not depend on the host cost (GPU-bound) get zero weight by
    construction: their slope is zero.
    """
    num = den = 0.0
    for cfg, measured in zip(configs, measured_step_us):
        s0 = simulate(cfg, {"costs.host_call_us": 0.0}).summary["step_us_mean"]
        s1 = simulate(cfg, {"costs.host_call_us": probe_us}).summary["step_us_mean"]
        slope = (s1 - s0) / probe_us
        num += slope * (measured - s0)
        den += slope * slope
    if den == 0:
        raise ValueError("no case depends on the host cost (all GPU-bound): nothing to fit")
    return max(0.0, num / den)


#: device time of the replay's one-element kernels (the write, the snapshot and D2H copies),
#: typical of a tiny kernel on a current GPU; the primitives give host costs only
TINY_KERNEL_US = 2.0


def loop_case_config(case: dict, primitives: dict, *, host_call_us: float = 0.0,
                     warmup_steps: int = 20, cross_stream_us: float = 3.0) -> dict:
    """A simwar config (mapping) reproducing one measured replay-loop case."""
    R, C, W, P, Q = (float(case[k]) for k in "RCWPQ")
    policy = case["policy"]
    if policy == "host":
        barrier, placement = "host_sync", "after_launch"
    else:
        barrier, placement = policy, "after_launch"
    if case["graph"]:
        read_ends = {"pre": "pre_replay", "in": "in_replay", "post": "post_replay"}[
            case["boundary"]]
        phases = [
            {"name": "forward", "graph": "full", "read_ends": read_ends, "prep_us": R,
             "body_us": C, "reads": ["req_to_token"]},
            # the static slot the graph read into is copied to the step's snapshot
            {"name": "snapshot", "graph": "eager", "body_us": TINY_KERNEL_US},
        ]
    else:
        # eager: spin R, read (a copy), record read_done, spin C: three launches and a record
        phases = [{"name": "spin", "graph": "eager", "body_us": R},
                  {"name": "forward", "graph": "eager", "read_ends": "pre_replay",
                   "load_batch_us": TINY_KERNEL_US, "body_us": C, "reads": ["req_to_token"]}]
    p = primitives
    return {
        "name": f"h200-{policy}-{'graph-' + case['boundary'] if case['graph'] else 'eager'}"
                f"-R{R:g}-C{C:g}-W{W:g}-P{P:g}-Q{Q:g}",
        "seed": 0,
        "steps": int(case.get("steps", 150)) + warmup_steps,
        "warmup_steps": warmup_steps,
        "algorithm": "custom",
        "phases": phases,
        "policy": {"barrier": barrier, "placement": placement},
        "cpu": {"ingest_us": 0, "schedule_us": P, "prepare_us": 0, "process_result_us": Q},
        "gpu": {"schedule_prep_us": W, "schedule_writes_us": TINY_KERNEL_US,
                "result_writes_us": 0, "result_copy_us": TINY_KERNEL_US,
                "result_copy_stream": "forward"},
        "costs": {
            "launch_us": p["launch_sleep_kernel_us"],
            "event_record_us": p["event_record_us"],
            "wait_event_us": p["stream_wait_event_us"],
            "wait_stream_us": p["stream_wait_stream_us"],
            "graph_launch_us": p["graph_replay_20k_host_us"],
            "sync_us": p["event_query_us"],
            "sync_wake_us": p["sync_overhead_after_200us_us"],
            "cross_stream_us": cross_stream_us,
            "host_call_us": host_call_us,
        },
        "accept": {"tokens": 1.0},
        "batch_size": 1,
    }


def host_speed_factor(case: dict, costs: dict) -> float:
    """The case's measured mean launch cost over the calibrated ``launch_us`` (1.0 if unknown)."""
    launch = case.get("host_costs", {}).get("launch_us", {})
    cal = costs.get("launch_us")
    if not launch.get("n") or not isinstance(cal, (int, float)) or cal <= 0:
        return 1.0
    return float(launch["mean"]) / float(cal)


def with_host_speed(cfg: dict, case: dict, costs: dict) -> dict:
    """``cfg`` with ``costs`` applied and its host API costs scaled by the case's host speed
    (:func:`simwar.fit.profiler.scale_host`, the calls only: the replay's CPU work is spins
    timed to their nominal duration; the device latencies are not host speed)."""
    return scale_host(_with_costs(cfg, costs), host_speed_factor(case, costs), work=False)


def error_table(configs: dict[str, dict], measured: dict[str, dict],
                metrics=METRICS) -> pd.DataFrame:
    """One row per (case, metric): simulated, measured, abs and relative error.

    ``configs``: case → config mapping (costs already calibrated);
    ``measured``: case → :func:`measured_summary` record. Each metric both summaries
    carry is compared by :func:`simwar.fit.compare.compare_figures`. A ``races`` row
    compares presence: 1 if the simulator observed an overlap (measured: a read saw
    another write's stamp), else 0. A case with per-step figures adds
    :func:`per_step_row`.
    """
    rows = []
    for name in sorted(set(configs) & set(measured)):
        result = simulate(configs[name])
        sim = result.summary
        meas = measured[name]["summary"]
        keys = [m for m in metrics if sim.get(m) is not None and meas.get(m) is not None]
        rows.extend(_table_row(name, c) for c in compare_figures(meas, sim, keys))
        if measured[name].get("steps"):
            rows.append(per_step_row(name, result.columns, measured[name]["steps"]))
        rows.append(_table_row(name, compare_figure(
            "races", float(measured[name]["measured_races"] > 0),
            float(sim.get("overlaps", 0) > 0))))
    return pd.DataFrame(rows, columns=["config", "metric", "simulated", "measured",
                                       "abs_error", "rel_error"])


def table_errors(error, relative, measured) -> tuple:
    """``(abs_error, rel_error)`` of the error table from a comparison's signed errors
    (floats, or per-step arrays): their magnitudes, and where the measured value is 0 (a
    relative error undefined) 0 when the two agree, else inf, so that :func:`criteria`'s
    maxima, which skip NaN, still see the mismatch."""
    err = np.abs(error)
    rel = np.where(measured != 0, np.abs(relative), np.where(err == 0, 0.0, np.inf))
    return err, rel


def _table_row(name: str, c: FigureComparison) -> dict:
    err, rel = table_errors(c.error, c.relative, c.measured)
    return {"config": name, "metric": c.key, "simulated": c.simulated, "measured": c.measured,
            "abs_error": float(err), "rel_error": float(rel)}


#: the per-step row of :func:`error_table`: medians over the steps both runs measured
PER_STEP = "step_us_per_step"


def per_step_errors(columns: dict, steps: dict, column: str = "step_us"):
    """Simulated and measured ``column`` of the steps both have, and the per-step errors:
    ``(sim, meas, abs_error, rel_error)`` as numpy arrays in step order."""
    sim_steps = np.asarray(columns["step"])
    meas_steps = np.asarray(steps["step"])
    common, i_sim, i_meas = np.intersect1d(sim_steps, meas_steps, return_indices=True)
    sim = np.asarray(columns[column], dtype=float)[i_sim]
    meas = np.asarray(steps[column], dtype=float)[i_meas]
    ok = ~(np.isnan(sim) | np.isnan(meas))
    sim, meas = sim[ok], meas[ok]
    error = sim - meas
    err, rel = table_errors(error, relative_error(error, meas), meas)
    return sim, meas, err, rel


def per_step_row(name: str, columns: dict, steps: dict) -> dict:
    """Row ``step_us_per_step``: the medians of the simulated and measured step times of the
    steps both measured, and the median of each step's own abs and relative error (not the
    error of the medians)."""
    sim, meas, err, rel = per_step_errors(columns, steps)
    if len(sim) == 0:
        nan = float("nan")
        return {"config": name, "metric": PER_STEP, "simulated": nan, "measured": nan,
                "abs_error": nan, "rel_error": nan}
    return {"config": name, "metric": PER_STEP, "simulated": float(np.median(sim)),
            "measured": float(np.median(meas)), "abs_error": float(np.median(err)),
            "rel_error": float(np.median(rel))}


def criteria(table: pd.DataFrame) -> dict:
    """The acceptance figures of the suite (issue 5) from an error table."""
    def rows(metric):
        return table[table.metric == metric]

    step = rows("step_us_mean")
    gap = rows("fwd_gap_us_mean")
    gap_ok = gap.abs_error <= (gap.measured.abs() * 0.10).clip(lower=25.0)
    ahead = rows("launch_ahead_mean")
    races = rows("races")
    out = {
        "cases": int(len(step)),
        "step_rel_error_median": float(step.rel_error.median()),
        "step_rel_error_max": float(step.rel_error.max()),
        "fwd_gap_within_bound": int(gap_ok.sum()),
        "fwd_gap_abs_error_max_us": float(gap.abs_error.max()),
        "launch_ahead_abs_error_max": float(ahead.abs_error.max()),
        "race_presence_mismatches": int((races.abs_error > 0).sum()),
        "racy_cases": int((races.measured > 0).sum()),
    }
    per_step = rows(PER_STEP)
    if len(per_step):  # cases whose steps differ: each case's median per-step error
        out["per_step_cases"] = int(len(per_step))
        out["per_step_rel_error_median_max"] = float(per_step.rel_error.max())
        out["per_step_rel_error_median_median"] = float(per_step.rel_error.median())
    return out


#: the targets of the workload cases (issue 12), as for the constant cases
WORKLOAD_TARGETS = {"step_rel_error_median": 0.03, "per_step_rel_error_median_max": 0.05,
                    "launch_ahead_abs_error_max": 0.15, "race_presence_mismatches": 0}


def workload_targets_met(c: dict) -> dict[str, bool]:
    """Each target of :data:`WORKLOAD_TARGETS` against :func:`criteria`'s figures."""
    return {k: c.get(k, float("inf")) <= limit for k, limit in WORKLOAD_TARGETS.items()}


def case_rows(table: pd.DataFrame) -> list[dict]:
    """Per case, the figures the calibration tables show: step time simulated and measured
    and its error, the median per-step error (cases with per-step figures), the forward gap,
    launch-ahead and race presence."""
    out = []
    for name, t in table.groupby("config", sort=True):
        m = t.set_index("metric")

        def get(metric, col, m=m):
            return float(m.at[metric, col]) if metric in m.index else float("nan")

        out.append({
            "case": name,
            "step_sim": get("step_us_mean", "simulated"),
            "step_meas": get("step_us_mean", "measured"),
            "step_err": get("step_us_mean", "rel_error"),
            "per_step_err": get(PER_STEP, "rel_error"),
            "gap_sim": get("fwd_gap_us_mean", "simulated"),
            "gap_meas": get("fwd_gap_us_mean", "measured"),
            "ahead_sim": get("launch_ahead_mean", "simulated"),
            "ahead_meas": get("launch_ahead_mean", "measured"),
            "races_sim": get("races", "simulated"),
            "races_meas": get("races", "measured"),
        })
    return out


def markdown_table(table: pd.DataFrame) -> str:
    """:func:`case_rows` as a Markdown table (the form ``calibration/README.md`` shows)."""
    def pct(x):
        return "–" if x != x else f"{100 * x:.2f}%"

    def us(x):
        return "–" if x != x else f"{x:.0f}"

    lines = ["| case | step sim | step meas | step err | per-step err (median) | gap sim | "
             "gap meas | ahead sim/meas | races sim/meas |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in case_rows(table):
        lines.append(f"| {r['case']} | {us(r['step_sim'])} | {us(r['step_meas'])} | "
                     f"{pct(r['step_err'])} | {pct(r['per_step_err'])} | {us(r['gap_sim'])} | "
                     f"{us(r['gap_meas'])} | {r['ahead_sim']:.2f}/{r['ahead_meas']:.2f} | "
                     f"{r['races_sim']:.0f}/{r['races_meas']:.0f} |")
    return "\n".join(lines) + "\n"

