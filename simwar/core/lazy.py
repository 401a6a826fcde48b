"""Lazy module attributes: a package's public names, imported on first use.

Keeps ``import simwar`` (and ``simwar.capture``) cheap and free of heavy
dependencies, so the stdlib-only modules (program, trace, harness) load on a
machine that has only torch. Imports: the standard library only.
"""

from __future__ import annotations

import importlib
from typing import Callable


def lazy_getattr(package: str, table: dict[str, tuple[str, str]], namespace: dict) -> Callable:
    """A module ``__getattr__`` resolving ``name`` via ``table[name] = (module, attribute)``."""

    def __getattr__(name: str):
        if name in table:
            module, attr = table[name]
            value = getattr(importlib.import_module(module), attr)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
