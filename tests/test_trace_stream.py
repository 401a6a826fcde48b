"""The fast executor's trace mode: its windows, put back together, are the SimPy
engine's Trace, column by column (text decoded), on every shipped config, stochastic and
varying workloads, the policy variants and random programs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from golden import NOISY as GOLDEN_NOISY
from hypothesis import given, settings
from hypothesis import strategies as st
from programs import programs

from simwar.api import build_program, resolve_sizes, simulate, trace_windows
from simwar.config import ConfigError, load_config
from simwar.core.trace import SCHEMAS
from simwar.executors.engine import Engine
from simwar.executors.fast import trace as T
from simwar.executors.fast.plan import Unsettled, plan_config, plan_program

ROOT = Path(__file__).resolve().parents[1]
#: tensor-parallel configs run on the SimPy engine only: the trace mode refuses them
#: (test_the_trace_mode_refuses_tensor_parallel_ranks)
RANKS = [p for p in sorted((ROOT / "configs").glob("*.yaml")) if load_config(p).tp > 1]
CONFIGS = [p for p in sorted((ROOT / "configs").glob("*.yaml")) if p not in RANKS]
SHORT = {"steps": 40, "warmup_steps": 5}
NOISY = {**GOLDEN_NOISY, "steps": 60, "warmup_steps": 5}  # the golden files' noise, shorter
ARRIVALS = {"steps": 80, "warmup_steps": 5,
            "workload": {"arrivals": {"rate_per_s": 300}, "max_batch": 64, "initial_batch": 4,
                         "output_tokens": {"dist": "uniform", "low": 16, "high": 128},
                         "graph_buckets": [8, 16, 32, 64]},
            "accept.tokens": {"dist": "empirical", "values": [1, 2, 3, 4, 5]}}


def assert_same_trace(got, want) -> None:
    for name, cols in SCHEMAS.items():
        a, b = getattr(got, name), getattr(want, name)
        assert len(a) == len(b), f"{name}: {len(a)} rows, expected {len(b)}"
        for col, _, how in cols:
            if how == "str":
                x, y = a.decoded(col).tolist(), b.decoded(col).tolist()
                assert x == y, f"{name}.{col}"
            else:
                x, y = getattr(a, col), getattr(b, col)
                np.testing.assert_array_equal(x, y, err_msg=f"{name}.{col}")
    assert got.meta == want.meta


def check_config(path, overrides, chunk: int = 7, margin: int = 3) -> None:
    cfg = load_config(path, overrides)
    want = simulate(cfg, engine="simpy").trace
    try:
        plan = plan_config(cfg, resolve_sizes(cfg))
    except Unsettled:  # shapes picked as the run goes: its Program's plan (trace_windows')
        plan = plan_program(build_program(cfg))
    parts = list(T.windows(plan, chunk=chunk, margin=margin))
    assert len(parts) > 2 and parts[0].first and parts[-1].last
    assert not any(w.last for w in parts[:-1])
    assert_same_trace(T.join(parts), want)
    assert_same_trace(T.join(list(T.windows(plan, chunk=10 ** 9))), want)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_windows_are_the_engines_trace_on_every_config(path):
    check_config(path, SHORT)
    check_config(path, NOISY, chunk=13, margin=0)


@pytest.mark.parametrize("path", RANKS, ids=lambda p: p.stem)
def test_the_trace_mode_refuses_tensor_parallel_ranks(path):
    with pytest.raises(ConfigError, match="^the one-pass plans and trace mode run one rank"):
        trace_windows(load_config(path, SHORT))


def test_windows_of_a_varying_and_an_arrivals_workload():
    check_config(ROOT / "configs" / "dspark_fine_bimodal.yaml", SHORT)
    check_config(ROOT / "configs" / "dspark_fine_bimodal.yaml", ARRIVALS, chunk=11)


@pytest.mark.parametrize("variant", [
    {"policy.needs_cpu_seq_lens": True},
    {"policy.plan_stream": True, "gpu.schedule_prep_us": 20},
    {"policy.placement": "loop_top", "policy.barrier": "host_sync"},
    {"policy.placement": "loop_top", "policy.barrier": "fine", "cpu.post_launch_us": 5},
    {"gpu.result_copy_stream": "forward", "phases.verify.read_ends": "unknown"},
], ids=lambda v: ",".join(v))
def test_windows_of_the_policy_variants(variant):
    check_config(None, {**SHORT, **variant}, chunk=4, margin=1)


@settings(max_examples=80, deadline=None)
@given(programs(max_ops=40, max_steps=6))
def test_windows_of_random_programs(program):
    want = Engine(program).run()
    plan = plan_program(program)
    for chunk in (1, 3, 10 ** 6):
        assert_same_trace(T.join(list(T.windows(plan, chunk=chunk))), want)


@settings(max_examples=60, deadline=None)
@given(programs(max_ops=40, max_steps=6, irregular=True))
def test_windows_of_irregular_programs(program):
    want = Engine(program).run()
    plan = plan_program(program)
    assert_same_trace(T.join(list(T.windows(plan, chunk=2))), want)


def test_a_window_holds_its_core_steps_and_what_they_bind_to():
    cfg = load_config(None, {"steps": 30, "warmup_steps": 2})
    plan = plan_config(cfg, resolve_sizes(cfg))
    seen = []
    for w in T.windows(plan, chunk=5, margin=2):
        core_ops = np.arange(w.core_op, len(w.ops))
        bound = w.ops.bound[core_ops]
        assert np.all(bound >= -1)  # every core op's record is in its window
        assert w.span_core.sum() > 0 and w.marker_core.sum() > 0
        seen.append((w.op_base + w.core_op, w.op_base + len(w.ops)))
        if not w.last:  # a later window can still add to the last steps seen
            assert w.complete_below <= int(w.spans.step[w.span_core].max()) + 1
    assert all(a[1] == b[0] for a, b in zip(seen, seen[1:]))  # the cores tile the run


@pytest.mark.parametrize("name,overrides,least", [("dspark_fine", SHORT, 3),
                                                  ("dspark_fine", NOISY, 0),
                                                  ("dspark_fine_bimodal", ARRIVALS, 1)])
def test_alike_windows_take_their_columns_made_once(monkeypatch, name, overrides, least):
    """A window of a recent window's structure takes that window's columns but its steps
    (shifted) and times (read at the same places): every window the one made anew, margin
    and all; one whose waits held their streams otherwise is made anew."""
    from simwar.executors.fast import tracecols

    cfg = load_config(ROOT / "configs" / f"{name}.yaml", overrides)
    plan = plan_config(cfg, resolve_sizes(cfg))
    taken = []
    columns = tracecols._Reuse.columns

    def counted(self, pieces):
        got = columns(self, pieces)
        taken.append(got is not None)
        return got

    monkeypatch.setattr(tracecols._Reuse, "columns", counted)
    reused = list(T.windows(plan, chunk=7, margin=3))
    assert sum(taken) >= least  # (a noisy run's windows are seldom alike)
    # no window's structure taken as another's: every window made anew
    monkeypatch.setattr(tracecols._Reuse, "sig_matches", lambda self, sig: False)
    count = len(taken)
    anew = list(T.windows(plan, chunk=7, margin=3))
    assert len(taken) == count and len(anew) == len(reused)
    for a, b in zip(reused, anew):
        assert_same_trace(a, b)
        assert a.strings == b.strings
        for key in ("span_core", "marker_core", "span_issue"):
            np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)
        assert (a.op_base, a.core_op, a.complete_below, a.clock, a.first, a.last) == \
            (b.op_base, b.core_op, b.complete_below, b.clock, b.first, b.last)


def test_only_the_windows_of_the_steps_asked_for():
    cfg = load_config(None, {"steps": 3000, "warmup_steps": 2})
    plan = plan_config(cfg, resolve_sizes(cfg))
    got = list(T.windows(plan, chunk=64, margin=2, steps=(1000, 1100)))
    steps = np.concatenate([w.spans.step[w.span_core] for w in got])
    assert steps.min() <= 1000 and steps.max() >= 1100 and steps.max() < 1300
    assert len(got) <= 4


def test_a_name_without_a_template_is_refused():
    from simwar.config.policies import BARRIERS, Barrier, register_barrier

    @register_barrier
    class Stamped(Barrier):
        name = "stamped_test"

        def fence(self, b, k):
            b.record(f"stamp[{k}]", "forward", k)  # a plain name that holds the step

    try:
        cfg = load_config(None, {"steps": 30, "warmup_steps": 2,
                                 "policy.barrier": "stamped_test"})
        with pytest.raises(T.TraceUnsupported, match="template"):
            list(T.windows(plan_config(cfg, resolve_sizes(cfg))))
    finally:
        BARRIERS.pop("stamped_test")


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("workload", ["prompts", "closed"])
def test_requests_with_prompts_and_the_normal_loop_stream_the_engines_trace(workload, overlap):
    """Prefill kernels, the processed-result markers and the loop without overlap."""
    wl = {"prompts": {"arrivals": {"rate_per_s": 500}, "max_batch": 32,
                      "output_tokens": {"dist": "uniform", "low": 1, "high": 20},
                      "prompt_tokens": {"dist": "uniform", "low": 20, "high": 700},
                      "graph_buckets": [8, 16, 32]},
          "closed": {"closed_loop": {"concurrency": 5}, "output_tokens": 6,
                     "prompt_tokens": 300}}[workload]
    check_config(ROOT / "configs" / "dspark_fine.yaml",
                 {"steps": 80, "warmup_steps": 5, "workload": wl, "policy.overlap": overlap,
                  "prefill": {"chunk_tokens": 256, "forward_us": {"base": 80, "per_token": 1},
                              "host_us": {"base": 40, "per_token": 0.1},
                              "graph": "piecewise" if overlap else "eager"}})


def test_names_of_a_template_are_its_formatted_texts():
    """A template's names made by concatenation (trace._numbered) are ``template.format``'s,
    across hundreds and below them; a template not of one plain field is formatted."""
    for template in ("copy_done[{}]", "{}", "x{}", "{}y", "a{{b}}{}", "s{:03d}", "{}-{}"):
        parts = T._parts(template)
        assert (parts is None) == (template in ("a{{b}}{}", "s{:03d}", "{}-{}"))
        if template == "{}-{}":
            continue
        for lo, hi in ((0, 0), (0, 250), (99, 101), (100, 199), (137, 2400), (9990, 10012)):
            assert T._numbered(template, parts, lo, hi) == \
                [template.format(k) for k in range(lo, hi + 1)]


_TEMPLATES = [("a[", "]"), ("a", "b"), ("a1", "b"), ("", "b"), ("a", "")]
_POOL = ["", "a[5]", "a[05]", "a[-1]", "a[x]", "a15b", "a1b", "ab", "a[7]", "a12", "b", "7b",
         "a[120]", "a1120b", "a120b", "120b"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(
    st.tuples(st.just("code"), st.sampled_from(_POOL)),
    st.tuples(st.just("plain"), st.lists(st.sampled_from(_POOL), max_size=6)),
    st.tuples(st.just("named"), st.sampled_from(_TEMPLATES), st.integers(0, 130),
              st.integers(0, 12))), max_size=12))
def test_a_windows_string_table_codes_names_by_their_steps_as_texts(calls):
    """tracecols._Strings, its Named columns coded by their steps: every text the code it
    was first given, new texts coded in order, as a table of texts alone codes them."""
    from simwar.executors.fast.tracecols import Named, _Strings

    got, want = _Strings(), {"": 0}
    order = [""]

    def coded(text):
        if text not in want:
            want[text] = len(order)
            order.append(text)
        return want[text]

    for call in calls:
        if call[0] == "code":
            assert got.code(call[1]) == coded(call[1])
            continue
        if call[0] == "plain":
            values = call[1]
        else:
            (head, tail), first, n = call[1:]
            values = Named([f"{head}{k}{tail}" for k in range(first, first + n)], head, tail,
                           first)
        codes = got.column(values)
        assert codes.dtype == np.int32
        assert codes.tolist() == [coded(v) for v in values]
    assert got.strings == order
