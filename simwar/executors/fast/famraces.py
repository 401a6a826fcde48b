"""The race windows of a family's members from one pass over their union.

A family's members (``advise``'s candidates that differ only in where read-done is
published, :mod:`simwar.executors.fast.union`) run the same accesses: every access is on a
kernel of the backbone, which every member has, and the accesses compared (one buffer,
different lanes, not both reads, steps at most ``window`` apart: the scan of
:func:`~simwar.analysis.hazards.candidate_pairs`) depend only on those. What differs is
which of them happen before which: the records, waits and syncs around the backbone, and
what each member binds them to. So the pass that finds a run's race windows
(:meth:`~simwar.executors.fast.races.RacePlan._fill`: one pass over its segments, each block
cut to its first ``window + 1``) is made once for the family over the unions of its blocks,
the vector clocks of every member side by side (an array of a row per member): each union op
ticks and joins the clocks of the members that have it (the others' rows are left as they
were, as their own pass never sees the op), a wait or sync joins the clock of the op each
member binds it to, and each compared pair's latent flag is one comparison over the rows.
A member's windows are then the latent pairs of its row, in the pass's order, as templates
of its own ops (:func:`family_windows`): the pairs, order and flags its own pass gives,
the same integers compared (``tests/test_family_races.py`` holds each member's race plan
equal to its own, for the families of shipped configs and a custom algorithm).

Where it does not apply (a block without a union, an access on an op not every member has,
a member whose race plan is not windowed) the members' race plans are their own, as before.

Imports: numpy, simwar.core's kinds, :mod:`simwar.analysis.hazards` (the race kinds) and
the executor's races and union (what it feeds).
"""

from __future__ import annotations

import numpy as np

from simwar.analysis.hazards import race_kind
from simwar.core.kinds import Mode, OpKind
from simwar.executors.fast.races import RacePlan, _RaceTpl, window_segments


def family_race_plans(plans: list, unions: list | None, window: int,
                      pairs: FamilyPairs | None = None) -> list[RacePlan]:
    """Each member's :class:`RacePlan`, its windows from the family's one pass where it
    can (see the module; ``pairs``: that pass, where made already), else its own."""
    if pairs is None and unions is not None:
        pairs = family_pairs(plans, unions, window)
    given = pairs.windows() if pairs is not None else None
    if given is None:
        return [RacePlan(p, window) for p in plans]
    return [RacePlan(p, window, windows=g) for p, g in zip(plans, given)]


def family_windows(plans: list, unions: list, window: int) -> list[dict | None] | None:
    """Per member, its latent pairs by the index of the later access's segment in the
    sequence :func:`~simwar.executors.fast.races.window_segments` makes of its plan (what
    :class:`RacePlan` takes as ``windows``; None for a member whose plan is not windowed),
    or None where the family's pass does not apply."""
    pairs = family_pairs(plans, unions, window)
    return None if pairs is None else pairs.windows()


class FamilyPairs:
    """The family's one pass: its segments' union ops (``shapes``, ``base``: each segment's
    first op), accesses and latent pairs (``found``: ``(i, k, latent rows)``), and each
    member's op of each union op (``inv``, per block)."""

    def __init__(self, plans, unions, window, seq_blocks, shapes, base, inv, acc, found):
        self.plans, self.unions, self.window = plans, unions, window
        self.seq_blocks, self.shapes, self.base, self.inv = seq_blocks, shapes, base, inv
        self.acc, self.found = acc, found

    def where(self, i: int, k: int) -> tuple[int, int, int, int]:
        """``(ja, jb, ua, ub)``: the segments and union ops of accesses ``i`` and ``k``."""
        a_op, b_op = self.acc[i][0], self.acc[k][0]
        ja, jb = _segment_of(self.base, a_op), _segment_of(self.base, b_op)
        return ja, jb, a_op - self.base[ja], b_op - self.base[jb]

    def logs(self) -> dict[int, set]:
        """Per block, the union's op times some member's race plan logs (each member's own
        where every window of its plan is its own segment's: :meth:`own_windows`)."""
        out: dict[int, set] = {}
        for i, k, _ in self.found:
            ja, jb, ua, ub = self.where(i, k)
            out.setdefault(self.seq_blocks[jb], set()).add((ub, "s"))
            out.setdefault(self.seq_blocks[ja], set()).add((ua, "e"))
        return out

    def own_windows(self) -> bool:
        """Whether each member's race plan takes every window from its own segment (none
        stands for another of the same shapes, :meth:`RacePlan._plan_windows`)."""
        w = self.window
        for p in self.plans:
            seq = [None] * w + [None if bi is None or not p.blocks[bi].marked
                                else p.blocks[bi].shape for bi in self.seq_blocks]
            keys = [tuple(map(id, seq[c:c + w + 1])) for c in range(len(self.seq_blocks))]
            if len(set(keys)) != len(keys):
                return False
        return True

    def windows(self, only: int | None = None) -> list[dict | None]:
        """:func:`family_windows`' (``only``: that member's alone, the others None)."""
        return _templates(self, only)


def family_pairs(plans: list, unions: list, window: int) -> FamilyPairs | None:
    """The family's one pass (:class:`FamilyPairs`), or None where it does not apply."""
    first = plans[0]
    seq_blocks = window_segments(first, window)  # block index per segment (None: a prefix)
    if any(bi is not None and unions[bi] is None for bi in seq_blocks):
        return None
    n = len(plans)
    shapes = [None if bi is None else unions[bi].shape for bi in seq_blocks]
    # per block: each member's device op index of each union op (-1: it has none)
    inv: dict[int, np.ndarray] = {}
    for bi in {bi for bi in seq_blocks if bi is not None}:
        u = unions[bi]
        table = np.full((n, len(u.shape.ops)), -1, dtype=np.int64)
        for m in range(n):
            devs = u.maps[m][1]
            table[m, devs] = np.arange(len(devs))
        inv[bi] = table
    # the union ops of every segment, in order, with what each member binds them to
    lane: list = []
    kind: list = []
    present: list = []  # per op: a row mask of the members that have it (None: all)
    bound: dict[int, np.ndarray] = {}  # op -> per member, the op it is bound to (-1: none)
    acc: list[tuple] = []  # (op, buffer, mode, step, sub) in op order
    bound_ops: dict = {}  # a member shape's id -> its waits and syncs bound to an op
    base: list[int | None] = []
    for j, sh in enumerate(shapes):
        if sh is None:
            base.append(None)
            continue
        b0 = len(lane)
        base.append(b0)
        bi = seq_blocks[j]
        table = inv[bi]
        for ud, op in enumerate(sh.ops):
            lane.append(op.lane)
            kind.append(op.kind)
            col = table[:, ud]
            every = bool((col >= 0).all())
            present.append(None if every else col >= 0)
            if op.accesses and not every:
                return None  # an access not every member makes
            acc += [(b0 + ud, buf, mode, j + op.off, sub)
                    for sub, (buf, mode) in enumerate(op.accesses)]
        for m, p in enumerate(plans):
            own = p.blocks[bi].shape
            devs = unions[bi].maps[m][1]
            binds = bound_ops.get(id(own))
            if binds is None:
                binds = bound_ops[id(own)] = [(d, op) for d, op in enumerate(own.ops)
                                              if op.bound_op is not None or op.bind is not None]
            for d, op in binds:
                if op.bound_op is not None:
                    target = b0 + devs[op.bound_op]
                else:
                    jp = j - op.bind.back
                    if jp < 0 or shapes[jp] is None:
                        continue
                    pb = seq_blocks[jp]
                    rec = plans[m].blocks[pb].shape.records[op.bind.record]
                    target = base[jp] + unions[pb].maps[m][1][rec]
                row = bound.get(b0 + devs[d])
                if row is None:
                    row = bound[b0 + devs[d]] = np.full(n, -1, dtype=np.int64)
                row[m] = target
    found = _latent_pairs(lane, kind, present, bound, acc, window, n)
    return FamilyPairs(plans, unions, window, seq_blocks, shapes, base, inv, acc, found)


def _templates(fp: FamilyPairs, only: int | None) -> list[dict | None]:
    """Each member's templates, of its own ops (a template equal for several members made
    once)."""
    n = len(fp.plans)
    out: list[dict | None] = [{} if RacePlan.fits(p) and only in (None, m) else None
                              for m, p in enumerate(fp.plans)]
    made: dict = {}
    members = np.arange(n)
    shapes, inv, seq_blocks, acc = fp.shapes, fp.inv, fp.seq_blocks, fp.acc
    for i, k, latent in fp.found:
        _, buf, a_mode, _, a_sub = acc[i]
        _, _, b_mode, _, b_sub = acc[k]
        ja, jb, ua, ub = fp.where(i, k)
        a, b = shapes[ja].ops[ua], shapes[jb].ops[ub]
        das = inv[seq_blocks[ja]][:, ua]
        dbs = inv[seq_blocks[jb]][:, ub]
        what = race_kind(a_mode, b_mode)
        for m in (members[latent].tolist() if only is None else
                  [only] if latent[only] else []):
            got = out[m]
            if got is None:
                continue
            key = (i, k, int(das[m]), int(dbs[m]))
            tpl = made.get(key)
            if tpl is None:
                tpl = made[key] = _RaceTpl(buf, what, True, jb - ja, key[2], a_sub, a.label,
                                           a.lane, a.phase, key[3], b_sub, b.label, b.lane,
                                           b.phase)
            got.setdefault(jb, []).append(tpl)
    return out


def _segment_of(base: list, op: int) -> int:
    """The segment (index into ``base``) of union op ``op``."""
    j = len(base) - 1
    while base[j] is None or base[j] > op:
        j -= 1
    return j


def _latent_pairs(lane_of: list, kind_of: list, present: list, bound: dict, acc: list,
                  window: int, n: int) -> list[tuple]:
    """``(i, k, latent)`` for every pair :func:`~simwar.analysis.hazards.candidate_pairs`
    compares (accesses ``i`` before ``k``, in its order) that is latent for some member:
    ``latent`` a row mask of those. Its one pass, the clocks of ``n`` members at once (see
    the module); the scan over each buffer's accesses in reach is its own, for accesses
    whose steps never decrease (the sequence's: segments in order, offsets 0)."""
    steps = [a[3] for a in acc]
    if any(y < x for x, y in zip(steps, steps[1:])):
        raise ValueError("accesses whose steps decrease")
    lanes = sorted(set(lane_of), key=str)
    index = {code: i for i, code in enumerate(lanes)}
    width = len(lanes)
    host = np.zeros((n, width), dtype=np.int64)
    lane_clock = {code: np.zeros((n, width), dtype=np.int64) for code in lanes}
    kept: dict[int, np.ndarray] = {}  # an op some member binds to -> its clocks
    targets = {int(t) for row in bound.values() for t in row.tolist() if t >= 0}
    members = np.arange(n)
    reach: dict = {}  # buffer -> (every access in reach, the writes in reach)
    out: list[tuple] = []
    ai = 0
    READ = Mode.READ
    SYNC, WAIT = OpKind.SYNC, OpKind.WAIT
    n_acc = len(acc)
    for op_id, (lane, kind, has) in enumerate(zip(lane_of, kind_of, present)):
        b = bound.get(op_id)
        if kind == SYNC:
            if b is not None:
                joined = _join_bound(host, kept, b, members)
                host = joined if has is None else np.where(has[:, None], joined, host)
            continue
        v = np.maximum(lane_clock[lane], host)
        if kind == WAIT and b is not None:
            v = _join_bound(v, kept, b, members)
        li = index[lane]
        v[:, li] += 1
        lane_clock[lane] = v if has is None else np.where(has[:, None], v, lane_clock[lane])
        if op_id in targets:
            kept[op_id] = v
        while ai < n_acc and acc[ai][0] == op_id:
            _, buf, mode, step, _ = acc[ai]
            pair = reach.get(buf)
            if pair is None:
                pair = reach[buf] = ([], [])
            every, writes = pair
            floor = step - window
            every[:] = [e for e in every if e[3] >= floor]
            writes[:] = [e for e in writes if e[3] >= floor]
            entry = (ai, op_id, mode, step, lane, v)
            for a, a_op, _, _, a_lane, a_clock in reversed(writes if mode == READ else every):
                if a_lane == lane or a_op == op_id:
                    continue
                la = index[a_lane]
                latent = a_clock[:, la] > v[:, la]
                if latent.any():
                    out.append((a, ai, latent))
            every.append(entry)
            if mode != READ:
                writes.append(entry)
            ai += 1
    return out


def _join_bound(v: np.ndarray, kept: dict, bound: np.ndarray, members: np.ndarray
                ) -> np.ndarray:
    """``v`` joined, row by row, with the clock of the op each member is bound to (a row
    of a member bound to none left as it is)."""
    out = v.copy()
    for target in set(bound.tolist()):
        if target < 0:
            continue
        rows = members[bound == target]
        out[rows] = np.maximum(v[rows], kept[target][rows])
    return out
