"""The profiler's own host cost, per recorded event, taken out of a capture's host times.

Under torch.profiler every event the profiler records costs the host thread that records it:
a ``record_function`` range, an aten op (``cpu_op``), a CUDA runtime call, each kernel a
graph launch hands CUPTI, each Python call under ``with_stack``. A fit of a profiled capture
therefore reads host durations (CPU work, the host cost of each API call) that are longer
than the server's own: the mini-server's fitted host times were 1.37× its unprofiled run's.

``simwar/data/profiler_cost.yaml`` holds what one event of each kind costs, measured on the
project's H200 with profiled and unprofiled twins (``python -m lab.profiler_cost``;
``docs/profiler-cost.md`` has the table, its spread and the command). The import keeps, per
kind, the host times of the events the profiler recorded on the host thread
(:attr:`simwar.capture.to_trace.KinetoImport.profiler_events`: each host event at its start,
each kernel, copy and sync at the start of the host call that issued it, where its cost is
paid). :class:`ProfilerCost` answers, for a host interval ``[a, b)``, the events of each
kind recorded in it and Σ count × cost, which the fit subtracts from every host duration it
reads (:mod:`simwar.fit.samples`: each region's host time, each API call's cost, each mapped
CPU range), never below zero. The table of the capture's setting is used: ``with_stack``
when it holds ``python_function`` events, else ``without_stack``.

``simwar import --fit --keep-profiler-cost`` keeps the profiler's cost (the fit as before);
a table of zeros subtracts nothing, bit for bit.

Imports: numpy, yaml and the standard library.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

#: the measured table shipped with simwar
DATA = Path(__file__).resolve().parent.parent / "data" / "profiler_cost.yaml"
#: event kinds whose count the fit reports (the trace's ``cat``), in this order
KINDS = ("cpu_op", "user_annotation", "python_function", "cuda_runtime", "kernel",
         "gpu_memcpy", "gpu_memset", "cuda_sync")


@dataclass
class CostTable:
    """µs per event of each kind for one profiler setting, and where it came from."""

    us: dict[str, float]
    setting: str = ""
    source: dict = field(default_factory=dict)

    def describe(self) -> str:
        src = self.source
        bits = [str(src[k]) for k in ("gpu", "torch", "date") if src.get(k)]
        return f"{self.setting}" + (f" ({', '.join(bits)})" if bits else "")


def load_table(path: str | Path | None = None, with_stack: bool = False) -> CostTable:
    """The table of ``path`` (default: the shipped one) for a capture profiled with or
    without stacks. A file without that setting gives an empty table (nothing subtracted)."""
    path = Path(path) if path is not None else DATA
    data = yaml.safe_load(path.read_text()) or {}
    setting = "with_stack" if with_stack else "without_stack"
    rows = (data.get("settings") or {}).get(setting) or {}
    us = {k: float(v["us"] if isinstance(v, dict) else v) for k, v in rows.items()}
    return CostTable(us, setting, dict(data.get("source") or {}))


class ProfilerCost:
    """The profiler's host cost inside host intervals of one capture.

    ``events``: per kind, the sorted host times of its events (the import's
    ``profiler_events``); ``table``: µs per event of each kind. A kind the table lacks costs
    nothing.
    """

    def __init__(self, events: dict, table: CostTable):
        self.table = table
        self.times = {k: np.asarray(v, dtype=float) for k, v in events.items()}
        self.cost = {k: float(table.us.get(k, 0.0)) for k in self.times}

    @property
    def zero(self) -> bool:
        return not any(self.cost.values())

    def counts(self, a: float, b: float) -> dict[str, int]:
        """Events of each kind recorded in ``[a, b)``."""
        return {k: int(np.searchsorted(t, b, "left") - np.searchsorted(t, a, "left"))
                for k, t in self.times.items()}

    def us(self, a: float, b: float) -> float:
        """The profiler's host cost in ``[a, b)``: Σ events × µs per event."""
        if b <= a:
            return 0.0
        total = 0.0
        for k, t in self.times.items():
            c = self.cost[k]
            if c:
                total += c * int(np.searchsorted(t, b, "left") - np.searchsorted(t, a, "left"))
        return total

    def less_outside(self, value: float, a: float, b: float, inner) -> float:
        """``value`` (a host duration over ``[a, b)`` net of the ``inner`` intervals in it,
        each within it) less the profiler's cost in ``[a, b)`` outside them, at most
        ``value``: the one rule the fit nets a host range or region by."""
        cut = self.us(a, b) - sum(self.us(x, y) for x, y in inner)
        return value - min(max(cut, 0.0), max(value, 0.0))

    def less(self, value: float, a: float, b: float) -> float:
        """``value`` (a host duration measured over ``[a, b)``) less the profiler's cost in
        that interval, never below zero."""
        cut = self.us(a, b)
        return value - min(cut, value) if cut > 0 and value > 0 else value


def for_capture(imp, table: CostTable | str | Path | None = None) -> ProfilerCost:
    """The profiler's cost for an imported capture: the shipped table (or ``table``: a
    :class:`CostTable` or a file) of the capture's setting."""
    events = getattr(imp, "profiler_events", None) or {}
    with_stack = len(events.get("python_function", ())) > 0
    if not isinstance(table, CostTable):
        table = load_table(table, with_stack)
    return ProfilerCost(events, table)
