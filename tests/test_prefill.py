"""The normal loop (``policy.overlap: false``), prompts with chunked prefill, closed loops and
the request metrics (TTFT both ways, TPOT, ITL, goodput under an SLO).

The executors' equality on these runs is in ``tests/test_fast.py`` (variants ``overlap_off``,
``prompts_chunked``, ``closed_loop_off`` and the random configs); here: what they model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import simwar
from simwar.analysis.metrics import SLO_COLUMNS
from simwar.api import build_program, resolve_sizes
from simwar.cli.app import main
from simwar.config import ConfigError, load_config, parse_slo
from simwar.config.schema import SLO_METRICS
from simwar.core.program import Launch, Synchronize, WaitEvent, WaitStream

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "none_fine.yaml"

ONE_REQUEST = {"steps": 40, "warmup_steps": 0, "algorithm": "none", "accept.tokens": 1.0,
               "workload": {"arrivals": {"rate_per_s": 1e-3}, "max_batch": 8,
                            "initial_batch": 1, "output_tokens": 10}}
PREFILL = {"chunk_tokens": 256, "forward_us": {"base": 100, "per_token": 2.0}}


def _sizes(overrides):
    return resolve_sizes(load_config(None, overrides))


@pytest.mark.parametrize("barrier", ["none", "coarse", "fine", "host_sync"])
def test_the_normal_loop_processes_each_result_before_the_next_step(barrier):
    cfg = load_config(None, {"steps": 30, "warmup_steps": 2, "policy.overlap": False,
                             "policy.barrier": barrier, "policy.needs_cpu_seq_lens": True})
    prog = build_program(cfg)
    syncs = [op for op in prog.ops if isinstance(op, Synchronize)]
    # one host sync per step, on its own result, issued in its own iteration; no barrier
    assert [(op.event, op.step, op.site) for op in syncs] == \
        [(f"copy_done[{k}]", k, "result_copy") for k in range(30)]
    assert not [op for op in prog.ops if isinstance(op, WaitEvent)]
    assert not [op for op in prog.ops if isinstance(op, WaitStream)
                and (op.stream, op.other) == ("schedule", "forward")]
    r = simwar.simulate(cfg)
    assert r.summary["launch_ahead_mean"] == 0.0 and r.summary["run_ahead_fraction"] == 0.0
    assert r.summary["races"] == 0 and r.summary["barrier_effective"] == "none"


def test_overlap_hides_the_host_and_its_absence_adds_it_to_every_step():
    on = simwar.simulate(None, {"steps": 60})
    off = simwar.simulate(None, {"steps": 60, "policy.overlap": False})
    s_on, s_off = on.summary, off.summary
    assert s_off["step_us_mean"] > s_on["step_us_mean"]
    # without overlap the GPU waits for the host's whole loop between two forwards
    assert s_off["fwd_gap_us_mean"] > 1000 and s_on["fwd_gap_us_mean"] == 0.0
    assert s_off["step_us_mean"] == pytest.approx(s_off["fwd_us_mean"]
                                                  + s_off["fwd_gap_us_mean"])


@pytest.mark.parametrize("overlap, leaves", [(True, 11), (False, 10)])
def test_a_finished_request_runs_one_extra_step_only_with_overlap(overlap, leaves):
    sz = _sizes({**ONE_REQUEST, "policy.overlap": overlap})
    req = sz.requests
    assert req["finish_step"].tolist()[:2] == [9, leaves + 9]
    # the next request, waited for once the batch is empty, is admitted where it left
    assert req["admit_step"].tolist()[:2] == [0, leaves]
    assert sz.idle[leaves] > 0 and not sz.idle[1:leaves].any()


def test_a_prompt_is_prefilled_in_chunks_then_decodes():
    wl = {**ONE_REQUEST["workload"], "prompt_tokens": 1000}
    cfg = load_config(None, {**ONE_REQUEST, "workload": wl, "prefill": PREFILL})
    sz = resolve_sizes(cfg)
    assert sz.prefill_tokens[:6].tolist() == [256, 256, 256, 232, 0, 0]
    assert sz.prefill_us[:5].tolist() == [612.0, 612.0, 612.0, 564.0, 0.0]
    req = sz.requests
    # the last chunk's step gives the first token; the 9 others from the next step on
    assert req["first_step"][0] == 3 and req["finish_step"][0] == 12
    assert sz.batch[:14].tolist() == [0] * 4 + [1] * 10  # + the overlap loop's extra step
    r = simwar.simulate(cfg, engine="simpy")
    fwd = [op for op in r.program.ops if isinstance(op, Launch) and op.kernel.phase == "prefill"]
    # a step that prefills nothing is a decode step: no prefill launch (three requests)
    assert [op.step for op in fwd] == np.flatnonzero(sz.prefill_tokens).tolist()
    assert len(fwd) == 12 and fwd[0].kernel.duration_us == 612.0
    c = r.columns
    s = r.summary
    assert s["request_ttft_forward_us_mean"] == pytest.approx(c["fwd_end_us"][3])
    assert s["request_ttft_us_mean"] == pytest.approx(c["result_done_us"][3])
    assert s["request_ttft_us_mean"] > s["request_ttft_forward_us_mean"]
    assert s["request_tpot_us_mean"] == pytest.approx((c["fwd_end_us"][12]
                                                       - c["fwd_end_us"][3]) / 9)
    assert s["request_itl_us_mean"] == s["request_tpot_us_mean"]  # one token per step


def test_without_overlap_the_first_result_is_processed_in_its_own_iteration():
    wl = {**ONE_REQUEST["workload"], "prompt_tokens": 500}
    base = {**ONE_REQUEST, "workload": wl, "prefill": PREFILL}
    for overlap in (True, False):
        r = simwar.simulate(None, {**base, "policy.overlap": overlap})
        c = r.columns
        first = 1  # 256 + 244 tokens
        if overlap:  # processed after the next step's launch, in iteration first + 1
            assert c["result_done_us"][first] > c["launch_us"][first + 1]
        else:
            assert c["fwd_end_us"][first] < c["result_done_us"][first] < \
                c["launch_us"][first + 1]


def test_a_closed_loop_keeps_its_concurrency_in_flight():
    cfg = load_config(None, {"steps": 200, "warmup_steps": 5, "algorithm": "none",
                             "accept.tokens": 1.0,
                             "workload": {"closed_loop": {"concurrency": 5},
                                          "output_tokens": {"dist": "uniform", "low": 3,
                                                            "high": 20}}})
    sz = resolve_sizes(cfg)
    req = sz.requests
    assert sz.batch.max() == 5 and sz.batch[0] == 5
    assert np.all(req["admit_us"] == req["arrival_us"])  # never queued: one in, one out
    # each request is replaced in the iteration after the next (overlap: one extra step)
    for step in range(1, 150):
        in_batch = np.sum((req["admit_step"] <= step) & (req["finish_step"] + 2 > step))
        assert in_batch == sz.batch[step]
    r = simwar.simulate(cfg)
    assert r.summary["request_queue_us_mean"] == 0.0


def test_goodput_is_the_rate_of_the_requests_meeting_every_bound():
    wl = {"arrivals": {"rate_per_s": 300}, "max_batch": 32, "initial_batch": 2,
          "output_tokens": {"dist": "uniform", "low": 2, "high": 64},
          "prompt_tokens": {"dist": "lognormal", "mean": 600, "std": 400}}
    base = {"steps": 400, "algorithm": "none", "workload": wl,
            "prefill": {"chunk_tokens": 1024, "forward_us": {"base": 200, "per_token": 1}}}
    loose = simwar.simulate(None, {**base, "slo": {"ttft": 1e9}}).summary
    assert loose["slo_attainment"] == 1.0
    assert loose["goodput_per_s"] == pytest.approx(loose["requests_per_s"])
    s = simwar.simulate(None, {**base, "slo": {"ttft": loose["request_ttft_us_p50"],
                                               "tpot": 1e9}}).summary
    assert 0.4 < s["slo_attainment"] < 0.6
    assert s["goodput_per_s"] == pytest.approx(s["requests_per_s"] * s["slo_attainment"])
    assert "goodput_per_s" not in simwar.simulate(None, base).summary


def test_the_request_table_is_the_summarys_requests_over_time(tmp_path):
    wl = {"arrivals": {"rate_per_s": 200}, "max_batch": 32, "output_tokens": 12,
          "prompt_tokens": {"dist": "uniform", "low": 10, "high": 600}}
    r = simwar.simulate(None, {"steps": 300, "algorithm": "none", "workload": wl,
                               "prefill": PREFILL})
    t = r.requests
    s = r.summary
    assert len(t) == s["requests_completed"]
    assert t.request_ttft_us.mean() == pytest.approx(s["request_ttft_us_mean"])
    assert t.request_tpot_us.mean() == pytest.approx(s["request_tpot_us_mean"])
    assert (t.first_step < t.finish_step).all() and (t.prompt_tokens >= 10).all()
    # the first token's step is the one that prefilled the prompt's last chunk
    pf = np.asarray(r.meta["workload"]["prefill_tokens"])
    assert (pf[t.first_step.to_numpy()] > 0).all()
    out = tmp_path / "w.png"
    assert main(["plot", "--set", "steps=300", "--set", "algorithm=none", "--set",
                 f"workload={json.dumps(wl)}", "--set", f"prefill={json.dumps(PREFILL)}",
                 str(CONFIG), "-o", str(out)]) == 0
    assert out.stat().st_size > 10_000


def test_slo_parsing_and_its_metrics():
    assert parse_slo("ttft=200ms, tpot=30000us,latency=2s") == \
        {"ttft": 200000.0, "tpot": 30000.0, "latency": 2e6}
    assert parse_slo("itl=12") == {"itl": 12000.0}  # a bare number is ms
    for bad in ("ttft", "ttft=-1ms", "p99=1ms", "tpot=fast"):
        with pytest.raises(ConfigError, match=r"^--slo "):
            parse_slo(bad)
    assert SLO_COLUMNS == SLO_METRICS  # analysis keeps its own copy (it imports no config)


@pytest.mark.parametrize("overrides, line", [
    ({"prefill": PREFILL}, "prefill: only used with workload.prompt_tokens"),
    ({"slo": {"ttft": 1000}},
     "slo: only used with requests (workload.arrivals or workload.closed_loop)"),
    ({"workload": {"closed_loop": {"concurrency": 8}, "output_tokens": 4, "max_batch": 4}},
     "max_batch: 4 is below closed_loop.concurrency (8)"),
    ({"workload": {"closed_loop": {"concurrency": 2}}},
     "closed_loop: needs workload.output_tokens"),
])
def test_unused_or_inconsistent_request_keys_are_one_line_errors(overrides, line):
    with pytest.raises(ConfigError, match=line.replace("(", r"\(").replace(")", r"\)") + "$"):
        load_config(None, overrides)
