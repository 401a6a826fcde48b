"""The GPU probe (lab.probe): its planning on the CPU, its loop as a dry run.

The probe runs on the GPU machine, which has torch, numpy and the standard library only;
here its sizing and summaries are checked without torch, its whole loop runs as a dry run
on a CPU torch (tiny shapes, no streams, graphs as plain calls: the same ranges, host work
and race check), and its captures are read back by the importer. A ``gpu`` test runs the
real probe for a few steps.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lab.probe import (
    RANGES,
    VARIANTS,
    HostWork,
    Shape,
    parse_variants,
    plan_counts,
    summarize_timings,
)

ROOT = Path(__file__).resolve().parents[1]


def test_layer_counts_hit_the_target_graph_times():
    s = plan_counts(Shape(), draft_layer_us=45.0, verify_layer_us=100.0, draft_us=800.0,
                    verify_us=700.0)
    assert (s.draft_steps, s.verify_layers) == (9, 7)  # 9 x 2 x 45 = 810, 7 x 100 = 700
    s = plan_counts(Shape(), draft_layer_us=5000.0, verify_layer_us=0.0, draft_us=800.0,
                    verify_us=700.0)
    assert (s.draft_steps, s.verify_layers) == (1, 1)  # never below one
    assert plan_counts(Shape(), 0.1, 0.1, 800, 700).verify_layers == 64  # nor above the cap


def test_variants_and_host_work():
    assert list(VARIANTS) == ["fine", "coarse", "none", "fine_host1000"]
    assert parse_variants("fine, coarse") == ["fine", "coarse"]
    with pytest.raises(ValueError, match="sideways: not a variant"):
        parse_variants("fine,sideways")
    with pytest.raises(ValueError, match="none given"):
        parse_variants(" , ")
    h = HostWork()
    assert (h.ingest, h.schedule, h.prepare, h.process_result, h.extra) == (30, 150, 80, 150, 0)


def test_timing_summary():
    out = summarize_timings([100.0, 110.0, 120.0], [90.0] * 3, [10.0, 20.0], [1.0, 1.0, 0.0], 2)
    assert out["step_us_mean"] == 110.0 and out["step_us_p50"] == 110.0
    assert out["step_us_p99"] == 120.0 and out["fwd_gap_us_mean"] == 15.0
    assert out["launch_ahead_mean"] == pytest.approx(2 / 3) and out["racy_steps"] == 2
    assert summarize_timings([], [], [], [], 0)["steps_measured"] == 0


def test_probe_imports_only_torch_and_the_standard_library():
    code = ("import sys; import lab.probe as p; "
            "bad = [m for m in ('simpy', 'pydantic', 'pandas', 'yaml', 'ijson', 'torch') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_dry_run_writes_captures_and_metrics(tmp_path):
    pytest.importorskip("torch")
    from lab.probe import main
    from simwar.capture.to_trace import import_kineto

    assert main([str(tmp_path), "--dry-run", "--steps", "3", "--measured-steps", "6",
                 "--warmup", "1", "--variants", "fine,none"]) == 0
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["probe_fine.kineto.json.gz", "probe_log.txt", "probe_metrics.json",
                     "probe_none.kineto.json.gz"]
    m = json.loads((tmp_path / "probe_metrics.json").read_text())
    assert m["format"] == "simwar.probe" and set(m["variants"]) == {"fine", "none"}
    fine = m["variants"]["fine"]
    assert fine["barrier"] == "fine" and fine["measured"]["steps_measured"] == 4
    assert fine["measured"]["racy_steps"] == 0 and fine["profiled"]["racy_steps_all"] == 0
    json.loads(gzip.decompress((tmp_path / "probe_fine.kineto.json.gz").read_bytes()))
    imp = import_kineto(tmp_path / "probe_fine.kineto.json.gz", {"steps": r"^step#\d+$"})
    seen = {a[0] for a in imp.annotations}
    assert set(RANGES) <= seen and {"step#0", "step#3"} <= seen  # 3 iterations, the drain
    # the ranges nest as in SGLang: prepare_for_decode in get_next_batch_to_run, the phases
    # in run_batch
    spans = {}
    for name, a, b in imp.annotations:
        spans.setdefault(name, []).append((a, b))
    for (a, b), (c, d) in zip(spans["get_next_batch_to_run"], spans["prepare_for_decode"]):
        assert a <= c and d <= b
    for phase in ("draft", "verify", "sample"):
        for (a, b), (c, d) in zip(spans["run_batch"], spans[phase]):
            assert a <= c and d <= b


def test_probe_mapping_names_the_probe_ranges():
    from simwar.capture.mapping import load_mapping

    m = load_mapping(ROOT / "tests" / "data" / "probe" / "mapping.yaml")
    names = set(RANGES)
    for rules in (m.phases, m.cpu, m.sites):
        for pattern in rules:
            assert pattern.strip("^$") in names
    assert set(m.reads) == {"draft", "verify"}


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs torch and a CUDA device")
def test_probe_on_the_gpu(tmp_path):
    from lab.probe import main

    assert main([str(tmp_path), "--steps", "3", "--measured-steps", "8", "--warmup", "2",
                 "--variants", "fine"]) == 0
    m = json.loads((tmp_path / "probe_metrics.json").read_text())
    fine = m["variants"]["fine"]["measured"]
    assert fine["racy_steps"] == 0 and fine["step_us_mean"] > 0
