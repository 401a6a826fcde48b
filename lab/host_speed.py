"""Each repeat at its own host speed: the one rule of the mini-server's checkers.

The GPU machine's host runs at speeds 0.4-2x apart between runs of one session, so a model
fitted from one capture is predicted at each repeat's measured host speed, read from the
repeat's own host stamps (an input about the machine, not an outcome) and applied by
simwar's one rule for a host at another speed, :func:`simwar.fit.profiler.scale_host`
(:func:`host_at`). Two factors per repeat:

- **the decode steps'**: the repeat's unpadded host work (prepare, launch, barrier:
  :func:`lab.check.host_speed`) on its steps that prefill nothing, over the host work the
  model describes at the same batches (:mod:`lab.shapes_check`: its capture's, less the
  profiler's cost in each step, :func:`net_unpadded`; :mod:`lab.prefill_check`: the
  un-profiled sweep's its fit is rescaled to). Every host duration of the model is multiplied
  by it but for the work the mini-server pads to a time target (:data:`PADDED`) and the
  prefill's (:data:`PREFILL_HOST`);
- **the steps' that prefill**: the same unpadded work on the repeat's steps with a chunk over
  the line in tokens the model's prefill describes (:func:`prefill_line`,
  :func:`prefill_speed`); the prefill's host keys and the receive are multiplied by it, or
  each by that ratio on the stretch of the stamps that times it (:func:`prefill_part_speeds`,
  the shapes checker's: its preparation, its launches; the receive at the preparation's).

And the loop's own turn, a result processed to the next iteration's start
(:func:`loop_tail`), the repeat's as its stamps show it in place of the profiled capture's.

Here too are the readers both checkers place a capture's host ranges with: its step ranges
(:class:`CaptureSteps`, the import's) and the profiler's own cost in a range
(:func:`profiler_cost_of`). Runs where simulation runs (simwar's full stack).
"""

from __future__ import annotations

import gzip
import json
import math
from pathlib import Path

import numpy as np

from lab import check
from simwar.capture.open import open_capture
from simwar.capture.sizes import step_bounds
from simwar.fit.profiler import host_keys, scale_host
from simwar.fit.profiler_cost import for_capture

#: the host work a repeat's measured speed does not move, kept as captured: what the
#: mini-server pads to a time target (lab.server: its ``schedule`` and ``process`` ranges)
PADDED = ("cpu.ingest_us", "cpu.schedule_us", "cpu.process_result_us")
#: the host work of a step that prefills, at the repeat's host speed on such steps
#: (:func:`prefill_speed`), not the decode steps': the prefill's preparation before its first
#: launch (``prefill.host_before_us``) and its launch window (``prefill.host_us``). The data
#: keep the two speeds apart: on the shapes suite's first run the repeats' decode steps ran
#: x0.69-2.08 of the capture's host work and their prefill steps x0.96-1.41 (the closed loop
#: x1.97-2.03 and x1.30-1.35: a prefill launched over 2.8 ms where the decode speed made it
#: 4.2 ms; the light load x0.69-0.87 and x1.26), and the twins show the prefill's prepare and
#: launch apart from the decode steps' (x0.53-1.64 profiled over un-profiled where the decode
#: launch ran x1.13-3.81). The receive (``cpu.receive_us``, fitted where the capture names it)
#: is with them: a request is admitted with its first chunk, most often in the step that
#: receives it, and before the receive was fitted its work was in ``prefill.host_before_us``.
#: At the decode steps' speed the tenth run's ``sglang`` closed loops (x2.0-4.7) charged it up
#: to 4.7 times over: TTFT to the forward's end +7.9 and +20.3 %, at the prefill's +0.6 and
#: +13.4 %
PREFILL_HOST = ("prefill.host_us", "prefill.host_before_us", "cpu.receive_us")
#: the stretch of a step's host stamps that times each of :data:`PREFILL_HOST`
#: (:func:`prefill_part_speeds`): the preparation before the prefill's launches is the server's
#: ``prepare_for_decode`` (``t_batch_us`` to ``t_scheduled_us``: its slot writes and inputs),
#: the launch window its ``run_batch`` and barrier (``t_scheduled_us`` to ``t_barrier_us``).
#: The data keep them apart: on the ninth run the repeats' steps that prefill ran their
#: preparation at x0.72-0.95 (``mixed``) and x0.58-0.69 (``sglang``) of the capture's (as
#: stamped) and their launches at x0.43-0.70 and x0.36-0.50 (the profiler lengthens each eager
#: launch, not the Python before them), so one factor over both (:func:`prefill_speed`, the
#: launches' mostly) made a mixed step's preparation 430-640 µs short in the medium load's
#: normal loop (calibration/README.md, "The ninth run's misses")
PREFILL_SPANS = {"prefill.host_before_us": ("t_batch_us", "t_scheduled_us"),
                 "prefill.host_us": ("t_scheduled_us", "t_barrier_us")}
#: a prefill host key no stamps time apart, and the key whose speed it takes: the receive is
#: Python over the prompt, as the preparation is, and the stamps hold no stretch of its own
#: (its range is in the capture only)
SPEED_OF = {"cpu.receive_us": "prefill.host_before_us"}
#: the whole unpadded span (prepare, launch, barrier: :func:`lab.check._unpadded`'s)
UNPADDED = ("t_batch_us", "t_barrier_us")


class CaptureSteps:
    """A capture's steps as its import numbers them (the Trace's step markers,
    :func:`simwar.capture.sizes.step_bounds`: step ``k`` from its start to the next one's),
    placed on the file's own clock by the import's origin
    (:attr:`~simwar.capture.imported.KinetoImport.origin_us`): the one reader of a capture's
    steps of the lab's checkers, whose raw ranges (``ts``) :meth:`at` puts in their steps."""

    def __init__(self, bounds: list[tuple[float, float]], origin_us: float):
        self.starts = np.array([a for a, _ in bounds], dtype=float)
        self.ends = np.array([b for _, b in bounds], dtype=float)
        self.origin_us = float(origin_us)

    @classmethod
    def of(cls, cap) -> CaptureSteps:
        """The steps of an opened capture (:func:`simwar.capture.open.open_capture`)."""
        return cls(step_bounds(cap.trace), cap.bound.origin_us)

    def at(self, ts: float) -> int | None:
        """The step holding the capture time ``ts`` (the file's ``ts``, µs), by one search of
        the sorted starts; None: before the first step or at/after the last one's end."""
        t = ts - self.origin_us  # as the import put the file's times on the trace's clock
        k = int(np.searchsorted(self.starts, t, side="right")) - 1
        return k if k >= 0 and t < self.ends[k] else None


def open_steps(capture: Path):
    """``(cap, steps)``: the capture opened with the mini-server's preset and its
    :class:`CaptureSteps`."""
    cap = open_capture(capture, preset="sglang")
    return cap, CaptureSteps.of(cap)


def profiler_cost_of(cap):
    """``less(ts, dur)``: a host range of the opened capture ``cap`` (at its file's ``ts``)
    less the profiler's own cost in it, by the capture's event counts
    (:mod:`simwar.fit.profiler_cost`), never below zero. The file's clock is the import's
    less its origin (:attr:`~simwar.capture.imported.KinetoImport.origin_us`)."""
    prof = for_capture(cap.bound)
    shift = cap.bound.origin_us
    return lambda ts, dur: prof.less(dur, ts - shift, ts - shift + dur)


def prefill_unpadded(metrics: dict, span: tuple[str, str] = UNPADDED
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Per measured step that prefills (a prefill step of its own or a mixed step):
    ``(prompt tokens, host work the server does not pad)``, :func:`lab.check._unpadded`'s
    span (prepare, launch, barrier; ``span``: a stretch of it, two stamps) on the steps
    :func:`lab.check._unpadded` leaves out with ``decode_only``, as stamped."""
    st = metrics["steps"]
    steps = check.measured_steps(metrics)
    tokens = np.asarray(st["prefill_tokens"], dtype=float)[steps]
    work = (np.asarray(st[span[1]], dtype=float)
            - np.asarray(st[span[0]], dtype=float))[steps]
    ok = (tokens > 0) & np.isfinite(work)
    return tokens[ok], work[ok]


def net_unpadded(capture: Path, metrics: dict, keep_profiler_cost: bool = False,
                 prefill: bool = False, span: tuple[str, str] = UNPADDED
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The profiled run's :func:`lab.check._unpadded` host work on its steps that prefill
    nothing, against their batch (``prefill``: on its steps that prefill, against their
    tokens), less the profiler's own cost in each (the capture's events in the step's host
    window, :func:`profiler_cost_of`), as a fit takes it out of the model's host times: the
    host speed the model describes. The metrics' host stamps are put on the capture's clock
    by each step's ``scheduler.prepare_for_decode`` range (it starts at the step's
    ``t_batch_us``; the median offset). ``keep_profiler_cost``: as stamped. ``span``: a
    stretch of that work (two stamps, :data:`PREFILL_SPANS`)."""
    st = metrics["steps"]
    steps = check.measured_steps(metrics)
    size = np.asarray(st["prefill_tokens" if prefill else "batch"], dtype=float)
    tokens = np.asarray(st["prefill_tokens"], dtype=float)
    a = np.asarray(st[span[0]], dtype=float)
    b = np.asarray(st[span[1]], dtype=float)
    keep = [k for k in range(steps.start, steps.stop) if size[k] > 0
            and (tokens[k] > 0) == prefill and np.isfinite(b[k] - a[k])]
    if keep_profiler_cost:
        return size[keep], (b - a)[keep]
    events = json.loads(gzip.decompress(capture.read_bytes()))["traceEvents"]
    cap, steps = open_steps(capture)
    offsets = []
    for e in events:
        if e.get("cat") == "user_annotation" and e.get("name") == "scheduler.prepare_for_decode":
            k = steps.at(e["ts"])
            if k is not None and k < len(a):  # the range opens at the step's t_batch_us
                offsets.append(float(e["ts"]) - float(st["t_batch_us"][k]))
    if not offsets:
        raise check.ServerDataError(f"{capture}: no scheduler.prepare_for_decode range to "
                                    f"tie the host stamps to the capture's clock")
    shift = float(np.median(offsets))
    less = profiler_cost_of(cap)
    return size[keep], np.array([less(a[k] + shift, b[k] - a[k]) for k in keep])


def prefill_line(capture: Path, metrics: dict, net: bool = False,
                 scale: float = 1.0, span: tuple[str, str] = UNPADDED) -> tuple[float, float]:
    """``(a, b)``: the capture's host work on its steps that prefill as ``a + b x tokens``,
    least squares, times ``scale``: the host speed the model's prefill describes. As stamped
    where the model keeps the profiler's cost in the prefill's host time (the shapes fit's
    eager prefill: :data:`simwar.fit.shapes.EAGER_PREFILL_LESS_PROFILER`); ``net``: less the
    profiler's cost in each step (:func:`net_unpadded`), where the model takes it out (the
    prefill checker's, whose prefill is also x the sweep's host factor: ``scale``).
    ``span``: a stretch of that work (:data:`PREFILL_SPANS`)."""
    x, y = net_unpadded(capture, metrics, keep_profiler_cost=not net, prefill=True, span=span)
    if len(x) < 3 or np.ptp(x) == 0:
        raise check.ServerDataError(f"{capture}: fewer than 3 steps that prefill, or all of "
                                    f"one size (the prefill's host speed needs a line)")
    base, slope = check.rising_line(x, y)
    return base * scale, slope * scale


def prefill_speed(metrics: dict, line: tuple[float, float],
                  span: tuple[str, str] = UNPADDED) -> float:
    """How much slower a repeat's host ran its steps that prefill than the model's (NaN:
    none): its :func:`prefill_unpadded` work over :func:`prefill_line` at the same tokens, as
    :func:`lab.check.host_speed` takes the decode steps' at the same batches (``span``: of
    one stretch of that work, the line being the same stretch's)."""
    x, y = prefill_unpadded(metrics, span)
    if not len(x):
        return math.nan
    return float(y.sum() / (line[0] + line[1] * x).sum())


def prefill_lines(capture: Path, metrics: dict) -> dict[str, tuple[float, float]]:
    """Per key of :data:`PREFILL_SPANS`, the capture's :func:`prefill_line` of the stretch
    that times it (as stamped, as :func:`prefill_line` takes the shapes fit's)."""
    return {key: prefill_line(capture, metrics, span=span) for key, span in PREFILL_SPANS.items()}


def prefill_part_speeds(metrics: dict, lines: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Per prefill host key, the repeat's :func:`prefill_speed` on the stretch that times it
    (``lines``: :func:`prefill_lines`): what :func:`host_at` multiplies each key by."""
    out = {key: prefill_speed(metrics, lines[key], PREFILL_SPANS[key]) for key in lines}
    return out | {key: out[of] for key, of in SPEED_OF.items() if of in out}


def loop_tail(metrics: dict) -> float:
    """A run's mean host time from a result processed (``proc_end_us``) to the start of the
    iteration after the one that processed it (``t_begin_us``), over its measured steps (NaN:
    none): the loop's own turn, outside every stretch the server stamps or pads. A fit puts
    it in ``cpu.process_result_us`` (the region from the result's sync to the step's end),
    which the speed keeps as captured (:data:`PADDED`); a profiled run's turn holds the
    profiler's bookkeeping of each step, which its event counts do not take out: 72 and 87
    µs on the ninth run's captures against 12-30 µs on their repeats (calibration/README.md,
    "The ninth run's misses")."""
    st = metrics["steps"]
    steps = check.measured_steps(metrics)
    it = np.asarray(st["processed_in"], dtype=np.int64)
    end = np.asarray(st["proc_end_us"], dtype=float)
    begin = np.asarray(st["t_begin_us"], dtype=float)
    gaps = [begin[it[k] + 1] - end[k] for k in range(steps.start, steps.stop)
            if 0 <= it[k] < len(begin) - 1]
    gaps = [g for g in gaps if math.isfinite(g)]
    return float(np.mean(gaps)) if gaps else math.nan


def _shift(node, d: float):
    """A duration ``node`` (a number, a line's ``base``, a distribution's ``mean`` or
    ``values``) moved by ``d`` µs, never below zero."""
    if isinstance(node, dict):
        out = dict(node)
        if "base" in out:
            out["base"] = max(0.0, out["base"] + d)
        elif "values" in out:
            out["values"] = [max(0.0, v + d) for v in out["values"]]
        elif "mean" in out:
            out["mean"] = max(0.0, out["mean"] + d)
        return out
    return max(0.0, float(node) + d)


def clamp_lines(node, where: str = "") -> list[str]:
    """CLAMPED: every ``{base, per_seq}`` line of ``node`` that goes below zero at a batch up
    to the admission cap is bent to reach zero there, in place; returns the keys it changed.
    A fit clamps its lines over the batches its own workload runs (the shapes capture's, up
    to 16), not the 64 a what-if asks for (the mixed capture's ``costs.launch_us`` goes below
    zero at 19)."""
    out = []
    if isinstance(node, dict):
        if "base" in node and "per_seq" in node:
            top = node["base"] + node["per_seq"] * check.MAX_BATCH
            if node["base"] >= 0 > top:
                node["per_seq"] = -node["base"] / check.MAX_BATCH
                out.append(where)
        for k, v in node.items():
            out += clamp_lines(v, f"{where}.{k}" if where else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += clamp_lines(v, f"{where}[{i}]")
    return out


def host_at(config: dict, speed: float, prefill: float | dict = math.nan,
            tail: float = 0.0) -> dict:
    """``config`` with its host durations at a repeat's measured host speeds
    (:func:`simwar.fit.profiler.scale_host`; NaN, unknown: as captured): the prefill's
    (:data:`PREFILL_HOST`) at ``prefill``, the speed of the repeat's steps that prefill
    (:func:`prefill_speed`; a mapping: each key at its own, :func:`prefill_part_speeds`), the
    others at ``speed``, the decode steps' (but :data:`PADDED`); its lines clamped again
    (:func:`clamp_lines`: a line bent to reach zero at the cap, scaled and rounded, may end a
    rounding below it). ``tail``: µs the repeat's loop turn took beyond the capture's
    (:func:`loop_tail`, the repeat's less the capture's; NaN: none), added to
    ``cpu.process_result_us`` where the fit put the capture's."""
    def known(v: float) -> float:
        return v if math.isfinite(v) else 1.0

    out = scale_host(config, known(speed), keep=PADDED + PREFILL_HOST)
    each = prefill if isinstance(prefill, dict) else dict.fromkeys(PREFILL_HOST, prefill)
    for key in PREFILL_HOST:
        out = scale_host(out, known(each.get(key, math.nan)),
                         keep=[k for k in host_keys(out) if k != key])
    cpu = out.get("cpu") or {}
    if tail and math.isfinite(tail) and "process_result_us" in cpu:
        cpu["process_result_us"] = _shift(cpu["process_result_us"], tail)
    clamp_lines(out)
    return out
