"""The host's work of receiving requests, fitted from the ranges a capture names it in.

A capture whose server names the work of receiving each iteration's requests in a range (the
mapping's ``receive`` pattern, :class:`simwar.capture.mapping.Mapping`: its groups the
range's requests and their prompt tokens; SGLang's preset reads the mini-server's ``recv
reqs=N toks=T``) gives the fit ``cpu.receive_us`` (``{per_request, per_prompt_token}``, the
work in the iteration whose marker receives the requests:
:class:`simwar.config.schema.ReceiveCost`). :func:`receive_ranges` takes each range of a
fitted step with its host time, net of the API calls inside it and of the profiler's own
cost there (:mod:`simwar.fit.profiler_cost`), as the fit nets its other host ranges;
:func:`receive_line` fits ``per_request x requests + per_prompt_token x tokens`` over them by
least squares, clamped at 0.

That time is the receive's alone, so the fit takes it out of the step's other host figures
(:func:`held_by_step`): the host region that holds a range and the mapped CPU range around it
(:func:`simwar.fit.samples.sample_cpu_work`: the mini-server's ``recv_requests``, which is
``cpu.ingest_us``), and a prefill step's work around its forward
(:func:`simwar.fit.shapes.prefill_step_host`), so that neither ``cpu.ingest_us`` nor
``prefill.host_before_us`` (where the steps that receive are those that prefill) counts it
again. A capture without the ranges, or a mapping without the key, fits as before.

Imports: numpy, the standard library and simwar's fit layout; never the simulator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from simwar.fit.layout import StepLayout, columns, merged


@dataclass(frozen=True)
class Received:
    """One receive range of a fitted step: its host interval, requests, prompt tokens (-1:
    the pattern names none) and host time net of calls and the profiler's cost."""

    step: int
    start: float
    end: float
    requests: int
    tokens: int
    us: float


def receive_ranges(imp, pattern: str | None, lays: dict[int, StepLayout],
                   prof=None) -> list[Received]:
    """The ranges whose names match ``pattern`` (the mapping's ``receive``; None: none) in
    the steps ``lays``, in time order, each with its host time less the API calls inside it
    and (``prof``) the profiler's own cost outside those calls."""
    if not pattern or not lays:
        return []
    rx = re.compile(pattern)
    trace = imp.trace
    s0, e0 = columns(trace, "spans", "start_us", "end_us")
    keys = sorted(lays)
    starts = np.array([lays[k].start for k in keys], dtype=float)
    named: dict[str, tuple[int, int] | None] = {}
    out = []
    for name, a, b in imp.annotations:
        if name not in named:
            m = rx.search(name)
            named[name] = None if m is None else (
                int(m["requests"]), int(m["tokens"]) if m.groupdict().get("tokens") else -1)
        got = named[name]
        if got is None or got[0] <= 0:
            continue
        i = int(np.searchsorted(starts, a, side="right")) - 1
        if i < 0 or a >= lays[keys[i]].end:
            continue  # outside every fitted step (the warm-up, a step left out)
        lay = lays[keys[i]]
        calls = merged([(float(s0[c]), float(e0[c])) for c in lay.calls], a, b)
        net = (b - a) - sum(y - x for x, y in calls)
        if prof is not None:
            net = prof.less_outside(net, a, b, calls)
        out.append(Received(keys[i], float(a), float(b), got[0], got[1], max(net, 0.0)))
    return sorted(out, key=lambda r: r.start)


def held_by_step(received: list[Received]) -> dict[int, list[tuple[float, float, float]]]:
    """Per step: its receive ranges as ``(start, end, µs)``, what the fit takes out of the
    step's other host figures."""
    out: dict[int, list[tuple[float, float, float]]] = {}
    for r in received:
        out.setdefault(r.step, []).append((r.start, r.end, r.us))
    return out


def receive_line(received: list[Received]) -> tuple[dict | None, str]:
    """``({per_request, per_prompt_token}, how)``: the ranges' host time against their
    requests and prompt tokens, least squares through 0; a negative coefficient is dropped
    and the other refitted alone, never below 0. Ranges that name no tokens, or whose tokens
    are a fixed multiple of their requests: per request only. None without a range."""
    if not received:
        return None, ""
    n = np.array([r.requests for r in received], dtype=float)
    t = np.array([r.tokens for r in received], dtype=float)
    y = np.array([r.us for r in received], dtype=float)
    how = (f"least squares through 0 over {len(y)} receive ranges, {int(n.sum())} requests, "
           f"{int(t.sum()) if t.min() >= 0 else 'no'} prompt tokens")
    both = t.min() >= 0 and np.linalg.matrix_rank(np.column_stack([n, t])) == 2
    if both:
        (per_req, per_tok), *_ = np.linalg.lstsq(np.column_stack([n, t]), y, rcond=None)
        if per_tok < 0:
            per_req, per_tok = _through_zero(n, y), 0.0
            how += "; per_prompt_token < 0: per request alone"
        elif per_req < 0:
            per_req, per_tok = 0.0, _through_zero(t, y)
            how += "; per_request < 0: per token alone"
    else:
        per_req, per_tok = _through_zero(n, y), 0.0
        how += ("; the ranges name no tokens" if t.min() < 0 else "; no prompt tokens"
                if not t.any() else "; tokens in a fixed ratio to requests") + \
            ": per request alone"
    return {"per_request": round(max(float(per_req), 0.0), 3),
            "per_prompt_token": round(max(float(per_tok), 0.0), 6)}, how


def _through_zero(x: np.ndarray, y: np.ndarray) -> float:
    xx = float((x * x).sum())
    return max(float((x * y).sum()) / xx, 0.0) if xx > 0 else 0.0


def receive_lines(value: dict | None, how: str, received: list[Received],
                  steps: int = 0, replay: bool = False) -> list[str]:
    """The header's lines on the receive (none without a range); ``replay``: the config
    replays the capture's batches (no requests arrive, so nothing is received), over
    ``steps`` fitted steps."""
    if value is None:
        return []
    per_step = {}
    for r in received:
        per_step[r.step] = per_step.get(r.step, 0.0) + r.us
    mean = float(np.mean(list(per_step.values())))
    return [f"Receive: cpu.receive_us {value['per_request']:g} µs a request + "
            f"{value['per_prompt_token']:g} µs a prompt token: the mapping's receive ranges' "
            f"host time (less the calls in them and the profiler's cost there; {how}); "
            f"{mean:.1f} µs in each of the {len(per_step)} steps that received, taken out of "
            f"the host regions and CPU ranges that hold them (cpu.ingest_us, the prefill's "
            f"host time), so it is counted once."] + (
        [f"  The config replays the capture's batches: no request arrives, so its steps "
         f"receive none and lack this work ({sum(per_step.values()) / max(steps, 1):.1f} µs "
         f"a fitted step on average); a what-if with arrivals charges it per request."]
        if replay else [])

