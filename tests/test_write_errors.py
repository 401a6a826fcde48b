"""A write that fails names the file asked for, not the hidden temporary, and says why in one
line (:func:`simwar.core.files.atomic_file`): a full disk, a directory without permission."""

from __future__ import annotations

import errno
import os
import tempfile

import pytest

from simwar.cli.app import main
from simwar.core import files


def test_a_full_disk_names_the_output(tmp_path, monkeypatch, capsys):
    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", full)
    out = tmp_path / "t.json"
    assert main(["run", "--set", "steps=40", "--trace", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == f"simwar: error: {out}: no space left on device\n"
    assert os.listdir(tmp_path) == []


def test_a_directory_without_permission_names_the_output_not_the_temporary(tmp_path,
                                                                           monkeypatch):
    def denied(dir, prefix, suffix):
        raise PermissionError(errno.EACCES, "Permission denied", f"{dir}/{prefix}x{suffix}")

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    out = tmp_path / "f.txt"
    with pytest.raises(PermissionError) as e:
        files.write_text_atomic(out, "x")
    assert e.value.filename == str(out)


def test_an_error_naming_another_file_is_left_as_it_is(tmp_path):
    other = str(tmp_path / "input.yaml")
    with pytest.raises(FileNotFoundError) as e:
        with files.atomic_file(tmp_path / "out.txt"):
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", other)
    assert e.value.filename == other
    assert os.listdir(tmp_path) == []
