"""lab.profiler_cost without a GPU: its fit of per-event costs, and the shipped table's origin.

The shipped ``simwar/data/profiler_cost.yaml`` must be what ``--to-yaml`` writes from the
committed H200 run (``tests/data/profiler_cost/profiler_cost.json``); the joint fit must give
back the costs a set of benchmarks was made of; with a CPU build of torch the script's dry run
must write its JSON (skipped without torch).
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from lab.profiler_cost import fit_costs, main, nnls, to_yaml

ROOT = Path(__file__).resolve().parents[1]
RUN = ROOT / "tests" / "data" / "profiler_cost" / "profiler_cost.json"
SHIPPED = ROOT / "simwar" / "data" / "profiler_cost.yaml"


def test_the_shipped_table_is_the_committed_run():
    date = yaml.safe_load(SHIPPED.read_text())["source"]["date"]
    assert to_yaml(json.loads(RUN.read_text()), date=date) == SHIPPED.read_text()


def test_the_joint_fit_gives_back_known_costs():
    truth = {"cpu_op": 1.5, "user_annotation": 1.25, "cuda_runtime": 0.25, "kernel": 0.75}
    counts = {"launch": {"cpu_op": 200, "cuda_runtime": 200, "kernel": 200},
              "annotate": {"user_annotation": 200},
              "event": {"cuda_runtime": 600},
              "graph": {"cuda_runtime": 100, "kernel": 3200}}
    deltas = {b: sum(n * truth[k] for k, n in c.items()) for b, c in counts.items()}
    got = fit_costs(deltas, counts, list(counts))
    assert got == pytest.approx(truth, rel=1e-9)


def test_nnls_keeps_every_cost_non_negative():
    a = np.array([[1.0, 1.0], [1.0, 0.0]])
    x = nnls(a, np.array([1.0, 3.0]))  # unconstrained: (3, -2)
    assert (x >= 0).all() and x == pytest.approx([2.0, 0.0])


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="no torch here")
def test_the_dry_run_writes_its_json(tmp_path):
    assert main([str(tmp_path), "--dry-run", "--repeats", "2", "--iters", "2", "--n", "4"]) == 0
    out = json.loads((tmp_path / "profiler_cost.json").read_text())
    assert out["dry_run"] and set(out["settings"]) == {"profiled", "profiled_stack"}
    benches = out["settings"]["profiled"]["benches"]
    assert benches["annotate"]["events_per_iter"]["user_annotation"] == 4
    assert "python_function" in out["settings"]["profiled_stack"]["benches"]["pyfunc"][
        "events_per_iter"]
