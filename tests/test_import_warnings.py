"""``simwar import`` without ``--fit``: a mapping rule that matches nothing in the capture is
one warning line (with ``--fit`` or ``--check`` it is an error: the corpus holds that case)."""

from __future__ import annotations

import json
from pathlib import Path

from simwar.cli.app import main

ROOT = Path(__file__).resolve().parents[1]
CAPTURE = ROOT / "tests" / "data" / "kineto_synthetic" / "three_steps.json"


def test_a_cpu_rule_that_matches_nothing_is_a_warning(tmp_path, capsys):
    mapping = tmp_path / "m.yaml"
    mapping.write_text("cpu: {'^no_such_range$': schedule}\n")
    assert main(["import", str(CAPTURE), "--mapping", str(mapping), "--no-progress"]) == 0
    out, err = capsys.readouterr()
    assert err == (f"simwar: warning: {mapping}: cpu '^no_such_range$' matches none of the "
                   f"capture's 6 annotation names (ProfilerStep#N, draft, result_copy, verify); "
                   f"it is used by --fit only\n")
    assert "warning" not in out


def test_phase_and_site_rules_that_match_nothing_are_warnings_too(tmp_path, capsys):
    mapping = tmp_path / "m.yaml"
    mapping.write_text("phases: {'^draft$': draft, '^nothing$': verify}\n"
                       "sites: {'^nowhere$': result_copy}\n")
    assert main(["import", str(CAPTURE), "--mapping", str(mapping), "--no-progress",
                 "--json"]) == 0
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert lines == [f"simwar: warning: {mapping}: phases '^nothing$' matches none of the "
                     f"capture's 12 kernel and annotation names (Memcpy DtoH (Device -> Pinned), "
                     f"Memset (Device), ProfilerStep#N, draft, gemm_a, ...)",
                     f"simwar: warning: {mapping}: sites '^nowhere$' matches none of the "
                     f"capture's 6 annotation names (ProfilerStep#N, draft, result_copy, verify)"]
    assert json.loads(out)["warnings"] == [line.split("warning: ", 1)[1] for line in lines]


def test_a_mapping_whose_rules_all_match_warns_of_nothing(tmp_path, capsys):
    mapping = tmp_path / "m.yaml"
    mapping.write_text("phases: {'^draft$': draft, '^verify$': verify}\n")
    assert main(["import", str(CAPTURE), "--mapping", str(mapping), "--no-progress"]) == 0
    assert capsys.readouterr().err == ""
