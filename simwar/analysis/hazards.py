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

from ..trace import HOST, Mode, OpKind, Trace


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
        """Only races whose later access belongs to a step >= ``step`` (warm-up excluded)."""
        return HazardReport([r for r in self.races if r.second_step >= step])

    def frame(self):
        import pandas as pd

        return pd.DataFrame(self.races, columns=Race._fields)


def detect(trace: Trace, window: int = 2) -> HazardReport:
    ops = trace.ops
    strings = trace.strings
    lane_of = ops.lane.tolist()
    kind_of = ops.kind.tolist()
    bound_of = ops.bound.tolist()
    lanes = sorted({strings[c] for c in set(lane_of)} | {HOST})
    index = {trace.code(lane): i for i, lane in enumerate(lanes)}
    n = len(lanes)
    host = [0] * n
    clocks = {code: [0] * n for code in index}
    op_clock: dict[int, tuple[int, ...]] = {}
    acc = trace.accesses
    need = set(acc.op.tolist())
    SYNC, WAIT, RECORD = OpKind.SYNC, OpKind.WAIT, OpKind.RECORD
    for op_id, (lane, kind, bound) in enumerate(zip(lane_of, kind_of, bound_of)):
        if kind == SYNC:
            if bound >= 0:
                host = _join(host, op_clock[bound])
            continue
        v = _join(clocks[lane], host)
        if kind == WAIT and bound >= 0:
            v = _join(v, op_clock[bound])
        v[index[lane]] += 1
        clocks[lane] = v
        if kind == RECORD or op_id in need:
            op_clock[op_id] = tuple(v)

    order = np.argsort(acc.op, kind="stable")
    per_buffer: dict[int, list] = {}
    for a in zip(acc.op[order].tolist(), acc.buffer[order].tolist(), acc.mode[order].tolist(),
                 acc.step[order].tolist(), acc.phase[order].tolist()):
        per_buffer.setdefault(a[1], []).append(a)

    start_of, end_of = ops.start_us, ops.end_us
    label_of = ops.label
    races: list[Race] = []
    for buf, accs in per_buffer.items():
        for j, (b_op, _, b_mode, b_step, b_phase) in enumerate(accs):
            vb = op_clock[b_op]
            i = j - 1
            while i >= 0:
                a_op, _, a_mode, a_step, a_phase = accs[i]
                i -= 1
                if b_step - a_step > window:
                    break
                if abs(a_step - b_step) > window:
                    continue
                if a_mode == Mode.READ and b_mode == Mode.READ:
                    continue
                la_code = lane_of[a_op]
                if la_code == lane_of[b_op] or a_op == b_op:
                    continue
                la = index[la_code]
                latent = op_clock[a_op][la] > vb[la]
                overlap = float(end_of[a_op] - start_of[b_op])
                if not latent and overlap <= 0:
                    continue
                kind = {(Mode.READ, Mode.WRITE): "WAR", (Mode.WRITE, Mode.READ): "RAW"}.get(
                    (a_mode, b_mode), "WAW")
                races.append(Race(strings[buf], kind, a_step, strings[a_phase],
                                  strings[la_code], strings[label_of[a_op]], a_op,
                                  b_step, strings[b_phase], strings[lane_of[b_op]],
                                  strings[label_of[b_op]], b_op, latent, max(0.0, overlap)))
    return HazardReport(races)


def _join(a, b) -> list[int]:
    return [x if x >= y else y for x, y in zip(a, b)]
