"""The fit of ``cpu.receive_us`` from a capture that names each iteration's received requests.

A shortened ``configs/sglang_default_prefill.yaml`` with a known receive cost is simulated and
written as a server's profile with a ``recv reqs=N toks=T`` range around each iteration's
receive work (the mini-server's name, in SGLang's preset); the fit must give the cost back,
take it out of the loop's other host work (``cpu.ingest_us`` as configured, no
``prefill.host_before_us`` holding it) and check within 3 % per shape. The mini-server's
H200 capture with the range (``shapes/run10``) gives its receive out of the prefill's
preparation; a committed capture without the ranges fits as before (``receive`` is the
preset's, dropped where nothing matches).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simwar.api import resolve_sizes, simulate
from simwar.capture.open import open_capture
from simwar.capture.stalls import import_report
from simwar.capture.synthetic import Style, write_kineto
from simwar.config import load_config
from simwar.fit.check import check_fit
from simwar.fit.from_capture import fit_model
from simwar.fit.receive import Received, receive_line

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "sglang_default_prefill.yaml"
RECEIVE = {"per_request": 40.0, "per_prompt_token": 0.16}
#: prompts well inside the 4,096-token chunk: each request is admitted in the iteration that
#: receives it, so the sizes' admissions say which requests each iteration received
SHORT = {"steps": 600, "warmup_steps": 10, "prefill.launches": 8,
         "workload.prompt_tokens": {"dist": "uniform", "low": 100, "high": 1500},
         "cpu.receive_us": RECEIVE}


def _received(over: dict, config: Path = CONFIG) -> tuple:
    """``((step, requests, prompt tokens), ...)`` of each iteration that received requests,
    from the run's admissions, checked against the work the sizes charged there."""
    sz = resolve_sizes(load_config(str(config), over))
    n = np.zeros(len(sz.batch), dtype=int)
    tokens = np.zeros(len(sz.batch), dtype=int)
    for k, p in zip(sz.requests["admit_step"], sz.requests["prompt_tokens"]):
        n[k] += 1
        tokens[k] += p
    np.testing.assert_allclose(sz.received_us, RECEIVE["per_request"] * n
                               + RECEIVE["per_prompt_token"] * tokens)
    return tuple((int(k), int(n[k]), int(tokens[k])) for k in np.flatnonzero(n))


def _fit(tmp: Path, rule: str, ranges: bool):
    over = {**SHORT, "scheduling.rule": rule}
    sim = simulate(str(CONFIG), over, engine="simpy")
    style = Style(names="sglang", batch_ranges=True, copies=("result_copy",),
                  receives=_received(over) if ranges else ())
    path = write_kineto(sim.trace, tmp / f"{rule}.json.gz", style=style)
    cap = open_capture(path)
    return cap, path, fit_model(cap)


@pytest.mark.parametrize("rule", ["sglang", "sglang_mixed"])
def test_the_fit_gives_the_receive_back_and_counts_it_once(rule, tmp_path):
    cap, path, fit = _fit(tmp_path, rule, ranges=True)
    cpu = fit.config["cpu"]
    assert cpu["receive_us"]["per_request"] == pytest.approx(RECEIVE["per_request"], rel=1e-3)
    assert cpu["receive_us"]["per_prompt_token"] == pytest.approx(
        RECEIVE["per_prompt_token"], rel=1e-3)
    # out of the loop's other host work: the configured ingest, no prefill preparation
    assert cpu["ingest_us"] == pytest.approx(100.0, abs=0.5)
    assert "host_before_us" not in fit.config["prefill"]
    assert any(line.startswith("Receive: cpu.receive_us 40 µs a request + 0.16 µs")
               for line in fit.header)
    steps, _ = import_report(cap.bound)
    checked = check_fit(cap, load_config(fit.config), "fitted", steps, path.name)
    assert checked["ok"], checked["text"]
    rows = {r["key"]: r for r in checked["rows"]}
    shapes = [k for k in rows if k.startswith("by_shape.") and k.endswith(".own_us_mean")]
    assert len(shapes) == 2
    for key in shapes:
        assert abs(rows[key]["error"]) <= 0.03, checked["text"]


def test_a_replay_of_decode_steps_says_its_steps_lack_the_receive(tmp_path):
    """Decode-only requests (no prompt) at a light load: the receive per request is given
    back and out of the ingest; the fitted config replays the capture's batches, where no
    request arrives, and the header says how much a step lacks."""
    src = ROOT / "configs" / "dspark_fine.yaml"
    over = {"steps": 400, "warmup_steps": 10, "cpu.receive_us": RECEIVE,
            "workload": {"arrivals": {"rate_per_s": 100}, "max_batch": 64, "initial_batch": 8,
                         "output_tokens": {"dist": "uniform", "low": 16, "high": 64},
                         "graph_buckets": [8, 16, 32, 64]}}
    sim = simulate(str(src), over, engine="simpy")
    path = write_kineto(sim.trace, tmp_path / "decode.json.gz",
                        style=Style(names="sglang", batch_ranges=True, copies=("result_copy",),
                                    receives=_received(over, src)))
    fit = fit_model(open_capture(path))
    cpu = fit.config["cpu"]
    assert cpu["receive_us"] == {"per_request": 40.0, "per_prompt_token": 0.0}
    assert cpu["ingest_us"] == 100.0 and "arrivals" not in fit.config["workload"]
    assert any(line.startswith("  The config replays the capture's batches: no request "
                               "arrives") for line in fit.header)


def test_without_the_ranges_the_prefill_holds_the_receive(tmp_path):
    """The same run without the ranges: no receive, and the steps that receive (the prefill
    steps of their own) put the work in the prefill's preparation, as before the key."""
    _, _, fit = _fit(tmp_path, "sglang", ranges=False)
    assert "receive_us" not in fit.config["cpu"]
    before = fit.config["prefill"]["host_before_us"]
    assert before["per_token"] > 0.1 and not any(line.startswith("Receive:")
                                                 for line in fit.header)


def test_a_committed_capture_without_the_ranges_fits_as_before():
    """The mini-server's H200 capture of run9 (before the range): the preset's ``receive``
    matches nothing and is dropped; no receive, no header line (the fitted config and header
    were compared with the fit before the key, byte for byte, when it was added)."""
    from lab.check import SERVER_MAPPING

    run9 = ROOT / "tests" / "data" / "server" / "shapes" / "run9"
    cap = open_capture(run9 / "shapes_sglang_medium_overlap_profiled.kineto.json.gz",
                       SERVER_MAPPING)
    assert cap.mapping.receive is None
    fit = fit_model(cap)
    assert "receive_us" not in fit.config["cpu"]
    assert not any(line.startswith("Receive:") for line in fit.header)


def test_the_tenth_runs_capture_gives_its_receive_out_of_the_prefills_preparation():
    """The mini-server's first capture with the range (H200, ``shapes/run10``, SGLang's default
    scheduling): a receive per request and per token, taken out of the prefill's preparation
    (the steps that receive are those that prefill: the decode steps', ``cpu.ingest_us``, is
    the same), and ``--check`` within 3 % per shape."""
    from lab.check import SERVER_MAPPING

    path = (ROOT / "tests" / "data" / "server" / "shapes" / "run10"
            / "shapes_sglang_medium_overlap_profiled.kineto.json.gz")
    cap = open_capture(path, SERVER_MAPPING)
    fit = fit_model(cap)
    plain = fit_model(open_capture(path, {**SERVER_MAPPING, "receive": None})).config
    receive = fit.config["cpu"]["receive_us"]
    assert receive["per_request"] > 0 and receive["per_prompt_token"] > 0
    assert "receive_us" not in plain["cpu"]
    assert fit.config["cpu"]["ingest_us"] == plain["cpu"]["ingest_us"]
    before, was = fit.config["prefill"]["host_before_us"], plain["prefill"]["host_before_us"]
    assert before["per_token"] < was["per_token"]
    steps, _ = import_report(cap.bound)
    checked = check_fit(cap, load_config(fit.config), "fitted", steps, path.name)
    assert checked["ok"], checked["text"]
    # the profiler's cost in each range (its own event), back per request as captured
    kept = fit_model(cap, profiler_cost=False).config["cpu"]["receive_us"]
    assert checked["profiler_back"]["cpu.receive_us"] == pytest.approx(
        kept["per_request"] - receive["per_request"], abs=1e-3)
    assert 0 < checked["profiler_back"]["cpu.receive_us"] < 5


def _ranges(rows) -> list[Received]:
    return [Received(i, i, i + 1, n, t, us) for i, (n, t, us) in enumerate(rows)]


def test_the_receive_line_is_least_squares_through_zero_and_never_negative():
    got, how = receive_line(_ranges([(1, 100, 30.0), (2, 100, 50.0), (1, 300, 50.0)]))
    assert got == {"per_request": 20.0, "per_prompt_token": 0.1}
    assert "3 receive ranges, 4 requests, 500 prompt tokens" in how
    # more tokens, less time: per request alone
    got, how = receive_line(_ranges([(1, 100, 30.0), (1, 300, 20.0), (2, 200, 50.0)]))
    assert got["per_prompt_token"] == 0.0 and got["per_request"] > 0
    assert "per_prompt_token < 0" in how
    # tokens not named, or a fixed number a request: per request alone
    for rows in ([(1, -1, 30.0), (2, -1, 62.0)], [(1, 100, 30.0), (2, 200, 62.0)]):
        got, how = receive_line(_ranges(rows))
        assert got == {"per_request": pytest.approx(30.8), "per_prompt_token": 0.0}
        assert "per request alone" in how
    assert receive_line([]) == (None, "")
