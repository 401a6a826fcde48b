"""The fit of a capture whose steps prefill: each step's shape, each shape's costs, and
``--check`` per shape.

Each case simulates a shortened ``configs/sglang_default_prefill.yaml`` (Poisson arrivals,
lognormal prompts chunked at 4,096 tokens) under one scheduling rule, writes it as a server's
profile (``simwar.capture.synthetic``, SGLang's names with a shape range per step: ``decode
bs=B``, ``prefill bs=N toks=T``, ``mixed bs=B toks=T``), imports it with no mapping (the
preset is detected), fits it and checks the fitted config against the capture: the rule and
the prefill's costs must be the config's, and the step time of every shape within 3 %.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from simwar.api import resolve_sizes, simulate
from simwar.capture.open import open_capture
from simwar.capture.stalls import import_report
from simwar.capture.synthetic import Style, write_kineto
from simwar.config import load_config
from simwar.config.load import get_dotted
from simwar.fit.check import SHAPE_SEEDS, check_fit, profiler_back
from simwar.fit.from_capture import FitError, duration_mean, fit_model
from simwar.fit.launches import launch_device, launch_shares, shares_device
from simwar.fit.layout import step_layouts
from simwar.fit.policy import detect_roles
from simwar.fit.prefix import prefixes
from simwar.fit.profiler import (
    CPU_KEYS,
    GPU_KEYS,
    HOST_COSTS,
    PHASE_KEYS,
    host_keys,
    scale_device,
    scale_host,
)
from simwar.fit.samples import Samples
from simwar.fit.shape_check import at_sizes, shape_frame
from simwar.fit.shape_workload import prompt_groups
from simwar.fit.shapes import (
    PrefillSample,
    StepKinds,
    classify,
    cpu_outside,
    prefill_section,
    split_host,
    token_line,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "sglang_default_prefill.yaml"
#: the source prefill runs as 8 launches, each kernel as launched: the fit gives the count
#: back, and the whole device and host time over them
SHORT = {"steps": 600, "warmup_steps": 10, "prefill.launches": 8}
#: the config's prefill, as the fit must give it back
FORWARD = {"base": 400.0, "per_token": 0.9}
HOST = {"base": 120.0, "per_token": 0.01}


def _capture(tmp: Path, rule: str):
    sim = simulate(str(CONFIG), {**SHORT, "scheduling.rule": rule}, engine="simpy")
    path = write_kineto(sim.trace, tmp / f"{rule}.json.gz",
                        style=Style(names="sglang", batch_ranges=True, copies=("result_copy",)))
    return sim, path


@pytest.mark.parametrize("rule, shapes", [("sglang", {"decode", "prefill"}),
                                          ("sglang_mixed", {"decode", "mixed"})])
def test_fit_reads_each_shape_and_checks_within_3_percent(rule, shapes, tmp_path):
    sim, path = _capture(tmp_path, rule)
    cap = open_capture(path)
    fit = fit_model(cap)
    cfg = fit.config
    assert cfg["scheduling"] == {"rule": rule}
    pf = cfg["prefill"]
    assert pf["chunk_tokens"] == 4096 and pf["graph"] == "eager" and pf["launches"] == 8
    assert any(line.startswith("  prefill.launches 8: the capture's 8.0 launches")
               for line in fit.header)
    for got, want in ((pf["forward_us"], FORWARD), (pf["host_us"], HOST)):
        assert got["base"] == pytest.approx(want["base"], rel=0.01, abs=1.0)
        assert got["per_token"] == pytest.approx(want["per_token"], rel=0.01)
    assert "arrivals" in cfg["workload"] and cfg["workload"]["prompt_tokens"]
    assert any(line.startswith("Shapes:") for line in fit.header)
    # every fitted phase is a decode phase: the prefill's units are the prefill section's
    assert "prefill" not in [p["name"] for p in cfg["phases"]]
    # the simulator's loop does the same CPU work around every shape's forward: nothing is
    # moved into the prefill's host time
    assert not any("beyond the decode steps'" in line for line in fit.header)
    if rule == "sglang":
        trace = cap.bound.trace
        lays = step_layouts(trace, detect_roles(trace, cap.mapping)[0])
        kinds = classify(cap)
        around = {kinds.shape[k]: cpu_outside(trace, lays[k], lays[k].units)
                  for k in (40, 41, 42, 43, 44, 45) if k in lays}
        assert set(around) == {"decode", "prefill"}  # ingest, schedule, prepare, result
        assert around["decode"] == pytest.approx(100 + 900 + 300 + 800)
        assert around["prefill"] == pytest.approx(around["decode"])

    steps, _ = import_report(cap.bound)
    checked = check_fit(cap, load_config(cfg), "fitted", steps, path.name)
    rows = {r["key"]: r for r in checked["rows"]}
    judged = {k.split(".")[1] for k, r in rows.items()
              if k.startswith("by_shape.") and r["ok"] is not None}
    assert judged == shapes, checked["text"]
    assert checked["ok"], checked["text"]
    # judged on SHAPE_SEEDS runs' steps together, each run's own error printed beside
    assert f"seeds               {SHAPE_SEEDS} runs pooled (seeds 0-{SHAPE_SEEDS - 1}" \
        in checked["text"]
    for shape in shapes:
        assert abs(rows[f"by_shape.{shape}.own_us_mean"]["error"]) <= 0.03
    # the whole-run figures depend on each run's queue: shown, not judged
    assert rows["step_us_mean"]["ok"] is None
    if rule == "sglang_mixed":  # mixed steps whose prefill kernels no phase names: said
        plain = fit_model(open_capture(path, {"preset": "sglang",
                                              "phases": {"^sample$": "sample"}}))
        assert "prefill" not in plain.config
        assert any("mixed steps, but no forward kernel of theirs is of the phase 'prefill'" in w
                   for w in plain.warnings)
    if rule == "sglang":  # a config that never runs the capture's prefill steps misses
        other = check_fit(cap, load_config(cfg, {"scheduling.rule": "sglang_mixed"}),
                          "mixed", steps, path.name)
        assert not other["ok"]
        assert {r["key"]: r["ok"] for r in other["rows"]}["by_shape.prefill.own_us_mean"] \
            is False
        assert "prefill step time" in other["text"]


#: long prompts (longer than the chunk) whose later chunks cost more by their cached prefix
LONG = {"steps": 500, "scheduling.rule": "sglang", "prefill.chunk_tokens": 2048,
        "prefill.forward_us": {"base": 400, "per_token": 0.9, "per_token_prefix": 2e-5},
        "workload.prompt_tokens": {"dist": "lognormal", "mean": 6000, "std": 3000},
        "workload.arrivals": {"rate_per_s": 40}}


def test_the_prefix_term_is_fitted_from_carried_chunks(tmp_path):
    """A simulated sglang capture of prompts prefilled over several chunks: each step's prefix
    is read from the ranges' tokens and requests (the simulator's own where the ranges give
    it, unknown where several requests share a step), and ``forward_us`` is fitted back
    within 1 % per term; the check within 3 % per shape."""
    cfg = load_config(str(CONFIG), {**SHORT, **LONG})
    sim = simulate(cfg, engine="simpy")
    path = write_kineto(sim.trace, tmp_path / "long.json.gz",
                        style=Style(names="sglang", batch_ranges=True, copies=("result_copy",)))
    cap = open_capture(path)
    pre, carried = prefixes(classify(cap), 2048)
    true = resolve_sizes(cfg).prefill_prefix
    known = {k: v for k, v in pre.items() if v >= 0}
    assert carried == int((true > 0).sum()) and sum(v > 0 for v in known.values()) >= 20
    assert all(v == true[k] for k, v in known.items())
    fit = fit_model(cap)
    got = fit.config["prefill"]["forward_us"]
    for key, want in LONG["prefill.forward_us"].items():
        assert got[key] == pytest.approx(want, rel=0.01), fit.header
    assert any("continued a carried-over request" in line for line in fit.header)
    steps, _ = import_report(cap.bound)
    checked = check_fit(cap, load_config(fit.config), "fitted", steps, path.name)
    assert checked["ok"], checked["text"]


#: a light load of short requests with DP-attention idle steps between them
IDLE = {"scheduling.rule": "sglang", "workload.arrivals": {"rate_per_s": 15},
        "workload.initial_batch": 0,
        "workload.output_tokens": {"dist": "uniform", "low": 8, "high": 60},
        "workload.prompt_tokens": {"dist": "lognormal", "mean": 1500, "std": 800},
        "scheduling.idle": {"forward_us": 300.0, "host_us": 40.0, "graph": "eager"}}


@pytest.mark.parametrize("graph", ["eager", "full"])
def test_idle_steps_fit_scheduling_idle(graph, tmp_path):
    """A simulated capture with idle steps (a forward with no request; the simulator's capture
    names them ``decode bs=0``, SGLang's ``step[IDLE bs=0]``), eager or a graph (of batch 0:
    no graph bucket of the config): ``scheduling.idle`` fitted back exactly, and the check
    judges the idle steps as a shape of their own, within 3 %."""
    idle = {**IDLE, "scheduling.idle": {**IDLE["scheduling.idle"], "graph": graph}}
    sim = simulate(str(CONFIG), {**SHORT, **idle}, engine="simpy")
    path = write_kineto(sim.trace, tmp_path / "idle.json.gz",
                        style=Style(names="sglang", batch_ranges=True, copies=("result_copy",)))
    # the preset reads a bare `idle` range as the loop waiting for requests (SGLang's on_idle
    # stage); the simulator's capture names the idle forward's own range so: not that here
    cap = open_capture(path, {"preset": "sglang", "idle": None})
    assert classify(cap).counts()["idle"] > 50
    fit = fit_model(cap)
    assert fit.config["scheduling"] == {"rule": "sglang", "idle": idle["scheduling.idle"]}
    assert 0 not in fit.config["workload"]["graph_buckets"]
    assert any(line.startswith("Idle (") for line in fit.header)
    steps, _ = import_report(cap.bound)  # the fitted run long enough for every shape
    checked = check_fit(cap, load_config(fit.config, {"steps": 800}), "fitted", steps,
                        path.name)
    assert checked["ok"], checked["text"]
    rows = {r["key"]: r for r in checked["rows"]}
    assert rows["by_shape.idle.own_us_mean"]["ok"] is True


def test_the_check_adds_the_profilers_cost_back_to_every_host_key(tmp_path, monkeypatch):
    """The check adds the profiler's cost back to the host durations a host at another speed
    scales (``scale_host``), one list (``host_keys``): the idle step's host time of a profiled
    capture with idle steps, and a prefill's host time before its window, too."""
    sim = simulate(str(CONFIG), {**SHORT, **IDLE}, engine="simpy")
    path = write_kineto(sim.trace, tmp_path / "idle.json.gz", profiled=True,
                        style=Style(names="sglang", batch_ranges=True, copies=("result_copy",)))
    cap = open_capture(path, {"preset": "sglang", "idle": None})
    net, kept = fit_model(cap).config, fit_model(cap, profiler_cost=False).config
    back = profiler_back(cap, net)
    idle = kept["scheduling"]["idle"]["host_us"] - net["scheduling"]["idle"]["host_us"]
    assert idle > 1.0 and back["scheduling.idle.host_us"] == pytest.approx(idle, abs=1e-3)
    steps, _ = import_report(cap.bound)
    assert check_fit(cap, load_config(net), "fitted", steps, "idle")["profiler_back"] == back
    # every host key, whatever its section: a fit that keeps half as much again of each
    net["prefill"]["host_before_us"] = {"base": 50.0, "per_token": 0.01}
    monkeypatch.setattr("simwar.fit.check.fit_model",
                        lambda cap, **kw: SimpleNamespace(config=scale_host(net, 1.5)))
    back = profiler_back(cap, net)
    dumped = load_config(net).model_dump()
    held = {k for k in host_keys(dumped) if duration_mean(get_dotted(dumped, k)) > 0.01}
    assert {"prefill.host_us", "prefill.host_before_us", "scheduling.idle.host_us"} <= held
    assert set(back) == held
    assert back["prefill.host_before_us"] == pytest.approx(25.0, abs=1e-3)


def test_unprofiled_rescaling_scales_the_shapes_forwards():
    """``--unprofiled-step-us`` scales every device time (and per bucket every host time):
    the prefill's and the idle step's too, a small coefficient kept to its digits."""
    cfg = {"prefill": {"forward_us": {"base": 400, "per_token": 0.9, "per_token_prefix": 2e-5},
                       "host_us": {"base": 120, "per_token": 0.0123}},
           "scheduling": {"rule": "sglang", "idle": {"forward_us": 300.0, "host_us": 40.0}}}
    out = scale_device(cfg, 0.5, 2.0)
    assert out["prefill"]["forward_us"] == {"base": 200, "per_token": 0.45,
                                            "per_token_prefix": 1e-5}
    assert out["prefill"]["host_us"] == {"base": 240, "per_token": 0.0246}
    assert out["scheduling"]["idle"] == {"forward_us": 150, "host_us": 80}
    assert cfg["prefill"]["forward_us"]["base"] == 400  # a copy
    assert scale_device(cfg, 0.5)["prefill"]["host_us"] == cfg["prefill"]["host_us"]


def test_scale_host_scales_exactly_the_host_keys():
    """A host at another speed (``scale_host``): every host duration (the CPU work, each
    phase's, the prefill's and the idle step's host time, the host API costs) times the
    factor, faster as slower; nothing on the device, nor the device latencies; the calls
    alone with ``work=False`` (a replay's timed spins)."""
    cfg = {"cpu": {k: 100.0 for k in CPU_KEYS},
           "costs": {**{k: 4.0 for k in HOST_COSTS}, "sync_wake_us": 16.0,
                     "cross_stream_us": 3.0, "launch_us": {"base": 6.0, "per_seq": 0.5}},
           "gpu": {k: 50.0 for k in GPU_KEYS},
           "phases": [{"name": "forward", "graph": "full", "host_us": 30.0,
                       **{k: 200.0 for k in PHASE_KEYS}}],
           "prefill": {"forward_us": {"base": 400, "per_token": 0.9},
                       "host_us": {"base": 120, "per_token": 0.0123}, "launches": 32},
           "scheduling": {"rule": "sglang", "idle": {"forward_us": 300.0, "host_us": 40.0}}}
    for f in (0.5, 1.6):
        out = scale_host(cfg, f)
        changed = {k for k in _leaves(cfg) if _leaves(out)[k] != _leaves(cfg)[k]}
        host = ({f"cpu.{k}" for k in CPU_KEYS}
                | {f"costs.{k}" for k in HOST_COSTS if k != "launch_us"}
                | {"costs.launch_us.base", "costs.launch_us.per_seq", "phases.0.host_us",
                   "prefill.host_us.base", "prefill.host_us.per_token",
                   "scheduling.idle.host_us"})
        assert changed == host
        assert all(_leaves(out)[k] == pytest.approx(_leaves(cfg)[k] * f) for k in host)
        calls = {k for k in _leaves(cfg)
                 if _leaves(scale_host(cfg, f, work=False))[k] != _leaves(cfg)[k]}
        assert calls == {k for k in host if k.startswith("costs.")}
    assert scale_host(cfg, 1.0) == cfg and scale_host(cfg, 2.0) is not cfg
    assert cfg["cpu"]["schedule_us"] == 100.0  # a copy
    # --unprofiled-step-us's host factor is the same rule
    assert scale_device(cfg, 1.0, 1.6) == scale_host(cfg, 1.6)


def test_scale_device_copies_the_config_once(monkeypatch):
    """Device and host scaled in one copy (the host's in place, not a copy of the copy)."""
    import simwar.fit.profiler as profiler

    copies = []
    real = profiler.copy.deepcopy
    monkeypatch.setattr(profiler.copy, "deepcopy", lambda x: copies.append(1) or real(x))
    cfg = {"cpu": {"schedule_us": 100.0}, "gpu": {"schedule_prep_us": 10.0},
           "phases": [{"name": "forward", "host_us": 30.0, "body_us": 200.0}]}
    out = scale_device(cfg, 0.5, 2.0)
    assert len(copies) == 1 and out["cpu"]["schedule_us"] == 200.0
    assert out["phases"][0] == {"name": "forward", "host_us": 60.0, "body_us": 100.0}
    assert cfg["phases"][0]["host_us"] == 30.0  # the caller's untouched


def test_a_forwards_window_starts_after_the_call_before_its_first_launch():
    """One rule (the prefill's window, the idle forward's host time, the CPU work outside the
    window): the end of the step's last call that ended before the first launch began, but
    the forward's own calls; else the default (the step's start); never before the step."""
    from simwar.fit.layout import StepLayout
    from simwar.fit.shapes import _window_start

    s0 = [10.0, 20.0, 40.0, 5.0]  # calls 0, 1 before the launch (2), 3 a call of its own
    e0 = [15.0, 30.0, 45.0, 35.0]
    lay = StepLayout(0, 12.0, 100.0, [0, 1, 2, 3], [], [], [], [], [], [], None, None, None)
    assert _window_start(lay, 2, s0, e0) == 35.0
    assert _window_start(lay, 2, s0, e0, skip={3}) == 30.0
    assert _window_start(lay, 1, s0, e0) == 15.0
    assert _window_start(lay, 0, s0, e0) == 12.0  # nothing before: the step's start
    assert _window_start(lay, 0, s0, e0, default=10.0) == 12.0  # never before the step
    lay = StepLayout(0, 0.0, 100.0, [0, 1, 2, 3], [], [], [], [], [], [], None, None, None)
    assert _window_start(lay, 0, s0, e0, default=10.0) == 10.0


def _leaves(node, where=""):
    """A nested config's numbers by dotted key."""
    if isinstance(node, dict):
        return {k: v for key, val in node.items()
                for k, v in _leaves(val, f"{where}.{key}" if where else str(key)).items()}
    if isinstance(node, list):
        return {k: v for i, val in enumerate(node) for k, v in _leaves(val, f"{where}.{i}").items()}
    return {where: node} if isinstance(node, (int, float)) else {}


def test_launch_device_ends_the_forward_where_the_capture_did():
    """Over a host window of 3,200 µs in 32 launches (100 µs each), a forward that ends at
    5,000 µs is device-bound (its kernels back to back from the first launch's end: 4,900);
    one that ends 10 µs after the last launch is launch-bound (each kernel 10 µs: 320)."""
    assert launch_device(5000.0, 3200.0, 32) == pytest.approx(4900.0)
    assert launch_device(3210.0, 3200.0, 32) == pytest.approx(320.0)
    assert launch_device(3000.0, 3200.0, 32) == 0.0  # the window outlasts it: nothing left
    assert launch_device(700.0, 500.0, 1) == pytest.approx(200.0)  # one launch: the tail


def test_prefixes_follow_the_ranges():
    """A step after a full chunk continues its last request: alone in its steps, its prefix
    is its earlier chunks' tokens times this one's; several requests in a step leave it
    unknown (-1); a capture without a full chunk carries nothing."""
    kinds = StepKinds(shape=dict.fromkeys(range(6), "prefill"),
                      tokens={0: 100, 1: 1000, 2: 1000, 3: 300, 4: 1000, 5: 200},
                      requests={0: 2, 1: 1, 2: 1, 3: 2, 4: 3, 5: 1})
    assert prefixes(kinds, 1000) == ({0: 0, 1: 0, 2: 1000 * 1000, 3: -1, 4: 0, 5: -1}, 3)
    none = StepKinds(shape={0: "prefill", 1: "prefill"}, tokens={0: 10, 1: 20},
                     requests={0: 1, 1: 1})
    assert prefixes(none, 1000) == ({0: 0, 1: 0}, 0)
    section, lines = prefill_section({k: PrefillSample(k, "prefill", t, 50.0, 60.0, 0.0, False,
                                                       launches=1, busy_us=100.0 + t)
                                      for k, t in none.tokens.items()}, ["req_to_token"],
                                     kinds=none)
    assert "per_token_prefix" not in section["forward_us"]
    assert any("per_token_prefix 0: the capture gave no carried chunks" in line
               for line in lines)


def test_a_decode_only_capture_fits_as_before(tmp_path):
    """A capture without prompts has no shapes: no prefill, no scheduling, its batches
    replayed (the fit of every capture before shapes)."""
    sim = simulate(str(ROOT / "configs" / "dspark_fine.yaml"),
                   {"steps": 60, "warmup_steps": 6}, engine="simpy")
    path = write_kineto(sim.trace, tmp_path / "d.json.gz",
                        style=Style(names="sglang", batch_ranges=True))
    fit = fit_model(open_capture(path))
    assert "prefill" not in fit.config and "scheduling" not in fit.config
    assert not any(line.startswith("Shapes:") for line in fit.header)


def test_prompt_groups_follow_carried_chunks():
    """A run of prefill steps whose chunks are full carries one request over: its tokens add
    up, its requests are counted once."""
    kinds = StepKinds(shape={0: "prefill", 1: "prefill", 2: "decode", 3: "prefill",
                             4: "prefill"},
                      tokens={0: 4096, 1: 1000, 3: 300, 4: 500},
                      requests={0: 1, 1: 2, 3: 2, 4: 1})
    assert prompt_groups(kinds, [0, 1, 2, 3, 4], 4096) == [(2, 5096), (2, 300), (1, 500)]
    # a mixed step's chunk is the same queue's (its range counts no requests: one each)
    mixed = StepKinds(shape={0: "mixed", 1: "mixed", 2: "decode", 3: "mixed", 4: "prefill"},
                      tokens={0: 2048, 1: 2048, 3: 700, 4: 300}, requests={4: 2})
    assert prompt_groups(mixed, [0, 1, 2, 3, 4], 2048) == [(1, 4096), (1, 700), (2, 300)]


def test_a_mixed_steps_excess_before_its_first_kernel_is_the_prefills_preparation():
    """A mixed step's host work beyond the decode steps' mean goes to its prefill: the loop's
    before the launch (ingest, schedule, prepare) and its first phase's (``phases.NAME.host_us``
    of the first phase: on the server the rest of the batch's preparation up to its first
    copy) before the prefill's first launch (``extra_before_us``), as the server does it
    before the step's first kernel; the rest (the later phases', the work after the launch)
    in its host time."""
    s = Samples()
    for k in range(12):
        mixed = k in (3, 7)
        s.add("cpu.prepare_us", 100.0 + 500 * mixed, k)
        s.add("cpu.post_launch_us", 50.0 + 30 * mixed, k)
        s.add("phases.forward.host_us", 20.0 + 90 * mixed, k)
        s.add("phases.draft.host_us", 10.0 + 40 * mixed, k)
    samples = {k: PrefillSample(k, "mixed", 100, 0.0, 0.0, 0.0, False) for k in (3, 7)}
    assert split_host(s, samples, "forward") == pytest.approx(500 + 30 + 90 + 40)
    for p in samples.values():
        assert p.extra_before_us == pytest.approx(500 + 90)
        assert p.extra_us == pytest.approx(500 + 30 + 90 + 40)
    assert s.steps_of("phases.forward.host_us") == [k for k in range(12) if k not in (3, 7)]


def test_token_line_is_never_negative():
    assert token_line([100, 200, 300], [50, 40, 30])[0] == pytest.approx(40.0)  # slope < 0
    line, how = token_line([1000, 2000, 3000], [50, 250, 450])  # base < 0: through 0
    assert line["base"] == 0.0 and line["per_token"] > 0 and "through 0" in how
    assert token_line([-1, -1], [5.0, 7.0])[0] == 6.0  # no tokens named: the mean


def test_unknown_step_kind_is_one_line(tmp_path):
    sim, path = _capture(tmp_path, "sglang")
    cap = open_capture(path, {"preset": "sglang", "shape": r"^(?P<mode>scheduler)\.run_batch$"})
    with pytest.raises(FitError, match=r"names the step kind 'scheduler', which simwar does "
                                       r"not know"):
        fit_model(cap)


@pytest.mark.parametrize("name, shape, tokens, requests", [
    ("sglang_extend_bs15", "prefill", 15360, 15),  # step[EXTEND bs=15 toks=15360]: eager
    ("sglang_decode_bs32", "decode", None, None),
    ("vllm_mixed_piecewise", "mixed", 8155, 9),  # context 9 (8155 tokens), generation 37
    ("vllm_decode_full_bs32", "decode", None, None)])
def test_real_engines_steps_have_their_shapes(name, shape, tokens, requests):
    """The public captures of real engines (tests/data/real: one step each, too few to fit):
    each step's shape from its engine's own range, the prompts' tokens where it names them,
    and the chunk's requests (a mixed step's: vLLM's context count, not its whole batch)."""
    kinds = classify(open_capture(ROOT / "tests" / "data" / "real" / f"{name}.json.gz"))
    assert kinds.shape == {0: shape}
    assert kinds.tokens.get(0) == tokens
    assert kinds.requests.get(0) == requests


def test_the_mini_servers_mixed_steps_are_read_from_its_prefill_range():
    """The mini-server's committed prefill capture (H200, profiled) names every step ``decode
    bs=B`` and its prefill chunk by an inner ``prefill`` range (no token count): those steps
    are mixed, the rule sglang_mixed, the prefill's cost a constant (no tokens to fit a line
    on), its host time the launch train plus what a mixed step's other host work adds; the
    check (the profiler's cost added back) within 3 % for both shapes."""
    cap = open_capture(ROOT / "tests" / "data" / "server"
                       / "prefill_light_overlap_profiled.kineto.json.gz", preset="sglang")
    kinds = classify(cap)
    assert kinds.counts() == {"decode": 92, "mixed": 28}  # 28 prefill ranges
    assert all(t == -1 for t in kinds.tokens.values())
    fit = fit_model(cap)
    assert fit.config["scheduling"] == {"rule": "sglang_mixed"}
    pf = fit.config["prefill"]
    assert isinstance(pf["host_us"], float) and pf["host_us"] > 1000  # an eager launch train
    assert [p["name"] for p in fit.config["phases"]] == ["forward", "draft", "verify", "sample"]
    assert any("beyond the decode steps' (mean +4" in line for line in fit.header)
    # its 57 launches modelled as 32, each kernel as launched: the prefill's whole device time
    assert pf["launches"] == 32 and pf["forward_us"] > 600
    # (7.11 µs a launch: an eager prefill's host time keeps the profiler's cost,
    # EAGER_PREFILL_LESS_PROFILER)
    assert any(line.startswith("  prefill.launches 32: the capture's 57.0 launches per prefill "
                               "(mean; 7.11 µs of host each), modelled as 32")
               for line in fit.header)
    steps, _ = import_report(cap.bound)
    checked = check_fit(cap, load_config(fit.config), "fitted", steps, "prefill_light")
    assert checked["ok"] and checked["profiler_back"], checked["text"]
    rows = {r["key"]: r for r in checked["rows"]}
    for shape in ("decode", "mixed"):
        assert abs(rows[f"by_shape.{shape}.own_us_mean"]["error"]) <= 0.03
    # the mixed step's forward starts at the prefill's first kernel, as the capture's does
    # (one kernel after the whole host window was 2031 µs short); it runs longer by the host
    # work the prefill's window holds spread over its launches, which the capture did before
    # them (+439 µs) or did not do (the empty chunk's launch calls, +233 µs)
    fwd = rows["by_shape.mixed.fwd_us_mean"]
    assert 0.9 < fwd["simulated"] / fwd["capture"] < 1.25, checked["text"]


def test_a_step_of_several_forwards_takes_its_prefill_range():
    """SGLang's speculative decoding runs several forwards in one step, each in its own range:
    an EXTEND then a DRAFT_EXTEND is a prefill step, whatever their order."""
    from types import SimpleNamespace

    from simwar.capture.step_shapes import StepShape

    def cap(*names):
        shapes = [StepShape(mode, 4, toks, name, 0) for mode, toks, name in names]
        trace = simulate(str(ROOT / "configs" / "dspark_fine.yaml"),
                         {"steps": 4, "warmup_steps": 0}, engine="simpy").trace
        mapping = SimpleNamespace(shape=None)
        return SimpleNamespace(bound=SimpleNamespace(trace=trace), shapes=shapes,
                               mapping=mapping)

    extend = ("EXTEND", 300, "step[EXTEND bs=4 toks=300]")
    draft = ("DRAFT_EXTEND", -1, "step[DRAFT_EXTEND bs=4]")
    for order in ((extend, draft), (draft, extend)):
        kinds = classify(cap(*order))
        assert kinds.shape[0] == "prefill" and kinds.tokens[0] == 300


def test_an_eager_prefill_keeps_the_profilers_cost_a_graph_one_does_not(monkeypatch):
    """The twins showed the profiler not lengthening the mini-server's eager prefill
    (``EAGER_PREFILL_LESS_PROFILER``): its host time is the capture's, while the window taken
    out of the decode unit's host region (net of the profiler) is net too; with the rule
    turned on, the host time is taken net like the window."""
    from simwar.fit import shapes
    from simwar.fit.profiler_cost import for_capture

    cap = open_capture(ROOT / "tests" / "data" / "server"
                       / "prefill_light_overlap_profiled.kineto.json.gz", preset="sglang")
    trace = cap.bound.trace
    lays = step_layouts(trace, detect_roles(trace, cap.mapping)[0])
    kinds = classify(cap)
    prof = for_capture(cap.bound)
    raw = shapes.split_prefill(trace, lays, kinds)[1]
    kept = shapes.split_prefill(trace, lays, kinds, prof)[1]
    assert raw and set(raw) == set(kept) and not any(p.graph for p in raw.values())
    for k, p in kept.items():
        assert p.host_us == raw[k].host_us and p.launch_us == raw[k].launch_us
        assert p.window_us < raw[k].window_us
    monkeypatch.setattr(shapes, "EAGER_PREFILL_LESS_PROFILER", True)
    net = shapes.split_prefill(trace, lays, kinds, prof)[1]
    assert all(net[k].host_us < raw[k].host_us and net[k].window_us == kept[k].window_us
               for k in raw)


def test_a_shapes_step_is_taken_at_the_capture_s_tokens_before_it():
    """A step's time is its forward's end less the one before's, so it follows the prompt
    tokens the step before prefilled (``before_tokens``, a column of each shape's frame): the
    simulation's mean is moved to the capture's along its own slope in them."""
    n = 8
    table = {"step": list(range(n)), "step_us": [1.0] * n, "fwd_us": [900.0] * n,
             "fwd_gap_us": [100.0] * n, "batch_size": [4] * n}
    shapes = {k: "mixed" if k % 2 == 0 else "decode" for k in range(n)}
    tokens = {k: 100.0 * (k + 1) for k in range(0, n, 2)}
    frame = shape_frame(table, shapes, tokens)
    assert frame["decode"]["before_tokens"].tolist() == [100, 300, 500, 700]
    assert frame["mixed"]["before_tokens"].tolist() == [0, 0, 0, 0]
    before = np.array([100.0, 300, 500, 700])
    sim = {"own_us": 1000 + 0.5 * before, "batch": np.full(4, 4.0), "bucket": np.full(4, 8.0),
           "after": np.full(4, 2.0), "before_tokens": before}
    cap = {"own_us": np.full(2, 1100.0), "batch": np.full(2, 4.0), "bucket": np.full(2, 8.0),
           "after": np.full(2, 2.0), "before_tokens": np.full(2, 150.0)}
    assert at_sizes(sim, cap, "own_us", "decode") == pytest.approx(1075.0)


def test_the_h200_mixed_capture_fits_its_chunk_once_and_its_requests():
    """The third H200 run's mixed capture (``lab.check.SERVER_MAPPING``): a decode phase's
    device time that ran on past a step's end (the next phase issued ahead, queued) stops at
    the first kernel its stream started, not at the next phase's first kernel: a mixed step's
    prefill chunk lies between ``forward`` and ``draft``, and was counted in
    ``phases.forward.body_us`` on the steps where the host ran ahead (1.1-5.6 ms); the mixed
    steps' batch is their range's (not their graph's bucket), and their chunks are the
    queue's prompts: the workload's rate near the 38 requests a second the server ran."""
    from lab.check import SERVER_MAPPING

    cap = open_capture(ROOT / "tests" / "data" / "server" / "shapes" / "run3"
                       / "shapes_mixed_medium_overlap_profiled.kineto.json.gz", SERVER_MAPPING)
    assert not cap.sizes.from_bucket  # every step's batch from its range
    fit = fit_model(cap)
    forward = next(p for p in fit.config["phases"] if p["name"] == "forward")
    assert max(forward["body_us"]["values"]) < 50.0
    wl = fit.config["workload"]
    assert 30 < wl["arrivals"]["rate_per_s"] < 45
    assert wl["prompt_tokens"]["dist"] == "lognormal" and wl["prompt_tokens"]["mean"] > 1500


def test_the_rule_a_capture_shows_is_mixed_where_any_step_mixes():
    """SGLang's mixed chunk runs a prefill step of its own when no request decodes (nothing
    to mix into), so a mixed-mode capture at a varying load holds a few: any mixed step
    makes the rule ``sglang_mixed``; prefill steps with no mixed step, ``sglang``."""
    from simwar.fit.shapes import StepKinds, rule_of

    def rule(*shapes):
        kinds = StepKinds(shape=dict(enumerate(shapes)))
        return rule_of(kinds, range(len(shapes)))

    assert rule("prefill", "mixed", "decode", "mixed", "prefill") == "sglang_mixed"
    assert rule("decode", "mixed") == "sglang_mixed"
    assert rule("prefill", "decode", "prefill") == "sglang"
    assert rule("decode", "decode") == "sglang_mixed"  # no prompts: the default rule


def test_the_h200_mixed_steps_name_their_chunks_requests():
    """The fourth H200 run's mixed capture names each mixed step's chunk requests (``mixed
    bs=B toks=T reqs=N``, read as the shape's ``context`` group): the mixed steps carry
    their requests, so the carried chunks over a known prefix give the forward its
    ``per_token_prefix`` and the workload counts each request's prompt once (a mixed step
    counted one request before: 24 requests, 26 a second, where the ranges name 32)."""
    from lab.check import SERVER_MAPPING

    cap = open_capture(ROOT / "tests" / "data" / "server" / "shapes" / "run4"
                       / "shapes_mixed_medium_overlap_profiled.kineto.json.gz", SERVER_MAPPING)
    kinds = classify(cap)
    mixed = kinds.steps("mixed")
    assert len(mixed) == 47 and all(kinds.requests[k] >= 1 for k in mixed)
    assert max(kinds.requests[k] for k in mixed) == 3
    pre, carried = prefixes(kinds, 2048)
    assert carried == 24 and sum(v > 0 for v in pre.values()) == 6
    fit = fit_model(cap)
    assert fit.config["prefill"]["forward_us"]["per_token_prefix"] > 0
    assert any("24 steps continued a carried-over request, 6 of them" in line
               for line in fit.header)
    assert 30 < fit.config["workload"]["arrivals"]["rate_per_s"] < 40


def test_a_queued_gap_ends_at_its_streams_next_kernel():
    """A decode phase's tail gap stops at the kernel its stream runs next (a mixed step's
    prefill chunk between two phases), found by issue order on that stream: another
    stream's kernel and a record on the same stream in between are not its work."""
    from simwar.core.recorder import Recorder
    from simwar.core.trace import Call, OpKind
    from simwar.fit.layout import queued_gap

    rec = Recorder()
    rec.marker("step", 0, 0.0)

    def kernel(lane, issue, start, end):
        call = rec.host(Call.LAUNCH, 0, issue - 1, issue, "k", op=rec.next_op)
        return rec.op(OpKind.KERNEL, lane, 0, "k", issue=issue, start=start, end=end,
                      call=call)

    a = kernel("forward", 1, 2, 10)
    kernel("copy", 2, 11, 13)  # another stream's kernel, between in time and in issue
    rec.op(OpKind.RECORD, "forward", 0, "r", issue=3, start=10, end=10)
    chunk = kernel("forward", 4, 14, 20)  # a unit the layout does not hold
    b = kernel("forward", 5, 30, 40)
    late = kernel("forward", 50, 60, 70)  # issued after the earlier op ended: no gap
    trace = rec.finish({"warmup_steps": 0})
    assert queued_gap(trace, a, b) == 4.0  # 10 -> the chunk's start, 14
    assert queued_gap(trace, chunk, b) == 10.0  # 20 -> 30: the later op itself
    assert queued_gap(trace, b, late) == 0.0
    assert queued_gap(trace, None, b) == queued_gap(trace, a, None) == 0.0


def test_the_fit_reads_whether_the_decodes_took_their_tokens_of_the_budget_first():
    """SGLang's mixed chunk takes the running batch's tokens out of the chunk budget first
    (``PrefillAdder``'s ``mixed_with_decode_tokens``), so the steps that filled it hold the
    budget less their decodes; a server giving the prompts the whole budget (the mini-server
    before it did as SGLang) holds the budget itself. Either way the budget is read back, and
    a full step's next continues its carried request."""
    from simwar.fit.prefix import prefixes
    from simwar.fit.shapes import StepKinds, budgeted

    def kinds(tokens, decodes):
        k = StepKinds(shape={i: "mixed" for i in range(len(tokens))},
                      tokens=dict(enumerate(tokens)), requests={i: 1 for i in range(len(tokens))},
                      decodes=dict(enumerate(decodes)))
        k.budgeted = budgeted(k)
        return k

    # one 5,000-token prompt over three steps, then a short one, decodes 3..7
    sglang = kinds([2045, 2041, 914, 300], [3, 7, 5, 6])
    whole = kinds([2048, 2048, 904, 300], [3, 7, 5, 6])
    assert sglang.budgeted and not whole.budgeted
    for k in (sglang, whole):
        assert max(k.budget(i) for i in k.tokens) == 2048
        assert prompt_groups(k, sorted(k.tokens), 2048) == [(1, 5000), (1, 300)]
        pre, carried = prefixes(k, 2048)
        assert carried == 2 and pre[3] == 0
    assert prefixes(sglang, 2048)[0][1] == 2041 * 2045
    # no mixed step naming its decodes (a capture of prefill steps): the whole budget
    assert not budgeted(StepKinds(shape={0: "prefill"}, tokens={0: 2048}))


def test_launch_shares_are_each_groups_share_of_its_steps_time():
    """An eager prefill's launch calls cut into ``launches`` groups in issue order: each
    group's host time (less the modelled launch call) and its kernels' device time as a
    share of the step's, averaged over the steps, written as weights (equal: all 1)."""
    steps = [(np.array([10.0, 20.0, 30.0, 40.0]), np.array([100.0, 0.0, 0.0, 300.0]), 5.0),
             (np.array([10.0, 20.0, 30.0]), np.array([1.0, 1.0, 1.0]), 5.0)]
    host, device, used = launch_shares(steps, 2)
    # groups [0, 0, 1, 1] and [0, 0, 1]: hosts 25/65 and 25/25, devices 100/300 and 2/1
    assert used == 2
    want_h = np.mean([[25 / 90, 65 / 90], [0.5, 0.5]], axis=0) * 2
    want_d = np.mean([[0.25, 0.75], [2 / 3, 1 / 3]], axis=0) * 2
    assert host == pytest.approx(want_h, abs=1e-3) and device == pytest.approx(want_d, abs=1e-3)
    assert launch_shares(steps, 1) == ([], [], 0)  # one launch: nothing to share
    assert launch_shares(steps[1:], 4) == ([], [], 0)  # fewer calls than launches


def test_shares_device_ends_the_last_kernel_where_the_capture_did():
    """The least device time at which a prefill of weighted launches ends its last kernel at
    the captured end: device-bound, the kernels back to back after the first launch;
    launch-bound, what the kernels after the last launch run; never below zero."""
    # launches at 50 and 100 µs; kernels 1/4 and 3/4 of D: 50 + D = 500
    assert shares_device(500.0, 100.0, [1, 1], [1, 3]) == pytest.approx(450.0)
    # launch-bound: the last kernel (3/4 of D) starts at 100 and ends at 130: D = 40
    assert shares_device(130.0, 100.0, [1, 1], [1, 3]) == pytest.approx(40.0)
    assert shares_device(90.0, 100.0, [1, 1], [1, 3]) == 0.0
    # equal shares give launch_device's answer
    assert shares_device(5000.0, 3200.0, [1] * 32, [1] * 32) == \
        pytest.approx(launch_device(5000.0, 3200.0, 32))


def test_a_prefills_launch_shares_are_fitted_back_from_its_capture(tmp_path):
    """A simulated capture of a prefill of 4 launches with weighted shares: the fit with
    ``launch_shares`` gives the weights back (the host's net of the launch call) and the
    device time; the default fit writes equal shares."""
    shares = {"prefill.launches": 4, "prefill.host_shares": [1.0, 0.5, 2.0, 0.5],
              "prefill.device_shares": [0.2, 2.4, 0.4, 1.0]}
    cfg = load_config(str(CONFIG), {**SHORT, **shares, "scheduling.rule": "sglang"})
    sim = simulate(cfg, engine="simpy")
    path = write_kineto(sim.trace, tmp_path / "shares.json.gz",
                        style=Style(names="sglang", batch_ranges=True, copies=("result_copy",)))
    cap = open_capture(path)
    fit = fit_model(cap, launch_shares=True)
    pf = fit.config["prefill"]
    assert pf["launches"] == 4
    assert pf["device_shares"] == pytest.approx(shares["prefill.device_shares"], abs=0.01)
    assert pf["host_shares"] == pytest.approx(shares["prefill.host_shares"], abs=0.05)
    for key, want in FORWARD.items():
        assert pf["forward_us"][key] == pytest.approx(want, rel=0.01)
    assert any("each launch its measured share" in line for line in fit.header)
    plain = fit_model(cap).config["prefill"]
    assert "device_shares" not in plain and "host_shares" not in plain
