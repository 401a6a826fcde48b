"""The cyclic garbage collector paused around a run: the one helper every executor uses.

A run allocates many small objects (tuples, events, floats) and no reference cycles worth
collecting; with the collector on, collecting alone cost 1.4-1.6x the run.

Imports: the standard library only.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off, and what exists frozen out of its sight, for the
    block; restored after it. Nested uses are harmless."""
    enabled = gc.isenabled()
    gc.disable()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        if enabled:
            gc.enable()


__all__ = ["gc_paused"]
