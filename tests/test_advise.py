"""``simwar advise``: the policy search finds by itself what SGLang's PRs found by hand.

The acceptance cases screen with 60 steps (warm-up 10) instead of the default 200 to keep
the suite fast: the shipped configs are deterministic, so their steady state is reached
within a few steps; the advised and the input figures are re-run at full length anyway.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simwar.api import simulate
from simwar.cli.app import main
from simwar.config import load_config
from simwar.study.advise import AdviseError, advise, space

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "configs"
FAST = {"screen_steps": 60, "screen_warmup": 10}


@pytest.fixture(scope="module")
def step_time():
    cache: dict = {}

    def get(name: str) -> float:
        if name not in cache:
            cache[name] = simulate(CONFIGS / f"{name}.yaml").summary["step_us_mean"]
        return cache[name]

    return get


def _never_advises_racy_or_unsafe(a):
    assert a.best is not None and a.best.races == 0 and not a.best.racy
    assert a.best.knobs.barrier != "none"
    assert a.best.confirmed is not None and a.best.confirmed["races"] == 0
    racy = [c for c in a.candidates if c.racy]
    assert racy and all(c is not a.best for c in racy)  # racy ones are reported
    assert any(c.knobs.barrier == "none" for c in a.candidates)  # none is simulated


def test_dspark_before_34816_publishes_at_the_verify_graphs_in_graph_node(step_time):
    a = advise(CONFIGS / "dspark_before_34816.yaml", **FAST)
    _never_advises_racy_or_unsafe(a)
    assert not a.baseline.racy
    # what #34816 did: verify publishes read-done at its in-graph node, nothing else changes
    assert a.best.overrides == {"phases.verify.read_ends": "in_replay"}
    assert a.best.knobs.barrier == "fine" and a.best.knobs.placement == "after_launch"
    assert a.best.summary["publish_phase"] == "verify"
    assert a.best.summary["publish_position"] == "in_replay"
    assert any("in-graph event record node in verify's graph" in n for n in a.best.needs)
    assert a.best.confirmed["step_us_mean"] == step_time("dspark_fine")
    assert a.baseline.confirmed["step_us_mean"] == step_time("dspark_before_34816")
    assert a.saving_us == pytest.approx(step_time("dspark_before_34816")
                                        - step_time("dspark_fine"))
    assert a.config_diff() == "phases:\n- {name: verify, read_ends: in_replay}"


def test_dflash_legacy_host_sync_drops_the_sync_for_the_fine_barrier(step_time):
    a = advise(CONFIGS / "dflash_legacy_host_sync.yaml", **FAST)
    _never_advises_racy_or_unsafe(a)
    assert a.baseline.racy  # the legacy loop leaves the result-processing writes unordered
    # what #29541/#29556 did: no host sync, the fine barrier after the launch
    assert a.best.knobs.barrier == "fine" and a.best.knobs.placement == "after_launch"
    assert a.best.overrides["policy.barrier"] == "fine"
    assert any("drop the host-blocking read-done synchronize" in n for n in a.best.needs)
    assert a.best.confirmed["step_us_mean"] == step_time("dflash_fine")
    assert a.best.confirmed["cpu_blocked_verify_done_us_mean"] == 0.0
    # a host_sync variant is as fast here (the CPU has slack) but blocks the CPU: ranked below
    tied = [c for c in a.candidates if c.knobs.barrier == "host_sync" and not c.racy
            and c.summary["step_us_mean"] == a.best.summary["step_us_mean"]]
    assert tied and all(c.summary["launch_lead_us_mean"] < a.best.summary["launch_lead_us_mean"]
                        for c in tied)


def test_eagle_publish_verify_is_flagged_and_a_race_free_policy_advised(step_time):
    a = advise(CONFIGS / "eagle_publish_verify.yaml", **FAST)
    _never_advises_racy_or_unsafe(a)
    assert a.baseline.racy and a.baseline.races > 0
    assert a.best.confirmed["step_us_mean"] <= step_time("eagle_fine")
    # the last reader (draft_extend) publishes, in its graph
    assert a.best.summary["publish_phase"] == "draft_extend"
    assert a.to_dict()["baseline"]["racy"] is True


def test_advised_set_items_reproduce_the_step_time_with_simwar_run(capsys, tmp_path):
    cfg = str(CONFIGS / "dspark_before_34816.yaml")
    assert main(["advise", cfg, "--json", "--screen-steps", "60", "--no-progress",
                 "--set", "steps=400", "-o", str(tmp_path / "best.yaml")]) == 0
    d = json.loads(capsys.readouterr().out)
    assert set(d) >= {"baseline", "candidates", "best"}
    best = d["best"]
    assert best["races"] == 0 and best["saving_us"] == pytest.approx(356.0)
    assert set(best["policy"]) >= {"barrier", "placement", "plan_stream", "needs_cpu_seq_lens",
                                   "publish_phase", "publish_position"}
    assert d["baseline"]["step_us_mean"] - best["step_us_mean"] == pytest.approx(
        best["saving_us"])
    assert len(d["candidates"]) == len(space(load_config(cfg)))
    argv = ["run", cfg, "--set", "steps=400", "--json"]
    for item in best["set"]:
        argv += ["--set", item]
    assert main(argv) == 0
    ran = json.loads(capsys.readouterr().out)
    assert ran["step_us_mean"] == best["step_us_mean"] and ran["races"] == 0
    # the written config runs to the same figure
    assert main(["run", str(tmp_path / "best.yaml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_us_mean"] == best["step_us_mean"]


def test_text_output_names_the_change_and_how_to_run_it(capsys):
    assert main(["advise", str(CONFIGS / "dspark_before_34816.yaml"), "--screen-steps", "40",
                 "--set", "steps=200", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "advised: fine, read-done at verify's in-graph node, after_launch" in out
    assert "--set steps=200 --set phases.verify.read_ends=in_replay" in out
    assert "racy:" in out and "never advised" in out


def test_the_space():
    cands = space(load_config(CONFIGS / "dspark_fine_no_external_events.yaml"))
    # no external events: no in-graph node, so no in_replay publish of a graph phase
    assert all(c.knobs.publish is None or c.knobs.publish[1] != "in_replay"
               for c in cands)
    cands = space(load_config(CONFIGS / "eagle_fine.yaml"))
    assert not cands[0].overrides  # the input itself is a candidate, first
    keys = [tuple(sorted(c.overrides.items())) for c in cands]
    assert len(keys) == len(set(keys))
    # the CPU seq_lens mirror is only ever removed, never added
    assert all(not c.knobs.needs_cpu_seq_lens for c in cands)
    with_mirror = space(load_config(CONFIGS / "eagle_fine.yaml",
                                    {"policy.needs_cpu_seq_lens": True}))
    assert {c.knobs.needs_cpu_seq_lens for c in with_mirror} == {True, False}
    # coarse and none do not depend on the publish point: listed once per placement/stream
    coarse = [c for c in cands if c.knobs.barrier == "coarse"]
    assert len(coarse) == 4 and all(c.knobs.publish is None for c in coarse)


def test_other_objectives():
    a = advise(CONFIGS / "dspark_coarse.yaml", "tokens_per_s", screen_steps=40,
               screen_warmup=5, confirm=False)
    assert a.best.summary["tokens_per_s"] == max(c.summary["tokens_per_s"]
                                                 for c in a.candidates if not c.racy)
    a = advise(CONFIGS / "dspark_coarse.yaml", "p99", screen_steps=40, screen_warmup=5,
               confirm=False)
    assert a.best.summary["step_us_p99"] == 5840.0


@pytest.mark.parametrize("argv, fragment", [
    (["advise", "{cfg}", "--objective", "fastest"], "--objective fastest: not known"),
    (["advise", "nope.yaml"], "nope.yaml: file not found"),
])
def test_advise_errors_are_one_line(capsys, tmp_path, argv, fragment):
    argv = [a.format(cfg=CONFIGS / "dspark_fine.yaml") for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert fragment in err and err.count("\n") == 1, err
    with pytest.raises(AdviseError, match="not known"):
        advise(CONFIGS / "dspark_fine.yaml", "fastest")


NO_READS = ("name: noreads\nalgorithm: custom\nsteps: 200\nphases:\n"
            "  - {name: fwd, body_us: 5000}\n  - {name: sample, graph: eager, body_us: 100}\n")


def test_a_workload_that_reads_no_shared_buffer_is_advised_no_barrier(tmp_path, capsys):
    # fine has nothing published there and falls back to coarse (a 356 µs bubble); none has
    # no read to protect, is race-free and 356 µs faster: it is advised, not refused
    cfg = tmp_path / "noreads.yaml"
    cfg.write_text(NO_READS)
    a = advise(cfg, screen_steps=60, screen_warmup=5)
    assert a.baseline.summary["barrier_effective"] == "coarse"
    assert a.best.knobs.barrier == "none" and a.best.races == 0
    assert a.saving_us == pytest.approx(356.0)
    assert "no phase reads a shared buffer" in a.best.needs[0]
    assert main(["advise", str(cfg), "--no-progress", "--screen-steps", "60"]) == 0
    out = capsys.readouterr().out
    assert "  advised: none\n" in out and "--set policy.barrier=none" in out
    assert "unsafe policy" not in out


def test_none_is_still_never_advised_where_a_phase_reads():
    a = advise(CONFIGS / "dspark_none.yaml", screen_steps=40, screen_warmup=5, confirm=False)
    assert a.best is not None and a.best.knobs.barrier != "none"
    assert all(not c.safe_policy for c in a.candidates if c.knobs.barrier == "none")
