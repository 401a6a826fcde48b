"""The profiler's own cost in a capture: the steps it stalled, and device time without it.

A capture is a profiled run, and the profiler is not free:

- **Kineto's stalls**: an ``overhead`` event (``Activity Buffer Request``, a few ms while
  CUPTI hands out a new activity buffer) holds the host thread wherever it falls, and the
  profiler's first step pays its start (lazy initialisation, the first buffers). A step that
  holds one is not the loop's own: :func:`profiler_steps` names them (the first step, and
  every step an ``overhead`` range overlaps), and the fit and the check leave them out, said
  in the fitted file's header and the check's first line. Left in, a loop whose host gap is a
  few µs fits a mean gap of tens of µs. :func:`left_out_steps` adds the steps in which the
  loop waited for requests (the mapping's ``idle`` ranges), which are not its own work either.
- **CUPTI's cost that remains**: under the profiler, kernels of CUDA graphs run a few percent
  longer (about 3-4 % measured on the project's H200, :data:`CUPTI_NOTE`), so a fit's device
  times are the profiled run's. :func:`rescale_to` turns them into a run's without the
  profiler when its step time is known from the server's own log (``--unprofiled-step-us``):
  every device duration is multiplied by one factor, found by simulating the fitted loop, so
  that the simulated mean step time is the one given. Use it on a device-bound loop (the
  device sets the step time; a host-bound loop's step time does not move with the device
  time, and is refused), for what-ifs about the un-profiled server; ``--check`` against the
  capture itself then misses by the factor, as it should.

Imports: numpy, the standard library and simwar (:func:`simwar.api.simulate`).
"""

from __future__ import annotations

import bisect
import copy
import math
import re

from simwar.api import simulate
from simwar.capture.sizes import step_bounds

#: what a fitted file says of the device times it keeps
CUPTI_NOTE = ("device times are the profiled run's: under CUPTI, kernels of CUDA graphs run "
              "about 3-4 % longer than without the profiler (the project's H200); "
              "--unprofiled-step-us rescales them to a step time measured without it")
#: the config's device durations (phases: every phase's, gpu: these)
GPU_KEYS = ("schedule_prep_us", "schedule_writes_us", "result_writes_us", "result_copy_us",
            "seq_lens_copy_us")
PHASE_KEYS = ("load_batch_us", "prep_us", "body_us")


class RescaleError(ValueError):
    """``--unprofiled-step-us`` cannot be met; one line."""


def profiler_steps(imp) -> dict[int, str]:
    """Steps of an imported capture the profiler stalled, each with why (see the module)."""
    bounds = step_bounds(imp.trace)
    if not bounds:
        return {}
    out = {0: "the profiler's first step"}
    for name, a, b in imp.overhead:
        for k, (s, e) in enumerate(bounds):
            if a < e and b > s:
                out.setdefault(k, f"a Kineto overhead event ({name}, {b - a:.0f} µs)")
    return dict(sorted(out.items()))


def left_out_steps(imp, mapping=None) -> dict[int, str]:
    """Steps that are not the loop's own, each with why: the profiler's
    (:func:`profiler_steps`) and, with a mapping that names ``idle`` ranges, the steps in
    which the loop waited for requests (the simulator's arrivals model that wait; a fit of
    the capture's batches replays no wait)."""
    out = profiler_steps(imp)
    rx = re.compile(mapping.idle) if mapping is not None and mapping.idle else None
    if rx is None:
        return out
    bounds = step_bounds(imp.trace)
    starts = [a for a, _ in bounds]
    for name, a, b in imp.annotations:
        if rx.search(name):
            k = bisect.bisect_right(starts, a) - 1
            if 0 <= k < len(bounds):
                out.setdefault(k, f"the loop waited for requests ({name}, {b - a:.0f} µs)")
    return dict(sorted(out.items()))


def left_out_line(left: dict[int, str], fitted: set[int] | None = None) -> str:
    """``3 steps the profiler stalled (...)``, or '' when none of them would have counted."""
    if not left:
        return ""
    shown = left if fitted is None else {k: v for k, v in left.items() if k in fitted}
    if not shown:
        return ""
    by: dict[str, list[int]] = {}
    for k, why in shown.items():
        by.setdefault(why.split(" (")[0], []).append(k)
    parts = [f"{why} in step{'s' if len(ks) > 1 else ''} "
             + ", ".join(map(str, ks[:6])) + (" ..." if len(ks) > 6 else "")
             for why, ks in by.items()]
    return f"{len(shown)} step{'s' if len(shown) > 1 else ''} left out, not the loop's own: " \
           + "; ".join(parts)


def _scale(value, f: float):
    """A duration times ``f``: a number, a distribution, an affine function (and its noise)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return round(float(value) * f, 3)
    if not isinstance(value, dict):
        return value
    d = dict(value)
    if "dist" in d:
        for key in ("mean", "std", "low", "high"):
            if d.get(key) is not None:
                d[key] = round(float(d[key]) * f, 3)
        if d.get("values") is not None:
            d["values"] = [round(float(v) * f, 3) for v in d["values"]]
        return d
    for key in ("base", "per_seq", "per_token"):
        if key in d:
            d[key] = round(float(d[key]) * f, 3)
    if d.get("noise") is not None:
        d["noise"] = _scale(d["noise"], f)
    return d


def scale_device(cfg: dict, f: float) -> dict:
    """A copy of a fitted config with every device duration multiplied by ``f``."""
    out = copy.deepcopy(cfg)
    for p in out.get("phases", []):
        for key in PHASE_KEYS:
            if key in p:
                p[key] = _scale(p[key], f)
    for key in GPU_KEYS:
        if key in out.get("gpu", {}):
            out["gpu"][key] = _scale(out["gpu"][key], f)
    return out


def rescale_to(cfg: dict, step_us: float, tol: float = 1e-3) -> tuple[dict, float, float]:
    """``(config, factor, simulated step µs)``: ``cfg`` with its device durations scaled so that
    its simulated mean step time is ``step_us`` (see the module docstring).

    Secant steps on the factor from 1; a loop whose step time does not follow its device time
    (host-bound) is a :class:`RescaleError`.
    """
    if not (step_us > 0 and math.isfinite(step_us)):
        raise RescaleError(f"--unprofiled-step-us: expected a step time in µs > 0, got {step_us}")

    def step_of(f: float) -> float:
        return float(simulate(scale_device(cfg, f)).summary["step_us_mean"])

    f0, s0 = 1.0, step_of(1.0)
    if abs(s0 - step_us) <= tol * step_us:
        return copy.deepcopy(cfg), 1.0, s0
    f1 = step_us / s0
    s1 = step_of(f1)
    for _ in range(8):
        if abs(s1 - step_us) <= tol * step_us:
            break
        if abs(s1 - s0) < 1e-9 * step_us:
            raise RescaleError(
                f"--unprofiled-step-us {step_us:g}: the fitted loop's step time ({s0:.1f} µs) "
                f"does not follow its device time (the host sets it): nothing to rescale")
        f0, s0, f1 = f1, s1, max(1e-3, f1 + (step_us - s1) * (f1 - f0) / (s1 - s0))
        s1 = step_of(f1)
    if abs(s1 - step_us) > 0.01 * step_us:
        raise RescaleError(f"--unprofiled-step-us {step_us:g}: scaling the device time reaches "
                           f"{s1:.1f} µs at best (the host sets the step time below that)")
    return scale_device(cfg, f1), f1, s1
