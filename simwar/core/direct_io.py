"""Large files written past the page cache (``O_DIRECT``): the same bytes, less CPU.

A buffered ``write`` of a gigabyte (a Chrome trace export of 100k steps) makes the kernel
allocate a page-cache page per 4 KiB, copy the bytes into it and account it dirty: on this
repository's disk 0.2 to 1.8 s of system time per gigabyte (it varies with the machine's
state), billed to the writer, and the fsync after it waits for the whole gigabyte. Written
with ``O_DIRECT``, the device reads the bytes straight from the writer's memory: about
0.15 s of CPU for the gigabyte, most of it the copy into the aligned buffers here
(docs/benchmarks-trace.md).

:func:`direct_writes` wraps a handle open on a new regular file (one from
:func:`simwar.core.files.atomic_file`): what is written is gathered in aligned buffers of
:data:`CHUNK` bytes, each handed whole to a thread that writes it while the next is filled
(a direct write returns only once the device has the bytes: without the thread the export
would wait for the device at every buffer); the tail that does not fill a block is written
the ordinary way at the end. A caller may also make its bytes in the buffer itself
(:meth:`DirectWriter.room`, :meth:`DirectWriter.advance`: no copy at all). Where the file
system refuses ``O_DIRECT`` (at the start or at any write), or keeps files in memory anyway
(tmpfs, whose "direct" writes are its ordinary ones: the copy here would only add to
them), the bytes go through the handle as before.
The file's bytes are the same either way; nothing is committed here (the handle's owner
flushes, syncs and renames).

Imports: the standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import queue
import stat
import threading
from typing import Iterator

try:
    import fcntl
except ImportError:  # not POSIX: no direct writes (every write goes through the handle)
    fcntl = None

#: bytes gathered before each direct write: a multiple of every file system's block size
#: (4 MiB: half the CPU of 1 MiB writes, and a few MiB of memory at most)
CHUNK = 4 << 20
#: buffers filled in turn (one written by the thread while the next is filled)
BUFFERS = 2
#: the alignment of a direct write's offset and length (the largest logical block in use)
ALIGN = 4096
#: file systems that keep files in memory: ``O_DIRECT`` there is an ordinary write
MEMORY_FILESYSTEMS = frozenset({"tmpfs", "ramfs", "hugetlbfs"})


class DirectWriter:
    """A file-like ``write`` that gathers bytes in aligned buffers and writes whole buffers
    with ``O_DIRECT`` (see the module docstring); :meth:`finish` writes what is left.

    A direct write returns once the device has the bytes: a thread writes each full buffer,
    in order, while the caller fills the next (:data:`BUFFERS` in turn), so the export
    waits for the device only where it outruns it."""

    def __init__(self, fd: int, flags: int):
        self.fd, self.flags = fd, flags  # flags: the descriptor's own, O_DIRECT off
        self.direct = True
        self.error: BaseException | None = None  # the writing thread's, raised here
        # page-aligned, as O_DIRECT needs
        self.buffers = [mmap.mmap(-1, CHUNK) for _ in range(BUFFERS)]
        self.free: queue.SimpleQueue = queue.SimpleQueue()  # buffers the thread is done with
        for b in self.buffers[1:]:
            self.free.put(b)
        self.full: queue.SimpleQueue = queue.SimpleQueue()  # (buffer, bytes) to write; None
        self.thread = threading.Thread(target=self._writing, name="simwar direct writes",
                                       daemon=True)
        self.thread.start()
        self.current = self.buffers[0]
        self.fill = 0

    def write(self, data) -> int:
        with memoryview(data) as given, given.cast("B") as src:
            n = len(src)
            at = 0
            while at < n:
                take = min(n - at, CHUNK - self.fill)
                self.current[self.fill:self.fill + take] = src[at:at + take]
                self.fill += take
                at += take
                if self.fill == CHUNK:
                    self._hand_over(CHUNK)
                    self.current = self.free.get()
                    self._raise()
        return n

    def room(self) -> memoryview:
        """The free bytes of the buffer being filled (one at least), for a caller that makes
        its bytes in place (the rows of :func:`simwar.plots.jsoncols.write_rows_into`: no
        copy into the buffer); :meth:`advance` then takes the first ones made. Nothing is
        to be made there once they are taken or anything else is written."""
        return memoryview(self.current)[self.fill:]

    def advance(self, n: int) -> None:
        """Take the first ``n`` bytes of :meth:`room` as written."""
        if not 0 <= n <= CHUNK - self.fill:
            raise ValueError(f"advance({n}): {CHUNK - self.fill} bytes of room")
        self.fill += n
        if self.fill == CHUNK:
            self._hand_over(CHUNK)
            self.current = self.free.get()
            self._raise()

    def _hand_over(self, size: int) -> None:
        self._raise()
        self.full.put((self.current, size))
        self.fill = 0

    def _raise(self) -> None:
        if self.error is not None:
            raise self.error

    def _writing(self) -> None:
        """The thread: each full buffer written whole, in order (after a failure, none: the
        caller raises it), then given back."""
        while True:
            item = self.full.get()
            if item is None:
                return
            buffer, size = item
            try:
                if self.error is None:
                    with memoryview(buffer) as whole, whole[:size] as data:
                        self._write(data)
            except BaseException as e:  # noqa: BLE001 - handed to the caller, raised there
                self.error = e
            finally:
                self.free.put(buffer)

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

    def _stop(self) -> None:
        """Let the thread write what it was given, and end."""
        if self.thread.is_alive():
            self.full.put(None)
            self.thread.join()

    def finish(self) -> None:
        """Write what is gathered: its whole blocks directly, the rest buffered."""
        whole = self.fill - self.fill % ALIGN
        tail = bytes(self.current[whole:self.fill])
        if whole:
            self._hand_over(whole)
        self._stop()
        self._raise()
        self._buffered()
        if tail:
            with memoryview(tail) as data:
                self._write(data)
        self.fill = 0

    def close(self) -> None:
        """End the thread and give the buffers back (after :meth:`finish`, or after a
        failure: what was gathered is dropped with the file)."""
        self._stop()
        self._buffered()
        for b in self.buffers:
            try:
                b.close()
            except BufferError:  # a view made on it still held (by a failure's traceback):
                pass  # unmapped once that goes


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
