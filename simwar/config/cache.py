"""The cache of validated configs: ``simwar run`` of a config file it has run before, with the
same options, reads the validated config back instead of reading the YAML and validating it.

A run's first validation builds pydantic's validator of the Config, its schema generated in
Python at every start (with the YAML's import and parse, a sixth of a short run's CPU time);
the cache gives a repeat run the very config that validation gave (the same models, the same
values, its phase models and the overrides as parsed), pickled.

An entry is used only when everything its validation read is the same, compared in full, not
by a hash: the config file's bytes, its path and the options' text (``--set``, ``--slo``),
simwar's version and the size and modification time of each source file of
:mod:`simwar.config` and of :mod:`simwar.core`, the one package of simwar it imports (as
Python's own bytecode cache checks its sources), the versions of
Python, pydantic, pydantic-core and PyYAML, and the registered barrier policies. Otherwise
the config is validated afresh and the entry rewritten. Never cached: an invalid config (its
error line comes from the validation, every time), a config that names another file (a
workload's ``batch_sizes_file``, or per-rank overrides, which may), a ``--costs`` file, a
stream (``<(cat cfg.yaml)``). An entry that cannot be read back is a miss; one that cannot be
written is not written (the run goes on).

The cache also keeps the core schema of the Config's validator (one entry, ``validator``,
beside the configs' entries), for the same environment (simwar's and the libraries' versions
and the sources above): a run whose config is not in the cache still validates it, but its
validator is built from that schema rather than generating it in Python
(:func:`simwar.config.schema.build_validator_from`; generating it is nearly all of building the
validator: about 12 ms of a first run's start-up, against under 2 ms from the kept schema).
The first run of an install (or of changed sources) generates it and writes the entry; an
entry that cannot be read back, or whose schema pydantic does not build, is a miss.

Where: ``$SIMWAR_CACHE_DIR/configs``, else ``configs`` in the user's cache directory
(``$XDG_CACHE_HOME/simwar``, ``~/.cache/simwar``; ``~/Library/Caches/simwar`` on macOS,
``%LOCALAPPDATA%\\simwar`` on Windows: platformdirs' rules, written out as importing it
costs 2.5 ms of the start-up this saves). ``SIMWAR_NO_CACHE=1`` turns the cache off. The
directory is its owner's only (mode 0700): an entry is a pickle, read only from a place the
user alone writes. At most :data:`MAX_ENTRIES` entries, the oldest removed first.

Imports: the modules of :mod:`simwar.config` below it; pydantic's and PyYAML's
versions are read without importing PyYAML (a hit reads no YAML).
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import sys
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path

import pydantic
import pydantic_core

import simwar
from simwar.config.load import DEFAULT_CONFIG, Override, load_config
from simwar.config.phases import share_phase_models
from simwar.config.policies import BARRIERS
from simwar.config.schema import Config, build_validator_from
from simwar.config.workload import BatchSizesFile

#: the environment variable naming the cache's directory (its ``configs`` folder)
CACHE_DIR_ENV = "SIMWAR_CACHE_DIR"
#: the environment variable that turns the cache off (any value but empty or 0)
NO_CACHE_ENV = "SIMWAR_NO_CACHE"
#: entries kept; writing one more removes the oldest
MAX_ENTRIES = 256
#: the packages whose sources a validation runs: the config's and the one below it (layers:
#: simwar.config imports only simwar.core of simwar's own modules, tests/test_layers.py)
SOURCES = (Path(__file__).parent, Path(__file__).parents[1] / "core")
#: the layout of an entry (bumped when it changes: an entry of another layout is a miss)
FORMAT = 1
#: the entry of the Config validator's core schema, in the entries' folder (not a
#: ``*.pickle``: not one of the :data:`MAX_ENTRIES`)
VALIDATOR = "validator"


def cache_dir() -> Path | None:
    """The folder of the cache's entries, or None when the cache is off."""
    if os.environ.get(NO_CACHE_ENV, "") not in ("", "0"):
        return None
    explicit = os.environ.get(CACHE_DIR_ENV)
    if explicit:
        return Path(explicit).expanduser() / "configs"
    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Caches"
    elif os.name == "nt":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        xdg = os.environ.get("XDG_CACHE_HOME", "")
        base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "simwar" / "configs"


def load_cached(source: str | Path | None, options: list[str],
                overrides: Callable[[], list[Override]]) -> tuple[Config, list[Override]]:
    """``load_config(source, overrides())`` and the overrides, from the cache when it holds
    this run's config (see the module docstring).

    ``options``: the command line's text that ``overrides`` parses (``--set k=v``, ``--slo
    ...``): a hit does not call it (a ``--set`` value is YAML: parsing it imports PyYAML).
    Errors are :func:`load_config`'s, raised in the same order (a hit is a config that
    validated with these very inputs)."""
    where = cache_dir()
    if where is None:
        items = overrides()
        return load_config(source, items), items
    path = Path(DEFAULT_CONFIG if source is None else source)
    text = _bytes_of(path)
    environment = _environment()
    if text is None:
        items = overrides()
        return _validated(where, environment, source, items), items
    material = (FORMAT, environment, str(source), text, tuple(options))
    entry = where / f"{zlib.crc32(repr((os.path.abspath(path), options)).encode()):08x}.pickle"
    hit = _read(entry, material)
    if hit is not None:
        return hit
    items = overrides()
    cfg = _validated(where, environment, source, items)
    if (not isinstance(cfg.workload, BatchSizesFile)
            and not (cfg.ranks is not None and cfg.ranks.per_rank)
            and _bytes_of(path) == text):  # not changed while it was validated
        _write(where, entry, material, (cfg, cfg.phase_table(), items))
    return cfg, items


def _validated(where: Path, environment: tuple, source, items: list[Override]) -> Config:
    """``load_config(source, items)``, its validator (where this process has not built it
    yet) built from the cache's schema when it holds one for ``environment``; where it did
    not, the schema that the validation generated is written to it (a config that fails
    validation too: its schema was generated all the same)."""
    entry = where / VALIDATOR
    material = (FORMAT, environment)
    built = Config.__pydantic_complete__
    kept = None if built else _load(entry, material)
    if not isinstance(kept, dict):
        kept = None
    if kept is not None:  # the validator built now, from the kept schema
        try:
            build_validator_from(kept)
        except Exception:  # noqa: BLE001  (a kept schema that does not build is a miss: the
            kept = None  # validation generates it, and the entry is rewritten)
    try:
        return load_config(source, items)
    finally:
        if not built and kept is None and Config.__pydantic_complete__:
            _write(where, entry, material, Config.__pydantic_core_schema__)


def _bytes_of(path: Path) -> bytes | None:
    """A regular file's bytes; None for anything else (a stream is read once, by the
    validation; a missing file's error is the validation's)."""
    try:
        return path.read_bytes() if path.is_file() else None
    except OSError:
        return None


def _environment() -> tuple:
    """What a validation depends on besides its inputs (see the module docstring)."""
    sources = []
    for package in SOURCES:
        with os.scandir(package) as entries:
            sources += sorted((f"{package.name}/{e.name}", e.stat().st_size, e.stat().st_mtime_ns)
                              for e in entries if e.name.endswith(".py"))
    barriers = tuple((name, type(b).__module__, type(b).__qualname__)
                     for name, b in BARRIERS.items())
    return (simwar.__version__, sys.version, pydantic.VERSION, pydantic_core.__version__,
            _yaml_stamp(), tuple(sources), barriers)


def _yaml_stamp() -> tuple | None:
    """PyYAML's ``__init__.py`` (it holds the version), by size and modification time,
    without importing it."""
    spec = importlib.util.find_spec("yaml")
    if spec is None or not spec.origin:
        return None
    st = os.stat(spec.origin)
    return spec.origin, st.st_size, st.st_mtime_ns


def _load(entry: Path, material: tuple):
    """The entry's payload when it was written for ``material``; None otherwise (no entry,
    another input, or one that cannot be read back)."""
    try:
        with open(entry, "rb") as f:
            if pickle.load(f) != material:
                return None
            return pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception:  # noqa: BLE001  (any entry that cannot be read back is a miss: the
        return None  # validation runs as without a cache, and the entry is rewritten)


def _read(entry: Path, material: tuple) -> tuple[Config, list[Override]] | None:
    """The entry's config and overrides when it was written for ``material``; None
    otherwise (no entry, another input, or one that cannot be read back)."""
    payload = _load(entry, material)
    try:
        cfg, models, items = payload
    except (TypeError, ValueError):
        return None
    if type(cfg) is not Config:
        return None
    share_phase_models(cfg.phases, models)
    return cfg, items


def _write(where: Path, entry: Path, material: tuple, payload: tuple) -> None:
    """Write an entry (atomically: a reader sees the old one or the new one), then keep the
    newest :data:`MAX_ENTRIES`."""
    try:
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        blob = (pickle.dumps(material, protocol=pickle.HIGHEST_PROTOCOL)
                + pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL))
        fd, tmp = tempfile.mkstemp(dir=where, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, entry)
        except BaseException:
            os.unlink(tmp)
            raise
        entries = sorted(where.glob("*.pickle"), key=lambda p: p.stat().st_mtime_ns)
        for old in entries[:-MAX_ENTRIES]:
            old.unlink(missing_ok=True)
    except (OSError, pickle.PicklingError, AttributeError, TypeError):
        return  # the cache is only a shortcut: the run goes on (a payload that does not pickle,
        # such as a schema holding a lambda a later change adds, is not written)


__all__ = ["CACHE_DIR_ENV", "MAX_ENTRIES", "NO_CACHE_ENV", "cache_dir", "load_cached"]
