"""Readers: real GPU captures → :class:`simwar.core.trace.Trace`, through one front door.

The front door is :func:`~simwar.capture.open.open_capture` (:mod:`.open`): it reads, maps,
binds and sizes a capture into one finished :class:`~simwar.capture.open.Capture`; its
docstring describes the four stages. The modules:

- :mod:`.reader`: the read stage, torch.profiler (Kineto) Chrome-trace JSON read in one pass
  into a ``CaptureEvents`` (malformed events counted, HIP names mapped), whose records are
  :mod:`.records`';
- :mod:`.to_trace`: the bind stage, ``CaptureEvents`` and a mapping → the Trace
  (:func:`~simwar.capture.to_trace.bind_capture`; :func:`import_kineto`: read and bind alone),
  with :mod:`.binding` (which record each wait and sync binds to, the one place of those
  rules), :mod:`.device_times` (when records fired and waits released), :mod:`.threads`
  (which thread is the scheduler's) and :mod:`.ranks` (several processes or per-rank files
  as ranks side by side); what it returns is :mod:`.imported`'s ``KinetoImport``;
- :mod:`.mapping`: the YAML mapping of streams, steps, phases and sync sites;
- :mod:`.presets`: the map stage, mappings shipped for known servers (SGLang, vLLM) and
  their detection (:func:`~simwar.capture.presets.map_capture`);
- :mod:`.sizes`: the size stage, each step's batch and graph bucket (a ``batch`` regex, the
  graphs that ran);
- :mod:`.stalls`: step metrics plus HTA's idle breakdown (:mod:`simwar.analysis.idle`)
  of an import;
- :mod:`.synthetic`: a simulated Trace written as a Kineto capture.

This package reads: it never imports the simulator (:mod:`simwar.api`,
:mod:`simwar.executors`, :mod:`simwar.builder`) nor anything above it. Importing it
loads only the standard-library parts; the names below load their modules on first use.
"""

from __future__ import annotations

from simwar.core.lazy import lazy_getattr

_LAZY = {
    "import_kineto": ("simwar.capture.to_trace", "import_kineto"),
    "KinetoImport": ("simwar.capture.to_trace", "KinetoImport"),
    "read_capture": ("simwar.capture.reader", "read_capture"),
    "KinetoFormatError": ("simwar.capture.reader", "KinetoFormatError"),
    "Mapping": ("simwar.capture.mapping", "Mapping"),
    "load_mapping": ("simwar.capture.mapping", "load_mapping"),
    "import_report": ("simwar.capture.stalls", "import_report"),
    "write_kineto": ("simwar.capture.synthetic", "write_kineto"),
    "open_capture": ("simwar.capture.open", "open_capture"),
    "Capture": ("simwar.capture.open", "Capture"),
    "map_capture": ("simwar.capture.presets", "map_capture"),
    "bind_capture": ("simwar.capture.to_trace", "bind_capture"),
    "size_capture": ("simwar.capture.sizes", "size_capture"),
}

__all__ = ["Capture", "KinetoFormatError", "KinetoImport", "Mapping", "bind_capture",
           "import_kineto", "import_report", "load_mapping", "map_capture", "open_capture",
           "read_capture", "size_capture", "write_kineto"]


__getattr__ = lazy_getattr("simwar.capture", _LAZY, globals())
