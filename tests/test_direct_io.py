"""Direct writes (``simwar.core.direct_io``): the file's bytes are those written, whichever
way they went (direct whole buffers and a buffered tail, buffered after a refusal, or the
handle itself where direct writes do not pay), and the descriptor is left as found."""

from __future__ import annotations

import errno
import fcntl
import os

import pytest

from simwar.core import direct_io
from simwar.core.direct_io import ALIGN, CHUNK, DirectWriter, direct_writes
from simwar.core.files import atomic_file

pytestmark = pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="no O_DIRECT here")


def _pieces(sizes):
    """Distinct bytes per piece (a shifted piece would not match), as memoryviews and bytes."""
    out = []
    for i, n in enumerate(sizes):
        data = bytes((i * 7 + k) % 251 for k in range(n))
        out.append(memoryview(bytearray(data)) if i % 2 else data)
    return out


SIZES = [
    [],  # nothing written
    [5],  # a tail only
    [ALIGN],  # one block, no tail
    [CHUNK],  # exactly one buffer
    [CHUNK - 3, 10, ALIGN + 1],  # across a buffer's end, a tail
    [3 * CHUNK + 17],  # one write of several buffers
    [1000] * 50 + [CHUNK // 2 + 1] * 3,
]


@pytest.mark.parametrize("sizes", SIZES)
def test_the_file_holds_the_bytes_written(tmp_path, sizes):
    pieces = _pieces(sizes)
    path = tmp_path / "out.bin"
    with atomic_file(path) as handle:
        flags = fcntl.fcntl(handle.fileno(), fcntl.F_GETFL)
        with direct_writes(handle) as out:
            for p in pieces:
                assert out.write(p) == len(p)
        assert fcntl.fcntl(handle.fileno(), fcntl.F_GETFL) == flags  # left as found
    assert path.read_bytes() == b"".join(bytes(p) for p in pieces)


def test_a_refused_direct_write_goes_buffered(tmp_path, monkeypatch):
    """EINVAL at a direct write (a file system that took the flag but not the write): the
    same bytes, written the ordinary way from then on."""
    real = os.write
    calls = []

    def write(fd, data):
        calls.append(len(data))
        if len(calls) == 2:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, data)

    pieces = _pieces([CHUNK + 5, CHUNK + 9, 100])
    path = tmp_path / "out.bin"
    with open(path, "wb") as handle:
        with direct_writes(handle) as out:
            if not isinstance(out, DirectWriter):
                pytest.skip("this file system takes no direct writes")
            monkeypatch.setattr(direct_io.os, "write", write)
            for p in pieces:
                out.write(p)
        monkeypatch.setattr(direct_io.os, "write", real)
    assert path.read_bytes() == b"".join(bytes(p) for p in pieces)
    assert calls[1] == calls[2] == CHUNK  # the refused buffer, written again


def test_no_descriptor_or_a_stream_is_written_as_it_is(tmp_path):
    import io

    buf = io.BytesIO()
    with direct_writes(buf) as out:
        assert out is buf
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    r = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with open(fifo, "wb") as handle, direct_writes(handle) as out:
            assert out is handle
    finally:
        os.close(r)


def test_memory_file_systems_are_written_as_they_are(tmp_path, monkeypatch):
    """tmpfs takes O_DIRECT as an ordinary write: the copy into the buffer would only add."""
    monkeypatch.setattr(direct_io, "_filesystem", lambda dev: "tmpfs")
    with open(tmp_path / "out.bin", "wb") as handle, direct_writes(handle) as out:
        assert out is handle


def test_a_failure_leaves_nothing_gathered_behind(tmp_path):
    path = tmp_path / "out.bin"
    with pytest.raises(RuntimeError):
        with atomic_file(path) as handle, direct_writes(handle) as out:
            out.write(b"x" * (CHUNK + 10))
            raise RuntimeError("stop")
    assert not path.exists()
    assert not list(tmp_path.iterdir())  # the temporary removed too


def test_a_failed_write_is_raised_to_the_writer(tmp_path, monkeypatch):
    """A full disk met by the writing thread: the export's with-block raises it, and the
    destination is left as it was."""
    path = tmp_path / "out.bin"
    path.write_bytes(b"old")

    def write(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError) as caught:
        with atomic_file(path) as handle, direct_writes(handle) as out:
            monkeypatch.setattr(direct_io.os, "write", write)
            for _ in range(4):
                out.write(b"y" * CHUNK)
    monkeypatch.undo()
    assert caught.value.errno == errno.ENOSPC
    assert path.read_bytes() == b"old"
