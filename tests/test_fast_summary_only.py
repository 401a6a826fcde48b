"""A summary-only run of a plan the streaming summary cannot take still has its summary.

Streaming needs the forward steps issued in order; otherwise the pass computes the whole
per-step table (the ``collect`` path), and a summary-only run summarizes it before dropping
it, so its summary is the table run's.
"""

from __future__ import annotations

from simwar.core.program import Kernel, Launch, Program, StepMarker
from simwar.executors import fast
from simwar.executors.fast.execute import run_plan
from simwar.executors.fast.plan import plan_program


def forward(step: int) -> Launch:
    return Launch("forward", Kernel(f"forward{step}", 10.0, phase="decode"), step)


def test_summary_only_of_forward_steps_issued_out_of_order_is_the_table_summary():
    program = Program([StepMarker(0), forward(1), forward(0), StepMarker(1), forward(2),
                       StepMarker(2), forward(3)],
                      meta={"forward_stream": "forward", "warmup_steps": 0})
    full = fast.run(program)
    assert full.paths[1] == "collect"
    streamed = run_plan(plan_program(program), summary_only=True)
    assert streamed.columns is None
    assert list(streamed.summary) == list(full.summary)
    for key, value in full.summary.items():
        assert same(streamed.summary[key], value), key


def same(a, b) -> bool:
    """Equal, or both NaN (a summary is NaN where its quantity is undefined: no launches)."""
    return a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)
