"""The GPU mini-server (lab.server): its scheduler without torch, its loop as a dry run.

The server runs on the GPU machine (torch and the standard library). Here the request
scheduler's rules (admission, the overlap loop's finish rule, chunked prefill, slot reuse),
the race check's bookkeeping, the load and host-work arithmetic and the case selection are
checked as plain Python; the whole loop runs as a dry run on a CPU torch (tiny shapes, no
streams, graphs as plain calls) for every suite's cases, and its files are read back. A
``gpu`` test runs the smoke suite on a real device.
"""

from __future__ import annotations

import ast
import gzip
import json
import math
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lab.server_cases import Case, Loads, select_cases, sized_for, suite_cases
from lab.server_requests import (
    POLICIES,
    Arrivals,
    Dist,
    HostWork,
    Ramp,
    Scheduler,
    StepLog,
    bucket_of,
    mean_decode_steps,
    overtaken,
    rate_for,
    receive_range,
    summarize,
)

ROOT = Path(__file__).resolve().parents[1]
MODULES = ("server", "server_cases", "server_model", "server_requests")
BUCKETS = (8, 16, 32, 64)


def _scheduler(arrivals, **kw):
    args = dict(max_batch=64, accept_tokens=2.0, buckets=BUCKETS, rows=66, kv_slots=67585,
                max_context=1024)
    args.update(kw)
    return Scheduler(arrivals, **args)


def _drive(sched, steps, overlap=True, dt=0.001):
    """The loop's order of scheduler calls: schedule(k), then process(k-1) (overlap) or
    process(k) (no overlap) and its finishes streamed, at host time k × dt."""
    plans = []
    for k in range(steps + 1):
        now = k * dt
        if k < steps:
            sched.recv(now)
            plans.append(sched.schedule(k, now, stamp=k + 1))
            if not overlap:
                sched.stream(sched.process(plans[k], now), now)
        if overlap and k > 0:
            sched.stream(sched.process(plans[k - 1], now), now)
    return plans


# --------------------------------------------------------------------------- the scheduler
@pytest.mark.parametrize("overlap", [True, False])
def test_a_request_finished_by_step_k_leaves_before_batch_k_plus_2(overlap):
    arr = Arrivals(seed=3, output=Dist(2, 20), rate=3000.0, initial=10)
    sched = _scheduler(arr, max_batch=16)
    plans = _drive(sched, 120, overlap)
    batches = [{r.rid for r in p.decode} for p in plans]
    finished = [r for r in arr.made if 0 <= r.finish_step < 118]
    assert len(finished) > 30
    lag = 1 if overlap else 0
    for r in finished:
        f = r.finish_step
        # decode-only: admitted at a, it decodes from a, and ceil(out / accept) steps finish it
        assert f == r.admit_step + math.ceil(r.output_tokens / 2.0) - 1
        assert all(r.rid in batches[k] for k in range(r.admit_step, f + 1 + lag))
        assert r.rid not in batches[f + 1 + lag]
    # the independent rule: batch k holds every admitted request not finished by k-1-lag
    for k, batch in enumerate(batches):
        expect = {r.rid for r in arr.made if 0 <= r.admit_step <= k
                  and not (0 <= r.finish_step <= k - 1 - lag)}
        assert batch == expect
        assert plans[k].bucket == bucket_of(len(batch), BUCKETS)
        assert len(batch) <= 16


def test_admission_waits_for_room_and_slots_are_reused():
    arr = Arrivals(seed=1, output=Dist(4, 4), concurrency=6, context=Dist(10, 10))
    sched = _scheduler(arr, max_batch=4, rows=6, kv_slots=200)
    plans = _drive(sched, 12)
    assert [len(p.decode) for p in plans[:3]] == [4, 4, 4]  # two wait for room
    first, later = arr.made[0], [r for r in arr.made if r.admit_step > 0]
    assert first.finish_step == 1 and first.row >= 0
    # its row and slots went back to the FIFO free lists and were handed out again
    reused_rows = {r.row for r in later}
    assert first.row in reused_rows or len(reused_rows) == 6
    slots = [s for r in arr.made if r.admit_step >= 0 for s in r.slots]
    assert 0 not in slots  # slot 0 is the padding slot
    # every write of a step is (row, position, slot) of a request in it, or a marker stamp
    for p in plans:
        marks = [(r, v) for r, c, v in zip(p.w_rows, p.w_cols, p.w_vals) if c == 1024]
        assert sorted(marks) == sorted((r.row, p.stamp) for r in p.decode)


def test_closed_loop_sends_a_request_when_one_finishes():
    arr = Arrivals(seed=2, output=Dist(3, 9), concurrency=5)
    sched = _scheduler(arr)
    _drive(sched, 40)
    done = [r for r in arr.made if r.finish_step >= 0]
    assert len(arr.made) == 5 + len(done)
    for r in arr.made[5:]:
        assert any(d.finish_time == r.arrival for d in done)


def test_arrivals_are_seeded_and_the_ramp_thins_a_poisson_process():
    a = Arrivals(seed=9, output=Dist(16, 128), rate=500.0)
    b = Arrivals(seed=9, output=Dist(16, 128), rate=500.0)
    ra, rb = a.due(1.0), b.due(1.0)
    assert [(r.arrival, r.output_tokens, r.context_tokens) for r in ra] == [
        (r.arrival, r.output_tokens, r.context_tokens) for r in rb]
    assert 430 < len(ra) < 570 and all(16 <= r.output_tokens <= 128 for r in ra)
    ramp = Ramp(0.0, 1000.0, 1.0, rise=0.5)
    assert ramp.rate(0.25) == 500.0 and ramp.rate(0.5) == 1000.0 and ramp.rate(2.0) == 0.0
    c = Arrivals(seed=9, output=Dist(16, 16), ramp=ramp).due(1.0)
    assert 400 < len(c) < 600
    first, second = sum(r.arrival < 0.25 for r in c), sum(0.25 <= r.arrival < 0.5 for r in c)
    assert first < second  # the rate rises
    with pytest.raises(ValueError, match="exactly one"):
        Arrivals(seed=0, output=Dist(1, 1), rate=1.0, concurrency=2)


def test_prefill_chunks_take_prompts_first_come_first_served():
    arr = Arrivals(seed=0, output=Dist(5, 5), prompt=Dist(600, 600), concurrency=1)
    sched = _scheduler(arr, chunk_tokens=256)
    plans = _drive(sched, 6)
    r = arr.made[0]
    assert [[(x.rid, s, n) for x, s, n in p.prefill] for p in plans[:4]] == [
        [(0, 0, 256)], [(0, 256, 256)], [(0, 512, 88)], []]
    assert r.prefill_done_step == 2 == math.ceil(600 / 256) - 1
    assert r.first_token_step == 2 and r.decode_from == 3
    assert [len(p.decode) for p in plans[:5]] == [0, 0, 0, 1, 1]
    # 5 output tokens: the first from the prefill, 4 more in ceil(4 / 2) = 2 decode steps
    assert r.finish_step == 4


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("seed", range(5))
def test_prefill_finishes_at_the_chunk_that_holds_its_last_prompt_token(seed, policy):
    rng = random.Random(seed)
    prompts = [rng.randint(1, 700) for _ in range(6)]
    chunk = rng.choice([64, 256, 300])
    arr = Arrivals(seed=seed, output=Dist(500, 500), prompt=Dist(1, 1), concurrency=6)
    for r, p in zip(arr.made, prompts):
        r.prompt_tokens = p
    sched = _scheduler(arr, chunk_tokens=chunk, max_prefill_requests=8, policy=policy)
    plans = _drive(sched, sum(prompts) // (chunk - 6) + 3)
    if policy == "sglang":  # the prompts before it and its own share the chunks in order
        want = [math.ceil(sum(prompts[:i + 1]) / chunk) - 1 for i in range(6)]
    else:  # the same, each step's budget less one token per request decoding in it
        want, left, k = [], list(prompts), 0
        while len(want) < 6:
            budget = chunk - len(want)  # none finishes: each decodes after its prefill step
            for i in range(len(want), 6):
                n = min(left[i], budget)
                left[i], budget = left[i] - n, budget - n
                if left[i]:
                    break
            want += [k] * sum(1 for i in range(len(want), 6) if not left[i])
            k += 1
    assert [r.prefill_done_step for r in arr.made[:6]] == want
    for p in plans:
        assert p.prefill_tokens() + (len(p.decode) if policy == "mixed" else 0) <= chunk


def test_sglang_policy_runs_prefill_steps_of_their_own_and_carries_a_long_prompt():
    """SGLang's default: while prompt tokens wait, a prefill step where every decoding
    request pauses; a prompt longer than the budget is carried over (first in the next
    step) and decodes only after its last chunk; admission is the prefill's."""
    arr = Arrivals(seed=0, output=Dist(9, 9), prompt=Dist(1, 1), concurrency=3)
    for r, p in zip(arr.made, (100, 600, 50)):
        r.prompt_tokens = p
    sched = _scheduler(arr, chunk_tokens=256, policy="sglang")
    plans = _drive(sched, 12)
    assert [[(x.rid, s, n) for x, s, n in p.prefill] for p in plans[:5]] == [
        [(0, 0, 100), (1, 0, 156)], [(1, 156, 256)], [(1, 412, 188), (2, 0, 50)], [], []]
    assert [p.shape for p in plans[:4]] == ["prefill"] * 3 + ["decode"]
    assert [len(p.decode) for p in plans[:4]] == [0, 0, 0, 3]
    # request 0 finished its prompt at step 0: it pauses in steps 1 and 2
    assert [p.paused for p in plans[:4]] == [0, 1, 1, 0]
    r0, r1, r2 = arr.made[:3]
    assert (r0.admit_step, r1.admit_step, r2.admit_step) == (0, 0, 2)  # in its chunk
    assert (r1.prefill_done_step, r1.first_token_step, r1.decode_from) == (2, 2, 3)
    # only the chunk's slots are written: the carried request's second chunk at 156..411
    assert plans[1].w_cols == list(range(156, 412)) and plans[1].w_rows == [r1.row] * 256
    assert len(r1.slots) == 600 + sum(1 for p in plans if r1 in p.decode)
    # 9 tokens: the first from the prefill, 8 more in 4 decode steps from step 3
    assert r1.finish_step == 6 and r0.finish_step == 6


def test_mixed_policy_admits_as_sglang_and_mixes_the_prefill_batch_into_the_decode_step():
    """SGLang's mixed chunk builds the prefill batch as its default mode does
    (``PrefillAdder``: a request admitted with its first chunk, only the chunk's slots
    written, a long prompt carried over first in the next step), its budget less one token
    per decoding request (``mixed_with_decode_tokens``), and mixes it into the running
    batch; with nothing decoding, the step is a prefill step of its own."""
    arr = Arrivals(seed=0, output=Dist(9, 9), prompt=Dist(1, 1), concurrency=3)
    for r, p in zip(arr.made, (100, 600, 50)):
        r.prompt_tokens = p
    sched = _scheduler(arr, chunk_tokens=256)
    plans = _drive(sched, 12)
    # steps 1 and 2: request 0 decodes, so 255 of the 256 tokens are the chunk's
    assert [[(x.rid, s, n) for x, s, n in p.prefill] for p in plans[:4]] == [
        [(0, 0, 100), (1, 0, 156)], [(1, 156, 255)], [(1, 411, 189), (2, 0, 50)], []]
    r0, r1, r2 = arr.made[:3]
    assert (r0.admit_step, r1.admit_step, r2.admit_step) == (0, 0, 2)  # with its chunk
    assert [p.shape for p in plans[:4]] == ["prefill", "mixed", "mixed", "decode"]
    assert [[x.rid for x in p.decode] for p in plans[:4]] == [[], [0], [0], [0, 1, 2]]
    assert {p.paused for p in plans} == {0}
    # step 0 writes the two chunks' slots alone: request 1's first 156, not its 600
    assert sorted(zip(plans[0].w_rows, plans[0].w_cols)) == sorted(
        [(r0.row, c) for c in range(100)] + [(r1.row, c) for c in range(156)])
    # step 1: request 0's new decode slot and marker, and the carried chunk's 256 slots
    chunk = [(r, c) for r, c in zip(plans[1].w_rows, plans[1].w_cols) if r == r1.row]
    assert [c for _, c in chunk] == list(range(156, 411))
    assert (r1.prefill_done_step, r1.first_token_step, r1.decode_from) == (2, 2, 3)


@pytest.mark.parametrize("policy", POLICIES)
def test_the_decodes_take_their_tokens_of_the_budget_only_in_the_mixed_mode(policy):
    """SGLang's ``get_new_batch_prefill`` gives the ``PrefillAdder`` ``running_bs`` decode
    tokens under ``--enable-mixed-chunk`` (0 otherwise): a mixed step's chunk is the budget
    less the decoding requests, none when they take it all; a prefill step of its own (the
    ``sglang`` policy) pauses them and has the whole budget."""
    arr = Arrivals(seed=0, output=Dist(50, 50), prompt=Dist(1, 1), concurrency=6)
    for r, p in zip(arr.made, (1, 1, 1, 1, 1, 40)):
        r.prompt_tokens = p
    sched = _scheduler(arr, chunk_tokens=7, max_prefill_requests=8, policy=policy)
    plans = _drive(sched, 12)
    chunks = [[(x.rid, s, n) for x, s, n in p.prefill] for p in plans[:4]]
    if policy == "sglang":
        assert chunks == [[(i, 0, 1) for i in range(5)] + [(5, 0, 2)], [(5, 2, 7)],
                          [(5, 9, 7)], [(5, 16, 7)]]
        assert [p.paused for p in plans[:4]] == [0, 5, 5, 5]
    else:  # five decode from step 1 on: 7 - 5 = 2 tokens a step for the carried prompt
        assert chunks == [[(i, 0, 1) for i in range(5)] + [(5, 0, 2)], [(5, 2, 2)],
                          [(5, 4, 2)], [(5, 6, 2)]]
        assert [len(p.decode) for p in plans[:4]] == [0, 5, 5, 5]
        assert [p.shape for p in plans[:2]] == ["prefill", "mixed"]
        # the carried prompt's slots are written two by two, after its first chunk's
        assert [c for r, c in zip(plans[1].w_rows, plans[1].w_cols)
                if r == arr.made[5].row] == [2, 3]
    # with the decodes taking the whole budget, a mixed step has no chunk
    arr = Arrivals(seed=0, output=Dist(50, 50), prompt=Dist(1, 1), concurrency=9)
    for r, p in zip(arr.made, (1,) * 8 + (40,)):
        r.prompt_tokens = p
    plans = _drive(_scheduler(arr, chunk_tokens=8, max_prefill_requests=8, policy=policy), 4)
    assert [p.prefill_tokens() for p in plans[:3]] == (
        [8, 8, 8] if policy == "sglang" else [8, 0, 0])
    assert arr.made[8].admit_step == (1 if policy == "sglang" else -1)


def test_sglang_policy_admits_no_prompt_in_a_decode_step_and_mixed_never_pauses():
    arr = Arrivals(seed=1, output=Dist(4, 12), prompt=Dist(16, 300), concurrency=5)
    sched = _scheduler(arr, chunk_tokens=128, policy="sglang")
    for p in _drive(sched, 60):
        assert p.shape in ("prefill", "decode")
        assert not (p.shape == "decode" and any(r.prompt_tokens for r in p.admitted))
        assert p.prefill_tokens() <= 128
    arr = Arrivals(seed=1, output=Dist(4, 12), prompt=Dist(16, 300), concurrency=5)
    plans = _drive(_scheduler(arr, chunk_tokens=128), 60)
    assert {p.paused for p in plans} == {0} and "mixed" in {p.shape for p in plans}
    with pytest.raises(ValueError, match="policy"):
        _scheduler(arr, policy="vllm")


def test_bucket_of():
    assert [bucket_of(b, BUCKETS) for b in (0, 1, 8, 9, 33, 64)] == [0, 8, 8, 16, 64, 64]
    with pytest.raises(ValueError):
        bucket_of(65, BUCKETS)


def test_dist_parse():
    assert Dist.parse("64..512") == Dist(64, 512) and Dist.parse("7") == Dist(7, 7)
    assert str(Dist(3, 3)) == "3" and Dist(16, 128).mean() == 72
    for bad in ("9..3", "-1", "a..b", ""):
        with pytest.raises(ValueError, match="LO..HI"):
            Dist.parse(bad)


# --------------------------------------------------------------------------- race check
def test_the_race_check_counts_reads_that_saw_a_later_stamp():
    assert not overtaken([5, 5, 5], 5)
    assert overtaken([5, 6, 5], 5)  # the next step's write overtook the read
    assert not overtaken([4], 5) and not overtaken([], 5)
    log = StepLog(6)
    log.cols["racy_verify"][1] = 1  # in the warm-up: counted in racy_steps_all only
    log.cols["racy_verify"][3] = log.cols["racy_draft"][3] = 1
    log.cols["racy_draft"][4] = 1
    log.cols["t_begin_us"] = [0.0, 10, 20, 30, 40, 50]
    sched = _scheduler(Arrivals(seed=0, output=Dist(1, 1), concurrency=1))
    s = summarize(log, sched, timing=False, warmup=2)
    assert (s["racy_steps_all"], s["racy_steps"]) == (3, 2)
    assert (s["racy_draft_steps"], s["racy_verify_steps"]) == (2, 2)
    assert s["steps_measured"] == 3 and s["iter_us_mean"] == 10.0


def test_the_barriers_issue_different_calls():
    from lab.server import barrier_calls

    assert barrier_calls("fine", True) == (("wait_event", "read_done"),)
    assert barrier_calls("planted", True) == (("wait_event", "early_done"),)
    assert barrier_calls("coarse", True) == (("wait_stream", "forward"),)
    assert barrier_calls("none", True) == ()
    for b in ("fine", "planted", "coarse"):  # nothing published: coarse
        assert barrier_calls(b, False) == (("wait_stream", "forward"),)
    assert barrier_calls("none", False) == ()


# --------------------------------------------------------------------------- arithmetic
def test_load_and_host_arithmetic():
    assert mean_decode_steps(Dist(4, 6), 2.0, False) == pytest.approx(8 / 3)  # 2, 3, 3 steps
    assert mean_decode_steps(Dist(5, 5), 2.0, True) == 2.0  # 4 tokens after the first
    assert rate_for(10, 1000.0, 40.0) == pytest.approx(250.0)  # 10 / (40 × 1 ms)
    loads = Loads({"5": 1000.0, "20": 2000.0, "64": 2500.0, "prefill_6": 3000.0,
                   "prefill_20": 4000.0}, 2.0, Dist(16, 128))
    steps = mean_decode_steps(Dist(16, 128), 2.0, False) + 1.5
    assert loads.rate("light") == pytest.approx(5 / (steps * 1e-3))
    assert loads.rate("saturated") == pytest.approx(1.15 * 64 / (steps * 2.5e-3))
    ramp = loads.ramp(200)
    assert ramp.duration_s == pytest.approx(0.4) and ramp.peak > loads.rate("medium")
    host, warn = HostWork.fit({5: 400.0, 64: 600.0}, {8: 1000.0, 64: 3000.0})
    assert warn == ""
    total5 = host.schedule_us(5) + host.process_us(5) + 400.0
    total64 = host.schedule_us(64) + host.process_us(64) + 600.0
    assert total5 == pytest.approx(1300.0) and total64 == pytest.approx(2100.0)
    capped, warn = HostWork.fit({5: 400.0, 64: 900.0}, {8: 1000.0, 64: 1500.0})
    assert capped.schedule_per_req_us == 0 and "capped" in warn
    _, warn = HostWork.fit({5: 400.0, 64: 3000.0}, {8: 1000.0, 64: 2000.0})
    assert "host-bound" in warn
    assert host.scaled(0.0).schedule_us(64) == 0.0


def test_case_selection():
    class Args:
        suite, cases, dry_run, dry_steps, name = "races,smoke", None, True, 8, None

    for k in ("steps", "load", "rate", "concurrency", "barrier", "seed", "profiled",
              "hidden_sync", "overlap", "prompt_tokens", "chunk_tokens", "output_tokens",
              "eager", "csan", "host_scale", "schedule"):
        setattr(Args, k, None)
    cases = select_cases(Args)
    assert [c.csan for c in cases] == [False] * 7 + [True] * 4  # sanitized cases last
    assert all(c.steps <= 8 and c.warmup_steps() <= 2 for c in cases)
    Args.barrier = "none"
    assert {c.barrier for c in select_cases(Args)} == {"none"}
    Args.suite, Args.dry_run, Args.barrier, Args.concurrency = None, False, None, 8
    (one,) = select_cases(Args)
    assert (one.name, one.load, one.concurrency, one.steps) == ("custom", "closed", 8, 200)
    with pytest.raises(ValueError, match="needs --eager"):
        Case("x", 10, csan=True)
    with pytest.raises(ValueError, match="LO..HI"):
        Case("x", 10, prompt_tokens="9..1")
    with pytest.raises(ValueError, match="not a suite"):
        suite_cases("nope")
    with pytest.raises(ValueError, match="needs prompts"):
        Case("x", 10, schedule="sglang")
    with pytest.raises(ValueError, match="schedule"):
        Case("x", 10, schedule="vllm", prompt_tokens="8")
    names = [c.name for s in ("fit", "loads", "races", "hostsync", "prefill", "shapes", "smoke")
             for c in suite_cases(s)]
    assert len(names) == len(set(names)) == 54 + 38
    shapes = suite_cases("shapes")
    assert {c.schedule for c in shapes} == {"sglang", "mixed"}
    assert [c.name for c in shapes if c.profiled] == ["shapes_sglang_medium_overlap_profiled",
                                                      "shapes_mixed_medium_overlap_profiled"]
    # three repeats per case, interleaved: round r holds repeat r of all 12 cases, each
    # round's order rotated, and no two repeats of a case sit next to each other's rounds'
    timed = [c for c in shapes if not c.profiled]
    assert [c.seed for c in timed] == [300] * 12 + [301] * 12 + [302] * 12
    case = [c.name.rsplit("_r", 1)[0] for c in timed]
    assert len(set(case)) == 12 and all(case.count(n) == 3 for n in set(case))
    assert len({tuple(case[i:i + 12]) for i in (0, 12, 24)}) == 3
    for n in set(case):
        at = [i for i, x in enumerate(case) if x == n]
        assert min(b - a for a, b in zip(at, at[1:])) >= 8
    assert shapes.index(next(c for c in shapes if c.profiled)) == 24  # mid-suite
    # the pools grow to the longest prompt, the chunk to the budget
    assert sized_for(shapes, 2.0, 1024, 1024) == (4224, 2048)
    assert sized_for(suite_cases("prefill"), 2.0, 1024, 1024) == (1024, 1024)
    # the profiler's effect by loop: each mode's medium load profiled in both loops, each
    # between timed twins of its own loop
    twins = suite_cases("shapes_normal")
    assert [c.name for c in twins if c.profiled] == [
        f"shapes_{m}_medium_{loop}_profiled" for m in ("sglang", "mixed")
        for loop in ("normal", "overlap")]
    for i, c in enumerate(twins):
        if c.profiled:
            before, after = twins[i - 1], twins[i + 1]
            assert (before.seed, after.seed, c.seed) == (300, 301, 300)
            assert {before.overlap, after.overlap, before.schedule, after.schedule} == \
                {c.overlap, c.schedule}


def test_cpu_pins_the_loop_only_where_the_process_has_cores_to_spare(monkeypatch):
    from lab import server, server_requests

    pinned = []
    monkeypatch.setattr(server_requests.os, "sched_setaffinity",
                        lambda tid, cores: pinned.append(cores))
    monkeypatch.setattr(server_requests.os, "sched_getaffinity", lambda pid: {0, 1})
    pin = server_requests.pin_loop
    assert pin("auto") is None and pinned == []
    monkeypatch.setattr(server_requests.os, "sched_getaffinity", lambda pid: set(range(2, 18)))
    assert pin("auto") == 17 and pinned == [{17}]
    assert pin("3") == 3 and pin("none") is None
    assert pinned == [{17}, {3}]
    with pytest.raises(SystemExit):
        server.build_parser().parse_args(["out", "--cpu", "fast"])


def test_the_server_modules_import_only_the_standard_library_the_lab_and_the_harness():
    allowed = set(sys.stdlib_module_names) | {"lab", "simwar"}
    for name in MODULES:
        tree = ast.parse((ROOT / "lab" / f"{name}.py").read_text())
        for node in tree.body:  # module level only: torch comes in through main()
            if isinstance(node, ast.Import):
                tops = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                tops = [(node.module or "").split(".")[0]]
            else:
                continue
            assert set(tops) <= allowed, (name, tops)
    code = ("import sys; import lab.server; "
            "bad = [m for m in ('torch', 'simpy', 'pydantic', 'pandas', 'yaml') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


# --------------------------------------------------------------------------- the dry run
@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    pytest.importorskip("torch")
    from lab.server import main

    out = tmp_path_factory.mktemp("server")
    assert main([str(out), "--suite", "fit,loads,races,hostsync,prefill,smoke", "--dry-run",
                 "--dry-steps", "6"]) == 0
    return out


def _metrics(out, name):
    return json.loads((out / f"{name}.metrics.json").read_text())


def test_dry_run_writes_every_case(dry_run):
    names = [c.name for s in ("fit", "loads", "races", "hostsync", "prefill", "smoke")
             for c in suite_cases(s)]
    for name in names:
        m = _metrics(dry_run, name)
        assert m["format"] == "simwar.server" and m["case"]["name"] == name
        assert set(m) >= {"case", "arrivals", "accept_tokens", "host_work", "timed", "summary",
                          "steps", "requests", "capture", "seconds"}
        s = m["summary"]
        assert set(s) >= {"step_us_mean", "step_us_p50", "step_us_p99", "fwd_us_mean",
                          "gap_us_mean", "iter_us_mean", "batch_mean", "per_bucket",
                          "launch_ahead_mean", "host_us", "requests_completed",
                          "latency_us_mean", "latency_us_p99", "ttft_dev_us_mean",
                          "ttft_host_us_mean", "tpot_dev_us_mean", "tpot_host_us_mean",
                          "racy_steps", "racy_steps_all"}
        steps = m["steps"]
        assert len(steps["batch"]) == m["case"]["steps"] == 6
        for b, bucket in zip(steps["batch"], steps["bucket"]):
            assert bucket == bucket_of(b, BUCKETS)
        assert set(m["requests"]) >= {"arrival_us", "admit_step", "first_token_step",
                                      "first_token_dev_us", "first_token_host_us",
                                      "finish_step", "finish_dev_us", "finish_host_us"}
        assert s["racy_steps_all"] == 0  # one CPU stream: no race in a dry run
        assert (dry_run / f"{name}.kineto.json.gz").exists() == m["case"]["profiled"]
        if m["case"]["csan"]:
            assert s["csan"] == {"run": False, "why": "dry run: no CUDA"}
        if m["timed"]:
            assert all(a <= b for a, b in zip(steps["fwd_start_us"], steps["fwd_end_us"]))
    device = json.loads((dry_run / "server_device.json").read_text())
    assert set(device) >= {"device", "torch", "shape", "forward_us", "forward_eager_us",
                           "prefill_us", "host_work", "host_other_us", "pilot_step_us",
                           "load_rates_per_s"}
    assert set(device["forward_us"]) == {"8", "16", "32", "64"}
    log = (dry_run / "server_log.txt").read_text()
    assert "forward µs per bucket" in log and "total" in log and "FAILED" not in log


def test_dry_run_orders_processing_with_and_without_overlap(dry_run):
    on = _metrics(dry_run, "prefill_light_overlap_r0")["steps"]
    off = _metrics(dry_run, "prefill_light_normal_r0")["steps"]
    n = len(on["batch"])
    assert on["processed_in"] == list(range(1, n + 1))  # step k's result in iteration k+1
    assert off["processed_in"] == list(range(n))
    for k in range(n - 1):
        # overlap: forward k+1 is launched before step k's result is processed
        assert on["t_launched_us"][k + 1] <= on["proc_begin_us"][k]
        # no overlap: step k's result is processed before step k+1 begins
        assert off["proc_end_us"][k] <= off["t_begin_us"][k + 1]
        assert off["t_launched_us"][k] <= off["proc_begin_us"][k]


def test_dry_run_prefill_and_requests(dry_run):
    m = _metrics(dry_run, "smoke_prefill_profiled")
    assert m["timed"] is False and m["arrivals"] == {"concurrency": 4}
    steps, req = m["steps"], m["requests"]
    assert steps["prefill_tokens"][0] == 256 and steps["batch"][0] == 0
    for k, pre in enumerate(req["prefill_done_step"]):
        if pre >= 0:
            assert req["first_token_step"][k] == pre  # the first token comes with it
    s = m["summary"]
    assert s["ttft_host_us_mean"] is not None and s["ttft_dev_us_mean"] is None  # untimed


def test_dry_run_capture_has_the_ranges(dry_run):
    raw = gzip.decompress((dry_run / "smoke_prefill_profiled.kineto.json.gz").read_bytes())
    names = {e.get("name") for e in json.loads(raw)["traceEvents"]}
    assert {"scheduler.recv_requests", "scheduler.get_next_batch_to_run",
            "scheduler.prepare_for_decode", "scheduler.run_batch",
            "scheduler.process_batch_result", "prefill", "sample"} <= names
    assert {f"ProfilerStep#{k}" for k in range(7)} <= names  # 6 steps and the drain's
    # the first step prefills alone (nothing decodes yet), the next ones mix
    assert "prefill bs=3 toks=256" in names
    assert any(str(n).startswith(("mixed bs=", "decode bs=")) for n in names)
    raw = gzip.decompress((dry_run / "races_planted.kineto.json.gz").read_bytes())
    names = {e.get("name") for e in json.loads(raw)["traceEvents"]}
    assert {"draft", "verify", "load_batch"} <= names


RECEIVE = re.compile(r"^recv reqs=(\d+) toks=(\d+)$")


def test_the_receive_range_names_the_requests_and_their_tokens():
    assert RECEIVE.match(receive_range(3, 1200)).groups() == ("3", "1200")


@pytest.mark.parametrize("name", ["smoke_prefill_profiled", "hostsync_medium"])
def test_dry_run_capture_names_the_requests_each_iteration_receives(dry_run, name):
    """Each ``recv`` range names the next N requests in arrival order and their T tokens (a
    prompt's, or a decode-only request's context), inside the loop's receive (or wait)."""
    raw = gzip.decompress((dry_run / f"{name}.kineto.json.gz").read_bytes())
    events = [e for e in json.loads(raw)["traceEvents"]
              if e.get("ph") == "X" and e.get("cat") == "user_annotation"]
    outer = [e for e in events
             if e["name"] in ("scheduler.recv_requests", "scheduler.wait_requests")]
    recv = sorted((e for e in events if RECEIVE.match(e["name"])), key=lambda e: e["ts"])
    m = _metrics(dry_run, name)
    req = m["requests"]
    tokens = [p or c for p, c in zip(req["prompt_tokens"], req["context_tokens"])]
    assert recv and len(recv) < len(m["steps"]["batch"]) + 1  # at most one an iteration
    seen = 0
    for e in recv:
        n, t = map(int, RECEIVE.match(e["name"]).groups())
        assert n > 0 and t == sum(tokens[seen:seen + n]), e["name"]
        seen += n
        assert any(o["tid"] == e["tid"] and o["ts"] <= e["ts"]
                   and e["ts"] + e["dur"] <= o["ts"] + o["dur"] for o in outer), e["name"]
    admitted = [i for i, a in enumerate(req["admit_step"]) if a >= 0]
    assert admitted and max(admitted) < seen <= len(tokens)


#: the shapes suite's dry run: small prompts in small chunks, closed loops of 3 (the suite's
#: loads have no requests to speak of at a dry run's pilot rates)
SHAPES_DRY = ("shapes_sglang_closed16_overlap_r0", "shapes_sglang_closed16_normal_r0",
              "shapes_mixed_closed16_overlap_r0", "shapes_sglang_medium_overlap_profiled")


@pytest.fixture(scope="module")
def shapes_dry_run(tmp_path_factory):
    pytest.importorskip("torch")
    from lab.server import main

    out = tmp_path_factory.mktemp("shapes")
    assert main([str(out), "--suite", "shapes", "--cases", ",".join(SHAPES_DRY), "--dry-run",
                 "--dry-steps", "24", "--prompt-tokens", "16..300", "--chunk-tokens", "128",
                 "--output-tokens", "4..12", "--concurrency", "3"]) == 0
    return out


@pytest.mark.parametrize("name", SHAPES_DRY[:2])
def test_shapes_dry_run_sglang_prefill_steps_pause_every_decode(shapes_dry_run, name):
    m = _metrics(shapes_dry_run, name)
    st, req = m["steps"], m["requests"]
    assert m["case"]["schedule"] == "sglang"
    n = len(st["batch"])
    for k in range(n):
        prefill = st["prefill_tokens"][k] > 0
        assert st["shape"][k] == ("prefill" if prefill else "decode")
        if prefill:  # batch 0 decoding, the decodable requests paused, no graph
            assert st["batch"][k] == 0 and st["bucket"][k] == 0
            decoding = sum(1 for d, f in zip(req["prefill_done_step"], req["finish_step"])
                           if 0 <= d < k and (f < 0 or f >= k))
            assert st["paused"][k] >= decoding
        else:
            assert st["paused"][k] == 0
    assert any(p > 0 for p in st["paused"])  # some decoding request did wait
    # a prompt longer than the chunk spans consecutive prefill steps, and decodes after
    long = [i for i, p in enumerate(req["prompt_tokens"])
            if p > 128 and req["prefill_done_step"][i] >= 0]
    assert long
    for i in long:
        a, d = req["admit_step"][i], req["prefill_done_step"][i]
        assert d - a + 1 >= math.ceil(req["prompt_tokens"][i] / 128) >= 2
        assert all(st["shape"][k] == "prefill" for k in range(a, d + 1))
        assert req["first_token_step"][i] == d
        assert req["finish_step"][i] < 0 or req["finish_step"][i] > d
    s = m["summary"]
    assert set(s["per_shape"]) == {"prefill", "decode"}
    assert s["paused_steps"] == sum(1 for k in range(s["warmup"], n - 1) if st["paused"][k])


@pytest.mark.parametrize("name", SHAPES_DRY[:3])
def test_shapes_dry_run_closed_loop_sends_at_the_end_of_the_results_processing(
        shapes_dry_run, name):
    """SGLang streams a finish at the end of process_batch_result: the closed loop's next
    request arrives then, after the scheduler learned of the finish and padded its work."""
    m = _metrics(shapes_dry_run, name)
    st, req = m["steps"], m["requests"]
    done = [i for i, f in enumerate(req["finish_step"]) if f >= 0]
    assert done and len(req["arrival_us"]) == 3 + len(done)
    for i in done:
        assert req["finish_host_us"][i] < st["proc_end_us"][req["finish_step"][i]]
    sends = sorted(st["proc_end_us"][req["finish_step"][i]] for i in done)
    assert sorted(req["arrival_us"][3:]) == sends


def test_shapes_dry_run_mixed_never_runs_a_prefill_only_step_while_requests_decode(
        shapes_dry_run):
    st = _metrics(shapes_dry_run, "shapes_mixed_closed16_overlap_r0")["steps"]
    assert set(st["paused"]) == {0}
    assert "mixed" in st["shape"]
    for k, shape in enumerate(st["shape"]):
        assert shape == {(False, True): "prefill", (True, True): "mixed",
                         (True, False): "decode"}[(st["batch"][k] > 0,
                                                    st["prefill_tokens"][k] > 0)]
    # once a request decodes, every step decodes until the loop drains
    first = st["shape"].index("mixed")
    assert "prefill" not in st["shape"][first:]


def test_shapes_dry_run_capture_names_each_steps_shape(shapes_dry_run):
    raw = gzip.decompress((shapes_dry_run / "shapes_sglang_medium_overlap_profiled"
                                            ".kineto.json.gz").read_bytes())
    names = [e.get("name", "") for e in json.loads(raw)["traceEvents"]
             if e.get("cat") == "user_annotation"]
    st = _metrics(shapes_dry_run, "shapes_sglang_medium_overlap_profiled")["steps"]
    want = [f"prefill bs={r} toks={t}" if t else f"decode bs={b}"
            for b, r, t in zip(st["batch"], st["prefill_requests"], st["prefill_tokens"])]
    seen = [x for x in names if x.startswith(("prefill bs=", "decode bs=", "mixed bs="))]
    assert sorted(seen) == sorted(want)
    device = json.loads((shapes_dry_run / "server_device.json").read_text())
    assert "shapes_16" in device["pilot_requests_per_s"]
    assert set(device["load_rates_per_s"]) >= {"shapes_light", "shapes_medium"}


def test_a_later_chunk_attends_over_its_prompts_prefix_in_the_cache():
    """A carried-over prompt's second chunk reads the K/V of the positions the first chunk
    wrote (through req_to_token), not only its own: its tokens see the prefix and, causally,
    the chunk's earlier tokens."""
    torch = pytest.importorskip("torch")
    from lab.server_model import DryOps, ModelShape, ServerModel

    model = ServerModel(DryOps(torch), ModelShape.dry())
    packed, t, s = model.prefill_meta([(3, 100, 50), (5, 0, 20)])
    assert (t, s) == (70, 176)  # K/V: 150 + 20 positions, padded to a multiple of 8
    tok_pos, kv_row, kv_pos = packed[t:2 * t], packed[3 * t:3 * t + s], packed[3 * t + s:]
    assert tok_pos[:50] == list(range(100, 150)) and tok_pos[50:] == list(range(20))
    assert kv_row[:150] == [3] * 150 and kv_pos[:150] == list(range(150))
    assert kv_row[150:170] == [5] * 20 and kv_row[170:] == [model.shape.rows] * 6
    meta = torch.tensor(packed, dtype=torch.int64)
    model.prefill(meta, t, s, 2)
    before = model.prefill_last[:2].clone()
    prefix = model.req_to_token[3, :100]  # the first chunk's slots of request row 3
    for layer in range(model.shape.layers):
        model.v_pool[layer][prefix] += 1.0
    model.prefill(meta, t, s, 2)
    after = model.prefill_last[:2]
    assert not torch.allclose(before[0], after[0])  # the second chunk read its prefix
    assert torch.equal(before[1], after[1])  # the other request did not


def test_the_loop_issues_each_barrier(tmp_path):
    """A dry server whose streams record what the host issues on them."""
    torch = pytest.importorskip("torch")
    from lab.server import Server
    from lab.server_model import DryOps, DryStream, ModelShape, ServerModel

    calls = []

    class Recording(DryStream):
        def __init__(self, name):
            self.name = name

        def wait_stream(self, other):
            calls.append((self.name, "wait_stream", other.name))

        def wait_event(self, event):
            calls.append((self.name, "wait_event", getattr(event, "label", "?")))

    class Ops(DryOps):
        names = iter(("schedule", "forward", "copy"))

        def stream(self):
            return Recording(next(self.names))

    model = ServerModel(Ops(torch), ModelShape.dry())
    model.capture()
    server = Server(model.ops, model, HostWork(), 2.0)
    server.early_done.label = "early_done"
    model.read_done_eager.label = "read_done"
    for b in model.buckets.values():
        b.read_done.label = "read_done"
    seen = {}
    for barrier in ("fine", "coarse", "none", "planted"):
        calls.clear()
        case = Case(f"b_{barrier}", 3, "closed", barrier, concurrency=3)
        server.run(case, Loads({}, 2.0).arrivals(case), timing=False)
        seen[barrier] = [c for c in calls if c[0] == "schedule"]
        # every forward waits for its step's writes, every copy for its forward
        assert calls.count(("forward", "wait_stream", "schedule")) == 3
        assert calls.count(("copy", "wait_stream", "forward")) == 3
    assert seen["fine"] == [("schedule", "wait_event", "read_done")] * 3
    assert seen["coarse"] == [("schedule", "wait_stream", "forward")] * 3
    assert seen["none"] == []
    assert seen["planted"] == [("schedule", "wait_event", "early_done")] * 3
    # across shapes: a prefill step publishes no graph read-done, so the fine barrier fences
    # the next step's writes on its whole forward; a decode step on verify's read-done
    calls.clear()
    case = Case("b_shapes", 7, "closed", "fine", concurrency=2, schedule="sglang",
                prompt_tokens="8", output_tokens="6", chunk_tokens=8)
    server.run(case, Loads({}, 2.0).arrivals(case), timing=False)
    shapes = [p.shape for p in server.plans]
    # 6 tokens: one from the prefill, 3 decode steps; the finish is learnt after step 5 is
    # scheduled (overlap), the closed loop's next requests prefill in step 6
    assert shapes == ["prefill"] * 2 + ["decode"] * 4 + ["prefill"]
    assert [c for c in calls if c[0] == "schedule"] == [
        ("schedule", "wait_event", "read_done") if sh == "decode" else
        ("schedule", "wait_stream", "forward") for sh in shapes]


# --------------------------------------------------------------------------- on a GPU
def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs torch and a CUDA device")
def test_smoke_suite_on_the_gpu(tmp_path):
    from lab.server import main

    assert main([str(tmp_path), "--suite", "smoke"]) == 0
    device = json.loads((tmp_path / "server_device.json").read_text())
    fwd = device["forward_us"]
    assert 0 < fwd["8"] < fwd["64"]
    decode = _metrics(tmp_path, "smoke_decode")["summary"]
    assert decode["racy_steps"] == 0 and decode["step_us_mean"] > 0
    assert decode["requests_completed"] > 0
    assert (tmp_path / "smoke_prefill_profiled.kineto.json.gz").stat().st_size < 1.5e6
