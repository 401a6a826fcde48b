"""Loading a config: YAML files, dotted overrides, validation, and the error's blame.

:func:`read_yaml` is the one reader of simwar's YAML files (configs, sweeps, import
mappings, costs files) and :func:`yaml_value` of a ``--set`` value, with three rules of
their own on top of PyYAML's safe loader: a mapping that gives a key twice is an error
naming the key and both lines (YAML would keep the last silently); ``.nan``, ``.inf`` and
numbers too large for a float are errors naming the key and line (no duration, count or
rate is infinite); and ``1e3`` is the number 1000, as YAML 1.2 reads it (YAML 1.1, which
PyYAML follows, needs ``1.0e+3``).

:func:`load_config` reads a YAML file (or takes a mapping or a Config), applies the dotted
overrides (``--set policy.barrier=coarse``, a costs file's keys: :class:`Override`), reads
the files the config names (a workload's CSV of batch sizes: :func:`read_batch_sizes`) and
validates the result against :class:`simwar.config.schema.Config`, giving it what the files
hold. A :class:`ConfigError`
names the place to fix: the file and key, or the override that caused it (:func:`_blame`).

Imports: :mod:`simwar.config.schema` and :mod:`simwar.config.workload`, yaml at the first YAML
read (:func:`_loader_classes`); nothing from
builder, executors or above.
"""

from __future__ import annotations

import copy
import csv
import functools
import json
import math
import re
from pathlib import Path
from typing import Any, NamedTuple

from pydantic import ValidationError

from simwar.config.schema import SLO_METRICS, Config, ConfigError, first_error
from simwar.config.workload import READ_FILES, SOURCE_KEYS, batch_error, positive_int

#: the packaged default config (DSPARK, fine barrier): ``load_config(None)``
DEFAULT_CONFIG = Path(__file__).parents[1] / "data" / "default.yaml"


#: how deep collections may nest in a YAML file (simwar's deepest key is a few levels; the
#: bound keeps PyYAML's recursive composer far from Python's recursion limit)
MAX_DEPTH = 64
#: how many values a YAML document may hold once its aliases are expanded (a "billion
#: laughs" of nested aliases is a few lines that expand to billions; everything that reads
#: a config afterwards, validation and copies included, walks the expansion)
MAX_NODES = 1_000_000


@functools.cache
def _loader_classes() -> tuple[type, type | None]:
    """PyYAML's safe loader, with YAML 1.2's floats: ``1e3`` and ``2E-5`` are numbers, and
    collections nested at most :data:`MAX_DEPTH` deep; and the same loader reading its events
    from libyaml (PyYAML's C parser) where PyYAML was built with it, else None.

    The second reads a document in C up to its events, then composes, checks and constructs
    it as the first does (the same Python composer, with its depth guard, and the same
    resolver and constructor: the same values); PyYAML's own C loader composes in C too,
    which has no depth guard (a document nested a million deep overflows its stack).
    Made at the first YAML read (yaml is imported then, not with the config: a run whose
    config comes from the cache of validated configs, :mod:`simwar.config.cache`, reads no
    YAML)."""
    import yaml
    from yaml.composer import Composer
    from yaml.constructor import SafeConstructor
    from yaml.resolver import Resolver

    class _Depth:
        _depth = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.MappingStartEvent, yaml.SequenceStartEvent):
                self._depth += 1
                try:
                    if self._depth > MAX_DEPTH:
                        mark = self.peek_event().start_mark
                        raise YamlRuleError(f"nested deeper than {MAX_DEPTH} levels (line "
                                            f"{mark.line + 1})")
                    return super().compose_node(parent, index)
                finally:
                    self._depth -= 1
            return super().compose_node(parent, index)

    class _Loader(_Depth, yaml.SafeLoader):
        pass

    _Loader.yaml_implicit_resolvers = {k: list(v) for k, v in
                                       yaml.SafeLoader.yaml_implicit_resolvers.items()}
    _Loader.add_implicit_resolver(
        "tag:yaml.org,2002:float",
        re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
        list("-+0123456789."))
    if not yaml.__with_libyaml__:
        return _Loader, None

    class _CLoader(_Depth, Composer, yaml.cyaml.CParser, SafeConstructor, Resolver):
        # Composer before CParser: its get_single_node (and compose_node) replace the C ones
        def __init__(self, stream):
            yaml.cyaml.CParser.__init__(self, stream)
            Composer.__init__(self)
            SafeConstructor.__init__(self)
            Resolver.__init__(self)

    _CLoader.yaml_implicit_resolvers = _Loader.yaml_implicit_resolvers
    return _Loader, _CLoader


_FLOAT_TAG = "tag:yaml.org,2002:float"


class YamlRuleError(ValueError):
    """A document PyYAML would read, against one of :func:`read_yaml`'s own rules."""


def _check_node(loader, node, where: str) -> None:
    """Duplicate keys and non-finite numbers anywhere under ``node`` (``where``: its key),
    and at most :data:`MAX_NODES` values once aliases are expanded.

    Each node is checked once, however many aliases name it (a node met again is an alias:
    its expanded size is remembered, not walked again)."""
    import yaml

    sizes: dict[int, int] = {}
    if _checked(loader, node, where, sizes, yaml) > MAX_NODES:
        raise YamlRuleError(f"more than {MAX_NODES:,} values once its aliases (*name) are "
                            f"expanded; write the values out or use fewer aliases")


def _checked(loader, node, where: str, sizes: dict[int, int], yaml) -> int:
    """:func:`_check_node` of one node: its expanded size (values under it, itself
    included), each node checked once (``sizes``: the nodes already checked; ``yaml``: the
    module, imported once by the caller rather than at each node)."""
    if id(node) in sizes:
        return sizes[id(node)]
    sizes[id(node)] = 1  # a recursive alias (a node inside itself) counts once
    size = 1
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = key.value if isinstance(key, yaml.ScalarNode) else None
            child = f"{where}.{name}" if where else str(name)
            if name is not None and name != "<<":  # merge keys may repeat
                line = key.start_mark.line + 1
                if name in seen:
                    raise YamlRuleError(f"{child}: duplicate key (lines {seen[name]} and "
                                        f"{line}); give it once")
                seen[name] = line
            size += 1 + _checked(loader, value, child, sizes, yaml)
            if size > MAX_NODES:
                break
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            size += _checked(loader, item, f"{where}.{i}" if where else str(i), sizes, yaml)
            if size > MAX_NODES:
                break
    elif isinstance(node, yaml.ScalarNode) and node.tag == _FLOAT_TAG:
        text = node.value
        value = loader.construct_yaml_float(node)
        if not math.isfinite(value):
            raise YamlRuleError(f"{where or 'value'}: expected a finite number, got {text} "
                                f"(line {node.start_mark.line + 1})")
    sizes[id(node)] = size
    return size


def load_yaml_text(text: str) -> Any:
    """A YAML document under :func:`read_yaml`'s rules (``YamlRuleError`` when broken).

    Read with libyaml's events where PyYAML has them (:func:`_loader_classes`); a document
    that fails there, or holds a character PyYAML's reader refuses, is read again by the
    pure-Python loader, whose error (and its line and column) is the one raised: an error
    reads the same with or without libyaml."""
    import yaml

    python, c = _loader_classes()
    if c is not None and not yaml.reader.Reader.NON_PRINTABLE.search(text):
        try:
            return _load(c, text)
        except (yaml.YAMLError, YamlRuleError):
            pass  # read again for the pure-Python loader's words
    return _load(python, text)


def _load(loader_class: type, text: str) -> Any:
    """``text`` read by ``loader_class`` under :func:`read_yaml`'s rules."""
    loader = loader_class(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_node(loader, node, "")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def yaml_value(raw: str) -> Any:
    """A ``--set`` value as YAML reads it (text that is not YAML stays text); a non-finite
    number is a :class:`ConfigError`."""
    import yaml  # lazy: see _loader_classes

    try:
        value = load_yaml_text(raw)
    except YamlRuleError as e:
        raise ConfigError(str(e).split(" (line ")[0]) from None
    except yaml.YAMLError:
        return raw
    return value


#: the text of each stream read (a FIFO, ``<(cat file)``): a command reads a file more than
#: once (is it a sweep? then load it), and a stream gives its text to the first read only
_STREAMS: dict[str, str] = {}


def _text_of(path: Path) -> str:
    """``path``'s text; a stream's is read once and kept for the process's later reads."""
    if path.is_file():
        return path.read_text()
    key = str(path)
    if key not in _STREAMS:
        _STREAMS[key] = path.read_text()
    return _STREAMS[key]


def read_yaml(path: str | Path) -> dict:
    """The top-level mapping of a YAML file; a missing, unreadable or empty file is an error,
    and so are a key given twice and a non-finite number (see the module docstring)."""
    import yaml  # lazy: see _loader_classes

    path = Path(path)
    if not path.exists():
        raise ConfigError(f"{path}: file not found")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory (expected a YAML file)")
    try:
        data = load_yaml_text(_text_of(path))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file (expected YAML)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    except YamlRuleError as e:
        raise ConfigError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    if data is None:  # nothing but blank lines and comments
        raise ConfigError(f"{path}: the file is empty (expected a YAML mapping)")
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    bad_key = next((key for key in data if not isinstance(key, str)), None)
    if bad_key is not None:
        raise ConfigError(f"{path}: {bad_key}: expected a key name at the top level, got the "
                          f"{type(bad_key).__name__} {bad_key!r}")
    return data


def resolve_paths(data: dict, root: str | Path) -> dict:
    """``data`` with its relative file paths (``workload.batch_sizes_file``) made relative to
    ``root`` (the directory of the file they were written in)."""
    wl = data.get("workload")
    if isinstance(wl, dict) and isinstance(wl.get("batch_sizes_file"), str):
        path = Path(wl["batch_sizes_file"]).expanduser()
        if not path.is_absolute():
            wl["batch_sizes_file"] = str(Path(root) / path)
    return data


class Override(NamedTuple):
    """A dotted-key override and where it came from, as an error message names it."""

    key: str
    value: Any
    origin: str  # "--set policy.barrier=coarse", "--costs fitted.yaml", ...


def override_list(overrides: list | dict | None) -> list[Override]:
    """``["key=value", ...]``, ``{key: value}`` or Overrides, as a list of :class:`Override`."""
    if not overrides:
        return []
    if isinstance(overrides, dict):
        return [Override(k, v, f"--set {k}={_value_text(v)}") for k, v in overrides.items()]
    out = []
    for item in overrides:
        if isinstance(item, Override):
            out.append(item)
        else:
            key, value = parse_override(item)
            out.append(Override(key, value, f"--set {item}"))
    return out


def _value_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


#: the units ``--slo`` accepts, in µs (a bare number is in ms)
SLO_UNITS = {"us": 1.0, "µs": 1.0, "ms": 1e3, "s": 1e6}


def parse_slo(text: str) -> dict[str, float]:
    """``--slo ttft=200ms,tpot=30ms`` → ``{"ttft": 200000.0, "tpot": 30000.0}`` (µs; a bare
    number is in ms; the metrics: :data:`simwar.config.schema.SLO_METRICS`)."""
    out: dict[str, float] = {}
    for item in [x.strip() for x in text.split(",") if x.strip()] or [""]:
        where = f"--slo {item}"
        if "=" not in item:
            raise ConfigError(f"{where}: expected metric=bound, e.g. ttft=200ms,tpot=30ms")
        metric, raw = (x.strip() for x in item.split("=", 1))
        if metric not in SLO_METRICS:
            raise ConfigError(f"{where}: not a request metric (one of "
                              f"{', '.join(SLO_METRICS)})")
        unit = next((u for u in sorted(SLO_UNITS, key=len, reverse=True) if raw.endswith(u)),
                    "")
        try:
            value = float(raw[:len(raw) - len(unit)]) * SLO_UNITS.get(unit, 1e3)
        except ValueError:
            value = math.nan
        if not value > 0 or not math.isfinite(value):
            raise ConfigError(f"{where}: a bound > 0 with a unit (us, ms or s), got {raw!r}")
        out[metric] = value
    return out


def parse_override(item: str, option: str = "--set") -> tuple[str, Any]:
    """``key.path=value`` → (key.path, YAML-parsed value); ``option``: the option that gave
    it, as its errors name it (``--set``, ``--where``)."""
    if "=" not in item:
        raise ConfigError(f"{option} {item}: expected key.path=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"{option} {item}: empty key")
    try:
        value = yaml_value(raw)
    except ConfigError as e:
        raise ConfigError(f"{option} {key}: {str(e).removeprefix('value: ')}") from None
    return key, value


def set_dotted(data: dict, key: str, value: Any) -> None:
    """Set ``a.b.0.c`` in nested dicts/lists; ``phases.NAME.key`` targets a phase by name."""
    parts = key.split(".")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        nxt_is_last = i == len(parts) - 2
        if not isinstance(node, (dict, list)):
            raise _not_a_section(parts[:i], node)
        if isinstance(node, list):
            node = _list_item(node, part, key)
            continue
        if part == "phases" and not nxt_is_last and not parts[i + 1].isdigit():
            phases = node.setdefault("phases", [])
            name = parts[i + 1]
            entry = next((p for p in phases if isinstance(p, dict) and p.get("name") == name),
                         None)
            if entry is None:
                if data.get("algorithm") == "custom":  # a custom table is given whole
                    names = [p.get("name") for p in phases if isinstance(p, dict)]
                    raise ConfigError(f"phases.{name}: '{name}' is not a phase of the custom "
                                      f"table ({', '.join(map(str, names))}); to add a "
                                      f"phase, list it in phases")
                entry = {"name": name}
                phases.append(entry)
            node = {"__phase__": entry}
            continue
        if "__phase__" in node:
            node = node["__phase__"]
            continue
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        node = child
    last = parts[-1]
    if isinstance(node, dict) and "__phase__" in node:
        node = node["__phase__"]
    if isinstance(node, list):
        idx = _index(node, last, key)
        node[idx] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise _not_a_section(parts[:-1], node)


def get_dotted(data: dict, key: str) -> Any:
    """The value at ``a.b.0.c`` in nested dicts/lists, walked as :func:`set_dotted` walks it
    (``phases.NAME.key``: a phase by name); KeyError where nothing is there."""
    node: Any = data
    for part in key.split("."):
        if isinstance(node, list):
            if part.isdigit() and int(part) < len(node):
                node = node[int(part)]
                continue
            node = next((p for p in node if isinstance(p, dict) and p.get("name") == part),
                        None)
            if node is None:
                raise KeyError(key)
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            raise KeyError(key)
    return node


def _not_a_section(parts: list[str], node: Any) -> ConfigError:
    """A dotted key that goes on past a plain value (``name.foo.bar``: ``name`` is text)."""
    return ConfigError(f"{'.'.join(parts)}: is {_kind(node)}, not a section with keys")


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return f"the boolean {str(value).lower()}"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return f"the text {value!r}"
    return f"a {type(value).__name__}"


def _index(node: list, part: str, key: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(f"{key}: '{part}' is not an index of a list of {len(node)}")
    return int(part)


def _list_item(node: list, part: str, key: str) -> Any:
    return node[_index(node, part, key)]


def load_config(source: str | Path | dict | Config | None = None,
                overrides: list[str] | dict | None = None) -> Config:
    """Load and validate a config.

    ``source``: a YAML path, a mapping, a Config, or None for the packaged
    default (DSPARK, fine barrier). ``overrides``: ``["key.path=value", ...]``
    or a ``{dotted.key: value}`` mapping, applied before validation.
    """
    if isinstance(source, Config) and not overrides:
        return source
    label = "<config>"
    if source is None:
        source = DEFAULT_CONFIG
    if isinstance(source, Config):
        data = source.model_dump()
    elif isinstance(source, dict):
        data = copy.deepcopy(source)
    else:
        label = str(source)
        data = resolve_paths(read_yaml(source), Path(source).parent)
    items = override_list(overrides)
    source_data = copy.deepcopy(data) if items else data
    for item in items:
        try:
            # a copy: a later dotted key must not write into the caller's mapping
            set_dotted(data, item.key, copy.deepcopy(item.value))
        except ConfigError as e:
            raise ConfigError(f"{item.origin}: {e}") from None
    try:
        return validate(data, label)
    except ConfigError as e:
        raise _blame(e, label, source_data, items) from None


def _blame(error: ConfigError, label: str, source_data: dict,
           items: list[Override]) -> ConfigError:
    """The error, naming the override that caused it rather than the file when it was one."""
    if not items:
        return error
    text = str(error)
    bad = text[len(label) + 2:] if text.startswith(label + ": ") else text
    match = re.match(r"([\w.-]+): ", bad)
    failing = match.group(1) if match else None
    if failing is not None:
        for item in reversed(items):  # the last override of a key is the one that counts
            if failing == item.key or failing.startswith(item.key + "."):
                if item.origin.startswith("--set "):
                    return ConfigError(f"--set {item.key}: {bad[len(item.key) + 1:].strip()}")
                return ConfigError(f"{item.origin}: {bad}")
            if item.key.startswith(failing + "."):  # e.g. --set bogus.key=3: bogus: unknown key
                return ConfigError(f"{item.origin}: {bad}")
    # a rule across keys (warmup_steps < steps, ...): the overrides are to blame when the
    # source is valid without them; name those the message mentions (all if none is)
    try:
        validate(source_data, label)
    except ConfigError:
        return error
    named = [item for item in items if _mentions(bad, item.key)] or items
    return ConfigError(f"{' '.join(dict.fromkeys(item.origin for item in named))}: {bad}")


def _mentions(message: str, key: str) -> bool:
    return any(re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", message)
               for name in (key, key.split(".")[-1]))


def validate(data: dict, label: str = "<config>") -> Config:
    """``data`` (a config mapping, overrides applied) as a Config; an error is a
    :class:`ConfigError` of one line, ``LABEL: dotted.key: what was expected``.

    The files a config names are read here, before the validation, which is given what they
    hold (the validation itself reads no file): ``workload.batch_sizes_file``
    (:func:`read_files`)."""
    try:
        cfg = Config.model_validate(data, context={READ_FILES: read_files(data)})
    except ValidationError as e:
        raise ConfigError(f"{label}: {first_error(e)}") from None
    except ValueError as e:
        raise ConfigError(f"{label}: {e}") from None
    if cfg.ranks is not None and cfg.ranks.per_rank:
        # each rank's overrides give a valid config of their own (checked without the
        # other ranks' overrides, which are the config's, checked once, here)
        base = cfg.model_dump()
        base["ranks"]["per_rank"] = {}
        for rank in cfg.ranks.per_rank:
            try:
                load_config(base, rank_overrides(cfg, rank))
            except ConfigError as e:
                raise ConfigError(f"{label}: {str(e).removeprefix('<config>: ')}") from None
    return cfg


def rank_overrides(cfg: Config, rank: int) -> list[Override]:
    """Rank ``rank``'s ``ranks.per_rank`` overrides, each blamed on its place in the config
    (an error in one is the config's ``ranks.per_rank.RANK``, not a ``--set``)."""
    over = cfg.ranks.per_rank.get(rank, {}) if cfg.ranks is not None else {}
    return [Override(key, value, f"ranks.per_rank.{rank}") for key, value in over.items()]


def read_files(data: dict) -> dict[str, list[int]]:
    """The CSV files of a config mapping, read: ``{path: batch sizes}`` for its
    ``workload.batch_sizes_file`` when that is its one batch source (with another, the
    validation's error that there are two comes first, as the file is not used)."""
    wl = data.get("workload")
    if not isinstance(wl, dict) or not isinstance(wl.get("batch_sizes_file"), str):
        return {}
    if any(wl.get(key) is not None for key in SOURCE_KEYS if key != "batch_sizes_file"):
        return {}
    path = wl["batch_sizes_file"]
    return {path: read_batch_sizes(path)}


def read_batch_sizes(path: str | Path) -> list[int]:
    """The ``batch_size`` column of a CSV file, as positive integers (one line on error)."""
    where = f"workload.batch_sizes_file: {path}"
    path = Path(path)
    if not path.exists():
        raise ValueError(f"{where}: file not found")
    if path.is_dir():
        raise ValueError(f"{where}: is a directory (expected a CSV file)")
    try:
        text = path.read_text()
    except UnicodeDecodeError:
        raise ValueError(f"{where}: not a text file (expected CSV)") from None
    except OSError as e:
        raise ValueError(f"{where}: cannot read: {e.strerror or e}") from None
    try:
        rows = list(csv.reader(text.splitlines()))
    except csv.Error as e:
        raise ValueError(f"{where}: malformed CSV ({e})") from None
    rows = [r for r in rows if any(cell.strip() for cell in r)]
    if not rows:
        raise ValueError(f"{where}: the file is empty (expected a header with a "
                         f"'batch_size' column)")
    header = [c.strip() for c in rows[0]]
    if "batch_size" not in header:
        raise ValueError(f"{where}: no column 'batch_size' (columns: {', '.join(header)})")
    col = header.index("batch_size")
    out = []
    for line, row in enumerate(rows[1:], start=2):
        cell = row[col].strip() if col < len(row) else ""
        try:
            value = float(cell)
        except ValueError:
            value = None
        if value is None or not positive_int(value):
            raise ValueError(batch_error(f"{where}: line {line}", cell))
        out.append(int(value))
    if not out:
        raise ValueError(f"{where}: no rows (expected one batch size per step)")
    return out


__all__ = ["DEFAULT_CONFIG", "Override", "YamlRuleError", "get_dotted", "load_config",
           "load_yaml_text", "override_list", "parse_override", "read_batch_sizes",
           "read_files", "read_yaml", "rank_overrides", "resolve_paths", "set_dotted",
           "validate", "yaml_value"]
