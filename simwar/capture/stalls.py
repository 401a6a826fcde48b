"""Stall figures of an imported capture: the step metrics plus HTA's idle breakdown.

The per-step table and summary are :func:`simwar.analysis.metrics.analyze`'s,
unchanged, so a measured capture and a simulated run are compared by the same
code. On top of it, the report carries :func:`simwar.analysis.idle.idle_breakdown`:
each stream's idle time between consecutive device ops, split by cause the way
Holistic Trace Analysis does (host-wait, kernel-wait, dependency, other), and
:func:`simwar.analysis.idle.temporal_breakdown`: HTA's idle / compute / non-compute
shares of the device span.

The report also says which thread is the scheduler (and why), which threads launched
device work, how the waits and syncs were bound (:mod:`simwar.capture.binding`), the
device events of kinds simwar does not model, and with several ranks each rank's
figures and the cross-rank skew of step starts.

Imports: numpy and pandas (through :mod:`simwar.analysis.metrics`); never the
simulator (api, executors, build).
"""

from __future__ import annotations

from simwar.analysis.idle import HTA_KERNEL_WAIT_US, idle_breakdown, temporal_breakdown
from simwar.analysis.metrics import analyze
from simwar.capture.to_trace import KinetoImport


def import_report(result: KinetoImport, kernel_wait_us: float = HTA_KERNEL_WAIT_US):
    """``(steps_df, report)``: the per-step frame and one JSON-ready dict for the capture."""
    trace = result.trace
    steps, summary, _ = analyze(trace)
    warm = int(trace.meta.get("warmup_steps", 0))
    counts = result.counts
    names = trace.meta.get("step_names") or []
    n_steps = len(names) if names else (int(steps.step.nunique()) if len(steps) else 0)
    report = {
        "file": trace.meta.get("file", ""),
        "forward_stream": trace.meta.get("forward_stream"),
        "steps": n_steps,
        "counts": {
            "kernels": counts.get("kernel", 0),
            "memcpys": counts.get("memcpy", 0),
            "memsets": counts.get("memset", 0),
            "sync_events": counts.get("cuda_sync", 0),
            "host_runtime_calls": counts.get("host_runtime_calls", 0),
            "runtime_calls": counts.get("runtime", 0),
            "annotations": counts.get("annotation", 0),
            "device_without_launch": counts.get("device_without_launch", 0),
            "device_before_launch": counts.get("device_before_launch", 0),
            "outside_steps": counts.get("outside_steps", 0),
            "records_unplaced": counts.get("records_unplaced", 0),
            "waits_unbound": counts.get("waits_unbound", 0),
            "syncs_unbound": counts.get("syncs_unbound", 0),
            "ignored_events": result.ignored_total,
        },
        "ignored": dict(sorted(result.ignored.items())),
        "metrics": summary,
        "idle": idle_breakdown(trace, kernel_wait_us, from_step=warm),
        "temporal": temporal_breakdown(trace, from_step=warm),
        "gpu_clock_offset_us": trace.meta.get("gpu_clock_offset_us", 0.0),
        "warnings": list(result.warnings),
        "threads": _threads(result),
        "binding": trace.meta.get("binding", {"rules": {}, "unbound": {}}),
        "unmodelled": dict(result.unmodelled),
    }
    if len(result.ranks) > 1:
        report["ranks"] = [_rank(r, warm) for r in result.ranks]
        report["skew"] = dict(result.skew)
    return steps, report


def _threads(result: KinetoImport) -> dict:
    if not result.ranks:
        return {}
    p = result.primary
    return {"scheduler": {"tid": p.host_thread[1] if p.host_thread else None,
                          "name": p.host_thread_name, "why": p.host_thread_reason},
            "launch": [{"name": n, "tid": tid, "launches": k} for n, tid, k in p.launch_threads]}


def _rank(r, warm: int) -> dict:
    """One rank's figures for the per-rank report."""
    _, summary, _ = analyze(r.trace)
    c = r.counts
    return {"rank": r.rank, "process": r.pid, "file": r.file,
            "clock_offset_us": r.clock_offset_us, "kernels": c.get("kernel", 0),
            "memcpys": c.get("memcpy", 0), "steps_measured": summary.get("steps_measured", 0),
            "step_us_mean": summary.get("step_us_mean"),
            "fwd_gap_us_mean": summary.get("fwd_gap_us_mean"),
            "forward_stream": r.trace.meta.get("forward_stream"),
            "scheduler": r.host_thread_name}
