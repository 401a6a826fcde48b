"""Barrier policies and the read-done publish rule.

The rule (reference §(d), "Rule the simulator should implement"): the
read-done event is published by the **last phase that reads shared buffers**
(or the phase named by ``policy.publish_phase``), recorded at that phase's
declared end:

- ``pre_replay``: a host record before the graph launch (after ``load_batch``);
- ``in_replay``: the in-graph node after the in-graph prep — only with
  external events; otherwise it falls back to ``post_replay`` (era 3) or to
  ``pre_replay`` (eras 1/2, unsound when the prep re-reads live tables);
- ``post_replay``: a host record after the graph launch;
- ``unknown``: nothing is published, and a fine barrier falls back to coarse.

For an eager phase the same names mean: after ``load_batch``, after the prep
kernel, after the body. Imports: nothing beyond the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class PublishPoint:
    """Where this step's read-done is recorded (``phase`` None: not published)."""

    phase: str | None
    index: int | None
    position: str | None  # pre_replay | in_replay | post_replay (after fallback)
    in_graph: bool
    reason: str


def publish_point(phases: Sequence, publish_phase: str = "auto", external_events: bool = True,
                  in_replay_fallback: str = "post_replay") -> PublishPoint:
    """Resolve the publish phase and position for a phase table (``config.Phase`` objects)."""
    if publish_phase == "auto":
        readers = [i for i, p in enumerate(phases) if p.reads]
        if not readers:
            return PublishPoint(None, None, None, False, "no phase reads shared buffers")
        idx = readers[-1]
    else:
        idx = next(i for i, p in enumerate(phases) if p.name == publish_phase)
    p = phases[idx]
    declared = p.read_ends
    if declared == "unknown":
        return PublishPoint(None, idx, None, False,
                            f"{p.name} declares read_ends unknown: nothing published")
    if declared == "in_replay" and p.graph != "eager":
        if external_events:
            return PublishPoint(p.name, idx, "in_replay", True, f"{p.name}: in-graph node")
        return PublishPoint(p.name, idx, in_replay_fallback, False,
                            f"{p.name}: in_replay without external events -> "
                            f"{in_replay_fallback}")
    return PublishPoint(p.name, idx, declared, False, f"{p.name}: {declared} record")


def effective_barrier(barrier: str, point: PublishPoint) -> str:
    """The barrier actually applied each step: a fine barrier with no read-done is coarse."""
    if barrier == "fine" and point.phase is None:
        return "coarse"
    return barrier
