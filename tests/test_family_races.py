"""A family's race windows from one pass over its union are each member's own.

:mod:`simwar.executors.fast.famraces` finds the race windows of a family of ``advise``'s
candidates (those that differ only in where read-done is published) in one pass over the
unions of their blocks, every member's vector clocks side by side. Held here: each member's
race plan so made (its windows, the pairs of each and the op times it logs) equals the one
its own pass makes, for every family of shipped configs and of custom algorithms (host
records, in-graph record nodes, waits bound to either); and the family's pass is taken
there (the comparison is not of a fallback to each member's own).
"""

from __future__ import annotations

import pytest
from advise_families import families
from custom_phases import custom_config

from simwar.api import resolve_sizes
from simwar.builder.moves import Family
from simwar.executors import fast
from simwar.executors.fast import races
from simwar.executors.fast.famraces import family_race_plans, family_windows
from simwar.executors.fast.union import family_codes

SHORT = {"steps": 40, "warmup_steps": 5}


def _families(source) -> list[list]:
    return families(source, SHORT)


@pytest.mark.parametrize("source", [custom_config(5), custom_config(7), "dspark_fine.yaml",
                                    "eagle_fine.yaml", "dspark_fine_no_external_events.yaml",
                                    "dspark_fine_bimodal.yaml", "dflash_legacy_host_sync.yaml",
                                    "dspark_before_34816.yaml",
                                    "none_fine_pre_replay_fallback.yaml",
                                    "eagle_fine_draft_extend_post_replay.yaml"],
                         ids=lambda s: s if isinstance(s, str) else s["name"])
def test_each_members_race_plan_is_its_own(source):
    derived = 0
    for members in _families(source):
        if len(members) < 2:
            continue
        family = Family()
        plans = [fast._plan(c, resolve_sizes(c), family) for c in members]
        unions = family_codes(plans)
        if unions is not None and family_windows(plans, unions, 2) is not None:
            derived += 1
        got = family_race_plans(plans, unions, 2)
        races._WINDOWS.clear()  # each member's own pass, not a cached window
        for plan, mine in zip(plans, got):
            own = races.RacePlan(plan, 2)
            assert mine.windowed == own.windowed
            assert mine.groups == own.groups
            assert mine.logs == own.logs
    if isinstance(source, dict):
        assert derived
