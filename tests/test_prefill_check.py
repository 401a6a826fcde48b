"""The prefill check on the mini-server's H200 run: overlap on and off, with prompts.

``lab.prefill_check`` predicts the committed ``prefill_*`` cases (two Poisson loads
replayed request by request, a closed loop of 8; overlap on and off) from the sweep's fit
and the one prefill capture, and compares TPOT, throughput and TTFT (both ways), and the
sign of each on-vs-off difference. This holds the verdicts calibration/README.md reports:
each listed miss must still miss, every other judged figure must meet its target.
"""

from __future__ import annotations

import pytest

from lab.check import DEFAULT_DIR
from lab.prefill_check import FIGURES, evaluate, main, markdown

pytestmark = pytest.mark.skipif(not (DEFAULT_DIR / "prefill_light_overlap_r0.metrics.json.gz")
                                .exists(), reason="the mini-server's prefill run is absent")

#: (case, figure) that miss their target on the committed run (calibration/README.md says why),
#: with the profiler's own host cost subtracted (the default)
MISSES = {("light_overlap", "ttft_forward_us"), ("light_overlap", "ttft_us"),
          ("medium_overlap", "tokens_per_s"), ("medium_overlap", "tpot_us")}
#: (the closed loop's TTFTs, +10.8 to +19.4 % with its requests drawn afresh, are within
#: 4.5 % with the repeat's own: lab.prefill_check.closed_lengths)
#: (medium_overlap's TPOT, -4.9 % with the graph phases a line in the bucket, is -5.1 % with
#: them per bucket: a miss, listed; with the profiler's cost kept, medium_normal's TTFT to
#: the forward's end went from +11.4 % to +9.0 %, within its 10 %, and is no longer listed)
#: (load, figure) whose on-vs-off difference the prediction gets the wrong way round
WRONG_SIGNS = {("light", "ttft_forward_us"), ("medium", "tokens_per_s")}
#: the same with the profiler's cost kept (--keep-profiler-cost: the fit before it was taken
#: out)
MISSES_KEPT = {("light_overlap", "ttft_forward_us"), ("medium_normal", "ttft_us"),
               ("medium_overlap", "ttft_us")}
WRONG_SIGNS_KEPT = {("light", "ttft_forward_us")}


@pytest.fixture(scope="module")
def result():
    return evaluate()


def test_every_prefill_case_is_predicted_with_the_listed_misses_only(result):
    _verdicts(result, MISSES, WRONG_SIGNS)


def test_with_the_profilers_cost_kept_the_old_verdicts_hold():
    _verdicts(evaluate(keep_profiler_cost=True), MISSES_KEPT, WRONG_SIGNS_KEPT)


def _verdicts(result, misses, wrong_signs):
    assert sorted(result["cases"]) == [f"{load}_{loop}" for load in ("closed8", "light", "medium")
                                       for loop in ("normal", "overlap")]
    for name, case in result["cases"].items():
        for figure, row in case["rows"].items():
            if row["ok"] is None:
                continue
            assert row["ok"] == ((name, figure) not in misses), (name, figure, row["error"])
    for load, signs in result["signs"].items():
        for figure in FIGURES:
            s = signs[figure]
            assert s["ok"] == ((load, figure) not in wrong_signs), (load, figure, s)
    # the medium load's second overlapped repeat ran its host 1.6x slower than the sweep's
    assert result["cases"]["medium_overlap"]["judged"] == [True, False]
    assert result["signs"]["medium"]["seeds"] == [200]


def test_what_overlap_changes_is_predicted_where_the_measurement_is_clear(result):
    # the host-bound prefill loop: overlap shortens every step by most of the host's loop
    for load in ("light", "medium", "closed8"):
        s = result["signs"][load]["step_us"]
        assert s["measured"] < -500 and s["predicted"] < -500
    # the closed loop: overlap raises req/s and TTFT to the host, lowers TTFT to the forward
    signs = result["signs"]["closed8"]
    assert signs["requests_per_s"]["predicted"] > 0 and signs["ttft_us"]["predicted"] > 0
    assert signs["ttft_forward_us"]["predicted"] < 0
    text = markdown(result)
    assert "| closed8 | overlap |" in text and "WRONG SIGN" in text


def test_the_command_prints_the_table(capsys):
    assert main([str(DEFAULT_DIR)]) == 0
    assert "TPOT µs meas. / pred. (err)" in capsys.readouterr().out


def test_a_captures_steps_have_one_reader():
    """The step ranges of a capture (``ProfilerStep#k``), read once by start, and the step
    holding a time: the prefill model's and the shapes checker's host ranges (by
    ``lab.shapes_check.net_unpadded``) are placed in their steps by the same reader."""
    import inspect

    from lab import shapes_check
    from lab.prefill_check import step_at, step_marks

    events = [{"cat": "user_annotation", "name": "ProfilerStep#4", "ts": 30.0, "dur": 10.0},
              {"cat": "user_annotation", "name": "ProfilerStep#3", "ts": 10.0, "dur": 20.0},
              {"cat": "kernel", "name": "ProfilerStep#9", "ts": 0.0, "dur": 99.0},
              {"cat": "user_annotation", "name": "scheduler.run_batch", "ts": 12.0, "dur": 1}]
    marks = step_marks(events)
    assert [m["name"] for m in marks] == ["ProfilerStep#3", "ProfilerStep#4"]
    assert [step_at(marks, t) for t in (9.9, 10.0, 29.9, 30.0, 39.9, 40.0)] == \
        [None, 3, 3, 4, 4, None]
    source = inspect.getsource(shapes_check.net_unpadded)
    assert "step_marks(" in source and "ProfilerStep" not in source
