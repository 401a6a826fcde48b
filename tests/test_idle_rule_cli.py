"""``simwar explain --idle-rule``: HTA's idle breakdown by simwar's rule or HTA's own, on a
committed capture, against what benchmarks/hta_agreement.py computes from the file itself
(HTA's row-0 join of the file's first event, its scope with two or more ProfilerSteps)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from simwar.analysis.idle import idle_breakdown
from simwar.capture.open import open_capture
from simwar.cli.app import main
from simwar.core.trace import OpKind

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from hta_agreement import file_facts  # noqa: E402

#: a kernel whose launch is not in the capture, two ProfilerStep ranges: HTA's rule and
#: simwar's part on it (tests/test_kineto.py reads it too)
CAPTURE = ROOT / "tests" / "data" / "kineto_synthetic" / "kernel_no_launch.json"


def _idle(rule: str, capsys) -> dict:
    assert main(["explain", str(CAPTURE), "--idle-rule", rule, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["idle"]["rule"] == rule
    return out["idle"]["streams"]


def test_explain_idle_rule_hta_gives_hta_agreements_numbers(capsys):
    t = open_capture(CAPTURE).trace
    first_ts, first_device_ts, stepped = file_facts(CAPTURE)
    origin = first_device_ts - float(t.ops.start_us[t.ops.kind == OpKind.KERNEL].min())
    expected = idle_breakdown(t, rule="hta", no_launch_us=first_ts - origin,
                              launched_only=stepped)
    hta = _idle("hta", capsys)
    assert hta == expected
    simwar = _idle("simwar", capsys)
    assert simwar == idle_breakdown(t)
    assert hta != simwar  # the row-0 launch and the scope: the two rules part on this file
    assert t.meta["profiler_steps"] == 2 and stepped
    assert t.meta["first_event_us"] == first_ts - origin


def test_explain_idle_rule_text(capsys):
    assert main(["explain", str(CAPTURE), "--idle-rule", "hta"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = out.index(next(line for line in out if line.startswith("stream idle")))
    assert "HTA's own rule" in out[head]
    assert out[head + 1].split()[0] == "stream7"
