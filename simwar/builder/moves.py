"""Iterations of configs that differ only in where read-done is published, built once.

``advise`` screens *families* of candidates: configs equal but for where read-done is
published (``policy.publish_phase`` and the phases' ``read_ends``), up to three per phase
that reads. Their iterations are the same host ops but for one: the read-done record of
each step, ``read_done[k]`` on the forward stream, which every barrier binds to by its
name. So a family's iterations are built once (:func:`~simwar.builder.loop.plan_iterations`
keeping where a host record of each publish point goes: ``spots``), and a member's are
those with the record moved to its point (:func:`moved_iterations`): the same op, at the
place its own build would put it, which is what its build gives (the tests hold the two
equal for every candidate of the shipped configs it applies to).

A member whose read-done is an in-graph node (``in_replay`` in a graph phase, with external
events) has no host record: its publishing phase's graph launch carries the node, after the
graph's prep kernel (:meth:`~simwar.builder.loop.LoopBuilder.phase`), and every wait and
sync on read-done names that node's event (``<phase>.read_done``) instead of the step's
``read_done[k]``. Its iterations are the first's with the host record taken out, that
graph launch given the node, and those waits and syncs renamed: again what its build gives
(the same tests).

It applies where nothing else moves with the record: the family's first's record a host
record, costs that are numbers (a drawn cost's draws go to its uses in program order, so
moving a use renumbers the draws between its two places) and durations that do not vary
with the step (their per-use values are laid out in program order too). Elsewhere the
member's iterations are built as usual.

Imports: simwar's config and the builder's loop.
"""

from __future__ import annotations

from simwar.builder.loop import READ_DONE, IterationPlan, LoopBuilder, node_event, plan_iterations
from simwar.builder.sizes import StepSizes
from simwar.config.policies import publish_point
from simwar.config.schema import Config
from simwar.core.program import GraphLaunch, GraphRecord, Kernel, Record, Synchronize, WaitEvent

#: the meta keys family members may differ in
_PUBLISH_META = frozenset({"publish_phase", "publish_position", "publish_reason"})


class Family:
    """The iterations of configs that differ only in where read-done is published
    (``advise``'s screen keeps one per family of candidates): the first config's are built
    keeping the publish points' spots, every later one's moved from them where
    :func:`moved_iterations` applies, built as usual elsewhere (a base whose record is not a
    host record is replaced by the next config's)."""

    def __init__(self) -> None:
        self.base: IterationPlan | None = None
        #: whether the last iterations given are the base's ops (the base, or moved from
        #: it): what the executor keeps of the base's (``shaping``) applies to them
        self.shared = False
        #: what the executor keeps of the family's plans (the fast executor's
        #: :class:`~simwar.executors.fast.plan.ShapeMemo`: the base's ops as shaped)
        self.shaping = None

    def iterations(self, cfg: Config, sizes: StepSizes) -> IterationPlan:
        if self.base is not None:
            moved = moved_iterations(self.base, cfg)
            if moved is not None:
                self.shared = True
                return moved
        its = plan_iterations(cfg, sizes, spots=True)
        self.shared = self.base is None or _host_spot(self.base.cfg, self.base.phases) is None
        if self.base is None or _host_spot(self.base.cfg, self.base.phases) is None:
            self.base = its  # one the next members can move from, where any can
        return its


def _host_spot(cfg: Config, phases) -> tuple[int, str] | None:
    """The spot of ``cfg``'s read-done record, when it is a host record in a phase."""
    pol = cfg.policy
    point = publish_point(phases, pol.publish_phase, pol.external_events,
                          pol.in_replay_fallback)
    if point.phase is None or point.in_graph:
        return None
    return point.index, point.position


def _node_phase(cfg: Config, phases) -> str | None:
    """The phase whose in-graph node is ``cfg``'s read-done record, if it is one."""
    pol = cfg.policy
    point = publish_point(phases, pol.publish_phase, pol.external_events,
                          pol.in_replay_fallback)
    return point.phase if point.phase is not None and point.in_graph else None


def _to_node(iteration: list, at: int | None, phase: str) -> list | None:
    """An iteration of the first's with its host read-done record (at ``at``; None: none
    this step) made ``phase``'s in-graph node (see the module); None where its ops are not
    as the builder makes them."""
    event = node_event(phase)
    out: list = []
    graphs = 0
    for j, op in enumerate(iteration):
        kind = type(op)
        if j == at:
            if kind is not Record:
                return None
            continue
        if kind is GraphLaunch and op.phase == phase:
            nodes = op.nodes
            if not 1 <= len(nodes) <= 2 or any(type(n) is not Kernel for n in nodes):
                return None
            # the node after the graph's prep kernel, before its body
            op = GraphLaunch(op.stream, op.graph, (*nodes[:-1], GraphRecord(event), nodes[-1]),
                             op.step, op.phase, op.host_us)
            graphs += 1
        elif kind in (WaitEvent, Synchronize) and \
                getattr(op.event, "template", None) == READ_DONE:
            op = op.replace(event=event)
        out.append(op)
    if graphs != (at is not None):  # the phase ran, and published, in the same steps
        return None
    return out


def _same_but_publish(a: Config, b: Config) -> bool:
    """``b`` is ``a`` but for ``policy.publish_phase`` and the phases' ``read_ends``."""
    for name in type(a).model_fields:
        x, y = getattr(a, name), getattr(b, name)
        if x is y:
            continue
        if name == "policy":
            if x.model_copy(update={"publish_phase": y.publish_phase}) != y:
                return False
        elif name == "phases":
            if len(x) != len(y) or any({**p, "read_ends": None} != {**q, "read_ends": None}
                                       for p, q in zip(x, y)):
                return False
        elif x != y:
            return False
    return True


def moved_iterations(base: IterationPlan, cfg: Config) -> IterationPlan | None:
    """``plan_iterations(cfg, sizes)`` from ``base`` (built with ``spots`` for a config that
    differs from ``cfg`` only in where read-done is published, at the same sizes): its ops
    with each step's read-done record moved to ``cfg``'s point. None where that does not
    apply (see the module docstring)."""
    if base.spots is None or base.dists or base.affines or base.noise_of:
        return None
    if not _same_but_publish(base.cfg, cfg):
        return None
    phases = cfg.phase_table()
    src, dst = _host_spot(base.cfg, base.phases), _host_spot(cfg, phases)
    node = _node_phase(cfg, phases) if dst is None else None
    if src is None or (dst is None and node is None):
        return None
    ops: list[list] = []
    for iteration, spots in zip(base.ops, base.spots):
        if node is not None:
            moved = _to_node(iteration, spots.get(src), node)
            if moved is None:
                return None
            ops.append(moved)
            continue
        a, b = spots.get(src), spots.get(dst)
        if a is None and b is None:  # no phase ran (a step of its own): nothing moves
            ops.append(list(iteration))
            continue
        if a is None or b is None or type(iteration[a]) is not Record:
            return None
        moved = iteration[:a] + iteration[a + 1:]
        moved.insert(b - 1 if b > a else b, iteration[a])
        ops.append(moved)
    meta = LoopBuilder(cfg, None, base.sizes, phases).meta()
    if {k: v for k, v in meta.items() if k not in _PUBLISH_META} != {
            k: v for k, v in base.meta.items() if k not in _PUBLISH_META}:
        return None
    return IterationPlan(cfg, ops, [dict(u) for u in base.uses], {}, meta, phases, {},
                         [dict(c) for c in base.contexts], base.sizes)
