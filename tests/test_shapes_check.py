"""The shapes check on the mini-server's H200 run: SGLang's default scheduling and the mixed mode.

``lab.shapes_check`` fits each mode from its one profiled capture (simwar's fit, with the
prefill and the scheduling rule filled from the capture where the fit gives none), predicts
every committed ``shapes_*`` case as a what-if, and compares TPOT, throughput, TTFT, the sign
of each on-vs-off difference and the recommendations (overlap on or off; mixed chunk or not).
This holds the verdicts calibration/README.md reports, literally: a change of the model that
moves any of them fails here and is reported there.
"""

from __future__ import annotations

import json

import pytest

from lab.shapes_check import DEFAULT_DIR, evaluate, main, trace

# slow: the evaluation fits both 1.5 MB captures (about 4-7 s each on two shared cores; ~15-25 s
# for the module), the one path that holds the table calibration/README.md reports
pytestmark = [pytest.mark.skipif(not (DEFAULT_DIR / "shapes_sglang_light_overlap_r0.metrics"
                                                    ".json.gz").exists(),
                                 reason="the mini-server's shapes run is absent"),
              pytest.mark.slow]

#: (case, figure) within their target on the committed run; every other judged one misses
WITHIN = {("mixed_closed16_normal", "tokens_per_s"), ("mixed_closed16_normal", "tpot_us"),
          ("mixed_closed16_overlap", "tokens_per_s"), ("mixed_closed16_overlap", "tpot_us"),
          ("mixed_light_normal", "tokens_per_s"), ("mixed_light_normal", "ttft_us"),
          ("mixed_light_overlap", "tokens_per_s"), ("mixed_medium_normal", "tokens_per_s"),
          ("mixed_medium_normal", "ttft_us"), ("mixed_medium_overlap", "tokens_per_s"),
          ("sglang_light_normal", "tokens_per_s"), ("sglang_light_normal", "tpot_us"),
          ("sglang_light_normal", "ttft_us"), ("sglang_light_overlap", "tokens_per_s"),
          ("sglang_light_overlap", "tpot_us"), ("sglang_medium_overlap", "tokens_per_s")}
#: (mode_load, figure) whose on-vs-off difference the prediction gets the wrong way round
WRONG_SIGNS = {("mixed_light", "requests_per_s"), ("sglang_light", "requests_per_s"),
               ("sglang_light", "tokens_per_s")}
#: measured and predicted: overlap on or off (mode_load), mixed chunk or not (load_loop)
OVERLAP = {f"{mode}_{load}": ("on", "on") for mode in ("sglang", "mixed")
           for load in ("light", "medium", "closed16")}
MIXED = {"closed16_normal": ("mixed", "mixed"), "closed16_overlap": ("mixed", "mixed"),
         "light_normal": ("separate", "mixed"), "light_overlap": ("separate", "mixed"),
         "medium_normal": ("mixed", "mixed"), "medium_overlap": ("mixed", "mixed")}


@pytest.fixture(scope="module")
def result():
    return evaluate()


def test_every_case_is_predicted_with_the_listed_verdicts(result):
    assert sorted(result["cases"]) == sorted(f"{m}_{load}_{loop}" for m in ("sglang", "mixed")
                                             for load in ("light", "medium", "closed16")
                                             for loop in ("overlap", "normal"))
    judged = set()
    for name, case in result["cases"].items():
        assert case["repeats"] == 2
        for figure, row in case["rows"].items():
            if row["ok"] is None:
                continue
            judged.add((name, figure))
            assert row["ok"] == ((name, figure) in WITHIN), (name, figure, row["error"])
    assert WITHIN <= judged and len(judged) == 48
    wrong = {(key, k) for key, sign in result["signs"].items() for k, v in sign.items()
             if isinstance(v, dict) and not v["ok"]}
    assert wrong == WRONG_SIGNS
    assert {k: (v["measured"], v["predicted"]) for k, v in result["overlap"].items()} == OVERLAP
    assert {k: (v["measured"], v["predicted"]) for k, v in result["mixed"].items()} == MIXED
    assert result["ok"] is False


def test_the_model_says_what_this_checker_filled(result):
    for mode, rule in (("sglang", "sglang"), ("mixed", "sglang_mixed")):
        notes = result["models"][mode]["notes"]
        assert notes["scheduling"] == f"FILLED: rule {rule} (the mode)"
        assert notes["prefill"].startswith("FILLED from ")
        assert result["models"][mode]["buckets"] == [8, 16, 32, 64]
        assert "phases.verify.body_us.per_bucket.32" in notes["extrapolated"]
        assert notes["clamped"] == []  # the decode steps' lines stay >= 0 up to 64
        # the fit's phase table is the decode steps' (the prefill is its own phase, left
        # out with the steps that run it): no per-request prefill in the default phase
        body = next(ph for ph in result["models"][mode]["phases"] if ph["name"] == "forward")
        assert "per_seq" not in body["body_us"]
        assert result["models"][mode]["prefill"]["chunk_tokens"] == 2048


def test_a_poisson_repeat_is_replayed_with_its_own_requests_and_more():
    from lab.check import read_metrics

    m = read_metrics(DEFAULT_DIR / "shapes_sglang_medium_overlap_r0.metrics.json.gz")
    t = trace(m)["trace"]
    n = len(m["requests"]["arrival_us"])
    assert len(t["arrival_us"]) > 2 * n
    assert t["output_tokens"][:n] == m["requests"]["output_tokens"]
    m["case"]["seed"] += 1  # another seed's requests are not the repeat's
    with pytest.raises(ValueError, match="not its seed's"):
        trace(m)


def test_the_command_prints_the_table_and_fails_on_a_miss(result, capsys, monkeypatch):
    from lab import shapes_check

    # the evaluation once (the fixture's): the command's own is the same call
    monkeypatch.setattr(shapes_check, "evaluate", lambda folder, keep_profiler_cost: result)
    assert main([]) == 1
    out = capsys.readouterr().out
    assert "| sglang | closed16 | overlap | x1.52, x1.56 |" in out and "mixed chunk?" in out
    assert main(["--json"]) == 1
    assert json.loads(capsys.readouterr().out)["ok"] is False


def test_the_servers_mapping_reads_old_and_new_captures():
    """``SERVER_MAPPING`` reads a capture written before the shapes (a mixed step was
    ``decode bs=<B>`` with a ``prefill`` range inside) with the preset's batches, and a
    shapes capture's steps with the shapes the server logged."""
    from collections import Counter

    import numpy as np

    from lab.check import DEFAULT_DIR as OLD
    from lab.check import SERVER_MAPPING, read_metrics
    from simwar.capture.open import open_capture

    old = OLD / "prefill_light_overlap_profiled.kineto.json.gz"
    assert np.array_equal(open_capture(old, SERVER_MAPPING).sizes.batch,
                          open_capture(old, preset="sglang").sizes.batch)
    cap = open_capture(DEFAULT_DIR / "shapes_mixed_medium_overlap_profiled.kineto.json.gz",
                       SERVER_MAPPING)
    logged = read_metrics(DEFAULT_DIR / "shapes_mixed_medium_overlap_profiled.metrics.json.gz")
    assert [s.mode for s in cap.shapes] == logged["steps"]["shape"]
    assert Counter(s.mode for s in cap.shapes) == {"decode": 156, "mixed": 42, "prefill": 2}
    assert [s.tokens for s in cap.shapes if s.mode != "decode"] == [
        t for t in logged["steps"]["prefill_tokens"] if t]


def test_the_twins_show_the_profiler_shortening_the_eager_prefills_launches():
    """Un-profiled and profiled runs of the medium load back to back (three processes): in
    every ``sglang`` pair the profiled prefill step launched its eager prefill faster than
    the un-profiled one, while its decode steps launched slower (calibration/README.md)."""
    from lab.shapes_check import twins

    pairs = [t for t in twins(DEFAULT_DIR) if t["mode"] == "sglang"]
    assert [t["run"] for t in pairs] == [1, 2, 3]
    assert [round(t["ratio"]["prefill"]["launch"], 2) for t in pairs] == [0.81, 0.81, 0.53]
    assert [round(t["ratio"]["decode"]["launch"], 2) for t in pairs] == [1.60, 1.82, 1.13]
