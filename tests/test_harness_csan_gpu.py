"""The CSAN matrix replayed on a real GPU under PyTorch's CUDA sanitizer (marked ``gpu``;
skipped without torch or CUDA).

Per case (every algorithm × barrier with all phases eager, plus the unsafe variants): CSAN
reports an unsynchronized access on a shared buffer if and only if simwar reports latent
races for the program, and reports nothing on any of the harness's own tensors.

The programs are built here by the simulator, or, where ``SIMWAR_CSAN_PROGRAMS`` names a
directory written by ``simwar harness --csan -o DIR``, read from it (so the test also runs
on a machine with torch but without the simulator's dependencies).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


PROGRAMS = os.environ.get("SIMWAR_CSAN_PROGRAMS")


def _names():
    if PROGRAMS:
        return sorted(p.stem for p in Path(PROGRAMS).glob("*.json"))
    from simwar.harness import suite

    return list(suite.csan_cases())


def _program(name):
    if PROGRAMS:
        from simwar.core.program import Program

        return Program.from_json((Path(PROGRAMS) / f"{name}.json").read_text())
    from simwar.harness import suite

    return suite.csan_program(name)


@pytest.fixture(scope="module")
def sanitized():
    from simwar.harness.csan import CsanCollector, sanitize
    from simwar.harness.cuda import calibrate_device

    cal = calibrate_device()
    collector = CsanCollector()
    out = {}
    for name in _names():
        program = _program(name)
        out[name] = (program, sanitize(program, cal, collector))
    return out


@pytest.mark.parametrize("name", _names())
def test_csan_agrees_with_simwar(sanitized, name):
    program, r = sanitized[name]
    counts = r["csan"]
    assert r["graph_launches"] == 0
    assert r["csan_internal"] == 0, (counts["all"]["internal"], counts["all"]["unknown"],
                                     r["examples"][:3])
    latent = program.meta["latent_races"]
    assert (r["csan_shared"] > 0) == (latent > 0), (latent, counts["after_warmup"]["shared"],
                                                    r["examples"][:3])
    if latent:
        assert set(counts["after_warmup"]["shared"]) == set(program.meta["latent_race_buffers"])
    assert r["agree"] is True
