"""The fast executor equals the SimPy engine, exactly.

"Equal" means: every column of the per-step table is bit for bit the same (``==``, NaN
where NaN, same dtype), every summary key has the same value (floats ``==``), and the race
list is the same list of ``Race`` tuples in the same order. No tolerance is needed: both
executors place every op with the functions of :mod:`simwar.core.rules`, in the same order, and
the table and summary are assembled and computed by the same functions of
:mod:`simwar.analysis.metrics` (forward-stream busy time per step window is added interval
by interval in start order on both paths). Only ``--summary-only`` summaries differ: means
by summation order (<= 1e-12 relative), sketched quantiles by the sketch's accuracy.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from programs import programs

import simwar
from simwar.analysis.hazards import detect
from simwar.analysis.metrics import step_columns, summarize
from simwar.analysis.streaming import QuantileSketch
from simwar.api import NoTraceError, build_program, resolve_sizes
from simwar.builder.draws import Sampler
from simwar.builder.loop import LoopBuilder, plan_iterations
from simwar.config import ConfigError, load_config
from simwar.executors import fast
from simwar.executors.engine import Engine
from simwar.executors.fast.plan import HOST_RECORDS, EventBinding, SyncBinding, host_records

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
CONFIG_FILES = sorted(CONFIGS.glob("*.yaml"))
#: tensor-parallel configs run on the SimPy engine only: the fast executor refuses them
#: (test_fast_refuses_tensor_parallel_ranks)
RANKS = [p for p in CONFIG_FILES if load_config(p).tp > 1]
ONE_RANK = [p for p in CONFIG_FILES if p not in RANKS]

NOISY = {"cpu.schedule_us": {"dist": "lognormal", "mean": 900, "std": 300},
         "gpu.schedule_writes_us": {"dist": "uniform", "low": 100, "high": 400},
         "cpu.process_result_us": {"dist": "empirical", "values": [600, 800, 1500]},
         "cpu.ingest_us": {"dist": "normal", "mean": 20, "std": 40},  # often clipped to 0
         "costs.host_call_us": {"dist": "normal", "mean": 2, "std": 3},
         "costs.cross_stream_us": {"dist": "uniform", "low": 0, "high": 30}}

#: durations that scale with the batch, on host and device, eager and in graphs
AFFINE = {"cpu.schedule_us": {"base": 150, "per_seq": 25},
          "cpu.process_result_us": {"base": 80, "per_seq": 12, "per_token": 2,
                                    "noise": {"dist": "normal", "mean": 20, "std": 15}},
          "gpu.schedule_writes_us": {"base": 20, "per_seq": 4},
          "gpu.result_writes_us": {"base": 5, "per_seq": 1},
          "costs.launch_us": {"base": 5, "per_seq": 0.05}}

VARIANTS = {
    "short": {"steps": 60, "warmup_steps": 10},
    "three_steps": {"steps": 3, "warmup_steps": 0},  # the fewest a config may have
    "four_steps": {"steps": 4, "warmup_steps": 1},
    "seven_steps": {"steps": 7, "warmup_steps": 0},
    "noisy": {"steps": 80, "warmup_steps": 5, **NOISY},
    "noisy_host_bound": {"steps": 80, "warmup_steps": 0, **NOISY,
                         "cpu.schedule_us": {"dist": "lognormal", "mean": 9000, "std": 3000}},
    "loop_top_seq_lens": {"steps": 40, "warmup_steps": 5, "policy.placement": "loop_top",
                          "policy.needs_cpu_seq_lens": True},
    "plan_stream_copy_on_forward": {"steps": 40, "warmup_steps": 5, "policy.plan_stream": True,
                                    "gpu.result_copy_stream": "forward",
                                    "gpu.schedule_prep_us": 7},
    # workloads that change every step: the durations are per-step values, never new shapes
    "workload_bimodal": {"steps": 50, "warmup_steps": 3,
                         "workload": {"batch_sizes": [2] * 6 + [60] * 6,
                                      "graph_buckets": [4, 16, 64]},
                         **AFFINE},
    "workload_arrivals": {"steps": 70, "warmup_steps": 3,
                          "workload": {"arrivals": {"rate_per_s": 900}, "max_batch": 24,
                                       "output_tokens": {"dist": "uniform", "low": 2, "high": 30},
                                       "initial_batch": 2},
                          "accept.tokens": {"dist": "empirical", "values": [1, 2, 3, 4]},
                          **AFFINE, **NOISY},
    # the normal loop (no overlap), and requests with prompts: chunked prefill, closed loops
    "overlap_off": {"steps": 40, "warmup_steps": 3, "policy.overlap": False, **NOISY},
    "prompts_chunked": {"steps": 70, "warmup_steps": 3,
                        "workload": {"arrivals": {"rate_per_s": 900}, "max_batch": 24,
                                     "output_tokens": {"dist": "uniform", "low": 1, "high": 20},
                                     "prompt_tokens": {"dist": "uniform", "low": 50,
                                                       "high": 900},
                                     "initial_batch": 2, "graph_buckets": [8, 16, 32]},
                        "prefill": {"chunk_tokens": 512,
                                    "forward_us": {"base": 150, "per_token": 1.5},
                                    "host_us": {"base": 40, "per_token": 0.1},
                                    "graph": "piecewise"},
                        "slo": {"ttft": 20000, "tpot": 2500},
                        **AFFINE, **NOISY},
    "closed_loop_off": {"steps": 60, "warmup_steps": 3, "policy.overlap": False,
                        # the first requests' lengths listed (a measured run's), then drawn
                        "workload": {"closed_loop": {"concurrency": 6, "lengths": {
                                         "output_tokens": [3, 11, 1, 7, 12, 5, 9, 2],
                                         "prompt_tokens": [40, 700, 300, 5, 512, 90, 260, 1]}},
                                     "output_tokens": {"dist": "uniform", "low": 1, "high": 12},
                                     "prompt_tokens": 300},
                        "prefill": {"chunk_tokens": 256, "forward_us": {"per_token": 2}}},
}


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):  # per-bucket figures
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


def assert_same_run(ref_columns: dict, ref_summary: dict, ref_races: list, run) -> None:
    assert list(run.columns) == list(ref_columns)
    for name, col in ref_columns.items():
        got = run.columns[name]
        assert got.dtype == col.dtype, name
        assert np.array_equal(got, col, equal_nan=col.dtype.kind == "f"), name
    assert list(run.summary) == list(ref_summary)
    for key, value in ref_summary.items():
        assert _same(run.summary[key], value), (key, run.summary[key], value)
    assert run.hazards.races == ref_races


def reference(program):
    trace = Engine(program).run()
    columns = step_columns(trace)
    hazards = detect(trace)
    return columns, summarize(columns, trace.meta, hazards), hazards.races


# ---------------------------------------------------------------------------- shipped configs
@pytest.mark.parametrize("path", RANKS, ids=lambda p: p.stem)
def test_the_one_pass_plans_refuse_tensor_parallel_ranks(path):
    cfg = load_config(path, {"steps": 40, "warmup_steps": 5})
    with pytest.raises(ConfigError, match=r"^the one-pass plans and trace mode run one rank; "
                                          r"parallel.tp 2 runs its ranks through simulate"):
        fast.run_config(cfg, resolve_sizes(cfg))
    # simulate runs them in one pass per rank (executors/fast/ranks.py)
    assert simwar.simulate(cfg, engine="fast").engine == simwar.simulate(cfg).engine == "fast"


#: shipped configs whose requests have prompts (a prefill: section): a variant that gives
#: another workload does not apply to them
PROMPTS = {p for p in CONFIG_FILES if load_config(p).prefill is not None}


def applies(path, variant: str) -> bool:
    """Whether the exactness variant ``variant`` applies to the shipped config ``path``."""
    return not (path in PROMPTS and "workload" in VARIANTS[variant])


@pytest.mark.parametrize("path,variant", [(p, v) for p in ONE_RANK for v in sorted(VARIANTS)
                                          if applies(p, v)],
                         ids=lambda x: x if isinstance(x, str) else x.stem)
def test_fast_equals_simpy_on_every_shipped_config(path, variant):
    cfg = load_config(path, VARIANTS[variant])
    program = build_program(cfg)
    ref = reference(program)
    assert_same_run(*ref, fast.run_config(cfg, resolve_sizes(cfg)))  # the iteration plan
    assert_same_run(*ref, fast.run(program))  # from the materialized Program


#: workloads whose steps reach every graph bucket: a batch list, arrivals (the sizes fixed
#: iteration by iteration as requests arrive) and prompts (a prefill-only step has batch 0)
PER_BUCKET = {"batches": {"steps": 50, "warmup_steps": 3,
                          "workload": {"batch_sizes": [2, 9, 17, 40, 64, 30, 8],
                                       "graph_buckets": [8, 16, 32, 64]}},
              "arrivals": {**VARIANTS["workload_arrivals"],
                           "workload": {**VARIANTS["workload_arrivals"]["workload"],
                                        "graph_buckets": [8, 16, 32]}},
              "prompts": VARIANTS["prompts_chunked"]}


def per_bucket_tables(path, buckets) -> dict:
    """Overrides giving every graph phase of a config a per-bucket ``body_us`` and
    ``prep_us`` (not a line in the bucket; the first phase's prep with noise on top)."""
    out = {}
    graphs = [p for p in load_config(path).phase_table() if p.graph != "eager"]
    for i, ph in enumerate(graphs):
        out[f"phases.{ph.name}.body_us"] = {"per_bucket": {
            b: 300.0 + 97.0 * i + 4.0 * b + (60.0 if j % 2 else 0.0)
            for j, b in enumerate(buckets)}}
        prep = {"per_bucket": {b: 2.5 * (j + 1) for j, b in enumerate(buckets)}}
        if i == 0:
            prep["noise"] = {"dist": "normal", "mean": 3, "std": 2}
        out[f"phases.{ph.name}.prep_us"] = prep
    return out


@pytest.mark.parametrize("path,variant", [(p, v) for p in ONE_RANK for v in sorted(PER_BUCKET)
                                          if p not in PROMPTS] +
                         # a config with prompts keeps its own workload (its graph buckets)
                         [(p, "own") for p in ONE_RANK if p in PROMPTS],
                         ids=lambda x: x if isinstance(x, str) else x.stem)
def test_fast_equals_simpy_with_per_bucket_durations(path, variant):
    """A graph phase's durations as tables per bucket give the fast executor the
    reference's run, bit for bit (from the iteration plan and from the Program)."""
    overrides = PER_BUCKET.get(variant, {"steps": 60, "warmup_steps": 3})
    buckets = (overrides["workload"] if "workload" in overrides
               else load_config(path).workload.model_dump())["graph_buckets"]
    cfg = load_config(path, {**overrides, **per_bucket_tables(path, buckets)})
    program = build_program(cfg)
    ref = reference(program)
    assert_same_run(*ref, fast.run_config(cfg, resolve_sizes(cfg)))
    assert_same_run(*ref, fast.run(program))


def test_a_bucket_the_table_lacks_is_an_error_naming_the_step():
    """Drawn batches are not known at load: the bucket a table lacks is named as drawn."""
    cfg = load_config(CONFIGS / "dspark_fine.yaml", {
        "steps": 40, "warmup_steps": 2,
        "workload": {"batch_size": {"dist": "normal", "mean": 30, "std": 20}},
        "phases.verify.body_us": {"per_bucket": {8: 1000, 16: 1500, 32: 2000, 64: 4000}}})
    with pytest.raises(ConfigError, match=r"^phases\.verify\.body_us: per_bucket has no entry "
                                          r"for bucket \d+, which step \d+ reaches \(it gives "
                                          r"buckets 8, 16, 32, 64\)$"):
        simwar.simulate(cfg)


@pytest.mark.parametrize("stem", ["dspark_fine_bimodal", "none_coarse_loop_top",
                                  "dflash_legacy_host_sync"])
def test_fast_equals_simpy_with_launch_ahead_two(stem):
    cfg = load_config(CONFIGS / f"{stem}.yaml", {"steps": 60, "warmup_steps": 5,
                                                 "policy.launch_ahead": 2, **NOISY})
    program = build_program(cfg)
    ref = reference(program)
    assert_same_run(*ref, fast.run_config(cfg, resolve_sizes(cfg)))
    assert_same_run(*ref, fast.run(program))


def test_simulate_engines_agree_on_every_result_field():
    a = simwar.simulate(CONFIGS / "dspark_none.yaml", {"steps": 120}, engine="simpy")
    b = simwar.simulate(CONFIGS / "dspark_none.yaml", {"steps": 120}, engine="fast")
    assert (a.engine, b.engine) == ("simpy", "fast")
    assert a.summary == b.summary and a.summary["races"] > 0
    assert a.steps.equals(b.steps)
    assert a.races.equals(b.races)
    assert a.hazards.races == b.hazards.races


@settings(max_examples=60, deadline=None)
@given(algorithm=st.sampled_from(["none", "eagle", "dflash", "dspark"]),
       barrier=st.sampled_from(["none", "coarse", "fine", "host_sync"]),
       placement=st.sampled_from(["after_launch", "loop_top"]),
       external=st.booleans(), fallback=st.sampled_from(["post_replay", "pre_replay"]),
       plan_stream=st.booleans(), seq_lens=st.booleans(),
       copy=st.sampled_from(["copy", "forward"]),
       read_ends=st.sampled_from([None, "pre_replay", "in_replay", "post_replay", "unknown"]),
       graph=st.sampled_from([None, "full", "breakable", "eager"]),
       noisy=st.booleans(), steps=st.integers(3, 30), seed=st.integers(0, 3),
       workload=st.sampled_from([None, None, "list", "dist", "arrivals", "prompts", "closed"]),
       overlap=st.booleans())
def test_fast_equals_simpy_on_random_configs(algorithm, barrier, placement, external, fallback,
                                             plan_stream, seq_lens, copy, read_ends, graph,
                                             noisy, steps, seed, workload, overlap):
    phase = {"none": "decode"}.get(algorithm, "draft")
    overrides = {"algorithm": algorithm, "policy.barrier": barrier,
                 "policy.placement": placement, "policy.external_events": external,
                 "policy.in_replay_fallback": fallback, "policy.plan_stream": plan_stream,
                 "policy.needs_cpu_seq_lens": seq_lens, "gpu.result_copy_stream": copy,
                 "steps": steps, "warmup_steps": min(3, steps - 3), "seed": seed,
                 "policy.overlap": overlap, **(NOISY if noisy else {})}
    if read_ends:
        overrides[f"phases.{phase}.read_ends"] = read_ends
    if graph:
        overrides[f"phases.{phase}.graph"] = graph
    if workload:
        overrides.update(AFFINE)
        overrides[f"phases.{phase}.body_us"] = {"base": 300, "per_seq": 40, "per_token": 5}
        overrides[f"phases.{phase}.prep_us"] = {"base": 10, "per_seq": 1}
        overrides["workload"] = {
            "list": {"batch_sizes": [1, 7, 33, 64, 2], "graph_buckets": [8, 32, 64]},
            "dist": {"batch_size": {"dist": "lognormal", "mean": 12, "std": 10}},
            "arrivals": {"arrivals": {"rate_per_s": 700}, "max_batch": 16, "output_tokens": 9,
                         "initial_batch": seed, "graph_buckets": [4, 16]},
            "prompts": {"arrivals": {"rate_per_s": 700}, "max_batch": 16, "output_tokens": 5,
                        "prompt_tokens": {"dist": "uniform", "low": 1, "high": 400},
                        "graph_buckets": [4, 16]},
            "closed": {"closed_loop": {"concurrency": seed + 1}, "output_tokens": 4,
                       "prompt_tokens": 100}}[workload]
        if workload in ("prompts", "closed"):
            overrides["prefill"] = {"chunk_tokens": 64 + 100 * seed,
                                    "forward_us": {"base": 30, "per_token": 2},
                                    "graph": ["eager", "piecewise"][seed % 2]}
        overrides["accept.tokens"] = [1.0, 2.5, 3.0]
    cfg = load_config(None, overrides)
    assert_same_run(*reference(build_program(cfg)), fast.run_config(cfg, resolve_sizes(cfg)))


# ---------------------------------------------------------------------------- random programs
@settings(max_examples=500, deadline=None)
@given(programs(max_ops=90, max_steps=6, irregular=True))
def test_fast_equals_simpy_on_random_programs(program):
    """Up to six steps, also irregular ones (ops labelled with a neighbouring step, markers
    skipped or out of order, a graph relaunched with other nodes)."""
    assert_same_run(*reference(program), fast.run(program))


@settings(max_examples=500, deadline=None, derandomize=True)
@given(programs())
def test_fast_equals_simpy_on_the_random_program_generator_of_the_harness(program):
    """The programs the harness's replay and the race detector are held to
    (tests/test_random_programs.py): 1-5 streams, graphs with in-graph records, waits and
    syncs, host costs and latencies."""
    assert_same_run(*reference(program), fast.run(program))


@settings(max_examples=150, deadline=None)
@given(programs(max_ops=25, max_steps=1))
def test_fast_equals_simpy_on_random_single_step_programs(program):
    assert_same_run(*reference(program), fast.run(program))


def test_every_path_of_the_fast_executor_is_taken_by_the_random_programs():
    """Windowed and all-pairs race analysis, streamed and collected step windows."""
    seen = set()

    @settings(max_examples=200, deadline=None, database=None)
    @given(programs(max_ops=90, max_steps=6, irregular=True))
    def collect(program):
        seen.update(fast.run(program).paths)

    collect()
    assert seen >= {"windowed", "full", "stream", "collect"}


def test_a_long_run_is_a_few_blocks_whatever_its_length():
    cfg = load_config(None, {"steps": 1_000_000})
    plan = fast.plan_config(cfg, resolve_sizes(cfg))
    assert len(plan.blocks) <= 4 and plan.segments == 1_000_001


def test_a_shapes_host_records_are_its_plain_tuples():
    """The shaper reads host ops into plain tuples and finds shapes by them: the records a
    shape holds (a NamedTuple per kind, graph nodes and bindings too) equal and hash as
    those tuples, and plain tuples are made the same records again."""
    cfg = load_config(CONFIGS / "dspark_fine.yaml", VARIANTS["prompts_chunked"])
    program_plan = fast.plan_program(build_program(cfg))
    # (a run with prompts picks its shapes as it goes: a config's plan is of one without)
    arrivals = load_config(CONFIGS / "dspark_fine.yaml", VARIANTS["workload_arrivals"])
    config_plan = fast.plan_config(arrivals, resolve_sizes(arrivals))

    def plain(x):
        return tuple(plain(v) for v in x) if isinstance(x, tuple) else x

    kinds = set()
    for plan in (program_plan, config_plan):
        for b in plan.blocks:
            host = b.shape.host
            assert plain(host) == host and hash(plain(host)) == hash(host)
            assert host_records(plain(host)) == host
            for h in host:
                kinds.add(h.kind)
                assert type(h) is HOST_RECORDS[h.kind]
                if h.kind in ("wait_event", "sync") and h.bind is not None:
                    assert type(h.bind) is (EventBinding if h.kind == "wait_event" else SyncBinding)
    assert {"cpu", "launch", "graph", "wait_event", "sync", "run_batch", "result_done"} <= kinds


# ---------------------------------------------------------------------------- the builder
GOLDEN = {  # sha256 of Program.to_json() as the builder made it before drawing vectorised
    ("dspark_fine", ()): "6a1497a83e18216169c221d116c5ad3b1b5a3c5119c010aa11ad4c0f06d217d3",
    ("dflash_legacy_host_sync", ()):
        "6f5b86e5762258a30317a956f720c50fb318b5ca5f5f51bb131560b8fdc0f17c",
    ("eagle_none", (("policy.needs_cpu_seq_lens", True), ("policy.plan_stream", True))):
        "befaa45b7351ae6981c222ff1331d0531cd892da44b6c772f1d866000fa273f1",
    ("none_coarse_loop_top", (("gpu.schedule_prep_us", 4),)):
        "768d60a673eff9b54a0dcb80865c339d744a2a49b643bf5dee0a500454901bbc",
}


@pytest.mark.parametrize("key", sorted(GOLDEN), ids=lambda k: k[0])
def test_constant_configs_build_the_same_program_as_before(key):
    stem, extra = key
    cfg = load_config(CONFIGS / f"{stem}.yaml", {"steps": 30, "warmup_steps": 5, **dict(extra)})
    assert hashlib.sha256(build_program(cfg).to_json().encode()).hexdigest() == GOLDEN[key]


def test_each_distribution_is_drawn_in_one_call_and_every_draw_is_used(monkeypatch):
    cfg = load_config(None, {"steps": 50, "warmup_steps": 5, **NOISY})
    sizes = resolve_sizes(cfg)
    plan = plan_iterations(cfg, sizes)
    calls = []
    make = np.random.default_rng

    class Counting:
        def __init__(self, seed):
            self.rng = make(seed)

        def __getattr__(self, name):
            def call(*args, **kwargs):
                calls.append(name)
                return getattr(self.rng, name)(*args, **kwargs)
            return call

    monkeypatch.setattr(np.random, "default_rng", Counting)
    sampler = Sampler(cfg.seed, plan.draw_counts())
    assert len(calls) == len(NOISY) == len(sampler.arrays)
    LoopBuilder(cfg, sampler, sizes, plan.phases).build()
    assert sampler.unused() == [], "draws left over, or a distribution never drawn"


# ---------------------------------------------------------------------------- API and CLI
def test_fast_engine_has_no_trace_and_says_so():
    r = simwar.simulate(None, {"steps": 30, "warmup_steps": 5}, engine="fast")
    assert not r.has_trace
    with pytest.raises(NoTraceError, match="engine='simpy'"):
        print(r.trace)
    assert r.program.meta["name"] == "dspark-fine"  # built on demand


def test_auto_engine_simulates_the_trace_when_first_read():
    r = simwar.simulate(None, {"steps": 30, "warmup_steps": 5})
    assert r.engine == "fast" and r.has_trace
    assert len(r.trace.spans) > 0 and r.events > 0
    assert np.array_equal(step_columns(r.trace)["step_us"], r.columns["step_us"], equal_nan=True)


def test_unknown_engine_is_rejected_by_the_schema_and_the_api(tmp_path):
    with pytest.raises(ConfigError, match="engine"):
        load_config(None, {"engine": "turbo"})
    with pytest.raises(ConfigError, match="engine: 'turbo'"):
        simwar.simulate(None, {"steps": 10, "warmup_steps": 1}, engine="turbo")
    path = tmp_path / "c.yaml"
    path.write_text("engine: turbo\n")
    out = cli("run", str(path))
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    assert "engine" in out.stderr


def test_config_engine_key_chooses_the_executor():
    assert simwar.simulate(None, {"steps": 10, "warmup_steps": 1, "engine": "simpy"}).engine \
        == "simpy"


def test_gc_is_restored_after_a_run():
    assert gc.isenabled()
    simwar.simulate(None, {"steps": 10, "warmup_steps": 1})
    assert gc.isenabled()


def cli(*args):
    return subprocess.run([sys.executable, "-m", "simwar", *args], capture_output=True,
                          text=True, cwd=Path(__file__).resolve().parents[1])


def test_cli_fast_engine_with_a_timeline_is_a_one_line_error(tmp_path):
    out = cli("run", "--engine", "fast", "--timeline", str(tmp_path / "x.png"), "--set",
              "steps=30")
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "--timeline" in lines[0] and "--engine simpy" in lines[0]
    assert out.stdout == ""


def test_cli_fast_engine_streams_its_trace_export(tmp_path):
    # the export is the fast executor's trace mode: no SimPy run, no trace kept
    out = cli("run", "--engine", "fast", "--summary-only", "--trace", str(tmp_path / "t.json"),
              "--set", "steps=30", "--set", "warmup_steps=2")
    assert out.returncode == 0 and "executor fast" in out.stderr
    doc = json.loads((tmp_path / "t.json").read_text())
    assert {e["args"]["step"] for e in doc["traceEvents"] if e["ph"] == "X"} == set(range(31))


def test_cli_unknown_engine_is_rejected():
    out = cli("run", "--engine", "turbo")
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_cli_says_which_executor_ran():
    out = cli("run", "--set", "steps=20", "--set", "warmup_steps=2")
    assert out.returncode == 0 and "executor fast" in out.stderr
    out = cli("run", "--engine", "simpy", "--set", "steps=20", "--set", "warmup_steps=2")
    assert out.returncode == 0 and "executor simpy" in out.stderr


def test_cli_engines_print_the_same_summary():
    args = ("run", "--json", "configs/dspark_none.yaml", "--set", "steps=80")
    fast_out, simpy_out = cli(*args), cli(*args, "--engine", "simpy")
    assert json.loads(fast_out.stdout) == json.loads(simpy_out.stdout)
    summary_only = json.loads(cli(*args, "--summary-only").stdout)
    assert summary_only == json.loads(fast_out.stdout)


#: what ``simwar run`` must not import, by the run (start-up time: each is loaded only by
#: the command or executor that uses it; benchmarks/bench_startup.py measures the rest)
NOT_IMPORTED_BY_RUN = ("pandas", "simpy", "matplotlib", "scipy", "pyarrow", "tqdm",
                       "simwar.executors.engine", "simwar.executors.lockstep",
                       "simwar.executors.fast.trace", "simwar.analysis.critical_path",
                       "simwar.study", "simwar.capture", "simwar.fit", "simwar.harness",
                       "simwar.plots")
#: and what a one-rank run does not import besides (the tensor-parallel ranks' modules)
RANKS_ONLY = ("simwar.builder.ranks", "simwar.executors.fast.ranks", "simwar.core.ranks",
              "simwar.analysis.ranks", "simwar.executors.ranks")


@pytest.mark.parametrize("config, absent", [
    ("configs/dspark_fine.yaml", NOT_IMPORTED_BY_RUN + RANKS_ONLY),
    # the ranks run in lockstep, a lane per rank (simwar.executors.lockstep.ranks)
    ("configs/tp2_slow_rank.yaml", tuple(m for m in NOT_IMPORTED_BY_RUN
                                         if m != "simwar.executors.lockstep")
     + ("simwar.executors.ranks", "simwar.core.ranks", "simwar.executors.fast.ranks"))])
def test_run_imports_only_what_it_uses(config, absent):
    """The import graph of ``simwar run`` (fast, one rank and ranks): none of the named
    modules (a package counts with any of its modules). Not timed: what is imported."""
    code = (f"import sys; from simwar.cli.app import main; main(['run', {config!r}, '--set', "
            f"'steps=30', '--set', 'warmup_steps=2', '--quiet']); "
            f"bad = sorted(m for m in sys.modules if any(m == a or m.startswith(a + '.') "
            f"for a in {absent!r})); sys.exit(print(bad) or (1 if bad else 0))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stdout + out.stderr


# ---------------------------------------------------------------------------- summary only
@pytest.mark.parametrize("chunk", [7, 50])
@pytest.mark.parametrize("variant", ["short", "noisy", "noisy_host_bound", "loop_top_seq_lens",
                                     "workload_bimodal", "workload_arrivals", "overlap_off",
                                     "prompts_chunked", "closed_loop_off"])
@pytest.mark.parametrize("stem", ["dspark_fine", "dspark_none", "eagle_coarse",
                                  "dflash_legacy_host_sync", "none_coarse_loop_top"])
def test_summary_only_equals_the_table_summary(monkeypatch, stem, variant, chunk):
    monkeypatch.setattr(fast.execute, "CHUNK", chunk)  # many moves of the accumulators
    cfg = load_config(CONFIGS / f"{stem}.yaml", {**VARIANTS[variant], "steps": 300})
    sizes = resolve_sizes(cfg)
    full = fast.run_config(cfg, sizes).summary
    streamed = fast.run_config(cfg, sizes, summary_only=True)
    assert streamed.columns is None and streamed.paths[1] == "streamed"
    assert_close_summaries(streamed.summary, full)


def assert_close_summaries(s: dict, full: dict) -> None:
    """Means within 1e-12 (summation order), everything else equal (quantiles: exact below
    4096 distinct values)."""
    assert list(s) == list(full)
    for key, value in full.items():
        if isinstance(value, dict) and key == "shape_time":  # shares of sums of step times
            assert list(s[key]) == list(value)
            assert list(s[key].values()) == pytest.approx(list(value.values()), rel=1e-12)
        elif isinstance(value, dict) and key == "by_bucket":
            assert list(s[key]) == list(value)
            for bucket, figures in value.items():
                assert_close_summaries(s[key][bucket], figures)
        elif isinstance(value, float) and not key.endswith(("_p50", "_p99")):
            assert s[key] == pytest.approx(value, rel=1e-12, nan_ok=True), key
        else:  # counts, histograms, and quantiles (exact: fewer than 4096 distinct values)
            assert _same(s[key], value), key


@pytest.mark.parametrize("dist", ["lognormal", "normal", "mixed_sign"])
def test_quantile_sketch_error_is_within_its_accuracy(dist):
    rng = np.random.default_rng(1)
    x = {"lognormal": rng.lognormal(8, 0.5, 200_000),
         "normal": rng.normal(5000, 300, 200_000),
         "mixed_sign": np.concatenate([rng.normal(-300, 200, 100_000), np.zeros(50),
                                       rng.normal(3000, 800, 100_000)])}[dist]
    sketch = QuantileSketch(alpha=1e-4)
    for chunk in np.array_split(x, 13):
        sketch.add(chunk)
    assert sketch.exact is None  # far more distinct values than the exact limit
    for q in (1, 25, 50, 90, 99, 99.9):
        exact = np.percentile(x, q)
        assert abs(sketch.quantile(q) - exact) <= 1e-4 * abs(exact) + 1e-9, q
    assert abs(sketch.quantile(50, median=True) - np.median(x)) <= 1e-4 * abs(np.median(x))


def test_quantile_sketch_is_numpy_exact_for_few_values():
    rng = np.random.default_rng(3)
    for trial in range(400):
        n = int(rng.integers(1, 80))
        x = [rng.normal(0, 1e3, n), rng.choice([0.0, 1.5, 5840.0, 1e-300, 3.3333333], n),
             rng.lognormal(5, 3, n), rng.integers(-5, 5, n) * 0.1][trial % 4]
        sketch = QuantileSketch()
        for part in np.array_split(x, 3):
            sketch.add(part)
        for q in (0, 1, 13.7, 50, 99, 99.9, 100, float(rng.uniform(0, 100))):
            assert sketch.quantile(q) == np.percentile(x, q)
        assert sketch.quantile(50, median=True) == np.median(x)
    sketch.add(np.array([np.nan]))
    assert math.isnan(sketch.quantile(50))
