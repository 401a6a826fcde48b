"""A family of ``advise``'s candidates run on one compiled code gives each its own answers.

The candidates that differ only in where read-done is published run together
(:func:`simwar.executors.fast.run_family`): each block's code compiled once, as the union of
the members' shapes (:mod:`simwar.executors.fast.union`), each member run on it with its
own numbers. Held here: every member's summary, races and per-step table are those of its
own run (:func:`simwar.executors.fast.run_config`), bit for bit, on the shipped configs and
the benchmark's custom algorithm (whose families have host records, in-graph record nodes
and waits bound to either); the unions are made (the comparison is of the shared code, not
of a fallback to each member's own), and a member's flags, parameters and logs are its own
(a member run with another's numbers gives another answer).
"""

from __future__ import annotations

import random

import pytest
from advise_families import families
from custom_phases import custom_config

from simwar.api import Runner, resolve_sizes
from simwar.builder.moves import Family
from simwar.executors import fast
from simwar.executors.fast import codegen, union
from simwar.executors.fast.plan import plan_config
from simwar.executors.fast.races import RacePlan

SHORT = {"steps": 60, "warmup_steps": 10}


def _families(source) -> list[list]:
    return families(source, SHORT)


def _races(run) -> list:
    return list(run.hazards.races)


@pytest.mark.parametrize("source", [custom_config(5), "dspark_fine.yaml", "eagle_fine.yaml",
                                    "dspark_fine_no_external_events.yaml",
                                    "dspark_fine_bimodal.yaml", "dflash_legacy_host_sync.yaml"],
                         ids=lambda s: s if isinstance(s, str) else s["name"])
def test_a_family_run_together_gives_each_member_its_own_run(source, monkeypatch):
    made = []
    real = union.block_union
    monkeypatch.setattr(union, "block_union", lambda *a: made.append(real(*a)) or made[-1])
    for members in _families(source):
        sizes = [resolve_sizes(c) for c in members]
        got = fast.run_family(members, sizes, summary_only=True, family=Family())
        for cfg, sz, run in zip(members, sizes, got):
            ref = fast.run_config(cfg, sz, summary_only=True)
            # (repr: a mean of no requests is NaN in both, which == would call different)
            # (the screen's runs: the races counted in the summary)
            assert repr(run.summary) == repr(ref.summary), cfg.policy
    if isinstance(source, dict):  # its families' blocks are unions, none refused
        assert made and all(u is not None for u in made)
        assert any(u.guards for u in made)


def test_the_per_step_table_and_the_races_are_each_members_own():
    members = max(_families(custom_config(4)), key=len)
    members = random.Random(0).sample(members, 6)
    sizes = [resolve_sizes(c) for c in members]
    got = fast.run_family(members, sizes)
    for cfg, sz, run in zip(members, sizes, got):
        ref = fast.run_config(cfg, sz)
        assert run.columns.keys() == ref.columns.keys()
        for name, col in ref.columns.items():
            assert repr(list(run.columns[name])) == repr(list(col)), name
        assert _races(run) == _races(ref) and repr(run.summary) == repr(ref.summary)


def test_a_member_run_on_the_union_with_anothers_numbers_answers_as_the_other():
    members = max(_families(custom_config(4)), key=len)
    plans = [plan_config(c, resolve_sizes(c)) for c in members]
    races = [RacePlan(p, 2) for p in plans]
    unions = union.family_codes(plans, [[r.logs_of(b) for b in range(len(p.blocks))]
                                        for p, r in zip(plans, races)])
    assert unions is not None and all(u is not None for u in unions)
    steady = max(range(len(unions)), key=lambda b: plans[0].blocks[b].n)
    u = unions[steady]
    # the flags differ between members: each runs its own ops of the union
    flags = {u.maps[m][2] for m in range(len(members))}
    assert len(flags) == len(members)
    # one code for the family's block: compiled once, whoever runs it
    before = len(codegen._CODE)
    fast.run_family(members, [resolve_sizes(c) for c in members], summary_only=True)
    assert len(codegen._CODE) - before <= len(unions)
    # the union's numbers for a member are its own: another's give the other's answer
    a, b = 0, len(members) - 1
    assert u.consts(a, plans[a].blocks[steady].consts) != u.consts(
        b, plans[b].blocks[steady].consts)


def test_a_runner_runs_a_family_as_it_runs_each_member():
    members = max(_families("eagle_fine.yaml"), key=len)
    runner = Runner(members[0], "fast")
    together = runner.run_family(members, Family())
    for cfg, res in zip(members, together):
        assert repr(res.summary) == repr(runner.run(cfg).summary)
