"""Every interpreter of the host-program IR handles every op type of ``simwar.core.program``.

The op types are read from the module itself (its ``HostOp`` and ``GraphNode`` unions), so a
new op type makes these tests fail until it has an example here and every interpreter
handles it, or an interpreter declares it out of its scope in :data:`OUT_OF_SCOPE` (with
the reason; the test then holds it to refusing the op, never to running it wrongly).

For each op type a small Program (a few steps of a forward kernel, the op in every step)
runs through each interpreter, and where two can be compared they must agree:

- the SimPy engine (:mod:`simwar.executors.engine`), the reference;
- the fast executor's ranks (:mod:`simwar.executors.fast.ranks`): every Trace column equal
  to the SimPy engine's ranks, on two ranks running the same Program;
- the fast executor's planner and pass (:func:`simwar.executors.fast.run`): the per-step
  table, summary and races equal to the engine's;
- its trace mode (:mod:`simwar.executors.fast.trace`): every Trace column equal;
- the lockstep executor (it runs the planner's plans through its own code generator):
  every summary key equal to the fast executor's;
- the GPU harness's plan and replay (:mod:`simwar.harness`) on its CPU fake backend with
  each op's own costs: the engine's ops, accesses and markers.
"""

from __future__ import annotations

import math
import typing

import numpy as np
import pytest

from simwar.analysis.hazards import detect
from simwar.analysis.metrics import step_columns, summarize
from simwar.core import program as ir
from simwar.core.program import (
    Collective,
    CpuWork,
    GraphLaunch,
    GraphRecord,
    HostCollective,
    Kernel,
    Launch,
    Marker,
    Program,
    Record,
    StepMarker,
    Synchronize,
    WaitEvent,
    WaitStream,
)
from simwar.core.trace import SCHEMAS
from simwar.executors import fast, lockstep
from simwar.executors import ranks as simpy_ranks
from simwar.executors.engine import Engine
from simwar.executors.fast import ranks as fast_ranks
from simwar.executors.fast import trace as trace_mode
from simwar.executors.fast.plan import RanksOnly, plan_program
from simwar.harness import make_plan, replay
from simwar.harness.fake import FakeBackend

HOST_OPS = typing.get_args(ir.HostOp)
GRAPH_NODES = typing.get_args(ir.GraphNode)
STEPS = 6


# --------------------------------------------------------------------------- one op type each
def _forward(step: int) -> Launch:
    return Launch("forward", Kernel("forward", 40.0 + step, reads=("kv",), writes=("kv",),
                                    phase="decode"), step, host_us=3.0)


def _graph(step: int, node) -> GraphLaunch:
    return GraphLaunch("forward", "g", (Kernel("body", 15.0, writes=("x",), phase="decode"),
                                        node), step, phase="decode", host_us=6.0)


#: op type -> the host ops of one step that use it (after the step's marker and forward)
EXAMPLES = {
    StepMarker: lambda s: [],  # every step has one
    CpuWork: lambda s: [CpuWork("schedule", 25.0 + 3 * s, s)],
    Launch: lambda s: [Launch("copy", Kernel("copy", 12.0, reads=("kv",), writes=("out",)),
                              s, host_us=2.0)],
    GraphLaunch: lambda s: [GraphLaunch("forward", "g", (Kernel("body", 15.0, phase="decode"),),
                                        s, phase="decode", host_us=6.0)],
    Record: lambda s: [Record("done", "forward", s, host_us=1.0),
                       Synchronize("done", s, "sync", host_us=1.0, wake_us=4.0)],
    WaitEvent: lambda s: [Record("fwd_done", "forward", s, host_us=1.0),
                          WaitEvent("copy", "fwd_done", s, host_us=1.0, latency_us=2.0),
                          WaitEvent("copy", "never_recorded", s, host_us=1.0),
                          Launch("copy", Kernel("copy", 9.0, reads=("kv",)), s)],
    WaitStream: lambda s: [WaitStream("copy", "forward", s, host_us=1.0, latency_us=3.0),
                           Launch("copy", Kernel("copy", 9.0, reads=("kv",)), s)],
    Synchronize: lambda s: [Record("fwd_done", "forward", s),
                            Synchronize("fwd_done", s, "result", host_us=2.0, wake_us=5.0),
                            Synchronize("never_recorded", s, "other", host_us=1.0)],
    Marker: lambda s: [Marker("run_batch", s)],
    HostCollective: lambda s: [HostCollective("broadcast", s, cost_us=8.0, wake_us=3.0)],
    # graph nodes: a graph launch holding one
    Kernel: lambda s: [_graph(s, Kernel("tail", 7.0, reads=("x",), phase="decode"))],
    GraphRecord: lambda s: [_graph(s, GraphRecord("graph_done")),
                            WaitEvent("copy", "graph_done", s, host_us=1.0, latency_us=2.0),
                            Synchronize("graph_done", s, "result", host_us=1.0, wake_us=2.0)],
    Collective: lambda s: [_graph(s, Collective("allreduce", 11.0, phase="decode"))],
}

OP_TYPES = HOST_OPS + GRAPH_NODES

#: interpreter -> op types it refuses by design, and why
RANKS_ONLY = "tensor-parallel coupling: the fast executor's plans run one rank " \
             "(simwar.executors.fast.one_rank); its ranks run on executors/fast/ranks.py"
OUT_OF_SCOPE = {
    "fast": {HostCollective: RANKS_ONLY, Collective: RANKS_ONLY},
    "trace mode": {HostCollective: RANKS_ONLY, Collective: RANKS_ONLY},
    "lockstep": {HostCollective: RANKS_ONLY, Collective: RANKS_ONLY},
    "harness": {HostCollective: "the GPU harness replays one rank",
                Collective: "the GPU harness replays one rank"},
}


def program_with(kind: type) -> Program:
    ops = []
    for step in range(STEPS):
        ops += [StepMarker(step), _forward(step), *EXAMPLES[kind](step)]
    return Program(ops, streams=("forward", "copy"),
                   meta={"warmup_steps": 1, "forward_stream": "forward", "accept_tokens": 2.0,
                         "batch_size": 4, "name": kind.__name__})


def _uses(program: Program, kind: type) -> bool:
    return any(type(op) is kind or (type(op) is GraphLaunch
                                    and any(type(n) is kind for n in op.nodes))
               for op in program.ops)


# --------------------------------------------------------------------------- comparisons
def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return a == b


def assert_same_summary(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for key, value in want.items():
        assert _same(got[key], value), (key, got[key], value)


def assert_same_trace(got, want, meta: bool = True) -> None:
    for name, cols in SCHEMAS.items():
        a, b = getattr(got, name), getattr(want, name)
        assert len(a) == len(b), f"{name}: {len(a)} rows, expected {len(b)}"
        for col, _, how in cols:
            if how == "str":
                assert a.decoded(col).tolist() == b.decoded(col).tolist(), f"{name}.{col}"
            else:
                np.testing.assert_array_equal(getattr(a, col), getattr(b, col),
                                              err_msg=f"{name}.{col}")
    if meta:
        assert got.meta == want.meta


def reference(program: Program):
    trace = Engine(program).run()
    columns = step_columns(trace)
    hazards = detect(trace)
    return trace, columns, summarize(columns, trace.meta, hazards), hazards.races


# --------------------------------------------------------------------------- interpreters
def run_simpy(program: Program) -> None:
    trace = Engine(program).run()
    assert len(trace.ops) > 0


def run_fast_ranks(program: Program) -> None:
    want, _ = simpy_ranks.run_ranks([program, program])
    got = fast_ranks.run_ranks([program, program])
    for a, b in zip(got, want):
        assert_same_trace(a, b)


def run_fast(program: Program) -> None:
    _, columns, summary, races = reference(program)
    run = fast.run(program)
    assert list(run.columns) == list(columns)
    for name, col in columns.items():
        assert np.array_equal(run.columns[name], col, equal_nan=True), name
    assert_same_summary(run.summary, summary)
    assert run.hazards.races == races


def run_trace_mode(program: Program) -> None:
    want = Engine(program).run()
    plan = plan_program(program)
    assert_same_trace(trace_mode.join(list(trace_mode.windows(plan, chunk=2))), want)


def lockstep_plan(program: Program):
    """The fast executor's plan of ``program``, its parameter columns also as arrays, as a
    config's plan has them (the lockstep executor runs config plans)."""
    plan = plan_program(program)
    for block in plan.blocks:
        lists = block.columns
        lists.arrays = lambda start, stop, lists=lists: [np.asarray(c, dtype=np.float64)
                                                         for c in lists(start, stop)]
    return plan


def run_lockstep(program: Program) -> None:
    want = fast.run(program).summary
    for got in lockstep.run_group([lockstep_plan(program), lockstep_plan(program)]):
        assert_same_summary(got, want)


def run_harness(program: Program) -> None:
    want = Engine(program).run()
    got = replay(make_plan(program), FakeBackend("program"))
    # the replay's own timing points are not the program's ops: compare the program's
    assert got.ops.decoded("label").tolist() == want.ops.decoded("label").tolist()
    assert got.ops.decoded("kind").tolist() == want.ops.decoded("kind").tolist()
    for col in ("start_us", "end_us", "issue_us"):
        np.testing.assert_allclose(getattr(got.ops, col), getattr(want.ops, col), rtol=0,
                                   atol=1e-9, err_msg=col)
    assert got.accesses.decoded("buffer").tolist() == want.accesses.decoded("buffer").tolist()
    assert [m.name for m in got.markers] == [m.name for m in want.markers]


INTERPRETERS = {"simpy": run_simpy, "fast ranks": run_fast_ranks, "fast": run_fast,
                "trace mode": run_trace_mode, "lockstep": run_lockstep,
                "harness": run_harness}


# --------------------------------------------------------------------------- the tests
def test_every_op_type_has_an_example_that_uses_it():
    assert set(ir._OP_TYPES.values()) == set(HOST_OPS)  # what a program file may hold
    missing = [k.__name__ for k in OP_TYPES if k not in EXAMPLES]
    assert not missing, f"op types with no example here (add one, then handle them): {missing}"
    for kind in OP_TYPES:
        assert _uses(program_with(kind), kind), kind.__name__


def test_out_of_scope_lists_name_interpreters_and_op_types_that_exist():
    assert set(OUT_OF_SCOPE) <= set(INTERPRETERS)
    for refused in OUT_OF_SCOPE.values():
        assert set(refused) <= set(OP_TYPES)


@pytest.mark.parametrize("kind", OP_TYPES, ids=lambda k: k.__name__)
@pytest.mark.parametrize("interpreter", INTERPRETERS)
def test_every_interpreter_handles_every_op_type(interpreter, kind):
    program = program_with(kind)
    run = INTERPRETERS[interpreter]
    if kind in OUT_OF_SCOPE.get(interpreter, {}):
        # refused where the op is first read: the fast planner (and so the trace mode and
        # lockstep) by its named refusal; the harness as an unknown host op, or a graph node
        # that is not a kernel read as one
        refusal = (RanksOnly if interpreter in ("fast", "trace mode", "lockstep")
                   else (TypeError, AttributeError))
        with pytest.raises(refusal, match=rf"\b{kind.__name__}\b"):
            run(program)
    else:
        run(program)
