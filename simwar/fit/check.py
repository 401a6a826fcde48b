"""Capture against simulation: the figures ``simwar import --check`` prints side by side.

:func:`check_rows` takes the capture's summary (:func:`simwar.capture.stalls.import_report`'s
``metrics``) and a simulation's summary (:func:`simwar.analysis.metrics.summarize`, the
same code) and returns one :class:`Row` per figure with its error. Three figures carry the
acceptance bounds a fitted config must meet on the capture it was fitted from
(:data:`ACCEPTANCE`): the mean step time within 2 %, the mean forward gap within
max(10 µs, 10 %) and the mean launch-ahead depth within 0.05. The others are shown with
their errors for reading, not judged.

A capture whose mapping names no ``run_batch`` annotation times each launch at the
forward's first launch call (the importer's rule); :func:`relaunch` re-times a
simulation's launch figures the same way, so that both sides are measured alike.

Imports: numpy, pandas (through :mod:`simwar.analysis.metrics`) and the standard library.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from simwar.analysis.metrics import launch_ahead_depth, measured, step_frame
from simwar.analysis.views import forward_kernels
from simwar.fit.compare import compare_figure, figure

#: (step time relative error, forward gap µs, forward gap relative error, launch-ahead)
ACCEPTANCE = {"step_rel": 0.02, "gap_us": 10.0, "gap_rel": 0.10, "ahead": 0.05}


class Row(NamedTuple):
    """One figure of ``simwar import --check``: the capture's, the simulation's, the error."""

    label: str
    key: str
    capture: float
    simulated: float
    error: float  # simulated - capture (relative for "rel" rows)
    kind: str  # rel | abs
    bound: float | None  # the acceptance bound on |error|, None: shown only
    ok: bool | None

    def error_text(self) -> str:
        if not (math.isfinite(self.error)):
            return "-"
        if self.kind == "rel":
            return _plain(f"{100 * self.error:+.2f}") + "%"
        if self.kind == "count":
            return _plain(f"{self.error:+.3f}")
        return _plain(f"{self.error:+.1f}") + " µs"

    def bound_text(self) -> str:
        if self.bound is None:
            return ""
        if self.kind == "rel":
            return f"{100 * self.bound:.0f}%"
        if self.kind == "count":
            return f"{self.bound:.2f}"
        return f"{self.bound:.1f} µs"


def _plain(text: str, signed: bool = True) -> str:
    """A number's text, never a negative zero (``+0.0`` where signed, else ``0.0``)."""
    if text.startswith("-") and not any(c in "123456789" for c in text):
        return ("+" if signed else "") + text[1:]
    return text


def check_rows(capture: dict, simulated: dict) -> list[Row]:
    """One row per figure (see the module docstring), acceptance rows first judged."""
    rows: list[Row] = []

    def rel(label, key, bound=None):
        c = compare_figure(key, figure(capture, key), figure(simulated, key))
        ok = None if bound is None else (math.isfinite(c.relative) and abs(c.relative) <= bound)
        rows.append(Row(label, key, c.measured, c.simulated, c.relative, "rel", bound, ok))

    def ab(label, key, bound=None, kind="abs"):
        c = compare_figure(key, figure(capture, key), figure(simulated, key))
        ok = None if bound is None else (math.isfinite(c.error) and abs(c.error) <= bound + 1e-9)
        rows.append(Row(label, key, c.measured, c.simulated, c.error, kind, bound, ok))

    rel("step time mean", "step_us_mean", ACCEPTANCE["step_rel"])
    rel("step time p50", "step_us_p50")
    rel("step time p99", "step_us_p99")
    ab("forward", "fwd_us_mean")
    gap = figure(capture, "fwd_gap_us_mean")
    ab("forward gap", "fwd_gap_us_mean",
       max(ACCEPTANCE["gap_us"], ACCEPTANCE["gap_rel"] * abs(gap)) if math.isfinite(gap)
       else ACCEPTANCE["gap_us"])
    ab("GPU idle", "gpu_idle_us_mean")
    ab("  on a dependency", "gpu_idle_dep_us_mean")
    ab("  on the host", "gpu_idle_host_us_mean")
    ab("CPU blocked", "cpu_blocked_us_mean")
    sites = sorted({k for d in (capture, simulated) for k in d
                    if k.startswith("cpu_blocked_") and k.endswith("_us_mean")
                    and k != "cpu_blocked_us_mean"
                    and (figure(capture, k) > 0 or figure(simulated, k) > 0)})
    for key in sites:
        ab(f"  {key[len('cpu_blocked_'):-len('_us_mean')]}", key)
    ab("launch lead", "launch_lead_us_mean")
    ab("launch-ahead", "launch_ahead_mean", ACCEPTANCE["ahead"], kind="count")
    ab("run-ahead fraction", "run_ahead_fraction", kind="count")
    return rows


def accepted(rows: list[Row]) -> bool:
    return all(r.ok for r in rows if r.ok is not None)


def format_rows(rows: list[Row], races: dict) -> str:
    def num(v: float, kind: str) -> str:
        if not math.isfinite(v):
            return "-"
        return _plain(f"{v:.3f}" if kind == "count" else f"{v:.1f}", signed=False)

    lines = [f"  {'':<22}{'capture':>12}{'simulated':>12}{'error':>12}  {'bound':<9}"]
    for r in rows:
        unit = "" if r.kind == "count" else " µs"
        verdict = "" if r.ok is None else ("ok" if r.ok else "MISS")
        lines.append(f"  {r.label + unit:<22}{num(r.capture, r.kind):>12}"
                     f"{num(r.simulated, r.kind):>12}{r.error_text():>12}  "
                     f"{r.bound_text():<9}{verdict}".rstrip())
    lines.append(f"  {'races':<22}{'-':>12}{races.get('latent', 0):>12}  latent "
                 f"(simulated; {races.get('overlaps', 0)} observed overlaps; a capture "
                 f"shows no reads)")
    return "\n".join(lines)


def relaunch(trace, summary: dict) -> dict:
    """``summary`` with the launch figures re-timed at each forward's first launch call.

    The builder marks ``run_batch`` before the forward's stream wait and first phase's
    dispatch; a capture without a ``run_batch`` annotation can only time the first forward
    launch. Launch lead, run-ahead fraction and launch-ahead depth are recomputed on the
    measured steps with that launch time.
    """
    df = step_frame(trace)
    if "step_us" not in df.columns:
        return summary
    ops, spans = trace.ops, trace.spans
    fk = forward_kernels(trace)
    fk = fk[ops.call[fk] >= 0]
    first: dict[int, float] = {}
    for k, t in zip(ops.step[fk].tolist(), spans.start_us[ops.call[fk]].tolist()):
        first[k] = min(first.get(k, t), t)
    launch = np.array([first.get(k, np.nan) for k in df.step.tolist()])
    end = df.fwd_end_us.to_numpy()
    df["launch_lead_us"] = end - np.append(launch[1:], np.nan)
    df["launch_ahead"] = launch_ahead_depth(end, launch)
    m = measured(df, int(trace.meta.get("warmup_steps", 0)))
    lead, ahead = m.launch_lead_us.dropna(), m.launch_ahead.dropna()
    out = dict(summary)
    out.update({"launch_lead_us_mean": float(lead.mean()) if len(lead) else float("nan"),
                "run_ahead_fraction": float((lead > 0).mean()) if len(lead) else float("nan"),
                "launch_ahead_mean": float(ahead.mean()) if len(ahead) else float("nan")})
    return out
