"""A capture's Python frames (``with_stack=True``): the engine's own functions, as ranges.

torch.profiler with ``with_stack=True`` (SGLang's default) writes each Python call as a
``python_function`` complete event on the calling thread: ``/.../sglang/srt/managers/
scheduler.py(2919): _run_batch_inner``, ``vllm/v1/worker/gpu_model_runner.py(3380):
execute_model``. A capture without ``record_function`` stage ranges still names its
scheduler's stages this way, and the frame around a host call says which function made it
(the copy that blocked the host, the graph replay). They are read as
:class:`~simwar.capture.reader.Annotation` records (name, pid, tid, ts, dur), the shape
the importer's ranges have.

The reader (:mod:`simwar.capture.reader`) reads them in its one pass over the file: it
counts ``python_function`` events, keeps every frame's name (detection reads names) and,
as ranges, only the frames whose name matches the pattern it is given (the engines' own
source files: frames of the Python runtime and torch, ``<built-in ...>``, ``torch/...``,
are most of a ``with_stack`` capture's bytes and need no record each);
:func:`engine_frames` then keeps the frames of the files the chosen preset names.

Imports: the standard library and :mod:`simwar.capture.reader`.
"""

from __future__ import annotations

import re

from simwar.capture.reader import FRAME_CAT, Annotation


def engine_frames(frames, pattern: str | None) -> list[Annotation]:
    """The frames whose name matches ``pattern`` (the engine's own source files)."""
    if not pattern:
        return []
    rx = re.compile(pattern)
    return [f for f in frames if rx.search(f.name)]


def short_name(name: str) -> str:
    """``scheduler.py(2919): _run_batch_inner`` of ``/sgl-workspace/.../scheduler.py(2919):
    _run_batch_inner``: the file's own name and the function, as a report shows a frame."""
    head, sep, tail = name.partition("): ")
    if not sep or "/" not in head:
        return name
    return f"{head.rsplit('/', 1)[1]}){sep[1:]}{tail}"


__all__ = ["FRAME_CAT", "engine_frames", "short_name"]
