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
    """Latent races and observed overlaps among accesses at most ``window`` steps apart.

    One pass in issue order: a lane's clock is joined and ticked per op; a record's clock
    is kept only until the last wait or sync bound to it; each buffer keeps the accesses of
    the last ``window`` steps, which a new access is compared with.
    """
    ops, acc = trace.ops, trace.accesses
    strings = trace.strings
    n_ops = len(ops)
    lanes = sorted({strings[c] for c in np.unique(ops.lane).tolist()} | {HOST})
    index = {trace.code(lane): i for i, lane in enumerate(lanes)}
    n = len(lanes)
    host = [0] * n
    clocks = {code: [0] * n for code in index}
    # the last op that needs each record's clock (records nobody waits on keep none)
    bound = ops.bound
    users = np.flatnonzero(bound >= 0)
    last_use = np.full(n_ops, -1, dtype=np.int64)
    np.maximum.at(last_use, bound[users], users)
    del users
    kept = np.flatnonzero(last_use >= 0)
    kept = kept[np.argsort(last_use[kept], kind="stable")]  # in the order they may be freed
    free_at = last_use[kept]
    free_ptr = 0
    rec_clock: dict[int, tuple[int, ...]] = {}
    # accesses in op order; ops that have some are flagged
    order = np.argsort(acc.op, kind="stable")
    accesses = _rows_in_chunks(acc.op[order], acc.buffer[order], acc.mode[order],
                               acc.step[order], acc.phase[order])
    has_access = np.zeros(n_ops, dtype=bool)
    has_access[acc.op] = True
    n_of = np.bincount(acc.op, minlength=n_ops) if len(acc) else np.zeros(n_ops, dtype=int)
    buffers_seen: dict[int, int] = {}  # buffer -> rank of first appearance (report order)
    recent: dict[int, list] = {}  # buffer -> accesses of the last `window` steps
    start_of, end_of = ops.start_us, ops.end_us
    label_of = ops.label
    found: list[tuple] = []
    SYNC, WAIT, RECORD = OpKind.SYNC, OpKind.WAIT, OpKind.RECORD
    for op_id, kind, lane, b, touches in _rows_in_chunks(np.arange(n_ops), ops.kind, ops.lane,
                                                        ops.bound, has_access):
        if kind == SYNC:
            if b >= 0:
                host = _join(host, rec_clock[b])
        else:
            v = _join(clocks[lane], host)
            if kind == WAIT and b >= 0:
                v = _join(v, rec_clock[b])
            v[index[lane]] += 1
            clocks[lane] = v
            if kind == RECORD and last_use[op_id] >= 0:
                rec_clock[op_id] = tuple(v)
            for _ in range(n_of[op_id] if touches else 0):
                _, buf, mode, step, phase = next(accesses)
                rank = buffers_seen.setdefault(buf, len(buffers_seen))
                hist = recent.setdefault(buf, [])
                while hist and step - hist[0][3] > window:
                    hist.pop(0)
                for k in range(len(hist) - 1, -1, -1):
                    a_op, a_lane, a_mode, a_step, a_phase, a_clock = hist[k]
                    if abs(a_step - step) > window:
                        continue
                    if a_mode == Mode.READ and mode == Mode.READ:
                        continue
                    if a_lane == lane or a_op == op_id:
                        continue
                    la = index[a_lane]
                    latent = a_clock[la] > v[la]
                    overlap = float(end_of[a_op] - start_of[op_id])
                    if not latent and overlap <= 0:
                        continue
                    kind_name = {(Mode.READ, Mode.WRITE): "WAR",
                                 (Mode.WRITE, Mode.READ): "RAW"}.get((a_mode, mode), "WAW")
                    found.append(((rank, op_id, -a_op, -k), Race(
                        strings[buf], kind_name, a_step, strings[a_phase], strings[a_lane],
                        strings[label_of[a_op]], a_op, step, strings[phase], strings[lane],
                        strings[label_of[op_id]], op_id, latent, max(0.0, overlap))))
                hist.append((op_id, lane, mode, step, phase, tuple(v)))
        while free_ptr < len(kept) and free_at[free_ptr] == op_id:
            rec_clock.pop(int(kept[free_ptr]), None)
            free_ptr += 1
    found.sort(key=lambda item: item[0])
    return HazardReport([race for _, race in found])


def _rows_in_chunks(*columns, size: int = 1 << 15):
    """Rows of equal-length arrays as tuples, converted to Python a chunk at a time."""
    n = len(columns[0])
    for lo in range(0, n, size):
        hi = min(lo + size, n)
        yield from zip(*(c[lo:hi].tolist() for c in columns))


def _join(a, b) -> list[int]:
    return [x if x >= y else y for x, y in zip(a, b)]
