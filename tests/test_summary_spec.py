"""One summary spec (:mod:`simwar.analysis.summary`), two summaries of it: the exact one of the
per-step table (:func:`~simwar.analysis.metrics.summarize`) and the streaming one of
``--summary-only`` (:class:`~simwar.analysis.streaming.StreamingSummary`).

Over varied configs (every algorithm and barrier, warm-ups from 0, noisy durations, every
kind of workload, arrivals with requests) both give the same keys in the same order, and
values within the streaming summary's stated accuracy: means 1e-12 relative (summation
order), quantiles equal while a column has at most 4096 distinct values (always, in runs
this short), everything else equal.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fast import AFFINE, NOISY, assert_close_summaries

from simwar.analysis import metrics, streaming
from simwar.analysis.metrics import columns_from_arrays, summarize
from simwar.analysis.streaming import StreamingSummary
from simwar.analysis.summary import (
    HAZARD_KEYS,
    META_KEYS,
    REQUEST_KEYS,
    SHAPE_KEYS,
    STEP_KEYS,
    WORKLOAD_KEYS,
    measured_mask,
)
from simwar.api import resolve_sizes
from simwar.config import load_config
from simwar.executors import fast

WORKLOADS = {
    "list": {"batch_sizes": [1, 7, 33, 64, 2], "graph_buckets": [8, 32, 64]},
    "dist": {"batch_size": {"dist": "lognormal", "mean": 12, "std": 10}},
    "arrivals": {"arrivals": {"rate_per_s": 700}, "max_batch": 16,
                 "output_tokens": {"dist": "uniform", "low": 2, "high": 20},
                 "initial_batch": 2, "graph_buckets": [4, 16]},
    # prefill steps of their own (scheduling.rule sglang): the shapes' shares
    "shapes": {"arrivals": {"rate_per_s": 1500}, "max_batch": 16,
               "output_tokens": {"dist": "uniform", "low": 2, "high": 20},
               "prompt_tokens": {"dist": "uniform", "low": 10, "high": 900},
               "initial_batch": 2, "graph_buckets": [4, 16]},
}


def test_each_statistic_of_the_spec_is_computed_by_both_summaries():
    stats = {k.stat for k in STEP_KEYS + WORKLOAD_KEYS + SHAPE_KEYS + REQUEST_KEYS}
    assert set(metrics._EXACT) == stats
    assert set(streaming._STREAM) == stats


@settings(max_examples=40, deadline=None)
@given(algorithm=st.sampled_from(["none", "eagle", "dflash", "dspark"]),
       barrier=st.sampled_from(["none", "coarse", "fine", "host_sync"]),
       placement=st.sampled_from(["after_launch", "loop_top"]),
       seq_lens=st.booleans(), noisy=st.booleans(), steps=st.integers(3, 160),
       warmup=st.integers(0, 12), seed=st.integers(0, 3),
       workload=st.sampled_from([None, None, "list", "dist", "arrivals", "shapes"]),
       chunk=st.sampled_from([5, 64, 1 << 15]))
def test_the_two_summaries_agree_on_varied_configs(algorithm, barrier, placement, seq_lens,
                                                   noisy, steps, warmup, seed, workload,
                                                   chunk):
    overrides = {"algorithm": algorithm, "policy.barrier": barrier,
                 "policy.placement": placement, "policy.needs_cpu_seq_lens": seq_lens,
                 "steps": steps, "warmup_steps": min(warmup, steps - 3), "seed": seed,
                 **(NOISY if noisy else {})}
    if workload:
        overrides.update(AFFINE)
        overrides["workload"] = WORKLOADS[workload]
        overrides["accept.tokens"] = {"dist": "empirical", "values": [1, 2, 3]}
    if workload == "shapes":
        overrides["prefill"] = {"chunk_tokens": 256, "forward_us": {"base": 50, "per_token": 1}}
        overrides["scheduling"] = {"rule": "sglang"}
    cfg = load_config(None, overrides)
    sizes = resolve_sizes(cfg)
    exact = fast.run_config(cfg, sizes).summary
    saved = fast.execute.CHUNK
    fast.execute.CHUNK = chunk  # the streaming summary sees the table in chunks of this size
    try:
        streamed = fast.run_config(cfg, sizes, summary_only=True).summary
    finally:
        fast.execute.CHUNK = saved
    assert exact["steps_measured"] == steps - 1 - overrides["warmup_steps"]
    assert set(HAZARD_KEYS) <= set(exact) and set(META_KEYS) <= set(exact)
    assert_close_summaries(streamed, exact)


def test_the_streaming_summary_of_a_table_in_any_chunks_is_the_table_summary():
    """Both summaries fed the same table, with NaN rows and a warm-up: equal keys, close
    values, whatever the chunks."""
    rng = np.random.default_rng(5)
    n = 500
    start = np.cumsum(rng.uniform(50, 150, n))
    end = start + rng.uniform(10, 40, n)
    launch = start - rng.uniform(-20, 60, n)
    launch[rng.integers(0, n, 20)] = np.nan  # steps without a run_batch marker
    blocked = {"result_copy": rng.uniform(0, 5, n), "barrier": np.zeros(n)}
    facts = metrics.StepFacts({"batch_size": 4, "accept_tokens": 2.0})
    cols = columns_from_arrays(np.arange(n), start, end, rng.uniform(0, 10, n),
                               rng.uniform(0, 3, n), blocked, launch, facts)
    meta = {"name": "table", "warmup_steps": 7, "barrier": "fine"}
    full = summarize(cols, meta)
    for cuts in ([n], [1, 2, 3, 250, 499], list(range(0, n, 37))):
        s = StreamingSummary(meta)
        for lo, hi in zip([0, *cuts], [*cuts, n]):
            s.add({k: v[lo:hi] for k, v in cols.items()})
        assert_close_summaries(s.result(), full)
    assert full["steps_measured"] == int(np.count_nonzero(
        measured_mask(cols["step"], cols["step_us"], 7)))
