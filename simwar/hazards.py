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

Imports: the standard library (``frame()`` imports pandas lazily).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from .trace import HOST, Trace


class Race(NamedTuple):
    buffer: str
    kind: str  # WAR | RAW | WAW (by issue order: earlier access, then later)
    first_step: int
    first_phase: str
    first_lane: str
    first_label: str
    second_step: int
    second_phase: str
    second_lane: str
    second_label: str
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
    ops = trace.ops
    lanes = sorted({op.lane for op in ops} | {HOST})
    index = {lane: i for i, lane in enumerate(lanes)}
    n = len(lanes)
    host = [0] * n
    clocks = {lane: [0] * n for lane in lanes}
    op_clock: dict[int, tuple[int, ...]] = {}
    need = {a.op_id for a in trace.accesses}
    by_id = {}
    for op in ops:
        by_id[op.op_id] = op
        if op.kind == "sync":
            if op.bound >= 0:
                host = _join(host, op_clock[op.bound])
            continue
        v = _join(clocks[op.lane], host)
        if op.kind == "wait" and op.bound >= 0:
            v = _join(v, op_clock[op.bound])
        v[index[op.lane]] += 1
        clocks[op.lane] = v
        if op.kind == "record" or op.op_id in need:
            op_clock[op.op_id] = tuple(v)

    per_buffer: dict[str, list] = {}
    for a in sorted(trace.accesses, key=lambda a: a.op_id):
        per_buffer.setdefault(a.buffer, []).append(a)

    races: list[Race] = []
    for buf, accs in per_buffer.items():
        for j, b in enumerate(accs):
            ob = by_id[b.op_id]
            vb = op_clock[b.op_id]
            i = j - 1
            while i >= 0:
                a = accs[i]
                i -= 1
                if b.step - a.step > window:
                    break
                if abs(a.step - b.step) > window:
                    continue
                if a.mode == "read" and b.mode == "read":
                    continue
                oa = by_id[a.op_id]
                if oa.lane == ob.lane or a.op_id == b.op_id:
                    continue
                la = index[oa.lane]
                latent = op_clock[a.op_id][la] > vb[la]
                overlap = oa.end_us - ob.start_us
                if not latent and overlap <= 0:
                    continue
                kind = {("read", "write"): "WAR", ("write", "read"): "RAW"}.get(
                    (a.mode, b.mode), "WAW")
                races.append(Race(buf, kind, a.step, a.phase, oa.lane, oa.label,
                                  b.step, b.phase, ob.lane, ob.label, latent, max(0.0, overlap)))
    return HazardReport(races)


def _join(a, b) -> list[int]:
    return [x if x >= y else y for x, y in zip(a, b)]
