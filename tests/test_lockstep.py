"""Runs in lockstep give every run the fast executor's summary, bit for bit.

Random grids (Hypothesis) over a random base config: every algorithm, barrier and
placement, the plan stream, the seq_lens mirror; swept constants (zero and positive: a zero
CPU time issues no op, so one grid holds several structures), distributions and affine
durations, repeats (seeds), workloads whose steps differ (batch lists, drawn batches, drawn
accepted tokens) and arrivals (which run alone). Every summary key of every run equals the
summary of ``simulate(config)`` (floats ``==``, dicts in order), and the sweep built on it
writes the same run files and table as running each config by itself.
"""

from __future__ import annotations

import itertools
import json
import math
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fast import CONFIG_FILES, VARIANTS, applies

from simwar.analysis import batched
from simwar.api import build_program, draw_sizes, simulate, simulate_many
from simwar.config import load_config
from simwar.core.program import Marker
from simwar.core.rules import begins, begins_many, released, released_many, returns, returns_many
from simwar.executors import fast, lockstep
from simwar.study.sweeps import load_sweep, run_one, sweep

DISTS = [{"dist": "lognormal", "mean": 900, "std": 300},
         {"dist": "uniform", "low": 0, "high": 40},
         {"dist": "empirical", "values": [600, 800, 1500]},
         {"dist": "normal", "mean": 20, "std": 40}]
AFFINES = [{"base": 150, "per_seq": 25}, {"base": 80, "per_seq": 12, "per_token": 2},
           {"base": 5, "per_seq": 1, "noise": {"dist": "normal", "mean": 20, "std": 15}}]
WORKLOADS = [None, {"batch_sizes": [1, 7, 33, 64, 2], "graph_buckets": [8, 32, 64]},
             {"batch_size": {"dist": "lognormal", "mean": 12, "std": 10}}]
#: a graph phase's device time per bucket (the buckets of WORKLOADS[1])
PER_BUCKET = [{"per_bucket": {8: 1682.0, 32: 1950.0, 64: 2400.0}},
              {"per_bucket": {8: 900.0, 32: 2700.0, 64: 2500.0}},
              {"per_bucket": {8: 1200.0, 32: 1300.0, 64: 4100.0},
               "noise": {"dist": "uniform", "low": 0, "high": 90}}]
SWEPT = ["cpu.schedule_us", "cpu.ingest_us", "cpu.post_launch_us", "gpu.schedule_writes_us",
         "gpu.result_writes_us", "costs.host_call_us", "costs.cross_stream_us",
         "costs.sync_wake_us", "gpu.schedule_prep_us"]


def same(a, b) -> bool:
    """Equal, NaN where NaN, dicts in the same order."""
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def assert_same_summary(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        assert same(got[key], value), (key, got[key], value)


values = st.one_of(st.sampled_from([0.0, 0.5, 7.0, 120.0, 900.0, 2500.0]),
                   st.sampled_from(DISTS), st.sampled_from(AFFINES))


@settings(max_examples=60, deadline=None)
@given(algorithm=st.sampled_from(["none", "eagle", "dflash", "dspark"]),
       barriers=st.lists(st.sampled_from(["none", "coarse", "fine", "host_sync"]), min_size=1,
                         max_size=2, unique=True),
       placement=st.sampled_from(["after_launch", "loop_top"]), plan_stream=st.booleans(),
       seq_lens=st.booleans(), steps=st.integers(3, 45), warmup=st.integers(0, 6),
       keys=st.lists(st.sampled_from(SWEPT), min_size=1, max_size=2, unique=True),
       grid=st.data(), repeats=st.integers(1, 3),
       workload=st.sampled_from(range(len(WORKLOADS))), accept=st.booleans(),
       phase_body=st.one_of(st.none(), values, st.sampled_from(PER_BUCKET)))
def test_every_run_of_a_random_grid_is_its_own_run_bit_for_bit(
        algorithm, barriers, placement, plan_stream, seq_lens, steps, warmup, keys, grid,
        repeats, workload, accept, phase_body):
    if phase_body in PER_BUCKET and workload != 1:  # a table for the buckets it gives
        workload = 1
    phase = {"none": "decode"}.get(algorithm, "verify")
    base = {"name": "grid", "algorithm": algorithm, "steps": steps,
            "warmup_steps": min(warmup, steps - 3), "policy": {"placement": placement,
                                                                "plan_stream": plan_stream,
                                                                "needs_cpu_seq_lens": seq_lens}}
    if WORKLOADS[workload] is not None:
        base["workload"] = WORKLOADS[workload]
    if accept:
        base["accept"] = {"tokens": {"dist": "empirical", "values": [1, 2, 3, 4]}}
    swept = {"policy.barrier": barriers}
    for key in keys:
        swept[key] = grid.draw(st.lists(values, min_size=1, max_size=3), label=key)
    if phase_body is not None:
        swept[f"phases.{phase}.body_us"] = [phase_body, 3000.0]
    spec = {"base": base, "grid": swept, "repeats": repeats}
    runs = load_sweep(spec).runs
    got = simulate_many([run.config for run in runs])
    for run, summary in zip(runs, got):
        assert_same_summary(summary, simulate(run.config).summary)


@pytest.mark.parametrize("variant", ["short", "noisy", "workload_bimodal", "loop_top_seq_lens",
                                     "overlap_off"])
def test_every_shipped_config_in_lockstep_is_its_own_run(variant):
    """Every shipped config, in the exactness suite's variants, three seeds of each in one
    lockstep batch."""
    configs = [load_config(path, {**VARIANTS[variant], "seed": seed})
               for path in CONFIG_FILES if applies(path, variant) for seed in range(3)]
    for cfg, summary in zip(configs, simulate_many(configs)):
        assert_same_summary(summary, simulate(cfg).summary)


def test_runs_that_pick_their_shapes_run_alone_each_its_own_summary():
    """A batch of runs whose scheduler picks each step's shape under each rule (the mixed
    rules too: a decode step when no prompt token waits), the same requests: every summary
    is its own run's, whichever executor ran it."""
    path = next(p for p in CONFIG_FILES if p.stem == "sglang_default_prefill")
    configs = [load_config(path, {"steps": 90, "warmup_steps": 5, "seed": seed,
                                  "scheduling.rule": rule})
               for rule in ("sglang", "sglang_mixed", "vllm") for seed in range(2)]
    assert [c.shapes_vary for c in configs] == [True] * 6
    for cfg, summary in zip(configs, simulate_many(configs)):
        assert_same_summary(summary, simulate(cfg, engine="simpy").summary)


def test_a_grid_runs_in_lockstep_and_its_constants_and_draws_are_per_run(monkeypatch):
    """The groups really run together (one pass per batch), whatever each run's numbers,
    each run's plan bound from its group's one template (none planned on its own)."""
    calls, united = [], []
    real = lockstep.run_group
    monkeypatch.setattr(lockstep, "run_group",
                        lambda plans, *a: calls.append(len(plans)) or real(plans, *a))
    real_united = lockstep.run_united
    monkeypatch.setattr(lockstep, "run_united", lambda groups, *a: united.append(
        [len(g) for g in groups]) or real_united(groups, *a))
    own = []
    real_plan = fast.plan_config
    monkeypatch.setattr(fast, "plan_config", lambda *a, **k: own.append(1) or real_plan(*a, **k))
    spec = {"base": {"steps": 60, "warmup_steps": 5},
            "grid": {"policy.barrier": ["coarse", "fine"],
                     "cpu.schedule_us": [200.0, 900.0, DISTS[0]],
                     "phases.verify.body_us": [3000.0, 5100.0]},
            "repeats": 2}
    runs = load_sweep(spec).runs
    got = simulate_many([run.config for run in runs])
    # per barrier: constants (8 runs), a distribution (4: drawn per pass, its own group); the
    # two barriers' constants differ in one op a step, and run as one pass
    assert sorted(calls) == [4, 4] and united == [[8, 8]]
    assert not own  # every plan bound from a template
    monkeypatch.undo()
    for run, summary in zip(runs, got):
        assert_same_summary(summary, simulate(run.config).summary)
    assert len({s["cpu_blocked_us_mean"] for s in got}) > 8  # each run its own numbers


def test_per_bucket_tables_swept_share_one_template(monkeypatch):
    """Runs whose graph phases differ only in their per-bucket tables (and a table with
    noise) run as one group bound from one template, each run its own numbers."""
    calls, united = [], []
    real = lockstep.run_group
    monkeypatch.setattr(lockstep, "run_group",
                        lambda plans, *a: calls.append(len(plans)) or real(plans, *a))
    real_united = lockstep.run_united
    monkeypatch.setattr(lockstep, "run_united", lambda groups, *a: united.append(
        [len(g) for g in groups]) or real_united(groups, *a))
    own = []
    real_plan = fast.plan_config
    monkeypatch.setattr(fast, "plan_config", lambda *a, **k: own.append(1) or real_plan(*a, **k))
    spec = {"base": {"steps": 50, "warmup_steps": 4, "workload": WORKLOADS[1]},
            "grid": {"phases.verify.body_us": PER_BUCKET[:2],
                     "phases.draft.body_us": [{"per_bucket": {8: 300.0, 32: 420.0, 64: 380.0}},
                                              {"per_bucket": {8: 150.0, 32: 150.0, 64: 900.0}}],
                     "phases.draft.prep_us": [PER_BUCKET[2]]},
            "repeats": 2}
    runs = load_sweep(spec).runs
    got = simulate_many([run.config for run in runs])
    assert calls == [8] and not own  # one group, every plan bound from its template
    monkeypatch.undo()
    for run, summary in zip(runs, got):
        assert_same_summary(summary, simulate(run.config).summary)
    assert len({s["fwd_us_mean"] for s in got}) == 8  # each table (and seed) its own forward


def test_arrivals_and_the_simpy_engine_run_alone_with_their_own_summary():
    arrivals = {"steps": 40, "warmup_steps": 3,
                "workload": {"arrivals": {"rate_per_s": 700}, "max_batch": 8,
                             "output_tokens": 9}}
    configs = [load_config(None, {**arrivals, "seed": s}) for s in range(2)]
    configs.append(load_config(None, {"steps": 30, "warmup_steps": 2, "engine": "simpy"}))
    for cfg, summary in zip(configs, simulate_many(configs)):
        assert_same_summary(summary, simulate(cfg).summary)


@pytest.mark.parametrize("variant", ["workload_arrivals", "prompts_chunked", "closed_loop_off"])
def test_runs_with_requests_run_in_lockstep_as_their_own_runs(variant):
    """Requests that arrive (arrivals, prompts, a closed loop): each processed result is
    marked (``result_done``, the first token a client sees) and each run's batches depend on
    its own times. A group of them runs in lockstep, each run's sizes fixed as the group
    goes: every summary is that run's own, bit for bit."""
    names = ["dspark_fine.yaml", "eagle_coarse.yaml", "dflash_legacy_host_sync.yaml",
             "none_none.yaml"]
    paths = [p for p in CONFIG_FILES if p.name in names]
    assert len(paths) == len(names)
    for path in paths:
        configs = [load_config(path, {**VARIANTS[variant], "seed": seed}) for seed in range(3)]
        if configs[0].shapes_vary:  # prompts: planned as it runs, from its Program's steps
            assert any(isinstance(op, Marker) and op.name == "result_done"
                       for op in build_program(configs[0]).ops)
        else:
            plan = fast.plan_config(configs[0], draw_sizes(configs[0]), fill=False)
            assert any(h.kind == "result_done" for b in plan.blocks for h in b.shape.host)
        got = lockstep.realize_group(configs)
        for cfg, summary in zip(configs, got):
            assert_same_summary(summary, simulate(cfg).summary)
        assert "request_ttft_us_mean" in got[0]
        assert len({s["request_ttft_us_mean"] for s in got}) > 1  # each run its own requests


def test_a_reduction_along_the_steps_is_each_runs_own_sum():
    """The batched summary's sums: numpy sums each row of a 2-d array (a view of one too) as
    it sums that row alone (pairwise), whatever its length."""
    rng = np.random.default_rng(4)
    for n in [*range(0, 40), 127, 128, 129, 1000, 8191, 8192, 8193, 20_001]:
        x = rng.lognormal(5, 3, (9, n + 3))
        for rows in (x, x[2:7, 1:n + 1], x[:, ::2][:, rng.random((n + 4) // 2) < 0.9]):
            assert batched._sums(rows).tolist() == \
                [float(np.add.reduce(np.array(r))) for r in rows], n


def test_the_rules_over_arrays_are_the_rules_element_by_element():
    rng = np.random.default_rng(2)
    a = rng.choice([0.0, 1.0, 2.5, 7.0], 500)
    b = rng.choice([0.0, 1.0, 2.5, 7.0], 500)
    c = rng.choice([0.0, 0.5, 3.0], 500)
    assert begins_many(a, b).tolist() == [begins(x, y) for x, y in zip(a, b)]
    for same_stream in (False, True):
        assert released_many(a, b, c, same_stream).tolist() == \
            [released(x, y, z, same_stream) for x, y, z in zip(a, b, c)]
    assert returns_many(a, c, b, c).tolist() == \
        [returns(x, y, z, w) for x, y, z, w in zip(a, c, b, c)]
    assert returns_many(a, c, None, c).tolist() == [returns(x, y, None, 0) for x, y in zip(a, c)]
    one = b[:1].reshape(())  # a record every run shares (0-d): numpy's where, not putmask
    assert returns_many(a, c, one, c).tolist() == \
        [returns(x, y, float(one), w) for x, y, w in zip(a, c, c)]


def test_a_minus_zero_duration_runs_alone():
    configs = [load_config(None, {"steps": 20, "warmup_steps": 2, "gpu.result_copy_us": v})
               for v in (-0.0, 0.0, 5.0)]
    for cfg, summary in zip(configs, simulate_many(configs)):
        assert_same_summary(summary, simulate(cfg).summary)


def test_a_negative_or_minus_zero_parameter_is_refused():
    # the generated code takes a tail set since the host clock last moved as at or after it,
    # which holds for durations >= 0 only: such a group runs one by one (the config schema
    # allows no negative duration; a plan made otherwise may hold one)
    from simwar.executors.lockstep.execute import _unfit

    assert _unfit([1.0, -0.0]) and _unfit(np.array([[2.0], [-1e-300]]))
    assert not _unfit([0.0, 3.5]) and not _unfit(np.array(7.0))


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_lockstep_sweep_writes_the_run_files_and_table_of_runs_one_by_one(tmp_path, jobs):
    spec = {"base": {"steps": 50, "warmup_steps": 4},
            "grid": {"algorithm": ["eagle", "dspark"], "policy.barrier": ["none", "fine"],
                     "cpu.schedule_us": [300.0, DISTS[0]]},
            "repeats": 2}
    frame = sweep(spec, tmp_path / "out", jobs=jobs, run_files=True)
    plan = load_sweep(spec)
    for run in plan.runs:
        record = json.loads((tmp_path / "out" / "runs" / f"{run.run_key}.json").read_text())
        assert record["summary"] == run_one(run.config)
    rows = frame.set_index("run_id")
    for run in plan.runs:
        assert rows.loc[run.run_id, "step_us_mean"] == run_one(run.config)["step_us_mean"]
    assert list(itertools.accumulate(frame.run_id))[-1] == sum(range(len(plan.runs)))


def test_runs_differing_in_numbers_are_bound_together_and_equal_their_own_runs(monkeypatch):
    import simwar.api as api

    bound = []
    real = api._bound_many

    def spy(*args):
        out = real(*args)
        bound.append(len(out))
        return out

    monkeypatch.setattr(api, "_bound_many", spy)
    configs = [load_config(None, {"steps": 40, "warmup_steps": 3, "seed": seed,
                                  "name": f"r{seed}-{i}", "cpu.schedule_us": 300.0 + 7.5 * i,
                                  "costs.host_call_us": 2.0 + i, "cpu.ingest_us": 10.0 * i,
                                  "gpu.result_writes_us": DISTS[0]})
               for seed in (1, 2) for i in range(6)]
    for cfg, summary in zip(configs, simulate_many(configs)):
        assert_same_summary(summary, simulate(cfg).summary)
    # cpu.ingest_us 0 issues no op: that run is of its own; the others are bound at once
    assert bound == [2, 10]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="forks a child process")
def test_a_batchs_fresh_arrays_are_private_to_a_forked_worker():
    """A sweep's worker processes are forked after the parent may have left a batch's arrays
    spare: a child writing them must not change the parent's (a shared map did, and two jobs
    then gave other rows than one)."""
    from simwar.executors.lockstep import execute
    arr = execute._fresh(1 << 16)  # large enough to be mapped, not numpy's
    arr.fill(0.0)
    pid = os.fork()
    if pid == 0:  # the child: write the pages and leave at once
        arr.fill(1.0)
        os._exit(0)
    os.waitpid(pid, 0)
    assert not arr.any()


def test_a_window_carried_into_a_block_is_added_first_when_summed_in_its_rows():
    """A block whose segments each close one window sums it in the rows of ``busy`` and
    ``dep`` themselves (the array target), its first sum written there; a window carried in
    from the block before is added first, as the form that sums in a scratch row and copies
    (``picked``) adds it, bit for bit (the pass runs that form for its first segment)."""
    from simwar.executors.fast.codegen import compile_block
    from simwar.executors.lockstep.execute import State, _stack_consts, run_passes

    cfgs = [load_config(None, {"steps": 12, "warmup_steps": 2, "cpu.schedule_us": v})
            for v in (150.0, 400.0, 900.0)]
    plans = [fast.plan_config(c, draw_sizes(c)) for c in cfgs]
    plan = plans[0]
    main = max(range(len(plan.blocks)), key=lambda i: plan.blocks[i].n)
    got = {}
    for target in ("array", "picked"):
        state = State(plan.lo, plan.hi, plan.sites, plan.depth, len(plans))
        for bi, b in enumerate(plan.blocks):
            slots = tuple(c is None for c in b.consts)
            assert not any(slots)
            how = (b.shape, slots, "forward", False, (), plan.depth)
            fn = compile_block(*how, target=target)
            steps = [k - plan.lo for k in b.steps]
            if bi == main:
                assert fn.sums_in_rows == (target == "array")
                state.w, state.dp = np.array([3.0, 0.1, 7.25]), np.array([1.5, 0.0, 0.3])
                if target == "array":
                    with pytest.raises(ValueError, match="carried"):
                        fn(steps, _stack_consts(plans, bi), (), state)
            run_passes(fn, how, steps, _stack_consts(plans, bi), (), state)
        got[target] = [a.copy() for a in (state.busy, state.dep, state.fs, state.fe,
                                          *state.blocked.values())]
    assert all(np.array_equal(a, b) for a, b in zip(got["array"], got["picked"]))


BARRIERS = ["none", "coarse", "fine", "host_sync"]


def _barrier_grid(algorithm: str, placement: str, **base) -> list:
    spec = {"base": {"steps": 30, "warmup_steps": 3, "algorithm": algorithm,
                     "policy": {"placement": placement}, **base},
            "grid": {"policy.barrier": BARRIERS, "cpu.schedule_us": [200.0, 900.0],
                     "gpu.result_writes_us": [15.0, DISTS[1]]}}
    # each run named (a plan's meta says which run it is)
    return [{**run.config, "name": f"run{run.run_id}"} for run in load_sweep(spec).runs]


@pytest.mark.parametrize("placement", ["after_launch", "loop_top"])
@pytest.mark.parametrize("algorithm", ["none", "eagle", "dflash", "dspark"])
def test_groups_that_differ_in_their_barrier_run_united_each_its_own_run(
        monkeypatch, algorithm, placement):
    """A sweep over the barriers: the groups of constants (no wait, a stream wait, a wait on
    an event, a host sync at the step's end) run as one pass over their blocks' unions
    (lockstep.run_united), the coarse and fine runs in it whatever the algorithm; every
    summary is that run's own, bit for bit (races included); the groups drawn per pass run
    as groups of their own."""
    united = []
    real = lockstep.run_united
    monkeypatch.setattr(lockstep, "run_united", lambda groups, *a: united.append(
        [[p.meta["name"] for p in g] for g in groups]) or real(groups, *a))
    runs = _barrier_grid(algorithm, placement)
    barrier = {run["name"]: run["policy"]["barrier"] for run in runs}
    got = simulate_many(runs)
    assert len(united) == 1 and len(united[0]) >= 2
    together = {barrier[name] for group in united[0] for name in group}
    assert {"coarse", "fine"} <= together
    assert sum(map(len, united[0])) == 2 * len(together)  # the drawn runs: not united
    monkeypatch.undo()
    for run, summary in zip(runs, got):
        assert_same_summary(summary, simulate(run).summary)
    races = [s["races"] for s in got if barrier[s["name"]] in together]
    assert len(set(races)) > 1  # groups of different races, each counted as its own


def test_a_united_set_larger_than_a_batch_runs_as_its_groups(monkeypatch):
    """Groups that would unite but do not fit in one batch run as their own groups, each
    run its own summary."""
    monkeypatch.setattr(lockstep, "batch_size", lambda steps: 3)
    calls = []
    real = lockstep.run_group
    monkeypatch.setattr(lockstep, "run_group",
                        lambda plans, *a: calls.append(len(plans)) or real(plans, *a))
    monkeypatch.setattr(lockstep, "run_united", lambda *a: pytest.fail("united"))
    runs = _barrier_grid("dspark", "after_launch")
    got = simulate_many(runs)
    assert calls and max(calls) <= 3
    monkeypatch.undo()
    for run, summary in zip(runs, got):
        assert_same_summary(summary, simulate(run).summary)


def test_groups_unite_only_where_their_unions_cost_less(monkeypatch):
    """``unite`` unites the groups of the four barriers (eagle's coarse and fine one group
    already) where the union's ops, an op a group lacks counted ``GUARD_COST`` times, are
    fewer than the groups' apart over their blocks' passes; with a lacking op costed
    higher than a group's whole block, only the groups whose union lacks none unite."""
    from simwar.executors.lockstep import united

    plans = []
    for b in BARRIERS:
        cfg = load_config(None, {"steps": 30, "warmup_steps": 3, "algorithm": "eagle",
                                 "policy": {"barrier": b}})
        plans.append(fast.plan_config(cfg, draw_sizes(cfg)))
    coarse, fine = plans[1], plans[2]
    assert lockstep.group_key(coarse) == lockstep.group_key(fine)  # eagle: one group
    reps = [plans[0], coarse, plans[3], fine]
    assert united.unite(reps) == [[0, 1, 2, 3]]
    monkeypatch.setattr(united, "GUARD_COST", 1000.0)
    assert united.unite(reps) == [[0], [1, 3], [2]]


def test_a_window_carried_into_a_unions_block_is_added_first_in_every_lane():
    """A union's block whose segments each close one window sums it in the rows of ``busy``
    and ``dep`` (every sum an add, in the lanes too); a window carried in from the block
    before is added to the first pass's row first: each lane's rows equal its run's alone,
    given the same carried window, bit for bit."""
    from simwar.executors.fast.codegen import compile_block
    from simwar.executors.fast.union import PLACED_WAITS, family_codes
    from simwar.executors.lockstep.execute import State, _stack_consts, run_passes
    from simwar.executors.lockstep.family import _consts

    runs = (("coarse", 150.0), ("fine", 400.0), ("coarse", 900.0))
    cfgs = [load_config(None, {"steps": 12, "warmup_steps": 2, "algorithm": "dspark",
                               "policy": {"barrier": b}, "cpu.schedule_us": v})
            for b, v in runs]
    plans = [fast.plan_config(c, draw_sizes(c)) for c in cfgs]
    plan = plans[0]
    unions = family_codes(plans[:2], placed=PLACED_WAITS)
    assert all(u is not None for u in unions) and any(u.guards for u in unions)
    main = max(range(len(plan.blocks)), key=lambda i: plan.blocks[i].n)
    w, dp = np.array([3.0, 0.1, 7.25]), np.array([1.5, 0.0, 0.3])
    lanes = State(plan.lo, plan.hi, plan.sites, plan.depth, len(plans))
    for bi, b in enumerate(plan.blocks):
        u = unions[bi]
        fn = compile_block(u.shape, (False,) * u.shape.nparams, "forward", False, (),
                           plan.depth, target="array", union=u.guards, merged=u.merged)
        if bi == main:
            assert "W = BU[ki]" in fn.source and not fn.sums_in_rows  # in the rows, adds
            lanes.w, lanes.dp = w.copy(), dp.copy()
        fn([k - plan.lo for k in b.steps],
           _consts(u, [p.blocks[bi].consts for p in plans], [0, 1, 0]), (), lanes)
    for j, p in enumerate(plans):
        alone = State(p.lo, p.hi, p.sites, p.depth, 1)
        for bi, b in enumerate(p.blocks):
            how = (b.shape, (False,) * len(b.consts), "forward", False, (), p.depth)
            if bi == main:
                alone.w, alone.dp = w[j:j + 1].copy(), dp[j:j + 1].copy()
            run_passes(compile_block(*how, target="array"), how,
                       [k - p.lo for k in b.steps], _stack_consts([p], bi), (), alone)
        for a, b in [(lanes.busy, alone.busy), (lanes.dep, alone.dep), (lanes.fs, alone.fs),
                     (lanes.fe, alone.fe)] + [(lanes.blocked[s], alone.blocked[s])
                                              for s in p.sites]:
            assert np.array_equal(a[:, j], b[:, 0], equal_nan=True)
