"""Atomic file writes: readers see the old content or the new, never a torn file.

Every file simwar writes whole (traces, Chrome trace exports, sweep run files,
results tables, the resolved sweep, images, calibration and fit outputs) goes
through :func:`atomic_file`: the content is written to a temporary file in the
destination's directory (``.NAME.<random>.tmp``), flushed to disk, given the
permissions a plain ``open()`` would give (``0o666`` less the umask), then
renamed over the destination. Any failure, an interrupt included, removes the
temporary file and leaves the destination as it was.

**Interrupts that reach the writer.** Python raises ``KeyboardInterrupt`` at the next
bytecode after Ctrl-C, wherever that is; when it lands inside a lookup that a C library
answers by clearing every error (numpy's lookup of ``__array_ufunc__`` and friends on a
class with a Python ``__getattr__``, such as an ``IntEnum`` in Python 3.11, is one), the
interrupt is lost and the program carries on. So while :func:`interrupts_noted` is active
(the command line wraps every command in it; :func:`atomic_file` uses it too) SIGINT is
also *noted*: an atomic write never commits after a noted interrupt
(:func:`check_interrupt` raises ``KeyboardInterrupt`` again before the rename), a long
writer can call it between chunks, and the context raises it at its end if nothing did.

Imports: the standard library only (the GPU harness writes traces with it).
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import math
import os
import signal
import tempfile
import threading
from pathlib import Path
from typing import BinaryIO, Iterator

#: suffix of the temporary files (a killed writer can leave one; see ``stale_temporaries``)
TMP_SUFFIX = ".tmp"


def _umask() -> int:
    # the only portable way to read the umask is to set it; set it straight back
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class _Interrupts:
    """The SIGINT handler of :func:`interrupts_noted` and what it has seen."""

    depth = 0  # nested interrupts_noted() contexts
    noted = False  # SIGINT arrived since the outermost context began
    previous = None  # the handler before it


def _note_interrupt(signum, frame):
    _Interrupts.noted = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_noted() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` as usual and is also noted until the block ends.

    Only in the main thread and only over Python's default handler (a program that set its
    own keeps it). At the end of the outermost block a noted interrupt that nothing raised
    (it was swallowed on its way) is raised: the interrupt always reaches the caller.
    """
    usable = (threading.current_thread() is threading.main_thread()
              and (_Interrupts.depth or signal.getsignal(signal.SIGINT)
                   is signal.default_int_handler))
    if not usable:
        yield
        return
    if _Interrupts.depth == 0:
        _Interrupts.noted = False
        _Interrupts.previous = signal.signal(signal.SIGINT, _note_interrupt)
    _Interrupts.depth += 1
    try:
        yield
        if _Interrupts.depth == 1:
            check_interrupt()
    finally:
        _Interrupts.depth -= 1
        if _Interrupts.depth == 0:
            signal.signal(signal.SIGINT, _Interrupts.previous)
            _Interrupts.previous = None


def check_interrupt() -> None:
    """Raise ``KeyboardInterrupt`` if SIGINT was noted (see :func:`interrupts_noted`)."""
    if _Interrupts.noted:
        raise KeyboardInterrupt


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[BinaryIO]:
    """A binary handle whose content replaces ``path`` when the block ends without error.

    Raises ``IsADirectoryError`` when ``path`` is a directory and ``FileNotFoundError``
    when its directory does not exist, before anything is written. Nothing is committed
    after an interrupt, even one swallowed on its way (:func:`interrupts_noted`).
    """
    with interrupts_noted():
        with _atomic_file(Path(path)) as handle:
            yield handle


@contextlib.contextmanager
def _atomic_file(path: Path) -> Iterator[BinaryIO]:
    if path.is_dir():
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    parent = path.parent
    if not parent.is_dir():
        raise FileNotFoundError(errno.ENOENT, "directory does not exist", str(parent))
    fd, tmp = tempfile.mkstemp(dir=parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it 0600; a plain open() would not
        with os.fdopen(fd, "wb") as handle:
            yield handle
            check_interrupt()
            handle.flush()
            os.fsync(handle.fileno())
        check_interrupt()
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_bytes_atomic(path: str | Path, payload: bytes) -> Path:
    """Write ``payload`` to ``path`` atomically (see :func:`atomic_file`)."""
    with atomic_file(path) as handle:
        handle.write(payload)
    return Path(path)


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically, gzipped when the name ends in ``.gz``."""
    path = Path(path)
    with atomic_file(path) as handle:
        if path.suffix == ".gz":
            with gzip.GzipFile(filename=path.name, mode="wb", fileobj=handle) as gz:
                gz.write(text.encode())
        else:
            handle.write(text.encode())
    return path


def stale_temporaries(directory: str | Path) -> list[Path]:
    """Temporary files a killed writer left in ``directory`` (the real files are intact)."""
    directory = Path(directory)
    return sorted(directory.glob(f".*{TMP_SUFFIX}")) if directory.is_dir() else []


__all__ = ["TMP_SUFFIX", "atomic_file", "check_interrupt", "interrupts_noted",
           "stale_temporaries", "write_bytes_atomic", "write_text_atomic"]


def jsonable(obj):
    """``obj`` as JSON can hold it: string keys, lists for tuples, numpy scalars as Python
    numbers, and non-finite floats (NaN, infinities) as None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return jsonable(obj.item())
    return obj
