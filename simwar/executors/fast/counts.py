"""Races counted as a run goes: the counts of a summary-only run and its first races.

- :class:`Tally`: what :meth:`simwar.executors.fast.races.RacePlan.tally` counts into for a
  summary-only run: the races, overlaps and race steps of the measured steps, and the first
  :data:`RACES_KEPT` races of each pair;
- :class:`RaceCounts`: the result, answering as the race report does from what it kept.

Imports: numpy and the executor's races.
"""

from __future__ import annotations

import numpy as np

from simwar.executors.fast.races import FastHazards, _Intervals, _RaceList, _Rows

#: races of each kind a summary-only run keeps as a list (the first, in the engine's order)
RACES_KEPT = 1024


class Tally:
    """Race counts of a summary-only run, and its first races of each kind per pair."""

    def __init__(self, groups: int) -> None:
        self.races = self.overlaps = 0
        self.steps = _Intervals()
        # per (group, pair): (first pass, overlaps) of its first races; observed (pass, overlap)
        self.first: dict[tuple[int, int], tuple[int, list]] = {}
        self.observed: dict[tuple[int, int], list] = {}

    def add(self, gi: int, ri: int, j0: int, b_step: int, overlap: np.ndarray) -> None:
        """The races ``j0, j0 + 1, ...`` of pair ``ri`` of group ``gi`` (later access in step
        ``b_step`` and on), with their overlaps."""
        n = len(overlap)
        self.races += n
        self.steps.add(b_step, b_step + n)
        hits = np.flatnonzero(overlap > 0)
        self.overlaps += len(hits)
        j, kept = self.first.setdefault((gi, ri), (j0, []))
        if len(kept) < RACES_KEPT:
            kept += overlap[:RACES_KEPT - len(kept)].tolist()
        obs = self.observed.setdefault((gi, ri), [])
        if len(obs) < RACES_KEPT and len(hits):
            hits = hits[:RACES_KEPT - len(obs)]
            obs += zip((hits + j0).tolist(), overlap[hits].tolist())

    def result(self, plan, first, last) -> RaceCounts:
        w = plan.window
        blocks = plan.plan.blocks
        latent: list[_Rows] = []
        observed: list[_Rows] = []
        for (gi, ri), (j0, kept) in self.first.items():
            bi, i, count, tpls = plan.groups[gi]
            r = tpls[ri]
            b = blocks[bi]
            nops = len(b.shape.ops)
            b_step = b.steps[0] + i
            b_op = plan.op_base[bi] + i * nops + r.b_dev
            if i >= w:
                a_op = plan.op_base[bi] + (i - r.a_back) * nops + r.a_dev
            else:
                abi, ap = plan._segment(b.g0 + i - r.a_back)
                a_op = plan.op_base[abi] + ap * len(blocks[abi].shape.ops) + r.a_dev
            row = _Rows(r, b_step - r.a_back, b_step, a_op, b_op, nops, np.zeros(0))
            latent.append(row.at(j0, np.asarray(kept)))
            for j, ov in self.observed.get((gi, ri), []):
                observed.append(row.at(j, np.array([ov])))
        order = plan._buffer_order()
        return RaceCounts((self.races, self.overlaps, self.steps.total()),
                          None if last is None else (first, last),
                          FastHazards(latent, order, plan.plan.lo, plan.plan.hi),
                          FastHazards(observed, order, plan.plan.lo, plan.plan.hi))


class RaceCounts:
    """The races of a summary-only run: their counts over the measured steps, and the first
    :data:`RACES_KEPT` latent races and observed overlaps among them (no list of them all:
    a long racy run has millions).

    ``counts(first, last)`` answers for the measured steps only; ``latent``, ``observed``,
    ``since`` and ``within`` answer as :class:`FastHazards` does, from the races kept;
    ``races``, ``report()`` and ``frame()`` (the whole list) raise ``ValueError``.
    """

    def __init__(self, totals: tuple[int, int, int], steps: tuple[int, int] | None,
                 latent: FastHazards, observed: FastHazards):
        self.totals = totals
        self.steps = steps
        self._latent = latent
        self._observed = observed

    def counts(self, first: int, last: int) -> tuple[int, int, int]:
        if (first, last) != self.steps:
            raise ValueError(f"this run counted its races over steps {self.steps} only "
                             f"(summary_only=True), not {first}..{last}")
        return self.totals

    @property
    def latent(self) -> _RaceList:
        return self._latent.latent

    @property
    def observed(self) -> _RaceList:
        return self._observed.observed

    def since(self, step: int) -> RaceCounts:
        return RaceCounts(self.totals, None, self._latent.since(step),
                          self._observed.since(step))

    def within(self, steps) -> RaceCounts:
        return RaceCounts(self.totals, None, self._latent.within(steps),
                          self._observed.within(steps))

    def _no_list(self):
        raise ValueError("this run kept no race list (summary_only=True): the summary has "
                         "its counts; simulate without summary_only for the races")

    @property
    def races(self):
        self._no_list()

    def report(self):
        self._no_list()

    def frame(self):
        self._no_list()
