"""The bad-input corpus (tests/data/bad): every malformed input gets its one line, nothing else.

Each case of ``tests/data/bad/cases.yaml`` runs ``simwar ARGS`` in-process, in a fresh empty
working directory that all output paths point into, and must exit non-zero with exactly the
expected line on stderr, nothing on stdout, no traceback, and no file written: neither in
that directory nor next to the corpus files.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from simwar.cli.app import main

REPO = Path(__file__).resolve().parents[1]
BAD = Path(__file__).resolve().parent / "data" / "bad"
CASES = yaml.safe_load((BAD / "cases.yaml").read_text())["cases"]


def _case_id(case: dict) -> str:
    what = case.get("file") or " ".join(case["args"][1:])
    return f"{case['args'][0]}:{what}"


def _fill(text: str, case: dict, tmp: Path, escape=lambda s: s) -> str:
    values = {"{file}": str(BAD / case["file"]) if case.get("file") else "{file}",
              "{dir}": str(BAD), "{tmp}": str(tmp), "{repo}": str(REPO)}
    for name, value in values.items():
        text = text.replace(name, escape(value))
    return text


def test_the_corpus_is_complete():
    files = {p.name for p in BAD.iterdir()} - {"cases.yaml"}
    used = {c["file"] for c in CASES if c.get("file")}
    assert len(files) >= 40
    assert files <= used, f"corpus files without a case: {sorted(files - used)}"
    assert used <= files, f"cases naming missing files: {sorted(used - files)}"
    for case in CASES:
        assert ("error" in case) != ("error_re" in case), case


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_bad_input_gives_its_one_line(case, tmp_path, monkeypatch, capsys):
    work = tmp_path / "work"
    work.mkdir()
    work = work.resolve()
    monkeypatch.chdir(work)
    corpus_before = sorted(os.listdir(BAD))
    args = [_fill(a, case, work) for a in case["args"]]
    code = main(args)
    out, err = capsys.readouterr()
    assert code != 0
    assert "Traceback" not in out + err
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    line = err.rstrip("\n")
    if "error" in case:
        assert line == _fill(case["error"], case, work)
    else:
        assert re.fullmatch(_fill(case["error_re"], case, work, re.escape), line), line
    assert os.listdir(work) == [], "a failed command left files behind"
    assert sorted(os.listdir(BAD)) == corpus_before, "a failed command wrote into the corpus"
