"""A family member's plan derived from its first's is the plan made from scratch.

``advise``'s screen plans the members of a family (candidates that differ only in where
read-done is published) from the family's first: their iterations are the first's with the
record moved (:mod:`simwar.builder.moves`), and each segment is the first's reading of the
ops that neither are nor bind to a record, spliced around the member's own records, waits
and syncs (:class:`simwar.executors.fast.plan.ShapeMemo`). Held here: on every candidate of
the shipped configs and of the benchmark's 50-phase custom algorithm, in the screen's order,
that plan equals :func:`~simwar.executors.fast.plan.plan_config` of the member alone, field
by field (the shapes, their device ops and records, every block's constants and columns,
the offsets, sites, sign and meta); and the splice is what made the members' plans (it is
not a fallback to reading each member's segments whole).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from custom_phases import custom_config

from simwar.builder.moves import Family
from simwar.builder.sizes import draw_sizes
from simwar.config import load_config
from simwar.executors.fast import _plan, shaper
from simwar.study import advise

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(p.name for p in (ROOT / "configs").glob("*.yaml") if not p.name.startswith("tp"))


def bench_config(phases: int) -> dict:
    """The benchmark's custom algorithm (benchmarks/bench_advise.py's ``config``)."""
    cfg = custom_config(phases)
    for p in cfg["phases"]:
        p["body_us"] = 5000.0 / phases
    return {**cfg, "steps": 2000}


def assert_same_plan(p, q) -> None:
    assert len(p.blocks) == len(q.blocks)
    for x, y in zip(p.blocks, q.blocks):
        assert x.shape == y.shape and x.shape.host == y.shape.host
        assert x.shape.ops == y.shape.ops and x.shape.records == y.shape.records
        assert x.shape.nparams == y.shape.nparams
        assert (x.g0, x.steps, x.marked, x.source) == (y.g0, y.steps, y.marked, y.source)
        assert repr(x.consts) == repr(y.consts)  # -0.0 and NaN as they are
        assert repr(x.columns(0, x.n)) == repr(y.columns(0, y.n))
    assert (p.lo, p.hi, p.negative, p.offsets, p.sites) == (q.lo, q.hi, q.negative, q.offsets,
                                                            q.sites)
    assert p.meta == q.meta and p.skeleton_steps == q.skeleton_steps
    assert p.skeleton_shapes == q.skeleton_shapes


def screened(source) -> list:
    """The candidates' configs at the screen's length, in the screen's order."""
    cfg = load_config(source if isinstance(source, dict) else ROOT / "configs" / source)
    base = load_config(cfg, {"steps": advise.SCREEN_STEPS, "warmup_steps": advise.SCREEN_WARMUP})
    cands = advise.space(cfg)
    return [advise.candidate_config(base, cands[i].overrides)
            for i in advise._screen_order(cands)]


def check_families(cfgs: list, every: int = 1) -> None:
    """Each family's members' plans (its first, then every ``every``-th) against their own."""
    for _, members in itertools.groupby(cfgs, key=lambda c: advise._family_key(c.policy)):
        family = Family()
        for cfg in itertools.islice(members, 0, None, every):
            sizes = draw_sizes(cfg)
            # (_plan: plan_config, or the Program's plan where the run does not settle)
            assert_same_plan(_plan(cfg, sizes, family), _plan(cfg, sizes, None))


@pytest.fixture
def spliced(monkeypatch) -> list:
    """What each splice of a member's segment gave (None: read whole)."""
    out: list = []
    real = shaper.ShapeMemo.splice
    monkeypatch.setattr(shaper.ShapeMemo, "splice", lambda *a: out.append(real(*a)) or out[-1])
    return out


@pytest.mark.parametrize("source", [*SHIPPED, custom_config(5)],
                         ids=lambda s: s if isinstance(s, str) else s["name"])
def test_a_members_plan_from_its_firsts_is_its_own(source, spliced):
    check_families(screened(source))
    if isinstance(source, dict):  # families with host records: members spliced
        assert any(s is not None for s in spliced)


@pytest.mark.slow
def test_the_benchmarks_members_plans_are_their_own(spliced):
    # every family of the 50-phase custom algorithm, its first and every 4th member (each
    # member's plan depends only on its first's: the others are the same kind of move)
    check_families(screened(bench_config(50)), every=4)
    assert sum(s is not None for s in spliced) > 1000  # ~2,000 segments, most spliced
