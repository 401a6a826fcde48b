"""A capture's Python frames (``with_stack=True``): the engine's own functions, as ranges.

torch.profiler with ``with_stack=True`` (SGLang's default) writes each Python call as a
``python_function`` complete event on the calling thread: ``/.../sglang/srt/managers/
scheduler.py(2919): _run_batch_inner``, ``vllm/v1/worker/gpu_model_runner.py(3380):
execute_model``. A capture without ``record_function`` stage ranges still names its
scheduler's stages this way, and the frame around a host call says which function made it
(the copy that blocked the host, the graph replay). :func:`read_frames` reads them as
:class:`~simwar.capture.reader.Annotation` records (name, pid, tid, ts, dur), the shape
the importer's ranges have.

The reader (:mod:`simwar.capture.reader`) counts ``python_function`` events and keeps
none of them (they are most of a ``with_stack`` capture's bytes and most captures need
none); this module reads them in a second pass, only for a capture that has them (the
reader's count says so), with msgspec's typed decode that builds nothing for the other
events' fields. Frames of the Python runtime and torch (``<built-in ...>``,
``torch/...``) are most of them: only the names of those are kept (detection reads names),
and :func:`engine_frames` keeps the frames of the files the chosen preset names.

Imports: msgspec, the standard library and :mod:`simwar.capture.reader`'s records.
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path
from typing import Any

import msgspec

from simwar.capture.reader import Annotation, KinetoFormatError

FRAME_CAT = "python_function"


class _Frame(msgspec.Struct):
    cat: Any = None
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None


class _Doc(msgspec.Struct):
    traceEvents: list[_Frame] = []  # noqa: N815 (the Chrome trace format's key)


_DOC = msgspec.json.Decoder(_Doc)
_LIST = msgspec.json.Decoder(list[_Frame])


def read_frames(path: str | Path, keep: str | None = None) -> tuple[set[str], list[Annotation]]:
    """``(names, frames)``: the name of every ``python_function`` event of a capture, and as
    ranges those whose name matches ``keep`` (None: all) with a numeric time and length (ids
    that are not integers, as some exporters write them, become 0). Detection reads the names;
    only the engines' own frames are worth a record each (``keep``)."""
    path = Path(path)
    with open(path, "rb") as fh:
        magic = fh.read(2)
    opener = gzip.open if magic == b"\x1f\x8b" else open
    try:
        with opener(path, "rb") as fh:
            data = fh.read()
    except (OSError, EOFError) as e:
        raise KinetoFormatError(f"{path}: cannot decompress: {e}") from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        events = (_LIST.decode(data) if data.lstrip()[:1] == b"["
                  else _DOC.decode(data).traceEvents)
    except msgspec.DecodeError as e:  # the reader has read the same bytes: not expected
        raise KinetoFormatError(f"{path}: Python frames not readable: {e}") from None
    mine = [e for e in events if e.cat == FRAME_CAT and type(e.name) is str]
    names = {e.name for e in mine}
    if keep is not None:
        rx = re.compile(keep)
        kept = {n for n in names if rx.search(n)}
        mine = [e for e in mine if e.name in kept]
    out = [Annotation(e.name, _id(e.pid), _id(e.tid), float(e.ts), float(e.dur))
           for e in mine if type(e.ts) in _NUM and type(e.dur) in _NUM and e.dur >= 0]
    return names, out


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


_NUM = (int, float)  # by exact type: a bool is no time


def _id(v) -> int:
    return v if type(v) is int else 0


__all__ = ["FRAME_CAT", "engine_frames", "read_frames", "short_name"]
