"""``advise``'s screen: what it spares each candidate leaves every answer as it was.

A candidate's config is copied, not validated again (equal to ``load_config``'s for every
candidate of the shipped configs); its run is one ``simwar.api.Runner``'s of the screen's
config (equal to ``simulate``'s); blocks an earlier candidate compiled are reused (the
codegen cache is hit, the summaries unchanged); and worker processes rank the candidates
exactly as one process does.
"""

from __future__ import annotations

from collections import OrderedDict
from pathlib import Path

import pytest

from simwar.api import Runner, resolve_sizes, simulate
from simwar.builder.loop import plan_iterations
from simwar.builder.moves import Family, moved_iterations
from simwar.builder.sizes import draw_sizes
from simwar.config import load_config
from simwar.executors.fast import codegen
from simwar.executors.fast.plan import plan_config
from simwar.study import advise as advise_module
from simwar.study.advise import advise, candidate_config, screen, space

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
SHORT = {"steps": 60, "warmup_steps": 10}


def _custom(phases: int) -> dict:
    """``benchmarks/bench_advise.py``'s config: graph kinds in turn, each phase reads."""
    return {"name": f"custom-{phases}", "algorithm": "custom", "steps": 200,
            "policy": {"barrier": "fine"},
            "phases": [{"name": f"p{i}", "graph": ("full", "eager", "breakable")[i % 3],
                        "body_us": 1000.0, "reads": ["req_to_token"],
                        "read_ends": "post_replay" if i == phases - 1 else "unknown"}
                       for i in range(phases)]}


@pytest.mark.parametrize("source", [*sorted(CONFIGS.glob("*.yaml")), _custom(4)],
                         ids=lambda s: s.stem if isinstance(s, Path) else s["name"])
def test_a_candidates_config_is_the_one_load_config_gives(source):
    base = load_config(load_config(source), SHORT)
    for cand in space(base):
        copied = candidate_config(base, cand.overrides)
        loaded = load_config(base, cand.overrides)
        assert copied == loaded, cand.description
        assert copied.model_dump_json() == loaded.model_dump_json(), cand.description
        assert copied.model_fields_set == loaded.model_fields_set
    # a key the candidates never carry is validated as usual
    assert candidate_config(base, {"steps": 61}) == load_config(base, {"steps": 61})


def test_the_screen_gives_simulates_summaries_and_reuses_compiled_blocks(monkeypatch):
    cfg = load_config(_custom(4))
    cands = space(cfg)
    # fine and host_sync with one publish point and the barrier at the loop's top: their
    # first iteration is one shape (no barrier has run yet at step 0)
    pair = [c for c in cands if c.knobs.placement == "loop_top" and not c.knobs.plan_stream
            and c.knobs.publish == ("p1", "pre_replay")
            and c.knobs.barrier in ("fine", "host_sync")]
    assert len(pair) == 2
    generated = []
    real = codegen._generate
    monkeypatch.setattr(codegen, "_CODE", OrderedDict())  # a cold cache, this test's own
    monkeypatch.setattr(codegen, "_generate",
                        lambda shape, *a, **k: generated.append(shape) or real(shape, *a, **k))
    screen(cfg, pair, SHORT["steps"], SHORT["warmup_steps"])
    short = load_config(cfg, SHORT)
    shapes = [[b.shape for b in plan_config(run, draw_sizes(run)).blocks]
              for run in (candidate_config(short, c.overrides) for c in pair)]
    assert shapes[0][0] == shapes[1][0]  # the first iteration: one shape
    distinct = set(shapes[0] + shapes[1])
    assert len(generated) == len(distinct) < len(shapes[0]) + len(shapes[1])
    for c in pair:
        ref = simulate(load_config(cfg, {**c.overrides, **SHORT}), engine="fast").summary
        assert c.summary == ref and c.summary["races"] == ref["races"]
    # every candidate, in the screen's order (the one that puts the sharing pairs together)
    screen(cfg, cands, SHORT["steps"], SHORT["warmup_steps"])
    for c in cands:
        assert c.summary == simulate(load_config(cfg, {**c.overrides, **SHORT}),
                                     engine="fast").summary, c.description


def test_one_runner_runs_each_variant_as_simulate_does():
    # the screen's Runner: the memory check and the executor chosen once for the base config
    base = load_config(load_config(_custom(3)), SHORT)
    runner = Runner(base, "fast")
    for cand in space(base)[::7]:
        variant = candidate_config(base, cand.overrides)
        assert runner.run(variant).summary == simulate(variant, engine="fast").summary
    assert runner.run().summary == simulate(base, engine="fast").summary
    # a variant of another size would escape the check and the choice made for the base
    with pytest.raises(ValueError, match="keeps the config's steps"):
        runner.run(load_config(base, {"steps": 61}))
    # the choice reads the shapes the scheduling picks from: kept too (another bound on
    # consecutive prefill steps picks from the same shapes, and is run)
    shaped = load_config(CONFIGS / "sglang_default_prefill.yaml", {"steps": 50})
    with pytest.raises(ValueError, match="keeps the config's scheduling"):
        Runner(shaped, "fast").run(load_config(shaped, {"scheduling.rule": "sglang_mixed"}))
    bounded = load_config(shaped, {"scheduling.max_consecutive_prefill": 2})
    # (repr: a mean of no requests is NaN in both, which == would call different)
    assert repr(Runner(shaped, "fast").run(bounded).summary) == repr(simulate(bounded).summary)


def test_two_worker_processes_rank_the_candidates_bit_for_bit(monkeypatch):
    pools = []
    real = advise_module._pool

    def counted(workers, base):
        pools.append(workers)
        return real(workers, base)

    monkeypatch.setattr(advise_module, "_pool", counted)
    monkeypatch.setattr(advise_module, "ALONE_S", 0.0)  # hand every candidate left to them
    kw = {"screen_steps": 60, "screen_warmup": 10, "confirm": False}
    alone = advise(CONFIGS / "dspark_before_34816.yaml", jobs=1, **kw)
    assert pools == []
    together = advise(CONFIGS / "dspark_before_34816.yaml", jobs=2, **kw)
    assert pools == [2]
    assert together.to_dict() == alone.to_dict()
    assert [c.summary for c in together.candidates] == [c.summary for c in alone.candidates]
    with pytest.raises(advise_module.AdviseError, match="jobs: expected 0 .one per core."):
        advise(CONFIGS / "dspark_fine.yaml", jobs=-1, **kw)


def test_a_candidate_shares_the_phase_models_of_the_phases_it_keeps():
    # a phase's model is made once per resolved phase dict: a candidate that moves one
    # phase's read_ends has a new model for that phase only, each equal to a fresh one
    from simwar.config.phases import Phase

    cfg = load_config(_custom(4))
    cand = candidate_config(cfg, {"phases.p1.read_ends": "pre_replay",
                                  "policy.barrier": "coarse"})
    base, moved = cfg.phase_table(), cand.phase_table()
    assert base is not cfg.phase_table() and base == cfg.phase_table()  # a new list each call
    assert [a is b for a, b in zip(base, moved)] == [True, False, True, True]
    assert moved[1].read_ends == "pre_replay" and base[1].read_ends == "unknown"
    assert moved == [Phase(**p) for p in cand.phases]
    # a config validated again has dicts of its own, so models of its own
    again = load_config(cfg)
    assert not any(a is b for a, b in zip(base, load_config(again, {"seed": 2}).phase_table()))


@pytest.mark.parametrize("source", ["eagle_fine.yaml", "dflash_legacy_host_sync.yaml",
                                    "none_fine_pre_replay_fallback.yaml", _custom(5)],
                         ids=lambda s: s if isinstance(s, str) else s["name"])
def test_a_family_members_iterations_moved_are_the_ones_its_build_gives(source):
    """The candidates that differ only in where read-done is published: each one's
    iterations, its record moved from the family's first, equal its own build's (the ops,
    their draws and the meta); where moving does not apply (an in-graph record, a drawn
    cost), :func:`moved_iterations` says so and the member is built."""
    base = load_config(load_config(source if isinstance(source, dict) else CONFIGS / source),
                       SHORT)
    families: dict = {}
    moved = 0
    for cand in space(base):
        cfg = candidate_config(base, cand.overrides)
        pol = cfg.policy
        family = families.setdefault(
            (pol.barrier, pol.placement, pol.plan_stream, pol.needs_cpu_seq_lens), Family())
        sizes = resolve_sizes(cfg)
        ref = plan_iterations(cfg, sizes)
        if family.base is not None:
            its = moved_iterations(family.base, cfg)
            if its is not None:
                moved += 1
                member = (family.base, cfg)
                assert its.ops == ref.ops, cand.description
                assert (its.uses, its.contexts, its.meta) == (ref.uses, ref.contexts, ref.meta)
                assert its.phases == ref.phases and its.cfg is cfg
        got = family.iterations(cfg, sizes)
        assert got.ops == ref.ops and got.meta == ref.meta, cand.description
    assert moved > 0
    # a config that differs in anything else is not a member
    family_base, cfg = member
    other = load_config(cfg, {"costs.event_record_us": 3.0})
    assert moved_iterations(family_base, other) is None
