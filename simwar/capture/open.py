"""The front door of a capture: :func:`open_capture` reads, maps, binds and sizes it, once.

A torch.profiler (Kineto) capture becomes a simwar Trace in four stages, each named by
its verb wherever it appears. **Read** (:func:`simwar.capture.reader.read_capture`): each
file, in one pass, into its :class:`~simwar.capture.reader.CaptureEvents` (malformed events
counted, HIP names mapped). **Map** (:func:`simwar.capture.presets.map_capture`): the
mapping the events are read with, from a preset (named, or detected from the range names
read, and from the Python frames of a ``with_stack`` capture, which the reader reads in its
one pass: :mod:`simwar.capture.frames`), a mapping file over it, and the preset's
entries that match nothing dropped; the engine's own frames (the preset's ``engine.frames``)
join the capture's ranges, so that a stage or a blocking call is named by the function that
ran it where no ``record_function`` range names it.
**Bind** (:func:`simwar.capture.to_trace.bind_capture`): events and mapping into a Trace per
rank, each wait and sync bound to its record (:mod:`simwar.capture.binding`), the
:class:`~simwar.capture.to_trace.KinetoImport`. **Size**
(:func:`simwar.capture.sizes.size_capture`): each step's batch and graph bucket, written
into the Trace's ``meta.workload`` where they vary, and each step's shape as the engine named
it (:mod:`simwar.capture.step_shapes`). :func:`open_capture` runs the four and
returns a finished :class:`Capture`, the one record ``simwar import``, ``explain``,
``races`` and the fit (:mod:`simwar.fit.from_capture`) read a capture through; the
reports on it (:mod:`simwar.capture.stalls`, :mod:`simwar.capture.accesses`) and the fit
start from it. As HTA's ``TraceAnalysis``, the record is finished when it is returned, so
that no consumer reads, maps or sizes a capture again, or in another order.
:func:`simwar.capture.to_trace.import_kineto` is the read and bind stages alone, with an
explicit mapping and no preset: the tests of those stages use it.

Imports: the standard library and simwar's capture modules; never the simulator.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from simwar.capture.frames import FRAME_CAT, engine_frames
from simwar.capture.mapping import Mapping, load_mapping
from simwar.capture.presets import engine_of, load_preset, map_capture, preset_names
from simwar.capture.reader import (
    CaptureEvents,
    KinetoFormatError,
    ProgressFn,
    read_capture,
)
from simwar.capture.sizes import CaptureSizes, SizesError, size_capture, step_bounds
from simwar.capture.step_shapes import StepShape, step_shapes
from simwar.capture.to_trace import KinetoImport, bind_capture
from simwar.core.collector import gc_off
from simwar.core.trace import Trace


@dataclass
class Capture:
    """A capture opened by :func:`open_capture`: bound, with its sizes in its Trace.

    ``bound``: the bind stage's import (the primary rank's Trace, the annotations, the
    device names, every rank); ``mapping``: what it was read with (its
    :attr:`~simwar.capture.mapping.Mapping.origin` says which preset and how it was
    chosen); ``label``: the name errors give the mapping (the mapping file, else the
    preset); ``sizes``: the size stage's result, or None where it failed, ``size_error``
    then saying why (only what needs the sizes fails on it: :meth:`sized`).
    """

    paths: list[Path]
    bound: KinetoImport
    mapping: Mapping
    label: str
    #: the mapping file as given (None: a preset alone, a dict or no mapping)
    mapping_file: str | None = None
    sizes: CaptureSizes | None = None
    size_error: str | None = None
    #: each step's shape as the engine named it (the mapping's ``shape``), in time order
    shapes: list[StepShape] = field(default_factory=list)
    #: the engine's own Python frames kept among the ranges (0: none, or no ``with_stack``)
    n_frames: int = 0

    @property
    def trace(self) -> Trace:
        return self.bound.trace

    @property
    def preset(self) -> str | None:
        """The preset the capture was read with (named or detected), None: none."""
        return self.mapping.origin[0] or None

    @property
    def warnings(self) -> list[str]:
        return self.bound.warnings

    @property
    def counts(self) -> dict:
        return self.bound.counts

    def sized(self) -> CaptureSizes:
        """The per-step sizes; a :class:`~simwar.capture.sizes.SizesError` where the size
        stage could not read them as the mapping says."""
        if self.sizes is None:
            raise SizesError(self.size_error)
        return self.sizes


def mapping_label(mapping: Mapping) -> str:
    """How errors name a mapping given as no file: its preset, else ``mapping``."""
    name, _ = mapping.origin
    return f"preset {name}" if name else "mapping"


@gc_off()
def open_capture(paths, mapping=None, preset: str | None = None,
                 progress: ProgressFn | None = None) -> Capture:
    """Read, map, bind and size a capture (see the module docstring).

    ``paths``: a file, or several per-rank files of one run (a list). ``mapping``: a mapping
    file, a dict, a :class:`~simwar.capture.mapping.Mapping` or None; ``preset``: a preset's
    name, or None (detected from the capture when no mapping is given either). An unknown
    preset or a bad mapping file fails before any file is read.
    """
    if preset is not None:
        load_preset(preset)
    if isinstance(mapping, (str, Path)):
        load_mapping(mapping)
    files = [Path(p) for p in paths] if isinstance(paths, (list, tuple)) else [Path(paths)]
    # the frames of every engine a preset knows are kept as the file is read: which engine
    # it is, detection says after the pass
    engines = "|".join(f"(?:{e['frames']})" for e in map(engine_of, preset_names())
                       if e.get("frames"))
    events = [read_capture(p, progress, frames=engines or None) for p in files]
    for p, ev in zip(files, events):
        _check_not_frames_only(p, ev)
    names = {a.name for ev in events for a in ev.annotations}
    kernels = {d.name for ev in events for d in ev.device_events}
    used = map_capture(preset, mapping, names, kernels,
                       set().union(*(ev.frame_names for ev in events)))
    pattern = engine_of(used.origin[0]).get("frames")
    kept = 0
    for ev in events:
        mine = engine_frames(ev.frames, pattern)
        ev.frames = []  # the kept ones are ranges now; the others are of no use
        ev.annotations.extend(mine)
        kept += len(mine)
    bound = bind_capture(events, used, [p.name for p in files], consume=True)
    cap = finish_capture(bound, used, files,
                         str(mapping) if isinstance(mapping, (str, Path)) else None)
    cap.n_frames = kept
    return cap


def _check_not_frames_only(path: Path, ev: CaptureEvents) -> None:
    """A capture of Python frames alone (``activities=[CPU]`` with ``with_stack``) has nothing
    to import: one line saying so, rather than an empty import."""
    if ev.device_events or ev.runtime_calls or ev.annotations or ev.sync_events:
        return
    n = ev.ignored.get(FRAME_CAT, 0)
    if n and n == sum(ev.ignored.values()):
        raise KinetoFormatError(
            f"{path}: every event is a Python frame ({n} {FRAME_CAT} events): no device work, "
            f"runtime calls or ranges to import (profile with activities=[ProfilerActivity.CPU, "
            f"ProfilerActivity.CUDA])")


@gc_off()
def finish_capture(bound: KinetoImport, mapping: Mapping, paths=(),
                   mapping_file: str | None = None) -> Capture:
    """The size stage on a bound import: the :class:`Capture` of it (what
    :func:`open_capture` ends with; a capture bound by other means is finished here)."""
    label = mapping_file or mapping_label(mapping)
    cap = Capture(list(paths), bound, mapping, label, mapping_file)
    cap.shapes = step_shapes(bound.annotations, mapping.shape, step_bounds(bound.trace))
    try:
        cap.sizes = size_capture(bound, mapping, label)
    except SizesError as e:
        cap.size_error = str(e)
        return cap
    cap.sizes.apply(bound.trace)
    return cap


__all__ = ["Capture", "finish_capture", "mapping_label", "open_capture"]
