"""The CUDA stream rules (docs/design.md, "CUDA semantics"), in one place.

Every executor and reader that places device work in time uses these
functions: the SimPy engine (inside its stream processes), the one-pass
executor, the GPU replay's assembly (for device times it does not measure),
the fake stream backend and the Kineto importer (for record firings and
wait releases a capture does not show). Written once, they cannot drift
apart.

- a stream runs its operations in FIFO order, each no earlier than the host
  call that issued it returned: an operation **begins** at
  ``max(stream tail, ready)``;
- ``record(E, S)`` captures the tail of S at the host call: it **fires** when
  S drains the work issued before it, i.e. at ``max(tail, ready)``;
- a stream wait is reached at ``max(tail, ready)`` and **released** when its
  bound record has fired, plus the cross-stream latency when the record is
  on another stream; a wait bound to nothing (never recorded) is a no-op;
- a host ``synchronize`` **returns** after its own call cost, or, if its
  record fires later than that, at the firing plus the host's wake-up
  latency.

:class:`Lanes` applies the first three to per-stream tails for executors
that compute a schedule in one pass (the host's issue order is a valid
evaluation order: every input of an operation was issued before it).

Imports: the standard library, and numpy for the forms over arrays of runs.
"""

from __future__ import annotations

import numpy as _np


def begins(tail: float, ready: float) -> float:
    """Start of an operation on a FIFO stream whose tail is ``tail``, issued at ``ready``."""
    return tail if tail > ready else ready


# a record fires when its stream reaches it: the same rule as a kernel's start
fires = begins


def released(reach: float, fired: float, latency_us: float, same_stream: bool) -> float:
    """When a stream wait reached at ``reach`` lets its stream go on."""
    t = fired if same_stream else fired + latency_us
    return t if t > reach else reach


def returns(called: float, cost_us: float, fired: float | None, wake_us: float) -> float:
    """When a host ``synchronize`` called at ``called`` returns (``fired`` None: no record)."""
    t = called + cost_us
    if fired is not None and fired > t:  # really blocked: the thread pays the wake-up
        return fired + wake_us
    return t


# ---- tensor-parallel ranks' collectives (docs/design.md, "Tensor-parallel ranks")

def collective_ends(last: float, duration_us: float) -> float:
    """When a device collective kernel completes on a rank: the last rank's begin of it
    (``last``) plus the rank's own duration (an early rank spins in it meanwhile)."""
    return last + duration_us


def host_collective_leaves(arrival: float, last: float, cost_us: float,
                           wake_us: float) -> float:
    """When a rank's host leaves a host collective it reached at ``arrival``: the last rank's
    arrival plus its own cost, plus its wake-up when it waited (``wake_us`` 0 for a spinning
    waiter)."""
    return last + cost_us + (wake_us if last > arrival else 0.0)


# ---- the same rules over arrays of runs (lockstep: one element per run, the same ops)
#
# For values that are not NaN and never -0.0 (a run's times: sums of durations >= 0 from
# 0.0), ``numpy.maximum(a, b)`` is ``a if a > b else b`` element by element: the two differ
# only on a tie, where both are the same number. So each function below gives, per element,
# exactly what its scalar form above gives (:mod:`simwar.executors.lockstep`).

#: :func:`begins` of arrays (or an array and a number): numpy's ``maximum`` itself, bound
#: without a wrapper (the lockstep pass calls it a few times per op and step)
begins_many = _np.maximum


def begins_where(tail, ready):
    """:func:`begins` of arrays by the scalar form's own comparison, element by element: the
    same choice for every value, NaN and ties included (an import's inferred times, which the
    lockstep's caveat above does not cover)."""
    return _np.where(tail > ready, tail, ready)


def released_where(reach, fired, latency_us: float, same_stream):
    """:func:`released` of arrays (``same_stream`` an array of bools), by its own comparison
    element by element, as :func:`begins_where`."""
    t = _np.where(same_stream, fired, fired + latency_us)
    return _np.where(t > reach, t, reach)


def released_many(reach, fired, latency_us, same_stream: bool):
    """:func:`released` of arrays."""
    return _np.maximum(fired if same_stream else fired + latency_us, reach)


def returns_many(called, cost_us, fired, wake_us):
    """:func:`returns` of arrays (``fired`` None: no record)."""
    t = called + cost_us
    if fired is None:
        return t
    if type(t) is _np.ndarray and type(fired) is _np.ndarray and t.shape == fired.shape:
        # the same choice element by element, written into t (a new array): numpy's
        # putmask costs less than its where over a lockstep group's few runs
        _np.putmask(t, fired > t, fired + wake_us)
        return t
    return _np.where(fired > t, fired + wake_us, t)


class Lanes:
    """Per-stream tails, advanced by the rules above (one-pass schedules)."""

    __slots__ = ("tail",)

    def __init__(self) -> None:
        self.tail: dict[str, float] = {}

    def fire(self, lane: str, ready: float) -> float:
        """A record issued at ``ready`` on ``lane``: when it fires."""
        t = fires(self.tail.get(lane, ready), ready)
        self.tail[lane] = t
        return t

    def hold(self, lane: str, ready: float, fired: float | None, latency_us: float,
             same_stream: bool) -> tuple[float, float]:
        """A wait issued at ``ready``: ``(reached, released)``; ``fired`` None is a no-op."""
        reach = begins(self.tail.get(lane, ready), ready)
        release = reach if fired is None else released(reach, fired, latency_us, same_stream)
        self.tail[lane] = release
        return reach, release
