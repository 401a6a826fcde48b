"""The harness's own logic on the CPU: replay plans, graph grouping, timing points, the value
check and trace assembly, through the virtual-clock fake backend (no torch, no GPU)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simwar.analysis.metrics import analyze
from simwar.api import simulate
from simwar.config import load_config
from simwar.core.program import (
    GraphLaunch,
    GraphRecord,
    Kernel,
    Launch,
    Program,
    Record,
    StepMarker,
    Synchronize,
    WaitEvent,
)
from simwar.harness import make_plan, replay
from simwar.harness.fake import FakeBackend
from simwar.harness.plan import GraphStep, KernelStep

COST_KEYS = ("launch_us", "graph_launch_us", "event_record_us", "wait_event_us",
             "wait_stream_us", "sync_us")


def fake_for(cfg) -> FakeBackend:
    c = cfg.costs
    return FakeBackend({k: getattr(c, k) for k in COST_KEYS}, sync_wake_us=c.sync_wake_us,
                       cross_stream_us=c.cross_stream_us)


@pytest.mark.parametrize("overrides", [
    {},
    {"policy.barrier": "coarse"},
    {"policy.barrier": "host_sync"},
    {"policy.barrier": "none", "cpu.schedule_us": 50, "cpu.process_result_us": 50},
    {"algorithm": "eagle", "policy.barrier": "none"},
    {"algorithm": "dflash", "policy.plan_stream": True},
    {"policy.placement": "loop_top", "policy.barrier": "coarse"},
])
def test_fake_replay_reproduces_the_simulator(overrides):
    """With the program's own host costs, the replayed trace gives the simulator's metrics."""
    cfg = load_config(None, dict({"steps": 60, "warmup_steps": 5}, **overrides))
    sim = simulate(cfg)
    trace = replay(make_plan(sim.program), fake_for(cfg))
    _, measured, hazards = analyze(trace)
    for key in ("step_us_mean", "fwd_us_mean", "fwd_gap_us_mean", "cpu_blocked_us_mean",
                "launch_ahead_mean", "launch_lead_us_mean", "races"):
        assert measured[key] == pytest.approx(sim.summary[key], abs=1e-6), key
    # the value check agrees with the simulator's observed overlaps, step by step
    warm = cfg.warmup_steps
    value_steps = {r["read_step"] for r in trace.meta["measured_races"]
                   if r["read_step"] >= warm}
    sim_steps = {r.first_step for r in sim.hazards.observed
                 if r.kind == "WAR" and r.first_step >= warm}
    assert value_steps == sim_steps
    assert trace.meta["source"] == "harness"


def test_racy_config_is_caught_by_the_value_check():
    cfg = load_config(None, {"steps": 40, "warmup_steps": 5, "policy.barrier": "none",
                             "cpu.schedule_us": 20, "cpu.process_result_us": 20})
    trace = replay(make_plan(simulate(cfg).program), fake_for(cfg))
    races = trace.meta["measured_races"]
    assert races and all(r["kind"] == "WAR" for r in races)
    # the read of step k saw a write issued after it (result writes of step k, or the next
    # step's schedule writes), never an older one
    assert all(r["seen_step"] >= r["read_step"] for r in races)
    assert any(r["seen_step"] > r["read_step"] for r in races)


def _tiny_graph_program() -> Program:
    body = Kernel("g.body", 10.0, reads=("buf",), phase="p")
    write = Kernel("w", 2.0, writes=("buf",))
    ops = []
    for k in range(3):
        ops += [StepMarker(k), Launch("schedule", write, k), Record(f"w[{k}]", "schedule", k),
                WaitEvent("forward", f"w[{k}]", k),
                GraphLaunch("forward", "g", (Kernel("g.prep", 4.0, phase="p"), GraphRecord("rd"),
                                             body), k, "p"),
                Record(f"done[{k}]", "forward", k), Synchronize("rd", k, "barrier"),
                Synchronize(f"done[{k}]", k, "result_copy")]
    return Program(ops=ops, meta={"warmup_steps": 0})


def test_plan_groups_graph_launches_and_lays_out_stamps():
    plan = make_plan(_tiny_graph_program())
    assert list(plan.graphs) == ["g"]
    g = plan.graphs["g"]
    assert g.launches == 3
    assert [n.event for n in g.nodes] == ["", "rd", ""]
    # the graph's read node owns one snapshot slot per launch
    graph_reads = [r for r in plan.reads if r.node >= 0]
    assert [r.slot for r in graph_reads] == [0, 1, 2]
    # each read expects the stamp of the write issued just before it, in the same step
    assert [plan.stamp_steps[r.expected] for r in graph_reads] == [0, 1, 2]
    assert plan.graph_events == (("g", "rd"),)
    assert set(plan.events) == {f"{e}[{k}]" for e in ("w", "done") for k in range(3)}


def test_timing_points_only_around_each_steps_forward():
    """One start point on the first forward-phase launch of a step, one end point on the last:
    every other launch (the schedule stream's writes, here) makes no timing call."""
    plan = make_plan(_tiny_graph_program())
    timed = [s for s in plan.steps if type(s) in (KernelStep, GraphStep)]
    writes = [s for s in timed if type(s) is KernelStep]
    assert all(s.start_point == s.end_point == -1 for s in writes)
    graphs = [s for s in timed if type(s) is GraphStep]
    points = [p for s in graphs for p in (s.start_point, s.end_point)]
    assert sorted(points) == list(range(plan.timing_points)) and plan.timing_points == 6


def test_forward_bounds_of_a_built_program():
    from simwar.harness.plan import forward_bounds

    cfg = load_config(None, {"steps": 6, "warmup_steps": 1, "algorithm": "eagle"})
    program = simulate(cfg).program
    first, last = forward_bounds(program)
    assert len(first) == len(last) == 6
    labels = {program.ops[i].kernel.label if type(program.ops[i]) is Launch
              else program.ops[i].graph for i in first | last}
    assert labels == {"draft.load_batch", "draft_extend.graph"}


def test_measured_start_earlier_than_the_estimate_wins_and_clips_it():
    """An untimed wait estimated to release after the measured forward start is clipped."""
    from simwar.harness.plan import make_plan as plan_of
    from simwar.harness.replay import assemble

    ops = [StepMarker(0), Launch("schedule", Kernel("w", 50.0, writes=("b",)), 0),
           Record("w", "schedule", 0), WaitEvent("forward", "w", 0),
           Launch("forward", Kernel("f", 10.0, reads=("b",), phase="p"), 0)]
    plan = plan_of(Program(ops=ops))
    n = len(plan.steps)
    t0 = [float(i) for i in range(n)]
    t1 = [float(i + 1) for i in range(n)]
    first = list(t1)
    # the write is estimated to end at 2 + 50 = 52; the forward was measured starting at 40
    trace = assemble(plan, t0, t1, first, [None, None, None, ("host", "w"), None],
                     [40.0, 50.0], [1], {"cross_stream_us": 0.0})
    fwd = [s for s in trace.spans if s.lane == "forward"]
    kernel = next(s for s in fwd if s.kind == "kernel")
    assert (kernel.start_us, kernel.end_us) == (40.0, 50.0)
    assert all(s.end_us <= 40.0 for s in fwd if s.kind == "wait")


def test_graph_nodes_are_interpolated_and_records_bound():
    program = _tiny_graph_program()
    backend = FakeBackend({"launch_us": 1.0, "graph_launch_us": 1.0})
    trace = replay(make_plan(program), backend)
    kernels = [o for o in trace.ops if o.kind == "kernel" and o.label.startswith("g.")]
    assert [round(o.end_us - o.start_us, 6) for o in kernels[:2]] == [4.0, 10.0]
    # the sync binds to the in-graph record node of the same launch
    syncs = [o for o in trace.ops if o.kind == "sync" and o.event == "rd"]
    by_id = {o.op_id: o for o in trace.ops}
    assert len(syncs) == 3
    node = trace.graph_node()
    assert all(by_id[s.bound].kind == "record" and by_id[s.bound].event == "rd"
               and node[s.bound] and by_id[s.bound].step == s.step for s in syncs)
    assert trace.meta["measured_races"] == []
    calls = backend.calls
    assert calls.count("graph forward g") == 3


def test_never_recorded_event_makes_wait_and_sync_no_ops():
    ops = [StepMarker(0), WaitEvent("forward", "nope", 0), Synchronize("nope", 0, "barrier"),
           Launch("forward", Kernel("k", 5.0, phase="p"), 0)]
    trace = replay(make_plan(Program(ops=ops)), FakeBackend({"sync_us": 1.0}))
    waits = [o for o in trace.ops if o.kind in ("wait", "sync")]
    assert all(o.bound == -1 for o in waits)


def test_harness_modules_import_without_simwar_dependencies():
    """The GPU machine has torch and numpy, but none of simwar's other dependencies."""
    code = (
        "import sys\n"
        "class Block:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('simpy','pydantic','pandas','yaml',"
        "'matplotlib'):\n"
        "            raise ImportError('blocked ' + name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "import simwar.harness, simwar.harness.plan, simwar.harness.replay, "
        "simwar.harness.fake, simwar.harness.gpu_main\n"
        "from simwar.core.program import Program\n"
        "from simwar.core.trace import Trace\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_cli_harness_writes_programs_and_rejects_bad_input(tmp_path, capsys):
    from simwar.cli.app import main

    assert main(["harness", "-o", str(tmp_path)]) == 2
    assert "give at least one CONFIG" in capsys.readouterr().err
    cfg = tmp_path / "c.yaml"
    cfg.write_text("name: tiny\nsteps: 5\nwarmup_steps: 1\n")
    assert main(["harness", str(cfg), "-o", str(tmp_path / "p")]) == 0
    assert Program.from_json((tmp_path / "p" / "tiny.json").read_text()).steps() == 6
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    assert main(["compare", str(bad), "--csv", str(tmp_path / "t.csv")]) == 2
    assert "'cases' mapping" in capsys.readouterr().err


def test_calibrate_and_compare_on_fake_traces(tmp_path, capsys):
    """End to end on the CPU: fake-measured suite cases -> calibrate -> compare."""
    from simwar.cli.app import main
    from simwar.harness import suite

    costs = {"launch_us": 20.0, "graph_launch_us": 10.0, "event_record_us": 3.0,
             "wait_event_us": 3.0, "wait_stream_us": 6.0, "sync_us": 4.0}
    traces = tmp_path / "traces"
    traces.mkdir()
    for name in ("dspark-fine-cpu", "dspark-none-gpu"):
        cfg = suite.case_config(name).model_copy(update={"steps": 40, "warmup_steps": 5})
        program = simulate(cfg).program
        trace = replay(make_plan(program), FakeBackend(costs, sync_wake_us=2.0,
                                                       cross_stream_us=1.0))
        trace.save(traces / f"{name}.trace.json.gz")
    out = tmp_path / "cal.yaml"
    bench = tmp_path / "bench.json"
    bench.write_text('{"primitives": {"sync_wake_after_200us_us": 2.0, "cross_stream_us": 1.0}}')
    assert main(["calibrate", str(traces), "--bench", str(bench), "-o", str(out)]) == 0
    import yaml

    fitted = yaml.safe_load(out.read_text())["costs"]
    for k, v in costs.items():
        assert fitted[k] == pytest.approx(v), k
    # device latencies are not timed by the replay: they come from the micro-benchmarks
    assert fitted["sync_wake_us"] == pytest.approx(2.0)
    assert fitted["cross_stream_us"] == pytest.approx(1.0)
    capsys.readouterr()
    csv = tmp_path / "t.csv"
    assert main(["compare", str(traces), "--costs", str(out), "--csv", str(csv)]) == 0
    import pandas as pd

    table = pd.read_csv(csv)
    assert set(table.columns) == {"config", "metric", "simulated", "measured", "abs_error",
                                  "rel_error"}
    races = table[table.metric == "races"].set_index("config").measured
    assert races["dspark-none-gpu"] == 1 and races["dspark-fine-cpu"] == 0


def test_graph_launch_span_carries_the_launchs_phase_as_in_the_engine():
    """The host span of a graph launch has the GraphLaunch's phase (the engine's), also when
    it differs from its first node's."""
    from simwar.executors.engine import run

    g = (GraphRecord("e"), Kernel("n", 3.0, phase="node"))
    program = Program([StepMarker(0), GraphLaunch("s", "g", g, 0, "launch", host_us=1.0)],
                      streams=("s",))
    api = [(sp.label, sp.phase) for t in (run(program), replay(make_plan(program),
                                                                FakeBackend("program")))
           for sp in t.spans if sp.kind == "api"]
    assert api == [("g", "launch"), ("g", "launch")]


def test_fake_reads_see_writes_ordered_before_them_at_the_same_instant():
    """Zero-length kernels: a kernel reads its own write, and a read ordered after a write
    that starts at the same instant sees it (stream order), so no measured race."""
    ops = [StepMarker(0), Launch("a", Kernel("rw", 0.0, reads=("b",), writes=("b",)), 0),
           Launch("a", Kernel("w", 0.0, writes=("b",)), 0),
           Launch("a", Kernel("r", 0.0, reads=("b",)), 0)]
    trace = replay(make_plan(Program(ops, streams=("a",))), FakeBackend())
    assert trace.meta["measured_races"] == []
    # a write issued after a read and starting when it ends did not overtake it
    ops = [StepMarker(0), Launch("a", Kernel("r", 2.0, reads=("b",)), 0),
           Record("r", "a", 0), WaitEvent("c", "r", 0),
           Launch("c", Kernel("w", 1.0, writes=("b",)), 0)]
    trace = replay(make_plan(Program(ops, streams=("a", "c"))), FakeBackend())
    assert trace.meta["measured_races"] == []


def test_fake_program_costs_use_each_ops_own_host_cost_and_latencies():
    from simwar.core.program import WaitStream
    from simwar.executors.engine import run

    ops = [StepMarker(0), Launch("a", Kernel("k", 10.0), 0, host_us=2.0),
           Record("e", "a", 0, host_us=3.0), WaitEvent("b", "e", 0, host_us=1.0, latency_us=4.0),
           WaitStream("c", "a", 0, host_us=0.5, latency_us=1.5),
           Launch("b", Kernel("kb", 1.0), 0, host_us=1.0),
           Launch("c", Kernel("kc", 1.0), 0, host_us=1.0),
           Synchronize("e", 0, "x", host_us=0.25, wake_us=7.0)]
    program = Program(ops, streams=("a", "b", "c"))
    backend = FakeBackend("program")
    trace = replay(make_plan(program), backend)
    assert backend.info()["latency"] == "program"
    want = {(o.label, o.start_us, o.end_us) for o in run(program).ops}
    assert {(o.label, o.start_us, o.end_us) for o in trace.ops} == want
    kb = next(o for o in trace.ops if o.label == "kb")
    assert kb.start_us == 2.0 + 10.0 + 4.0  # k ends at 12, plus the wait's own latency
    sync = next(o for o in trace.ops if o.kind == "sync")
    assert sync.end_us == 12.0 + 7.0  # the record fires at 12, plus the sync's own wake-up
