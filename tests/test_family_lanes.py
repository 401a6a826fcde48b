"""A family's members as lanes of one lockstep pass give each its own run, bit for bit.

:func:`simwar.executors.lockstep.family.run_family` runs the members of an ``advise``
family (candidates that differ only in where read-done is published) side by side on the
array target of their blocks' unions, each guarded op kept only in the lanes of the
members that have it. Held here: every member's per-step table, races and summary are
those of its own run (:func:`simwar.executors.fast.run_config`), for every family of
shipped configs and of custom algorithms (host records, in-graph record nodes, waits and
syncs bound to either); the lanes are taken there (the comparison is not of a fallback);
and a family they cannot take runs one by one with the same answers.
"""

from __future__ import annotations

import pytest
from advise_families import families
from custom_phases import custom_config

from simwar.api import Runner, resolve_sizes
from simwar.builder.moves import Family
from simwar.executors import fast
from simwar.executors.lockstep import family as lanes

SHORT = {"steps": 50, "warmup_steps": 8}


def _families(source) -> list[list]:
    return families(source, SHORT)


def _same(run, ref) -> None:
    assert run.columns.keys() == ref.columns.keys()
    for name, col in ref.columns.items():
        assert repr(list(run.columns[name])) == repr(list(col)), name
    assert list(run.hazards.races) == list(ref.hazards.races)
    # (repr: a mean of no requests is NaN in both, which == would call different)
    assert repr(run.summary) == repr(ref.summary)


@pytest.mark.parametrize("source", [custom_config(4), custom_config(6), "dspark_fine.yaml",
                                    "eagle_fine.yaml", "dspark_fine_no_external_events.yaml",
                                    "dflash_legacy_host_sync.yaml", "dspark_before_34816.yaml",
                                    "none_fine_pre_replay_fallback.yaml",
                                    "eagle_fine_draft_extend_post_replay.yaml",
                                    "dspark_fine_bimodal.yaml"],
                         ids=lambda s: s if isinstance(s, str) else s["name"])
def test_each_lane_is_its_members_own_run(source, monkeypatch):
    monkeypatch.setattr(lanes, "LANES_MIN", 2)  # these families are small: lanes all the same
    ran = []
    real = lanes._lanes
    monkeypatch.setattr(lanes, "_lanes", lambda *a: ran.append(len(a[0])) or real(*a))
    for members in _families(source):
        sizes = [resolve_sizes(c) for c in members]
        got = lanes.run_family(members, sizes, family=Family())
        for cfg, sz, run in zip(members, sizes, got):
            _same(run, fast.run_config(cfg, sz))
    if isinstance(source, dict):  # its families run as lanes, none refused
        assert ran


def test_lanes_taken_for_the_custom_algorithms_families():
    merged = {"wait_event": 0, "sync": 0}
    for members in _families(custom_config(5)):
        if len(members) < 2:
            continue
        plans, unions, races = fast.family_plans(members, [resolve_sizes(c) for c in members])
        assert len(lanes._lanes(plans, unions, races)) == len(members)
        for u in unions:
            for hi, _ in u.merged:
                merged[u.shape.host[hi].kind] += 1
    # the waits of the barrier, each member's bound to its own read-done, run as one wait,
    # and so do the host syncs on it (the tests above hold each lane its member's own run
    # with them)
    assert merged["wait_event"] and merged["sync"]


def test_a_runner_runs_a_family_as_it_runs_each_member(monkeypatch):
    monkeypatch.setattr(lanes, "LANES_MIN", 2)
    members = max(_families(custom_config(5)), key=len)
    runner = Runner(members[0], "fast")
    together = runner.run_family(members, Family())
    for cfg, res in zip(members, together):
        assert repr(res.summary) == repr(runner.run(cfg).summary)


def test_a_family_of_fewer_members_than_lanes_take_runs_one_by_one(monkeypatch):
    members = max(_families(custom_config(4)), key=len)
    assert len(members) < lanes.LANES_MIN
    monkeypatch.setattr(lanes, "_lanes", lambda *a: pytest.fail("lanes for a small family"))
    sizes = [resolve_sizes(c) for c in members]
    for cfg, sz, run in zip(members, sizes, lanes.run_family(members, sizes)):
        _same(run, fast.run_config(cfg, sz))


@pytest.mark.parametrize("source", [custom_config(6), "eagle_fine.yaml",
                                    "dflash_legacy_host_sync.yaml"],
                         ids=lambda s: s if isinstance(s, str) else s["name"])
def test_the_races_counted_over_the_lanes_are_each_members_counts(source, monkeypatch):
    # the counts of a family's lanes come from the family's race pass and the union's logs
    # (lanes._LaneRaces), not from each member's race plan: over any steps, they are its own
    monkeypatch.setattr(lanes, "LANES_MIN", 2)
    counted = []
    real = lanes._LaneRaces
    monkeypatch.setattr(lanes, "_LaneRaces", lambda *a: counted.append(real(*a)) or counted[-1])
    for members in _families(source):
        sizes = [resolve_sizes(c) for c in members]
        got = lanes.run_family(members, sizes, family=Family())
        for cfg, sz, run in zip(members, sizes, got):
            ref = fast.run_config(cfg, sz).hazards
            for first, last in [(0, None), (5, 30), (12, 12), (40, 49), (8, 49)]:
                assert run.hazards.counts(first, last) == ref.counts(first, last)
    assert counted
