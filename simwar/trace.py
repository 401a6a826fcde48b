"""Trace records: what an executor saw, in one schema for every executor.

The SimPy engine, the GPU harness and the Kineto importer all produce a
:class:`Trace`; metrics, hazards, plots and the Perfetto export read only
this. It holds

- ``spans``: time intervals on a lane (``cpu`` or a stream name), by kind:
  ``cpu`` (host work), ``api`` (a host API call), ``blocked`` (host inside a
  synchronize), ``kernel`` (device work), ``wait`` (a stream held by a
  cross-stream dependency);
- ``ops``: every device-visible operation in host issue order (kernels,
  records, stream waits, host syncs), with the record each wait or sync bound
  to. This is the happens-before skeleton the race detector needs;
- ``accesses``: shared-buffer reads and writes, each tied to a kernel op;
- ``markers``: named host instants (``step``, ``run_batch``).

Imports: the standard library only (the GPU harness writes traces on a
machine without simwar's other dependencies). ``frames()`` imports pandas
lazily.
"""

from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from ._io import write_text_atomic

FORMAT_VERSION = 1

HOST = "cpu"  # the lane of the scheduler thread


class Span(NamedTuple):
    lane: str
    label: str
    kind: str  # cpu | api | blocked | kernel | wait
    step: int
    start_us: float
    end_us: float
    phase: str = ""
    site: str = ""


class Op(NamedTuple):
    """A device-visible operation, in host issue order.

    ``kind`` is ``kernel``, ``record``, ``wait`` (a stream wait; ``bound`` is
    the op id of the record it waits for, -1 for a no-op) or ``sync`` (a host
    synchronize on lane ``cpu``; ``bound`` likewise). ``start_us``/``end_us``
    are device times for kernels (a record's are both the time it fired; a
    wait's span from reaching the wait to being released) and host times for
    syncs. ``issue_us`` is the host time of the call that issued it.
    """

    op_id: int
    lane: str
    kind: str
    step: int
    label: str
    event: str
    bound: int
    issue_us: float
    start_us: float
    end_us: float
    phase: str = ""


class Access(NamedTuple):
    op_id: int
    buffer: str
    mode: str  # read | write
    step: int
    phase: str = ""


class Marker(NamedTuple):
    name: str
    step: int
    time_us: float


class Edge(NamedTuple):
    """A synchronization edge: a record released a stream wait or a host sync."""

    kind: str  # record_wait | record_sync
    event: str
    src_lane: str
    src_us: float
    dst_lane: str
    dst_us: float
    step: int


@dataclass(slots=True)
class Trace:
    spans: list[Span] = field(default_factory=list)
    ops: list[Op] = field(default_factory=list)
    accesses: list[Access] = field(default_factory=list)
    markers: list[Marker] = field(default_factory=list)
    meta: dict = field(default_factory=dict)

    # ---- derived views
    def lanes(self) -> list[str]:
        seen: dict[str, None] = {HOST: None}
        for s in self.spans:
            seen.setdefault(s.lane, None)
        return list(seen)

    def edges(self) -> list[Edge]:
        """record→wait and record→sync edges, derived from ``ops``."""
        by_id = {op.op_id: op for op in self.ops}
        out = []
        for op in self.ops:
            if op.kind in ("wait", "sync") and op.bound >= 0:
                src = by_id[op.bound]
                out.append(Edge("record_sync" if op.kind == "sync" else "record_wait",
                                op.event, src.lane, src.end_us, op.lane, op.end_us, op.step))
        return out

    def frames(self) -> dict:
        """The trace as pandas DataFrames (``spans``, ``ops``, ``accesses``, ``markers``)."""
        import pandas as pd

        return {
            "spans": pd.DataFrame(self.spans, columns=Span._fields),
            "ops": pd.DataFrame(self.ops, columns=Op._fields),
            "accesses": pd.DataFrame(self.accesses, columns=Access._fields),
            "markers": pd.DataFrame(self.markers, columns=Marker._fields),
        }

    # ---- serialization: {"format": "simwar.trace", "version": 1, ...}; .gz supported
    def to_dict(self) -> dict:
        return {
            "format": "simwar.trace",
            "version": FORMAT_VERSION,
            "meta": self.meta,
            "spans": [list(s) for s in self.spans],
            "ops": [list(o) for o in self.ops],
            "accesses": [list(a) for a in self.accesses],
            "markers": [list(m) for m in self.markers],
        }

    @classmethod
    def from_dict(cls, data: dict) -> Trace:
        if data.get("format") != "simwar.trace":
            raise ValueError("not a simwar trace (missing format: simwar.trace)")
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"trace format version {data.get('version')} is not {FORMAT_VERSION}")
        return cls(
            spans=[Span(*s) for s in data["spans"]],
            ops=[Op(*o) for o in data["ops"]],
            accesses=[Access(*a) for a in data["accesses"]],
            markers=[Marker(*m) for m in data["markers"]],
            meta=data.get("meta", {}),
        )

    def save(self, path: str | Path) -> None:
        write_text_atomic(path, json.dumps(self.to_dict()))

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        path = Path(path)
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as fh:
            return cls.from_dict(json.load(fh))
