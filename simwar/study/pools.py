"""Worker processes for sweeps and advice: one rule for how they start and how they end.

:func:`process_pool` is a ``multiprocessing.Pool`` of ``workers`` processes, forked on Linux
(the workers inherit the imported simulator and never import the caller's ``__main__``
again: stdin, notebooks and unguarded scripts all work; elsewhere fork is unsafe (macOS) or
missing, and the platform's default start needs the usual ``__main__`` guard), whose workers
ignore Ctrl-C (it reaches the whole process group; only the parent decides what it means)
and end on SIGTERM as by default (the parent's handler, inherited by the fork, would answer
it as Ctrl-C). Leaving it closes the pool after the work, or terminates the runs in flight
on an error or Ctrl-C instead of waiting for them (why ``multiprocessing.Pool`` rather than
``concurrent.futures``).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import sys
from collections.abc import Callable, Iterator
from multiprocessing.pool import Pool


def pool_context() -> multiprocessing.context.BaseContext:
    """Fork on Linux, the platform's default elsewhere (module docstring)."""
    if sys.platform.startswith("linux"):
        return multiprocessing.get_context("fork")
    return multiprocessing.get_context()


def _start(initializer: Callable | None, initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if initializer is not None:
        initializer(*initargs)


@contextlib.contextmanager
def process_pool(workers: int, initializer: Callable | None = None,
                 initargs: tuple = ()) -> Iterator[Pool]:
    """A pool of ``workers`` processes, each running ``initializer(*initargs)`` first
    (module docstring: how they start and end)."""
    pool = pool_context().Pool(workers, initializer=_start, initargs=(initializer, initargs))
    finished = False
    try:
        yield pool
        finished = True
    finally:
        if finished:
            pool.close()
        else:
            pool.terminate()
        pool.join()


__all__ = ["pool_context", "process_pool"]
