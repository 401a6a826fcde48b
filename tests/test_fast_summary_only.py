"""Summary-only runs: flat in memory, and what they keep.

A constant config allocates no per-step arrays; races are counted as the run goes and their
logged times dropped (the same counts and first races as the table run's), so a racy run's
memory does not grow with its length. A plan the streaming summary cannot take still has its
summary: streaming needs the forward steps issued in order; otherwise the pass computes the
whole per-step table (the ``collect`` path), and a summary-only run summarizes it before
dropping it, so its summary is the table run's.
"""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest

from simwar.analysis.metrics import measured_rows
from simwar.api import resolve_sizes
from simwar.config import load_config
from simwar.core.program import Kernel, Launch, Program, StepMarker
from simwar.executors import fast
from simwar.executors.fast.execute import run_plan
from simwar.executors.fast.plan import plan_program


def forward(step: int) -> Launch:
    return Launch("forward", Kernel(f"forward{step}", 10.0, phase="decode"), step)


def test_summary_only_of_forward_steps_issued_out_of_order_is_the_table_summary():
    program = Program([StepMarker(0), forward(1), forward(0), StepMarker(1), forward(2),
                       StepMarker(2), forward(3)],
                      meta={"forward_stream": "forward", "warmup_steps": 0})
    full = fast.run(program)
    assert full.paths[1] == "collect"
    streamed = run_plan(plan_program(program), summary_only=True)
    assert streamed.columns is None
    assert list(streamed.summary) == list(full.summary)
    for key, value in full.summary.items():
        assert same(streamed.summary[key], value), key


def same(a, b) -> bool:
    """Equal, or both NaN (a summary is NaN where its quantity is undefined: no launches)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)


# ---------------------------------------------------------------------------- flat memory
CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def test_a_constant_config_has_no_per_step_size_arrays():
    cfg = load_config(CONFIGS / "dspark_fine.yaml", {"steps": 1_000_000})
    sizes = resolve_sizes(cfg)
    for arr in (sizes.batch, sizes.bucket, sizes.accept):
        assert len(arr) == 1_000_000 and arr.strides == (0,) and not arr.flags.writeable


@pytest.mark.parametrize("chunk", [7, 64])
@pytest.mark.parametrize("stem,extra", [("eagle_none", {}), ("dspark_none", {}),
                                        ("eagle_publish_verify", {}),
                                        ("none_coarse_loop_top", {"policy.barrier": "none"}),
                                        ("dflash_none", {"warmup_steps": 0})])
def test_summary_only_counts_and_lists_the_races_of_the_table_run(monkeypatch, stem, extra,
                                                                  chunk):
    """Counted as the run goes, the logged times dropped: the same counts, and the same first
    latent races and observed overlaps of the measured steps, as the table run's."""
    monkeypatch.setattr(fast.execute, "CHUNK", chunk)
    cfg = load_config(CONFIGS / f"{stem}.yaml", {"steps": 400, **extra})
    sizes = resolve_sizes(cfg)
    table = fast.run_config(cfg, sizes)
    flat = fast.run_config(cfg, sizes, summary_only=True)
    for key in ("races", "overlaps", "race_steps"):
        assert flat.summary[key] == table.summary[key], key
    assert table.summary["races"] > 0
    steps = table.columns["step"][measured_rows(table.columns, cfg.warmup_steps)].tolist()
    listed = table.hazards.within(steps)
    for kind in ("latent", "observed"):
        assert getattr(flat.hazards.since(cfg.warmup_steps), kind)[:300] == \
            getattr(listed, kind)[:300], kind
    with pytest.raises(ValueError, match="kept no race list"):
        flat.hazards.frame()


def _peak_mb(steps: int) -> float:
    cfg = load_config(CONFIGS / "dspark_none.yaml", {"steps": steps})
    tracemalloc.start()
    try:
        run = fast.run_config(cfg, resolve_sizes(cfg), summary_only=True)
        peak = tracemalloc.get_traced_memory()[1] / 1e6
    finally:
        tracemalloc.stop()
    assert run.summary["races"] > 8 * (steps - 30)  # every step races
    return peak


def test_summary_only_memory_does_not_grow_with_the_run_racy_or_not(monkeypatch):
    """Past its first chunks (the window of accumulators and the summary's chunk reach their
    size), a racy run's peak memory stays where it is, however many steps and races follow."""
    monkeypatch.setattr(fast.execute, "CHUNK", 2048)
    short, long = _peak_mb(20_000), _peak_mb(80_000)
    assert long - short < 0.5, (short, long)  # 60k more steps, 480k more races
