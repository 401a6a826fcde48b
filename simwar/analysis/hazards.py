"""Race detection on a Trace: latent races by happens-before, observed overlaps by time.

Happens-before is built with vector clocks, as PyTorch's CUDA stream
sanitizer does: one component per lane (each stream and the host thread).
Walking ``trace.ops`` in host issue order:

- a stream operation joins the host's clock (the host issued it after
  everything the host had already synchronized with), then ticks its lane;
- a stream wait also joins the clock of the record it bound to;
- a host synchronize joins the clock of the record it bound to into the host.

Two accesses to the same buffer conflict when at least one writes and they
run on different lanes. The earlier-issued one must happen-before the later
one; if not, the pair is a **latent race** (even if this run's timing kept
them apart). If the later-issued access actually started before the earlier
one ended (it overtook it, wholly or in part), it is also an **observed
overlap**, of ``earlier end - later start`` µs. Only pairs whose steps differ by at most ``window``
are compared (a step's buffers are reused by the next steps, not by steps
far away; the default covers the k / k+1 reuse of the overlap loop).

Each race names its two accesses by op id (``first_op``, ``second_op``), so a reader finds
the spans of both without matching labels or times.

Imports: the standard library and numpy (``frame()`` imports pandas lazily).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from ..trace import Mode, OpKind, Trace


class Race(NamedTuple):
    buffer: str
    kind: str  # WAR | RAW | WAW (by issue order: earlier access, then later)
    first_step: int
    first_phase: str
    first_lane: str
    first_label: str
    first_op: int
    second_step: int
    second_phase: str
    second_lane: str
    second_label: str
    second_op: int
    latent: bool  # no happens-before path from first to second
    overlap_us: float  # > 0: the second started this long before the first ended

    @property
    def observed(self) -> bool:
        return self.overlap_us > 0


@dataclass
class HazardReport:
    races: list[Race] = field(default_factory=list)

    @property
    def latent(self) -> list[Race]:
        return [r for r in self.races if r.latent]

    @property
    def observed(self) -> list[Race]:
        return [r for r in self.races if r.observed]

    def since(self, step: int) -> HazardReport:
        """Only races whose two accesses belong to steps >= ``step`` (warm-up excluded)."""
        return HazardReport([r for r in self.races if r.first_step >= step
                             and r.second_step >= step])

    def within(self, steps) -> HazardReport:
        """Only races whose two accesses belong to ``steps`` (e.g. the measured steps)."""
        steps = set(steps)
        return HazardReport([r for r in self.races if r.first_step in steps
                             and r.second_step in steps])

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.races, columns=Race._fields)


def detect(trace: Trace, window: int = 2) -> HazardReport:
    """Latent races and observed overlaps among accesses at most ``window`` steps apart
    (the pairs of :func:`candidate_pairs`, with their times)."""
    ops, acc = trace.ops, trace.accesses
    strings = trace.strings
    lane_of = ops.lane.tolist()
    order = np.argsort(acc.op, kind="stable")
    a_op = acc.op[order].tolist()
    a_buf = acc.buffer[order].tolist()
    a_mode = acc.mode[order].tolist()
    a_step = acc.step[order].tolist()
    a_phase = acc.phase[order].tolist()
    start_of, end_of = ops.start_us, ops.end_us
    label_of = ops.label
    races: list[Race] = []
    for i, j, latent in candidate_pairs(lane_of, ops.kind.tolist(), ops.bound.tolist(), a_op,
                                        a_buf, a_mode, a_step, window):
        first, second = a_op[i], a_op[j]
        overlap = float(end_of[first] - start_of[second])
        if not latent and overlap <= 0:
            continue
        races.append(Race(strings[a_buf[j]], race_kind(a_mode[i], a_mode[j]), a_step[i],
                          strings[a_phase[i]], strings[lane_of[first]],
                          strings[label_of[first]], first, a_step[j], strings[a_phase[j]],
                          strings[lane_of[second]], strings[label_of[second]], second, latent,
                          max(0.0, overlap)))
    return HazardReport(races)


def race_kind(first_mode: int, second_mode: int) -> str:
    """WAR, RAW or WAW by issue order (earlier access, then later)."""
    return {(Mode.READ, Mode.WRITE): "WAR", (Mode.WRITE, Mode.READ): "RAW"}.get(
        (first_mode, second_mode), "WAW")


def happens_before(lane_of: list, kind_of: list, bound_of: list, need) -> tuple[dict, dict]:
    """Vector clocks of the ops in ``need``, walking in issue order (a record's clock is
    kept while a later wait or sync may still bind to it).

    ``lane_of``/``kind_of``/``bound_of``: per op (issue order) its lane (any hashable code),
    :class:`OpKind` and bound record (-1: none). Returns ``(op_clock, index)``: op id ->
    clock tuple, and lane code -> component. An op ``a`` on lane ``L`` happens before ``b``
    iff ``op_clock[a][index[L]] <= op_clock[b][index[L]]``.
    """
    index = {code: i for i, code in enumerate(sorted(set(lane_of), key=str))}
    n = len(index)
    host = [0] * n
    clocks = {code: [0] * n for code in index}
    op_clock: dict[int, tuple[int, ...]] = {}
    # a record's clock is needed until the last wait or sync bound to it (then dropped,
    # unless the record is itself asked for): a long trace keeps few of them at once
    last_use: dict[int, int] = {}
    for op_id, bound in enumerate(bound_of):
        if bound >= 0:
            last_use[bound] = op_id
    drop_at: dict[int, list[int]] = {}
    for rec, last in last_use.items():
        if rec not in need:
            drop_at.setdefault(last, []).append(rec)
    SYNC, WAIT, RECORD = OpKind.SYNC, OpKind.WAIT, OpKind.RECORD
    for op_id, (lane, kind, bound) in enumerate(zip(lane_of, kind_of, bound_of)):
        if kind == SYNC:
            if bound >= 0:
                host = _join(host, op_clock[bound])
        else:
            v = _join(clocks[lane], host)
            if kind == WAIT and bound >= 0:
                v = _join(v, op_clock[bound])
            v[index[lane]] += 1
            clocks[lane] = v
            if (kind == RECORD and op_id in last_use) or op_id in need:
                op_clock[op_id] = tuple(v)
        for rec in drop_at.pop(op_id, ()):
            del op_clock[rec]
    return op_clock, index


def candidate_pairs(lane_of: list, kind_of: list, bound_of: list, acc_op: list, acc_buf: list,
                    acc_mode: list, acc_step: list, window: int = 2):
    """The access pairs :func:`detect` compares, with their latent flag.

    Ops are given per op id (issue order): ``lane_of``, ``kind_of``, ``bound_of``; accesses
    sorted by op id: ``acc_op``, ``acc_buf``, ``acc_mode``, ``acc_step``. Yields
    ``(i, j, latent)`` (indices into the accesses, ``i`` issued before ``j``) for every pair on
    one buffer, on different lanes, not both reads, whose steps differ by at most ``window``:
    per buffer in order of first access, ``j`` in issue order, ``i`` from the nearest back.
    Every executor's race list comes from here (the trace's, and the one-pass executor's per
    iteration shape), so the two cannot disagree on which pairs count.
    """
    op_clock, index = happens_before(lane_of, kind_of, bound_of, set(acc_op))
    per_buffer: dict = {}
    for n, buf in enumerate(acc_buf):
        per_buffer.setdefault(buf, []).append(n)
    READ = Mode.READ
    for accs in per_buffer.values():
        for j, b in enumerate(accs):
            b_op, b_mode, b_step = acc_op[b], acc_mode[b], acc_step[b]
            vb = op_clock[b_op]
            b_lane = lane_of[b_op]
            i = j - 1
            while i >= 0:
                a = accs[i]
                i -= 1
                a_step = acc_step[a]
                if b_step - a_step > window:
                    break
                if a_step - b_step > window:
                    continue
                if acc_mode[a] == READ and b_mode == READ:
                    continue
                a_op = acc_op[a]
                la_code = lane_of[a_op]
                if la_code == b_lane or a_op == b_op:
                    continue
                la = index[la_code]
                yield a, b, op_clock[a_op][la] > vb[la]


def _join(a, b) -> list[int]:
    return [x if x >= y else y for x, y in zip(a, b)]
