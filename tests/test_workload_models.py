"""The workload section as a discriminated union: each batch source is its own model, picked
by the key a user's file gives (no ``kind:`` key), and the CSV of batch sizes is read by the
loader, never by the validation.

What each source models is in ``tests/test_workload.py`` and ``tests/test_prefill.py``; the
error lines of bad workloads in ``tests/data/bad/`` (``tests/test_bad_inputs.py``).
"""

from __future__ import annotations

import builtins
import pathlib

import pytest

from simwar.builder.sizes import draw_sizes
from simwar.config import ConfigError, load_config
from simwar.config.schema import (
    REQUEST_SOURCES,
    ArrivingRequests,
    BatchSizes,
    BatchSizesFile,
    ClosedLoopRequests,
    Config,
    ConstantBatch,
    DrawnBatch,
)
from simwar.config.workload import WORKLOAD_KEYS

REQUESTS = {"output_tokens": 8, "max_batch": 16}
#: one workload per batch source: (mapping, its model, its source)
SOURCES = {
    "constant": ({"graph_buckets": [8, 64]}, ConstantBatch, "constant"),
    "batch_sizes": ({"batch_sizes": [3, 9]}, BatchSizes, "batch_sizes"),
    "batch_size": ({"batch_size": 12}, DrawnBatch, "batch_size"),
    "batch_size_dist": ({"batch_size": {"dist": "uniform", "low": 1, "high": 8}}, DrawnBatch,
                        "batch_size"),
    "arrivals_rate": ({"arrivals": {"rate_per_s": 100}, **REQUESTS}, ArrivingRequests,
                      "arrivals"),
    "arrivals_trace": ({"arrivals": {"trace": {"arrival_us": [0, 5], "output_tokens": [4, 6]}},
                        "max_batch": 4}, ArrivingRequests, "arrivals"),
    "closed_loop": ({"closed_loop": {"concurrency": 4}, "output_tokens": 8}, ClosedLoopRequests,
                    "closed_loop"),
}


@pytest.mark.parametrize("name", SOURCES)
def test_each_batch_source_parses_to_its_own_model(name):
    mapping, model, source = SOURCES[name]
    wl = load_config(None, {"workload": mapping}).workload
    assert type(wl) is model and wl.source == source
    # the other models' keys are not fields of this one
    others = {k for k in WORKLOAD_KEYS if k not in model.model_fields}
    assert not others & set(mapping)


def test_a_batch_file_parses_to_its_own_model(tmp_path):
    (tmp_path / "steps.csv").write_text("batch_size\n4\n7\n")
    wl = load_config(None, {"workload": {"batch_sizes_file": str(tmp_path / "steps.csv")}}).workload
    assert type(wl) is BatchSizesFile and wl.source == "batch_sizes_file"
    assert wl.file_sizes() == [4, 7]


def test_keys_given_as_null_are_not_given():
    wl = load_config(None, {"workload": {"batch_sizes": [2], "arrivals": None, "max_batch": None,
                                         "initial_batch": 0}}).workload
    assert type(wl) is BatchSizes and wl.batch_sizes == [2]


def test_a_closed_loop_is_not_reported_as_arrivals():
    closed = load_config(None, {"workload": SOURCES["closed_loop"][0]}).workload
    arriving = load_config(None, {"workload": SOURCES["arrivals_rate"][0]}).workload
    assert closed.source == "closed_loop" and not isinstance(closed, ArrivingRequests)
    assert arriving.source == "arrivals" and not isinstance(arriving, ClosedLoopRequests)
    # both are requests, asked for by name
    assert {closed.source, arriving.source} == set(REQUEST_SOURCES)
    assert closed.max_batch == 4  # the concurrency, unless given


def test_a_closed_loop_keeps_the_name_saved_traces_give_it():
    cfg = load_config(None, {"steps": 30, "warmup_steps": 2,
                             "workload": SOURCES["closed_loop"][0]})
    sizes = draw_sizes(cfg)
    assert sizes.source == "closed_loop"
    assert sizes.meta()["source"] == "arrivals"


def test_a_closed_loop_sends_its_listed_lengths_first_then_draws():
    """``closed_loop.lengths``: the i-th request sent has the i-th lengths (a measured run's
    own requests, replayed); past the lists, the draws a run without them would begin with."""
    from simwar.api import simulate

    wl = {"closed_loop": {"concurrency": 3}, "output_tokens": {"dist": "uniform", "low": 1,
                                                                 "high": 9},
          "prompt_tokens": {"dist": "uniform", "low": 10, "high": 600}, "max_batch": 3}
    pf = {"chunk_tokens": 256, "forward_us": {"per_token": 2}}
    listed = {"output_tokens": [7, 1, 4, 9], "prompt_tokens": [500, 12, 300, 33]}
    runs = [simulate(None, {"steps": 80, "warmup_steps": 0, "prefill": pf, "engine": "simpy",
                            "workload": w}).requests
            for w in (wl, {**wl, "closed_loop": {"concurrency": 3, "lengths": listed}})]
    drawn, replayed = (r.sort_values("arrival_us", kind="stable") for r in runs)
    n = len(listed["output_tokens"])
    for key in ("output_tokens", "prompt_tokens"):
        assert replayed[key].tolist()[:n] == listed[key]
        assert replayed[key].tolist()[n:n + 5] == drawn[key].tolist()[:5]
    with pytest.raises(ConfigError, match=r"closed_loop.lengths.prompt_tokens: give it with "
                                          r"workload.prompt_tokens"):
        load_config(None, {"workload": {**wl, "prompt_tokens": None,
                                        "closed_loop": {"concurrency": 3, "lengths": listed}}})


def test_a_trace_that_ends_before_the_run_is_one_line_in_every_engine():
    """A trace whose requests have all finished with steps still to run: one line naming
    the key, the same from both engines, in place of an IndexError where the loop waited
    for a request past the trace's last (the lab's replays of slower hosts ran into it)."""
    from simwar.api import simulate

    change = {"steps": 200, "warmup_steps": 0, "workload": {
        "max_batch": 8, "arrivals": {"trace": {"arrival_us": [0, 10], "output_tokens": [4, 4]}}}}
    for engine in ("simpy", "fast"):
        with pytest.raises(ConfigError, match=r"^workload.arrivals.trace: its 2 requests have "
                                              r"all finished by step 4 of 200 "):
            simulate(None, {**change, "engine": engine})
    assert simulate(None, {**change, "steps": 4}).summary["requests_completed"] == 2


def test_the_rules_for_requests_hold_for_a_closed_loop_by_name():
    closed = {"workload": SOURCES["closed_loop"][0]}
    with pytest.raises(ConfigError, match="are not modelled with parallel.tp > 1"):
        load_config(None, {**closed, "parallel": {"tp": 2}})
    cfg = load_config(None, {**closed, "slo": {"ttft": 1000}})
    assert cfg.slo == {"ttft": 1000.0}


def test_validating_a_mapping_with_a_file_name_does_not_touch_the_file_system(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the validation read the file system")

    for name in ("exists", "is_dir", "read_text", "open", "stat"):
        monkeypatch.setattr(pathlib.Path, name, refuse)
    monkeypatch.setattr(builtins, "open", refuse)
    cfg = Config.model_validate({"workload": {"batch_sizes_file": "no_such_dir/steps.csv"}})
    monkeypatch.undo()
    wl = cfg.workload
    assert type(wl) is BatchSizesFile and not wl.read
    with pytest.raises(ConfigError, match="no_such_dir/steps.csv: not read"):
        wl.file_sizes()


def test_the_loader_reads_the_file_and_the_validation_checks_its_sizes(tmp_path):
    (tmp_path / "steps.csv").write_text("step,batch_size\n0,4\n1,70\n")
    config = tmp_path / "c.yaml"
    config.write_text("workload:\n  batch_sizes_file: steps.csv\n  graph_buckets: [8, 64]\n")
    with pytest.raises(ConfigError) as e:
        load_config(config)
    assert str(e.value) == (f"{config}: workload.batch_sizes_file: {tmp_path / 'steps.csv'}: "
                            f"line 3: batch 70 at step 1 is above the largest graph bucket (64)")


def test_the_file_is_not_read_when_another_source_is_given(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(None, {"workload": {"batch_sizes_file": str(tmp_path / "missing.csv"),
                                        "batch_sizes": [1]}})
    assert "give one batch source" in str(e.value) and "file not found" not in str(e.value)


@pytest.mark.parametrize("name", SOURCES)
def test_a_dump_lists_every_workload_key_and_loads_back(name):
    cfg = load_config(None, {"workload": SOURCES[name][0]})
    dumped = cfg.model_dump(mode="json")["workload"]
    assert list(dumped) == list(WORKLOAD_KEYS)
    again = load_config(cfg.model_dump())
    assert again.workload == cfg.workload


def test_every_field_of_the_config_has_a_description():
    import typing

    from pydantic import BaseModel

    from simwar.config.reference import field_descriptions

    def models(annotation):
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            return [annotation]
        return [m for arg in typing.get_args(annotation) for m in models(arg)]

    missing, seen, todo = [], set(), [("", Config)]
    while todo:
        prefix, model = todo.pop()
        if model in seen:
            continue
        seen.add(model)
        described = field_descriptions(model)
        for name, field in model.model_fields.items():
            if not described[name]:
                missing.append(f"{model.__name__}.{name}")
            todo += [(f"{prefix}{name}.", m) for m in models(field.annotation)]
    assert len(seen) > 20 and missing == []
