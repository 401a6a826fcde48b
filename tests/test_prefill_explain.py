"""Prefill explained: the TTFT in parts (queueing, prefill with its chunks, the result's wait),
the decode pauses behind prefill steps (``simwar explain``), and the shapes on the step
timeline (``simwar plot CONFIG``).

Every figure is computed from the per-step table and the request rows, which the SimPy engine
and the fast executor give bit for bit: both are run and must agree.
"""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

import simwar  # noqa: E402
from simwar.analysis.prefill import pause_words, prefill_pauses  # noqa: E402
from simwar.cli.app import main  # noqa: E402
from simwar.plots.workload import regime_steps  # noqa: E402

CONFIG = "configs/sglang_default_prefill.yaml"
SHORT = {"steps": 240, "warmup_steps": 10}
#: one request: a prompt of 1000 tokens prefilled 256 a step (4 chunks), no other request
ONE = {"steps": 30, "warmup_steps": 0, "algorithm": "none", "accept.tokens": 1.0,
       "workload": {"arrivals": {"rate_per_s": 1e-3}, "max_batch": 8, "initial_batch": 1,
                    "output_tokens": 10, "prompt_tokens": 1000},
       "prefill": {"chunk_tokens": 256, "forward_us": {"base": 100, "per_token": 2.0}},
       "scheduling": {"rule": "sglang"}}
PARTS = ("ttft_queue_us", "ttft_prefill_us", "ttft_result_wait_us")


def _runs(overrides: dict):
    return [simwar.simulate(CONFIG, {**SHORT, **overrides}, engine=e) for e in ("simpy", "fast")]


@pytest.mark.parametrize("rule", ["sglang", "sglang_mixed", "vllm"])
@pytest.mark.parametrize("overlap", [True, False])
def test_the_ttft_parts_add_up_exactly_and_the_executors_agree(rule, overlap):
    ref, fast = _runs({"scheduling.rule": rule, "policy.overlap": overlap})
    for r in (ref, fast):
        q = r.requests
        assert len(q) > 20
        total = q.ttft_queue_us + q.ttft_prefill_us + q.ttft_result_wait_us
        assert (total == q.request_ttft_us).all()  # every request, to the last bit
        assert (q[list(PARTS)] >= 0).all().all()
        assert (q.ttft_chunks >= 1).all()  # every request has a prompt here
        assert (q.ttft_chunk_fwd_us > 0).all()
        assert (q.ttft_chunk_fwd_us + q.ttft_other_us == q.ttft_prefill_us).all()
        # a prompt of p tokens needs at least ceil(p / chunk) chunks
        assert (q.ttft_chunks >= np.ceil(q.prompt_tokens / 4096)).all()
        for part in PARTS:
            assert r.summary[f"{part}_mean"] == pytest.approx(q[part].mean(), rel=1e-12)
    assert ref.requests.equals(fast.requests)
    assert {k: v for k, v in ref.summary.items() if k.startswith("ttft_")} == \
        {k: v for k, v in fast.summary.items() if k.startswith("ttft_")}


def test_one_requests_chunks_are_its_four_prefill_steps():
    r = simwar.simulate(None, ONE, engine="simpy")
    row = r.requests.iloc[0]  # the first request (the next arrives once it is done)
    assert (row.prefill_step, row.first_step, row.ttft_chunks) == (0, 3, 4)
    # 3 chunks of 256 tokens and one of 232, each forward 100 + 2 µs a token
    assert row.ttft_chunk_fwd_us == 3 * (100 + 2 * 256) + (100 + 2 * 232)
    assert row.ttft_queue_us == 0.0
    pauses = prefill_pauses(r.columns, r.meta)
    assert pauses["count"] == 0  # nothing decoded before a prefill: nothing paused


@pytest.mark.parametrize("overlap", [True, False])
def test_decode_pauses_behind_prefill_steps_under_sglang(overlap):
    ref, fast = _runs({"policy.overlap": overlap})
    p = prefill_pauses(ref.columns, ref.meta)
    assert p == prefill_pauses(fast.columns, fast.meta)
    assert 0 < p["count"] < p["decode_steps"]
    shape = ref.columns["shape"]
    step = ref.columns["step"]
    start, end = ref.columns["fwd_start_us"], ref.columns["fwd_end_us"]
    tokens = np.asarray(ref.meta["workload"]["prefill_tokens"])
    for row in p["per_step"]:
        i = int(np.searchsorted(step, row["step"]))
        n = row["prefill_steps"]
        assert shape[i] == "decode" and shape[i - n - 1] == "decode"
        assert (shape[i - n:i] == "prefill").all()
        assert row["pause_us"] == start[i] - end[i - n - 1]
        assert row["prefill_tokens"] == tokens[step[i - n]:step[i - 1] + 1].sum() > 0
        assert row["requests"] >= 1 and row["paused"] >= 1
    assert p["total_us"] == pytest.approx(sum(r["pause_us"] for r in p["per_step"]))
    assert pause_words(p["per_step"][0]).startswith("decode paused ")


def test_no_decode_pause_under_sglang_mixed():
    ref, fast = _runs({"scheduling.rule": "sglang_mixed"})
    assert prefill_pauses(ref.columns, ref.meta) is None
    assert prefill_pauses(fast.columns, fast.meta) is None


def test_explain_prints_the_pauses_and_the_ttft_parts(capsys):
    assert main(["explain", CONFIG, "--set", "steps=200", "--steps", "60:120"]) == 0
    text = capsys.readouterr().out
    assert "decode paused       after a run of prefill steps in" in text
    assert "    step " in text and "decode paused" in text.split("    step ", 1)[1]
    assert "TTFT" in text and "queueing" in text and "result wait" in text
    assert main(["explain", CONFIG, "--set", "steps=200", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["prefill_pauses"]["count"] > 0 and "per_step" not in d["prefill_pauses"]
    t = d["ttft"]
    assert t["ttft_queue_us"] + t["ttft_prefill_us"] + t["ttft_result_wait_us"] == \
        pytest.approx(t["request_ttft_us"], rel=1e-12)
    assert main(["explain", CONFIG, "--set", "steps=200", "--set",
                 "scheduling.rule=sglang_mixed"]) == 0
    text = capsys.readouterr().out
    assert "decode paused" not in text and "TTFT" in text


def test_the_step_timeline_shades_the_shapes():
    r = simwar.simulate(CONFIG, SHORT, engine="fast")
    fig = Figure()
    ax = regime_steps(r, ax=fig.subplots(), steps=(20, 90))
    shaded = [p.get_gid() for p in ax.patches if str(p.get_gid()).startswith("shape:")]
    df = r.steps
    want = df[(df.step >= 20) & (df.step <= 90) & (df["shape"] == "prefill")].step
    assert sorted(shaded) == sorted(f"shape:prefill:{k}" for k in want) and shaded
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("prefill step") for t in labels)
    fig.canvas.draw() if hasattr(fig.canvas, "draw") else None
    # the mixed rule: a band per mixed step (a step that prefills), none for its decode steps
    mixed = simwar.simulate(CONFIG, {**SHORT, "scheduling.rule": "sglang_mixed"}, engine="fast")
    ax = regime_steps(mixed, ax=Figure().subplots(), steps=(20, 90))
    shaded = [p.get_gid() for p in ax.patches if str(p.get_gid()).startswith("shape:")]
    df = mixed.steps
    want = df[(df.step >= 20) & (df.step <= 90) & (df["shape"] == "mixed")].step
    assert sorted(shaded) == sorted(f"shape:mixed:{k}" for k in want) and shaded
    assert (df["shape"] == "decode").any()


def test_the_step_timeline_bands_idle_steps():
    """A run with DP-attention idle steps (``scheduling.idle``): each idle step gets its band,
    as the prefill steps do, and the legend names it."""
    r = simwar.simulate(CONFIG, {**SHORT, "workload.arrivals": {"rate_per_s": 20},
                                 "workload.initial_batch": 0,
                                 "scheduling.idle": {"forward_us": 300, "host_us": 20}},
                        engine="fast")
    ax = regime_steps(r, ax=Figure().subplots(), steps=(20, 200))
    df = r.steps
    idle = [f"shape:idle:{k}" for k in df[(df.step >= 20) & (df.step <= 200)
                                          & (df["shape"] == "idle")].step]
    shaded = [p.get_gid() for p in ax.patches if str(p.get_gid()).startswith("shape:idle:")]
    assert idle and sorted(shaded) == sorted(idle)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any(t.startswith("idle step") for t in labels)


def test_simwar_plot_draws_a_config_with_shapes(tmp_path):
    out = tmp_path / "w.png"
    assert main(["plot", CONFIG, "--set", "steps=150", "-o", str(out)]) == 0
    assert out.stat().st_size > 0


def test_the_summary_only_run_gives_the_same_ttft_parts():
    full = simwar.simulate(CONFIG, SHORT, engine="fast")
    only = simwar.simulate(CONFIG, SHORT, engine="fast", summary_only=True)
    keys = [f"{p}_mean" for p in PARTS]
    assert [only.summary[k] for k in keys] == [full.summary[k] for k in keys]


def test_a_saved_trace_is_explained_as_its_config(tmp_path, capsys):
    saved = tmp_path / "run.json.gz"
    simwar.simulate(CONFIG, {"steps": 160}, engine="simpy").trace.save(saved)
    assert main(["explain", CONFIG, "--set", "steps=160", "--steps", "40:120", "--json"]) == 0
    from_config = json.loads(capsys.readouterr().out)
    assert main(["explain", str(saved), "--steps", "40:120", "--json"]) == 0
    from_trace = json.loads(capsys.readouterr().out)
    assert from_trace["prefill_pauses"] == from_config["prefill_pauses"]
    assert from_trace["prefill_pauses"]["per_step"]
    assert from_trace["ttft"] == from_config["ttft"]


def test_a_requests_chunks_are_the_steps_that_prefilled_its_tokens():
    """A bound of one prefill step in a row: a decode step comes between two chunks of a long
    prompt, and is no chunk of it."""
    over = {**SHORT, "scheduling.max_consecutive_prefill": 1, "prefill.chunk_tokens": 1024}
    ref, fast = _runs(over)
    assert ref.requests.equals(fast.requests)
    q = ref.requests
    tokens = np.asarray(ref.meta["workload"]["prefill_tokens"])
    shape = np.asarray(ref.meta["workload"]["shape"])
    gaps = 0
    for row in q.itertuples():
        took = tokens[row.prefill_step:row.first_step + 1]
        between = shape[row.prefill_step:row.first_step + 1]
        assert row.ttft_chunks == np.count_nonzero(took) == np.count_nonzero(between == "prefill")
        assert row.ttft_chunks >= np.ceil(row.prompt_tokens / 1024)
        gaps += int(np.count_nonzero(between == "decode"))
    assert gaps  # some request's chunks had a decode step between them
