"""Critical-path chains tallied by cause: the aggregation behind ``simwar explain``'s table.

A chain (:class:`~simwar.analysis.chain_records.Chain`) is one forward gap or step period cut
into segments; :class:`CauseTally` adds chains as they come (µs per cause and kind, per gate,
and each chain's length), so a walk of any length keeps only the sums, and :func:`causes`
gives the same entries as tallying a list of chains, to the last bit (the sums are taken in
the same order). Split from :mod:`simwar.analysis.critical_path`, which walks the chains.

Imports: numpy and :mod:`simwar.analysis.chain_records`.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from simwar.analysis.chain_records import Chain, Segment, SegmentKind


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else float("nan")


class CauseTally:
    """Chains counted as they come: µs per (cause, kind), per gate, and each chain's length.

    Adding chains one by one gives :func:`causes` of them, to the last bit (the sums are
    taken in the same order), without keeping them.
    """

    def __init__(self) -> None:
        self.total: dict[tuple[str, SegmentKind], float] = defaultdict(float)
        self.by_gate: dict[tuple[str, SegmentKind], dict[str, float]] = defaultdict(
            lambda: defaultdict(float))
        self.example: dict[tuple[str, SegmentKind], Segment] = {}
        self.lengths: list[float] = []

    @property
    def n(self) -> int:
        return len(self.lengths)

    def add(self, length_us: float, segments) -> None:
        """One chain of ``length_us`` and its :class:`Segment` s."""
        total, by_gate, example = self.total, self.by_gate, self.example
        for s in segments:
            key = (s.cause, s.kind)
            us = s.end_us - s.start_us
            total[key] += us
            by_gate[key][s.after] += us
            if key not in example:
                example[key] = s
        self.lengths.append(length_us)

    def mean_us(self) -> float:
        return _mean(self.lengths)

    def causes(self) -> list[dict]:
        """The entries of :func:`causes`."""
        n = self.n
        if not n:
            return []
        mean_len = sum(self.lengths) / n
        out = []
        for (cause, kind), us in self.total.items():
            us /= n
            after = max(self.by_gate[(cause, kind)].items(), key=lambda kv: (kv[1], kv[0]))[0]
            out.append({"cause": cause, "kind": kind, "us": us,
                        "share": us / mean_len if mean_len > 0 else 0.0, "after": after,
                        "words": self.example[(cause, kind)].words()})
        out.sort(key=lambda d: (-d["us"], d["cause"]))
        return out


def causes(chains: list[Chain]) -> list[dict]:
    """Mean µs per chain by (cause, kind), largest first, with its share of the mean length.

    Each entry: ``cause``, ``kind``, ``us`` (mean over the chains), ``share`` (of the mean
    chain length), ``after`` (the gate most of its time came through, '' if none) and
    ``words`` (the cause as a phrase).
    """
    tally = CauseTally()
    for chain in chains:
        tally.add(chain.us, chain.segments)
    return tally.causes()


__all__ = ["CauseTally", "causes"]
