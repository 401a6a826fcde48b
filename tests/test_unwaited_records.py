"""A record nothing waits on, issued at no host cost, changes no time, fact or race.

This is what running an ``advise`` family as one program rests on
(docs/benchmarks-explain-advise-startup.md, the ``advise`` paragraphs): the candidates that
differ only in where read-done is published would share one program with a record at every
publish point, each firing for the member that publishes there and costing the others 0.0 of
host time (``t + 0.0`` is ``t``). A record on the forward stream moves that stream's tail to
``max(tail, t)``, and every later use of the tail is ``begins(tail, t')`` with ``t' >= t``,
so nothing later moves; an in-graph record node fires at the node before it and delays none
after it; neither adds a happens-before edge, as nothing waits on it. Held here on programs
of candidates of the advise space: the per-step table, the summary and the races (but for
the op ids, which the extra records shift) are those of the program without them, bit for
bit; and the same records at a host cost of 1 us do move some figure (the comparison can
fail). """

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
from custom_phases import custom_config

from simwar.api import resolve_sizes
from simwar.builder.loop import build_program
from simwar.config import load_config
from simwar.core.program import GraphLaunch, GraphRecord, Launch, Program, Record
from simwar.executors import fast
from simwar.study.advise import candidate_config, space

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def _unwaited(program, cost: float):
    """``program`` with a record on the forward stream after every forward launch (host
    cost ``cost``) and an in-graph record node between every two nodes of a graph, each of
    an event of its own (nothing waits on it)."""
    ops = []
    for n, op in enumerate(program.ops):
        if type(op) is GraphLaunch and len(op.nodes) > 1:
            nodes = [x for i, node in enumerate(op.nodes)
                     for x in ((GraphRecord(f"unwaited.node[{n}.{i}]"), node) if i else (node,))]
            op = op.replace(nodes=tuple(nodes))
        ops.append(op)
        if type(op) in (Launch, GraphLaunch) and op.stream == "forward":
            ops.append(Record(f"unwaited[{n}]", "forward", op.step, cost))
    return Program(ops, program.streams, program.meta), len(ops) - len(program.ops)


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (math.isnan(a) and math.isnan(b))
    return a == b


def _races(run) -> list:
    return [r._replace(first_op=0, second_op=0) for r in run.hazards.races]


@pytest.mark.parametrize("source", [custom_config(6), "dspark_fine.yaml", "eagle_fine.yaml",
                                    "sglang_default_prefill.yaml"])
def test_a_record_nothing_waits_on_at_no_cost_changes_nothing(source):
    cfg = load_config(source if isinstance(source, dict) else CONFIGS / source)
    base = load_config(cfg, {"steps": 60, "warmup_steps": 10})
    cands = space(cfg)
    for cand in random.Random(0).sample(cands, min(6, len(cands))):
        cc = candidate_config(base, cand.overrides)
        program = build_program(cc, resolve_sizes(cc))
        ref = fast.run(program)
        extra, added = _unwaited(program, 0.0)
        assert added > 0
        got = fast.run(extra)
        assert list(got.columns) == list(ref.columns)
        for name, col in ref.columns.items():
            assert np.array_equal(got.columns[name], col, equal_nan=col.dtype.kind == "f"), name
        assert list(got.summary) == list(ref.summary)
        for key, value in ref.summary.items():
            assert _same(got.summary[key], value), (cand.description, key)
        assert _races(got) == _races(ref), cand.description
        costly = fast.run(_unwaited(program, 1.0)[0])
        assert any(not _same(costly.summary[k], v) for k, v in ref.summary.items())
