"""Barrier policies and the read-done publish rule.

The rule (docs/design.md, the rule the simulator implements): the
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
kernel, after the body.

Barrier policies are classes registered by name (:func:`register_barrier`):
each says what the scheduler issues to order step k+1's shared writes after
forward k's reads, and the builder only calls their hooks. A new policy is
one subclass in one place, inside the package or outside it; the config
schema accepts every registered name.

Imports: the standard library and :class:`simwar.core.program.StepName` (the names of
per-step events).
"""

from __future__ import annotations

from typing import Sequence

from simwar.core.frozen import Frozen, set_field
from simwar.core.program import StepName


class PublishPoint(Frozen):
    """Where this step's read-done is recorded (``phase`` None: not published)."""

    __slots__ = ("phase", "index", "position", "in_graph", "reason")

    def __init__(self, phase: str | None, index: int | None, position: str | None,
                 in_graph: bool, reason: str):
        set_field(self, "phase", phase)
        set_field(self, "index", index)
        set_field(self, "position", position)  # pre_replay | in_replay | post_replay (after
        # fallback)
        set_field(self, "in_graph", in_graph)
        set_field(self, "reason", reason)


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


# --------------------------------------------------------------------------- barrier policies
class Barrier:
    """A WAR barrier policy. Subclass, set ``name``, override the hooks, register.

    The hooks receive the builder (:class:`simwar.builder.loop.LoopBuilder`), whose host-API
    methods (``wait_stream``, ``wait_event``, ``sync``, ``record``) issue the ops, and the
    step ``k`` whose forward the barrier fences:

    - :meth:`fence`: the barrier for forward ``k`` (after the launch, or at the
      top of iteration k+1 under ``placement: loop_top``);
    - :meth:`after_phases`: right after forward ``k``'s phases are launched
      (e.g. to record an event a later host block waits on);
    - :meth:`before_prepare`: in iteration ``k``, before the next batch is
      prepared, when the placement is ``loop_top`` and :attr:`blocks_at_prepare`
      (the legacy DFLASH ``verify_done`` position).
    """

    name = ""
    #: a short description for listings (``simwar advise``, docs)
    doc = ""
    #: whether the policy is expected to be race-free when the publish rule holds
    safe = True
    #: under loop_top placement, fence at prepare (a host block) instead of the loop top
    blocks_at_prepare = False

    def resolve(self, point: PublishPoint) -> Barrier:
        """The policy actually applied, given where read-done is published."""
        return self

    def fence(self, b, k: int) -> None:  # pragma: no cover - every policy overrides it
        raise TypeError(f"barrier policy {self.name!r} does not define fence()")

    def after_phases(self, b, k: int) -> None:
        return None

    def before_prepare(self, b, k: int) -> None:
        self.fence(b, k - 1)


BARRIERS: dict[str, Barrier] = {}


def register_barrier(cls: type[Barrier]) -> type[Barrier]:
    """Class decorator: make ``cls.name`` a valid ``policy.barrier``."""
    if not cls.name or not cls.name.isidentifier():
        raise ValueError(f"barrier policy {cls.__name__}: name must be an identifier")
    BARRIERS[cls.name] = cls()
    return cls


def barrier(name: str) -> Barrier:
    try:
        return BARRIERS[name]
    except KeyError:
        raise ValueError(f"'{name}' is not a barrier policy "
                         f"({', '.join(BARRIERS)})") from None


@register_barrier
class NoBarrier(Barrier):
    name = "none"
    doc = "no barrier: the next step's writes may overtake the forward's reads (unsafe)"
    safe = False

    def fence(self, b, k: int) -> None:
        return None


@register_barrier
class Coarse(Barrier):
    name = "coarse"
    doc = "schedule.wait_stream(forward): the next writes wait for the whole forward"

    def fence(self, b, k: int) -> None:
        b.wait_stream("schedule", "forward", k)


@register_barrier
class Fine(Barrier):
    name = "fine"
    doc = "schedule.wait_event(read_done): the next writes wait for the published read-done"

    def resolve(self, point: PublishPoint) -> Barrier:
        # nothing published: SGLang's barrier finds the mailbox empty and goes coarse
        return BARRIERS["coarse"] if point.phase is None else self

    def fence(self, b, k: int) -> None:
        if k in b.read_done:
            b.wait_event("schedule", b.read_done[k], k)
        else:  # this step published nothing: coarse, as the cleared mailbox makes it
            b.wait_stream("schedule", "forward", k)


@register_barrier
class HostSync(Barrier):
    name = "host_sync"
    doc = "the CPU blocks on read-done (legacy DFLASH verify_done.synchronize())"
    blocks_at_prepare = True

    def after_phases(self, b, k: int) -> None:
        if k not in b.read_done:  # nothing published this step: block on the whole forward
            name = StepName("forward_done[{}]", k)
            b.record(name, "forward", k)
            b.read_done[k] = name

    def fence(self, b, k: int) -> None:
        b.sync(b.read_done[k], k, "barrier")

    def before_prepare(self, b, k: int) -> None:
        b.sync(b.read_done[k - 1], k, "verify_done")


def effective_barrier(name: str, point: PublishPoint) -> str:
    """The name of the barrier actually applied each step (a fine barrier without a
    read-done is coarse)."""
    return barrier(name).resolve(point).name
