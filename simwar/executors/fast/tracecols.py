"""The rows of the trace mode's windows: a shape's host spans, ops, accesses and markers as
templates, filled from a chunk's recorded times and names into recorder columns.

- ``_Layout``: per shape, which recorded value (codegen's ``fn.layout``), name slot or
  constant fills each column of each row; ``_Piece``: passes of one block as run;
- ``_window``: the pieces of a window (its margin, then its core) as a
  :class:`~simwar.core.trace.TraceWindow`, ordered by the one rule of
  :func:`simwar.core.recorder.assemble`; :func:`join`: a run's windows back into one Trace.

:mod:`simwar.executors.fast.trace` runs the blocks and streams the windows.

Imports: numpy, simwar.core and the executor's plan.
"""

from __future__ import annotations

import bisect

import numpy as np

from simwar.core.recorder import assemble
from simwar.core.trace import (
    ACCESS_COLUMNS,
    HOST,
    MARKER_COLUMNS,
    OP_COLUMNS,
    SPAN_COLUMNS,
    Call,
    OpKind,
    SpanKind,
    TraceWindow,
    window_of,
)
from simwar.executors.fast.plan import MARKS, Plan
from simwar.executors.fast.records import param_slots

_INF = float("inf")


# --------------------------------------------------------------------------- layouts
class _Layout:
    """A shape's rows as templates: which recorded value, name slot or constant fills each
    column of its host spans, ops, accesses and markers (see :func:`_piece`)."""

    def __init__(self, shape, layout: tuple):
        col = {key: i for i, key in enumerate(layout)}
        self.nvalues = len(layout)
        hs: list[tuple] = []  # (kind, call, label, phase, site, op dev|-1, off, start, end)
        ops: list[tuple] = []  # (lane, kind, off, label, event, bound, issue, start, end,
        #                          phase, call span)
        acc: list[tuple] = []  # (dev, buffer, mode, off, phase)
        marks: list[tuple] = []  # run_batch, result_done: (off, time column, name)
        fact = 0  # the next name slot
        dev = 0
        param = 0  # the next parameter slot (codegen's order)
        self.cpu_params: dict[int, int] = {}  # host span index of CPU work -> its slot
        prev = col[("h", -1)]
        for hi, h in enumerate(shape.host):
            kind = h.kind
            if kind in MARKS:
                marks.append((h.off, prev, kind))
                continue
            end = col[("h", hi)]
            span = len(hs)
            param += param_slots(h)
            if kind == "cpu":
                self.cpu_params[span] = param - 1
                hs.append((SpanKind.CPU, Call.CPU, ("f", fact), "", "", -1, ("f", fact + 1),
                           prev, end))
                fact += 2
            elif kind == "launch":
                stream, off, label, phase = h.stream, h.off, h.label, h.phase
                hs.append((SpanKind.API, Call.LAUNCH, label, phase, "", dev, off, prev, end))
                ops.append((stream, OpKind.KERNEL, off, label, "", -1, end, col[("s", dev)],
                            col[("e", dev)], phase, span))
                acc += [(dev, b, m, off, phase) for b, m in h.accesses]
                dev += 1
            elif kind == "graph":
                stream, off = h.stream, h.off
                hs.append((SpanKind.API, Call.GRAPH_LAUNCH, ("f", fact), ("f", fact + 1), "",
                           dev, off, prev, end))
                fact += 2
                for node in h.nodes:
                    if node.kind == "r":
                        ev = ("f", fact)
                        fact += 1
                        r = col[("r", dev)]
                        ops.append((stream, OpKind.RECORD, off, ev, ev, -1, end, r, r, "", span))
                    else:
                        ops.append((stream, OpKind.KERNEL, off, node.label, "", -1, end,
                                    col[("s", dev)], col[("e", dev)], node.phase, span))
                        acc += [(dev, b, m, off, node.phase) for b, m in node.accesses]
                    dev += 1
            elif kind == "record":
                stream, off = h.stream, h.off
                ev = ("f", fact)
                fact += 1
                hs.append((SpanKind.API, Call.RECORD, ev, "", "", dev, off, prev, end))
                r = col[("r", dev)]
                ops.append((stream, OpKind.RECORD, off, ev, ev, -1, end, r, r, "", span))
                dev += 1
            elif kind == "wait_stream":
                stream, other, off = h.stream, h.other, h.off
                name = h.tail_event
                hs.append((SpanKind.API, Call.WAIT_STREAM, other, "", "", dev + 1, off, prev,
                           end))
                r = col[("r", dev)]
                ops.append((other, OpKind.RECORD, off, name, name, -1, end, r, r, "", span))
                ops.append((stream, OpKind.WAIT, off, name, name, ("own", dev), end,
                            col[("s", dev + 1)], col[("e", dev + 1)], "", span))
                dev += 2
            elif kind == "wait_event":
                stream, off, bind = h.stream, h.off, h.bind
                ev = ("f", fact)
                fact += 1
                hs.append((SpanKind.API, Call.WAIT_EVENT, ev, "", "", dev, off, prev, end))
                bound = -1 if bind is None else ("back", bind.back, bind.record)
                ops.append((stream, OpKind.WAIT, off, ev, ev, bound, end, col[("s", dev)],
                            col[("e", dev)], "", span))
                dev += 1
            elif kind == "sync":
                off, site, bind = h.off, h.site, h.bind
                ev = ("f", fact)
                fact += 1
                hs.append((SpanKind.BLOCKED, Call.SYNCHRONIZE, ev, "", site, dev, off, prev,
                           end))
                bound = -1 if bind is None else ("back", bind.back, bind.record)
                ops.append((HOST, OpKind.SYNC, off, ev, ev, bound, prev, prev, end, "", span))
                dev += 1
            else:  # pragma: no cover
                raise AssertionError(kind)
            prev = end
        self.hs, self.ops, self.acc, self.marks = hs, ops, acc, marks
        self.ndev = dev
        self.nfacts = fact
        self.start = col[("h", -1)]
        self.end = prev  # the host clock after the segment


# --------------------------------------------------------------------------- windows
class _Strings:
    """One window's string table (code 0 is the empty text, as the recorder's)."""

    def __init__(self) -> None:
        self.strings: list[str] = [""]
        self.codes: dict[str, int] = {"": 0}

    def code(self, text: str) -> int:
        c = self.codes.get(text)
        if c is None:
            c = self.codes[text] = len(self.strings)
            self.strings.append(str(text))
        return c

    def column(self, values: list) -> np.ndarray:
        codes, strings = self.codes, self.strings
        # the texts not seen yet, in order of first appearance, coded in one go; then every
        # value's code by a mapping at C speed (no Python loop over the values)
        new = [v for v in dict.fromkeys(values) if v not in codes]
        codes.update(zip(new, range(len(strings), len(strings) + len(new))))
        strings.extend(new)
        return np.fromiter(map(codes.__getitem__, values), dtype=np.int32, count=len(values))


class _Piece:
    """Passes ``i0 .. i0+n`` of one block as run: their recorded values and names."""

    __slots__ = ("bi", "i0", "n", "vals", "facts", "op0", "steps", "idle")

    def __init__(self, bi, i0, n, vals, facts, op0, steps, idle=None):
        self.bi, self.i0, self.n, self.vals = bi, i0, n, vals
        self.facts, self.op0, self.steps = facts, op0, steps
        #: host span index -> per pass, whether that CPU work drew no time (the builder
        #: issues none then: a config's skeleton holds it for every draw)
        self.idle = idle or {}

    def tail(self, n: int, ndev: int) -> _Piece:
        """Its last ``n`` passes (``ndev``: ops per pass)."""
        k = self.n - n
        facts = [f if not isinstance(f, (list, np.ndarray)) else f[k:] for f in self.facts]
        return _Piece(self.bi, self.i0 + k, n, self.vals[k:], facts, self.op0 + k * ndev,
                      self.steps[k:], {j: v[k:] for j, v in self.idle.items()})


def _fact(spec, facts: list):
    """A layout entry's value: a constant, or the piece's fact slot ``("f", j)``."""
    return facts[spec[1]] if isinstance(spec, tuple) else spec


def _grid(columns: list, n: int, dtype) -> np.ndarray:
    """Rows of passes by columns of a layout, flattened in issue order."""
    if not columns:
        return np.zeros(0, dtype=dtype)
    out = np.empty((n, len(columns)), dtype=dtype)
    # the constants of every row at once (most of a layout's entries), then the columns
    varying = [j for j, c in enumerate(columns) if isinstance(c, (np.ndarray, list))]
    if len(varying) < len(columns):
        out[:] = np.asarray([0 if isinstance(c, (np.ndarray, list)) else c for c in columns],
                            dtype=dtype)
    for j in varying:
        out[:, j] = columns[j]
    return out.ravel()


def _piece(p: _Piece, run: dict, win_op0: int, hs0: int, strings: _Strings):
    """The host spans, ops, accesses and markers of one piece, as recorder columns."""
    lay: _Layout = run["layouts"][p.bi]
    plan: Plan = run["plan"]
    n, D, V, F = p.n, lay.ndev, p.vals, p.facts
    steps = p.steps
    code = strings.code
    slots: dict[int, np.ndarray] = {}

    def text(spec):
        """A text column's codes: a constant's code, or a name slot's (coded once: a slot
        names a host span, its op's label and its event alike)."""
        if not isinstance(spec, tuple):
            return code(spec)
        value = F[spec[1]]
        if isinstance(value, str):
            return code(value)
        codes = slots.get(spec[1])
        if codes is None:
            codes = slots[spec[1]] = strings.column(value)
        return codes

    passes = np.arange(n, dtype=np.int64)
    ops_at = (p.op0 - win_op0) + passes * D  # each pass's first op, in the window
    nh = len(lay.hs)
    host = {"lane": np.full(n * nh, code(HOST), dtype=np.int32)}
    if nh:
        hs = lay.hs
        host["label"] = _grid([text(h[2]) for h in hs], n, np.int32)
        host["kind"] = _grid([h[0] for h in hs], n, np.int8)
        host["step"] = _grid([_fact(h[6], F) if isinstance(h[6], tuple) else steps + h[6]
                              for h in hs], n, np.int32)
        host["start_us"] = V[:, [h[7] for h in hs]].ravel()
        host["end_us"] = V[:, [h[8] for h in hs]].ravel()
        host["phase"] = _grid([text(h[3]) for h in hs], n, np.int32)
        host["site"] = _grid([code(h[4]) for h in hs], n, np.int32)
        host["op"] = _grid([ops_at + h[5] if h[5] >= 0 else -1 for h in hs], n, np.int64)
        host["call"] = _grid([h[1] for h in hs], n, np.int8)
    else:
        host = {name: np.zeros(0, dtype=dtype) for name, dtype, _ in SPAN_COLUMNS}
    renumber = None
    if p.idle:
        drop = np.zeros((n, nh), dtype=bool)
        for span, idle in p.idle.items():
            drop[:, span] = idle
        drop = drop.ravel()
        if drop.any():
            keep = ~drop
            renumber = np.cumsum(keep) - 1
            host = {name: v[keep] for name, v in host.items()}
    ops: dict = {}
    if D:
        lo = lay.ops
        ops["lane"] = _grid([code(o[0]) for o in lo], n, np.int32)
        ops["kind"] = _grid([o[1] for o in lo], n, np.int8)
        ops["step"] = _grid([steps + o[2] for o in lo], n, np.int32)
        ops["label"] = _grid([text(o[3]) for o in lo], n, np.int32)
        ops["event"] = _grid([text(o[4]) for o in lo], n, np.int32)
        ops["bound"] = _grid([_bound(o[5], p, run, ops_at, win_op0) for o in lo], n, np.int64)
        ops["issue_us"] = V[:, [o[6] for o in lo]].ravel()
        ops["start_us"] = V[:, [o[7] for o in lo]].ravel()
        ops["end_us"] = V[:, [o[8] for o in lo]].ravel()
        ops["phase"] = _grid([code(o[9]) for o in lo], n, np.int32)
        call = _grid([passes * nh + o[10] for o in lo], n, np.int64)
        ops["call"] = hs0 + (call if renumber is None else renumber[call])
    else:
        ops = {name: np.zeros(0, dtype=dtype) for name, dtype, _ in OP_COLUMNS}
        ops["start_us"], ops["end_us"] = np.zeros(0), np.zeros(0)
    acc: dict = {}
    if lay.acc:
        la = lay.acc
        acc["op"] = _grid([ops_at + a[0] for a in la], n, np.int64)
        acc["buffer"] = _grid([code(a[1]) for a in la], n, np.int32)
        acc["mode"] = _grid([int(a[2]) for a in la], n, np.int8)
        acc["step"] = _grid([steps + a[3] for a in la], n, np.int32)
        acc["phase"] = _grid([code(a[4]) for a in la], n, np.int32)
    else:
        acc = {name: np.zeros(0, dtype=dtype) for name, dtype, _ in ACCESS_COLUMNS}
    marked = plan.blocks[p.bi].marked
    mk_name = ([code("step")] if marked else []) + [code(m[2]) for m in lay.marks]
    mk_step = ([steps] if marked else []) + [steps + m[0] for m in lay.marks]
    mk_time = ([V[:, lay.start]] if marked else []) + [V[:, m[1]] for m in lay.marks]
    marks = {"name": _grid(mk_name, n, np.int32), "step": _grid(mk_step, n, np.int32),
             "time_us": _grid(mk_time, n, np.float64)}
    return host, ops, acc, marks


def _bound(spec, p: _Piece, run: dict, ops_at: np.ndarray, win_op0: int):
    """A wait's or sync's bound record, as a window op id per pass (-2: before the window)."""
    if spec == -1:
        return -1
    if spec[0] == "own":
        return ops_at + spec[1]
    _, back, rec = spec
    blocks, op_base, layouts = run["plan"].blocks, run["op_base"], run["layouts"]
    b = blocks[p.bi]
    out = np.empty(p.n, dtype=np.int64)
    D = layouts[p.bi].ndev
    i = p.i0 + np.arange(p.n)
    same = i >= back
    if same.any():  # bound within the block: a record of the same shape
        out[same] = op_base[p.bi] + (i[same] - back) * D + b.shape.records[rec] - win_op0
    for k in np.flatnonzero(~same).tolist():
        g = b.g0 + p.i0 + k - back
        if g < 0:
            out[k] = -1
            continue
        bj = bisect.bisect_right(run["g0s"], g) - 1
        j = g - blocks[bj].g0
        out[k] = (op_base[bj] + j * layouts[bj].ndev + blocks[bj].shape.records[rec]
                  - win_op0)
    out[out < 0] = -2
    return out


def _window(run: dict, kept: list[_Piece], core: _Piece, clock: float, below: float,
            is_last: bool) -> TraceWindow:
    pieces = kept + [core]
    strings = _Strings()
    win_op0 = pieces[0].op0
    parts = []
    hs0 = 0
    for p in pieces:
        part = _piece(p, run, win_op0, hs0, strings)
        hs0 += len(part[0]["step"])
        parts.append(part)
    host, ops, acc, marks = ({name: np.concatenate([part[k][name] for part in parts])
                              for name in parts[0][k]} for k in range(4))
    if is_last:
        marks = {"name": np.append(marks["name"], strings.code("end")),
                 "step": np.append(marks["step"], -1),
                 "time_us": np.append(marks["time_us"], run["state"].t)}
    n_ops = len(ops["kind"])
    # an op reference past the window (a graph launch of no nodes, last): not in it
    host["op"][host["op"] >= n_ops] = -2
    core_op = core.op0 - win_op0
    core_hs = len(host["step"]) - len(parts[-1][0]["step"])
    host_core = np.arange(len(host["step"])) >= core_hs
    kind, start, end = ops["kind"], ops["start_us"], ops["end_us"]
    device = np.flatnonzero((kind == OpKind.KERNEL) | ((kind == OpKind.WAIT) & (end > start)))
    steps = np.concatenate([host["step"], ops["step"][device]])
    issue = np.argsort(steps, kind="stable")  # as assemble orders them
    flags = np.concatenate([host_core, device >= core_op])[issue]
    marker_core = np.arange(len(marks["step"])) >= (len(marks["step"])
                                                    - len(parts[-1][3]["step"])
                                                    - (1 if is_last else 0))
    trace = assemble(host, ops, acc, marks, strings.strings, run["meta"])
    return TraceWindow(trace.spans, trace.ops, trace.accesses, trace.markers, trace.strings,
                       trace.meta, op_base=win_op0, core_op=core_op, span_core=flags,
                       marker_core=marker_core, complete_below=below,
                       clock=-_INF if run["plan"].negative else clock, first=win_op0 == 0,
                       last=is_last, span_issue=issue)


def join(parts) -> TraceWindow:
    """The windows of one run put back together: the whole run's Trace (as a window that is
    all core), equal to the SimPy engine's."""
    strings = _Strings()
    host: dict = {c: [] for c, _, _ in SPAN_COLUMNS}
    ops: dict = {c: [] for c, _, _ in OP_COLUMNS}
    acc: dict = {c: [] for c, _, _ in ACCESS_COLUMNS}
    marks: dict = {c: [] for c, _, _ in MARKER_COLUMNS}
    meta = {}
    hs_seen = 0
    for w in parts:
        meta = w.meta
        remap = np.asarray([strings.code(x) for x in w.strings] + [0], dtype=np.int32)
        sp, op = w.spans, w.ops
        mine = w.span_core & (sp.call != Call.NONE)  # host spans, by issue order
        ids = np.flatnonzero(mine)
        order = ids[np.argsort(w.span_issue[ids], kind="stable")]
        new_call = np.full(len(sp), -1, dtype=np.int64)
        new_call[order] = hs_seen + np.arange(len(order))
        hs_seen += len(order)
        base = w.op_base
        for c, _, how in SPAN_COLUMNS:
            v = getattr(sp, c)[order]
            if how == "str":
                v = remap[v]
            elif c == "op":
                v = np.where(v >= 0, v + base, v)
            host[c].append(v)
        sel = slice(w.core_op, len(op))
        for c, _, how in OP_COLUMNS:
            v = getattr(op, c)[sel]
            if how == "str":
                v = remap[v]
            elif c == "bound":
                v = np.where(v >= 0, v + base, v)
            elif c == "call":
                v = np.where(v >= 0, new_call[np.maximum(v, 0)], -1)
            ops[c].append(v)
        a = w.accesses
        keep = a.op >= w.core_op
        for c, _, how in ACCESS_COLUMNS:
            v = getattr(a, c)[keep]
            v = remap[v] if how == "str" else (v + base if c == "op" else v)
            acc[c].append(v)
        m = w.markers
        for c, _, how in MARKER_COLUMNS:
            v = getattr(m, c)[w.marker_core]
            marks[c].append(remap[v] if how == "str" else v)
    cat = {k: {c: np.concatenate(v) for c, v in d.items()}
           for k, d in (("host", host), ("ops", ops), ("acc", acc), ("marks", marks))}
    trace = assemble(cat["host"], cat["ops"], cat["acc"], cat["marks"], strings.strings, meta)
    return window_of(trace)
