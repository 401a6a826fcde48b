"""Fit → check → what-if on captures whose batch changes every step, read with a preset.

Each case is a simulated run of a shipped varying-workload config (or a varying variant of a
shipped config, with a ``workload:`` section built here) written as a real server's profile
(``simwar.capture.synthetic``, ``Style(names="sglang")``: ``scheduler.<stage>`` ranges, a
``decode bs=<B>`` range per step, one graph per bucket known by its kernels' launch dims, the
result D2H a memcpy), with the record correlation ids each wait binds to, or without them as
PyTorch 2.11 writes them (event ids only: ``simwar.capture.binding`` binds the waits). It is
imported with no mapping (the preset is detected), fitted, and
the fitted config's simulation (which replays the capture's batches) must infer the config's
own barrier and reproduce the capture within the acceptance bounds, per graph bucket too. The
probe's real H200 captures (PyTorch 2.11) must give their barrier from the event ids alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from simwar.api import simulate
from simwar.capture.open import open_capture
from simwar.capture.presets import load_preset, map_capture
from simwar.capture.sizes import SizesError
from simwar.capture.stalls import import_report
from simwar.capture.synthetic import Style, write_kineto
from simwar.cli.app import main
from simwar.config import ConfigError
from simwar.fit.affine import fit_sized
from simwar.fit.check import accepted, bucket_rows, check_rows, summary_without
from simwar.fit.from_capture import FitError, fit_model
from simwar.fit.profiler import left_out_steps, profiler_steps, scale_device

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
BUCKETS = [8, 16, 32, 64]
#: every bucket's own size is reached, so the buckets are inferred exactly
SWEEP = [1, 3, 6, 8, 11, 16, 20, 27, 32, 40, 52, 64, 58, 44, 31, 24, 16, 12, 8, 5, 2]
SCALING = {"cpu.schedule_us": {"base": 1500, "per_seq": 10},
           "cpu.process_result_us": {"base": 600, "per_seq": 8},
           "gpu.schedule_writes_us": {"base": 40, "per_seq": 4},
           "phases.draft.body_us": {"base": 200, "per_seq": 25},
           "phases.verify.body_us": {"base": 1200, "per_seq": 45}}
SHORT = {"steps": 100, "warmup_steps": 6}
#: name -> (config, overrides, whether the sync events name their records)
#: cases read with a mapping file on the preset (the others: no mapping, detected)
MAPPINGS = {"dflash_uniform_2.11": {"preset": "sglang", "graph_buckets": BUCKETS}}
CASES = {
    "bimodal_fine": ("dspark_fine_bimodal.yaml", {}, True),
    "bimodal_fine_2.11": ("dspark_fine_bimodal.yaml", {}, False),
    "bimodal_coarse_2.11": ("dspark_fine_bimodal.yaml", {"policy.barrier": "coarse"}, False),
    "bimodal_none_2.11": ("dspark_fine_bimodal.yaml", {"policy.barrier": "none"}, False),
    "dspark_sweep_2.11": ("dspark_fine.yaml", {"workload": {"batch_sizes": SWEEP,
                                                            "graph_buckets": BUCKETS},
                                               **SCALING}, False),
    "eagle_sweep": ("eagle_fine.yaml", {"workload": {"batch_sizes": SWEEP,
                                                     "graph_buckets": BUCKETS}, **SCALING},
                    True),
    # random batches need not reach a bucket's own size: the mapping names the buckets
    "dflash_uniform_2.11": ("dflash_fine.yaml", {
        "workload": {"batch_size": {"dist": "uniform", "low": 1, "high": 64},
                     "graph_buckets": BUCKETS}, **SCALING}, False),
    "dspark_arrivals_2.11": ("dspark_fine.yaml", {
        "workload": {"arrivals": {"rate_per_s": 250}, "max_batch": 64, "initial_batch": 8,
                     "output_tokens": {"dist": "uniform", "low": 16, "high": 96},
                     "graph_buckets": BUCKETS}, **SCALING}, False),
    "loop_top_2.11": ("dspark_fine_bimodal.yaml", {"policy.placement": "loop_top"}, False),
    # so light a load that the loop waits for requests: those steps are left out
    "dspark_light_arrivals_2.11": ("dspark_fine.yaml", {
        "workload": {"arrivals": {"rate_per_s": 40}, "max_batch": 64, "initial_batch": 1,
                     "output_tokens": {"dist": "uniform", "low": 4, "high": 12},
                     "graph_buckets": BUCKETS}, **SCALING}, False),
    # the barrier's record is a host record after the graph launch (post-replay), and the
    # legacy host sync at the loop top: their places, as the record ids are -1
    "eagle_post_replay_2.11": ("eagle_fine_draft_extend_post_replay.yaml", {
        "workload": {"batch_sizes": SWEEP, "graph_buckets": BUCKETS}, **SCALING}, False),
    # read-done recorded by the host after the verify graph while draft_extend still reads
    # (racy): found from the call order alone, and the fitted loop races as the capture's
    "eagle_early_post_replay_2.11": ("eagle_publish_verify.yaml", {
        "phases.verify.read_ends": "post_replay",
        "workload": {"batch_sizes": SWEEP, "graph_buckets": BUCKETS}, **SCALING}, False),
    "dflash_host_sync_2.11": ("dflash_legacy_host_sync.yaml", {
        "workload": {"batch_sizes": SWEEP, "graph_buckets": BUCKETS}, **SCALING}, False),
}


def capture(tmp: Path, config, overrides: dict, record_ids: bool = False,
            name: str = "cap.json.gz", **style):
    sim = simulate(config, {**SHORT, **overrides}, engine="simpy")
    style = {"names": "sglang", "batch_ranges": True, "record_ids": record_ids,
             "copies": ("result_copy",), **style}
    path = write_kineto(sim.trace, tmp / name, style=Style(**style))
    return sim, path


def fit_capture(path: Path, mapping=None, preset=None, **kw):
    cap = open_capture(path, mapping, preset)
    return cap.bound, cap.mapping, fit_model(cap, **kw)


def captured(imp, mapping=None) -> dict:
    steps, report = import_report(imp)
    return summary_without(steps, imp.trace.meta, None, left_out_steps(imp, mapping))


def assert_reproduces(imp, fitted, step_rel=1e-3, gap_us=1.0, mapping=None):
    cap = captured(imp, mapping)
    rows = check_rows(cap, fitted.summary) + bucket_rows(cap, fitted.summary)
    assert accepted(rows), [r for r in rows if r.ok is False]
    by = {r.key: r for r in rows}
    assert abs(by["step_us_mean"].error) <= step_rel
    assert abs(by["fwd_gap_us_mean"].error) <= gap_us
    assert sum(1 for r in rows if r.key.startswith("by_bucket") and r.ok) >= 2


# --------------------------------------------------------------------------- the loop
@pytest.mark.parametrize("case", sorted(CASES))
def test_fit_follows_the_batch_and_reproduces_each_bucket(case, tmp_path):
    config, overrides, record_ids = CASES[case]
    sim, path = capture(tmp_path, CONFIGS / config, overrides, record_ids)
    imp, m, fit = fit_capture(path, MAPPINGS.get(case))
    assert m.origin[0] == "sglang"
    assert m.origin[1].startswith("named by" if case in MAPPINGS else "detected")
    # a bucket only the left-out steps ran (the first step, the profiler's) is extrapolated:
    # the fitted config replays those steps too
    replayed = [w for w in fit.warnings if w.endswith("ran in no fitted step of the capture: "
                                                      "extrapolated from the line over the "
                                                      "measured buckets (the capture's own "
                                                      "batches reach them)")]
    assert replayed == ([] if case != "dspark_arrivals_2.11" else [
        f"phases.{p}.{k}_us: graph bucket 8 ran in no fitted step of the capture: extrapolated "
        f"from the line over the measured buckets (the capture's own batches reach them)"
        for p in ("draft", "verify") for k in ("prep", "body")])
    others = [w for w in fit.warnings if w not in replayed]
    assert not others or others == [
        "1 steps without a batch (no device work) replay the batch before them"]
    meta = sim.program.meta
    assert fit.policy.source == "capture"
    assert fit.policy.barrier == meta["barrier_effective"]
    if fit.policy.barrier != "none":
        assert fit.policy.placement == sim.config.policy.placement
    if fit.policy.barrier in ("fine", "host_sync"):
        assert fit.config["phases"][fit.policy.unit]["name"] == meta["publish_phase"]
        assert fit.policy.position == meta["publish_position"]
    # the workload: the capture's own batches, to its last forward
    wl = fit.config["workload"]
    ran = sim.steps.batch_size.to_numpy()
    assert wl["batch_sizes"] == ran[:len(wl["batch_sizes"])].tolist()
    assert len(wl["batch_sizes"]) >= SHORT["steps"] - 1
    close = {}
    if case == "dspark_light_arrivals_2.11":
        waited = {k for k, why in fit.left_out.items() if "waited for requests" in why}
        assert len(waited) >= 5
        # the replay does not wait: the steps after a wait can overlap a little differently
        close = {"step_rel": 5e-3, "gap_us": 5.0}
    fitted = simulate(fit.config)
    assert_reproduces(imp, fitted, mapping=m, **close)
    assert (fitted.summary["races"] > 0) == (sim.summary["races"] > 0)


def test_affine_fits_give_the_config_back_and_say_what_they_were_fitted_on(tmp_path):
    sim, path = capture(tmp_path, CONFIGS / "dspark_fine.yaml", CASES["dspark_sweep_2.11"][1])
    _, _, fit = fit_capture(path)
    assert fit.config["workload"]["graph_buckets"] == BUCKETS  # the sweep reaches every size
    cpu, phases = fit.config["cpu"], {p["name"]: p for p in fit.config["phases"]}
    assert cpu["schedule_us"] == {"base": 1500.0, "per_seq": 10.0}
    assert cpu["process_result_us"] == {"base": 600.0, "per_seq": 8.0}  # the previous step's
    assert fit.config["gpu"]["schedule_writes_us"] == {"base": 40.0, "per_seq": 4.0}
    # a graph phase's device time: each bucket's own mean, not a line in the bucket
    assert phases["verify"]["body_us"] == {"per_bucket": {b: 1200.0 + 45.0 * b for b in BUCKETS}}
    assert cpu["ingest_us"] == 100.0  # no slope: a constant
    f = fit.fits["phases.verify.body_us"]
    assert f.size == "bucket" and f.kind == "per_bucket" and f.sizes == BUCKETS
    assert f.r2 == pytest.approx(1.0) and not f.missing
    assert fit.fits["cpu.schedule_us"].size == "batch"
    header = "\n".join(fit.header)
    assert ("phases.verify.body_us: per bucket, the measured mean of each (8: 1560.0, "
            "16: 1920.0, 32: 2640.0, 64: 4080.0; n ") in header
    assert "cpu.ingest_us: constant, mean 100.00" in header and "slope not significant" in header
    assert "Workload: the capture's own" in header and "graph_buckets [8, 16, 32, 64]" in header


def test_noisy_durations_fit_a_line_with_noise_within_the_bounds(tmp_path):
    noisy = {**CASES["dspark_sweep_2.11"][1], "steps": 260,
             "cpu.schedule_us": {"base": 1500, "per_seq": 10,
                                 "noise": {"dist": "normal", "mean": 150, "std": 50}},
             "cpu.ingest_us": {"dist": "lognormal", "mean": 100, "std": 20}}
    _, path = capture(tmp_path, CONFIGS / "dspark_fine.yaml", noisy)
    imp, _, fit = fit_capture(path)
    s = fit.config["cpu"]["schedule_us"]
    assert s["per_seq"] == pytest.approx(10, abs=0.8) and isinstance(s.get("noise"), dict)
    assert isinstance(fit.config["cpu"]["ingest_us"], dict)  # a distribution, no slope
    assert fit.fits["cpu.ingest_us"].kind == "constant"
    cap = captured(imp)
    rows = check_rows(cap, simulate(fit.config).summary)
    assert accepted(rows), [r for r in rows if r.ok is False]


def test_what_if_arrivals_predicts_their_run(tmp_path):
    # fitted from a sweep, asked another load: the same as the config's own run of that load
    truth_cfg = CASES["dspark_sweep_2.11"][1]
    _, path = capture(tmp_path, CONFIGS / "dspark_fine.yaml", truth_cfg)
    _, _, fit = fit_capture(path, {"preset": "sglang", "accept_tokens": 3.2})
    load = {"workload": CASES["dspark_arrivals_2.11"][1]["workload"], "steps": 300,
            "warmup_steps": 20}
    truth = simulate(CONFIGS / "dspark_fine.yaml", {**truth_cfg, **load})
    pred = simulate(fit.config, load)
    for key in ("step_us_mean", "batch_size_mean", "request_latency_us_mean"):
        assert pred.summary[key] == pytest.approx(truth.summary[key], rel=0.01), key
    for b, v in truth.summary["by_bucket"].items():
        assert pred.summary["by_bucket"][b]["step_us_mean"] == pytest.approx(
            v["step_us_mean"], rel=0.01)


# --------------------------------------------------------------------------- buckets, clamps
def test_a_bucket_the_capture_never_ran_is_refused_or_extrapolated_on_request(tmp_path):
    # the mapping names four buckets, the capture's batches never fill the one of 16
    skip16 = [b for b in SWEEP if not 8 < b <= 16]
    overrides = {**CASES["dspark_sweep_2.11"][1],
                 "workload": {"batch_sizes": skip16, "graph_buckets": BUCKETS}}
    _, path = capture(tmp_path, CONFIGS / "dspark_fine.yaml", overrides)
    mapping = {"preset": "sglang", "graph_buckets": BUCKETS}
    _, _, fit = fit_capture(path, mapping)
    body = {p["name"]: p for p in fit.config["phases"]}["verify"]["body_us"]
    assert body == {"per_bucket": {8: 1560.0, 32: 2640.0, 64: 4080.0}}
    assert ("phases.verify.body_us: graph bucket 16 ran in no fitted step of the capture: the "
            "fitted config refuses a run that reaches it (fit with --extrapolate-buckets to "
            "extrapolate from the measured buckets)") in fit.warnings
    assert "Not in the per-bucket tables" in "\n".join(fit.header)
    simulate(fit.config)  # its own batches never reach bucket 16
    load = {"workload": CASES["dspark_arrivals_2.11"][1]["workload"], "steps": 200}
    with pytest.raises(ConfigError, match=r"phases\.draft\.prep_us: per_bucket has no entry for "
                                          r"bucket 16, which the run reaches"):
        simulate(fit.config, load)
    _, _, fit = fit_capture(path, mapping, extrapolate_buckets=True)
    body = {p["name"]: p for p in fit.config["phases"]}["verify"]["body_us"]
    assert body == {"per_bucket": {8: 1560.0, 16: 1920.0, 32: 2640.0, 64: 4080.0}}  # on the line
    assert fit.fits["phases.verify.body_us"].extrapolated == [16]
    assert "Extrapolated (in no fitted step; --extrapolate-buckets" in "\n".join(fit.header)
    assert simulate(fit.config, load).summary["by_bucket"][16]["steps"] > 0


def test_a_capture_of_one_bucket_does_not_lend_its_cost_to_the_others(tmp_path):
    # every batch runs the graph of 64: the fit knows that bucket's cost only
    overrides = {**CASES["dspark_sweep_2.11"][1],
                 "workload": {"batch_sizes": [40, 50, 64, 36, 58, 44], "graph_buckets": BUCKETS}}
    _, path = capture(tmp_path, CONFIGS / "dspark_fine.yaml", overrides)
    _, _, fit = fit_capture(path)
    assert fit.config["workload"]["graph_buckets"] == [64]
    body = {p["name"]: p for p in fit.config["phases"]}["verify"]["body_us"]
    assert body == {"per_bucket": {64: 4080.0}}
    load = {"workload": CASES["dspark_arrivals_2.11"][1]["workload"], "steps": 200}
    with pytest.raises(ConfigError, match=r"phases\.draft\.prep_us: per_bucket has no entry for "
                                          r"bucket 8, which the run reaches \(it gives buckets "
                                          r"64\)"):
        simulate(fit.config, load)
    # the mapping names the server's buckets: warned of; extrapolated on request, as a constant
    _, _, fit = fit_capture(path, {"preset": "sglang", "graph_buckets": BUCKETS},
                            extrapolate_buckets=True)
    body = {p["name"]: p for p in fit.config["phases"]}["verify"]["body_us"]
    assert body == {"per_bucket": {b: 4080.0 for b in BUCKETS}}
    assert ("phases.verify.body_us: graph buckets 8, 16, 32 ran in no fitted step of the "
            "capture: extrapolated from the one measured bucket (64), as a constant "
            "(--extrapolate-buckets)") in fit.warnings


def test_add_shifts_a_per_bucket_table_and_a_line(tmp_path, capsys):
    # fitted from the sweep, asked what-if every verify graph runs 300 µs longer (and the
    # schedule 200 µs): the capture of that run is within the bounds
    truth = CASES["dspark_sweep_2.11"][1]
    _, path = capture(tmp_path, CONFIGS / "dspark_fine.yaml", truth)
    out = tmp_path / "fitted.yaml"
    assert main(["import", str(path), "--fit", "-o", str(out), "--no-progress"]) == 0
    slower = {**truth, "phases.verify.body_us": {"base": 1500, "per_seq": 45},
              "cpu.schedule_us": {"base": 1700, "per_seq": 10}}
    _, more = capture(tmp_path, CONFIGS / "dspark_fine.yaml", slower, name="more.json.gz")
    capsys.readouterr()
    assert main(["import", str(more), "--check", str(out), "--add",
                 "phases.verify.body_us=300", "--add", "cpu.schedule_us=200",
                 "--no-progress"]) == 0
    assert "within the bounds" in capsys.readouterr().out


def test_fitted_lines_are_clamped_non_negative_at_every_batch_the_config_runs():
    x = np.repeat(np.arange(2, 41), 5).astype(float)
    rng = np.random.default_rng(3)
    rising = fit_sized(-30 + 3 * x + rng.normal(0, 2, len(x)), x)  # below 0 at batch 0
    assert rising.kind == "affine" and rising.clamped > 0 and rising.value["base"] >= 0
    assert "base raised by" in rising.text()
    # a falling line (significant) is no cost of the size: the samples' distribution, never
    # negative at batch 128 where the line would be
    falling = fit_sized(200 - 2 * x + rng.normal(0, 2, len(x)), x)
    assert falling.t < -3 and falling.kind == "constant" and falling.clamped == 0
    assert "per_seq" not in falling.value and falling.value["mean"] > 0
    # a prefill-only step (batch 0) with the clamped lines: the fitted config runs prompts
    fine = fit_sized(10 + 3 * x + rng.normal(0, 2, len(x)), x)
    assert fine.clamped == 0 and "base raised" not in fine.text()


SERVER = ROOT / "tests" / "data" / "server"


@pytest.mark.parametrize("name, buckets", [("fit_ramp_profiled", [8, 16, 32, 64]),
                                           ("races_fine", [8, 16]),
                                           ("hostsync_medium", [32, 64])])
def test_the_servers_captures_give_the_buckets_their_graphs_ran(name, buckets):
    # the server captured graphs at 8/16/32/64; a load that never filled a bucket (14
    # requests at most in the one of 16) still names it, from the graphs' launch dims
    sizes = open_capture(SERVER / f"{name}.kineto.json.gz", preset="sglang").sized()
    assert sizes.buckets == buckets


def test_the_ramp_fit_has_per_bucket_tables_and_runs_prompts():
    fit = fit_model(open_capture(SERVER / "fit_ramp_profiled.kineto.json.gz", preset="sglang"))
    phases = {p["name"]: p for p in fit.config["phases"]}
    assert fit.config["workload"]["graph_buckets"] == [8, 16, 32, 64]
    assert list(phases["verify"]["body_us"]["per_bucket"]) == [8, 16, 32, 64]
    assert not [w for w in fit.warnings if "graph bucket" in w]
    # every fitted line is >= 0 at batch 0: a what-if with prompts runs as fitted
    prompts = {"steps": 60, "warmup_steps": 5,
               "workload": {"arrivals": {"rate_per_s": 300}, "max_batch": 64,
                            "initial_batch": 2, "output_tokens": 20, "prompt_tokens": 400,
                            "graph_buckets": [8, 16, 32, 64]},
               "prefill": {"chunk_tokens": 512, "forward_us": {"base": 150, "per_token": 1.5}}}
    assert simulate(fit.config, prompts).summary["steps_measured"] > 0


# --------------------------------------------------------------------------- sizes
def test_buckets_come_from_the_graphs_when_the_capture_has_no_batch_ranges(tmp_path):
    sim, path = capture(tmp_path, CONFIGS / "dspark_fine.yaml", CASES["dspark_sweep_2.11"][1],
                        batch_ranges=False)
    cap = open_capture(path)
    assert cap.mapping.batch is None  # the preset's batch regex matches nothing here: dropped
    with pytest.raises(SizesError, match=r"step 0 \(ProfilerStep#0\) has no batch .* the "
                                         r"capture ran 4 graph sets: give their sizes as "
                                         r"graph_buckets \(4 of them"):
        cap.sized()
    cap = open_capture(path, {"preset": "sglang", "graph_buckets": BUCKETS})
    sizes = cap.sized()
    want = sim.steps.graph_bucket.to_numpy()
    ran = np.flatnonzero(sizes.batch > 0)
    assert sizes.source == "graphs" and sizes.bucket[ran].tolist() == want[ran].tolist()
    fit = fit_model(cap)
    assert "no batch ranges, so the batch is the bucket" in "\n".join(fit.header)
    # the host's work follows the bucket here, not the real batch it scales with: the step
    # time stays within the bounds, each bucket's too, the forward gap only roughly
    figures = captured(cap.bound)
    sim = simulate(fit.config).summary
    assert accepted(check_rows(figures, sim))
    steps = [r for r in bucket_rows(figures, sim) if r.key.endswith("step_us_mean")]
    assert len(steps) == 4 and all(r.ok for r in steps), steps


def test_batch_errors_name_the_step(tmp_path):
    _, path = capture(tmp_path, CONFIGS / "dspark_fine_bimodal.yaml", {})
    cap = open_capture(path, {"preset": "sglang", "graph_buckets": [8, 16, 32]})
    with pytest.raises(SizesError, match=r"graph_buckets: step \d+ \(ProfilerStep#\d+\)'s "
                                         r"batch \d+ is above the largest graph bucket \(32\)"):
        cap.sized()
    cap = open_capture(path, {"preset": "sglang", "batch": r"^(?:decode bs=|sample)(\d*)$"})
    with pytest.raises(SizesError, match=r"batch: step 0 \(ProfilerStep#0\): 'sample' gives "
                                         r"'', not a whole number"):
        cap.sized()
    with pytest.raises(ConfigError, match="has 2 capture groups; expected exactly one"):
        map_capture(None, {"batch": r"^decode (bs)=(\d+)$"})


def test_a_preset_entry_that_matches_nothing_is_dropped_a_mapping_entry_is_an_error(tmp_path):
    _, path = capture(tmp_path, CONFIGS / "dspark_fine_bimodal.yaml", {})
    m = open_capture(path, preset="sglang").mapping
    assert "^(scheduler\\.)?process_queue$" not in m.cpu  # no such range in this capture
    assert "^(scheduler\\.)?get_next_batch_to_run$" in m.cpu
    _, m, fit = fit_capture(path, preset="vllm")  # none of vLLM's names: all dropped
    assert not m.cpu and not m.phases and m.batch == load_preset("vllm")["batch"]
    cpu = fit.config["cpu"]  # the host time is still there, as the region's residual
    assert cpu["ingest_us"]["base"] > cpu["schedule_us"] == cpu["prepare_us"] == 0
    cap = open_capture(path, {"cpu": {"^no_such_range$": "schedule"}}, preset="sglang")
    with pytest.raises(FitError, match=r"cpu '\^no_such_range\$' matches none"):
        fit_model(cap)


def test_presets_name_the_servers_own_ranges(tmp_path):
    # vLLM's gpu_model_runner ranges: detected, phases from them, a fit within the bounds
    sim, path = capture(tmp_path, CONFIGS / "dspark_fine_bimodal.yaml", {}, names="vllm")
    imp, m, fit = fit_capture(path)
    assert m.origin[0] == "vllm" and [p["name"] for p in fit.config["phases"]] == [
        "draft", "forward", "sample"]
    assert_reproduces(imp, simulate(fit.config), step_rel=0.005, gap_us=5.0)
    with pytest.raises(ConfigError, match=r"--preset: 'sglangx' is not a preset \(sglang, "
                                          r"vllm\)"):
        open_capture(path, preset="sglangx")


# --------------------------------------------------------------------------- the profiler
def test_steps_the_profiler_stalled_are_left_out(tmp_path):
    stalls = {**SHORT, "cpu.ingest_us": {"dist": "empirical", "values": [100] * 15 + [4000]}}
    sim = simulate(CONFIGS / "dspark_fine.yaml", stalls, engine="simpy")
    sp = sim.trace.spans
    label = sim.trace.code("ingest")
    hold = [(float(a), float(b)) for a, b, lab in zip(sp.start_us, sp.end_us, sp.label)
            if lab == label and b - a > 1000]
    assert len(hold) >= 2
    path = write_kineto(sim.trace, tmp_path / "stalls.json.gz",
                        style=Style(names="sglang", overhead=tuple(hold)))
    imp, m, fit = fit_capture(path)
    left = profiler_steps(imp)
    assert len(left) == len(hold) + 1 and left[0] == "the profiler's first step"
    assert fit.config["cpu"]["ingest_us"] == 100.0  # the stalls are not the loop's
    assert any("left out, not the loop's own: a Kineto overhead event in steps" in line
               for line in fit.header)
    # the check leaves them out of both sides: within the bounds, where they would miss
    cap = captured(imp)
    assert cap["steps_measured"] < import_report(imp)[1]["metrics"]["steps_measured"]


def test_unprofiled_step_time_rescales_the_device_time(tmp_path):
    _, path = capture(tmp_path, CONFIGS / "dspark_fine.yaml", {})
    imp, m, fit = fit_capture(path)
    target = 0.96 * simulate(fit.config).summary["step_us_mean"]
    _, _, scaled = fit_capture(path, unprofiled_step_us=target)
    assert simulate(scaled.config).summary["step_us_mean"] == pytest.approx(target, rel=1e-3)
    assert 0.9 < scaled.scale < 1.0
    assert scaled.config == scale_device(fit.config, scaled.scale)
    assert any(f"--unprofiled-step-us {target:g}" in line for line in scaled.header)
    host_bound = {"cpu.schedule_us": 9000}
    _, path = capture(tmp_path, CONFIGS / "dspark_fine.yaml", host_bound, name="h.json.gz")
    with pytest.raises(FitError, match="does not follow its device time"):
        fit_capture(path, unprofiled_step_us=5000.0)


# --------------------------------------------------------------------------- the probe
@pytest.mark.capture
@pytest.mark.parametrize("variant,barrier", [("fine", "fine"), ("coarse", "coarse"),
                                             ("none", "none"), ("fine_host1000", "fine")])
def test_probe_captures_give_their_barrier_from_event_ids(variant, barrier):
    path = ROOT / "tests" / "data" / "probe" / f"probe_{variant}.kineto.json.gz"
    # no mapping: the preset is detected from the ranges; the profiler's cost kept, since the
    # fit is checked against the (profiled) capture itself
    imp, m, fit = fit_capture(path, profiler_cost=False)
    assert m.origin[0] == "sglang"
    assert fit.policy.barrier == barrier and fit.policy.source == "capture"
    if barrier == "fine":
        assert fit.policy.position == "in_replay" and "event59" in fit.policy.evidence
    if barrier == "coarse":
        assert "fresh event each step" in fit.policy.evidence
    rows = check_rows(captured(imp), simulate(fit.config).summary)
    assert accepted(rows), [r for r in rows if r.ok is False]


# --------------------------------------------------------------------------- CLI
def test_cli_fit_writes_the_batches_beside_the_config_and_checks_per_bucket(tmp_path, capsys):
    _, path = capture(tmp_path, CONFIGS / "dspark_fine_bimodal.yaml", {})
    out = tmp_path / "fitted.yaml"
    assert main(["import", str(path), "--fit", "-o", str(out), "--check", str(out),
                 "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "preset sglang (detected from the capture's range names" in text
    assert "per graph bucket" in text and "bucket 64 step µs" in text
    assert "within the bounds" in text and "per bucket: step time, forward gap" in text
    csv = tmp_path / "fitted.batches.csv"
    assert csv.read_text().startswith("step,batch_size\n0,4\n")
    cfg = yaml.safe_load(out.read_text())
    assert cfg["workload"]["batch_sizes_file"] == "fitted.batches.csv"
    assert main(["run", str(out), "--quiet", "--json"]) == 0  # runs as written
    capsys.readouterr()
    # another barrier's capture misses per bucket until asked what-if
    _, coarse = capture(tmp_path, CONFIGS / "dspark_fine_bimodal.yaml",
                        {"policy.barrier": "coarse"}, name="coarse.json.gz")
    assert main(["import", str(coarse), "--check", str(out), "--set", "policy.barrier=coarse",
                 "--no-progress"]) == 0
    assert "within the bounds" in capsys.readouterr().out


def test_the_fit_names_its_graph_buckets_once(tmp_path, monkeypatch):
    """The config's graph buckets (the capture's, without an idle step's batch 0) are taken
    once per fit: every per-bucket table, clamped line, workload and header line uses them."""
    import simwar.fit.from_capture as fc

    _, path = capture(tmp_path, CONFIGS / "dspark_fine.yaml", CASES["dspark_sweep_2.11"][1])
    calls = []
    real = fc.graph_buckets
    monkeypatch.setattr(fc, "graph_buckets", lambda sizes: calls.append(1) or real(sizes))
    _, _, fit = fit_capture(path)
    assert len(calls) == 1 and fit.config["workload"]["graph_buckets"] == BUCKETS
    assert any("graph_buckets [8, 16, 32, 64]" in line for line in fit.header)


def test_unprofiled_step_time_per_bucket_rescales_host_and_device(tmp_path):
    # the profiler slows the host too: per-bucket step times give both factors back
    _, path = capture(tmp_path, CONFIGS / "dspark_fine.yaml", CASES["dspark_sweep_2.11"][1])
    _, _, fit = fit_capture(path)
    truth = simulate(scale_device(fit.config, 0.96, 0.9)).summary["by_bucket"]
    targets = {b: v["step_us_mean"] for b, v in truth.items()}
    _, _, scaled = fit_capture(path, unprofiled_step_us=targets)
    assert scaled.scale == pytest.approx(0.96, abs=0.01)
    assert scaled.host_scale == pytest.approx(0.9, abs=0.01)
    got = simulate(scaled.config).summary["by_bucket"]
    for b, us in targets.items():
        assert got[b]["step_us_mean"] == pytest.approx(us, rel=0.005)
    assert any("every host time x" in line for line in scaled.header)
