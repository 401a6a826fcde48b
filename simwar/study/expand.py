"""A sweep's runs resolved from templates: validated once, then numbers put in place.

Most sweeps sweep numbers: a duration (``cpu.schedule_us``) over many values, crossed with a
few choices (an algorithm, a barrier). Validating each run's config on its own costs about
a millisecond and the same work each time. So the runs are gathered by *template*: the
values of the swept keys that are not such numbers, and the repeat. A template's config is
validated at the corners of its numbers' box (each *value key* at its smallest and at its
largest swept value, :func:`value_keys`); when every corner is valid, every value of the box
is (a duration's checks are bounds: finite, at least zero, within what another key allows,
and a bound that holds at both ends of a range holds inside it; non-finite values are
refused by the sweep file's schema). Each value key must land in one place of the resolved
mapping, as the same number (an ``int`` as its ``float``), and nothing else may change with
it: the corners' mappings are compared. A run is then the template's resolved mapping with
its numbers put in place (:meth:`ConfigTemplate.run`: the dicts on the way copied, the rest
shared), and its config hash is the template's canonical JSON with the numbers' text put in
place, hashed (the same text, so the same hash, as hashing the whole mapping).

A template whose corners are not all valid (or whose value keys do not land in one place)
has its runs validated one by one, as before: a bad value is then named in its own run's
one-line error.

Imports: the config's error type and the sweep's hashing (passed in: this module knows
nothing of the sweep's file).
"""

from __future__ import annotations

import hashlib
import itertools
import json
from collections import OrderedDict
from typing import Any, Callable

from simwar.config import ConfigError

#: the most value keys a template is probed for (2^k corners); more: runs one by one
MAX_VALUE_KEYS = 8
#: templates kept (a grid's structural values outermost revisit none; zips may)
TEMPLATES_KEPT = 256
_SECTIONS = ("cpu", "gpu", "costs")


def is_duration_key(key: str) -> bool:
    """A dotted key naming a config duration: ``SECTION.NAME_us`` or ``phases.P.NAME_us``."""
    parts = key.split(".")
    if not parts[-1].endswith("_us"):
        return False
    return (len(parts) == 2 and parts[0] in _SECTIONS) or (len(parts) == 3 and
                                                          parts[0] == "phases")


def _number(v) -> bool:
    return type(v) in (int, float)


def value_keys(swept: dict[str, list]) -> list[str]:
    """The swept keys whose every value is a number (not a bool) at a duration."""
    keys = [k for k, vals in swept.items() if is_duration_key(k) and all(map(_number, vals))]
    return keys if len(keys) <= MAX_VALUE_KEYS else []


def _diff(a, b, path: tuple = ()) -> list[tuple]:
    """The leaf paths where two resolved mappings differ."""
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return [p for k in a for p in _diff(a[k], b[k], (*path, k))]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [p for i, (x, y) in enumerate(zip(a, b)) for p in _diff(x, y, (*path, i))]
    return [] if type(a) is type(b) and a == b else [path]


def _at(data, path: tuple):
    for part in path:
        data = data[part]
    return data


def _placed(data, path: tuple, value):
    """``data`` with ``value`` at ``path``: the dicts and lists on the way copied."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    out = dict(data) if isinstance(data, dict) else list(data)
    out[head] = _placed(data[head], rest, value)
    return out


_MARK = "\u0000swept{}\u0000"


class ConfigTemplate:
    """The runs of one template: ``resolved`` (its config with the value keys at their
    smallest), where each value key lands (``paths``) and its canonical JSON cut at them."""

    def __init__(self, resolved: dict, paths: dict[str, tuple], structure: str):
        self.resolved = resolved
        self.paths = paths
        self.structure = structure  # the plan's structure key, the same for every run
        marked = {k: v for k, v in resolved.items() if k != "seed"}
        for i, path in enumerate(paths.values()):
            marked = _placed(marked, path, _MARK.format(i))
        text = json.dumps(marked, sort_keys=True, separators=(",", ":"), allow_nan=False)
        self.pieces: list[str] = []
        self.order: list[str] = []
        marks = {json.dumps(_MARK.format(i)): key for i, key in enumerate(paths)}
        rest = text
        while True:
            found = [(rest.find(m), m) for m in marks if m in rest]
            if not found:
                break
            at, mark = min(found)
            self.pieces.append(rest[:at])
            self.order.append(marks[mark])
            rest = rest[at + len(mark):]
        self.pieces.append(rest)

    def config_hash(self, numbers: dict[str, float]) -> str:
        text = self.pieces[0]
        for key, piece in zip(self.order, self.pieces[1:]):
            text += repr(numbers[key]) + piece
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def config(self, numbers: dict[str, float]) -> dict:
        out = self.resolved
        for key, path in self.paths.items():
            out = _placed(out, path, numbers[key])
        return out


class Templates:
    """The templates of a sweep, made as its runs are expanded (a bounded cache).

    ``resolve(values, repeat)``: a run's config validated on its own (the resolved mapping,
    or a :class:`~simwar.config.ConfigError`); ``structure(resolved)``: the plan's
    structure key of a resolved mapping; ``swept``: every swept key's values."""

    def __init__(self, swept: dict[str, list], resolve: Callable[[dict, int], dict],
                 structure: Callable[[dict], str]):
        self.keys = value_keys(swept)
        self.box = {k: (min(swept[k]), max(swept[k])) for k in self.keys}
        self.resolve = resolve
        self.structure = structure
        self._kept: OrderedDict = OrderedDict()

    def of(self, values: dict[str, Any], repeat: int) -> ConfigTemplate | None:
        """The template of a run (its values and repeat), or None: validate its runs one by
        one (a corner invalid, or a value key that does not land in one place)."""
        if not self.keys:
            return None
        fixed = {k: v for k, v in values.items() if k not in self.box}
        # (a grid of value keys only, the usual large one, has nothing fixed: no JSON per run)
        key = (json.dumps(fixed, sort_keys=True, default=str) if fixed else "", repeat)
        if key in self._kept:
            self._kept.move_to_end(key)
            return self._kept[key]
        made = self._make(fixed, repeat)
        self._kept[key] = made
        if len(self._kept) > TEMPLATES_KEPT:
            self._kept.popitem(last=False)
        return made

    def _make(self, fixed: dict, repeat: int) -> ConfigTemplate | None:
        corners = {}
        for ends in itertools.product(*([lo, hi] for lo, hi in self.box.values())):
            corner = dict(zip(self.box, ends))
            try:
                corners[tuple(ends)] = self.resolve({**fixed, **corner}, repeat)
            except ConfigError:
                return None
        low = corners[tuple(lo for lo, _ in self.box.values())]
        paths = {}
        for i, (key, (lo, hi)) in enumerate(self.box.items()):
            if lo == hi:
                continue
            ends = tuple(hi if j == i else v[0] for j, v in enumerate(self.box.values()))
            changed = _diff(low, corners[ends])
            if len(changed) != 1:
                return None
            path = changed[0]
            if not (type(_at(low, path)) is float and _at(low, path) == float(lo)
                    and _at(corners[ends], path) == float(hi)):
                return None
            paths[key] = path
        return ConfigTemplate(low, paths, self.structure(low))


__all__ = ["MAX_VALUE_KEYS", "ConfigTemplate", "Templates", "is_duration_key", "value_keys"]
