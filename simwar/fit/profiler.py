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
- **The cost that remains**: under the profiler, kernels of CUDA graphs run a few percent
  longer (about 3-4 % measured on the project's H200, :data:`CUPTI_NOTE`), and the host too
  is slower (every range and API call pays CUPTI's callbacks: the mini-server's host-bound
  steps ran about 12 % slower profiled than timed), so a fit's times are the profiled run's.
  :func:`rescale_to` turns them into a run's without the profiler when its step time is known
  from the server's own log (``--unprofiled-step-us``), by simulating the fitted loop:

  - one mean step time: every device duration times one factor, so that the simulated mean
    step time is the one given. For a device-bound loop (a host-bound loop's step time does
    not move with its device time, and is refused);
  - the mean step time per graph bucket (``8=1682,16=1726,...``): every device duration
    times one factor and every host duration (CPU work, host API costs) times another, the
    two fitted by least squares on the buckets' relative errors: host-bound buckets set the
    host's factor, device-bound ones the device's. For a loop whose batch changes.

  Use it for what-ifs about the un-profiled server; ``--check`` against the capture itself
  then misses by the factors, as it should.

Imports: numpy, the standard library and simwar (:func:`simwar.api.simulate`).
"""

from __future__ import annotations

import bisect
import copy
import math
import re

import numpy as np

from simwar.api import simulate
from simwar.capture.sizes import step_bounds
from simwar.config.load import get_dotted, set_dotted

#: what a fitted file says of the device times it keeps
CUPTI_NOTE = ("device times are the profiled run's: under CUPTI, kernels of CUDA graphs run "
              "about 3-4 % longer than without the profiler (the project's H200); "
              "--unprofiled-step-us rescales them to a step time measured without it")
#: the config's device durations (phases: every phase's, gpu: these)
GPU_KEYS = ("schedule_prep_us", "schedule_writes_us", "result_writes_us", "result_copy_us",
            "seq_lens_copy_us")
PHASE_KEYS = ("load_batch_us", "prep_us", "body_us")
#: the config's host durations: CPU work, each phase's host time, the host API costs (not the
#: device-side latencies, sync_wake_us and cross_stream_us)
CPU_KEYS = ("ingest_us", "schedule_us", "prepare_us", "process_result_us", "post_launch_us")
HOST_COSTS = ("launch_us", "event_record_us", "wait_event_us", "wait_stream_us",
              "graph_launch_us", "sync_us", "host_call_us")


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
    """A duration times ``f``: a number, a distribution, an affine function or a per-bucket
    table (and its noise)."""
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
    for key in ("base", "per_seq", "per_request"):
        if key in d:
            d[key] = round(float(d[key]) * f, 3)
    for key in ("per_token", "per_token_prefix", "per_prompt_token"):  # small coefficients:
        if key in d:  # significant digits
            d[key] = float(f"{float(d[key]) * f:.6g}")
    if d.get("per_bucket") is not None:
        d["per_bucket"] = {b: round(float(v) * f, 3) for b, v in d["per_bucket"].items()}
    if d.get("noise") is not None:
        d["noise"] = _scale(d["noise"], f)
    return d


def scale_device(cfg: dict, f: float, host: float = 1.0) -> dict:
    """A copy of a fitted config with every device duration multiplied by ``f`` (and every
    host duration by ``host``, :func:`scale_host`): the decode phases', the loop's and its
    costs', and those of the prefill and the idle step a capture with shapes gets."""
    out = copy.deepcopy(cfg)  # one copy: the host's scaled in it
    for p in out.get("phases", []):
        for key in PHASE_KEYS:
            if key in p:
                p[key] = _scale(p[key], f)
    for key in GPU_KEYS:
        if key in out.get("gpu", {}):
            out["gpu"][key] = _scale(out["gpu"][key], f)
    # the other shapes' forwards (a fitted prefill, an idle step)
    for sec in (out.get("prefill"), (out.get("scheduling") or {}).get("idle")):
        if sec and "forward_us" in sec:
            sec["forward_us"] = _scale(sec["forward_us"], f)
    _scale_host(out, host)
    return out


def host_keys(cfg: dict, work: bool = True) -> list[str]:
    """The dotted keys (:func:`simwar.config.load.get_dotted`'s) of the host durations a
    config holds, fitted or a loaded config's dump (a key whose value is None is not held):
    the host API calls' costs (:data:`HOST_COSTS`, not the device latencies ``sync_wake_us``
    and ``cross_stream_us``) and, with ``work``, the loop's CPU work (:data:`CPU_KEYS`, and
    ``cpu.receive_us`` where it costs anything), each
    phase's host time (``phases.NAME.host_us``) and the prefill's and the idle step's
    (``host_us``, ``host_before_us``; an eager prefill's launches cost ``costs.launch_us``
    each). The one list of what runs on the host: :func:`scale_host` scales it, the check adds
    the profiler's cost back to it (:func:`simwar.fit.check.profiler_back`)."""
    costs = [f"costs.{k}" for k in HOST_COSTS if (cfg.get("costs") or {}).get(k) is not None]
    if not work:
        return costs
    out = [f"cpu.{k}" for k in CPU_KEYS if (cfg.get("cpu") or {}).get(k) is not None]
    receive = (cfg.get("cpu") or {}).get("receive_us")
    if isinstance(receive, dict) and any(receive.values()):  # given: per request received
        out.append("cpu.receive_us")
    out += [f"phases.{p['name']}.host_us" for p in cfg.get("phases") or []
            if p.get("host_us") is not None]
    out += costs
    for where, sec in (("prefill", cfg.get("prefill")),
                       ("scheduling.idle", (cfg.get("scheduling") or {}).get("idle"))):
        out += [f"{where}.{k}" for k in ("host_us", "host_before_us")
                if sec and sec.get(k) is not None]
    return out


def scale_host(cfg: dict, f: float, work: bool = True, keep=()) -> dict:
    """A copy of a config with every host duration (:func:`host_keys`) multiplied by ``f``,
    nothing on the device touched. One rule for a host that ran at another speed than the one
    the config describes, faster (``f`` < 1) or slower: ``--unprofiled-step-us`` per bucket, a
    timed run's measured host speed (``simwar compare --host-speed measured``, the lab's
    checkers). ``work`` False: the calls only (a replay's CPU work is spins timed to their
    nominal duration, whatever the host's speed); ``keep``: dotted keys left as they are (work
    the server pads to a time target, e.g. ``cpu.schedule_us``). ``f`` 1: an exact copy."""
    out = copy.deepcopy(cfg)
    _scale_host(out, f, work, keep)
    return out


def _scale_host(cfg: dict, f: float, work: bool = True, keep=()) -> None:
    """:func:`scale_host` in place."""
    if f == 1.0:
        return
    for key in host_keys(cfg, work):
        if key not in keep:
            set_dotted(cfg, key, _scale(get_dotted(cfg, key), f))


def parse_unprofiled(text: str) -> float | dict[int, float]:
    """``--unprofiled-step-us``'s value: ``US`` or ``BUCKET=US,...``; ValueError, one line."""
    text = str(text).strip()
    try:
        if "=" not in text:
            v = float(text)
            if not (v > 0 and math.isfinite(v)):
                raise ValueError
            return v
        out = {}
        for item in text.split(","):
            b, _, us = item.partition("=")
            out[int(b)] = float(us)
            if not (out[int(b)] > 0 and math.isfinite(out[int(b)]) and int(b) > 0):
                raise ValueError
        return dict(sorted(out.items()))
    except ValueError:
        raise ValueError(f"--unprofiled-step-us: expected a step time in µs > 0, or BUCKET=US "
                         f"per graph bucket (8=1682,16=1726), got {text!r}") from None


def rescale_buckets(cfg: dict, per_bucket: dict[int, float], iterations: int = 8,
                    tol: float = 1e-3) -> tuple[dict, float, float, dict]:
    """``(config, device factor, host factor, per bucket (simulated, target) µs)``: ``cfg``
    with device and host durations scaled so that each graph bucket's simulated mean step
    time is the target's, the two factors fitted by least squares (Gauss-Newton on the
    buckets' relative errors, weighted by the buckets' steps; see the module docstring)."""
    if not (cfg.get("workload") or {}).get("graph_buckets"):
        raise RescaleError("--unprofiled-step-us BUCKET=US: the fitted loop has no graph "
                           "buckets (its batch does not change): give one step time")

    def errors(d: float, h: float):
        by = simulate(scale_device(cfg, d, h)).summary.get("by_bucket") or {}
        common = [b for b in per_bucket if b in by and by[b]["steps"] > 0]
        if not common:
            raise RescaleError(f"--unprofiled-step-us: none of buckets "
                               f"{', '.join(map(str, per_bucket))} ran in the fitted loop "
                               f"({', '.join(map(str, by))})")
        w = np.sqrt([by[b]["steps"] for b in common])
        r = np.array([by[b]["step_us_mean"] / per_bucket[b] - 1 for b in common])
        return r * w, {b: (by[b]["step_us_mean"], per_bucket[b]) for b in common}

    x = np.array([1.0, 1.0])
    r, per = errors(*x)
    for _ in range(iterations):
        if np.max(np.abs([s / t - 1 for s, t in per.values()])) <= tol:
            break
        jac = np.empty((len(r), 2))
        for i in range(2):
            dx = x.copy()
            dx[i] *= 1.02
            jac[:, i] = (errors(*dx)[0] - r) / (dx[i] - x[i])
        step, *_ = np.linalg.lstsq(jac, -r, rcond=None)
        new = np.clip(x + step, 0.2, 5.0)
        r_new, per_new = errors(*new)
        if float(r_new @ r_new) >= float(r @ r):
            break
        x, r, per = new, r_new, per_new
    return scale_device(cfg, float(x[0]), float(x[1])), float(x[0]), float(x[1]), per


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
