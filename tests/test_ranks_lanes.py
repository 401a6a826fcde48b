"""Tensor-parallel ranks in lockstep (executors/lockstep/ranks.py, a lane per rank: what
``engine: fast`` runs when no Trace is asked for) give the SimPy engine's answers bit for bit:
every summary key (rank 0's, the ranks', straggler and skew), the group's per-step table,
each rank's summary, per-step table and race list, on the shipped tensor-parallel config and
on random tensor-parallel variants (Hypothesis: jitter, a slow rank, per-rank costs, the
broadcast and all-gather on and off, spinning and blocking waits, device collectives,
2 to 4 ranks). Ranks whose plans differ in structure are refused by name and run by the
next executor.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_ranks_fast import (
    _bits,
    _variant,
    assert_same_tables,
    assert_same_trace,
    assert_same_value,
)

from simwar.api import resolve_sizes, simulate
from simwar.config import load_config
from simwar.executors.lockstep import ranks as lanes
from simwar.executors.lockstep.ranks import RanksApart, run_ranks

SHIPPED = "configs/tp2_slow_rank.yaml"


def assert_same_answers(ref, got) -> None:
    assert got.engine == "fast" and got.refused == ()
    assert all(r._trace is None for r in got.ranks)  # none kept
    assert_same_tables(ref, got)
    assert [r.rank for r in ref.ranks] == [r.rank for r in got.ranks]
    for a, b in zip(ref.ranks, got.ranks):
        assert a.summary.keys() == b.summary.keys()
        for k, v in a.summary.items():
            assert_same_value(v, b.summary[k], f"rank{a.rank}.{k}")
        assert a.columns.keys() == b.columns.keys()
        for k, v in a.columns.items():
            assert np.array_equal(_bits(v), _bits(b.columns[k])), (a.rank, k)
        assert a.hazards.races == b.hazards.races
        assert list(a.hazards.observed) == list(b.hazards.observed)


def test_ranks_planned_from_their_programs_give_the_same_answers():
    """A rank whose coupling a plan of its first iterations cannot express is planned from
    its Program: the same plan."""
    cfg = load_config(SHIPPED, {"steps": 40, "warmup_steps": 3})
    sizes = resolve_sizes(cfg)
    templated = [lanes.plan_rank(cfg, r, sizes) for r in range(cfg.tp)]
    built = [lanes.plan_program(p, ranks=True)
             for p in lanes.rank_programs(cfg, sizes, uniform=True)]
    for a, b in zip(templated, built):
        assert [(x.shape, x.steps) for x in a.blocks] == [(y.shape, y.steps) for y in b.blocks]
    (ta, ca), (tb, cb) = lanes.run_plans(templated), lanes.run_plans(built)
    for a, b in zip(ta, tb):
        assert a.summary == b.summary and a.hazards.races == b.hazards.races
    assert np.array_equal(ca.arrive, cb.arrive) and np.array_equal(ca.leave, cb.leave)


def test_the_shipped_config_runs_in_lockstep_as_on_the_engine():
    cfg = load_config(SHIPPED, {"steps": 200, "warmup_steps": 10})
    ref, got = simulate(cfg, engine="simpy"), simulate(cfg)
    assert got.summary["straggler_rank"] == 1
    assert_same_answers(ref, got)
    # a Trace read afterwards: the ranks run again, keeping theirs (engine auto)
    assert got.has_trace
    assert_same_trace(got.trace, ref.trace)
    assert_same_trace(got.combined, ref.combined)
    assert not simulate(cfg, engine="fast").has_trace


def test_the_shipped_config_without_overlap_runs_in_lockstep_as_on_the_engine():
    """The normal loop: its drain is an iteration of no operation (a block whose lanes have
    nothing to run)."""
    cfg = load_config(SHIPPED, {"steps": 40, "warmup_steps": 3, "policy.overlap": False})
    assert_same_answers(simulate(cfg, engine="simpy"), simulate(cfg))


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 2**31 - 1))
def test_random_tensor_parallel_variants_run_in_lockstep_as_on_the_engine(seed):
    base, over = _variant(seed)
    cfg = load_config(base, over)
    assert_same_answers(simulate(cfg, engine="simpy"), simulate(cfg, engine="fast"))


def test_ranks_of_different_structures_are_refused_by_name(monkeypatch):
    cfg = load_config(SHIPPED, {"steps": 30, "warmup_steps": 3})
    real = lanes.plan_rank

    def apart(cfg, rank, sizes):  # rank 1 plans one iteration fewer
        plan = real(cfg, rank, sizes)
        if rank == 1:
            plan.blocks = plan.blocks[:-1]
        return plan

    monkeypatch.setattr(lanes, "plan_rank", apart)
    with pytest.raises(RanksApart, match="different structures"):
        run_ranks(cfg, resolve_sizes(cfg))
    got = simulate(cfg)  # the ranks' one pass then runs it, the reason kept
    assert got.refused == (("fast", "the ranks issue different structures"),)
    assert got.ranks[0].trace is not None
    assert got.summary == simulate(cfg, engine="simpy").summary


def test_a_coupling_the_plan_cannot_express_is_planned_from_the_programs():
    """A drawn body split around its collectives is no draw of a plan: refused by name
    (``Unplanned``), the ranks are planned from their Programs and still run in lockstep."""
    over = {"steps": 40, "warmup_steps": 3, "phases": [
        {"name": "verify", "body_us": {"dist": "lognormal", "mean": 1500, "std": 200},
         "collectives": [{"name": "allreduce", "us": 10, "count": 4}]}]}
    cfg = load_config(SHIPPED, over)
    with pytest.raises(lanes.Unplanned, match="body is drawn"):
        lanes.plan_rank(cfg, 0, resolve_sizes(cfg))
    assert_same_answers(simulate(cfg, engine="simpy"), simulate(cfg))
