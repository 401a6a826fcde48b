"""The rows of the trace mode's windows: a shape's host spans, ops, accesses and markers as
templates, filled from a chunk's recorded times and names into recorder columns.

- ``_Layout``: per shape, which recorded value (codegen's ``fn.layout``), name slot or
  constant fills each column of each row; ``_Piece``: passes of one block as run;
- ``_window``: the pieces of a window (its margin, then its core) as a
  :class:`~simwar.core.trace.TraceWindow`, ordered by the one rule of
  :func:`simwar.core.recorder.assemble`; :func:`join`: a run's windows back into one Trace;
- ``_Strings``: a window's string table, where :class:`Named` columns (a template's names
  over consecutive steps) are coded by their steps, their texts never hashed;
- ``_Reuse``: a window's columns by its structure (its pieces, text codes and idle CPU
  work, :func:`_signature`): a later window of that structure, its steps the same shifted
  and its waits holding their streams alike, takes them (shared, read-only) with its own
  steps and times, read at the same places among its recorded values (a steady run's
  windows: made once, not per window).

:mod:`simwar.executors.fast.trace` runs the blocks and streams the windows.

Imports: numpy, simwar.core and the executor's plan.
"""

from __future__ import annotations

import bisect
import itertools

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
    Table,
    TraceWindow,
    window_of,
)
from simwar.executors.fast.plan import MARKS
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
        #: the furthest back a wait or sync of the shape binds (passes)
        self.back = max((o[5][1] for o in ops if isinstance(o[5], tuple) and o[5][0] == "back"),
                        default=0)
        self.start = col[("h", -1)]
        self.end = prev  # the host clock after the segment


# --------------------------------------------------------------------------- windows
class Named(list):
    """Names of one template over consecutive steps: ``head + str(k) + tail`` for the steps
    ``k`` from ``first`` on (``first`` >= 0), as :mod:`simwar.executors.fast.trace` makes
    them. :class:`_Strings` codes them by their steps, with no text hashed (a slice of one is
    a plain list)."""

    __slots__ = ("head", "tail", "first")

    def __init__(self, names, head: str, tail: str, first: int):
        super().__init__(names)
        self.head, self.tail, self.first = head, tail, first


def _step_of(text: str, head: str, tail: str) -> int | None:
    """The step ``k`` whose name ``head + str(k) + tail`` is ``text`` (None: none)."""
    n = len(text) - len(tail)
    if n <= len(head) or not text.startswith(head) or not text.endswith(tail):
        return None
    digits = text[len(head):n]
    # a step's text: ASCII digits, no leading zero (steps are numpy int64: 19 digits at most)
    if len(digits) > 19 or not (digits.isascii() and digits.isdigit()):
        return None
    k = int(digits)
    return k if str(k) == digits else None


class _Strings:
    """One window's string table (code 0 is the empty text, as the recorder's).

    Each text has one code, the first it was given, in order of coding; the texts in
    ``codes``, and the names of :class:`Named` columns as runs of consecutive steps coded
    consecutively (a window's names of a step's template: thousands of new texts, whose
    hashing and insertion in ``codes`` cost most of their coding), found by their steps."""

    def __init__(self) -> None:
        self.strings: list[str] = [""]
        self.codes: dict[str, int] = {"": 0}
        #: per template (head, tail): its runs [first step, last step, first step's code]
        self.runs: dict[tuple[str, str], list[list[int]]] = {}
        #: per template: how many of ``codes`` were read, and the steps of its names there
        self._plain: dict[tuple[str, str], tuple[int, dict[int, int]]] = {}

    def _find(self, text: str) -> int | None:
        c = self.codes.get(text)
        if c is None and self.runs:
            for (head, tail), runs in self.runs.items():
                k = _step_of(text, head, tail)
                if k is not None:
                    for lo, hi, c0 in runs:
                        if lo <= k <= hi:
                            return c0 + k - lo
        return c

    def code(self, text: str) -> int:
        c = self.codes.get(text)
        if c is None and self.runs:
            c = self._find(text)
        if c is None:
            c = self.codes[text] = len(self.strings)
            self.strings.append(str(text))
        return c

    def column(self, values: list) -> np.ndarray:
        if type(values) is Named and self._apart(values.head, values.tail):
            return self._named(values)
        codes, strings = self.codes, self.strings
        # the usual names of a step's template: every text new and each once (a mapping made
        # in one pass, then checked), coded in order
        first = len(strings)
        if values and not self.runs and values[0] not in codes:
            fresh = dict(zip(values, range(first, first + len(values))))
            if len(fresh) == len(values) and codes.keys().isdisjoint(fresh.keys()):
                codes.update(fresh)
                strings.extend(values)
                return np.arange(first, first + len(values), dtype=np.int32)
        # each value's code where it has one (a slot a step behind another of its template:
        # all but one), mapped at C speed; the texts not seen yet coded in order of first
        # appearance
        got = list(map(codes.get, values))
        if None in got:
            for i in [i for i, c in enumerate(got) if c is None]:
                c = self._find(values[i])  # new here, but maybe earlier in this column
                if c is None:
                    c = codes[values[i]] = len(strings)
                    strings.append(values[i])
                got[i] = c
        return np.array(got, dtype=np.int32)

    def _apart(self, head: str, tail: str) -> bool:
        """No other template's run can hold a name of this one (heads and tails unrelated)."""
        for h, t in self.runs:
            if ((h, t) != (head, tail) and (h.startswith(head) or head.startswith(h))
                    and (t.endswith(tail) or tail.endswith(t))):
                return False
        return True

    def _named(self, values: Named) -> np.ndarray:
        """A :class:`Named` column's codes: a step's name coded already keeps its code (in a
        run of its template, or in ``codes``), the others coded in order of their steps (as
        they come), as runs."""
        key = (values.head, values.tail)
        first, n = values.first, len(values)
        out = np.full(n, -1, dtype=np.int64)
        runs = self.runs.setdefault(key, [])
        for lo, hi, c0 in runs:
            a, b = max(lo, first), min(hi, first + n - 1)
            if a <= b:
                out[a - first:b - first + 1] = np.arange(c0 + a - lo, c0 + b - lo + 1)
        read, steps = self._plain.get(key, (0, {}))
        if read < len(self.codes):  # the texts coded since: which are names of the template
            for text, c in itertools.islice(self.codes.items(), read, None):
                k = _step_of(text, *key)
                if k is not None:
                    steps[k] = c
            self._plain[key] = (len(self.codes), steps)
        for k, c in steps.items():
            if 0 <= k - first < n:
                out[k - first] = c
        new = np.flatnonzero(out < 0)
        if len(new):
            code = len(self.strings)
            # (the usual: one run of new names, its steps consecutive)
            blocks = [new] if new[-1] - new[0] == len(new) - 1 else \
                np.split(new, np.flatnonzero(np.diff(new) != 1) + 1)
            for block in blocks:
                i, j = int(block[0]), int(block[-1]) + 1
                runs.append([first + i, first + j - 1, code])
                self.strings.extend(values[i:j])
                out[i:j] = np.arange(code, code + j - i)
                code += j - i
        return out.astype(np.int32)


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


def _texts(p: _Piece, run: dict, strings: _Strings) -> dict:
    """The codes of a piece's text columns in ``strings``, per column a list over the
    layout's entries (a constant's code, or a name slot's codes per pass): coded in the
    order :func:`_piece` makes its columns, so that a window's string table is in the order
    of its structure (alike windows code alike)."""
    lay: _Layout = run["layouts"][p.bi]
    F = p.facts
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

    out = {"h.lane": code(HOST)}
    if lay.hs:
        hs = lay.hs
        out["h.label"] = [text(h[2]) for h in hs]
        out["h.phase"] = [text(h[3]) for h in hs]
        out["h.site"] = [code(h[4]) for h in hs]
    if lay.ndev:
        lo = lay.ops
        out["o.lane"] = [code(o[0]) for o in lo]
        out["o.label"] = [text(o[3]) for o in lo]
        out["o.event"] = [text(o[4]) for o in lo]
        out["o.phase"] = [code(o[9]) for o in lo]
    if lay.acc:
        out["a.buffer"] = [code(a[1]) for a in lay.acc]
        out["a.phase"] = [code(a[4]) for a in lay.acc]
    marked = run["plan"].blocks[p.bi].marked
    out["m.name"] = ([code("step")] if marked else []) + [code(m[2]) for m in lay.marks]
    return out


def _times(p: _Piece, lay: _Layout, marked: bool, V: np.ndarray, keep) -> dict:
    """A piece's time columns read off its recorded values ``V`` (a row per pass; ``keep``:
    the host spans drawn, or None for all): host spans' start and end, ops' issue, start and
    end, markers' time. Given the places of the values instead, the places of the times."""
    out = {}
    if lay.hs:
        hs = lay.hs
        start = V[:, [h[7] for h in hs]].ravel()
        end = V[:, [h[8] for h in hs]].ravel()
        out["h.start_us"], out["h.end_us"] = (start, end) if keep is None else \
            (start[keep], end[keep])
    if lay.ndev:
        lo = lay.ops
        out["o.issue_us"] = V[:, [o[6] for o in lo]].ravel()
        out["o.start_us"] = V[:, [o[7] for o in lo]].ravel()
        out["o.end_us"] = V[:, [o[8] for o in lo]].ravel()
    mk_time = ([V[:, lay.start]] if marked else []) + [V[:, m[1]] for m in lay.marks]
    out["m.time_us"] = _grid(mk_time, p.n, np.float64)
    return out


def _piece(p: _Piece, run: dict, win_op0: int, hs0: int, T: dict):
    """The host spans, ops, accesses and markers of one piece, as recorder columns (``T``:
    its text columns' codes, :func:`_texts`); and which host spans were drawn (None: all)."""
    lay: _Layout = run["layouts"][p.bi]
    n, D, F = p.n, lay.ndev, p.facts
    steps = p.steps
    passes = np.arange(n, dtype=np.int64)
    ops_at = (p.op0 - win_op0) + passes * D  # each pass's first op, in the window
    nh = len(lay.hs)
    keep = None
    if p.idle:
        drop = np.zeros((n, nh), dtype=bool)
        for span, idle in p.idle.items():
            drop[:, span] = idle
        drop = drop.ravel()
        if drop.any():
            keep = ~drop
    marked = run["plan"].blocks[p.bi].marked
    times = _times(p, lay, marked, p.vals, keep)
    host = {"lane": np.full(n * nh, T["h.lane"], dtype=np.int32)}
    if nh:
        hs = lay.hs
        host["label"] = _grid(T["h.label"], n, np.int32)
        host["kind"] = _grid([h[0] for h in hs], n, np.int8)
        host["step"] = _grid([_fact(h[6], F) if isinstance(h[6], tuple) else steps + h[6]
                              for h in hs], n, np.int32)
        host["phase"] = _grid(T["h.phase"], n, np.int32)
        host["site"] = _grid(T["h.site"], n, np.int32)
        host["op"] = _grid([ops_at + h[5] if h[5] >= 0 else -1 for h in hs], n, np.int64)
        host["call"] = _grid([h[1] for h in hs], n, np.int8)
    else:
        host = {name: np.zeros(0, dtype=dtype) for name, dtype, _ in SPAN_COLUMNS}
    renumber = None
    if keep is not None:
        renumber = np.cumsum(keep) - 1
        host = {name: v[keep] for name, v in host.items()}
    if nh:
        host["start_us"], host["end_us"] = times["h.start_us"], times["h.end_us"]
    ops: dict = {}
    if D:
        lo = lay.ops
        ops["lane"] = _grid(T["o.lane"], n, np.int32)
        ops["kind"] = _grid([o[1] for o in lo], n, np.int8)
        ops["step"] = _grid([steps + o[2] for o in lo], n, np.int32)
        ops["label"] = _grid(T["o.label"], n, np.int32)
        ops["event"] = _grid(T["o.event"], n, np.int32)
        ops["bound"] = _grid([_bound(o[5], p, run, ops_at, win_op0) for o in lo], n, np.int64)
        ops["issue_us"] = times["o.issue_us"]
        ops["start_us"] = times["o.start_us"]
        ops["end_us"] = times["o.end_us"]
        ops["phase"] = _grid(T["o.phase"], n, np.int32)
        call = _grid([passes * nh + o[10] for o in lo], n, np.int64)
        ops["call"] = hs0 + (call if renumber is None else renumber[call])
    else:
        ops = {name: np.zeros(0, dtype=dtype) for name, dtype, _ in OP_COLUMNS}
        ops["start_us"], ops["end_us"] = np.zeros(0), np.zeros(0)
    acc: dict = {}
    if lay.acc:
        la = lay.acc
        acc["op"] = _grid([ops_at + a[0] for a in la], n, np.int64)
        acc["buffer"] = _grid(T["a.buffer"], n, np.int32)
        acc["mode"] = _grid([int(a[2]) for a in la], n, np.int8)
        acc["step"] = _grid([steps + a[3] for a in la], n, np.int32)
        acc["phase"] = _grid(T["a.phase"], n, np.int32)
    else:
        acc = {name: np.zeros(0, dtype=dtype) for name, dtype, _ in ACCESS_COLUMNS}
    mk_step = ([steps] if marked else []) + [steps + m[0] for m in lay.marks]
    marks = {"name": _grid(T["m.name"], n, np.int32), "step": _grid(mk_step, n, np.int32),
             "time_us": times["m.time_us"]}
    return (host, ops, acc, marks), keep


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


#: window structures kept for reuse (a steady run streams one; its first windows are
#: others, let go once a later structure comes)
_REUSE = 4


def _window(run: dict, kept: list[_Piece], core: _Piece, clock: float, below: float,
            is_last: bool) -> TraceWindow:
    pieces = kept + [core]
    strings = _Strings()
    T = [_texts(p, run, strings) for p in pieces]
    end_code = strings.code("end") if is_last else None
    win_op0 = pieces[0].op0
    cache = run.get("reuse")
    sig = None
    if cache is not None and not is_last:
        sig = _signature(run, pieces, T, win_op0)
        for i, entry in enumerate(cache):
            if entry.sig_matches(sig):
                cols = entry.columns(pieces)
                if cols is not None:
                    if i:
                        cache.insert(0, cache.pop(i))
                    entry.hits += 1
                    return _made(run, cols, strings, entry.win, win_op0, clock, below, False)
                break  # the structure's, but not its steps or held waits: made anew
    parts = []
    keeps = []
    hs0 = 0
    for p, t in zip(pieces, T):
        part, keep = _piece(p, run, win_op0, hs0, t)
        hs0 += len(part[0]["step"])
        parts.append(part)
        keeps.append(keep)
    host, ops, acc, marks = ({name: np.concatenate([part[k][name] for part in parts])
                              for name in parts[0][k]} for k in range(4))
    if is_last:
        marks = {"name": np.append(marks["name"], end_code),
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
    win = {"core_op": core_op, "span_core": flags, "marker_core": marker_core,
           "span_issue": issue}
    if sig is not None:  # those never taken again are let go (their memory too)
        cache[:] = [_Reuse(sig, pieces, keeps, run, trace, device, issue, win)] + \
            [e for e in cache if e.hits][:_REUSE - 1]
    return _made(run, trace, strings, win, win_op0, clock, below, is_last)


def _made(run: dict, trace, strings: _Strings, win: dict, win_op0: int, clock: float,
          below: float, is_last: bool) -> TraceWindow:
    """The window of ``trace`` (a Trace, or its tables' columns by name)."""
    if isinstance(trace, dict):
        tables = [Table(name, trace[name], strings.strings)
                  for name in ("spans", "ops", "accesses", "markers")]
    else:
        tables = [trace.spans, trace.ops, trace.accesses, trace.markers]
    return TraceWindow(*tables, strings.strings, dict(run["meta"]), op_base=win_op0,
                       complete_below=below, clock=-_INF if run["plan"].negative else clock,
                       first=win_op0 == 0, last=is_last, **win)


def _signature(run: dict, pieces: list[_Piece], T: list[dict], win_op0: int) -> tuple:
    """A window's structure: what decides every column of it but the steps and times
    (:class:`_Reuse`), as (numbers, arrays)."""
    key: list = []
    arrays: list = []
    for p, t in zip(pieces, T):
        lay = run["layouts"][p.bi]
        # a wait bound further back than the piece's first pass: its record's place depends
        # on where the piece begins
        key += [p.bi, p.n, p.op0 - win_op0, p.i0 if p.i0 < lay.back else -1]
        for codes in t.values():
            if isinstance(codes, list):
                for c in codes:
                    if isinstance(c, np.ndarray):
                        key.append(-1)
                        arrays.append(c)
                    else:
                        key.append(c)
            else:
                key.append(codes)
        for span, idle in p.idle.items():
            key.append(span)
            arrays.append(idle)
    return tuple(key), arrays


class _Reuse:
    """A window's columns by its structure (:func:`_signature`): a window of the same
    structure, whose steps are this one's shifted by one number and whose waits held their
    streams as this one's did, has the same columns but for its steps (shifted) and times
    (read off its recorded values at the same places)."""

    def __init__(self, sig, pieces, keeps, run, trace, device, issue, win):
        self.sig, self.win, self.hits = sig, win, 0
        for v in win.values():  # shared by the windows that reuse them
            if isinstance(v, np.ndarray):
                v.flags.writeable = False
        self.steps = np.concatenate([p.steps for p in pieces])
        # the places of the times among the pieces' recorded values, laid end to end
        places: dict = {}
        base = 0
        for p, keep in zip(pieces, keeps):
            size = p.vals.size
            at = np.arange(base, base + size, dtype=np.float64).reshape(p.vals.shape)
            lay = run["layouts"][p.bi]
            for name, v in _times(p, lay, run["plan"].blocks[p.bi].marked, at,
                                  keep).items():
                places.setdefault(name, []).append(v)
            base += size
        # as numpy's index type: ``take`` turns narrower indices into it at every call (a
        # third of its time)
        places = {k: np.concatenate(v).astype(np.intp) for k, v in places.items()}
        self.base = base
        none = np.zeros(0, dtype=np.intp)
        self.op_at = {c: places.get("o." + c, none) for c in ("issue_us", "start_us", "end_us")}
        self.span_at = {c: np.concatenate([places.get("h." + c, none),
                                           self.op_at[c][device]])[issue]
                        for c in ("start_us", "end_us")}
        self.mark_at = places["m.time_us"]
        self.tables = {name: getattr(trace, name).columns()
                       for name in ("spans", "ops", "accesses", "markers")}
        kind, ops = trace.ops.kind, trace.ops
        self.waits = np.flatnonzero(kind == OpKind.WAIT)
        self.held = ops.end_us[self.waits] > ops.start_us[self.waits]

    def sig_matches(self, sig) -> bool:
        key, arrays = sig
        mine, theirs = self.sig
        return key == mine and all(np.array_equal(a, b) for a, b in zip(arrays, theirs))

    def columns(self, pieces: list[_Piece]) -> dict | None:
        """The tables' columns of a window of this structure made of ``pieces``; None where
        its steps are not this one's shifted or its waits held their streams otherwise."""
        steps = np.concatenate([p.steps for p in pieces])
        d = int(steps[0]) - int(self.steps[0]) if len(steps) else 0
        if not np.array_equal(steps, self.steps + d):
            return None
        values = np.concatenate([p.vals.ravel() for p in pieces])
        if len(values) != self.base:
            return None
        ops = {c: values.take(at) for c, at in self.op_at.items()}
        w = self.waits
        if not np.array_equal(ops["end_us"][w] > ops["start_us"][w], self.held):
            return None
        out = {}
        for name, cols in self.tables.items():
            cols = dict(cols)
            if d:
                cols["step"] = cols["step"] + d
            out[name] = cols
        out["ops"].update(ops)
        out["spans"].update({c: values.take(at) for c, at in self.span_at.items()})
        out["markers"]["time_us"] = values.take(self.mark_at)
        return out


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
