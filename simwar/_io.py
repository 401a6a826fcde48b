"""Atomic file writes: readers see the old content or the new, never a torn file.

Imports: the standard library only.
"""

from __future__ import annotations

import gzip
from pathlib import Path


def write_text_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` (gzipped for ``.gz``) through a rename: never half-written."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    if path.suffix == ".gz":
        with gzip.open(tmp, "wt") as fh:
            fh.write(text)
    else:
        tmp.write_text(text)
    tmp.replace(path)
    return path
