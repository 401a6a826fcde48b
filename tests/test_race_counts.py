"""The races' counts of a one-pass run, taken over all its rows at once, are those of each row.

:meth:`simwar.executors.fast.races.FastHazards.counts` (the summary's races, overlaps and race
steps) counts every row's part within the steps at once; held here against the rows counted
one by one (each row's races within the steps, ``_Rows.within``, as the engine's list has
them) on runs with latent races and observed overlaps, for windows of steps that cut rows at
either end, hold none, or run past the run.
"""

from __future__ import annotations

import itertools

import pytest
from custom_phases import custom_config

from simwar.api import resolve_sizes
from simwar.config import load_config
from simwar.executors import fast


def by_rows(hazards, first: int, last: int | None) -> tuple[int, int, int]:
    races = overlaps = 0
    steps: set[int] = set()
    for row in hazards.rows:
        row = row.within(first, last)
        if row is None:
            continue
        if row.pair.latent:
            races += len(row)
            steps.update(range(row.b_step, row.b_step + len(row)))
        overlaps += sum(1 for x in row.overlap.tolist() if x > 0)
    return races, overlaps, len(steps)


@pytest.mark.parametrize("overrides", [
    {"policy.publish_phase": "p1", "phases.p1.read_ends": "post_replay"},
    {"policy.publish_phase": "p0", "phases.p0.read_ends": "pre_replay"},
    {"policy.barrier": "none"}])
def test_counts_over_all_rows_are_the_rows_counts(overrides):
    cfg = load_config(custom_config(4), overrides)
    run = fast.run_config(cfg, resolve_sizes(cfg))
    hz = run.hazards
    assert hz.rows and any(len(r.overlap) > 1 for r in hz.rows)
    got = {}
    for first, last in itertools.product([0, 1, 7, 30, 58, 59, 60, 500], [None, 0, 5, 31, 59, 61]):
        got[(first, last)] = hz.counts(first, last)
        assert got[(first, last)] == by_rows(hz, first, last), (first, last)
    assert any(c[0] for c in got.values())  # some windows hold races
    if overrides.get("policy.barrier") == "none":
        assert any(c[1] for c in got.values())  # and overlaps
