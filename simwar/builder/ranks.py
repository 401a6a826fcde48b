"""Tensor-parallel ranks as Programs: one overlap loop per rank, with its coupling ops.

A config with ``parallel.tp: N`` runs N copies of the single-rank loop
(:mod:`simwar.builder.loop`, unchanged): rank r's loop is built from the config with rank r's
``ranks.per_rank`` overrides and its own seed (rank 0 keeps the config's), at the run's
per-step sizes (rank 0 broadcasts the batch: every rank runs the same batches). On top of it
this module adds the ops that couple the ranks (docs/design.md, "Tensor-parallel ranks"):

- at the top of every iteration, the request broadcast (a
  :class:`~simwar.core.program.HostCollective`, ``parallel.broadcast_us``): SGLang's
  ``recv_requests`` broadcasts over the CPU group before anything else of the iteration;
- as the last host work before ``run_batch`` (after the batch is scheduled), the
  DP-attention metadata all-gather when ``parallel.allgather`` is on;
- the host work by which the rank is late (``rank_jitter``: ``ranks.jitter_us``, every rank;
  ``rank_slow``: ``ranks.slow_us``, ``ranks.slow_rank`` only), right before the broadcast
  (``ranks.at: loop_top``) or right before ``run_batch`` (``ranks.at: launch``);
- inside each graph phase with ``collectives``: its body (the graph's last kernel) split into
  ``count`` equal parts, each followed by a :class:`~simwar.core.program.Collective` kernel.

The rank-model durations are drawn per rank from their own generators
(``default_rng([seed, 24, rank, key])``), apart from the loop's draws, so a rank's loop is
drawn as the same config's single-rank loop with that seed would be.

Imports: numpy, :mod:`simwar.core.program`, :mod:`simwar.config` and the other build modules.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from simwar.builder import loop
from simwar.builder.draws import sample
from simwar.builder.sizes import StepSizes
from simwar.config import Config, load_config
from simwar.config.load import Override, rank_overrides
from simwar.config.schema import Dist, Ranks
from simwar.core.program import (
    Collective,
    CpuWork,
    GraphLaunch,
    HostCollective,
    HostOp,
    Kernel,
    Marker,
    Program,
    StepMarker,
)
from simwar.core.refusals import PlanRefused

#: the generator stream of the rank model's draws (beside the sizes' streams)
STREAM = 24


def rank_seed(seed: int, rank: int) -> int:
    """The seed of rank ``rank``'s loop: the config's for rank 0, else one derived from it."""
    if rank == 0:
        return seed
    return int(np.random.SeedSequence([seed, STREAM, rank]).generate_state(1)[0])


def rank_config(cfg: Config, rank: int) -> Config:
    """Rank ``rank``'s config: its ``ranks.per_rank`` overrides applied, its own seed."""
    over = rank_overrides(cfg, rank)
    over.append(Override("seed", rank_seed(cfg.seed, rank), f"rank {rank}'s seed"))
    return load_config(cfg, over)


class RankDraws:
    """Rank ``rank``'s draws of the rank model, one array per key (all uses of the run)."""

    def __init__(self, cfg: Config, rank: int):
        self.seed, self.rank = cfg.seed, rank
        self._keys = 0

    def values(self, d, n: int) -> np.ndarray:
        key = self._keys
        self._keys += 1
        if not isinstance(d, Dist):
            return np.full(n, float(d))
        return sample(np.random.default_rng([self.seed, STREAM, self.rank, key]), d, n)


def rank_programs(cfg: Config, sizes: StepSizes, uniform: bool = False) -> list[Program]:
    """The ranks' Programs (ops generated as they are read, like
    :func:`simwar.builder.loop.stream_program`); ``uniform``: see :func:`coupled`."""
    out = []
    for r in range(cfg.tp):
        rc = rank_config(cfg, r)
        base = loop.stream_program(rc, sizes)
        meta = dict(base.meta, rank=r, tp=cfg.tp, name=cfg.name, rank_seed=rc.seed)
        out.append(Program(ops=coupled(base.ops, cfg, rc, r, uniform), streams=base.streams,
                           meta=meta))
    return out


def coupling_draws(cfg: Config, rc: Config, rank: int) -> dict:
    """Rank ``rank``'s draws of the rank model for the whole run, by name: ``jitter``,
    ``slow``, ``broadcast``, ``allgather`` (one per step), ``wake`` (two per step: the
    broadcast's, the all-gather's) and ``(phase, i)`` (the phase's i-th collective: its
    count per launch of the phase, launch after launch)."""
    steps = cfg.steps
    par = cfg.parallel
    ranks = cfg.ranks if cfg.ranks is not None else Ranks()
    draws = RankDraws(cfg, rank)
    out = {"jitter": draws.values(ranks.jitter_us, steps),
           "slow": draws.values(ranks.slow_us if ranks.slow_rank == rank else 0.0, steps),
           "broadcast": draws.values(par.broadcast_us, steps),
           "allgather": draws.values(par.allgather_us, steps),
           "wake": draws.values(par.wake_us, 2 * steps) if par.wait == "block"
           else np.zeros(2 * steps)}
    for ph in rc.phase_table():
        for i, c in enumerate(ph.collectives):
            out[(ph.name, i)] = draws.values(c.us, steps * c.count)
    return out


def coupled(ops: Iterable[HostOp], cfg: Config, rc: Config, rank: int,
            uniform: bool = False, value=None, draws: dict | None = None,
            steps: int | None = None) -> Iterator[HostOp]:
    """Rank ``rank``'s loop ``ops`` with the coupling ops inserted (module docstring).

    ``uniform``: the late host work is issued at every step, 0 where it is none (the host
    clock plus 0.0 is the same clock), so every rank issues the same structure and the
    ranks run in lockstep (:mod:`simwar.executors.lockstep.ranks`); the Trace then has
    the zero-length spans, so the executors that keep one take the ranks as they are.
    ``value(name, index)``: the number of draw ``index`` of ``draws[name]``
    (:func:`coupling_draws`, given with :func:`late_work` merged where ``uniform``, as a
    plan does once for its every iteration; default: the number itself; a plan's: a
    symbolic use of it);
    ``steps``: the step from which no iteration is coupled (default: the config's; a plan
    builds the drain at another step)."""
    steps = cfg.steps if steps is None else steps
    par = cfg.parallel
    ranks = cfg.ranks if cfg.ranks is not None else Ranks()
    if draws is None:
        draws = coupling_draws(cfg, rc, rank)
        if uniform:
            draws = {**draws, **late_work(draws)}
    if value is None:
        def value(name, index: int) -> float:
            return float(draws[name][index])
    jitter, slow = draws["jitter"], draws["slow"]
    used: dict = {}  # per collective: its draws taken so far
    colls = {}
    for ph in rc.phase_table():
        for i, c in enumerate(ph.collectives):
            colls.setdefault(ph.name, []).append((c, (ph.name, i)))
            used[(ph.name, i)] = 0

    def draw(name) -> float:
        i = used[name]
        used[name] = i + 1
        return value(name, i)

    top = ranks.at == "loop_top"

    def late(k: int) -> Iterator[HostOp]:
        if uniform:  # the work issued at every step (the draws are the rank's anyway)
            yield CpuWork("rank_jitter", value("jitter", k), k)
            yield CpuWork("rank_slow", value("slow", k), k)
            return
        if jitter[k] > 0:
            yield CpuWork("rank_jitter", value("jitter", k), k)
        if slow[k] > 0:
            yield CpuWork("rank_slow", value("slow", k), k)

    for op in ops:
        kind = type(op)
        if kind is StepMarker:
            yield op
            k = op.step
            if k < steps:
                if top:
                    yield from late(k)
                if par.broadcast:
                    yield HostCollective("broadcast", k, value("broadcast", k),
                                         value("wake", 2 * k))
        elif kind is Marker and op.name == "run_batch":
            k = op.step
            if par.allgather:
                yield HostCollective("allgather", k, value("allgather", k),
                                     value("wake", 2 * k + 1))
            if not top:
                yield from late(k)
            yield op
        elif kind is GraphLaunch and op.phase in colls:
            yield _with_collectives(op, colls[op.phase], draw)
        else:
            yield op


def late_work(draws: dict) -> dict:
    """The late host work ``coupled(uniform=True)`` issues, by name: the draws, 0 where
    they are not positive (where the rank is not late, no work is issued)."""
    return {name: np.where(draws[name] > 0, draws[name], 0.0) for name in ("jitter", "slow")}


def _with_collectives(op: GraphLaunch, colls: list, draw) -> GraphLaunch:
    """The graph launch with its body (its last kernel) split around the collectives."""
    nodes = list(op.nodes)
    at = max(i for i, n in enumerate(nodes) if type(n) is Kernel)
    body = nodes[at]
    parts = sum(c.count for c, _ in colls)
    if type(body.duration_us) not in (int, float):  # a plan's draw: no part of it is one
        raise Unplanned(f"the {op.phase} phase's body is drawn: its parts around the "
                        f"collectives are not draws of the plan")
    piece = Kernel(body.label, body.duration_us / parts, body.reads, body.writes, body.phase)
    split: list = []
    for c, name in colls:
        for _ in range(c.count):
            split += [piece, Collective(c.name, draw(name), body.phase)]
    return GraphLaunch(op.stream, op.graph, tuple(nodes[:at] + split + nodes[at + 1:]), op.step,
                       op.phase, op.host_us)


class Unplanned(PlanRefused):
    """A rank's coupling that a plan's symbolic iterations cannot express."""


__all__ = ["RankDraws", "Unplanned", "coupled", "coupling_draws", "late_work", "rank_config",
           "rank_programs", "rank_seed"]
