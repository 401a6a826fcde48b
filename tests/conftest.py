"""Settings of the whole test run: the cache of validated configs (:mod:`simwar.config.cache`)
lives in a directory of this run, never the user's own (set here, at collection, so that the
commands the tests start in subprocesses inherit it), and is removed at the end."""

from __future__ import annotations

import os
import shutil
import tempfile

_CACHE = tempfile.mkdtemp(prefix="simwar-test-cache-")
os.environ["SIMWAR_CACHE_DIR"] = _CACHE


def pytest_unconfigure(config) -> None:
    shutil.rmtree(_CACHE, ignore_errors=True)
