"""The fast executor's ranks (executors/fast/ranks.py, one pass per rank, which a run that
needs a Trace takes) give the SimPy engine's answers exactly.

Every rank's Trace column by column (bit for bit, NaNs included), its per-step table and
races, and the run's summary (rank 0's keys, the rank keys, the straggler and skew keys),
on the shipped tensor-parallel config and on random variants of it and of other configs
(jitter, a slow rank, per-rank costs, the broadcast and all-gather on and off, spinning and
blocking waits, device collectives of random counts, late work at the loop top or the
launch, 2 to 4 ranks).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simwar.api import resolve_engine, resolve_sizes, simulate, simulate_many
from simwar.builder.ranks import rank_programs
from simwar.cli.app import main
from simwar.config import load_config
from simwar.core.program import (
    Collective,
    CpuWork,
    GraphLaunch,
    HostCollective,
    Kernel,
    Program,
    StepMarker,
)
from simwar.executors import ranks as simpy_ranks
from simwar.executors.fast import ranks as fast_ranks

SHIPPED = "configs/tp2_slow_rank.yaml"
RANKS = sorted(Path("configs").glob("tp*.yaml"))
SHORT = {"steps": 60, "warmup_steps": 5}


def _bits(x) -> np.ndarray:
    x = np.asarray(x)
    return x.view(np.int64) if x.dtype == np.float64 else x


def assert_same_trace(a, b) -> None:
    assert a.strings == b.strings
    assert a.meta == b.meta
    for name in ("spans", "ops", "accesses", "markers"):
        ca, cb = getattr(a, name).columns(), getattr(b, name).columns()
        assert ca.keys() == cb.keys(), name
        for k in ca:
            x, y = np.asarray(ca[k]), np.asarray(cb[k])
            assert x.dtype == y.dtype and x.shape == y.shape, (name, k)
            assert np.array_equal(_bits(x), _bits(y)), (name, k)


def assert_same_value(a, b, where: str) -> None:
    if isinstance(a, float) and isinstance(b, float):
        assert np.float64(a).view(np.int64) == np.float64(b).view(np.int64), (where, a, b)
    else:
        assert type(a) is type(b) and a == b, (where, a, b)


def assert_same_tables(ref, got) -> None:
    """The run's summary and per-step table, bit for bit."""
    assert ref.summary.keys() == got.summary.keys()
    for k, v in ref.summary.items():
        assert_same_value(v, got.summary[k], k)
    assert ref.columns.keys() == got.columns.keys()
    for k, v in ref.columns.items():
        assert np.array_equal(_bits(v), _bits(got.columns[k])), k


def assert_same_run(ref, got) -> None:
    assert_same_tables(ref, got)
    assert len(ref.ranks) == len(got.ranks)
    for a, b in zip(ref.ranks, got.ranks):
        assert a.rank == b.rank
        assert a.summary.keys() == b.summary.keys()
        for k, v in a.summary.items():
            assert_same_value(v, b.summary[k], f"rank{a.rank}.{k}")
        for k, v in a.columns.items():
            assert np.array_equal(_bits(v), _bits(b.columns[k])), (a.rank, k)
        assert a.hazards.races == b.hazards.races
        assert_same_trace(a.trace, b.trace)
    assert_same_trace(ref.combined, got.combined)


@pytest.mark.parametrize("path", RANKS, ids=lambda p: p.stem)
def test_the_shipped_configs_run_in_one_pass_as_on_the_engine(path):
    cfg = load_config(path, {"steps": 150, "warmup_steps": 10})
    assert resolve_engine(None, cfg) == resolve_engine("fast", cfg) == "fast"
    assert resolve_engine("auto", cfg, want_trace=True) == "fast"  # it keeps the Traces
    ref, got = simulate(cfg, engine="simpy"), simulate(cfg, engine="fast", trace_for="a Trace")
    assert (ref.engine, got.engine) == ("simpy", "fast")
    assert got.summary["straggler_rank"] == 1 and got.summary["rank0_races"] >= 0
    assert_same_run(ref, got)
    assert simulate(cfg).engine == "fast"
    # a config may name the engine (no longer a bad input)
    named = load_config(path, {"steps": 150, "warmup_steps": 10, "engine": "fast"})
    assert simulate(named).summary == got.summary
    # a sweep runs it alone, as simulate does
    assert simulate_many([cfg]) == [got.summary]


def _variant(seed: int) -> tuple[str, dict]:
    """A random tensor-parallel variant: ``(base config, overrides)``."""
    rng = np.random.default_rng(seed)
    dspark = rng.random() < 0.6
    base = str(rng.choice(["configs/tp2_slow_rank.yaml", "configs/dspark_fine.yaml",
                           "configs/dspark_coarse.yaml"]) if dspark else
               rng.choice(["configs/eagle_fine.yaml", "configs/none_coarse.yaml",
                           "configs/dflash_legacy_host_sync.yaml", "configs/eagle_none.yaml"]))
    tp = int(rng.integers(2, 5))

    def us(low: float, high: float):
        if rng.random() < 0.5:
            return float(np.round(rng.uniform(low, high), 1))
        return {"dist": "lognormal", "mean": float(rng.uniform(low, high)),
                "std": float(rng.uniform(low, high))}

    parallel = {"tp": tp, "broadcast": bool(rng.random() < 0.8), "broadcast_us": us(20, 300),
                "allgather": bool(rng.random() < 0.5), "allgather_us": us(50, 500),
                "wait": str(rng.choice(["spin", "block"])), "wake_us": us(2, 40)}
    ranks: dict = {"jitter_us": us(0, 300), "at": str(rng.choice(["loop_top", "launch"]))}
    if rng.random() < 0.7:
        ranks.update(slow_rank=int(rng.integers(0, tp)), slow_us=us(100, 1500))
    if rng.random() < 0.5:
        ranks["per_rank"] = {int(rng.integers(1, tp)): {"cpu.schedule_us": us(300, 2000)}}
    over = {**SHORT, "seed": int(rng.integers(0, 1000)), "parallel": parallel, "ranks": ranks}
    if dspark and rng.random() < 0.8:
        verify = {"name": "verify", "body_us": float(rng.uniform(800, 3000)),
                  "collectives": [{"name": "allreduce", "us": us(5, 40),
                                   "count": int(rng.integers(1, 12))}]}
        over["phases"] = [verify] + ([{"name": "draft", "collectives": [
            {"name": "allgather", "us": us(3, 20), "count": int(rng.integers(1, 3))}]}]
            if rng.random() < 0.5 else [])
    if rng.random() < 0.3:
        over["policy.launch_ahead"] = 2
    return base, over


@pytest.mark.parametrize("seed", range(12))
def test_random_tensor_parallel_variants_run_in_one_pass_as_on_the_engine(seed):
    base, over = _variant(seed)
    cfg = load_config(base, over)
    ref, got = simulate(cfg, engine="simpy"), simulate(cfg, engine="fast", trace_for="a Trace")
    assert got.summary["tp"] == cfg.tp > 1
    assert_same_run(ref, got)


def _rank(host_us: float, body_us: float, wake_us: float = 0.0, collective: bool = True,
          host_first: bool = True):
    nodes = (Kernel("body", body_us, phase="p"),) + (
        (Collective("allreduce", 20.0, "p"),) if collective else ())
    launch = GraphLaunch("forward", "g", nodes, 0, "p", 5.0)
    bcast = HostCollective("broadcast", 0, 10.0, wake_us)
    ops = [bcast, launch] if host_first else [launch, bcast]
    return Program(ops=[StepMarker(0), CpuWork("work", host_us, 0), *ops, StepMarker(1)])


@pytest.mark.parametrize("wake", [0.0, 7.0])
def test_hand_built_ranks_match_the_engine(wake):
    programs = [_rank(100.0, 50.0, wake), _rank(300.0, 80.0, wake), _rank(10.0, 500.0, wake)]
    ref, _ = simpy_ranks.run_ranks(programs)
    for a, b in zip(ref, fast_ranks.run_ranks(programs)):
        assert_same_trace(a, b)


def test_collectives_it_cannot_follow_are_left_to_the_engine():
    # a rank that never reaches a collective: the engine's deadlock decides
    with pytest.raises(fast_ranks.Unfollowable):
        fast_ranks.run_ranks([_rank(100.0, 50.0), _rank(100.0, 50.0, collective=False)])
    with pytest.raises(simpy_ranks.Deadlock):
        simpy_ranks.run_ranks([_rank(100.0, 50.0), _rank(100.0, 50.0, collective=False)])
    # the same collectives issued in another order: the engine runs them, one pass cannot
    mixed = [_rank(100.0, 50.0), _rank(100.0, 50.0, host_first=False)]
    with pytest.raises(fast_ranks.Unfollowable):
        fast_ranks.run_ranks(mixed)
    assert len(simpy_ranks.run_ranks(mixed)[0]) == 2


def test_program_ops_are_read_once_per_rank():
    cfg = load_config(SHIPPED, SHORT)
    programs = rank_programs(cfg, resolve_sizes(cfg))
    traces = fast_ranks.run_ranks(programs)
    assert [t.meta["rank"] for t in traces] == [0, 1]
    assert all(len(t.meta["collectives"]["op"]) == 2 * 60 + 32 * 60 for t in traces)


def test_the_cli_exports_the_same_perfetto_trace_from_either_engine(tmp_path, capsys):
    files = {}
    for engine in ("simpy", "fast"):
        files[engine] = tmp_path / f"{engine}.json"
        assert main(["run", SHIPPED, "--set", "steps=40", "--engine", engine,
                     "--trace", str(files[engine]), "-q"]) == 0
    text = files["fast"].read_text()
    assert all(f'"r{k}.forward"' in text for k in (0, 1))
    assert text == files["simpy"].read_text()
