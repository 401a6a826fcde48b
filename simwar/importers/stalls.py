"""Stall figures of an imported capture: the step metrics plus HTA's idle breakdown.

The per-step table and summary are :func:`simwar.analysis.metrics.analyze`'s, unchanged,
so a measured capture and a simulated run are compared by the same code. On
top of it, :func:`idle_breakdown` splits each stream's idle time between
consecutive device ops the way Holistic Trace Analysis does:

- ``host_wait``: the next op was issued (its host call returned) after the
  previous op ended: the host was not feeding the stream fast enough;
- ``kernel_wait``: the gap is shorter than ``kernel_wait_us`` (HTA's
  ``consecutive_kernel_delay``, 30 ns): back-to-back launch overhead;
- ``dependency``: part of the remaining gap during which the stream was held
  by a cross-stream wait (an inferred ``wait`` span); HTA files this under
  "other", simwar's metrics call it kernel-wait/dependency idle;
- ``other``: the rest.

Imports: numpy and pandas (through :mod:`simwar.analysis.metrics`).
"""

from __future__ import annotations

import bisect
from collections import defaultdict

from ..analysis.metrics import analyze
from ..trace import HOST, Trace
from .kineto import KinetoImport

#: HTA's default consecutive_kernel_delay (30 ns)
HTA_KERNEL_WAIT_US = 0.03


def idle_breakdown(trace: Trace, kernel_wait_us: float = HTA_KERNEL_WAIT_US,
                   from_step: int = 0) -> dict[str, dict[str, float]]:
    """Per stream lane: busy and idle µs between its device ops, idle split by cause."""
    ops: dict[str, list] = defaultdict(list)
    for op in trace.ops:
        if op.kind == "kernel" and op.lane != HOST and op.step >= from_step:
            ops[op.lane].append(op)
    waits: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for s in trace.spans:
        if s.kind == "wait":
            waits[s.lane].append((s.start_us, s.end_us))
    out: dict[str, dict[str, float]] = {}
    for lane in sorted(ops):
        seq = sorted(ops[lane], key=lambda o: (o.start_us, o.end_us))
        held = sorted(waits.get(lane, []))
        held_starts = [a for a, _ in held]
        row = {"busy_us": 0.0, "idle_us": 0.0, "host_wait_us": 0.0, "kernel_wait_us": 0.0,
               "dependency_us": 0.0, "other_us": 0.0}
        tail = None
        for op in seq:
            if tail is not None and op.start_us > tail:
                gap = op.start_us - tail
                row["idle_us"] += gap
                if op.issue_us > tail:
                    row["host_wait_us"] += gap
                elif gap < kernel_wait_us:
                    row["kernel_wait_us"] += gap
                else:
                    dep = min(gap, _covered(held, held_starts, tail, op.start_us))
                    row["dependency_us"] += dep
                    row["other_us"] += gap - dep
            row["busy_us"] += max(0.0, op.end_us - max(op.start_us, tail or op.start_us))
            tail = op.end_us if tail is None else max(tail, op.end_us)
        out[lane] = row
    return out


def _covered(spans: list[tuple[float, float]], starts: list[float], lo: float,
             hi: float) -> float:
    """Length of [lo, hi) covered by ``spans`` (sorted, non-overlapping on one lane)."""
    total = 0.0
    i = max(0, bisect.bisect_right(starts, lo) - 1)
    while i < len(spans) and spans[i][0] < hi:
        a, b = spans[i]
        total += max(0.0, min(b, hi) - max(a, lo))
        i += 1
    return total


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
        "gpu_clock_offset_us": trace.meta.get("gpu_clock_offset_us", 0.0),
        "warnings": list(result.warnings),
    }
    return steps, report
