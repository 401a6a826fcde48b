"""The cyclic garbage collector paused around work that makes no cycles: the one rule every
pause in simwar uses.

- :func:`gc_off`: the collector off for a block (or a function: it decorates too), back on
  after it if it was on; nested uses pause it once. What the capture reader uses for an
  import (the records make no cycles, and the collector's walks over millions of them were
  about a third of a large import's CPU time, ``benchmarks/bench_import.py``); with
  ``freeze_after``, what the block made is frozen (``gc.freeze``) before the collector is
  back: a command's start-up (:func:`simwar.cli.common.start_up`), whose objects live until
  the exit.
- :func:`gc_paused`: :func:`gc_off`, and what exists frozen out of the collector's sight for
  the block: a run, which allocates many small objects (tuples, events, floats) and no
  reference cycles worth collecting; with the collector on, collecting alone cost 1.4-1.6x
  the run.

Imports: the standard library only.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_off(*, freeze_after: bool = False) -> Iterator[None]:
    """The cyclic garbage collector off for the block, and back on after it if it was on
    before (nested uses pause it once). ``freeze_after``: what exists when the block ends is
    frozen (``gc.freeze``: left out of later collections) before the collector is back on.
    As a decorator (``@gc_off()``), the function's every call is such a block."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze_after:
            gc.freeze()
        if enabled:
            gc.enable()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off, and what exists frozen out of its sight, for the
    block; restored after it. Nested uses are harmless."""
    with gc_off():
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()


__all__ = ["gc_off", "gc_paused"]
