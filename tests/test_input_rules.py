"""Inputs that used to be read as something else: NaN and infinity, keys given twice, ``1e3``,
a misspelt phase on a custom table. Each is one line naming the file (or flag) and key.

The corpus cases (``tests/data/bad``) cover the command line; these cover the Python API
(``simulate``, ``sweep``, ``load_config`` with mappings) and what must still be accepted.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import simwar
from simwar.config import ConfigError, load_config, read_yaml
from simwar.study.sweeps import load_sweep

REPO = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------- NaN, infinity
@pytest.mark.parametrize("overrides,key", [
    ({"cpu.schedule_us": math.nan}, "cpu.schedule_us"),
    ({"cpu.schedule_us": math.inf}, "cpu.schedule_us"),
    ({"cpu.schedule_us": np.float64("nan")}, "cpu.schedule_us"),
    ({"costs.launch_us": {"dist": "normal", "mean": 5.0, "std": math.inf}}, "costs.launch_us"),
    ({"accept.tokens": math.inf}, "accept.tokens"),
    ({"accept.tokens": [2.0, math.nan]}, "accept.tokens"),
    ({"phases.verify.body_us": {"base": 10, "per_seq": math.inf}}, "phases.verify.body_us"),
])
def test_simulate_rejects_non_finite_numbers(overrides, key):
    with pytest.raises(ConfigError, match="expected a finite number") as e:
        simwar.simulate(None, overrides)
    assert str(e.value).count("\n") == 0 and key.split(".")[0] in str(e.value)


def test_a_mapping_config_with_nan_is_rejected_naming_the_key():
    with pytest.raises(ConfigError) as e:
        load_config({"cpu": {"schedule_us": math.nan}})
    assert str(e.value) == "<config>: cpu.schedule_us: expected a finite number, got nan"


def test_infinite_arrivals_rate_is_rejected_before_running():
    wl = {"arrivals": {"rate_per_s": math.inf}, "max_batch": 8, "output_tokens": 16}
    with pytest.raises(ConfigError, match="arrivals.rate_per_s: expected a finite number"):
        simwar.simulate(None, {"workload": wl})


def test_a_sweep_mapping_with_nan_is_a_config_error_not_a_json_traceback(tmp_path):
    spec = {"base": {"steps": 60, "warmup_steps": 5},
            "grid": {"cpu.schedule_us": [100.0, math.nan]}}
    with pytest.raises(ConfigError) as e:
        simwar.sweep(spec, tmp_path / "out")
    assert str(e.value) == "<sweep>: grid.cpu.schedule_us.1: expected a finite number, got nan"
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="zip.cpu.schedule_us.0: expected a finite"):
        load_sweep({"base": {}, "zip": {"cpu.schedule_us": [math.inf]}})


def test_a_number_too_large_for_a_float_is_not_infinity(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("gpu:\n  schedule_writes_us: 1e400\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == (f"{path}: gpu.schedule_writes_us: expected a finite number, got "
                            f"1e400 (line 2)")


# --------------------------------------------------------------------------- duplicate keys
def test_a_key_given_twice_names_it_and_both_lines(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("name: x\npolicy:\n  barrier: coarse\n  placement: loop_top\n"
                    "  barrier: fine\n")
    with pytest.raises(ConfigError) as e:
        load_config(path)
    assert str(e.value) == f"{path}: policy.barrier: duplicate key (lines 3 and 5); give it once"


def test_a_costs_file_with_a_key_given_twice_is_refused(tmp_path, capsys):
    from simwar.cli.app import main

    costs = tmp_path / "costs.yaml"
    costs.write_text("costs:\n  launch_us: 5\n  launch_us: 7\n")
    assert main(["run", "--costs", str(costs)]) == 2
    assert capsys.readouterr().err == (f"simwar: error: --costs {costs}: costs.launch_us: "
                                       f"duplicate key (lines 2 and 3); give it once\n")


def test_merge_keys_and_repeated_keys_in_different_mappings_are_fine(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("defaults: &d {schedule_us: 500}\ncpu:\n  <<: *d\n  prepare_us: 100\n"
                    "gpu: {schedule_writes_us: 100}\ncosts: {launch_us: 5}\n")
    data = read_yaml(path)
    assert data["cpu"] == {"schedule_us": 500, "prepare_us": 100}


# --------------------------------------------------------------------------- 1e3
def test_exponent_numbers_are_numbers(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("cpu:\n  schedule_us: 1e3\n  prepare_us: 2.5E2\n  ingest_us: -0e0\n"
                    "name: '1e3'\n")
    cfg = load_config(path)
    assert cfg.cpu.schedule_us == 1000.0 and cfg.cpu.prepare_us == 250.0
    assert cfg.cpu.ingest_us == 0.0
    assert cfg.name == "1e3"  # quoted: text
    assert load_config(None, ["cpu.schedule_us=1e3"]).cpu.schedule_us == 1000.0
    assert read_yaml(_write(tmp_path, "a: 1e3x\nb: e3\nc: 12\n")) == {"a": "1e3x", "b": "e3",
                                                                      "c": 12}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "x.yaml"
    path.write_text(text)
    return path


# --------------------------------------------------------------------------- custom phases
CUSTOM = {"algorithm": "custom", "steps": 60, "warmup_steps": 5,
          "phases": [{"name": "fwd", "body_us": 5000, "reads": ["req_to_token"],
                      "read_ends": "in_replay"}]}


def test_a_misspelt_phase_on_a_custom_table_is_an_error_not_a_new_phase():
    with pytest.raises(ConfigError) as e:
        load_config(CUSTOM, ["phases.fwdd.body_us=100"])
    assert str(e.value) == ("--set phases.fwdd.body_us=100: phases.fwdd: 'fwdd' is not a phase "
                            "of the custom table (fwd); to add a phase, list it in phases")
    assert load_config(CUSTOM, ["phases.fwd.body_us=100"]).phase_table()[0].body_us == 100.0


def test_a_sweep_over_a_misspelt_custom_phase_is_refused():
    with pytest.raises(ConfigError, match="'fwdd' is not a phase of the custom table"):
        load_sweep({"base": CUSTOM, "grid": {"phases.fwdd.body_us": [1, 2]}})


def test_libyaml_events_read_every_yaml_file_as_the_python_loader_does():
    """Documents are read with libyaml's events where PyYAML has them; every YAML file of the
    project (configs, sweeps, mappings, the bad inputs) gives the same values, or an error in
    both, and a document nested too deep for the C composer is refused by the depth guard."""
    yaml = pytest.importorskip("yaml")
    from simwar.config.load import YamlRuleError, _load, _loader_classes, load_yaml_text

    python, c = _loader_classes()
    if c is None:
        pytest.skip("PyYAML without libyaml")
    root = Path(__file__).parents[1]
    files = [f for d in ("configs", "simwar", "tests", "examples") for f in
             sorted((root / d).rglob("*.y*ml"))]
    assert len(files) > 50
    for f in files:
        text = f.read_text(errors="replace")
        got = []
        for loader in (python, c):
            try:
                got.append(repr(_load(loader, text)))
            except (yaml.YAMLError, YamlRuleError) as e:
                got.append(type(e).__name__)
        assert got[0] == got[1], f
    with pytest.raises(YamlRuleError, match="nested deeper than 64 levels"):
        load_yaml_text("a: " + "[" * 200_000 + "]" * 200_000)
