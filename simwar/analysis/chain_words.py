"""A critical path's forward gap in words: one sentence, with the gate behind each cause.

:func:`sentence` reads only a :class:`~simwar.analysis.critical_path.CriticalPath`'s figures
and causes (not imported: that module imports this one), so it lives apart from the walk;
the causes are tallied there (:class:`~simwar.analysis.critical_path.CauseTally`).

Imports: numpy, :mod:`simwar.core.trace` and :mod:`.chain_records`.
"""

from __future__ import annotations

import numpy as np

from simwar.analysis.chain_records import GateLanes, SegmentKind
from simwar.core.trace import HOST


# --------------------------------------------------------------------------- words
def _fmt_us(us: float) -> str:
    return f"{us:.0f} µs" if abs(us - round(us)) < 0.05 or us >= 100 else f"{us:.1f} µs"


def sentence(cp, max_causes: int = 4) -> str:
    """The forward gap in one sentence: its causes, largest first, and the gate behind each.

    e.g. "forward k waited 356 µs: 300 µs schedule_writes on the schedule stream, which
    could not start until forward k-1 ended because of the coarse barrier
    (schedule.wait_stream(forward)), + 50 µs ...". Cross-stream latencies are summed.
    """
    if getattr(cp, "one_step", False):
        return _one_step_sentence(cp, max_causes)
    gap = cp.fwd_gap_us
    if not cp.n_gaps or not np.isfinite(gap):
        return "no forward gap to explain in these steps"
    if gap < 0.5:
        return f"forward k started {_fmt_us(gap)} after forward k-1 ended: no bubble"
    forward = cp.trace.run.forward_stream
    found = cp.gap_causes()
    latency = [c for c in found if c["kind"] == SegmentKind.CROSS_STREAM]
    items = [c for c in found if c["kind"] != SegmentKind.CROSS_STREAM]
    if latency:
        us = sum(c["us"] for c in latency)
        n = len(latency)
        items.append({"us": us, "kind": SegmentKind.CROSS_STREAM, "after": "",
                      "words": "cross-stream latency" + (f" ({n} waits)" if n > 1 else "")})
        items.sort(key=lambda c: -c["us"])
    parts, said = [], set()
    top = items[:max_causes]
    for c in top:
        text = f"{_fmt_us(c['us'])} {c['words']}"
        gate = c["after"]
        if gate and gate not in said and c["kind"] not in (SegmentKind.CROSS_STREAM,
                                                           SegmentKind.WAKE_UP):
            said.add(gate)
            waiter, source = cp.gates.get(gate, GateLanes("", ""))
            if waiter == HOST:
                text += (", issued" if c["kind"] == SegmentKind.DEVICE else ",")
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


def _one_step_sentence(cp, max_causes: int) -> str:
    """A trace of one step: what its time went to, largest causes first."""
    total = cp.step_us
    found = cp.step_causes()
    # a kernel's name can run to hundreds of characters: its start says which it is
    parts = [f"{_fmt_us(c['us'])} "
             + (_clip(c["words"]) if c["kind"] == SegmentKind.DEVICE else c["words"])
             for c in found[:max_causes]]
    rest = total - sum(c["us"] for c in found[:max_causes])
    if rest >= 0.5:
        parts.append(f"{_fmt_us(rest)} other")
    return (f"the one step took {_fmt_us(total)} from its start to its forward's end: "
            + ", + ".join(parts))


def _clip(text: str, width: int = 90) -> str:
    return text if len(text) <= width else text[:width - 1] + "…"


def _gate_words(gate: str) -> str:
    """``schedule.wait_stream(forward) = the coarse barrier`` -> ``the coarse barrier
    (schedule.wait_stream(forward))``."""
    name, _, role = gate.partition(" = ")
    return f"{role} ({name})" if role else name
