"""Trace records: what an executor saw, in one schema for every executor.

The SimPy engine, the GPU replay and the Kineto importer all produce a
:class:`Trace` through :class:`simwar.core.recorder.Recorder`; every analysis
(:mod:`simwar.analysis`), plot and export reads only this. A Trace is four
tables of typed columns (numpy arrays; text is interned in ``strings``) and
its relations are **data**, ids and typed kinds, never labels to parse:

- ``ops``: every device-visible operation in host issue order (op id = row):
  ``kind`` kernel | record | wait | sync, ``lane`` (a stream; ``cpu`` for a
  host sync), ``step``, ``issue_us`` (when the issuing host call returned),
  ``start_us``/``end_us`` (device times; a record's are both its firing; a
  wait's run from reaching it to its release; a sync's are host times),
  ``bound`` (the op id of the record a wait or sync bound to, -1: none) and
  ``call`` (the span id of the host call that issued it, -1: unknown, e.g. a
  captured kernel whose launch is not in the capture);
- ``spans``: time intervals (span id = row), each on a lane with a ``kind``
  cpu | api | blocked | kernel | wait; host spans carry a typed ``call``
  (cpu work, launch, graph launch, record, wait_event, wait_stream,
  synchronize, other) and every span the ``op`` it belongs to or issued (a
  graph launch: its first node; cpu work: -1). Spans are stored sorted by
  step, so a window of steps is a slice;
- ``accesses``: shared-buffer reads and writes, each of a kernel ``op``;
- ``markers``: named host instants (``step``, ``run_batch``, ``end``).

Edges are therefore explicit: launch → kernel is ``ops.call``, record → wait
and record → sync are ``ops.bound``; :meth:`Trace.edges` lists them typed.
Iterating a table yields named rows (``Span``, ``Op``, ...) with text decoded,
for tests and small windows; analyses use the columns.

Run facts: ``meta`` is a dict each writer fills with its own keys; the facts
every analysis reads are :attr:`Trace.run`, a typed
:class:`~simwar.core.run_meta.RunMeta` read from it.

File format: ``{"format": "simwar.trace", "version": 3, "run": {...}, "meta":
{...}, ...}`` JSON (``.gz`` supported), ``run`` holding the meta keys that are
:class:`~simwar.core.run_meta.RunMeta`'s and ``meta`` the others. Version 2
(every key in ``meta``) reads the same. Version 1 (label-based, simwar 0.1) is
refused with a clear message, since its relations cannot be recovered without
guessing.

Imports: the standard library and numpy (every machine with torch has numpy,
so the GPU replay writes traces too).
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

from simwar.core.files import write_text_atomic
from simwar.core.kinds import (  # noqa: F401 (re-exported)
    CALLS,
    HOST,
    MODES,
    OP_KINDS,
    SPAN_KINDS,
    Call,
    Mode,
    OpKind,
    SpanKind,
)
from simwar.core.run_meta import RunMeta

FORMAT_VERSION = 3
#: versions read: 2 kept every meta key in ``meta``, 3 keeps the run record's apart
READ_VERSIONS = (2, 3)


# --------------------------------------------------------------------------- named rows
class Span(NamedTuple):
    lane: str
    label: str
    kind: str  # cpu | api | blocked | kernel | wait
    step: int
    start_us: float
    end_us: float
    phase: str = ""
    site: str = ""
    op: int = -1  # the op this span belongs to (device) or issued (host call)
    call: str = ""  # host spans: cpu | launch | graph_launch | record | wait_event | ...
    span_id: int = -1


class Op(NamedTuple):
    """A device-visible operation, in host issue order (see the module docstring)."""

    op_id: int
    lane: str
    kind: str  # kernel | record | wait | sync
    step: int
    label: str
    event: str
    bound: int
    issue_us: float
    start_us: float
    end_us: float
    phase: str = ""
    call: int = -1


class Access(NamedTuple):
    op_id: int
    buffer: str
    mode: str  # read | write
    step: int
    phase: str = ""


class MarkerRow(NamedTuple):
    name: str
    step: int
    time_us: float


class Edge(NamedTuple):
    """A relation between two trace items, by id.

    ``launch``: host span ``src`` issued op ``dst``; ``record_wait`` /
    ``record_sync``: record op ``src`` released wait / sync op ``dst``.
    """

    kind: str
    src: int
    dst: int


# --------------------------------------------------------------------------- schemas
#: (column, numpy dtype, decoding): "str" = a code into ``Trace.strings``, a tuple = an enum's
#: names, None = the number itself. The column order is the named row's field order.
SPAN_COLUMNS = (("lane", np.int32, "str"), ("label", np.int32, "str"),
                ("kind", np.int8, SPAN_KINDS), ("step", np.int32, None),
                ("start_us", np.float64, None), ("end_us", np.float64, None),
                ("phase", np.int32, "str"), ("site", np.int32, "str"),
                ("op", np.int32, None), ("call", np.int8, CALLS))
OP_COLUMNS = (("lane", np.int32, "str"), ("kind", np.int8, OP_KINDS),
              ("step", np.int32, None), ("label", np.int32, "str"),
              ("event", np.int32, "str"), ("bound", np.int32, None),
              ("issue_us", np.float64, None), ("start_us", np.float64, None),
              ("end_us", np.float64, None), ("phase", np.int32, "str"),
              ("call", np.int32, None))
ACCESS_COLUMNS = (("op", np.int32, None), ("buffer", np.int32, "str"),
                  ("mode", np.int8, MODES), ("step", np.int32, None),
                  ("phase", np.int32, "str"))
MARKER_COLUMNS = (("name", np.int32, "str"), ("step", np.int32, None),
                  ("time_us", np.float64, None))
SCHEMAS = {"spans": SPAN_COLUMNS, "ops": OP_COLUMNS, "accesses": ACCESS_COLUMNS,
           "markers": MARKER_COLUMNS}


class Table:
    """Typed columns of equal length: ``table.start_us`` is a numpy array.

    Iterating yields named rows with text decoded (``rows(index)`` for a
    subset); ``len`` is the row count. Tables are read-only once built.
    """

    def __init__(self, name: str, columns: dict[str, np.ndarray], strings: list[str]):
        self._name = name
        self._schema = SCHEMAS[name]
        self._strings = strings
        n = None
        for col, dtype, _ in self._schema:
            arr = np.asarray(columns[col], dtype=dtype)
            if n is None:
                n = len(arr)
            elif len(arr) != n:
                raise ValueError(f"{name}.{col}: {len(arr)} rows, expected {n}")
            arr.flags.writeable = False
            setattr(self, col, arr)
        self._n = n or 0

    def __repr__(self) -> str:
        return f"Table({self._name!r}: {len(self)} rows, columns {', '.join(self.columns())})"

    def __len__(self) -> int:
        return self._n

    def columns(self) -> dict[str, np.ndarray]:
        return {col: getattr(self, col) for col, _, _ in self._schema}

    def decoded(self, name: str) -> np.ndarray:
        """Column ``name`` with codes turned into text (an object array)."""
        _, _, how = next(c for c in self._schema if c[0] == name)
        codes = getattr(self, name)
        if how == "str":
            return _text(self._strings)[codes]
        if isinstance(how, tuple):
            return np.array(how, dtype=object)[codes]
        return codes

    def rows(self, index=None) -> list:
        """Named rows (all, or those at ``index``: an int array, a slice or a mask)."""
        ids = np.arange(self._n)
        if index is not None:
            ids = ids[index]
        cols = []
        for col, _, how in self._schema:
            values = getattr(self, col)[ids].tolist()
            if how == "str":
                s = self._strings
                values = [s[v] if v >= 0 else "" for v in values]
            elif isinstance(how, tuple):
                values = [how[v] for v in values]
            cols.append(values)
        if self._name == "ops":
            cols.insert(0, ids.tolist())  # Op(op_id, ...)
        elif self._name == "spans":
            cols.append(ids.tolist())  # Span(..., span_id)
        return [_ROW_TYPES[self._name](*r) for r in zip(*cols)]

    def __iter__(self):
        return iter(self.rows())


_ROW_TYPES = {"spans": Span, "ops": Op, "accesses": Access, "markers": MarkerRow}


def _text(strings: list[str]) -> np.ndarray:
    return np.array(strings + [""], dtype=object)  # code -1 decodes to ""


def empty_columns(name: str) -> dict[str, np.ndarray]:
    return {col: np.zeros(0, dtype=dtype) for col, dtype, _ in SCHEMAS[name]}


@dataclass(eq=False)
class Trace:
    """One executed program: spans, ops, accesses, markers and run facts (``meta``; the
    typed ones: :attr:`run`)."""

    spans: Table
    ops: Table
    accesses: Table
    markers: Table
    strings: list[str] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        """Sizes and the run it came from, never the tables or the interned strings."""
        steps = self.spans.step if len(self.spans) else np.zeros(0, dtype=np.int64)
        ran = f", steps {int(steps.min())}..{int(steps.max())}" if len(steps) else ""
        name = self.run.name
        return (f"Trace({name!r}: {len(self.spans)} spans, {len(self.ops)} ops, "
                f"{len(self.accesses)} accesses, {len(self.markers)} markers, "
                f"{len(self.strings)} strings{ran})" if name else
                f"Trace({len(self.spans)} spans, {len(self.ops)} ops, {len(self.accesses)} "
                f"accesses, {len(self.markers)} markers, {len(self.strings)} strings{ran})")

    @property
    def run(self) -> RunMeta:
        """The run facts every analysis reads, typed, from ``meta`` as it is now."""
        return RunMeta.from_meta(self.meta)

    # ---- text codes
    def code(self, text: str) -> int:
        """The code of ``text`` in this trace's string table (-2 if absent: matches nothing).

        Looked up by a scan and remembered per text: readers ask for a few names (lanes,
        markers, sites), and an index of every string (event names are per step) would cost
        more memory than the scans.
        """
        known = self.__dict__.setdefault("_codes", {})
        code = known.get(text)
        if code is None:
            try:
                code = self.strings.index(text)
            except ValueError:
                code = -2
            known[text] = code
        return code

    def text(self, code: int) -> str:
        return self.strings[code] if code >= 0 else ""

    # ---- derived views
    def lanes(self) -> list[str]:
        """``cpu`` and every lane with spans or ops, in first-seen order."""
        codes = np.concatenate([self.spans.lane, self.ops.lane])
        _, first = np.unique(codes, return_index=True)
        seen = [self.strings[c] for c in codes[np.sort(first)]]
        return [HOST] + [lane for lane in seen if lane != HOST]

    def edges(self) -> list[Edge]:
        """Launch, record→wait and record→sync edges, from ``ops.call`` and ``ops.bound``."""
        ops = self.ops
        out: list[Edge] = []
        kernel = np.flatnonzero((ops.kind == OpKind.KERNEL) & (ops.call >= 0))
        out += [Edge("launch", s, d) for s, d in zip(ops.call[kernel].tolist(), kernel.tolist())]
        for kind, name in ((OpKind.WAIT, "record_wait"), (OpKind.SYNC, "record_sync")):
            idx = np.flatnonzero((ops.kind == kind) & (ops.bound >= 0))
            out += [Edge(name, s, d) for s, d in zip(ops.bound[idx].tolist(), idx.tolist())]
        return out

    def graph_node(self) -> np.ndarray:
        """Per op: issued by a graph launch (a CUDA-graph node), from the issuing call's kind."""
        calls = self.ops.call
        out = np.zeros(len(calls), dtype=bool)
        has = calls >= 0
        out[has] = self.spans.call[calls[has]] == Call.GRAPH_LAUNCH
        return out

    def step_slice(self, first: int, last: int) -> slice:
        """The spans of steps ``first..last`` (inclusive): a slice, since spans are by step."""
        steps = self.spans.step
        return slice(int(np.searchsorted(steps, first, side="left")),
                     int(np.searchsorted(steps, last, side="right")))

    def frames(self) -> dict:
        """The trace as pandas DataFrames with text decoded."""
        import pandas as pd

        out = {}
        for name in SCHEMAS:
            table: Table = getattr(self, name)
            out[name] = pd.DataFrame({col: table.decoded(col) for col, _, _ in SCHEMAS[name]})
        out["ops"].insert(0, "op_id", np.arange(len(self.ops)))
        return out

    # ---- serialization
    def to_dict(self) -> dict:
        run, rest = RunMeta.split(self.meta)
        return {
            "format": "simwar.trace",
            "version": FORMAT_VERSION,
            "run": run,
            "meta": rest,
            "strings": list(self.strings),
            **{name: {col: arr.tolist() for col, arr in getattr(self, name).columns().items()}
               for name in SCHEMAS},
        }

    @classmethod
    def from_dict(cls, data: dict) -> Trace:
        if not isinstance(data, dict) or data.get("format") != "simwar.trace":
            raise ValueError("not a simwar trace (missing format: simwar.trace)")
        version = data.get("version")
        if version == 1:
            raise ValueError("trace format version 1 (simwar 0.1, relations stored as labels) "
                             "cannot be read by this simwar; re-create the trace (simwar run, "
                             "simwar harness --replay, simwar import --save-trace)")
        if version not in READ_VERSIONS:
            raise ValueError(f"trace format version {version} is not one of "
                             f"{', '.join(map(str, READ_VERSIONS))}")
        strings = list(data["strings"])
        tables = {}
        for name in SCHEMAS:
            cols = data[name]
            tables[name] = Table(name, {c: np.asarray(cols[c]) for c, _, _ in SCHEMAS[name]},
                                 strings)
        meta = {**data.get("run", {}), **data.get("meta", {})}  # version 2: no "run"
        return cls(strings=strings, meta=meta, **tables)

    def save(self, path: str | Path) -> None:
        write_text_atomic(path, json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        path = Path(path)
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:
            return cls.from_dict(json.load(fh))

    @classmethod
    def empty(cls, meta: dict | None = None) -> Trace:
        strings: list[str] = []
        return cls(**{name: Table(name, empty_columns(name), strings) for name in SCHEMAS},
                   strings=strings, meta=dict(meta or {}))


@dataclass(eq=False)
class TraceWindow(Trace):
    """A stretch of a run's Trace, as the fast executor's trace mode streams it
    (:mod:`simwar.executors.fast.trace`): the ops issued in a range of scheduler
    iterations (the *core*), after ``margin`` iterations before it for context, with
    everything they refer to, as a Trace of its own (ids are the window's rows).

    - ``op_base``: the run's op id of the window's op 0; ``core_op``: the first core op;
    - ``span_core``, ``marker_core``: which spans and markers belong to the core (host spans
      issued in it, device spans of its ops); accesses follow their ops;
    - ``complete_below``: every span and op of a step below it is in this window or an
      earlier one; ``clock``: every later window's times are at least this (the host clock
      at the core's end);
    - ``first`` / ``last``: the window starts / ends the run. ``bound`` and ``op`` references
      to ops outside the window (in the margin's own history) are ``-2``.

    A whole Trace is a window that is all core (:func:`window_of`).
    """

    op_base: int = 0
    core_op: int = 0
    span_core: np.ndarray | None = None
    marker_core: np.ndarray | None = None
    complete_below: float = float("inf")
    clock: float = float("inf")
    first: bool = True
    last: bool = True
    #: per span, its place in the recorder's order before the spans were sorted by step
    #: (host spans in issue order, then device spans in op order)
    span_issue: np.ndarray | None = None


def window_of(trace: Trace) -> TraceWindow:
    """``trace`` as a window: all core, first and last."""
    if isinstance(trace, TraceWindow):
        return trace
    return TraceWindow(trace.spans, trace.ops, trace.accesses, trace.markers, trace.strings,
                       trace.meta, span_core=np.ones(len(trace.spans), dtype=bool),
                       marker_core=np.ones(len(trace.markers), dtype=bool))
