"""The executable spec: a literal timeline per barrier policy on a tiny integer case.

One eager phase per step (load_batch 2 µs reading ``req_to_token``, body 6 µs),
schedule CPU 1 µs, result processing 1 µs, schedule-stream writes 2 µs,
result-processing writes 1 µs, result copy 1 µs, every host API cost and
latency 0. Each timeline below was derived by hand from the overlap loop
(builder docstring) and the CUDA rules (engine docstring); e.g. for coarse:
writes[1] wait for forward 0's whole tail (11), forward 1 waits for them (13).
"""

from __future__ import annotations

import pytest

import simwar

TINY = dict(
    name="tiny", seed=0, steps=3, warmup_steps=0, algorithm="custom",
    phases=[dict(name="fwd", graph="eager", read_ends="pre_replay", load_batch_us=2, body_us=6,
                 reads=["req_to_token"])],
    cpu=dict(ingest_us=0, schedule_us=1, prepare_us=0, process_result_us=1),
    gpu=dict(schedule_writes_us=2, result_writes_us=1, result_copy_us=1),
    costs=dict(launch_us=0, event_record_us=0, wait_event_us=0, wait_stream_us=0,
               graph_launch_us=0, sync_us=0, sync_wake_us=0, cross_stream_us=0),
)

# (label, step, start_us, end_us) per lane: device kernels, and host blocks on lane cpu
# (a host block is labelled with the event it synchronized on)
EXPECTED = {
    "none": {
        "forward": [
            ('fwd.load_batch', 0, 3, 5),
            ('fwd.body', 0, 5, 11),
            ('fwd.load_batch', 1, 11, 13),
            ('fwd.body', 1, 13, 19),
            ('fwd.load_batch', 2, 19, 21),
            ('fwd.body', 2, 21, 27),
        ],
        "schedule": [
            ('schedule_writes', 0, 1, 3),
            ('schedule_writes', 1, 3, 5),
            ('result_writes', 1, 13, 14),
            ('schedule_writes', 2, 14, 16),
            ('result_writes', 2, 21, 22),
            ('result_writes', 3, 29, 30),
        ],
        "cpu": [
            ('copy_done[0]', 1, 2, 12),
            ('copy_done[1]', 2, 14, 20),
            ('copy_done[2]', 3, 21, 28),
        ],
    },
    "coarse": {
        "forward": [
            ('fwd.load_batch', 0, 3, 5),
            ('fwd.body', 0, 5, 11),
            ('fwd.load_batch', 1, 13, 15),
            ('fwd.body', 1, 15, 21),
            ('fwd.load_batch', 2, 24, 26),
            ('fwd.body', 2, 26, 32),
        ],
        "schedule": [
            ('schedule_writes', 0, 1, 3),
            ('schedule_writes', 1, 11, 13),
            ('result_writes', 1, 21, 22),
            ('schedule_writes', 2, 22, 24),
            ('result_writes', 2, 32, 33),
            ('result_writes', 3, 34, 35),
        ],
        "cpu": [
            ('copy_done[0]', 1, 2, 12),
            ('copy_done[1]', 2, 14, 22),
            ('copy_done[2]', 3, 23, 33),
        ],
    },
    "fine": {
        "forward": [
            ('fwd.load_batch', 0, 3, 5),
            ('fwd.body', 0, 5, 11),
            ('fwd.load_batch', 1, 11, 13),
            ('fwd.body', 1, 13, 19),
            ('fwd.load_batch', 2, 19, 21),
            ('fwd.body', 2, 21, 27),
        ],
        "schedule": [
            ('schedule_writes', 0, 1, 3),
            ('schedule_writes', 1, 5, 7),
            ('result_writes', 1, 13, 14),
            ('schedule_writes', 2, 14, 16),
            ('result_writes', 2, 21, 22),
            ('result_writes', 3, 29, 30),
        ],
        "cpu": [
            ('copy_done[0]', 1, 2, 12),
            ('copy_done[1]', 2, 14, 20),
            ('copy_done[2]', 3, 21, 28),
        ],
    },
    "host_sync": {
        "forward": [
            ('fwd.load_batch', 0, 3, 5),
            ('fwd.body', 0, 5, 11),
            ('fwd.load_batch', 1, 11, 13),
            ('fwd.body', 1, 13, 19),
            ('fwd.load_batch', 2, 19, 21),
            ('fwd.body', 2, 21, 27),
        ],
        "schedule": [
            ('schedule_writes', 0, 1, 3),
            ('schedule_writes', 1, 6, 8),
            ('result_writes', 1, 14, 15),
            ('schedule_writes', 2, 15, 17),
            ('result_writes', 2, 22, 23),
            ('result_writes', 3, 29, 30),
        ],
        "cpu": [
            ('read_done[0]', 0, 1, 5),
            ('read_done[1]', 1, 6, 13),
            ('copy_done[0]', 1, 13, 13),
            ('read_done[2]', 2, 15, 21),
            ('copy_done[1]', 2, 21, 21),
            ('copy_done[2]', 3, 22, 28),
        ],
    },
}


def timeline(result):
    out = {}
    for lane in ("forward", "schedule", "cpu"):
        out[lane] = [(s.label, s.step, s.start_us, s.end_us)
                     for s in sorted(result.trace.spans, key=lambda s: s.start_us)
                     if s.lane == lane and s.kind in ("kernel", "blocked")]
    return out


@pytest.mark.parametrize("barrier", list(EXPECTED))
def test_literal_timeline(barrier):
    result = simwar.simulate(TINY, {"policy.barrier": barrier})
    assert timeline(result) == EXPECTED[barrier]


def test_no_barrier_lets_the_next_write_overtake_the_read():
    result = simwar.simulate(TINY, {"policy.barrier": "none"})
    observed = result.hazards.observed
    assert [(r.kind, r.first_label, r.first_step, r.second_label, r.second_step, r.overlap_us)
            for r in observed] == [("WAR", "fwd.load_batch", 0, "schedule_writes", 1, 2.0)]
    assert len(result.hazards.latent) == 4  # every write after a read is unordered


@pytest.mark.parametrize("barrier", ["coarse", "fine", "host_sync"])
def test_barriers_leave_no_race(barrier):
    assert simwar.simulate(TINY, {"policy.barrier": barrier}).hazards.races == []
