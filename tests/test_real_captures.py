"""Real engine captures (tests/data/real/: SGLang and vLLM on an MI300X, from TraceLens's test
data; README.md there says where from and under which license) read as a user would read
them: no flags.

Each capture's facts are literal in tests/data/real/expected.yaml, in the style of a diff
test: the preset detected, the steps and their shapes (mode, batch, tokens), the forward
stream, the launches of the one step (graph launches and their fan-out, eager calls, copies),
and the top cause ``simwar explain`` gives. A change to the presets, the frames, the step
shapes or the one-step walk that changes what a user sees on a real capture shows up here as
a diff of those facts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from simwar.analysis.critical_path import critical_path
from simwar.capture.open import open_capture
from simwar.cli import main
from simwar.cli.explain import load_source

REAL = Path(__file__).parent / "data" / "real"
EXPECTED = yaml.safe_load((REAL / "expected.yaml").read_text())


def facts(path: Path) -> dict:
    """What a user is told about a capture, as plain data (the expectations' shape)."""
    cap = open_capture(path)
    src = load_source(str(path))
    cp = critical_path(src.trace, None, src.host_ranges, src.device_info)
    top = cp.step_causes()[0]
    launches = cp.launches
    return {
        "preset": cap.preset,
        "detected": cap.mapping.origin[1].startswith("detected"),
        "steps": cap.trace.meta["step_names"],
        "shapes": [[s.mode, s.batch, s.tokens] for s in cap.shapes],
        "batch": cap.sized().batch.tolist(),  # the sizes' batch per step (simwar.capture.sizes)
        "forward_stream": cap.trace.run.forward_stream,
        "one_step": cp.one_step,
        "graph_launches": launches["graph_launches"],
        "graph_ops": sum(launches["graph_ops"]),
        "eager_calls": launches["launches"],
        "copies": launches["copies"],
        "copy_bytes": launches["copy_bytes"],
        "top_cause": top["cause"],
        "top_kind": str(top["kind"]),
        "top_share_pct": round(100 * top["share"]),
    }


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_real_capture_reads_as_expected(name):
    assert facts(REAL / name) == EXPECTED[name]


def test_every_real_capture_has_its_expectations_and_its_source():
    captures = {p.name for p in REAL.glob("*.json.gz")}
    assert captures == set(EXPECTED)
    readme = (REAL / "README.md").read_text()
    for name in captures:
        assert name in readme, f"{name}: its source and license are not in README.md"
        assert (REAL / name).stat().st_size < 1 << 20


def test_import_explain_and_races_run_on_each_without_flags(capsys):
    for name in sorted(EXPECTED):
        path = str(REAL / name)
        assert main(["import", path, "--no-progress", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["mapping"]["preset"] == EXPECTED[name]["preset"]
        assert [[s["mode"], s["batch"], s["tokens"]] for s in report["shapes"]] == \
            EXPECTED[name]["shapes"]
        assert "shape" in report["mapping"]["matched"]
        assert main(["explain", path, "--json"]) == 0
        d = json.loads(capsys.readouterr().out)
        assert d["one_step"] and d["steps_explained"] == 1
        assert d["step_causes"][0]["cause"] == EXPECTED[name]["top_cause"]
        assert main(["races", path]) == 0
        capsys.readouterr()


def test_the_sglang_decode_step_names_the_copy_that_blocked_the_host(capsys):
    """The 463 ms the host spent in one 256-byte copy is the step's first cause, named with
    its bytes, the frame that made it and the stream it waited for."""
    path = str(REAL / "sglang_decode_bs32.json.gz")
    assert main(["explain", path]) == 0
    out = capsys.readouterr().out
    assert "needs more steps    the forward gap (between two forwards)" in out
    assert "1 graph launch (544 device ops;" in out
    words = " ".join(out.split("  in words", 1)[1].split("step time by cause")[0].split())
    assert words.startswith("the one step took 473451 µs from its start to its forward's end: "
                            "463074 µs host blocked in hipMemcpyWithStream (256 B, DtoH "
                            "(Device -> Host) copy) from cuda_graph_runner.py(276)")


def test_the_guide_shows_what_the_commands_print(monkeypatch):
    """docs/guide-your-server.md, "Real engines": each command prints the lines shown, in
    order (``...`` stands for lines left out), run from the repository root."""
    from docs_text import section
    from test_readme_server import _commands, assert_prints

    monkeypatch.chdir(REAL.parents[2])
    commands = _commands(section("## Real engines: SGLang and vLLM as they are"))
    assert len(commands) >= 6
    for command, shown in commands:
        assert_prints(command, shown)
