"""simwar: a discrete-event simulator of LLM-serving overlap scheduling.

Public API (imported lazily so that ``simwar.core.program``, ``simwar.core.trace`` and
``simwar.harness`` load on a machine with only the standard library and torch):

- ``load_config(path_or_dict, overrides=None) -> Config``
- ``build_program(config) -> Program`` (a validated Config)
- ``simulate(config) -> Result`` (``.steps``, ``.summary``, ``.trace``, ``.races``)
- ``sweep(spec) -> DataFrame``
"""

from __future__ import annotations

from simwar.core.lazy import lazy_getattr

__version__ = "0.1.0"

_LAZY = {
    "load_config": ("simwar.config", "load_config"),
    "Config": ("simwar.config", "Config"),
    "ConfigError": ("simwar.config", "ConfigError"),
    "build_program": ("simwar.api", "build_program"),
    "simulate": ("simwar.api", "simulate"),
    "Result": ("simwar.api", "Result"),
    "Program": ("simwar.core.program", "Program"),
    "Trace": ("simwar.core.trace", "Trace"),
    "analyze": ("simwar.analysis.metrics", "analyze"),
    "sweep": ("simwar.study.sweeps", "sweep"),
}

__all__ = sorted(_LAZY) + ["__version__"]


__getattr__ = lazy_getattr("simwar", _LAZY, globals())
