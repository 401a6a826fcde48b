"""The mini-server check: fit the sweeping-load capture, predict every load and barrier.

``lab.server_check`` reads the mini-server's folder (``python -m lab.server
OUT --suite fit,loads`` on the GPU machine, committed under ``tests/data/server``): it fits the
profiled sweep with ``--preset sglang`` and no mapping, rescales its device time to the
un-profiled sweep, asks the fit each measured load and barrier (Poisson arrivals) and holds
the predictions to the issue's targets. The H200 folder is not committed yet: its test skips
and says why. The same loop runs on a synthetic folder of the same shape (simulated runs of
``examples/server.yaml`` written as the server's capture and metrics), so the module is
tested whatever data is present.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lab.check import DEFAULT_DIR, FIT_CAPTURE, ServerDataError
from lab.server_check import evaluate, main, markdown
from simwar.api import simulate
from simwar.capture.synthetic import Style, write_kineto

ROOT = Path(__file__).resolve().parents[1]
TRUE = ROOT / "examples" / "server.yaml"
SWEEP = [1, 2, 4, 6, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 56, 48, 40, 32, 28, 24,
         20, 16, 14, 12, 10, 8, 6, 4, 2]
OUTPUT = "16..96"
#: load -> (arrivals per second, requests it starts with), as the server sizes them
LOADS = {"light": (55.0, 5), "medium": (166.0, 20), "saturated": (416.0, 64)}
HOW = ("the mini-server's H200 captures and measurements are not committed yet: run "
       "`python -m lab.server OUT --suite fit,loads` on the GPU machine and commit "
       "OUT's fit_ramp_profiled.kineto.json.gz, fit_ramp.metrics.json and loads_*.metrics.json "
       "under tests/data/server/")


def _metrics(name: str, load: str, barrier: str, seed: int, rate: float, run) -> dict:
    s = run.summary
    return {"format": "simwar.server", "version": 1,
            "case": {"name": name, "steps": run.config.steps, "load": load,
                     "barrier": barrier, "seed": seed, "output_tokens": OUTPUT,
                     "warmup": run.config.warmup_steps},
            "arrivals": {"rate_per_s": rate}, "accept_tokens": run.config.accept.tokens,
            "summary": {"step_us_mean": s["step_us_mean"], "gap_us_mean": s["fwd_gap_us_mean"],
                        "batch_mean": s["batch_size_mean"],
                        "latency_dev_us_mean": s["request_latency_us_mean"]
                        + s["request_queue_us_mean"],
                        "per_bucket": {str(b): {"steps": v["steps"],
                                                "step_us_mean": v["step_us_mean"]}
                                       for b, v in s["by_bucket"].items()},
                        "racy_steps": s["race_steps"]}}


@pytest.fixture(scope="module")
def server_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("server")
    sweep = simulate(TRUE, {"steps": 160, "warmup_steps": 8,
                            "workload.batch_sizes": SWEEP}, engine="simpy")
    write_kineto(sweep.trace, folder / FIT_CAPTURE,
                 style=Style(names="sglang", batch_ranges=True, record_ids=False))
    (folder / "fit_ramp.metrics.json").write_text(json.dumps(
        {"summary": {"step_us_mean": sweep.summary["step_us_mean"],
                     "per_bucket": {str(b): {"steps": v["steps"],
                                             "step_us_mean": v["step_us_mean"]}
                                    for b, v in sweep.summary["by_bucket"].items()}}}))
    for load, (rate, initial) in LOADS.items():
        for barrier in ("fine", "coarse", "none"):
            for r in range(2):
                wl = {"arrivals": {"rate_per_s": rate}, "max_batch": 64,
                      "initial_batch": initial,
                      "output_tokens": {"dist": "uniform", "low": 16, "high": 96},
                      "graph_buckets": [8, 16, 32, 64]}
                run = simulate(TRUE, {"steps": 300, "warmup_steps": 30, "seed": r,
                                      "workload": wl, "policy.barrier": barrier})
                name = f"loads_{load}_{barrier}_r{r}"
                (folder / f"{name}.metrics.json").write_text(json.dumps(
                    _metrics(name, load, barrier, r, rate, run)))
    return folder


def test_synthetic_server_fit_predicts_every_load_and_barrier(server_folder, capsys):
    result = evaluate(server_folder)
    assert result["ok"], markdown(result)
    f = result["fit"]
    assert f["policy"]["barrier"] == "fine" and f["graph_buckets"] == [8, 16, 32, 64]
    assert f["scale"] == pytest.approx(1.0, abs=2e-3)  # a capture without CUPTI's cost
    assert sorted(result["cases"]) == [f"{load}_{b}" for load in sorted(LOADS)
                                       for b in ("coarse", "fine", "none")]
    for name, case in result["cases"].items():
        k = case["compare"]
        assert abs(k["step_us_mean"]["error"]) < 0.02, name
        assert k["races"]["ok"] and (k["races"]["predicted_latent"] > 0) == name.endswith(
            "none")
        assert k["per_bucket"]  # each bucket the load ran, compared
    assert main([str(server_folder)]) == 0
    table = capsys.readouterr().out
    assert table.count("\n| ") == 10 and "| saturated | none |" in table


def test_a_folder_without_the_capture_is_one_line(tmp_path, capsys):
    with pytest.raises(ServerDataError, match="fit_ramp_profiled.kineto.json.gz: not found"):
        evaluate(tmp_path)
    assert main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("simwar: error: ")


#: the H200 run's figures that miss their target (calibration/README.md, "The mini-server"):
#: listed, not loosened; each must still miss (a fix updates this list) and every other figure
#: must meet its target. At the medium load the predicted batch runs 9-20 % higher than the
#: measured repeats at the sweep's host speed (and so the gap and bucket 32 follow); bucket 16
#: of the light fine load is its rare steps above a batch of 8. (medium_coarse's step time,
#: -4.2 % while the capture's waits were unbound, is -3.9 % since the binding of waits gives
#: the fit the measured cross-stream latency: within its 4 %, by a small margin; -3.8 % with
#: the profiler's host cost subtracted, -4.0 % with the graph phases fitted per bucket: the
#: line in the bucket put buckets 16 and 32 about 2 % above their measured means, which offset
#: part of the slower host of that load's judged repeat. The per-bucket tables also brought
#: the medium loads' forward gap closer: medium_fine's from -65 µs to -36 µs, within its
#: max(25 µs, 25 %) of 38 µs, so no longer listed. medium_coarse's bucket 32, -3.8 %, is
#: within since a falling line is no longer fitted, simwar.fit.affine.fit_sized.)
MISSES = {"light_fine": {"bucket 16"},
          "medium_coarse": {"batch_mean", "gap_us_mean"},
          "medium_fine": {"batch_mean"},
          "medium_none": {"batch_mean", "gap_us_mean", "bucket 32"}}


@pytest.mark.slow
@pytest.mark.skipif(not (DEFAULT_DIR / FIT_CAPTURE).exists(), reason=HOW)
def test_h200_server_fit_meets_the_targets_but_the_listed_misses():
    result = evaluate(DEFAULT_DIR)
    assert result["fit"]["policy"]["barrier"] == "fine"
    assert result["fit"]["graph_buckets"] == [8, 16, 32, 64]
    assert len(result["cases"]) == 9
    for name, case in result["cases"].items():
        k = case["compare"]
        missed = {f for f in ("step_us_mean", "batch_mean", "latency_dev_us_mean",
                              "gap_us_mean", "races") if not k[f]["ok"]}
        missed |= {f"bucket {b}" for b, v in k["per_bucket"].items() if v["ok"] is False}
        assert missed == MISSES.get(name, set()), (name, markdown(result))


def test_the_server_mapping_reads_a_mixed_steps_batch_from_its_range():
    """The mini-server's ranges (``lab.server.step_range``): a decode and a mixed step's ``bs``
    is its decode batch, read by ``batch``; a prefill step's is the requests in its chunk, a
    shape's count and no decode batch (the step has none: 0)."""
    import re

    from lab.check import SERVER_MAPPING
    from lab.server import step_range

    rx = re.compile(SERVER_MAPPING["batch"])
    assert rx.search(step_range("decode", 6, 0, 0)).group(1) == "6"
    assert rx.search(step_range("mixed", 5, 2, 1483)).group(1) == "5"
    assert rx.search(step_range("prefill", 0, 3, 2048)) is None
    shape = re.compile(SERVER_MAPPING["shape"])
    assert shape.search(step_range("prefill", 0, 3, 2048)).group("batch") == "3"
    mixed = shape.search(step_range("mixed", 5, 2, 1483))
    assert (mixed.group("batch"), mixed.group("tokens"), mixed.group("context")) == (
        "5", "1483", "2")
    old = shape.search("mixed bs=5 toks=1483")  # a capture from before ``reqs``
    assert (old.group("batch"), old.group("context")) == ("5", None)
