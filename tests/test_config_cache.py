"""The cache of validated configs (simwar.config.cache): a hit is exactly the config a fresh
validation gives, any change to what the validation read is a miss, errors are never cached,
and the command line's start-up leaves the garbage collector as it found it."""

from __future__ import annotations

import gc
import json
import os
import pickle
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from simwar.cli.app import main
from simwar.config import ConfigError, load_config, override_list
from simwar.config import cache as config_cache
from simwar.config.cache import load_cached

REPO = Path(__file__).resolve().parents[1]
#: configs of many kinds of section: built-in and custom tables, distributions, workloads,
#: ranks, a prefill (``custom.yaml`` is written by the test)
CONFIGS = ["configs/dspark_fine.yaml", "configs/dspark_fine_bimodal.yaml",
           "configs/eagle_fine_draft_extend_post_replay.yaml",
           "configs/sglang_default_prefill.yaml", "configs/tp2_slow_rank.yaml",
           "examples/overlap.yaml", "custom.yaml"]
CUSTOM = """\
name: custom-arrivals
algorithm: custom
phases:
  - {name: a, body_us: 5, reads: [req_to_token]}
  - {name: b, body_us: {dist: uniform, low: 1, high: 3}}
workload: {arrivals: {rate_per_s: 200}, max_batch: 8, output_tokens: 16}
"""


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """A cache of its own, on: the folder its entries go in."""
    monkeypatch.setenv("SIMWAR_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SIMWAR_NO_CACHE", raising=False)
    return tmp_path / "cache" / "configs"


def _fresh(source, sets: list[str]):
    return load_config(source, override_list(sets))


def _parse(sets: list[str]):
    return lambda: override_list(sets)


def _never():
    raise AssertionError("a hit parses no option")


def _identical(a, b, where: str = "config") -> None:
    """``a`` and ``b`` the same all the way down: models of the same class with the same
    fields set, private and extra values; mappings with the same keys in the same order;
    values of the same type, floats to the bit (``-0.0`` is not ``0.0``)."""
    assert type(a) is type(b), where
    if isinstance(a, BaseModel):
        assert a.model_fields_set == b.model_fields_set, where
        for part in ("__pydantic_private__", "__pydantic_extra__"):
            _identical(getattr(a, part), getattr(b, part), f"{where} {part}")
        _identical(a.__dict__, b.__dict__, where)
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _identical(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _identical(x, y, f"{where}.{i}")
    elif isinstance(a, float):
        assert struct.pack("<d", a) == struct.pack("<d", b), where
    else:
        assert a == b, where


def _same(a, b) -> None:
    """The very same config: the same models and values, dump and phase models."""
    _identical(a, b)
    assert a == b
    assert a.model_dump() == b.model_dump()
    _identical(a.phase_table(), b.phase_table(), "phase_table")


@pytest.mark.parametrize("name", CONFIGS)
def test_a_repeat_load_is_the_config_a_validation_gives(name, cache, tmp_path):
    path = REPO / name
    if name == "custom.yaml":
        path = tmp_path / name
        path.write_text(CUSTOM)
    sets = ["steps=300", "policy.barrier=coarse"]
    options = [f"--set {s}" for s in sets]
    first, items = load_cached(path, options, _parse(sets))
    assert len(list(cache.glob("*.pickle"))) == 1
    again, items_again = load_cached(path, options, _never)
    fresh = _fresh(path, sets)
    _same(first, fresh)
    _same(again, fresh)
    assert items_again == items == override_list(sets)


def test_the_packaged_default_and_options_are_keyed(cache):
    cfg, _ = load_cached(None, [], _parse([]))
    _same(load_cached(None, [], _never)[0], load_config(None))
    other, _ = load_cached(None, ["--set steps=77"], _parse(["steps=77"]))
    assert other.steps == 77 and cfg.steps != 77
    assert load_cached(None, ["--set steps=77"], _never)[0].steps == 77


def test_a_changed_file_is_validated_afresh(tmp_path, cache):
    path = tmp_path / "cfg.yaml"
    path.write_text("name: a\nsteps: 300\n")
    stamp = path.stat()
    assert load_cached(path, [], _parse([]))[0].steps == 300
    path.write_text("name: a\nsteps: 400\n")  # same size, same modification time
    os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    cfg, _ = load_cached(path, [], _parse([]))
    assert cfg.steps == 400
    _same(cfg, _fresh(path, []))


def test_an_invalid_file_gets_its_line_after_a_valid_one(tmp_path, cache):
    path = tmp_path / "cfg.yaml"
    path.write_text("steps: 300\n")
    load_cached(path, [], _parse([]))
    path.write_text("steps: -30\n")
    with pytest.raises(ConfigError) as fresh:
        _fresh(path, [])
    for _ in range(2):  # never cached
        with pytest.raises(ConfigError) as cached:
            load_cached(path, [], _parse([]))
        assert str(cached.value) == str(fresh.value)
    with pytest.raises(ConfigError) as bad_set:
        load_cached(None, ["--set steps=.inf"], _parse(["steps=.inf"]))
    assert str(bad_set.value) == "--set steps: expected a finite number, got .inf"


def test_another_environment_or_a_broken_entry_is_a_miss(tmp_path, cache, monkeypatch):
    path = tmp_path / "cfg.yaml"
    path.write_text("steps: 300\n")
    load_cached(path, [], _parse([]))
    (entry,) = cache.glob("*.pickle")
    real = config_cache._environment()
    monkeypatch.setattr(config_cache, "_environment", lambda: (*real, "another pydantic"))
    with pytest.raises(AssertionError, match="a hit parses no option"):
        load_cached(path, [], _never)
    load_cached(path, [], _parse([]))  # rewritten for this environment
    assert load_cached(path, [], _never)[0].steps == 300
    entry.write_bytes(entry.read_bytes()[:40])  # cut short
    cfg, _ = load_cached(path, [], _parse([]))
    _same(cfg, _fresh(path, []))
    assert load_cached(path, [], _never)[0].steps == 300


def test_a_changed_source_changes_the_environment(tmp_path, monkeypatch):
    package = tmp_path / "config"
    package.mkdir()
    source = package / "schema.py"
    source.write_text("A = 1\n")
    monkeypatch.setattr(config_cache, "SOURCES", (package,))
    before = config_cache._environment()
    source.write_text("A = 22\n")
    assert config_cache._environment() != before
    assert set(config_cache.SOURCES) == {package}
    monkeypatch.undo()
    assert {p.name for p in config_cache.SOURCES} == {"config", "core"}


def test_what_is_never_cached(tmp_path, cache, monkeypatch):
    (tmp_path / "sizes.csv").write_text("batch_size\n4\n8\n")
    path = tmp_path / "cfg.yaml"
    path.write_text("steps: 300\nworkload:\n  batch_sizes_file: sizes.csv\n")
    assert load_cached(path, [], _parse([]))[0].steps == 300
    assert not cache.exists() or not list(cache.glob("*.pickle"))  # (its CSV is part of it)
    monkeypatch.setenv("SIMWAR_NO_CACHE", "1")
    load_cached(None, [], _parse([]))
    assert not cache.exists() or not list(cache.glob("*.pickle"))


def _run_json(args: list[str], capsys) -> dict:
    assert main(["run", *args, "--json", "--quiet"]) == 0
    return json.loads(capsys.readouterr().out)


def test_simwar_run_answers_the_same_from_the_cache(cache, capsys):
    args = ["--set", "steps=200", "--set", "warmup_steps=10", "--set",
            "workload={arrivals: {rate_per_s: 200}, max_batch: 8, output_tokens: 16}",
            "--slo", "ttft=20ms"]
    cold = _run_json(args, capsys)
    (entry,) = cache.glob("*.pickle")
    written = entry.stat().st_mtime_ns
    assert _run_json(args, capsys) == cold
    assert entry.stat().st_mtime_ns == written  # read back, not validated and rewritten
    assert cold["name"].endswith("--set warmup_steps=10, --set workload={arrivals: {rate_per_s: "
                                 "200}, max_batch: 8, output_tokens: 16}, --slo ttft=20ms]")
    assert "goodput_per_s" in cold


def test_the_bad_run_inputs_get_their_lines_with_a_warm_cache(cache, tmp_path, monkeypatch,
                                                              capsys):
    import test_bad_inputs as corpus

    for n, case in enumerate(c for c in corpus.CASES if c["args"][0] == "run"):
        lines = []
        for attempt in range(2):  # the second with what the first cached
            work = (tmp_path / f"w{n}-{attempt}").resolve()
            work.mkdir()
            monkeypatch.chdir(work)
            assert main([corpus._fill(a, case, work) for a in case["args"]]) != 0
            lines.append(capsys.readouterr().err.replace(str(work), "{tmp}"))
            assert os.listdir(work) == []
        assert lines[0] == lines[1], case["args"]
    assert list(cache.iterdir()), "no case validated its config: the cache was never used"


def test_main_leaves_the_garbage_collector_as_it_found_it(capsys):
    assert gc.isenabled()
    assert main(["run", "--set", "steps=50", "--set", "warmup_steps=5", "--quiet"]) == 0
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert main(["run", "--races", "-1"]) == 2
    assert gc.isenabled() and gc.get_freeze_count() == 0
    capsys.readouterr()


def test_a_hit_reads_no_yaml_and_builds_no_validator(cache):
    code = ("import sys; from simwar.cli import main; main(); "
            "from simwar.config import Config, Phase; "
            "print(('yaml' in sys.modules, Config.__pydantic_complete__, "
            "Phase.__pydantic_complete__), file=sys.stderr)")
    env = {**os.environ, "SIMWAR_CACHE_DIR": str(cache.parent), "PYTHONPATH": str(REPO)}
    found = [subprocess.run([sys.executable, "-c", code, "run", "--set", "steps=50", "--quiet"],
                            env=env, capture_output=True, text=True, check=True).stderr.strip()
             for _ in range(2)]
    assert found == ["(True, True, True)", "(False, False, False)"]


#: a process validating configs through the cache, printing what it gave (each config's
#: dump and phase table, or its error line), whether it generated the Config's schema, and
#: that schema with its functions named (a partial by its function and arguments)
VALIDATE = """
import json, sys
import pydantic._internal._generate_schema as G
generated = []
inner = G.GenerateSchema._model_schema
def spy(self, cls):
    generated.append(cls.__name__)
    return inner(self, cls)
G.GenerateSchema._model_schema = spy
from simwar.config import Config, ConfigError, override_list
from simwar.config.cache import load_cached
out = []
for path, sets in json.loads(sys.argv[1]):
    try:
        cfg, _ = load_cached(path, [f"--set {s}" for s in sets], lambda: override_list(sets))
        out.append(repr((cfg.model_dump(), cfg.phase_table())))
    except ConfigError as e:
        out.append(str(e))
def named(x):
    if isinstance(x, dict):
        return {k: named(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [named(v) for v in x]
    if hasattr(x, "func") and hasattr(x, "args"):
        return ["partial", named(x.func), list(x.args)]
    if callable(x):
        return f"{getattr(x, '__module__', '')}.{getattr(x, '__qualname__', repr(x))}"
    return repr(x)
print(json.dumps({"generated": "Config" in generated, "out": out,
                  "schema": named(Config.__pydantic_core_schema__)}))
"""


def _validate(inputs: list, cache_dir: Path, **extra) -> dict:
    """:data:`VALIDATE` of ``inputs``, each a config not in the cache (its entries removed
    first: only the validator's schema is kept)."""
    for entry in (cache_dir / "configs").glob("*.pickle"):
        entry.unlink()
    env = {**os.environ, "SIMWAR_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(REPO)}
    env.pop("SIMWAR_NO_CACHE", None)
    env.update(extra)
    done = subprocess.run([sys.executable, "-c", VALIDATE, json.dumps(inputs)], env=env,
                          cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


def test_a_validator_built_from_the_kept_schema_is_the_generated_one(tmp_path):
    custom = tmp_path / "custom.yaml"
    custom.write_text(CUSTOM)
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: true\n")
    inputs = [[str(REPO / n) if n != "custom.yaml" else str(custom), ["steps=300"]]
              for n in CONFIGS]
    inputs += [[str(bad), []],  # each model's own rule (a boolean for a number)
               [None, ["workload={output_tokens: 0}"]],  # a partial's check (workload._count)
               [None, ["workload={output_tokens: {dist: uniform, low: 2}}"]],
               [None, ["gpu.writes=[]", "bogus=1"]], [None, ["warmup_steps=3000"]]]
    cache_dir = tmp_path / "cache"
    first = _validate(inputs, cache_dir)
    kept = cache_dir / "configs" / "validator"
    assert first["generated"] and kept.exists()
    second = _validate(inputs, cache_dir)
    assert not second["generated"], "the kept schema was not taken"
    assert second["out"] == first["out"]
    assert second["schema"] == first["schema"]
    assert sum(not o.startswith("(") for o in first["out"]) == 5  # the bad ones failed
    # a kept schema of another environment, or one cut short, is not taken (and is rewritten)
    with open(kept, "rb") as f:
        material = pickle.load(f)
        schema = pickle.load(f)
    kept.write_bytes(pickle.dumps((*material[:1], "another pydantic")) + pickle.dumps(schema))
    third = _validate(inputs[:2], cache_dir)
    assert third["generated"] and third["out"] == first["out"][:2]
    assert not _validate(inputs[:1], cache_dir)["generated"]  # (rewritten by the third)
    kept.write_bytes(kept.read_bytes()[:100])
    assert _validate(inputs[:1], cache_dir)["generated"]
    # a kept schema that does not build (or is no schema) is a miss too, and is rewritten
    for payload in ({"type": "no such schema"}, ["not a schema"]):
        kept.write_bytes(pickle.dumps(material) + pickle.dumps(payload))
        again = _validate(inputs, cache_dir)
        assert again["generated"] and again["out"] == first["out"]
        assert not _validate(inputs[:1], cache_dir)["generated"]
    # with the cache off nothing is written
    off = tmp_path / "off"
    assert _validate(inputs[:1], off, SIMWAR_NO_CACHE="1")["generated"]
    assert not off.exists()
