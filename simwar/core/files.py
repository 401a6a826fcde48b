"""Atomic file writes: readers see the old content or the new, never a torn file.

Every file simwar writes whole (traces, Chrome trace exports, sweep run files,
results tables, the resolved sweep, images, calibration and fit outputs) goes
through :func:`atomic_file`: the content is written to a temporary file in the
destination's directory (``.NAME.<random>.tmp``), flushed to disk, given the
permissions a plain ``open()`` would give (``0o666`` less the umask), then
renamed over the destination. Any failure, an interrupt included, removes the
temporary file and leaves the destination as it was.

What a destination may be (:func:`write_target`, the one rule, which the command line
also applies before it runs anything):

- a new path in a directory that exists, or a regular file: replaced atomically as above;
  a symbolic link is followed, so the file it points to is replaced and the link kept;
- a stream: a FIFO, ``/dev/null``, or this process's own standard output or error
  (``/dev/stdout``, ``/proc/self/fd/1``): written in place, in order (a stream cannot be
  renamed over, and its reader expects the bytes);
- anything else (a directory, a device such as ``/dev/full`` or a disk, a socket) is refused
  before anything is written: :class:`NotAFileError` (an ``OSError`` naming the path).

**Interrupts that reach the writer.** Python raises ``KeyboardInterrupt`` at the next
bytecode after Ctrl-C, wherever that is; when it lands inside a lookup that a C library
answers by clearing every error (numpy's lookup of ``__array_ufunc__`` and friends on a
class with a Python ``__getattr__``, such as an ``IntEnum`` in Python 3.11, is one), the
interrupt is lost and the program carries on. So while :func:`interrupts_noted` is active
(the command line wraps every command in it; :func:`atomic_file` uses it too) SIGINT, and
SIGTERM treated as SIGINT, is also *noted*: an atomic write never commits after a noted interrupt
(:func:`check_interrupt` raises ``KeyboardInterrupt`` again before the rename), a long
writer can call it between chunks, and the context raises it at its end if nothing did.
A caller that answers the interrupt itself (a sweep writes the results tables of the runs
that finished, then stops) calls :func:`interrupt_handled` first.

Imports: the standard library only (the GPU harness writes traces with it).
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import math
import os
import signal
import stat
import sys
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
    """The SIGINT (and SIGTERM) handler of :func:`interrupts_noted` and what it has seen."""

    depth = 0  # nested interrupts_noted() contexts
    noted = False  # SIGINT or SIGTERM arrived since the outermost context began
    previous = None  # the SIGINT handler before it
    previous_term = None  # the SIGTERM handler before it (None: left as it was)


def _note_interrupt(signum, frame):
    _Interrupts.noted = True
    raise KeyboardInterrupt


@contextlib.contextmanager
def interrupts_noted() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt`` as usual and is also noted until the block ends;
    SIGTERM, when it has its default handler, is answered the same way (one handler for
    both: a terminated command stops as an interrupted one does, cleaning up after itself).

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
        # SIGTERM (a job scheduler's stop, `kill`) is answered as Ctrl-C: its default would
        # end the process at once, leaving a temporary file and a sweep without its tables
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            _Interrupts.previous_term = signal.signal(signal.SIGTERM, _note_interrupt)
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
            if _Interrupts.previous_term is not None:
                signal.signal(signal.SIGTERM, _Interrupts.previous_term)
                _Interrupts.previous_term = None


def interrupt_handled() -> None:
    """Forget a noted interrupt: the caller caught it and writes what it decided to write
    after it (a sweep's tables of the runs that finished); a later Ctrl-C is noted again."""
    _Interrupts.noted = False


def check_interrupt() -> None:
    """Raise ``KeyboardInterrupt`` if SIGINT was noted (see :func:`interrupts_noted`)."""
    if _Interrupts.noted:
        raise KeyboardInterrupt


class NotAFileError(OSError):
    """A destination that is neither a regular file, a new path nor a stream (see the module
    docstring); ``filename`` is the path, ``strerror`` says what it is."""


#: what :func:`write_target` refuses, by ``stat`` kind, in words
_KINDS = ((stat.S_ISBLK, "a block device"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISSOCK, "a socket"))


def _own_stream(st: os.stat_result) -> int | None:
    """The file descriptor (1 or 2) of this process's standard output or error that ``st``
    is, or None."""
    for fd in (1, 2):
        try:
            if os.path.samestat(st, os.fstat(fd)):
                return fd
        except OSError:  # closed
            continue
    return None


def write_target(path: str | Path) -> tuple[Path, str]:
    """Where a write to ``path`` goes, and how: ``(target, "replace" | "stream" | "fd1" |
    "fd2")`` (see the module docstring); raises before anything is written.

    ``replace``: ``target`` (the path, or the regular file a symbolic link points to) is
    replaced atomically; ``stream``: ``path`` is opened and written in place (a FIFO,
    ``/dev/null``); ``fd1``/``fd2``: the path is this process's standard output or error,
    written through that descriptor. ``IsADirectoryError`` for a directory,
    ``FileNotFoundError`` when the directory of a new file does not exist,
    :class:`NotAFileError` for anything else that is not a regular file.
    """
    path = Path(path)
    try:
        st = os.stat(path)  # follows symbolic links
    except FileNotFoundError:
        st = None
    if st is None:  # a new file (or a dangling link: the file it names is created)
        target = Path(os.path.realpath(path)) if path.is_symlink() else path
        if not target.parent.is_dir():
            raise FileNotFoundError(errno.ENOENT, "directory does not exist", str(target.parent))
        return target, "replace"
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a directory", str(path))
    fd = _own_stream(st)
    if fd is not None:
        return path, f"fd{fd}"
    if stat.S_ISREG(st.st_mode):
        return Path(os.path.realpath(path)), "replace"
    if stat.S_ISFIFO(st.st_mode) or os.path.samestat(st, os.stat(os.devnull)):
        return path, "stream"
    kind = next((words for test, words in _KINDS if test(st.st_mode)), "not a regular file")
    raise NotAFileError(errno.EINVAL, f"{kind}, not a regular file (simwar writes regular "
                                      f"files, FIFOs, {os.devnull} and its own stdout or "
                                      f"stderr)", str(path))


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[BinaryIO]:
    """A binary handle whose content replaces ``path`` when the block ends without error.

    Raises ``IsADirectoryError`` when ``path`` is a directory, ``FileNotFoundError``
    when its directory does not exist and :class:`NotAFileError` for a device or a
    socket, before anything is written; a stream (a FIFO, ``/dev/null``, this process's
    stdout or stderr) is written in place (:func:`write_target`). Nothing is committed
    after an interrupt, even one swallowed on its way (:func:`interrupts_noted`).
    """
    with interrupts_noted():
        target, how = write_target(path)
        if how != "replace":
            yield from _stream(target, how)
            return
        with _atomic_file(target) as handle:
            yield handle


def _naming(e: OSError, target: Path, tmp: str | None = None) -> OSError:
    """``e`` naming ``target``, the file the user asked for, when it named the temporary
    ``tmp`` or no file (no permission to create the temporary, a full disk while writing
    it: the destination's errors); an error naming another file is left as it is."""
    if not e.errno or e.filename not in (None, tmp):
        return e
    named = type(e)(e.errno, e.strerror or os.strerror(e.errno), str(target))
    named.__traceback__ = e.__traceback__
    return named


@contextlib.contextmanager
def _atomic_file(target: Path) -> Iterator[BinaryIO]:
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.",
                                   suffix=TMP_SUFFIX)
    except OSError as e:
        raise _naming(e, target, e.filename) from None
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes it 0600; a plain open() would not
        with os.fdopen(fd, "wb") as handle:
            yield handle
            check_interrupt()
            handle.flush()
            os.fsync(handle.fileno())
        check_interrupt()
        os.replace(tmp, target)
    except OSError as e:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise _naming(e, target, tmp) from None
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _stream(path: Path, how: str) -> Iterator[BinaryIO]:
    """Write in place: a FIFO or /dev/null opened, or our own stdout/stderr's descriptor
    duplicated (it shares the offset, so nothing printed before is overwritten)."""
    if how == "stream":
        with open(path, "wb") as handle:
            yield handle
        return
    fd = int(how[2:])
    (sys.stdout if fd == 1 else sys.stderr).flush()
    with os.fdopen(os.dup(fd), "wb") as handle:
        yield handle


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


#: the lock file of a directory one writer at a time fills (:func:`directory_lock`)
LOCK_NAME = ".simwar.lock"


class DirectoryBusy(OSError):
    """Another process holds :func:`directory_lock` on the directory (``filename``)."""


@contextlib.contextmanager
def directory_lock(directory: str | Path) -> Iterator[None]:
    """Hold ``directory``'s lock (an advisory ``flock`` on its ``.simwar.lock``) for the
    block, or raise :class:`DirectoryBusy` at once if another process holds it.

    The lock file is removed at the end; a process that opened it before the removal and
    locks it afterwards holds a lock on a removed file, so a lock counts only when the file
    locked is still the one the path names (checked after locking, retried otherwise). The
    kernel releases the lock of a killed process: a stale lock file is never an obstacle.
    """
    import fcntl  # POSIX; lazy so that the module stays importable elsewhere

    path = Path(directory) / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666 & ~_umask())
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise DirectoryBusy(errno.EBUSY, "another simwar process is writing into it",
                                str(directory)) from None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)  # locked a file its holder had just removed: lock the new one
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def stale_temporaries(directory: str | Path) -> list[Path]:
    """Temporary files a killed writer left in ``directory`` (the real files are intact)."""
    directory = Path(directory)
    return sorted(directory.glob(f".*{TMP_SUFFIX}")) if directory.is_dir() else []


__all__ = ["LOCK_NAME", "TMP_SUFFIX", "DirectoryBusy", "NotAFileError", "atomic_file",
           "directory_lock", "check_interrupt", "interrupt_handled",
           "interrupts_noted",
           "stale_temporaries", "write_bytes_atomic", "write_target", "write_text_atomic"]


def jsonable(obj):
    """``obj`` as JSON can hold it: string keys, lists for tuples, numpy scalars as Python
    numbers, and non-finite floats (NaN, infinities) as None."""
    kind = type(obj)
    if kind is int or kind is str or kind is bool or obj is None:  # most of a summary
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if kind is dict:  # a summary: mostly flat numbers and strings, looked at here
        out = {}
        for k, v in obj.items():
            kind = type(v)
            if type(k) is not str:
                k = str(k)
            if kind is float:
                out[k] = v if v - v == 0.0 else None  # v - v: 0.0 when finite, else NaN
            elif kind is int or kind is str or kind is bool or v is None:
                out[k] = v
            else:
                out[k] = jsonable(v)
        return out
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return jsonable(obj.item())
    return obj
