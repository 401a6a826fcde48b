"""Why an executor cannot take a run: :class:`PlanRefused`, the base of every planning signal.

Most refusals are known from the config alone and are checked before anything runs (the
table of :mod:`simwar.executors.choice`). The rest are only found while planning or
running: iterations that never settle into one shape, a template a duration cannot be traced
into, ranks whose collectives one pass cannot follow, a plan the lockstep pass cannot take,
names the trace mode cannot make. Each executor raises a subclass of its own, defined
where the signal is raised; the runner (:mod:`simwar.api`) catches exactly those, takes the
next executor and records the reason (the exception's message).

Not a :class:`RuntimeError`: an unrelated error raised while planning (a bug, bad data)
must propagate, not switch executors.

Imports: nothing.
"""

from __future__ import annotations


class PlanRefused(Exception):
    """An executor cannot take this run; the message says why (one line, no trailing dot)."""


__all__ = ["PlanRefused"]
