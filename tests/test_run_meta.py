"""The typed run facts of a Trace (``Trace.run``, :class:`simwar.core.run_meta.RunMeta`) and
the trace file format that keeps them apart (version 3), with files of version 2 still read."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from simwar.api import simulate
from simwar.cli.app import main
from simwar.core.run_meta import RunMeta
from simwar.core.trace import FORMAT_VERSION, Trace

REPO = Path(__file__).resolve().parents[1]
BIMODAL = str(REPO / "configs" / "dspark_fine_bimodal.yaml")
SAVED = REPO / "tests" / "data" / "traces"
BIMODAL_V2 = SAVED / "dspark_fine_bimodal.v2.trace.json.gz"
THREADS_V2 = SAVED / "threads_worker.v2.trace.json.gz"


def _raw(path: Path) -> dict:
    with gzip.open(path, "rt") as fh:
        return json.load(fh)


def test_a_run_without_facts_takes_the_defaults_the_readers_took():
    run = RunMeta.from_meta({"unrelated": 1})
    assert (run.name, run.warmup_steps, run.batch_size, run.accept_tokens,
            run.forward_stream, run.workload, run.barrier) == ("", 0, 1, 1.0, "forward", None,
                                                               None)


def test_the_record_reads_a_simulated_runs_meta():
    trace = simulate(BIMODAL, {"steps": 8, "warmup_steps": 2},
                     engine="simpy").trace
    run = trace.run
    assert (run.name, run.steps, run.warmup_steps, run.source) == (
        "dspark-fine-bimodal", 8, 2, "sim")
    assert run.barrier == trace.meta["barrier"] and run.workload is trace.meta["workload"]
    assert run.applied_barrier == trace.meta["barrier_effective"]
    trace.meta["warmup_steps"] = 3  # a writer that adds to meta later: the record follows
    assert trace.run.warmup_steps == 3


def test_version_3_keeps_the_records_keys_apart_and_reads_back_the_same(tmp_path):
    trace = simulate(BIMODAL, {"steps": 8, "warmup_steps": 2},
                     engine="simpy").trace
    trace.meta["written_by_a_tool"] = {"x": 1}  # a key of no record field stays in meta
    path = tmp_path / "t.trace.json.gz"
    trace.save(path)
    raw = _raw(path)
    assert raw["version"] == FORMAT_VERSION == 3
    assert raw["run"]["warmup_steps"] == 2 and "warmup_steps" not in raw["meta"]
    assert raw["meta"]["written_by_a_tool"] == {"x": 1} and "written_by_a_tool" not in raw["run"]
    back = Trace.load(path)
    assert json.loads(json.dumps(trace.meta)) == back.meta
    assert back.run == RunMeta.from_meta(json.loads(json.dumps(trace.meta)))
    assert len(back.ops) == len(trace.ops) and back.strings == trace.strings


@pytest.mark.parametrize("path", [BIMODAL_V2, THREADS_V2], ids=lambda p: p.name)
def test_a_version_2_file_still_loads_to_the_same_trace(path, tmp_path):
    raw = _raw(path)
    assert raw["version"] == 2 and "run" not in raw
    old = Trace.load(path)
    assert old.meta == raw["meta"] and old.run == RunMeta.from_meta(raw["meta"])
    again = tmp_path / "again.trace.json.gz"
    old.save(again)
    new = Trace.load(again)
    assert new.meta == old.meta and new.run == old.run
    for table in ("spans", "ops", "accesses", "markers"):
        assert getattr(new, table).columns().keys() == getattr(old, table).columns().keys()
        assert all((a == b).all() for a, b in zip(getattr(new, table).columns().values(),
                                                  getattr(old, table).columns().values()))


def test_the_facts_of_the_saved_version_2_files():
    sim, cap = Trace.load(BIMODAL_V2).run, Trace.load(THREADS_V2).run
    assert (sim.name, sim.warmup_steps, sim.barrier, sim.forward_stream) == (
        "dspark-fine-bimodal", 2, "fine", "forward")
    assert len(sim.workload["graph_bucket"]) == sim.steps == 8
    assert sim.graph_bucket == sim.workload["graph_bucket"] and sim.requests is None
    assert (cap.source, cap.forward_stream, cap.host_thread_name, cap.file) == (
        "kineto", "stream7", "python", "worker.kineto.json.gz")
    assert len(cap.launch_threads) == 3 and cap.barrier is None


@pytest.mark.parametrize("path", [BIMODAL_V2, THREADS_V2], ids=lambda p: p.name)
def test_explain_reads_a_version_2_file_as_its_version_3_copy(path, tmp_path, capsys):
    copy = tmp_path / path.name.replace(".v2.", ".v3.")
    Trace.load(path).save(copy)
    assert main(["explain", str(path), "--json"]) == 0
    old = json.loads(capsys.readouterr().out)
    assert main(["explain", str(copy), "--json"]) == 0
    new = json.loads(capsys.readouterr().out)
    assert old.pop("source").replace(str(path), str(copy)) == new.pop("source")
    assert old == new and old["steps_explained"] > 0


def test_an_unknown_version_is_refused():
    with pytest.raises(ValueError, match="version 4 is not one of 2, 3"):
        Trace.from_dict({"format": "simwar.trace", "version": 4})
