"""Race detection on a Trace: latent races by happens-before, observed overlaps by time.

Happens-before is built with vector clocks, as PyTorch's CUDA stream
sanitizer does: one component per lane (each stream), and a clock per host
thread (what it has synchronized with). Walking ``trace.ops`` in host issue order:

- a stream operation joins the clock of the host thread that issued it (it was
  issued after everything that thread had already synchronized with), then
  ticks its lane;
- a stream wait also joins the clock of the record it bound to;
- a host synchronize joins the clock of the op it bound to (a record; for a
  capture's blocking copy, the copy) into its thread's.

A simulated program has one host thread; a capture's other threads, blocking copies,
device-wide syncs and in-graph record nodes are :mod:`simwar.analysis.happens_before`'s,
on the same :func:`candidate_pairs`.

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

Imports: the standard library, numpy and simwar.core (``frame()`` imports pandas lazily).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from simwar.core.frozen import MutableRecord
from simwar.core.kinds import Mode, OpKind

if TYPE_CHECKING:
    from simwar.core.trace import Trace  # annotations only: a run keeps no Trace


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


class HazardReport(MutableRecord):
    """The races of a run (:class:`Race`), in the order found."""

    _fields = ("races",)

    def __init__(self, races: list[Race] | None = None):
        self.races = [] if races is None else races

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
    (the pairs of :func:`candidate_pairs`, with their times), in :func:`race_order`."""
    ops, acc = trace.ops, trace.accesses
    strings = trace.strings
    order = np.argsort(acc.op, kind="stable")
    a_op, a_buf, a_mode = acc.op[order], acc.buffer[order], acc.mode[order]
    a_step, a_phase = acc.step[order], acc.phase[order]
    rank = _first_seen(a_buf)
    # Python lists: the loop reads a few items per pair, and a pair costs a few numpy scalar
    # reads otherwise (a step of P reading phases has O(P) pairs, most of them ordered)
    start_of, end_of = ops.start_us.tolist(), ops.end_us.tolist()
    lane_of, label_of = ops.lane.tolist(), ops.label.tolist()
    ops_l, bufs_l, modes_l = a_op.tolist(), a_buf.tolist(), a_mode.tolist()
    steps_l, phases_l = a_step.tolist(), a_phase.tolist()
    found: list[tuple] = []
    for i, j, latent in candidate_pairs(ops.lane, ops.kind, ops.bound, a_op, a_buf, a_mode,
                                        a_step, window):
        first, second = ops_l[i], ops_l[j]
        overlap = end_of[first] - start_of[second]
        if not latent and overlap <= 0:
            continue
        found.append((race_order(rank[bufs_l[j]], j, i), Race(
            strings[bufs_l[j]], race_kind(modes_l[i], modes_l[j]), steps_l[i],
            strings[phases_l[i]], strings[lane_of[first]], strings[label_of[first]], first,
            steps_l[j], strings[phases_l[j]], strings[lane_of[second]],
            strings[label_of[second]], second, latent, max(0.0, overlap))))
    found.sort(key=lambda item: item[0])
    return HazardReport([race for _, race in found])


def race_order(buffer_rank: int, second: int, first: int) -> tuple:
    """The order races are listed in: per buffer (in order of its first access), by the
    later access (in issue order), then by the earlier access, nearest first. Accesses are
    indices into the accesses sorted by op id."""
    return (buffer_rank, second, -first)


def _first_seen(buffers) -> dict[int, int]:
    """Buffer code -> rank of its first access (accesses in op order)."""
    codes, first = np.unique(np.asarray(buffers), return_index=True)
    return {int(c): r for r, c in enumerate(codes[np.argsort(first, kind="stable")])}


def race_kind(first_mode: int, second_mode: int) -> str:
    """WAR, RAW or WAW by issue order (earlier access, then later)."""
    return {(Mode.READ, Mode.WRITE): "WAR", (Mode.WRITE, Mode.READ): "RAW"}.get(
        (first_mode, second_mode), "WAW")


def candidate_pairs(lane_of, kind_of, bound_of, acc_op, acc_buf, acc_mode, acc_step,
                    window: int = 2, latent_only: bool = False, host_of=None,
                    clocks: bool = False):
    """The access pairs :func:`detect` compares, with their latent flag.

    Ops are given per op id (issue order): ``lane_of`` (any hashable codes), ``kind_of``
    (:class:`OpKind`), ``bound_of`` (the op a wait or sync bound to, -1: none: a record, or
    for a sync any device op the host waited for, as a blocking copy's); accesses sorted by
    op id: ``acc_op``, ``acc_buf``, ``acc_mode``, ``acc_step`` (lists or numpy arrays).
    ``host_of``: per op, the host thread that issued it (any hashable codes; None: one
    thread issued every op, as in a simulated program). Yields ``(i, j, latent)`` (indices
    into the accesses, ``i`` issued before ``j``) for every pair on one buffer, on different
    lanes, not both reads, whose steps differ by at most ``window``, scanning from ``j`` back
    to the nearest earlier access and stopping at the first one more than ``window`` steps
    before it (``latent_only``: the latent ones only, for a caller that drops the rest); in
    issue order of ``j`` (sort with :func:`race_order` for the listed order).
    With ``clocks``, ``(i, j, latent, known)``: ``known`` is how many ops of ``i``'s lane
    happen-before ``j`` (``i``'s own op is that lane's op number ``known + 1`` or later when
    latent; 0: none), what a report names the missing edge by. Every executor's race list
    comes from here (the trace's, the fast executor's per iteration shape, and a
    capture's, :mod:`simwar.analysis.happens_before`), so they cannot disagree on which
    pairs count.

    One pass in issue order: each lane's vector clock (stream order, record→wait edges, host
    syncs; as PyTorch's CUDA sanitizer) is joined and ticked per op; each host thread has its
    own clock (what it has synchronized with), which the ops it issues join and its syncs
    advance; an op's clock is kept only until the last wait or sync bound to it; each buffer
    keeps the accesses the scan can still reach (when access steps never decrease in issue
    order, those of the last ``window`` steps, and its writes apart: a read scans only those),
    so a long trace is analysed in bounded memory and in time linear in its accesses plus the
    pairs found (a step of P reading phases costs O(P), not O(P²)).
    """
    n_ops = len(lane_of)
    lanes = sorted({int(x) if isinstance(x, np.integer) else x for x in _values(lane_of)},
                   key=str)
    index = {code: i for i, code in enumerate(lanes)}
    n = len(index)
    host = [0] * n
    hosts: dict = {}  # host thread -> its clock, while another thread issues
    thread = None
    lane_clock = {code: [0] * n for code in index}
    # per record, the last op bound to it (-1: none), and the records in that order
    bounds = np.asarray(bound_of, dtype=np.int64)
    users = np.flatnonzero(bounds >= 0)
    last_use = np.full(n_ops, -1, dtype=np.int64)
    np.maximum.at(last_use, bounds[users], users)
    kept = np.flatnonzero(last_use >= 0)
    kept = kept[np.argsort(last_use[kept], kind="stable")]
    free_at = last_use[kept]
    del bounds, users
    free = 0
    rec_clock: dict[int, tuple[int, ...]] = {}
    steps = np.asarray(acc_step)
    prune = bool(len(steps) < 2 or np.all(steps[1:] >= steps[:-1]))  # steps never decrease
    accesses = zip(_values(acc_op), _values(acc_buf), _values(acc_mode), _values(acc_step))
    nxt = next(accesses, None)
    ai = 0
    hist: dict = {}  # buffer -> [(access index, op, mode, step, lane, clock)]
    READ = Mode.READ
    SYNC, WAIT = OpKind.SYNC, OpKind.WAIT
    threads = itertools.repeat(None) if host_of is None else _values(host_of)
    for op_id, lane, kind, bound, by in zip(range(n_ops), _values(lane_of), _values(kind_of),
                                            _values(bound_of), threads):
        if by != thread:  # another host thread issues: its own clock
            hosts[thread] = host
            host = hosts.get(by) or [0] * n
            thread = by
        if kind == SYNC:
            if bound >= 0:
                host = _join(host, rec_clock[bound])
        else:
            v = _join(lane_clock[lane], host)
            if kind == WAIT and bound >= 0:
                v = _join(v, rec_clock[bound])
            v[index[lane]] += 1
            lane_clock[lane] = v
            if last_use[op_id] >= 0:  # a record (or an op a sync waited for) bound to later
                rec_clock[op_id] = tuple(v)
            while nxt is not None and nxt[0] == op_id:
                _, buf, b_mode, b_step = nxt
                entry = (ai, op_id, b_mode, b_step, lane, tuple(v))
                if prune:
                    # steps never decrease: the accesses in reach are the last ones, and a
                    # read is compared with writes only, so it scans the buffer's writes
                    pair = hist.get(buf)
                    if pair is None:
                        pair = hist[buf] = (_Reach(), _Reach())
                    every, writes = pair
                    floor = b_step - window
                    every.drop_below(floor)
                    writes.drop_below(floor)
                    src = writes if b_mode == READ else every
                    items = src.items
                    for k in range(len(items) - 1, src.start - 1, -1):
                        a, a_op, a_mode, a_step, a_lane, a_clock = items[k]
                        if a_lane == lane or a_op == op_id:
                            continue
                        la = index[a_lane]
                        latent = a_clock[la] > v[la]
                        if latent or not latent_only:
                            yield (a, ai, latent, v[la]) if clocks else (a, ai, latent)
                    every.items.append(entry)
                    if b_mode != READ:
                        writes.items.append(entry)
                else:
                    h = hist.setdefault(buf, [])
                    k = len(h) - 1
                    while k >= 0:
                        a, a_op, a_mode, a_step, a_lane, a_clock = h[k]
                        if b_step - a_step > window:
                            break
                        k -= 1
                        if a_step - b_step > window:
                            continue
                        if a_mode == READ and b_mode == READ:
                            continue
                        if a_lane == lane or a_op == op_id:
                            continue
                        la = index[a_lane]
                        latent = a_clock[la] > v[la]
                        if latent or not latent_only:
                            yield (a, ai, latent, v[la]) if clocks else (a, ai, latent)
                    h.append(entry)
                ai += 1
                nxt = next(accesses, None)
        while free < len(kept) and free_at[free] == op_id:
            rec_clock.pop(int(kept[free]), None)
            free += 1


class _Reach:
    """A buffer's accesses still in reach (steps never decrease): ``items[start:]``.

    Accesses fall out of reach from the front, ``window`` steps behind the newest; the
    dropped prefix is deleted once it is as long as what is kept (amortized O(1)).
    """

    __slots__ = ("items", "start")

    def __init__(self) -> None:
        self.items: list = []
        self.start = 0

    def drop_below(self, step: int) -> None:
        items, i = self.items, self.start
        while i < len(items) and items[i][3] < step:
            i += 1
        if i > 64 and 2 * i > len(items):
            del items[:i]
            i = 0
        self.start = i


def _values(seq, size: int = 1 << 15):
    """The items of a list, or of a numpy array as Python numbers a chunk at a time."""
    if not isinstance(seq, np.ndarray):
        yield from seq
        return
    for lo in range(0, len(seq), size):
        yield from seq[lo:lo + size].tolist()


def _join(a, b) -> list[int]:
    return [x if x >= y else y for x, y in zip(a, b)]
