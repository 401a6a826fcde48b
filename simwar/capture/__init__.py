"""Importers: real GPU captures → :class:`simwar.core.trace.Trace`.

- :mod:`.kineto`: torch.profiler (Kineto) Chrome-trace JSON, streamed;
- :mod:`.mapping`: the YAML mapping of streams, steps, phases and sync sites;
- :mod:`.stalls`: step metrics plus HTA's idle breakdown (:mod:`simwar.analysis.idle`)
  of an import;
- :mod:`.fit`: per-phase duration distributions in the config schema;
- :mod:`.synthetic`: a simulated Trace written as a Kineto capture.

Importing this package loads only the standard-library parts; the names below
load their modules on first use.
"""

from __future__ import annotations

from simwar.core.lazy import lazy_getattr

_LAZY = {
    "import_kineto": ("simwar.capture.kineto", "import_kineto"),
    "read_capture": ("simwar.capture.kineto", "read_capture"),
    "KinetoImport": ("simwar.capture.kineto", "KinetoImport"),
    "KinetoFormatError": ("simwar.capture.kineto", "KinetoFormatError"),
    "Mapping": ("simwar.capture.mapping", "Mapping"),
    "load_mapping": ("simwar.capture.mapping", "load_mapping"),
    "idle_breakdown": ("simwar.analysis.idle", "idle_breakdown"),
    "import_report": ("simwar.capture.stalls", "import_report"),
    "fit_durations": ("simwar.fit.durations", "fit_durations"),
    "write_kineto": ("simwar.capture.synthetic", "write_kineto"),
}

__all__ = ["KinetoFormatError", "KinetoImport", "Mapping", "fit_durations", "idle_breakdown",
           "import_kineto", "import_report", "load_mapping", "read_capture", "write_kineto"]


__getattr__ = lazy_getattr("simwar.capture", _LAZY, globals())
