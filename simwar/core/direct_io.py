"""Large files written past the page cache (``O_DIRECT``): the same bytes, a tenth of the CPU.

A buffered ``write`` of a gigabyte (a Chrome trace export of 100k steps) makes the kernel
allocate a page-cache page per 4 KiB, copy the bytes into it and account it dirty; on this
repository's disk that is 0.3 to 1.8 s of system time per gigabyte, billed to the writer,
and the fsync after it waits for the whole gigabyte again. Written with ``O_DIRECT``, the
device reads the bytes straight from the writer's memory: 0.1 s of CPU for the gigabyte
(most of it the copy into the aligned buffer here) and less wall time as well
(docs/benchmarks-trace.md).

:func:`direct_writes` wraps a handle open on a new regular file (one from
:func:`simwar.core.files.atomic_file`): what is written is gathered in an aligned buffer of
:data:`CHUNK` bytes and handed to the file a whole buffer at a time; the tail that does not
fill a block is written the ordinary way at the end. Where the file system refuses
``O_DIRECT`` (at the start or at any write), or keeps files in memory anyway (tmpfs, whose
"direct" writes are its ordinary ones: the copy here would only add to them), the bytes go
through the handle as before. The file's bytes are the same either way; nothing is
committed here (the handle's owner flushes, syncs and renames).

Imports: the standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
from typing import Iterator

try:
    import fcntl
except ImportError:  # not POSIX: no direct writes (every write goes through the handle)
    fcntl = None

#: bytes gathered before each direct write: a multiple of every file system's block size
#: (4 MiB: half the CPU of 1 MiB writes, and a few MiB of memory at most)
CHUNK = 4 << 20
#: the alignment of a direct write's offset and length (the largest logical block in use)
ALIGN = 4096
#: file systems that keep files in memory: ``O_DIRECT`` there is an ordinary write
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "hugetlbfs"})


class DirectWriter:
    """A file-like ``write`` that gathers bytes in an aligned buffer and writes whole buffers
    with ``O_DIRECT`` (see the module docstring); :meth:`finish` writes what is left."""

    def __init__(self, fd: int, flags: int):
        self.fd, self.flags = fd, flags  # flags: the descriptor's own, O_DIRECT off
        self.buffer = mmap.mmap(-1, CHUNK)  # page-aligned, as O_DIRECT needs
        self.view = memoryview(self.buffer)
        self.fill = 0
        self.direct = True

    def write(self, data) -> int:
        src = memoryview(data).cast("B")
        n = len(src)
        while len(src):
            take = min(len(src), CHUNK - self.fill)
            self.view[self.fill:self.fill + take] = src[:take]
            self.fill += take
            src = src[take:]
            if self.fill == CHUNK:
                self._write(self.view)
                self.fill = 0
        return n

    def _write(self, data: memoryview) -> None:
        """Write ``data`` whole (directly, or buffered once direct writes were refused)."""
        while len(data):
            try:
                done = os.write(self.fd, data)
            except OSError as e:
                if not (self.direct and e.errno == errno.EINVAL):
                    raise
                self._buffered()  # a file system that takes no direct writes after all
                continue
            data = data[done:]

    def _buffered(self) -> None:
        if self.direct:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, self.flags)
            self.direct = False

    def finish(self) -> None:
        """Write what is gathered: its whole blocks directly, the rest buffered."""
        whole = self.fill - self.fill % ALIGN
        if whole:
            self._write(self.view[:whole])
        self._buffered()
        if self.fill > whole:
            self._write(self.view[whole:self.fill])
        self.fill = 0

    def close(self) -> None:
        """Give the buffer back (after :meth:`finish`, or after a failure: nothing written)."""
        self._buffered()
        self.view.release()
        self.buffer.close()


@contextlib.contextmanager
def direct_writes(handle) -> Iterator:
    """A writer for ``handle`` (binary, open on a regular file at offset 0, nothing
    buffered): a :class:`DirectWriter` where the file system takes direct writes, else
    ``handle`` itself. At a normal end the bytes gathered are written; the handle is left
    as it was found (its descriptor's flags restored) either way."""
    writer = _direct(handle)
    if writer is None:
        yield handle
        return
    try:
        yield writer
        writer.finish()
    finally:
        writer.close()


def _direct(handle) -> DirectWriter | None:
    """A DirectWriter on ``handle``'s descriptor, or None where direct writes do not pay or
    are refused."""
    if fcntl is None or not hasattr(os, "O_DIRECT"):
        return None
    try:
        fd = handle.fileno()
        handle.flush()
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or os.lseek(fd, 0, os.SEEK_CUR) % ALIGN:
            return None
    except (AttributeError, OSError, ValueError):  # no descriptor (a buffer in memory)
        return None
    if _filesystem(st.st_dev) in MEMORY_FILESYSTEMS:
        return None
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_DIRECT)
    except OSError:  # a file system without direct writes
        return None
    return DirectWriter(fd, flags)


def _filesystem(dev: int) -> str | None:
    """The type of the mounted file system of device ``dev`` (Linux's mount table: the
    device's major:minor in it), or None where it is not known."""
    want = f"{os.major(dev)}:{os.minor(dev)}"
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                fields = line.split()
                if len(fields) > 2 and fields[2] == want and " - " in line:
                    return line.split(" - ", 1)[1].split()[0]
    except OSError:
        return None
    return None
