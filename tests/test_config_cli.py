"""Config validation, overrides, and the CLI's one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import simwar
from simwar.config import ConfigError, load_config


def cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "simwar", *args], capture_output=True,
                          text=True, cwd=cwd)


def test_default_run_prints_a_summary():
    out = cli("run", "--set", "steps=60", "--set", "warmup_steps=5")
    assert out.returncode == 0, out.stderr
    assert "dspark-fine" in out.stdout and "launch-ahead depth" in out.stdout


def test_json_output_is_one_object():
    out = cli("run", "--json", "--set", "steps=60", "--set", "warmup_steps=5",
              "--set", "policy.barrier=coarse")
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert s["barrier"] == "coarse" and s["steps_measured"] == 54


BAD = {
    "unknown_key.yaml": ("policy:\n  barier: fine\n", "policy.barier: unknown key"),
    "wrong_type.yaml": ("steps: many\n", "steps: Input should be a valid integer"),
    "negative.yaml": ("cpu:\n  schedule_us: -5\n", "cpu.schedule_us: a duration must be >= 0"),
    "algorithm.yaml": ("algorithm: medusa\n", "algorithm: Input should be"),
    "yaml.yaml": ("cpu: [1,\n", "invalid YAML"),
    "dist.yaml": ("cpu:\n  schedule_us: {dist: normal, mean: 3}\n",
                  "cpu.schedule_us: dist normal needs 'std'"),
    "phase.yaml": ("phases:\n  - {name: verify, bogus: 1}\n", "phases.0.bogus: unknown key"),
    "phase_name.yaml": ("phases:\n  - {name: draft_extend}\n",
                        "phases.0.name: 'draft_extend' is not a phase of dspark"),
    "custom.yaml": ("algorithm: custom\n", "phases: algorithm custom needs"),
    "publish.yaml": ("policy:\n  publish_phase: nope\n", "policy.publish_phase: 'nope'"),
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_bad_config_gives_one_line(tmp_path, name):
    text, expected = BAD[name]
    path = tmp_path / name
    path.write_text(text)
    out = cli("run", str(path))
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert str(path) in lines[0] and expected in lines[0], lines[0]
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_missing_file_and_bad_override():
    out = cli("run", "does/not/exist.yaml")
    assert out.returncode == 2 and "does/not/exist.yaml: file not found" in out.stderr
    out = cli("run", "--set", "policy.barrier=sometimes")
    assert out.returncode == 2 and out.stderr.startswith("simwar: error: --set policy.barrier:")
    out = cli("run", "--set", "novalue")
    assert out.returncode == 2 and "expected key.path=value" in out.stderr


def test_overrides_by_phase_name_and_index():
    cfg = load_config(None, {"phases.verify.body_us": 1234})
    assert next(p for p in cfg.phase_table() if p.name == "verify").body_us == 1234
    custom = {"algorithm": "custom", "phases": [{"name": "a", "body_us": 5}]}
    cfg = load_config(custom, ["phases.0.body_us=7"])
    assert cfg.phase_table()[0].body_us == 7


def test_resolved_config_revalidates_to_itself():
    cfg = load_config(None)
    again = load_config(cfg.model_dump())
    assert again == cfg


def test_api_raises_config_error():
    with pytest.raises(ConfigError, match="policy.barrier"):
        simwar.simulate(None, {"policy.barrier": "sometimes"})


def test_python_m_and_console_script_agree():
    out = cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("simwar ")


# --------------------------------------------------------------------------- one list of names
def test_engine_names_are_one_tuple_for_the_config_the_cli_and_the_api():
    from typing import get_args

    from simwar.api import resolve_engine
    from simwar.cli.app import build_parser
    from simwar.config import ENGINES, Config

    assert get_args(Config.model_fields["engine"].annotation) == ENGINES
    run = build_parser()._subparsers._group_actions[0].choices["run"]
    assert next(a for a in run._actions if a.dest == "engine").choices == ENGINES
    cfg = load_config(None)
    assert {resolve_engine(name, cfg) for name in ENGINES} == {"simpy", "fast"}
    assert resolve_engine("auto", cfg, want_trace=True) == "simpy"
    with pytest.raises(ConfigError, match="engine: 'turbo' is not one of simpy, fast, auto"):
        resolve_engine("turbo", cfg)


def test_algorithm_names_are_the_built_in_tables_and_custom():
    from typing import get_args

    from simwar.config import ALGORITHMS, Config
    from simwar.config.algorithms import BUILTIN

    assert get_args(Config.model_fields["algorithm"].annotation) == ALGORITHMS
    assert ALGORITHMS == (*BUILTIN, "custom")
    for name in BUILTIN:
        assert load_config(None, {"algorithm": name}).algorithm == name
    with pytest.raises(ConfigError, match="algorithm: Input should be 'none', 'eagle', "
                                          "'dflash', 'dspark' or 'custom'"):
        load_config(None, {"algorithm": "medusa"})


def test_every_public_name_of_the_package_resolves():
    for name in simwar.__all__:
        assert getattr(simwar, name) is not None, name
    cfg = load_config(None, {"steps": 30, "warmup_steps": 5})
    assert type(simwar.build_program(cfg)) is simwar.Program


def test_schema_re_exports_the_iteration_shape_models():
    """The prefill and scheduling sections live in simwar.config.shapes; ``from
    simwar.config.schema import X`` still gives each of its public names, and a config with
    them round-trips through pickle (the config cache's entries)."""
    import pickle

    from simwar.config import schema, shapes

    for name in shapes.__all__:
        assert name in schema.__all__ and getattr(schema, name) is getattr(shapes, name), name
    cfg = load_config(None, {"steps": 30, "warmup_steps": 5, "scheduling": {"rule": "sglang"},
                             "workload": {"arrivals": {"rate_per_s": 100}, "output_tokens": 4,
                                          "max_batch": 8, "prompt_tokens": 64},
                             "prefill": {"forward_us": {"base": 50, "per_token": 0.5}}})
    assert type(cfg.prefill) is shapes.Prefill and type(cfg.scheduling) is shapes.Scheduling
    assert pickle.loads(pickle.dumps(cfg)) == cfg
