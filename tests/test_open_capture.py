"""The front door of a capture (:mod:`simwar.capture.open`): one finished record, and the one
way ``simwar import``, ``explain``, ``races`` and the fit reach a capture.

A simulated run whose batch changes every step is written as an SGLang server's profile
(batch ranges named as SGLang names them), so that the preset is detected and the size
stage has sizes to write into the Trace.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simwar.api import simulate
from simwar.capture import open as front_door
from simwar.capture.open import open_capture
from simwar.capture.presets import map_capture
from simwar.capture.reader import read_capture
from simwar.capture.sizes import SizesError, graph_keys, size_capture
from simwar.capture.synthetic import Style, write_kineto
from simwar.capture.to_trace import bind_capture
from simwar.cli.app import main
from simwar.config import ConfigError
from simwar.fit.from_capture import FitError, fit_model

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def varying(tmp_path_factory):
    """A bimodal batch (graph buckets 8 and 64) captured with its batch ranges, and its
    simulated run."""
    sim = simulate(ROOT / "configs" / "dspark_fine_bimodal.yaml",
                   {"steps": 60, "warmup_steps": 5}, engine="simpy")
    path = write_kineto(sim.trace, tmp_path_factory.mktemp("bimodal") / "bimodal.json.gz",
                        style=Style(names="sglang", batch_ranges=True,
                                    copies=("result_copy",)))
    return sim, path


def test_open_capture_is_the_four_stages_with_the_sizes_in_the_trace(varying):
    sim, path = varying
    cap = open_capture(path)
    assert cap.preset == "sglang" and cap.label == "preset sglang"
    assert cap.paths == [path] and cap.mapping_file is None
    sizes = cap.sized()
    assert sizes.varying and sizes.source == "batch ranges"
    assert cap.trace.meta["workload"] == sizes.meta()
    ran = np.flatnonzero(sizes.batch > 0)
    assert sizes.batch[ran].tolist() == sim.steps.batch_size.to_numpy()[ran].tolist()
    # the stages one by one: the same mapping, the same events bound, the same sizes
    events = [read_capture(path)]
    mapping = map_capture(None, None, {a.name for a in events[0].annotations},
                          {d.name for d in events[0].device_events})
    assert mapping.model_dump() == cap.mapping.model_dump()
    bound = bind_capture(events, mapping, [path.name])
    assert bound.counts == cap.counts and len(bound.trace.ops) == len(cap.trace.ops)
    assert size_capture(bound, mapping).batch.tolist() == sizes.batch.tolist()


def test_graph_keys_read_each_kernels_launch_dims_from_the_imports_facts(varying):
    """The size stage's graph keys take every graph kernel's grid and block from the
    import's DeviceInfos (one search for them all, as a lookup per op gives them)."""
    _, path = varying
    bound = open_capture(path).bound
    info = bound.device_info
    ops = list(range(len(bound.trace.ops)))
    assert info.of_ops(ops) == [info.get(o) for o in ops]
    keys = graph_keys(bound)
    assert len(set(keys.values())) == 2  # the buckets 8 and 64
    assert all(grid and block for key in keys.values() for graph in key
               for _, grid, block in graph)


def test_a_mapping_file_is_the_label_and_a_bad_one_fails_before_the_capture_is_read(
        varying, tmp_path):
    _, path = varying
    mapping = tmp_path / "m.yaml"
    mapping.write_text("preset: sglang\n")
    cap = open_capture(path, str(mapping))
    assert cap.label == cap.mapping_file == str(mapping) and cap.preset == "sglang"
    absent = tmp_path / "absent.json"  # never opened: the preset and mapping fail first
    with pytest.raises(ConfigError, match=r"--preset: 'nope' is not a preset"):
        open_capture(absent, preset="nope")
    mapping.write_text("steps: [unclosed\n")
    with pytest.raises(ConfigError, match="m.yaml"):
        open_capture(absent, str(mapping))


def test_a_size_error_is_kept_for_what_needs_the_sizes(varying):
    _, path = varying
    cap = open_capture(path, {"preset": "sglang", "graph_buckets": [8, 16, 32]})
    assert cap.sizes is None and "workload" not in cap.trace.meta
    assert "is above the largest graph bucket (32)" in cap.size_error
    with pytest.raises(SizesError, match="above the largest graph bucket"):
        cap.sized()
    with pytest.raises(FitError, match="above the largest graph bucket"):
        fit_model(cap)


def test_import_explain_races_and_the_fit_open_the_capture_through_the_front_door(
        varying, monkeypatch, tmp_path, capsys):
    _, path = varying
    want = open_capture(path).trace.meta["workload"]
    opened = []
    real = front_door.open_capture

    def spy(*args, **kwargs):
        cap = real(*args, **kwargs)
        opened.append(cap)
        return cap

    monkeypatch.setattr(front_door, "open_capture", spy)
    fitted = tmp_path / "fitted.yaml"
    for argv in (["import", str(path)], ["explain", str(path)], ["races", str(path)],
                 ["import", str(path), "--fit", "-o", str(fitted)]):
        opened.clear()
        assert main(argv) == 0, argv
        capsys.readouterr()
        assert len(opened) == 1, argv
        assert opened[0].trace.meta["workload"] == want, argv
    fit = fit_model(opened[0])  # the fit reads the sizes the capture was opened with
    assert fit.sizes is opened[0].sizes
