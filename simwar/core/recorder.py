"""The one recorder every executor writes its Trace through.

It hands out the ids that make relations data (an op id per device-visible
operation, in host issue order; a span id per interval) and stores rows as
typed columns: rows are buffered as tuples in small chunks and moved into
``array.array`` columns chunk by chunk (text interned into one string
table), so a long run costs a few dozen bytes per row, not a Python object.
Times an executor only learns later (a kernel's start and end, a host
block's end) live in their own columns and are set by id.

The CUDA stream rules (when a record fires, when a wait releases, when a
host sync returns) are :mod:`simwar.core.rules`; ``Recorder.lanes`` gives
one-pass executors (the replay's assembly, the importer) per-stream tails
advanced by them.

Imports: the standard library, numpy (at :meth:`Recorder.finish`) and
simwar's stdlib-only modules.
"""

from __future__ import annotations

from array import array

import numpy as np

from simwar.core.rules import Lanes
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
    Trace,
)

_CHUNK = 4096
_TYPECODES = {np.int8: "b", np.int32: "i", np.float64: "d"}
_SPAN_FOR_CALL = {Call.CPU: SpanKind.CPU, Call.SYNCHRONIZE: SpanKind.BLOCKED}
_NAN = float("nan")


class _Interner(dict):
    """Text → code; a new text gets the next code (code 0 is the empty text)."""

    def __init__(self, strings: list[str]):
        super().__init__()
        self.strings = strings
        self[""] = 0
        strings.append("")

    def __missing__(self, key: str) -> int:
        code = len(self.strings)
        self.strings.append(key)
        self[key] = code
        return code


class _Columns:
    """Rows of fixed columns, buffered as tuples and flushed into typed arrays."""

    def __init__(self, schema, names: tuple[str, ...], interner: _Interner):
        types = {col: (dtype, how) for col, dtype, how in schema}
        self.names = names
        self.kinds = [types[n][1] == "str" for n in names]
        self.arrays = [array(_TYPECODES[types[n][0]]) for n in names]
        self.pending: list[tuple] = []
        self.interner = interner
        self.n = 0

    def add(self, row: tuple) -> int:
        pending = self.pending
        pending.append(row)
        if len(pending) >= _CHUNK:
            self.flush()
        self.n += 1
        return self.n - 1

    def flush(self) -> None:
        if not self.pending:
            return
        code = self.interner.__getitem__
        # fromlist of a list: about a quarter of the time of extend from a tuple, which
        # converts item by item through the sequence protocol (a large import's rows)
        for values, arr, is_text in zip(zip(*self.pending), self.arrays, self.kinds):
            arr.fromlist(list(map(code, values)) if is_text else list(values))
        self.pending.clear()

    def take(self) -> dict[str, np.ndarray]:
        """The columns as numpy arrays; each buffer is released once copied (a copy at a time)."""
        self.flush()
        out = {}
        for name in self.names:
            arr = self.arrays.pop(0)
            out[name] = np.array(arr, dtype=arr.typecode) if len(arr) else \
                np.zeros(0, dtype=arr.typecode)
            del arr
        return out


# columns of the rows an executor adds (the rest are set by id later, or derived)
_SPAN_ADD = ("lane", "label", "kind", "step", "start_us", "end_us", "phase", "site", "op",
             "call")
_OP_ADD = ("lane", "kind", "step", "label", "event", "bound", "issue_us", "phase", "call")


class Recorder:
    """Builds one Trace. ``finish(meta)`` returns it; the recorder is then spent.

    Executors add host spans and ops; the device spans (a kernel's run, a wait that held its
    stream) are not added but derived from the ops' final times when the Trace is made, so
    every executor produces them the same way and an op's times are set in one place.
    """

    def __init__(self) -> None:
        self.strings: list[str] = []
        self.interner = _Interner(self.strings)
        self._spans = _Columns(SPAN_COLUMNS, _SPAN_ADD, self.interner)
        self._ops = _Columns(OP_COLUMNS, _OP_ADD, self.interner)
        self._accesses = _Columns(ACCESS_COLUMNS, tuple(c for c, _, _ in ACCESS_COLUMNS),
                                  self.interner)
        self._markers = _Columns(MARKER_COLUMNS, tuple(c for c, _, _ in MARKER_COLUMNS),
                                 self.interner)
        # an op's device times, set by id once known (the engine learns them later)
        self.op_start = array("d")
        self.op_end = array("d")
        self.lanes = Lanes()

    # ------------------------------------------------------------------ ids
    @property
    def next_op(self) -> int:
        return self._ops.n

    # ------------------------------------------------------------------ host spans
    def host(self, call: Call, step: int, start: float, end: float, label: str,
             phase: str = "", site: str = "", op: int = -1, lane: str = HOST) -> int:
        """A span on a host lane (the scheduler thread's unless ``lane`` names another
        thread's, as an imported capture's launches from other threads): cpu work, an API
        call or a synchronize (blocked)."""
        cols = self._spans  # _Columns.add, inlined: this is the engine's hot path
        cols.pending.append((lane, label, _SPAN_FOR_CALL.get(call, SpanKind.API), step, start,
                             end, phase, site, op, call))
        if len(cols.pending) >= _CHUNK:
            cols.flush()
        cols.n += 1
        return cols.n - 1

    # ------------------------------------------------------------------ ops
    def op(self, kind: OpKind, lane: str, step: int, label: str, event: str = "",
           bound: int = -1, issue: float = _NAN, start: float = _NAN, end: float = _NAN,
           phase: str = "", call: int = -1) -> int:
        """A device-visible operation, in issue order; times may be set later by id."""
        self.op_start.append(start)
        self.op_end.append(end)
        cols = self._ops  # _Columns.add, inlined: this is the engine's hot path
        cols.pending.append((lane, kind, step, label, event, bound, issue, phase, call))
        if len(cols.pending) >= _CHUNK:
            cols.flush()
        cols.n += 1
        return cols.n - 1

    def set_times(self, op: int, start: float, end: float) -> None:
        self.op_start[op] = start
        self.op_end[op] = end

    def set_times_many(self, ops: np.ndarray, start: np.ndarray, end: np.ndarray) -> None:
        """:meth:`set_times` of each of ``ops`` (ids already added), in one step."""
        if len(ops):
            np.frombuffer(self.op_start, np.float64)[ops] = start
            np.frombuffer(self.op_end, np.float64)[ops] = end

    def access(self, op: int, buffer: str, write: bool, step: int, phase: str = "") -> None:
        self._accesses.add((op, buffer, 1 if write else 0, step, phase))

    def marker(self, name: str, step: int, time_us: float) -> None:
        self._markers.add((name, step, time_us))

    # ------------------------------------------------------------------ finish
    def finish(self, meta: dict | None = None) -> Trace:
        """The Trace: spans ordered by step (stable), ops in issue order.

        Device spans are derived here: one kernel span per kernel op, one wait span per wait
        op that held its stream (released after it was reached). Columns move into the
        Trace one at a time and each buffer is released as soon as it is moved.
        """
        ops = self._ops.take()
        ops["start_us"] = _take(self, "op_start")
        ops["end_us"] = _take(self, "op_end")
        s = self.strings
        trace = assemble(self._spans.take(), ops, self._accesses.take(), self._markers.take(),
                         s, meta)
        self.__dict__.clear()  # spent: the Trace owns what it needs
        return trace


def assemble(spans: dict, ops: dict, accesses: dict, markers: dict, strings: list[str],
             meta: dict | None = None) -> Trace:
    """A Trace from its host spans and ops as recorded (the one rule for both recorders:
    this one and the fast executor's trace mode, :mod:`simwar.executors.fast.trace`).

    ``spans``: the host spans' columns in issue order (their ``call`` and ``op`` filled);
    ``ops``: every op's columns in issue order, ``call`` indexing the host spans. The
    device spans are derived (one kernel span per kernel op, one wait span per wait op that
    held its stream: released after it was reached), appended after the host spans, and
    all spans ordered by step (stable); ``ops.call`` follows them. The dicts are consumed
    (each column is released once moved).
    """
    kind, start, end = ops["kind"], ops["start_us"], ops["end_us"]
    device = np.flatnonzero((kind == OpKind.KERNEL) | ((kind == OpKind.WAIT) & (end > start)))
    steps = np.concatenate([spans["step"], _device_column("step", ops, device)])
    order = np.argsort(steps, kind="stable")
    del steps
    moved = bool(len(order) and np.any(order[1:] < order[:-1]))
    for name in list(spans):  # host spans first, then the derived ones; by step
        column = np.concatenate([spans.pop(name), _device_column(name, ops, device)])
        spans[name] = column[order] if moved else column
        del column
    del device
    if moved:
        new_id = np.empty(len(order), dtype=np.int32)
        new_id[order] = np.arange(len(order), dtype=np.int32)
        call = ops["call"]
        ops["call"] = np.where(call >= 0, new_id[np.maximum(call, 0)], -1).astype(np.int32)
        del new_id
    del order
    return Trace(spans=Table("spans", spans, strings), ops=Table("ops", ops, strings),
                 accesses=Table("accesses", accesses, strings),
                 markers=Table("markers", markers, strings), strings=strings,
                 meta=dict(meta or {}))


def _device_column(name: str, ops: dict, device: np.ndarray) -> np.ndarray:
    """Span column ``name`` of the device spans, read off the device ops ``device``."""
    if name == "kind":
        return np.where(ops["kind"][device] == OpKind.KERNEL, SpanKind.KERNEL,
                        SpanKind.WAIT).astype(np.int8)
    if name == "op":
        return device.astype(np.int32)
    if name in ("site", "call"):  # no site; not a host call
        return np.zeros(len(device), dtype=np.int32 if name == "site" else np.int8)
    return ops[name][device]  # lane, label, step, start_us, end_us, phase: the op's own


def _take(rec: Recorder, name: str) -> np.ndarray:
    """Move a float buffer out of the recorder into a numpy array (the buffer is released)."""
    values = rec.__dict__.pop(name)
    return np.array(values, dtype=np.float64) if len(values) else np.zeros(0)
