"""Per-rank captures of a tensor-parallel run: their collectives, their clocks aligned on
them, and synthetic ones written from simulated ranks.

SGLang writes one capture per TP rank (``{id}-TP-{r}.trace.json.gz``); imported together
(:func:`simwar.capture.to_trace.bind_capture`), each rank is a Trace. Its **collectives**
(:func:`captured_table`) are its device collective kernels (NCCL's, by name:
:data:`DEVICE_COLLECTIVE`) and its host collectives (the scheduler's ranges around the
request broadcast and the DP-attention all-gather: :data:`HOST_COLLECTIVES`). The k-th
collective of a name on one rank is the k-th of that name on every rank (the ranks run the
same loop); the instances every rank has are the run's common collectives, and rank files
with none in common are not from one run (:class:`RanksError`).

**Clocks.** A device collective completes on every rank at once (the last rank's arrival
plus its transfer, docs/design.md, "Tensor-parallel ranks"), so the ranks' clocks are
aligned on the collectives' ends: rank r is shifted by the median over the common device
collectives of rank 0's end minus its own (host collectives' ends when there are no device
ones), on top of the files' ``baseTimeNanoseconds``. Per collective the **arrival skew** is
then the last rank's start minus the first's, naming the late rank
(:class:`simwar.analysis.ranks.Collectives`).

:func:`write_rank_captures` writes simulated ranks as such files, each with a clock error of
its own, for the round trip whose truth is the simulator's.

Imports: numpy, :mod:`simwar.analysis.ranks`, :mod:`simwar.core` and the synthetic writer;
never the simulator.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from simwar.analysis.ranks import Collectives
from simwar.capture.reader import KinetoFormatError
from simwar.capture.synthetic import ORIGIN_US, Style, write_kineto
from simwar.core.trace import OpKind, Table, Trace

#: device work that is a collective (NCCL's kernels; the simulator's collective names)
DEVICE_COLLECTIVE = re.compile(r"^nccl|^(allreduce|allgather|reduce_scatter)$", re.I)
#: host ranges that are host collectives (SGLang's broadcast of the requests over the CPU
#: group, the DP-attention all-gather; the simulator's names)
HOST_COLLECTIVES = re.compile(
    r"^(scheduler\.)?(broadcast|broadcast_pyobj|allgather|all_gather|"
    r"all_gather_into_tensor)$")


class RanksError(KinetoFormatError):
    """Rank captures that cannot be one run's (no collective common to every rank)."""


def captured_table(trace: Trace, annotations: list[tuple[str, float, float]]) -> dict:
    """One imported rank's collectives (the module docstring), in time order, keyed by
    (device, name, ordinal of that name)."""
    ops = trace.ops
    labels = trace.strings
    kernel = np.flatnonzero(ops.kind == OpKind.KERNEL)
    names = [labels[c] for c in ops.label[kernel]]
    rows = [(float(ops.start_us[i]), True, n, int(ops.step[i]), int(i), float(ops.end_us[i]))
            for i, n in zip(kernel.tolist(), names) if DEVICE_COLLECTIVE.search(n)]
    m = trace.markers
    pick = m.name == trace.code("step")
    starts, steps = m.time_us[pick], m.step[pick]
    order = np.argsort(starts, kind="stable")
    starts, steps = starts[order], steps[order]
    for name, a, b in annotations:
        if HOST_COLLECTIVES.search(name):
            i = int(np.searchsorted(starts, a, side="right")) - 1
            rows.append((float(a), False, name, int(steps[i]) if i >= 0 else -1, -1, float(b)))
    rows.sort(key=lambda r: (r[0], not r[1]))
    seen: dict[tuple, int] = {}
    keys = []
    for _, device, name, *_ in rows:
        k = (device, name)
        keys.append((device, name, seen.get(k, 0)))
        seen[k] = seen.get(k, 0) + 1
    return {"key": keys, "device": [r[1] for r in rows], "name": [r[2] for r in rows],
            "step": [r[3] for r in rows], "op": [r[4] for r in rows],
            "arrive": [r[0] for r in rows], "leave": [r[5] for r in rows]}


def align(traces: list[Trace], annotations: list[list], files: list[str]
          ) -> tuple[list[Trace], list[list], Collectives | None, list[float]]:
    """The ranks' Traces and host ranges on one clock aligned on their collectives, the
    common collectives, and each rank's shift in µs. Ranks without any collective are left
    as they are (None, zeros); rank files with none in common are a :class:`RanksError`."""
    tables = [captured_table(t, a) for t, a in zip(traces, annotations)]
    counts = [len(t["key"]) for t in tables]
    if len(traces) < 2 or not any(counts):
        return traces, annotations, None, [0.0] * len(traces)
    col = Collectives(tables)
    if not len(col):
        have = "; ".join(f"{f}: {n} collectives" + (f" ({', '.join(sorted(set(t['name'])))})"
                                                     if n else "")
                         for f, n, t in zip(files, counts, tables))
        raise RanksError(f"{files[0]}: no collective common to every rank ({have}): the "
                         f"rank files are not from one run")
    ends = col.leave[col.device] if col.device.any() else col.leave
    shifts = [float(np.median(ends[:, 0] - ends[:, r])) for r in range(len(traces))]
    out, ranges = [], []
    for t, a, d in zip(traces, annotations, shifts):
        out.append(shifted(t, d) if d else t)
        ranges.append([(n, x + d, y + d) for n, x, y in a] if d else a)
    tables = [captured_table(t, a) for t, a in zip(out, ranges)]
    return out, ranges, Collectives(tables), shifts


def shifted(trace: Trace, us: float) -> Trace:
    """``trace`` with every time moved by ``us``."""
    times = {"spans": ("start_us", "end_us"), "ops": ("issue_us", "start_us", "end_us"),
             "accesses": (), "markers": ("time_us",)}
    tables = {}
    for name, cols in times.items():
        t = getattr(trace, name)
        c = dict(t.columns())
        for k in cols:
            c[k] = c[k] + us
        tables[name] = Table(name, c, trace.strings)
    meta = dict(trace.meta, clock_aligned_us=us)
    return Trace(strings=trace.strings, meta=meta, **tables)


def write_rank_captures(traces: list[Trace], directory: str | Path, run_id: str = "run",
                        clock_error_us: list[float] | None = None,
                        style: Style | None = None) -> list[Path]:
    """Simulated ranks' Traces as SGLang's per-rank captures,
    ``{directory}/{run_id}-TP-{r}.trace.json.gz``: one host's clock (the same
    ``baseTimeNanoseconds``), rank r's times off by ``clock_error_us[r]`` (what aligning on
    the collectives must undo)."""
    errors = clock_error_us or [0.0] * len(traces)
    d = Path(directory)
    return [write_kineto(t, d / f"{run_id}-TP-{r}.trace.json.gz", ORIGIN_US + errors[r],
                         style=style) for r, t in enumerate(traces)]


__all__ = ["DEVICE_COLLECTIVE", "HOST_COLLECTIVES", "RanksError", "align", "captured_table",
           "shifted", "write_rank_captures"]
