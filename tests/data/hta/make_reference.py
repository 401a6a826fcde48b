"""Make tests/data/hta/reference.json: HTA's critical path on captures of simulated runs.

HTA (HolisticTraceAnalysis 0.5.0) needs pandas < 3 and simwar needs pandas 3, so this
runs in two steps, each in its own environment:

1. ``python3 tests/data/hta/make_reference.py captures DIR`` (simwar, with the Trace v2
   Kineto writer ``simwar.capture.synthetic.write_kineto``): simulates each case of
   ``CASES`` and writes ``DIR/<case>/rank0.json``, a Kineto capture with CUDA sync events;
2. ``VENV/bin/python tests/data/hta/make_reference.py hta DIR > tests/data/hta/reference.json``
   in a virtual environment with ``holistictraceanalysis==0.5.0`` and ``pandas<3`` from
   PyPI: runs ``TraceAnalysis.critical_path_analysis(rank=0, annotation="ProfilerStep",
   instance_id=k)`` for the steps of ``STEPS`` and keeps, per step, whether it succeeded,
   the path's first and last node (time, event name, start or end), its length (the sum of
   its edge weights) and its edges' durations by (event name, edge type, bound_by).

Times are the simulator's own µs: the writer puts time zero at ``ORIGIN_US`` and HTA
subtracts the trace's earliest timestamp, which is the first step marker at 0.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

EAGER = {"algorithm": "dspark", "phases.draft.graph": "eager", "phases.verify.graph": "eager",
         "steps": 12, "warmup_steps": 2}
CASES = {
    # no CUDA graphs, GPU-bound, coarse barrier: a 356 µs gap on every step
    "eager-coarse": {**EAGER, "policy.barrier": "coarse"},
    # no CUDA graphs, CPU-bound (the scheduler's python work is not in a capture)
    "eager-fine-cpu": {**EAGER, "policy.barrier": "fine", "cpu.schedule_us": 6000},
    # CUDA graphs (draft and verify), coarse barrier
    "graph-coarse": {"algorithm": "dspark", "steps": 12, "warmup_steps": 2,
                     "policy.barrier": "coarse"},
}
STEPS = range(3, 10)


def captures(out: Path) -> None:
    from simwar.api import simulate
    from simwar.capture.synthetic import write_kineto

    for case, overrides in CASES.items():
        (out / case).mkdir(parents=True, exist_ok=True)
        write_kineto(simulate(None, overrides).trace, out / case / "rank0.json")


def hta(out: Path) -> dict:
    import contextlib
    import io
    import logging
    import warnings
    from collections import defaultdict

    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import hta as hta_pkg
    from hta.trace_analysis import TraceAnalysis

    result: dict = {"hta_version": getattr(hta_pkg, "__version__", "0.5.0"),
                    "annotation": "ProfilerStep", "cases": {}}
    for case, overrides in CASES.items():
        ta = TraceAnalysis(trace_dir=str(out / case))
        steps = {}
        for k in STEPS:
            with contextlib.redirect_stdout(io.StringIO()):
                g, ok = ta.critical_path_analysis(rank=0, annotation="ProfilerStep",
                                                  instance_id=k)
            if not ok:
                steps[k] = {"ok": False}
                continue
            nodes = sorted((g.node_list[n] for n in g.critical_path_nodes), key=lambda n: n.ts)
            edges = g.get_critical_path_breakdown()
            by = defaultdict(float)
            for r in edges.to_dict("records"):
                name = r["s_name"] if isinstance(r["s_name"], str) else ""
                by[f"{name}|{r['type']}|{r['bound_by']}"] += float(r["duration"])

            steps[k] = {"ok": True, "first": _node(g, nodes[0]), "last": _node(g, nodes[-1]),
                        "length": float(edges.duration.sum()),
                        "edges": {key: round(v, 3) for key, v in sorted(by.items())}}
        result["cases"][case] = {"overrides": overrides, "steps": steps}
    return result


def _node(g, n) -> dict:
    return {"ts": float(n.ts), "name": g._get_node_name(n.ev_idx), "is_start": bool(n.is_start)}


if __name__ == "__main__":
    what, folder = sys.argv[1], Path(sys.argv[2])
    if what == "captures":
        captures(folder)
    else:
        json.dump(hta(folder), sys.stdout, indent=1, sort_keys=True)
        print()
