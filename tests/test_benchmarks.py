"""The benchmark scripts' own logic: sweep sizes and the import progress lines."""

from __future__ import annotations

import importlib.util
import io
from pathlib import Path

import pytest

from simwar.study.sweeps import load_sweep

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("runs", [1, 7, 20, 200])
def test_bench_sweep_takes_any_positive_number_of_runs(runs):
    bench = _load("bench_sweep")
    plan = load_sweep(bench.benchmark_spec(runs, 50))
    assert len(plan.runs) == runs
    assert len({r.run_key for r in plan.runs}) == runs  # every run is a distinct config
    with pytest.raises(ValueError):
        bench.benchmark_spec(0, 50)


def test_bench_sweep_covers_every_algorithm_and_barrier_at_each_point():
    plan = load_sweep(_load("bench_sweep").benchmark_spec(16, 50))
    combos = {(r.values["algorithm"], r.values["policy.barrier"], r.values["cpu.schedule_us"])
              for r in plan.runs}
    assert len(combos) == 16 and {c[2] for c in combos} == {200.0, 5200.0}


def test_bench_import_progress_shows_small_sizes_and_finishes_once():
    out = io.StringIO()
    progress = _load("bench_import").ProgressPrinter(compressed=True, out=out)
    total = 130_000  # a small gzip: 0 MB at one decimal
    for done in (20_000, 57_000, 99_000, total, total):  # the reader reports the end twice
        progress(done, total)
    lines = out.getvalue().splitlines()
    assert lines == ["  read  15% (0.02 / 0.13 MB compressed)",
                     "  read  43% (0.06 / 0.13 MB compressed)",
                     "  read  76% (0.10 / 0.13 MB compressed)",
                     "  read 100% (0.13 / 0.13 MB compressed)"]
