"""Ranks side by side: several ranks' Traces in one Trace, each rank's lanes its own.

Used by the capture importer (one Trace per host process of per-rank captures) and by the
simulation of tensor-parallel ranks (one Trace per rank's engine), so a multi-rank consumer
(a timeline, the Perfetto export, explain) reads either the same way: lanes ``r<k>.<lane>``,
ids offset, ``meta["ranks"]`` describing each rank.

Imports: numpy and :mod:`simwar.core.trace`.
"""

from __future__ import annotations

import numpy as np

from simwar.core.trace import HOST, Table, Trace


def side_by_side(traces: list[Trace], infos: list[dict]) -> Trace:
    """The ranks' Traces in one: each rank's lanes renamed ``r<k>.<lane>`` (its host lane
    ``r<k>.cpu``), op and span ids offset, ``meta["ranks"]`` = ``infos`` with each rank's
    ``host_lane``, ``lanes``, ``ops`` and ``spans`` (id ranges) added. One Trace is
    returned unchanged."""
    if len(traces) == 1:
        return traces[0]
    strings: list[str] = []
    code: dict[str, int] = {}

    def intern(text: str) -> int:
        if text not in code:
            code[text] = len(strings)
            strings.append(text)
        return code[text]

    intern("")
    tables: dict[str, list[dict]] = {"spans": [], "ops": [], "accesses": [], "markers": []}
    n_ops = n_spans = 0
    ranks = []
    for k, (t, info) in enumerate(zip(traces, infos)):
        lane_map = np.array([intern(f"r{k}.{s}" if s else "") for s in t.strings], dtype=np.int32)
        text_map = np.array([intern(s) for s in t.strings], dtype=np.int32)
        for name in tables:
            table = getattr(t, name)
            cols = {}
            for col, values in table.columns().items():
                if col == "lane":
                    values = lane_map[values]
                elif values.dtype == np.int32 and col in _TEXT[name]:
                    values = text_map[values]
                elif col in _OP_IDS[name]:
                    values = np.where(values >= 0, values + n_ops, values).astype(values.dtype)
                elif col in _SPAN_IDS[name]:
                    values = np.where(values >= 0, values + n_spans, values).astype(values.dtype)
                cols[col] = values
            tables[name].append(cols)
        ranks.append({**info, "host_lane": f"r{k}.{HOST}",
                      "lanes": [f"r{k}.{lane}" for lane in t.lanes()],
                      "ops": [n_ops, n_ops + len(t.ops)],
                      "spans": [n_spans, n_spans + len(t.spans)]})
        n_ops += len(t.ops)
        n_spans += len(t.spans)
    merged = {name: {col: np.concatenate([p[col] for p in parts])
                     for col in parts[0]} for name, parts in tables.items()}
    # spans stay sorted by step (a window of steps is a slice): stable by step
    order = np.argsort(merged["spans"]["step"], kind="stable")
    if np.any(order[1:] < order[:-1]):
        new_id = np.empty(len(order), dtype=np.int32)
        new_id[order] = np.arange(len(order), dtype=np.int32)
        merged["spans"] = {c: v[order] for c, v in merged["spans"].items()}
        call = merged["ops"]["call"]
        merged["ops"]["call"] = np.where(call >= 0, new_id[np.maximum(call, 0)],
                                         -1).astype(call.dtype)
        for r in ranks:
            r.pop("spans")  # no longer a contiguous range
    meta = dict(traces[0].meta)
    meta.update(ranks=ranks, lanes_by_rank=True)
    return Trace(spans=Table("spans", merged["spans"], strings),
                 ops=Table("ops", merged["ops"], strings),
                 accesses=Table("accesses", merged["accesses"], strings),
                 markers=Table("markers", merged["markers"], strings),
                 strings=strings, meta=meta)


#: per table, the columns holding text codes, op ids and span ids
_TEXT = {"spans": {"label", "phase", "site"}, "ops": {"label", "event", "phase"},
         "accesses": {"buffer", "phase"}, "markers": {"name"}}
_OP_IDS = {"spans": {"op"}, "ops": {"bound"}, "accesses": {"op"}, "markers": set()}
_SPAN_IDS = {"spans": set(), "ops": {"call"}, "accesses": set(), "markers": set()}


__all__ = ["side_by_side"]
