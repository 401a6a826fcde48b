"""What a window's Perfetto events are made of apart from its times, steps and texts, made
once per distinct window structure (:mod:`simwar.plots.perfetto` writes the events).

A steady run streams windows of one structure: each window's span and op columns (kinds,
call kinds, lanes, string codes, op references, bound records) equal the window's before
it; only the times, the steps and the texts of step-named strings (``publish_ready[k]``,
the same code in each window) differ. :class:`WindowShape` holds what the export derives
from those columns alone: each lane's process and core spans (its tracks), the slices'
groups of alike spans and the recipes of their names (which codes, joined how), the spans
each op's flows bind to, the kernel each record captured, each lane's first and last
kernel, the waits and syncs that bind to records. :meth:`WindowShape.matches` tells whether
a later window has the same structure by comparing those columns (and the texts of the
lanes, whose processes the shape holds): relations are the columns' ids and codes, never a
label's text. What depends on the times (a lane whose spans overlap, so that its spans take
more than one track) is checked window by window, and such a window's groups are made anew.

Imports: numpy, simwar.core.trace, simwar.plots.jsoncols.
"""

from __future__ import annotations

import numpy as np

from simwar.core.trace import Call, OpKind, SpanKind
from simwar.plots.jsoncols import Text, choose, compose, constant, dense, group_order, present

__all__ = ["WindowShape", "KernelNeighbours", "slice_groups", "name_text"]

#: the columns that make a window's structure (what the shape is derived from)
SPAN_KEY = ("kind", "call", "lane", "phase", "site", "label", "op")
OP_KEY = ("kind", "lane", "event", "call", "bound", "label", "phase")


def _scalars(w) -> tuple:
    return (len(w.spans), len(w.ops), w.core_op, len(w.strings), w.code(""))


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Equal columns (one array: the trace mode hands alike windows the columns it made
    once, read-only)."""
    return a is b or np.array_equal(a, b)


class WindowShape:
    """The structure-only parts of one window's export (see the module docstring);
    ``pid_of``: the writer's process of each lane."""

    def __init__(self, w, pid_of: dict):
        sp, ops = w.spans, w.ops
        self.scalars = _scalars(w)
        self.columns = ([getattr(sp, c) for c in SPAN_KEY], [getattr(ops, c) for c in OP_KEY])
        self.span_core = w.span_core
        texts = w.strings + [""]
        self.none = len(texts) - 1  # the code of "" in the writer's table for a code of -1
        self.empty = w.code("")
        self.lanes = np.union1d(present(sp.lane), present(ops.lane)).tolist()
        self.lane_texts = [texts[c] for c in self.lanes]
        self.lane_pid = np.zeros(len(texts), dtype=np.int64)
        for c, lane in zip(self.lanes, self.lane_texts):
            self.lane_pid[c] = pid_of.get(lane, 0)
        self.pid = self.lane_pid[sp.lane]
        self.core = np.flatnonzero(w.span_core) if w.span_core is not None else \
            np.arange(len(sp))
        lanes = sp.lane[self.core]
        # each lane's core spans (its tracks are made from them, by their times)
        self.lane_spans = [(code, self.core[lanes == code]) for code in present(lanes).tolist()]
        self._groups = None
        self._flows = None
        self.hits = 0  # later windows of this structure
        self._forward: dict[int, np.ndarray] = {}

    def matches(self, w) -> bool:
        """Whether window ``w`` has this structure (its columns, codes and lanes equal)."""
        if _scalars(w) != self.scalars:
            return False
        if (w.span_core is None) != (self.span_core is None) or (
                w.span_core is not None and not _same(w.span_core, self.span_core)):
            return False
        spans, ops = self.columns
        if not all(_same(a, getattr(w.spans, c)) for a, c in zip(spans, SPAN_KEY)):
            return False
        if not all(_same(a, getattr(w.ops, c)) for a, c in zip(ops, OP_KEY)):
            return False
        strings = w.strings
        return all((strings[c] if c < len(strings) else "") == t
                   for c, t in zip(self.lanes, self.lane_texts))

    def groups(self, w) -> list:
        """:func:`slice_groups` of the core spans, each on its lane's first track (the
        usual case: a lane's spans never overlap), made once."""
        if self._groups is None:
            tid = np.ones(len(w.spans), dtype=np.int64)
            self._groups = slice_groups(w, self.core, self.pid, tid, self.none, self.empty)
        return self._groups

    def forward_kernels(self, w, forward: int) -> np.ndarray:
        """The core's kernel ops of a phase on lane ``forward`` (a code), ascending."""
        kern = self._forward.get(forward)
        if kern is None:
            ops = w.ops
            ids = np.arange(w.core_op, len(ops))
            kern = self._forward[forward] = ids[
                (ops.kind[ids] == OpKind.KERNEL) & (ops.lane[ids] == forward)
                & (ops.phase[ids] != self.empty)]
        return kern

    def flows(self, w) -> Flows:
        if self._flows is None:
            self._flows = Flows(w, self)
        return self._flows


def codes(values: np.ndarray, none: int) -> np.ndarray:
    """String codes for a :class:`~simwar.plots.jsoncols.Text`: -1 (no string) as ``none``."""
    return np.where(values >= 0, values, none).astype(np.int64)


# --------------------------------------------------------------------------- slices
def slice_groups(w, ids, pid, tid, none: int, empty: int) -> list:
    """The spans ``ids`` as groups of alike spans (process, track, kind, call kind, phase,
    site): per group ``(pid, tid, kind, call, phase, site, rows, name)``, ``rows`` its
    spans and ``name`` the recipe of their names (:func:`name_text`)."""
    if not len(ids):
        return []
    sp = w.spans
    kind, call = sp.kind[ids], sp.call[ids]
    phase, site = sp.phase[ids], sp.site[ids]
    # one small integer per alike group: the fields combined, made dense
    fields = [pid[ids], tid[ids], kind.astype(np.int64), call.astype(np.int64),
              dense(phase), dense(site)]
    key = np.zeros(len(ids), dtype=np.int64)
    for values in fields:
        key = key * (int(values.max()) + 1) + values
    key = dense(key)
    order = group_order(key)
    cuts = np.flatnonzero(np.diff(key[order])) + 1
    first = order[np.r_[0, cuts]]
    heads = np.stack([pid[ids][first], tid[ids][first], kind[first], call[first],
                      phase[first], site[first]], axis=1)
    out = []
    for g, part in zip(heads.tolist(), np.split(order, cuts)):
        p, t, k, c, ph, si = g
        sel = ids[part]
        out.append((p, t, k, c, ph, si, sel, _name_recipe(w, sel, k, c, none, empty)))
    return out


def _name_recipe(w, rows, kind: int, call: int, none: int, empty: int):
    """How the slice names of spans ``rows`` (all of one kind and call kind) are made: host
    calls by their call kind, label and op's lane, waits by what they wait for, others'
    labels. A recipe is a string, ``("take", codes)`` (the window's strings by code),
    ``("const", text, n)``, ``("choose", mask, a, b)`` or ``("compose", *parts)``."""
    sp, ops = w.spans, w.ops
    label = sp.label[rows]
    if call in (Call.WAIT_EVENT, Call.WAIT_STREAM, Call.RECORD, Call.SYNCHRONIZE):
        op = sp.op[rows]
        has = op >= 0
        safe = np.where(has, op, 0)
        event = np.where(has, ops.event[safe], -1)
        named = (event >= 0) & (event != empty)
        event_or_label = ("take", codes(np.where(named, event, label), none))
        if call in (Call.WAIT_STREAM, Call.WAIT_EVENT):
            lane = ("take", codes(np.where(has, ops.lane[safe], -1), none))
            lane_text = ("choose", has, lane, ("const", "?", len(rows)))
            if call == Call.WAIT_STREAM:
                return ("compose", lane_text, ".wait_stream(", ("take", codes(label, none)),
                        ")")
            return ("compose", lane_text, ".wait_event(", event_or_label, ")")
        word = "record " if call == Call.RECORD else "sync "
        return ("compose", word, event_or_label)
    if call == Call.NONE and kind == SpanKind.WAIT:
        op = sp.op[rows]
        has = op >= 0
        safe = np.where(has, op, 0)
        c = np.where(has, ops.call[safe], -1)
        by_stream = (c >= 0) & (sp.call[np.maximum(c, 0)] == Call.WAIT_STREAM)
        ev = ops.event[safe]
        what = np.where(by_stream, sp.label[np.maximum(c, 0)],
                        np.where((ev >= 0) & (ev != empty), ev, ops.label[safe]))
        named = ("compose", "wait for ", ("take", codes(what, none)))
        return ("choose", has, named, ("take", codes(label, none)))
    return ("take", codes(label, none))


def name_text(recipe, esc) -> Text | str:
    """A name recipe (:func:`_name_recipe`) made with the window's escaped strings ``esc``."""
    if isinstance(recipe, str):
        return recipe
    how = recipe[0]
    if how == "take":
        return Text(esc, recipe[1])
    if how == "const":
        return constant(recipe[1], recipe[2])
    if how == "choose":
        return choose(recipe[1], name_text(recipe[2], esc), name_text(recipe[3], esc))
    return compose(*(name_text(p, esc) for p in recipe[1:]))


# --------------------------------------------------------------------------- flows
class Flows:
    """The spans and ops a window's flows join: the first device span of each op, launches
    (host call to kernel), the kernel each record captured (the last issued on its lane
    before it), each lane's first and last kernel, the waits and syncs bound to records."""

    def __init__(self, w, shape: WindowShape):
        sp, ops = w.spans, w.ops
        n = len(ops)
        core = np.arange(w.core_op, n)
        op_span = np.full(n, -1, dtype=np.int64)
        kinds = sp.kind
        dev = np.flatnonzero((sp.op >= 0) & ((kinds == SpanKind.KERNEL)
                                             | (kinds == SpanKind.WAIT)
                                             | (kinds == SpanKind.BLOCKED)))
        op_span[sp.op[dev][::-1]] = dev[::-1]  # the first span of an op wins
        self.op_span = op_span
        # launch: each kernel from the host call that issued it
        is_kernel = ops.kind[core] == OpKind.KERNEL
        kern = core[is_kernel & (ops.call[core] >= 0)]
        kern = kern[op_span[kern] >= 0]
        self.launch_src, self.launch_dst = ops.call[kern].astype(np.int64), op_span[kern]
        self.launch_label = codes(sp.label[self.launch_src], shape.none)
        self.launch_graph = sp.call[self.launch_src] == Call.GRAPH_LAUNCH
        # the kernel each record captured: the last one issued on its lane before it
        neighbours = KernelNeighbours(ops, core)
        self.recs = core[ops.kind[core] == OpKind.RECORD]
        local = neighbours.before(self.recs)
        self.rec_has = local >= 0
        self.rec_kernel = op_span[local[self.rec_has]]
        self.rec_missing = np.flatnonzero(~self.rec_has)  # captured in an earlier window
        # each lane's first and last kernel (their spans)
        self.first_kernel: dict[int, int] = {}
        self.last_kernel: list[tuple[int, int]] = []
        lanes = ops.lane[core]
        for lane_code in np.unique(lanes).tolist():
            on = core[(lanes == lane_code) & is_kernel]
            if len(on):
                self.first_kernel[lane_code] = int(op_span[on[0]])
                self.last_kernel.append((lane_code, int(op_span[on[-1]])))
        # waits and syncs bound to a record, the spans they release, and for a wait that
        # never held its stream its lane's next kernel (-1: in a later window)
        self.users = {}
        for kind in (OpKind.WAIT, OpKind.SYNC):
            users = core[(ops.kind[core] == kind) & (ops.bound[core] >= 0)]
            dst = op_span[users]
            nk = np.full(len(users), -1, dtype=np.int64)
            later = dst < 0
            if kind == OpKind.WAIT and later.any():
                nk[later] = neighbours.after(users[later])
            self.users[kind] = (users, ops.bound[users].astype(np.int64), dst, nk,
                                codes(ops.event[users], shape.none))


class KernelNeighbours:
    """The kernel ops of each lane among the core ops ``core`` (ascending op ids), to find
    an op's neighbours on its lane: the last kernel issued before it and the first after it
    (-1: none). Only the ops asked about are looked up (records, and waits that never held
    their stream: a few per step)."""

    def __init__(self, ops, core: np.ndarray):
        self.lane = ops.lane
        self.span = len(ops) + 1  # lane * span + op id: by lane, then by op id
        kernels = core[ops.kind[core] == OpKind.KERNEL]
        keys = self.lane[kernels].astype(np.int64) * self.span + kernels
        self.keys = keys[group_order(self.lane[kernels])]  # ascending: ids ascend per lane
        self.kernels = self.keys % self.span

    def _at(self, ops: np.ndarray, shift: int) -> np.ndarray:
        if not len(self.keys):
            return np.full(len(ops), -1, dtype=np.int64)
        key = self.lane[ops].astype(np.int64) * self.span + ops
        i = np.searchsorted(self.keys, key) + shift  # the kernel just before or after it
        ok = (i >= 0) & (i < len(self.keys))
        i = np.where(ok, i, 0)
        ok &= self.keys[i] // self.span == key // self.span  # ... on its own lane
        return np.where(ok, self.kernels[i], -1)

    def before(self, ops: np.ndarray) -> np.ndarray:
        """Per op, the last kernel op issued on its lane before it."""
        return self._at(np.asarray(ops, dtype=np.int64), -1)

    def after(self, ops: np.ndarray) -> np.ndarray:
        """Per op (none a kernel), the first kernel op issued on its lane after it."""
        return self._at(np.asarray(ops, dtype=np.int64), 0)
