"""Races of a one-pass run: which access pairs to compare where, and the races as progressions.

- ``_RaceTpl`` and ``_pairs``: the compared access pairs of a window of consecutive
  segments, relative to the later access's segment, found by the same
  :func:`~simwar.analysis.hazards.candidate_pairs` the engine's analysis uses (cached per
  distinct window of shapes; a run's windows found in one pass over its segments,
  :meth:`RacePlan._fill`).
- :class:`RacePlan`: which pairs to check on which segments, and which op times the pass
  logs for them (windowed, or over all accesses when the program does not fit).
- ``_Rows``: the races of one pair over consecutive segments, as a progression (steps and
  op ids advance with the segment); :class:`FastHazards` holds them and answers as a
  :class:`~simwar.analysis.hazards.HazardReport` does, building races only as far as read
  (``_RaceList``).

The package docstring (:mod:`simwar.executors.fast`) says why the windows are exact.

Imports: numpy, simwar.analysis.hazards and the plan's types; must not import codegen or
execute (the pass calls this).
"""

from __future__ import annotations

import functools
import heapq
import itertools
from array import array

import numpy as np

from simwar.analysis.hazards import HazardReport, Race, candidate_pairs, race_kind
from simwar.core.frozen import Frozen, set_field
from simwar.executors.fast.plan import Plan


class _RaceTpl(Frozen):
    """A pair of accesses of a window of shapes, relative to the later access's segment."""

    __slots__ = ("buffer", "kind", "latent", "a_back", "a_dev", "a_sub", "a_label", "a_lane",
                 "a_phase", "b_dev", "b_sub", "b_label", "b_lane", "b_phase")

    def __init__(self, buffer: str, kind: str, latent: bool, a_back: int, a_dev: int, a_sub: int,
                 a_label: str, a_lane: str, a_phase: str, b_dev: int, b_sub: int, b_label: str,
                 b_lane: str, b_phase: str):
        set_field(self, "buffer", buffer)
        set_field(self, "kind", kind)
        set_field(self, "latent", latent)
        # a_back: segments between the earlier access's segment and the later's
        set_field(self, "a_back", a_back)
        set_field(self, "a_dev", a_dev)
        set_field(self, "a_sub", a_sub)  # index of the access within its op (ordering ties)
        set_field(self, "a_label", a_label)
        set_field(self, "a_lane", a_lane)
        set_field(self, "a_phase", a_phase)
        set_field(self, "b_dev", b_dev)
        set_field(self, "b_sub", b_sub)
        set_field(self, "b_label", b_label)
        set_field(self, "b_lane", b_lane)
        set_field(self, "b_phase", b_phase)


def _op_lists(shape) -> tuple:
    """A shape's device ops as :func:`_pairs` reads them: lanes, kinds, the ops bound to a
    record (a wait or sync: ``(index, op)``), and its accesses in order as columns (op
    index, buffer, mode, step offset, index within the op)."""
    ops = shape.ops
    binds = [(dev, op) for dev, op in enumerate(ops)
             if op.bound_op is not None or op.bind is not None]
    acc = [(dev, buf, mode, op.off, sub) for dev, op in enumerate(ops)
           for sub, (buf, mode) in enumerate(op.accesses)]
    columns = tuple(list(c) for c in zip(*acc)) if acc else ([], [], [], [], [])
    return [op.lane for op in ops], [op.kind for op in ops], binds, columns


def _pairs(shapes: list, steps: list, window: int, last_only: bool,
           latent_only: bool | None = None) -> list:
    """The compared access pairs of consecutive segments (``None``: a segment left out).

    ``steps``: each segment's step; ``last_only``: only latent pairs whose later access is in
    the last segment; ``latent_only`` (default: ``last_only``): only latent pairs, wherever
    their later access is. Runs :func:`~simwar.analysis.hazards.candidate_pairs` on the
    segments' ops; returns ``(pair, earlier segment, later segment)`` in its order.
    """
    if latent_only is None:
        latent_only = last_only
    lane: list = []
    kind: list = []
    bound: list = []
    where: list[tuple[int, int]] = []  # local op -> (segment, device op)
    acc_op: list[int] = []
    acc_buf: list = []
    acc_mode: list = []
    acc_step: list = []
    acc_sub: list = []
    base: list[int | None] = []
    lists: dict = {}  # a shape's ops as lists, made once per call (a window repeats shapes)
    for j, sh in enumerate(shapes):
        if sh is None:
            base.append(None)
            continue
        b0 = len(lane)
        base.append(b0)
        own = lists.get(id(sh))
        if own is None:
            own = lists[id(sh)] = _op_lists(sh)
        lanes, kinds, binds, (a_dev, a_buf, a_mode, a_off, a_sub) = own
        lane += lanes
        kind += kinds
        seg_bound = [-1] * len(lanes)
        for dev, op in binds:
            if op.bound_op is not None:
                seg_bound[dev] = b0 + op.bound_op
            else:
                jp = j - op.bind.back
                if jp >= 0 and shapes[jp] is not None:
                    seg_bound[dev] = base[jp] + shapes[jp].records[op.bind.record]
        bound += seg_bound
        where += [(j, dev) for dev in range(len(lanes))]
        acc_op += [b0 + dev for dev in a_dev]
        acc_buf += a_buf
        acc_mode += a_mode
        acc_step += [steps[j] + off for off in a_off]
        acc_sub += a_sub
    last = len(shapes) - 1
    out: list = []
    for i, k, latent in candidate_pairs(lane, kind, bound, acc_op, acc_buf, acc_mode, acc_step,
                                        window, latent_only=latent_only):
        ja, da = where[acc_op[i]]
        jb, db = where[acc_op[k]]
        if last_only and (jb != last or not latent):
            continue
        a, b = shapes[ja].ops[da], shapes[jb].ops[db]
        out.append((_RaceTpl(acc_buf[k], race_kind(acc_mode[i], acc_mode[k]), latent, jb - ja,
                             da, acc_sub[i], a.label, a.lane, a.phase, db, acc_sub[k], b.label,
                             b.lane, b.phase), ja, jb))
    return out


#: latent pairs per window of shapes (a window's pairs depend on its shapes only)
_WINDOWS: dict = {}
_WINDOWS_LIMIT = 512  # windows kept before the cache is emptied


def window_segments(plan: Plan, window: int) -> list[int | None]:
    """The block of each segment of the sequence a windowed race plan's one pass goes over
    (:meth:`RacePlan._fill`: each block cut to its first ``window + 1``; None: a segment of
    an unmarked block, left out)."""
    out: list[int | None] = []
    for bi, b in enumerate(plan.blocks):
        out += [bi if b.marked else None] * min(b.n, window + 1)
    return out


class RacePlan:
    """Which pairs to check where, which op times to log, and the races once run.

    *Windowed* (the program's steps are consecutive segments and every access belongs to
    its segment's step): pairs per distinct window of ``window + 1`` shapes, mapped onto
    segments; only latent pairs are kept, and only their ops' times are logged.
    *Full* (anything else): every access op's times are logged and all pairs are compared
    over the whole program, as :func:`~simwar.analysis.hazards.detect` does on a Trace.

    The pass asks it, per block, which op times to log (:meth:`logs_of`) and where
    (:meth:`log_arrays`, emptied by :meth:`reset` before each attempt); :meth:`finish` then
    turns the logged times into the races.
    """

    def __init__(self, plan: Plan, window: int, windows: dict | None = None):
        self.plan = plan
        self.window = window
        blocks = plan.blocks
        self.op_base: list[int] = []
        base = 0
        for b in blocks:
            self.op_base.append(base)
            base += b.n * len(b.shape.ops)
        self.windowed = self.fits(plan)
        self.logs: list[list[tuple[int, str]]] = [[] for _ in blocks]
        self.groups: list[tuple] = []  # (block, first pass, count, pairs)
        self.cache = _WINDOWS
        if self.windowed:
            self._plan_windows(windows)
        else:
            for bi, b in enumerate(blocks):
                self.logs[bi] = sorted({(d, w) for d, op in enumerate(b.shape.ops)
                                        if op.accesses for w in "se"})
        self.arrays: list[list[array]] = []

    @staticmethod
    def fits(plan: Plan) -> bool:
        """Whether the plan's races are windowed (see the class): its steps consecutive
        segments, every access its segment's step's."""
        blocks = plan.blocks
        marked = [b for b in blocks if b.marked]
        consecutive = all(isinstance(b.steps, range) for b in marked) and all(
            x.steps[-1] + 1 == y.steps[0] for x, y in zip(marked, marked[1:]))
        prefix_ok = all(b.marked or not any(op.accesses for op in b.shape.ops) for b in blocks)
        return not plan.negative and plan.offsets <= {0} and consecutive and prefix_ok

    # ---- planning
    def _segment(self, g: int) -> tuple[int, int]:
        """(block, pass) of segment ``g``."""
        lo, hi = 0, len(self.plan.blocks) - 1
        blocks = self.plan.blocks
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if blocks[mid].g0 <= g:
                lo = mid
            else:
                hi = mid - 1
        return lo, g - blocks[lo].g0

    def _plan_windows(self, windows: dict | None) -> None:
        """The pairs of each window, and the op times logged for them. ``windows``: the
        latent pairs of the pass over the run's segments (:meth:`_fill`'s, by the index of
        the later access's segment in :func:`window_segments`' sequence) where known (a
        family's, :mod:`simwar.executors.fast.famraces`), else found here."""
        w = self.window
        blocks = self.plan.blocks
        need: list[set] = [set() for _ in blocks]
        # the run's segments with each block cut to its first w + 1 (None: a prefix): every
        # window a segment of the run ends (the first w of each block, and the one standing
        # for the rest) is w + 1 consecutive ones of it, after w Nones standing for the
        # segments before the first. A run whose scheduler picks each step's shape is a
        # block or two per step, so this is per segment, not per window, and the windows
        # are looked up by their shapes' ids first (a run has few)
        seq: list = []
        first: list[int] = []  # per block: the index in seq of its first segment
        for b in blocks:
            first.append(len(seq))
            seq += [b.shape if b.marked else None] * min(b.n, w + 1)
        padded = [None] * w + seq
        mine: dict = {}  # windows of this plan by their shapes' ids
        parts: list[tuple] = []  # (block, pass, count, window's key, its ids, index in seq)
        for bi, b in enumerate(blocks):
            if not b.marked:
                continue
            counts = [(i, 1) for i in range(min(b.n, w))]
            if b.n > w:
                counts.append((w, b.n - w))
            for i, count in counts:
                c = first[bi] + i
                key = tuple(padded[c:c + w + 1])  # the shapes of segments g - w .. g
                ids = tuple(map(id, key))
                if ids not in mine:  # (as _fill takes it: the first segment of the window)
                    mine[ids] = (self.cache.get((key, w)) if windows is None
                                 else windows.get(c, []))
                parts.append((bi, i, count, key, ids, c))
        if any(tpls is None for tpls in mine.values()):
            self._fill(seq, parts, mine)
        for bi, i, count, _, ids, _ in parts:
            tpls = mine[ids]
            if not tpls:
                continue
            self.groups.append((bi, i, count, tpls))
            g = blocks[bi].g0 + i
            for r in tpls:
                need[bi].add((r.b_dev, "s"))
                abi, _ = self._segment(g - r.a_back) if i < w else (bi, None)
                need[abi].add((r.a_dev, "e"))
        self.logs = [sorted(x) for x in need]

    def _fill(self, seq: list, parts: list, mine: dict) -> None:
        """The latent pairs of the windows not cached, from one pass over ``seq``.

        A window's pairs are those of the pass whose later access is in the window's last
        segment: the pass compares the same accesses (steps at most ``window`` apart, the
        segments being consecutive steps) in the same order, and which happen before which
        is decided by the ops issued between the two, all in the window (a wait or sync
        bound to a record before the window, unbound in the window alone, learns nothing of
        an op issued after that record). So one pass over the run's segments stands for
        every window of them (``window + 1`` passes over each segment when each window is
        its own)."""
        w = self.window
        by_segment: dict[int, list] = {}
        for r, _, jb in _pairs(seq, list(range(len(seq))), w, False, latent_only=True):
            by_segment.setdefault(jb, []).append(r)
        for _, _, _, key, ids, c in parts:
            if mine[ids] is None:
                mine[ids] = tpls = by_segment.get(c, [])
                if len(self.cache) >= _WINDOWS_LIMIT:
                    self.cache.clear()
                self.cache[(key, w)] = tpls

    def logs_of(self, bi: int) -> tuple:
        """Block ``bi``'s logged op times: sorted ``(device op index, 's' | 'e')``."""
        return tuple(self.logs[bi])

    def reset(self, new_log=None, tally=None) -> None:
        """Empty logs for a run of the plan (one array per logged time of each block).

        ``new_log``: makes one log (default: an ``array('d')``; runs in lockstep log a list
        of arrays, one element per run); ``tally``: what :meth:`tally` counts into
        (:class:`simwar.executors.fast.counts.Tally`, or the lockstep executor's)."""
        self.arrays = [[(new_log or _new_log)() for _ in log] for log in self.logs]
        self.base = [0] * len(self.logs)  # passes of each block dropped from its logs
        self.cursor = [0] * len(self.groups)  # passes of each group counted
        self.tallied = tally  # what tally() counts into (summary-only runs, lockstep)

    def log_arrays(self, bi: int) -> list:
        """Block ``bi``'s log arrays, in the order of :meth:`logs_of`."""
        return self.arrays[bi]

    def _log(self, bi: int, dev: int, what: str) -> np.ndarray:
        arr = self.arrays[bi][self.logs[bi].index((dev, what))]
        return np.frombuffer(arr, dtype=np.float64) if len(arr) else np.zeros(0)

    # ---- counting as the run goes (summary-only runs)
    def tally(self, first: int | None, last: int | None) -> None:
        """Count the races whose two accesses are in the measured steps ``first..last`` seen
        so far (None: none yet) and whose later access is in a step up to ``last``, then drop
        the logged times no race still needs: the logs stay as short as the window of the
        run not yet summarized (windowed plans; :meth:`counted` gives the result)."""
        if not self.windowed or last is None:
            return
        w = self.window
        blocks = self.plan.blocks
        avail = [len(a[0]) + self.base[bi] if a else 0 for bi, a in enumerate(self.arrays)]
        for gi, (bi, i, count, tpls) in enumerate(self.groups):
            cur = self.cursor[gi]
            b = blocks[bi]
            b0 = b.steps[0] + i  # the later access's step at pass i of the block
            stop = min(count, last - b0 + 1, avail[bi] - i)
            if stop <= cur:
                continue
            for ri, r in enumerate(tpls):
                j0 = max(cur, first - b0 + r.a_back)  # the earlier access measured too
                if j0 >= stop:
                    continue
                s_b = self._window(bi, r.b_dev, "s", i + j0, i + stop)
                if i >= w:
                    e_a = self._window(bi, r.a_dev, "e", i + j0 - r.a_back,
                                       i + stop - r.a_back)
                else:
                    abi, ap = self._segment(b.g0 + i - r.a_back)
                    e_a = self._window(abi, r.a_dev, "e", ap, ap + 1)
                self.tallied.add(gi, ri, j0, b0 + j0, e_a - s_b)
            self.cursor[gi] = stop
        self._drop()

    def _window(self, bi: int, dev: int, what: str, lo: int, hi: int) -> np.ndarray:
        """Logged times of passes ``lo..hi-1`` of block ``bi`` (a copy)."""
        arr = self.arrays[bi][self.logs[bi].index((dev, what))]
        base = self.base[bi]
        return np.array(arr[lo - base:hi - base], dtype=np.float64)

    def _drop(self) -> None:
        """Drop each block's logged times that no group still to count needs."""
        w = self.window
        need = [None] * len(self.arrays)

        def keep(bi: int, p: int) -> None:
            need[bi] = p if need[bi] is None else min(need[bi], p)

        for gi, (bi, i, count, tpls) in enumerate(self.groups):
            cur = self.cursor[gi]
            if cur >= count:
                continue
            keep(bi, i + cur - (max(r.a_back for r in tpls) if i >= w else 0))
            if i < w:
                for r in tpls:
                    abi, ap = self._segment(self.plan.blocks[bi].g0 + i - r.a_back)
                    keep(abi, ap)
        for bi, arrays in enumerate(self.arrays):
            if not arrays:
                continue
            upto = len(arrays[0]) + self.base[bi] if need[bi] is None else need[bi]
            cut = upto - self.base[bi]
            if cut > 0:
                for arr in arrays:
                    del arr[:cut]
                self.base[bi] += cut

    def counted(self, first: int | None, last: int | None):
        """The races counted by :meth:`tally` up to the end of the run, over the measured
        steps ``first..last``."""
        self.tally(first, last)
        return self.tallied.result(self, first, last)

    # ---- results
    def finish(self, state) -> FastHazards:
        """The races of the run whose times were logged (``state``: the pass's state)."""
        if self.windowed:
            return self._finish_windowed()
        return self._finish_full()

    def _finish_windowed(self) -> FastHazards:
        """The races of each group as progressions: a pair's overlaps are its earlier
        access's end minus its later access's start, pass by pass. A group's are one
        subtraction over its pairs at once (gathered from a table of the block's logs, one
        row per logged time), the same differences, element by element, as one per pair."""
        w = self.window
        blocks = self.plan.blocks
        parts = []  # per group: its pairs' progressions (FastHazards makes the rows)
        tables: dict = {}

        def table(bi: int):
            """Block ``bi``'s logs as rows of one array (None: logs of unequal lengths),
            and the row of each logged time."""
            t = tables.get(bi)
            if t is None:
                logs = [np.frombuffer(a, dtype=np.float64) if len(a) else np.zeros(0)
                        for a in self.arrays[bi]]
                equal = bool(logs) and all(len(x) == len(logs[0]) for x in logs)
                t = tables[bi] = (np.vstack(logs) if equal else None,
                                  {key: k for k, key in enumerate(self.logs[bi])})
            return t

        for bi, i, count, tpls in self.groups:
            b = blocks[bi]
            nops = len(b.shape.ops)
            b_step = b.steps[0] + i
            logs, row = table(bi)
            s_rows = [row[(r.b_dev, "s")] for r in tpls]
            b_op = self.op_base[bi] + i * nops  # the later access's op id, but for its index
            if logs is not None and logs.shape[1] >= i + count and len(tpls) * count <= 1 << 20:
                a_back = np.array([r.a_back for r in tpls], dtype=np.int64)
                a_dev = np.array([r.a_dev for r in tpls], dtype=np.int64)
                if i >= w:  # the earlier accesses in the same block: one gather for the group
                    first = i - a_back
                    e_rows = np.array([row[(r.a_dev, "e")] for r in tpls])
                    overlaps = (logs[e_rows[:, None], first[:, None] + np.arange(count)]
                                - logs[s_rows, i:i + count])
                    parts.append((tpls, b_step, self.op_base[bi] + first * nops + a_dev, b_op,
                                  nops, overlaps))
                    continue
                # one pass (i < w): the earlier accesses in any block, a gather per segment
                ends = np.empty(len(tpls), dtype=np.float64)
                a_ops = np.empty(len(tpls), dtype=np.int64)
                for back in sorted(set(a_back.tolist())):
                    abi, ap = self._segment(b.g0 + i - back)
                    a_logs, a_row = table(abi)
                    if a_logs is None:
                        break
                    mine = np.flatnonzero(a_back == back)
                    a_ops[mine] = (self.op_base[abi] + ap * len(blocks[abi].shape.ops)
                                   + a_dev[mine])
                    ends[mine] = a_logs[[a_row[(d, "e")] for d in a_dev[mine].tolist()], ap]
                else:
                    parts.append((tpls, b_step, a_ops, b_op, nops,
                                  (ends - logs[s_rows, i])[:, None]))
                    continue
            # one pair at a time (logs of unequal lengths, or a table too large)
            where: list[tuple] = []  # per pair: its earlier access's block, pass and op id
            back: dict = {}  # segments back -> (block, pass, the pass's first op id)
            for r in tpls:
                seg = back.get(r.a_back)
                if seg is None:
                    abi, ap = self._segment(b.g0 + i - r.a_back) if i < w else (bi, i - r.a_back)
                    seg = back[r.a_back] = (abi, ap, self.op_base[abi]
                                            + ap * len(blocks[abi].shape.ops))
                where.append((seg[0], seg[1], seg[2] + r.a_dev))
            overlaps = [self._log(abi, r.a_dev, "e")[ap:ap + count]
                        - self._log(bi, r.b_dev, "s")[i:i + count]
                        for r, (abi, ap, _) in zip(tpls, where)]
            parts.append((tpls, b_step, [a_op for _, _, a_op in where], b_op, nops, overlaps))
        # (the buffers' order only when the races are listed: counting needs none)
        return FastHazards(None, self._first_shapes(), self.plan.lo, self.plan.hi, parts)

    def _finish_full(self) -> FastHazards:
        blocks = self.plan.blocks
        shapes: list = []
        steps: list = []
        for b in blocks:
            shapes += [b.shape] * b.n
            steps += list(b.steps)
        seg_block = [bi for bi, b in enumerate(blocks) for _ in range(b.n)]
        seg_pass = [i for b in blocks for i in range(b.n)]
        rows = []
        for r, ga, gb in _pairs(shapes, steps, self.window, False):
            e_a = self._log(seg_block[ga], r.a_dev, "e")[seg_pass[ga]]
            s_b = self._log(seg_block[gb], r.b_dev, "s")[seg_pass[gb]]
            overlap = float(e_a - s_b)
            if not r.latent and overlap <= 0:
                continue
            a_op = self.op_base[seg_block[ga]] + seg_pass[ga] * len(shapes[ga].ops) + r.a_dev
            b_op = self.op_base[seg_block[gb]] + seg_pass[gb] * len(shapes[gb].ops) + r.b_dev
            rows.append(_Rows(r, steps[ga] + shapes[ga].ops[r.a_dev].off,
                              steps[gb] + shapes[gb].ops[r.b_dev].off, a_op, b_op, 0,
                              np.array([overlap])))
        return FastHazards(rows, self._buffer_order(), self.plan.lo, self.plan.hi)

    def _buffer_order(self) -> dict:
        """Buffer -> (op id, access index) of its first access: the engine lists races so."""
        return self._first_shapes()()

    def _first_shapes(self):
        """What :meth:`_buffer_order` reads (op ids grow with the block, so a buffer's first
        access is in the first block of a shape that accesses it: each shape read once, at
        its first block), as a call that makes it (it keeps the shapes only)."""
        firsts: dict = {}
        for bi, b in enumerate(self.plan.blocks):
            firsts.setdefault(id(b.shape), (self.op_base[bi], b.shape))
        return functools.partial(_first_accesses, list(firsts.values()))


def _first_accesses(shapes: list[tuple]) -> dict:
    """Buffer -> (op id, access index) of its first access among ``(op id base, shape)``."""
    first: dict = {}
    for base, shape in shapes:
        for dev, op in enumerate(shape.ops):
            for sub, (buf, _) in enumerate(op.accesses):
                here = (base + dev, sub)
                if buf not in first or here < first[buf]:
                    first[buf] = here
    return first


class _Rows:
    """Races of one pair of a window over consecutive segments, as progressions.

    Race ``j`` (``0 <= j < len(overlap)``): steps ``a_step + j`` and ``b_step + j``, ops
    ``a_op + j * stride`` and ``b_op + j * stride``, overlap ``overlap[j]`` (> 0: observed).
    """

    __slots__ = ("pair", "a_step", "b_step", "a_op", "b_op", "stride", "overlap")

    def __init__(self, pair: _RaceTpl, a_step: int, b_step: int, a_op: int, b_op: int,
                 stride: int, overlap: np.ndarray):
        self.pair = pair
        self.a_step, self.b_step = int(a_step), int(b_step)
        self.a_op, self.b_op = int(a_op), int(b_op)
        self.stride = int(stride)
        self.overlap = overlap

    def __len__(self) -> int:
        return len(self.overlap)

    def within(self, first: int, last: int | None = None) -> _Rows | None:
        """The races whose two accesses belong to steps ``first..last`` (None: no end)."""
        # both accesses' steps advance with j (a hand-made program may label the earlier
        # access with the later step)
        j0 = max(0, first - self.a_step, first - self.b_step)
        j1 = len(self.overlap)
        if last is not None:
            j1 = min(j1, last - self.a_step + 1, last - self.b_step + 1)
        if j0 >= j1:
            return None
        if j0 == 0 and j1 == len(self.overlap):
            return self
        return _Rows(self.pair, self.a_step + j0, self.b_step + j0,
                     self.a_op + j0 * self.stride, self.b_op + j0 * self.stride, self.stride,
                     self.overlap[j0:j1])

    def at(self, j: int, overlap: np.ndarray) -> _Rows:
        """The races ``j, j + 1, ...`` of this progression, with these overlaps."""
        return _Rows(self.pair, self.a_step + j, self.b_step + j, self.a_op + j * self.stride,
                     self.b_op + j * self.stride, self.stride, overlap)

    def race(self, j: int) -> Race:
        r = self.pair
        ov = float(self.overlap[j])
        return Race(r.buffer, r.kind, self.a_step + j, r.a_phase, r.a_lane, r.a_label,
                    self.a_op + j * self.stride, self.b_step + j, r.b_phase, r.b_lane,
                    r.b_label, self.b_op + j * self.stride, r.latent, ov if ov > 0 else 0.0)

    def picks(self, which: str):
        """Indices of the races that are ``all``, ``latent`` or ``observed`` (a range or an
        array)."""
        if which == "observed":
            return np.flatnonzero(self.overlap > 0)
        if which == "latent" and not self.pair.latent:
            return range(0)
        return range(len(self.overlap))


class FastHazards:
    """Races of a one-pass run, kept as progressions; counted without building them.

    Quacks like :class:`~simwar.analysis.hazards.HazardReport`: ``races`` (the engine's
    list, in its order), ``latent`` and ``observed`` (sequences whose length, truth and
    first items cost no more than they show), ``since(step)``, ``within(steps)``,
    ``frame()``; and adds ``counts(first_step, last_step)`` for the summary.
    """

    def __init__(self, rows: list[_Rows] | None, buffer_order, lo: int, hi: int,
                 parts: list | None = None):
        # ``parts`` (rows None): per group of a windowed run, its pairs' progressions as
        # ``(pairs, later step, earlier op ids, later op id but for the pair's, stride,
        # overlaps: a row per pair)``, the rows made from them when first read; counted
        # without them (``_columns``)
        self._rows = rows
        self._parts = parts
        # buffer -> its first access (a dict, or what makes it when first read)
        self._order = buffer_order
        self._rank: dict | None = None
        self.lo, self.hi = lo, hi
        self._races: list[Race] | None = None
        self._cols: tuple | None = None  # the rows as columns (counts)

    def counts(self, first: int, last: int | None) -> tuple[int, int, int]:
        """``(races, overlaps, race steps)`` of the races within steps ``first..last``.

        Over every row at once: each row's part within the steps (``_Rows.within``'s
        ``j0..j1``), its overlaps counted from one running count of the positive overlaps of
        all rows laid end to end, the race steps as the size of the union of the latent rows'
        later steps (intervals sorted by start: each adds what reaches past the ones before
        it). Integers throughout: the same counts as row by row."""
        a, b, n, latent, off, positive = self._columns()
        j0 = np.minimum(n, np.maximum(0, np.maximum(first - a, first - b)))
        j1 = n if last is None else np.minimum(n, np.minimum(last - a + 1, last - b + 1))
        j1 = np.maximum(j0, j1)  # empty where it would end before it starts
        overlaps = int((positive[off + j1] - positive[off + j0]).sum())
        size = (j1 - j0)[latent]
        races = int(size.sum())
        lo = (b + j0)[latent][size > 0]
        hi = (b + j1)[latent][size > 0]
        if len(lo) == 0:
            return races, overlaps, 0
        order = np.argsort(lo, kind="stable")
        lo, hi = lo[order], hi[order]
        reach = np.maximum.accumulate(hi)  # the furthest step covered up to each interval
        before = np.concatenate(([lo[0]], reach[:-1]))
        steps = int(np.maximum(0, hi - np.maximum(lo, before)).sum())
        return races, overlaps, steps

    @property
    def buffer_order(self) -> dict:
        if callable(self._order):
            self._order = self._order()
        return self._order

    @property
    def rank(self) -> dict:
        """Buffer -> its rank in the races' order (by its first access)."""
        if self._rank is None:
            order = self.buffer_order
            self._rank = {buf: n for n, buf in enumerate(sorted(order, key=order.get))}
        return self._rank

    @property
    def rows(self) -> list[_Rows]:
        if self._rows is None:
            self._rows = [_Rows(r, b_step - r.a_back, b_step, a_op, b_op + r.b_dev, nops, ov)
                          for tpls, b_step, a_ops, b_op, nops, overlaps in self._parts
                          for r, a_op, ov in zip(tpls, a_ops, overlaps)]
        return self._rows

    def _columns(self) -> tuple:
        """The rows as columns (made once): their earlier and later steps, lengths, latent
        flags, where each starts among all overlaps laid end to end, and the running count
        of positive overlaps there (one more element than the overlaps)."""
        if self._cols is None and self._rows is None:
            self._cols = self._part_columns()
        if self._cols is None:
            rows = self.rows
            n = np.array([len(r.overlap) for r in rows], dtype=np.int64)
            off = np.zeros(len(rows), dtype=np.int64)
            if len(rows) > 1:
                np.cumsum(n[:-1], out=off[1:])
            flat = np.concatenate([r.overlap for r in rows]) if rows else np.zeros(0)
            positive = np.zeros(len(flat) + 1, dtype=np.int64)
            np.cumsum(flat > 0, out=positive[1:])
            self._cols = (np.array([r.a_step for r in rows], dtype=np.int64),
                          np.array([r.b_step for r in rows], dtype=np.int64), n,
                          np.array([r.pair.latent for r in rows], dtype=bool), off, positive)
        return self._cols

    def _part_columns(self) -> tuple:
        """:meth:`_columns` from the parts, the rows not made: the same integers."""
        a, b, n, latent, flat = [], [], [], [], []
        for tpls, b_step, _, _, _, overlaps in self._parts:
            a.append(b_step - np.array([r.a_back for r in tpls], dtype=np.int64))
            b.append(np.full(len(tpls), b_step, dtype=np.int64))
            n.append(np.full(len(tpls), overlaps.shape[1], dtype=np.int64)
                     if isinstance(overlaps, np.ndarray) else
                     np.array([len(ov) for ov in overlaps], dtype=np.int64))
            latent.append(np.array([r.latent for r in tpls], dtype=bool))
            flat += [overlaps.ravel()] if isinstance(overlaps, np.ndarray) else list(overlaps)
        n = np.concatenate(n) if n else np.zeros(0, dtype=np.int64)
        off = np.zeros(len(n), dtype=np.int64)
        if len(n) > 1:
            np.cumsum(n[:-1], out=off[1:])
        flat = np.concatenate(flat) if flat else np.zeros(0)
        positive = np.zeros(len(flat) + 1, dtype=np.int64)
        np.cumsum(flat > 0, out=positive[1:])
        return (np.concatenate(a) if a else np.zeros(0, dtype=np.int64),
                np.concatenate(b) if b else np.zeros(0, dtype=np.int64), n,
                np.concatenate(latent) if latent else np.zeros(0, dtype=bool), off, positive)

    def since(self, step: int) -> FastHazards:
        """Only races whose two accesses belong to steps >= ``step`` (as HazardReport)."""
        rows = [r for r in (row.within(step) for row in self.rows) if r is not None]
        return FastHazards(rows, self.buffer_order, self.lo, self.hi)

    def within(self, steps) -> FastHazards:
        """Only races whose two accesses belong to ``steps`` (consecutive steps)."""
        steps = sorted(steps)
        if not steps:
            return FastHazards([], self.buffer_order, self.lo, self.hi)
        rows = [r for r in (row.within(steps[0], steps[-1]) for row in self.rows)
                if r is not None]
        return FastHazards(rows, self.buffer_order, self.lo, self.hi)

    def _key(self, row: _Rows, j: int) -> tuple:
        r = row.pair
        return (self.rank[r.buffer], row.b_op + j * row.stride, r.b_sub,
                -(row.a_op + j * row.stride), -r.a_sub)

    def _ordered(self, which: str):
        """Races in the engine's order (per buffer, by later op, then earlier op nearest)."""
        def each(row: _Rows):
            picks = row.picks(which)
            for n in range(0, len(picks), 4096):  # lazily: a long run has millions
                part = picks[n:n + 4096]
                for j in (part if isinstance(part, range) else part.tolist()):
                    yield self._key(row, j), j, row

        return (row.race(j) for _, j, row in heapq.merge(*(each(r) for r in self.rows),
                                                         key=lambda item: item[0]))

    @property
    def races(self) -> list[Race]:
        if self._races is None:
            self._races = list(self._ordered("all"))
        return self._races

    @property
    def latent(self) -> _RaceList:
        return _RaceList(self, "latent")

    @property
    def observed(self) -> _RaceList:
        return _RaceList(self, "observed")

    def report(self) -> HazardReport:
        return HazardReport(list(self.races))

    def frame(self):
        return self.report().frame()


class _RaceList:
    """The latent or observed races of a :class:`FastHazards`, built only as far as read."""

    def __init__(self, hazards: FastHazards, which: str):
        self.hazards = hazards
        self.which = which

    def __len__(self) -> int:
        return sum(len(row.picks(self.which)) for row in self.hazards.rows)

    def __bool__(self) -> bool:
        return any(len(row.picks(self.which)) for row in self.hazards.rows)

    def __iter__(self):
        return self.hazards._ordered(self.which)

    def __getitem__(self, index):
        if isinstance(index, slice) and (index.start or 0) == 0 and index.step in (None, 1) \
                and index.stop is not None and index.stop >= 0:
            return list(itertools.islice(iter(self), index.stop))
        return list(self)[index]

    def __eq__(self, other) -> bool:
        return list(self) == list(other)

    def __repr__(self) -> str:
        return f"<{len(self)} {self.which} races>"


class _Intervals:
    """A union of half-open integer intervals, and its size (the steps some race is in)."""

    __slots__ = ("spans",)

    def __init__(self) -> None:
        self.spans: list[tuple[int, int]] = []

    def add(self, lo: int, hi: int) -> None:
        if hi > lo:
            self.spans.append((lo, hi))
            if len(self.spans) > 64:
                self.spans = self._merged()

    def _merged(self) -> list[tuple[int, int]]:
        out: list[list[int]] = []
        for lo, hi in sorted(self.spans):
            if out and lo <= out[-1][1]:
                out[-1][1] = max(out[-1][1], hi)
            else:
                out.append([lo, hi])
        return [(lo, hi) for lo, hi in out]

    def total(self) -> int:
        return sum(hi - lo for lo, hi in self._merged())


def _new_log() -> array:
    return array("d")
