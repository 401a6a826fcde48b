"""Engine throughput: simulated decode steps per second per built-in algorithm,
and the cost per event relative to a bare SimPy loop of the same event count.

Two event counts are reported. ``SimPy events`` are what the engine schedules
on SimPy's heap; the host runs ahead on its own clock and yields only at a
synchronize, so there are few of them (15-21 a step) and most of the engine's
work per event is trace recording. ``operations`` are what is simulated: host
operations plus device operations (kernels, records, waits), ~35-45 a step.

    python benchmarks/bench_engine.py [--steps 4000] [--repeat 3]

Only the engine (Program → Trace) is timed: building the program and
computing metrics are excluded. Times are process CPU time (robust to other
load on the machine), best of ``--repeat`` runs, engine and bare loops
interleaved (this machine's speed drifts; the bare loop's figure shows by how
much, and the ratios cancel it). The bare loop is one
process yielding ``env.timeout(1)`` as many times as the engine scheduled
events, the cheapest thing SimPy can do per event.
"""

from __future__ import annotations

import argparse
import json
import time

import simpy

from simwar.api import build_program
from simwar.config import load_config
from simwar.executors.engine import Engine


def bare_simpy(n_events: int) -> float:
    env = simpy.Environment()

    def proc(env):
        for _ in range(n_events):
            yield env.timeout(1)

    env.process(proc(env))
    t0 = time.process_time()
    env.run()
    return time.process_time() - t0


def bench(algorithm: str, steps: int, repeat: int) -> dict:
    cfg = load_config(None, {"algorithm": algorithm, "steps": steps, "name": algorithm})
    program = build_program(cfg)
    best = bare = bare_ops = float("inf")
    events = operations = 0
    Engine(program).run()  # warm-up: the first run also pays for growing the heap
    # interleave the engine and the bare loops so that drifts of the machine hit both alike
    for _ in range(repeat):
        engine = Engine(program)
        t0 = time.process_time()
        trace = engine.run()
        best = min(best, time.process_time() - t0)
        events = engine.events
        operations = len(program.ops) + len(trace.ops)
        bare = min(bare, bare_simpy(events))
        bare_ops = min(bare_ops, bare_simpy(operations))
    return {
        "algorithm": algorithm,
        "steps": steps,
        "steps_per_s": steps / best,
        "events": events,
        "events_per_step": events / steps,
        "us_per_event": best / events * 1e6,
        "bare_us_per_event": bare / events * 1e6,
        "ratio_to_bare_per_event": best / bare,
        "operations_per_step": operations / steps,
        "ratio_to_bare_per_operation": best / bare_ops,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [bench(a, args.steps, args.repeat) for a in ("none", "eagle", "dflash", "dspark")]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    print(f"{'algorithm':10} {'steps/s':>9} {'SimPy ev/step':>14} {'µs/event':>9} "
          f"{'bare µs/ev':>10} {'ratio/event':>11} {'ops/step':>9} {'ratio/op':>9}")
    for r in rows:
        print(f"{r['algorithm']:10} {r['steps_per_s']:9.0f} {r['events_per_step']:14.1f} "
              f"{r['us_per_event']:9.2f} {r['bare_us_per_event']:10.2f} "
              f"{r['ratio_to_bare_per_event']:11.2f} {r['operations_per_step']:9.1f} "
              f"{r['ratio_to_bare_per_operation']:9.2f}")


if __name__ == "__main__":
    main()
