"""Mappings shipped for known servers (``--preset sglang``, ``--preset vllm``), and detection.

A preset is a mapping file under ``simwar/data/presets/`` (``sglang.yaml``, ``vllm.yaml``)
holding a server's own range names. :func:`map_capture` builds the mapping a capture is read
with: the preset's keys, then a mapping file's, each of which replaces the preset's key of
the same name (``cpu:`` in the file replaces the preset's whole ``cpu``). The preset's own
entries are optional in a capture: :func:`resolve` drops each one (a ``cpu``, ``phases``,
``sites`` or ``writes`` rule, ``batch``, ``run_batch``, ``idle``, ``shape``, ``receive``) that
matches nothing the capture holds, where a mapping file's entry that matches nothing stays an
error; its ``reads`` of a phase the capture lacks are dropped by the fit (and by
:mod:`simwar.capture.accesses`, with its ``reads`` regexes that map nothing). A preset's
``reads`` and ``writes`` are the server's shared buffers where its kernel or range names make
them identifiable (the preset files say which).

A mapping file may name its preset (``preset: sglang``); ``--preset`` names it on the command
line (both, and different, is an error). Without either and without a mapping file,
:func:`detect_preset` picks the preset whose CPU-stage and run_batch rules match the most
distinct range names of the capture (at least two), and the import says so; a mapping file
that names no preset is read alone (it says it all).

:func:`map_capture` is the map stage of :func:`simwar.capture.open.open_capture`: the capture
is read first (its names decide the preset and what of it stays), then mapped, then bound.

Imports: PyYAML and pydantic (through :mod:`simwar.capture.mapping`), the standard library and
simwar's capture modules; never the simulator.
"""

from __future__ import annotations

import copy
import functools
import re
from pathlib import Path

from pydantic import ValidationError

from simwar.capture.frames import short_name
from simwar.capture.mapping import Mapping, load_mapping
from simwar.config import ConfigError, first_error, read_yaml

PRESET_DIR = Path(__file__).resolve().parents[1] / "data" / "presets"
#: the keys a preset's entries are dropped from when they match nothing (dicts by pattern)
SOFT_DICTS = ("phases", "sites", "cpu", "writes")
SOFT_REGEXES = ("batch", "run_batch", "idle", "shape", "receive")
#: a preset's own key, not a mapping's: how the engine is told apart (``signature``: regexes
#: of range and Python-frame names only it writes) and its source files' frames (``frames``)
ENGINE_KEY = "engine"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_preset(name: str, where: str = "--preset") -> dict:
    """The preset's mapping as a dict (the caller's own copy); an unknown name is a
    :class:`ConfigError`."""
    names = preset_names()
    if name not in names:
        raise ConfigError(f"{where}: '{name}' is not a preset ({', '.join(names)})")
    return copy.deepcopy(_read_preset(name))


@functools.lru_cache(maxsize=None)
def _read_preset(name: str) -> dict:
    """A preset file, parsed once per process (detection reads every preset, the map stage
    the chosen one again: YAML parsing is most of their cost)."""
    return read_yaml(PRESET_DIR / f"{name}.yaml")


def engine_of(preset: str | None) -> dict:
    """A preset's ``engine`` block (``signature``, ``frames``); empty for none."""
    return dict(load_preset(preset).get(ENGINE_KEY) or {}) if preset else {}


def detect_preset(annotation_names, frame_names=()) -> tuple[str, list[str]] | None:
    """``(preset, the names that chose it)``: the preset whose CPU-stage, run_batch and
    signature rules match the most distinct range and Python-frame names (at least two);
    None when none does."""
    ranges = sorted(set(annotation_names))
    names = ranges + sorted(set(frame_names) - set(ranges))  # the ranges are shown first
    best = None
    for preset in preset_names():
        data = load_preset(preset)
        patterns = [*data.get("cpu", {}), *(data.get(ENGINE_KEY) or {}).get("signature", [])]
        if data.get("run_batch"):
            patterns.append(data["run_batch"])
        rules = [re.compile(p) for p in patterns]
        hits = [n for n in names if any(rx.search(n) for rx in rules)]
        if len(hits) >= 2 and (best is None or len(hits) > len(best[1])):
            best = (preset, hits)
    return best


def map_capture(preset: str | None, source=None, annotation_names=None,
                kernel_names=None, frame_names=()) -> Mapping:
    """The mapping to read a capture with (see the module docstring).

    ``preset``: a preset's name, or None (detected from ``annotation_names`` when ``source``
    is None too). ``source``: a mapping file, a dict or None. With names given, the preset's
    entries that match none of them are dropped (:func:`resolve`). ``frame_names``: the
    capture's Python frames (:mod:`simwar.capture.frames`), which detection reads too and a
    rule may match (a stage named by its function where no range names it).
    """
    how = "--preset"
    user: dict = {}
    label = "<mapping>"
    if isinstance(source, Mapping):
        user = source.model_dump(exclude_unset=True)
    elif isinstance(source, dict):
        user = dict(source)
    elif source is not None:
        label = str(source)
        load_mapping(source)  # the file's own errors, naming the file
        user = read_yaml(source)
    named = user.pop("preset", None)
    if named is not None:
        load_preset(named, f"{label}: preset")
        if preset is not None and preset != named:
            raise ConfigError(f"--preset {preset}: {label} names preset {named} (name one)")
        if preset is None:
            preset, how = named, f"named by {label}"
    if preset is None and source is None and annotation_names is not None:
        found = detect_preset(annotation_names, frame_names)
        if found is not None:
            preset, hits = found
            shown = ", ".join(short_name(h) for h in hits[:3]) + (", ..." if len(hits) > 3 else "")
            frames = set(frame_names) - set(annotation_names)
            kinds = ("range names and Python frames" if any(h in frames for h in hits)
                     else "range names")
            how = f"detected from the capture's {kinds} ({shown})"
    if preset is None:
        return load_mapping(source)
    base = load_preset(preset)
    base.pop(ENGINE_KEY, None)
    try:
        mapping = Mapping(**{**base, **user})
    except ValidationError as e:  # a valid preset and a valid file may still conflict
        raise ConfigError(f"{label}: {first_error(e)}") from None
    soft: dict = {}
    for key in SOFT_DICTS:
        if key in base and key not in user:
            soft[key] = set(base[key])
    for key in SOFT_REGEXES:
        if base.get(key) and key not in user:
            soft[key] = {base[key]}
    if "reads" in base and "reads" not in user:
        soft["reads"] = set(base["reads"])
    mapping._soft = soft
    mapping._origin = (preset, how)
    if annotation_names is not None:
        mapping = resolve(mapping, kernel_names or (), [*annotation_names, *frame_names])
    return mapping


def resolve(mapping: Mapping, kernel_names, annotation_names) -> Mapping:
    """``mapping`` without the preset's entries that match nothing in a capture."""
    soft = mapping.soft
    if not soft:
        return mapping
    notes = sorted(set(annotation_names))
    everything = sorted(set(kernel_names)) + notes

    def hit(pattern: str, names) -> bool:
        rx = re.compile(pattern)
        return any(rx.search(n) for n in names)

    data = mapping.model_dump()
    kept: dict = {}
    for key in SOFT_DICTS:
        if key not in soft:
            continue
        names = everything if key in ("phases", "writes") else notes
        data[key] = {p: v for p, v in data[key].items() if p not in soft[key] or hit(p, names)}
        kept[key] = {p for p in soft[key] if p in data[key]}
    for key in SOFT_REGEXES:
        if key in soft and data.get(key) and not hit(data[key], notes):
            data[key] = None
        if key in soft and data.get(key):
            kept[key] = {data[key]}
    if "phases" in soft and not data["phases"] and data.get("default_phase") == "forward":
        data["default_phase"] = None  # no phase ranges: every kernel is forward work anyway
    out = Mapping(**data)
    if "reads" in soft:
        kept["reads"] = soft["reads"]
    out._soft = kept
    out._origin = mapping.origin
    out._dropped = {k: sorted(v - kept.get(k, set())) for k, v in soft.items()
                    if k != "reads" and v - kept.get(k, set())}
    return out


def preset_line(mapping: Mapping) -> str:
    """One line on the preset a capture was read with ('' none)."""
    name, how = mapping.origin
    if not name:
        return ""
    soft = mapping.soft
    kept = sum(len(v) for k, v in soft.items() if k not in ("reads", "writes"))
    dropped = sum(len(v) for k, v in dropped_entries(mapping).items() if k != "writes")
    return (f"preset {name} ({how}); {kept} of its {kept + dropped} entries match this "
            f"capture")


def dropped_entries(mapping: Mapping) -> dict[str, list[str]]:
    """The preset's entries that matched nothing in the capture, by key (empty: none, or a
    mapping not resolved against a capture)."""
    return dict(getattr(mapping, "_dropped", None) or {})


def entry_lines(mapping: Mapping) -> list[str]:
    """Which of the preset's keys matched the capture and which did not (a key with several
    entries with their count): two lines, empty without a preset."""
    if not mapping.origin[0]:
        return []
    kept, dropped = mapping.soft, dropped_entries(mapping)

    def words(d: dict) -> str:
        keys = sorted(k for k, v in d.items() if k != "reads" and v)
        return ", ".join(k if len(d[k]) == 1 else f"{k} ({len(d[k])})" for k in keys) or "none"

    return [f"matched: {words(kept)}", f"not in the capture: {words(dropped)}"]


__all__ = ["ENGINE_KEY", "PRESET_DIR", "detect_preset", "dropped_entries", "engine_of",
           "entry_lines", "load_preset", "map_capture", "preset_line", "preset_names",
           "resolve"]
