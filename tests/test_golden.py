"""Every shipped config gives bit for bit the results recorded in ``tests/data/golden``.

The files were written by ``tests/golden.py`` before the package was reorganised; a change
that moves code must leave them all equal. Regenerate them only when results are meant to
change, and say why in the commit.
"""

from __future__ import annotations

import json

import pytest
from golden import CONFIGS, EXTRA, GOLDEN, ROOT, VARIANTS, entry, name_of

CASES = [(p, v) for p in CONFIGS for v in {**VARIANTS, **EXTRA.get(p.stem, {})}]


def test_every_shipped_config_has_golden_results():
    missing = [name_of(p, v) for p, v in CASES if not (GOLDEN / name_of(p, v)).exists()]
    assert not missing, f"no golden file for {missing}: run python tests/golden.py"


@pytest.mark.parametrize("path,variant", CASES, ids=[name_of(p, v)[:-5] for p, v in CASES])
def test_results_equal_the_golden_ones(path, variant, monkeypatch):
    monkeypatch.chdir(ROOT)
    golden = json.loads((GOLDEN / name_of(path, variant)).read_text())
    got = json.loads(json.dumps(entry(path, variant)))
    for key in golden:
        assert got[key] == golden[key], f"{name_of(path, variant)}: {key} changed"
    assert set(got) == set(golden)
