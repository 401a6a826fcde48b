"""A critical path's chains in words: causes aggregated over chains, and the gap in a sentence.

:func:`causes` sums the segments of :mod:`simwar.analysis.critical_path`'s chains by cause;
:func:`sentence` says the forward gap in one sentence, with the gate behind each cause. Both
read only the chains' fields (``chains``: :class:`~simwar.analysis.critical_path.Chain` s,
``cp``: a :class:`~simwar.analysis.critical_path.CriticalPath`; not imported: that module
imports this one), so they live apart from the walk.

Imports: numpy and :mod:`simwar.core.trace`.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from simwar.core.trace import HOST


# --------------------------------------------------------------------------- aggregation
def causes(chains: list) -> list[dict]:
    """Mean µs per chain by (cause, kind), largest first, with its share of the mean length.

    Each entry: ``cause``, ``kind``, ``us`` (mean over the chains), ``share`` (of the mean
    chain length), ``after`` (the gate most of its time came through, '' if none) and
    ``words`` (the cause as a phrase).
    """
    if not chains:
        return []
    total: dict[tuple[str, str], float] = defaultdict(float)
    gates: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    example: dict = {}  # (cause, kind) -> its first segment
    for chain in chains:
        for s in chain.segments:
            key = (s.cause, s.kind)
            total[key] += s.us
            gates[key][s.after] += s.us
            example.setdefault(key, s)
    n = len(chains)
    mean_len = sum(c.us for c in chains) / n
    out = []
    for (cause, kind), us in total.items():
        us /= n
        after = max(gates[(cause, kind)].items(), key=lambda kv: (kv[1], kv[0]))[0]
        out.append({"cause": cause, "kind": kind, "us": us,
                    "share": us / mean_len if mean_len > 0 else 0.0, "after": after,
                    "words": example[(cause, kind)].words()})
    out.sort(key=lambda d: (-d["us"], d["cause"]))
    return out


# --------------------------------------------------------------------------- words
def _fmt_us(us: float) -> str:
    return f"{us:.0f} µs" if abs(us - round(us)) < 0.05 or us >= 100 else f"{us:.1f} µs"


def sentence(cp, max_causes: int = 4) -> str:
    """The forward gap in one sentence: its causes, largest first, and the gate behind each.

    e.g. "forward k waited 356 µs: 300 µs schedule_writes on the schedule stream, which
    could not start until forward k-1 ended because of the coarse barrier
    (schedule.wait_stream(forward)), + 50 µs ...". Cross-stream latencies are summed.
    """
    gap = cp.fwd_gap_us
    if not cp.gaps or not np.isfinite(gap):
        return "no forward gap to explain in these steps"
    if gap < 0.5:
        return f"forward k started {_fmt_us(gap)} after forward k-1 ended: no bubble"
    forward = cp.trace.meta.get("forward_stream", "forward")
    found = cp.gap_causes()
    latency = [c for c in found if c["kind"] == "cross_stream"]
    items = [c for c in found if c["kind"] != "cross_stream"]
    if latency:
        us = sum(c["us"] for c in latency)
        n = len(latency)
        items.append({"us": us, "kind": "cross_stream", "after": "",
                      "words": "cross-stream latency" + (f" ({n} waits)" if n > 1 else "")})
        items.sort(key=lambda c: -c["us"])
    parts, said = [], set()
    top = items[:max_causes]
    for c in top:
        text = f"{_fmt_us(c['us'])} {c['words']}"
        gate = c["after"]
        if gate and gate not in said and c["kind"] not in ("cross_stream", "wake_up"):
            said.add(gate)
            waiter, source = cp.gates.get(gate, ("", ""))
            if waiter == HOST:
                text += (", issued" if c["kind"] == "device" else ",")
                text += f" after the CPU blocked in {_gate_words(gate)}"
            elif source == forward and waiter != forward:
                text += (f", which could not start until forward k-1 ended because of "
                         f"{_gate_words(gate)}")
            else:
                text += f", after {_gate_words(gate)}"
        parts.append(text)
    rest = gap - sum(c["us"] for c in top)
    if rest >= 0.5:
        parts.append(f"{_fmt_us(rest)} other")
    return f"forward k waited {_fmt_us(gap)}: " + ", + ".join(parts)


def _gate_words(gate: str) -> str:
    """``schedule.wait_stream(forward) = the coarse barrier`` -> ``the coarse barrier
    (schedule.wait_stream(forward))``."""
    name, _, role = gate.partition(" = ")
    return f"{role} ({name})" if role else name
