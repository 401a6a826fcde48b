"""Workloads that change every step: batch sources, graph buckets, affine durations, accepted
tokens per step, arrivals; the per-step table and summary; the harness's workload cases.

Both executors on varying workloads are held bit for bit equal in ``tests/test_fast.py``
(the ``workload_*`` variants of every shipped config, random configs with workloads, and
summary-only runs); here: what the numbers are.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fast import AFFINE, NOISY, assert_same_run, reference

import simwar
from simwar.api import build_program, resolve_sizes
from simwar.builder import loop
from simwar.builder.loop import LoopBuilder
from simwar.builder.sizes import ArrivalProcess, draw_sizes
from simwar.config import ConfigError, buckets_of, load_config
from simwar.core.program import CpuWork, GraphLaunch, Launch, StepMarker
from simwar.executors import fast
from simwar.executors.engine import Engine

REPO = Path(__file__).resolve().parents[1]
SHORT = {"steps": 40, "warmup_steps": 4}
SCALE = {"cpu.schedule_us": {"base": 500, "per_seq": 20},
         "cpu.process_result_us": {"base": 600, "per_seq": 10},
         "gpu.schedule_writes_us": {"base": 40, "per_seq": 4},
         "phases.verify.body_us": {"base": 500, "per_seq": 80},
         "phases.verify.load_batch_us": {"base": 10, "per_seq": 1},
         "phases.draft.body_us": {"base": 100, "per_token": 2}}


def ops_of(program, kind, label=None):
    """``(iteration, op)`` of each op of ``kind`` (and ``label``), iteration from the markers."""
    out, k = [], -1
    for op in program.ops:
        if type(op) is StepMarker:
            k = op.step
        elif type(op) is kind and (label is None or _label(op) == label):
            out.append((k, op))
    return out


def _label(op):
    return op.kernel.label if type(op) is Launch else getattr(op, "label", None) or \
        getattr(op, "graph", None)


# ---------------------------------------------------------------------------- sizes
def test_batch_list_cycles_and_graphs_run_at_the_smallest_bucket():
    r = simwar.simulate(None, {**SHORT, "workload": {"batch_sizes": [4, 5, 3, 57, 49],
                                                    "graph_buckets": [8, 16, 32, 64]}})
    steps = r.columns["step"]
    assert r.columns["batch_size"].tolist() == [[4, 5, 3, 57, 49][k % 5] for k in steps]
    assert r.columns["graph_bucket"].tolist() == [[8, 8, 8, 64, 64][k % 5] for k in steps]
    assert r.columns["batch_size"].dtype == np.int64
    assert np.array_equal(r.columns["tokens"], r.columns["batch_size"] * 3.2)
    assert sorted(r.program.graphs()) == ["draft.graph@64", "draft.graph@8", "verify.graph@64",
                                          "verify.graph@8"]


def test_without_buckets_graph_phases_run_at_the_real_batch():
    cfg = load_config(None, {**SHORT, **SCALE, "workload": {"batch_sizes": [3, 40]}})
    program = build_program(cfg)
    body = {k: g.nodes[-1].duration_us for k, g in ops_of(program, GraphLaunch, None)
            if g.graph.startswith("verify")}
    assert body[0] == 500 + 80 * 3 and body[1] == 500 + 80 * 40
    assert sorted(program.graphs()) == ["draft.graph@3", "draft.graph@40", "verify.graph@3",
                                        "verify.graph@40"]


def test_affine_durations_use_the_batch_of_the_right_step_and_the_bucket_in_graphs():
    sizes = [2, 9, 33, 64, 17]
    cfg = load_config(None, {**SHORT, **SCALE, "accept.tokens": [1.0, 2.0, 4.0],
                             "workload": {"batch_sizes": sizes, "graph_buckets": [8, 16, 64]}})
    program = build_program(cfg)
    batch = [sizes[k % 5] for k in range(cfg.steps)]
    bucket = [{2: 8, 9: 16, 33: 64, 64: 64, 17: 64}[b] for b in batch]
    tokens = [[1.0, 2.0, 4.0][k % 3] for k in range(cfg.steps)]
    for k, op in ops_of(program, CpuWork):
        if op.label == "schedule":  # the step being prepared
            assert op.duration_us == 500 + 20 * batch[k]
        elif op.label == "process_result":  # the step whose result is processed
            assert op.duration_us == 600 + 10 * batch[k - 1]
    for k, op in ops_of(program, Launch):
        if op.kernel.label == "schedule_writes":
            assert op.kernel.duration_us == 40 + 4 * batch[k]
        elif op.kernel.label == "verify.load_batch":  # an eager kernel: the real batch
            assert op.kernel.duration_us == 10 + batch[k]
    for k, op in ops_of(program, GraphLaunch):
        body = op.nodes[-1].duration_us
        if op.graph.startswith("verify"):
            assert body == 500 + 80 * bucket[k] and op.graph == f"verify.graph@{bucket[k]}"
        else:  # per_token: x size x the step's accepted tokens
            assert body == 100 + 2 * bucket[k] * tokens[k]
    r = simwar.simulate(cfg)
    assert r.columns["accepted_tokens"].tolist() == [tokens[k] for k in r.columns["step"]]


def test_drawn_batches_are_integers_reproducible_and_leave_the_duration_draws_alone():
    noisy = {"cpu.prepare_us": {"dist": "lognormal", "mean": 300, "std": 100}}
    uniform = {"workload": {"batch_size": {"dist": "uniform", "low": 1, "high": 64}}}
    a = load_config(None, {**SHORT, **noisy, **uniform, "steps": 4000})
    sizes = resolve_sizes(a).batch
    assert sizes.min() == 1 and sizes.max() == 64 and len(np.unique(sizes)) == 64
    assert np.array_equal(sizes, resolve_sizes(a.model_copy()).batch)
    b = load_config(None, {**SHORT, **noisy, **uniform, "steps": 4000, "seed": 1})
    assert not np.array_equal(sizes, resolve_sizes(b).batch)
    # the durations' generator is the config's own: the same prepare draws with or without
    prepare = [[op.duration_us for _, op in ops_of(build_program(c), CpuWork)
                if op.label == "prepare"]
               for c in (load_config(None, {**SHORT, **noisy}),
                         load_config(None, {**SHORT, **noisy, **uniform}))]
    assert prepare[0] == prepare[1]
    normal = load_config(None, {**SHORT, "workload": {
        "batch_size": {"dist": "normal", "mean": 2, "std": 3}}})
    assert resolve_sizes(normal).batch.min() == 1  # rounded, at least one request


def test_a_constant_config_is_unchanged_by_the_new_columns():
    r = simwar.simulate(None, SHORT)
    assert "by_bucket" not in r.summary and "workload" not in r.meta
    assert r.columns["batch_size"].tolist() == [32] * len(r.columns["step"])
    assert (r.columns["tokens"] == 32 * 3.2).all()


def test_batch_file_is_read_relative_to_the_config(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "steps.csv").write_text("step,batch_size\n0,4\n1,60\n2,7\n")
    cfg = tmp_path / "sub" / "c.yaml"
    cfg.write_text("steps: 30\nwarmup_steps: 3\nworkload:\n  batch_sizes_file: steps.csv\n")
    r = simwar.simulate(str(cfg))
    assert r.columns["batch_size"][:6].tolist() == [4, 60, 7, 4, 60, 7]
    # a sweep of that config (base by path) finds the file too
    sweep = tmp_path / "s.yaml"
    sweep.write_text("# s\nbase: sub/c.yaml\ngrid: {policy.barrier: [fine, coarse]}\n")
    from simwar.study.sweeps import load_sweep

    assert len(load_sweep(sweep).runs) == 2


@pytest.mark.parametrize("overrides, message", [
    ({"workload": {"batch_size": {"dist": "uniform", "low": 1, "high": 100},
                   "graph_buckets": [8, 64]}},
     r"workload.batch_size: batch \d+ at step \d+ is above the largest graph bucket \(64\)"),
    ({"workload": {"batch_size": {"dist": "lognormal", "mean": 20, "std": 10}},
      "cpu.prepare_us": {"base": 100, "per_seq": -4}},
     r"cpu.prepare_us: base 100, per_seq -4 gives -?\d+ µs at batch \d+ \(step \d+\); a "
     r"duration must be >= 0 µs"),
    ({"accept.tokens": {"dist": "normal", "mean": 3, "std": 2, "min": 1},
      "cpu.prepare_us": {"base": 20, "per_token": -2}},
     r"cpu.prepare_us: base 20, per_token -2 gives -?[\d.]+ µs at batch 32 and [\d.]+ accepted "
     r"tokens \(step \d+\)"),
])
def test_drawn_sizes_are_checked_as_they_are_drawn(overrides, message):
    cfg = load_config(None, {**SHORT, "steps": 400, **overrides})  # not known before drawing
    with pytest.raises(ConfigError, match=message):
        simwar.simulate(cfg)


def test_known_sizes_are_checked_when_the_config_loads():
    with pytest.raises(ConfigError, match="phases.verify.body_us: base -1000, per_seq 80 gives "
                                          "-360 µs at batch 8"):
        load_config(None, {**SHORT, "phases.verify.body_us": {"base": -1000, "per_seq": 80},
                           "workload": {"batch_sizes": [3, 40], "graph_buckets": [8, 64]}})
    # the bucket, not the batch, for a graph phase: 3 runs at 8 (the batch alone would be fine)
    with pytest.raises(ConfigError, match="at batch 8"):
        load_config(None, {**SHORT, "phases.verify.body_us": {"base": 100, "per_seq": -20},
                           "workload": {"batch_sizes": [3], "graph_buckets": [8]}})
    load_config(None, {**SHORT, "phases.verify.load_batch_us": {"base": -300, "per_seq": 100},
                       "workload": {"batch_sizes": [3, 40]}})  # eager: 3 -> 0 µs, allowed
    with pytest.raises(ConfigError, match="only used with arrivals"):
        load_config(None, {**SHORT, "workload": {"batch_sizes": [3], "max_batch": 4}})


# ---------------------------------------------------------------------------- accepted tokens
def test_accepted_tokens_drawn_per_step_feed_tokens_per_second():
    cfg = load_config(None, {**SHORT, "steps": 200,
                             "accept.tokens": {"dist": "uniform", "low": 1, "high": 4}})
    r = simwar.simulate(cfg)
    acc = r.columns["accepted_tokens"]
    assert len(np.unique(acc)) > 100 and acc.min() >= 1 and acc.max() <= 4
    m = r.columns["step"] >= cfg.warmup_steps
    m &= ~np.isnan(r.columns["step_us"])
    expect = (acc[m] * 32).sum() / r.columns["step_us"][m].sum() * 1e6
    assert r.summary["tokens_per_s"] == pytest.approx(expect, rel=1e-12)
    assert r.summary["accepted_tokens_mean"] == pytest.approx(acc[m].mean())


# ---------------------------------------------------------------------------- arrivals
ARRIVALS = {"steps": 300, "warmup_steps": 10,
            "workload": {"arrivals": {"rate_per_s": 150}, "max_batch": 16, "initial_batch": 0,
                         "output_tokens": {"dist": "uniform", "low": 5, "high": 60},
                         "graph_buckets": [4, 8, 16]},
            **SCALE, "accept.tokens": {"dist": "empirical", "values": [1, 2, 3, 4]}}


def test_arrivals_batch_follows_simulated_time_and_requests_leave_after_their_output():
    cfg = load_config(None, ARRIVALS)
    sizes = resolve_sizes(cfg)
    req = sizes.requests
    batch, acc = sizes.batch, sizes.accept
    assert batch.min() >= 1 and batch.max() <= 16 and len(np.unique(batch)) > 3
    assert (sizes.idle > 0).any()  # the host waited for a first request at least once
    # admitted when iteration k began (its step marker in the reference engine's trace), after
    # waiting for a request there if none was running or waiting
    program = build_program(cfg)
    trace = Engine(program).run()
    sel = trace.markers.name == trace.code("step")
    at = dict(zip(trace.markers.step[sel].tolist(), trace.markers.time_us[sel].tolist()))
    for k, t_admit, t_arrive in zip(req["admit_step"], req["admit_us"], req["arrival_us"]):
        assert t_admit == at[k] + sizes.idle[k] and t_arrive <= t_admit
    waits = [op for op in program.ops if type(op) is CpuWork and op.label == "wait_requests"]
    assert sum(op.duration_us for op in waits) == sizes.idle.sum()
    # each request's output is complete at its finish step and not before; it is still in the
    # next step's batch (the overlap loop learns of it then) and gone from the one after
    members = [[] for _ in batch]
    for i, (k0, k1, out) in enumerate(zip(req["admit_step"], req["finish_step"],
                                          req["output_tokens"])):
        if k1 < 0:
            assert acc[k0:].sum() < out
            last = len(batch) - 1
        else:
            assert acc[k0:k1 + 1].sum() >= out - 1e-9 > acc[k0:k1].sum()
            last = min(k1 + 1, len(batch) - 1)
        for k in range(k0, last + 1):
            members[k].append(i)
    assert [len(m) for m in members] == batch.tolist()


def test_arrivals_are_reproducible_exported_and_summarized():
    a = simwar.simulate(None, ARRIVALS)
    b = simwar.simulate(None, ARRIVALS, engine="simpy")
    assert a.summary == b.summary
    s = a.summary
    assert s["requests_completed"] > 20 and s["requests_per_s"] > 0
    assert s["request_latency_us_p50"] <= s["request_latency_us_p99"]
    assert s["request_queue_us_mean"] >= 0
    meta = a.program.meta["workload"]
    assert meta["batch_size"] == a.columns["batch_size"].tolist()[:len(meta["batch_size"])]
    json.dumps(meta)  # plain lists: the program is JSON
    other = simwar.simulate(None, {**ARRIVALS, "seed": 5}).columns["batch_size"]
    assert not np.array_equal(other, a.columns["batch_size"])
    # replayed as a fixed batch list (no arrivals), the realized sequence gives the same steps
    # up to the host's waits for a first request
    fixed = {k: v for k, v in ARRIVALS.items() if k != "workload"}
    fixed["workload"] = {"batch_sizes": meta["batch_size"], "graph_buckets": [4, 8, 16]}
    again = simwar.simulate(None, fixed)
    assert again.columns["batch_size"].tolist() == a.columns["batch_size"].tolist()


def test_arrivals_latency_is_forward_end_minus_admission():
    r = simwar.simulate(None, ARRIVALS)
    req = r.program.meta["workload"]["requests"]
    cols = r.columns
    warm = r.config.warmup_steps
    keep = (cols["step"] >= warm) & ~np.isnan(cols["step_us"])
    steps, end = cols["step"][keep], cols["fwd_end_us"][keep]
    lat = [end[steps.tolist().index(f)] - a for f, a in zip(req["finish_step"], req["admit_us"])
           if f in set(steps.tolist())]
    assert r.summary["requests_completed"] == len(lat)
    assert r.summary["request_latency_us_mean"] == pytest.approx(np.mean(lat), rel=1e-12)


# ---------------------------------------------------------------------------- summary, CLI
def test_per_bucket_summary_shows_the_regime_flip():
    r = simwar.simulate(REPO / "configs" / "dspark_fine_bimodal.yaml", {"steps": 200})
    by = r.summary["by_bucket"]
    assert sorted(by) == [8, 64]
    small, large = by[8], by[64]
    assert small["steps"] + large["steps"] == r.summary["steps_measured"]
    # small batches: host-bound (the GPU waits for the host before each forward); large:
    # device-bound (a large forward waits only after a run of small ones: the first of them)
    assert small["gpu_idle_us_mean"] > 100 and large["gpu_idle_us_mean"] < 0.2 * small[
        "gpu_idle_us_mean"]
    assert large["gpu_idle_us_mean"] == large["fwd_gap_us_mean"]
    assert small["launch_lead_us_mean"] < 0 < large["launch_lead_us_mean"]
    assert large["step_us_mean"] > 2.5 * small["step_us_mean"]


def test_cli_prints_the_workload_lines():
    from simwar.cli.run import format_summary

    r = simwar.simulate(REPO / "configs" / "dspark_fine_bimodal.yaml", {"steps": 100})
    text = format_summary(r)
    assert "batch mean" in text and "per graph bucket" in text
    r = simwar.simulate(None, ARRIVALS)
    assert "requests            " in format_summary(r)


# ---------------------------------------------------------------------------- harness
def test_workload_programs_capture_one_graph_per_phase_and_bucket(tmp_path):
    from simwar.cli.app import main
    from simwar.core.program import Program
    from simwar.harness import make_plan, suite

    assert main(["harness", "--workloads", "-o", str(tmp_path)]) == 0
    names = {p.stem for p in tmp_path.glob("*.json")}
    assert names == set(suite.workload_cases()) and len(names) >= 9
    for name in ("dspark-fine-bimodal", "dspark-coarse-uniform"):
        program = Program.from_json((tmp_path / f"{name}.json").read_text())
        plan = make_plan(program)
        graphs = program.graphs()
        assert set(plan.graphs) == set(graphs)
        for op in program.ops:  # a captured graph replays every launch of its name exactly
            if type(op) is GraphLaunch:
                assert op.nodes == graphs[op.graph], op.graph
        assert program.meta["workload"]["graph_buckets"] == suite.BUCKETS
    uniform = Program.from_json((tmp_path / "dspark-fine-uniform.json").read_text())
    assert {g.split("@")[1] for g in uniform.graphs()} == {"8", "16", "32", "64"}


def test_compare_checks_workload_cases_step_by_step(tmp_path, capsys):
    """Fake-measured workload cases (the engine's own timeline) meet every target, with a
    per-step error of zero; ``--save-measured`` keeps the per-step figures."""
    from simwar.cli.app import main
    from simwar.fit.replays import criteria, workload_targets_met
    from simwar.harness import make_plan, replay, suite
    from simwar.harness.fake import FakeBackend

    traces = tmp_path / "traces"
    traces.mkdir()
    names = ("dspark-none-bimodal", "dspark-coarse-ramp")
    for name in names:
        program = build_program(suite.case_config(name))
        trace = replay(make_plan(program), FakeBackend("program"))
        trace.save(traces / f"{name}.trace.json.gz")
    csv, saved = tmp_path / "t.csv", tmp_path / "measured.json"
    assert main(["compare", str(traces), "--csv", str(csv), "--save-measured", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "2 cases with per-step figures: median per-step step-time |error| 0.00%" in out
    import pandas as pd

    table = pd.read_csv(csv)
    per_step = table[table.metric == "step_us_per_step"]
    assert len(per_step) == 2 and (per_step.rel_error == 0).all()
    c = criteria(table)
    assert all(workload_targets_met(c).values()) and c["racy_cases"] == 1
    cases = json.loads(saved.read_text())["cases"]
    steps = cases["dspark-none-bimodal"]["steps"]
    assert steps["step"][0] == suite.WORKLOAD_WARMUP
    assert set(steps["batch_size"]) == set(suite.SMALL + suite.LARGE)
    # the saved summaries compare as the traces do
    assert main(["compare", str(saved), "--csv", str(tmp_path / "u.csv")]) == 0
    assert pd.read_csv(tmp_path / "u.csv").equals(table)


def test_fast_realizes_arrivals_without_building_the_program(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("built a Program")

    monkeypatch.setattr(LoopBuilder, "iter_ops", refuse)  # what build and stream_program call
    cfg = load_config(None, ARRIVALS)
    sizes = draw_sizes(cfg)
    fast.realize(cfg, sizes, ArrivalProcess(cfg, sizes))
    assert sizes.batch.min() >= 1
    run = fast.run_config(cfg, sizes)
    assert run.summary["requests_completed"] > 0


@settings(max_examples=25, deadline=None)
@given(rate=st.sampled_from([60.0, 400.0, 3000.0]), max_batch=st.integers(1, 24),
       initial=st.integers(0, 3), noisy=st.booleans(), steps=st.integers(3, 60),
       accept=st.sampled_from([2.0, [1.0, 2.5, 4.0], {"dist": "uniform", "low": 1.0,
                                                      "high": 4}]),
       barrier=st.sampled_from(["none", "coarse", "fine"]), chunk=st.sampled_from([3, 1 << 15]))
def test_the_run_that_realizes_arrivals_is_the_run_of_its_sizes(rate, max_batch, initial, noisy,
                                                                steps, accept, barrier, chunk):
    """The fast engine's arrivals run is the run that fixed the batches (one pass); it equals,
    bit for bit, a one-pass run and the reference engine's run of the realized sizes."""
    overrides = {"steps": steps, "warmup_steps": min(2, steps - 3), "policy.barrier": barrier,
                 "workload": {"arrivals": {"rate_per_s": rate}, "max_batch": max_batch,
                              "initial_batch": min(initial, max_batch),
                              "output_tokens": {"dist": "uniform", "low": 1, "high": 40}},
                 "accept.tokens": accept, **AFFINE, **(NOISY if noisy else {})}
    cfg = load_config(None, overrides)
    sizes = draw_sizes(cfg)
    saved = fast.execute.CHUNK
    fast.execute.CHUNK = chunk
    try:
        realized = fast.realize(cfg, sizes, ArrivalProcess(cfg, sizes))
    finally:
        fast.execute.CHUNK = saved
    assert realized.meta["workload"]["batch_size"] == sizes.batch.tolist()
    assert realized.meta["workload"]["requests"]["finish_step"] == \
        sizes.requests["finish_step"].tolist()
    ref = reference(loop.build_program(cfg, sizes))
    assert_same_run(*ref, realized)
    assert_same_run(*ref, fast.run_config(cfg, sizes))


def test_the_graph_bucket_rule_is_one_for_the_validation_the_sizes_and_the_arrivals():
    buckets = [4, 8, 16, 64]
    batches = list(range(1, 65))
    want = [min(b for b in buckets if b >= x) for x in batches]
    assert buckets_of(batches, buckets).tolist() == want
    assert buckets_of(batches, None).tolist() == batches
    listed = load_config(None, {**SHORT, "steps": 64,
                                "workload": {"batch_sizes": batches, "graph_buckets": buckets}})
    assert draw_sizes(listed).bucket.tolist() == want
    arrivals = load_config(None, ARRIVALS)
    sizes = resolve_sizes(arrivals)
    assert sizes.bucket.tolist() == buckets_of(sizes.batch,
                                               arrivals.workload.graph_buckets).tolist()
    # above the largest bucket: the same line, whether the config names the batch (checked
    # as it is validated) or it is drawn (checked as the sizes are drawn)
    with pytest.raises(ConfigError) as listed:
        load_config({**SHORT, "workload": {"batch_sizes": [3, 70], "graph_buckets": [64]}})
    assert str(listed.value) == ("<config>: workload.batch_sizes.1: batch 70 at step 1 is above "
                                 "the largest graph bucket (64)")
    drawn = load_config(None, {**SHORT, "seed": 3, "workload": {
        "batch_size": {"dist": "empirical", "values": [3, 70]}, "graph_buckets": [64]}})
    with pytest.raises(ConfigError, match=r"^workload.batch_size: batch 70 at step \d+ is "
                                          r"above the largest graph bucket \(64\)$"):
        draw_sizes(drawn)


# ---------------------------------------------------------------------------- plots
def test_workload_figure_draws_the_batches_and_shades_host_bound_steps(tmp_path):
    from simwar import plots
    from simwar.cli.app import main

    r = simwar.simulate(REPO / "configs" / "dspark_fine_bimodal.yaml", {"steps": 120})
    fig = plots.workload_figure(r, (24, 71))
    left, right = fig.axes[:2]
    assert {c.get_gid() for c in left.collections} == {"step:8", "gap:8", "step:64", "gap:64"}
    shaded = {p.get_gid() for p in right.patches if str(p.get_gid()).startswith("host_bound")}
    steps = r.steps[(r.steps.step >= 24) & (r.steps.step <= 71)]
    assert shaded == {f"host_bound:{k}" for k in steps.step[steps.gpu_idle_host_us > 0]}
    assert len(shaded) == 24  # two runs of 12 small-batch steps
    out = tmp_path / "w.png"
    assert main(["plot", str(REPO / "configs" / "dspark_fine_bimodal.yaml"), "--set",
                 "steps=100", "--steps-window", "24:60", "-o", str(out)]) == 0
    assert out.stat().st_size > 10_000
    assert main(["plot", str(REPO / "configs" / "dspark_fine_bimodal.yaml"), "--y", "step_us",
                 "-o", str(out)]) == 2
