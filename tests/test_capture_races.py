"""Latent races of a capture: the H200 mini-server's four race captures, synthetic captures of
every shipped config, and the happens-before facts a capture adds.

- The four captures of ``python -m lab.server --suite races`` (tests/data/server):
  no barrier and the planted bug of the vLLM kind (read-done recorded after the draft graph,
  before verify's gather) race, the fine and coarse barriers do not, with the preset alone and
  with the kernel-level mapping beside them; where the accesses overlapped in time they are the
  steps the server's own stamp check saw racy.
- A simulated run of every shipped config written as a Kineto capture
  (:func:`simwar.capture.synthetic.write_kineto`) and read back gives exactly the simulator's
  latent races, with record correlation ids; without them (as PyTorch 2.11 writes), wherever
  :mod:`simwar.capture.binding` recovers every edge the simulator had (all but two configs,
  whose two events used in turn leave a record ambiguous; see ``BINDING_LIMITS``).
- With no facts, :func:`simwar.analysis.happens_before.latent_races` is
  :func:`simwar.analysis.hazards.detect`; each fact orders what it should: a second host
  thread, a blocking copy, a device synchronize, an in-graph node.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from simwar.analysis.happens_before import Accesses, HbFacts, latent_races
from simwar.analysis.hazards import candidate_pairs, detect
from simwar.api import simulate
from simwar.capture.accesses import capture_races
from simwar.capture.mapping import load_mapping
from simwar.capture.open import open_capture
from simwar.capture.presets import map_capture
from simwar.capture.synthetic import Style, write_kineto
from simwar.capture.to_trace import import_kineto
from simwar.cli.app import main
from simwar.config import ConfigError, load_config
from simwar.core.program import (
    GraphLaunch,
    GraphRecord,
    Kernel,
    Launch,
    Program,
    StepMarker,
    Synchronize,
    WaitEvent,
)
from simwar.core.trace import Mode, OpKind
from simwar.executors.engine import run

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "tests" / "data" / "server"
MAPPING = SERVER / "races.mapping.yaml"
CASES = ("none", "fine", "coarse", "planted")


@pytest.fixture(scope="module")
def server():
    """Each race capture, imported once with the preset, and its races under the preset and
    under the kernel-level mapping (the same names: the file starts from the preset)."""
    out = {}
    for case in CASES:
        cap = open_capture(SERVER / f"races_{case}.kineto.json.gz")
        imp, preset = cap.bound, cap.mapping
        names = [a[0] for a in imp.annotations]
        kernels = imp.device_names
        kernel_map = map_capture(None, MAPPING, names, kernels)
        out[case] = (imp, capture_races(imp, preset, "preset sglang"),
                     capture_races(imp, kernel_map, str(MAPPING)))
    return out


def _racy(case: str, which: str) -> set[int]:
    steps = json.load(gzip.open(SERVER / f"races_{case}.metrics.json.gz"))["steps"]
    return {k for k, v in enumerate(steps[f"racy_{which}"]) if v}


# --------------------------------------------------------------------------- the H200 captures
@pytest.mark.parametrize("case", CASES)
def test_the_server_captures_race_exactly_without_a_barrier_and_with_the_planted_bug(server,
                                                                                     case):
    imp, by_preset, by_kernel = server[case]
    racy = case in ("none", "planted")
    for races in (by_preset, by_kernel):
        assert bool(races.latent) == racy, (case, len(races.latent))
        assert races.accesses.count(Mode.WRITE) and races.accesses.count(Mode.READ)
        assert {r.buffer for r in races.latent} <= {"req_to_token"}
    # the kernels the mapping names: every ordered pair kept apart in time too
    assert by_kernel.summary()["ordered_overlaps"] == 0
    if case == "fine":  # the verify graph's in-graph read-done node, after its gather
        assert len(by_kernel.facts.node_after) == 59
        assert by_preset.summary()["ordered_overlaps"] > 0  # every verify op taken for a read


def test_the_planted_bug_races_on_verify_only_and_names_the_early_record(server):
    imp, _, races = server["planted"]
    latent = races.latent
    assert {(races.name_of(r.first_op), races.name_of(r.second_op)) for r in latent} == {
        ("verify", "scheduler.prepare_for_decode")}
    assert {r.second_step - r.first_step for r in latent} == {1}
    assert len(latent) == 58 == len(races.steps())
    # the schedule stream's write follows the forward only up to the record after draft
    from simwar.analysis.happens_before import race_groups

    (group,) = race_groups(imp.trace, races.report, name_of=races.name_of)
    (words, n), = group["edges"]
    assert n == 58
    assert words == ("stream49's write of step k+1 is ordered after nothing that follows "
                     "verify's read of step k on stream53: the latest of stream53's work it "
                     "follows is an event record of step k, after draft: memcpy32_post of step k")
    # the server's stamp check saw step 50 racy: its accesses overlapped in time there
    assert _racy("planted", "verify") <= {r.first_step for r in latent if r.observed}


def test_without_a_barrier_the_overlaps_are_the_steps_the_stamp_check_saw(server):
    _, _, races = server["none"]
    by = {"draft": set(), "verify": set(), "prefill": set()}
    for r in races.latent:
        by[races.name_of(r.first_op)].add(r.first_step)
    assert by["draft"] and by["verify"] and by["prefill"]
    for which in ("draft", "verify"):
        seen = {r.first_step for r in races.latent if r.observed
                and races.name_of(r.first_op) == which}
        assert seen == _racy("none", which)


def test_hidden_host_syncs_are_blocking_copies():
    cap = open_capture(SERVER / "hostsync_medium.kineto.json.gz")
    imp = cap.bound
    races = capture_races(imp, cap.mapping)
    assert len(races.facts.blocking) == 120
    assert {imp.device_info[o].copy for o in races.facts.blocking} == {
        "DtoH (Device -> Pageable)"}
    assert not races.latent  # the fine barrier


# --------------------------------------------------------------------------- the CLI
def test_the_cli_fails_on_race_lists_pairs_and_prints_json(capsys):
    planted = str(SERVER / "races_planted.kineto.json.gz")
    fine = str(SERVER / "races_fine.kineto.json.gz")
    assert main(["races", planted, "--mapping", str(MAPPING), "--fail-on-race"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("races_planted.kineto.json.gz: 58 latent, ")
    assert "    missing edge      stream49 (schedule)'s write of step k+1 is ordered after " \
           "nothing that follows verify's read of step k on stream53 (forward)" in out
    assert main(["races", planted, "--mapping", str(MAPPING)]) == 0  # no --fail-on-race
    capsys.readouterr()
    assert main(["races", fine, "--mapping", str(MAPPING), "--fail-on-race", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["summary"]["latent"] == 0 and data["pairs"] == [] and data["races"] == []
    assert data["summary"]["writes"] == 60 and data["summary"]["reads"] == 238
    assert main(["races", planted, "--mapping", str(MAPPING), "--json", "--pairs"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["pairs"]) == 58
    p = data["pairs"][0]
    assert (p["first"]["access"], p["second"]["access"], p["buffer"]) == ("read", "write",
                                                                           "req_to_token")
    assert p["first"]["stream"] == "stream53" and p["second"]["stream"] == "stream49"
    assert p["second"]["step"] == p["first"]["step"] + 1
    assert p["missing_edge"].startswith("stream49 (schedule)'s write of step 2 is ordered after")


def test_import_prints_a_races_line(capsys):
    assert main(["import", str(SERVER / "races_none.kineto.json.gz"), "--mapping", str(MAPPING),
                 "--no-progress"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  races               234 latent, 84 also observed overlapping (in 59 steps; 238 " \
           "reads and 60 writes of req_to_token mapped); simwar races lists them" in lines
    assert main(["import", str(SERVER / "races_coarse.kineto.json.gz"), "--json",
                 "--no-progress"]) == 0
    races = json.loads(capsys.readouterr().out)["races"]
    assert races["latent"] == 0 and races["writes"] == 120


def test_a_writes_regex_that_maps_nothing_is_one_line(tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text("preset: sglang\nwrites: {'no_such_kernel': [req_to_token]}\n")
    cap = open_capture(SERVER / "races_fine.kineto.json.gz", bad)
    with pytest.raises(ConfigError, match=r"^m\.yaml: writes 'no_such_kernel' matches none of "
                                          r"the capture's \d+ device op names and the \d+ ranges"):
        capture_races(cap.bound, cap.mapping, "m.yaml")


# --------------------------------------------------------------------------- synthetic captures
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
#: configs whose 2.11-style capture (no record ids: only event ids) :mod:`simwar.capture.binding`
#: binds otherwise than the simulator did, so their latent races differ (fewer are found):
#: a read-done the host records before a graph launch and waits on after it is taken for the
#: graph's in-graph node (rule 5: where graphs run, only a record right after one graph launch
#: is taken for a host read-done), which orders the graph's reads before the next step's
#: writes: eagle_publish_verify's and none_fine_pre_replay_fallback's races are not seen
#: (the binding's records sit on the same lane and step, so only the races tell); two rings of
#: host syncs (verify_done and copy_done) bind to each other's records (rule 3).
BINDING_LIMITS = {"eagle_publish_verify", "none_fine_pre_replay_fallback",
                  "dflash_legacy_host_sync"}
#: configs bound otherwise without record ids whose races are the same: sglang_default_prefill's
#: prefill steps record their read-done on the host right after an eager prefill kernel, in a
#: capture where graphs run, so rule 5 does not take it for a host read-done and the next
#: step's waits bind to the step before's (or to nothing, at the start); it has no latent race
#: either way (an open limit of binding captures without record ids, not of the race analysis)
BINDING_DIFFERS_SAME_RACES = {"sglang_default_prefill"}


def synthetic_mapping(cfg) -> dict:
    """What a user would map for a synthetic capture of ``cfg``: the simulator's streams, its
    phases, its writes and, by kernel, its reads (load_batch and prep; a breakable graph's body)."""
    reads = {}
    for p in cfg.phase_table():
        if p.reads:
            parts = "load_batch|prep|body" if p.graph == "breakable" else "load_batch|prep"
            reads[rf"^{p.name}\.({parts})$"] = list(p.reads)
    return {"streams": {7: "forward", 13: "schedule", 20: "copy", 22: "plan", 24: "d2h"},
            "phases": {rf"^{p.name}\.": p.name for p in cfg.phase_table()},
            "writes": {r"^(schedule|result)_writes$": list(cfg.gpu.writes)}, "reads": reads}


def _key(r) -> tuple:
    return (r.buffer, r.kind, r.first_step, r.first_lane, r.first_label, r.second_step,
            r.second_lane, r.second_label)


def _bindings(trace) -> list[tuple]:
    """Each wait and sync in order: its lane, and its record's lane, kind and step counted from
    the wait's own (relative because a host op at the loop's top is labelled by the step the
    capture's range puts it in, the simulator's by the step it serves)."""
    ops = trace.ops
    lane, kind, step = ops.decoded("lane"), ops.kind, ops.step
    # a tensor-parallel rank's host collectives are host blocks, no CUDA call: a capture
    # has their ranges, not sync events
    coll = trace.meta.get("collectives") or {"op": [], "device": []}
    host_coll = {o for o, d in zip(coll["op"], coll["device"]) if not d}
    out = []
    for i in np.flatnonzero((kind == OpKind.WAIT) | (kind == OpKind.SYNC)).tolist():
        if i in host_coll:
            continue
        b = int(ops.bound[i])
        out.append((lane[i], (lane[b], int(kind[b]), int(step[b]) - int(step[i]))
                    if b >= 0 else None))
    return out


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_a_synthetic_capture_has_the_simulators_latent_races(config, tmp_path):
    cfg = load_config(config, {"steps": 30, "warmup_steps": 4})
    sim = simulate(cfg, engine="simpy")
    want = sorted(_key(r) for r in sim.hazards.races if r.latent)
    m = load_mapping(synthetic_mapping(cfg))
    for ids in (True, False):
        path = write_kineto(sim.trace, tmp_path / f"c{int(ids)}.json.gz",
                            style=Style(record_ids=ids, copies=("result_copy",)))
        imp = import_kineto(path, m)
        races = capture_races(imp, m)
        got = sorted(_key(r) for r in races.latent)
        faithful = _bindings(imp.trace) == _bindings(sim.trace)
        if not ids and config.stem in BINDING_DIFFERS_SAME_RACES:
            assert not faithful and got == want, (config.stem, len(got), len(want))
        elif ids or config.stem not in BINDING_LIMITS:
            assert faithful, (config.stem, ids)
            assert got == want, (config.stem, ids, len(got), len(want))
            assert races.summary()["ordered_overlaps"] == 0
        else:  # the binding's guess, not the race analysis, differs: races are missed
            assert got != want and len(got) < len(want), (config.stem, len(got), len(want))


# --------------------------------------------------------------------------- one implementation
@pytest.mark.parametrize("config", ["dspark_none", "eagle_publish_verify", "none_coarse_loop_top",
                                    "dspark_fine"])
def test_with_no_facts_it_is_the_simulators_detector(config):
    t = simulate(ROOT / "configs" / f"{config}.yaml", {"steps": 25, "warmup_steps": 3},
                 engine="simpy").trace
    assert latent_races(t, Accesses.of_trace(t)).races == detect(t).races


def _program(*ops) -> Program:
    return Program(ops=[StepMarker(0), *ops], meta={"warmup_steps": 0})


READ = Kernel("read", 100.0, reads=("b",))
WRITE = Kernel("write", 10.0, writes=("b",))


def _latent(trace, facts=None) -> int:
    return len(latent_races(trace, Accesses.of_trace(trace), facts).latent)


def test_a_blocking_op_and_a_device_sync_order_the_host_after_the_device():
    t = run(_program(Launch("forward", READ, 0), StepMarker(1), Launch("schedule", WRITE, 1)))
    assert _latent(t) == 1
    read = int(np.flatnonzero(t.ops.decoded("label") == "read")[0])
    assert _latent(t, HbFacts(blocking=(read,))) == 0
    t = run(_program(Launch("forward", READ, 0), Synchronize("never", 0, "other"),
                     StepMarker(1), Launch("schedule", WRITE, 1)))
    sync = int(np.flatnonzero(t.ops.kind == OpKind.SYNC)[0])
    assert t.ops.bound[sync] < 0 and _latent(t) == 1
    assert _latent(t, HbFacts(device_syncs=(sync,))) == 0


def test_an_in_graph_node_orders_what_it_follows():
    def program(nodes):
        return _program(GraphLaunch("forward", "g", nodes, 0), WaitEvent("schedule", "done", 0),
                        StepMarker(1), Launch("schedule", WRITE, 1))

    body = Kernel("body", 50.0)
    after = run(program((READ, GraphRecord("done"), body)))
    assert _latent(after) == 0
    first = run(program((GraphRecord("done"), READ, body)))  # as a capture places the node
    assert _latent(first) == 1
    rec = int(np.flatnonzero(first.ops.kind == OpKind.RECORD)[0])
    read = int(np.flatnonzero(first.ops.decoded("label") == "read")[0])
    assert _latent(first, HbFacts(node_after={rec: read})) == 0


def test_each_host_thread_has_its_own_clock():
    # stream A reads; thread 1 syncs on it; a write on stream B is issued by thread 1 or 2
    lane = ["A", "cpu", "B"]
    kind = [OpKind.KERNEL, OpKind.SYNC, OpKind.KERNEL]
    bound = [-1, 0, -1]
    acc = ([0, 2], ["b", "b"], [Mode.READ, Mode.WRITE], [0, 1])
    same = list(candidate_pairs(lane, kind, bound, *acc, host_of=[1, 1, 1]))
    other = list(candidate_pairs(lane, kind, bound, *acc, host_of=[1, 1, 2]))
    assert same == [(0, 1, False)] and other == [(0, 1, True)]
    assert list(candidate_pairs(lane, kind, bound, *acc)) == same  # one thread: the simulator's
    assert list(candidate_pairs(lane, kind, bound, *acc, host_of=[1, 1, 2], clocks=True)) == [
        (0, 1, True, 0)]
