"""Fit host costs from measurements, and express measured replay loops as configs.

Two things live here:

- :func:`loop_case_config` turns one case of a measured overlap-loop replay
  (the format of ``data/h200_overlap_run1.json``: a host loop with planning
  ``P``, schedule-stream work ``W`` before a one-element shared write, a
  forward that reads the buffer after ``R`` and computes ``C`` more, a WAR
  barrier, and result processing ``Q``) into a simwar config, using the
  measured primitive costs for the host API calls;
- :func:`fit_host_call_us` fits the one host cost the primitives do not
  give: the per-call overhead of the host loop around each API call
  (interpreter, framework dispatch, bookkeeping). On a CPU-bound loop the step
  time is linear in it, so it is the least-squares slope over CPU-bound
  cases, found by simulating each case twice.
"""

from __future__ import annotations

from typing import Iterable

from simwar.api import simulate

#: device time of the replay's one-element kernels (the write, the snapshot and D2H copies),
#: typical of a tiny kernel on a current GPU; the primitives give host costs only
TINY_KERNEL_US = 2.0


def loop_case_config(case: dict, primitives: dict, *, host_call_us: float = 0.0,
                     warmup_steps: int = 20, cross_stream_us: float = 3.0) -> dict:
    """A simwar config (mapping) reproducing one measured replay-loop case."""
    R, C, W, P, Q = (float(case[k]) for k in "RCWPQ")
    policy = case["policy"]
    if policy == "host":
        barrier, placement = "host_sync", "after_launch"
    else:
        barrier, placement = policy, "after_launch"
    if case["graph"]:
        read_ends = {"pre": "pre_replay", "in": "in_replay", "post": "post_replay"}[
            case["boundary"]]
        phases = [
            {"name": "forward", "graph": "full", "read_ends": read_ends, "prep_us": R,
             "body_us": C, "reads": ["req_to_token"]},
            # the static slot the graph read into is copied to the step's snapshot
            {"name": "snapshot", "graph": "eager", "body_us": TINY_KERNEL_US},
        ]
    else:
        # eager: spin R, read (a copy), record read_done, spin C: three launches and a record
        phases = [{"name": "spin", "graph": "eager", "body_us": R},
                  {"name": "forward", "graph": "eager", "read_ends": "pre_replay",
                   "load_batch_us": TINY_KERNEL_US, "body_us": C, "reads": ["req_to_token"]}]
    p = primitives
    return {
        "name": f"h200-{policy}-{'graph-' + case['boundary'] if case['graph'] else 'eager'}"
                f"-R{R:g}-C{C:g}-W{W:g}-P{P:g}-Q{Q:g}",
        "seed": 0,
        "steps": int(case.get("steps", 150)) + warmup_steps,
        "warmup_steps": warmup_steps,
        "algorithm": "custom",
        "phases": phases,
        "policy": {"barrier": barrier, "placement": placement},
        "cpu": {"ingest_us": 0, "schedule_us": P, "prepare_us": 0, "process_result_us": Q},
        "gpu": {"schedule_prep_us": W, "schedule_writes_us": TINY_KERNEL_US,
                "result_writes_us": 0, "result_copy_us": TINY_KERNEL_US,
                "result_copy_stream": "forward"},
        "costs": {
            "launch_us": p["launch_sleep_kernel_us"],
            "event_record_us": p["event_record_us"],
            "wait_event_us": p["stream_wait_event_us"],
            "wait_stream_us": p["stream_wait_stream_us"],
            "graph_launch_us": p["graph_replay_20k_host_us"],
            "sync_us": p["event_query_us"],
            "sync_wake_us": p["sync_overhead_after_200us_us"],
            "cross_stream_us": cross_stream_us,
            "host_call_us": host_call_us,
        },
        "accept": {"tokens": 1.0},
        "batch_size": 1,
    }


def fit_host_call_us(configs: Iterable[dict], measured_step_us: Iterable[float],
                     probe_us: float = 20.0) -> float:
    """Least-squares per-call host overhead from CPU-bound cases.

    ``configs`` are config mappings (their ``costs.host_call_us`` is ignored);
    ``measured_step_us`` the measured step times. Cases whose simulated step
    does not depend on the host cost (GPU-bound) get zero weight by
    construction: their slope is zero.
    """
    num = den = 0.0
    for cfg, measured in zip(configs, measured_step_us):
        s0 = simulate(cfg, {"costs.host_call_us": 0.0}).summary["step_us_mean"]
        s1 = simulate(cfg, {"costs.host_call_us": probe_us}).summary["step_us_mean"]
        slope = (s1 - s0) / probe_us
        num += slope * (measured - s0)
        den += slope * slope
    if den == 0:
        raise ValueError("no case depends on the host cost (all GPU-bound): nothing to fit")
    return max(0.0, num / den)
