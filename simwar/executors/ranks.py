"""The SimPy engine over tensor-parallel ranks: one environment, one engine per rank.

Each rank's Program (:func:`simwar.builder.ranks.rank_programs`) runs in its own
:class:`~simwar.executors.engine.Engine`, with its own host process, streams and recorder;
all share one SimPy environment and one :class:`~simwar.executors.engine.Group`, through
which the ranks' collectives join (the k-th host collective of every rank is one instance,
the k-th device collective another). The rules (docs/design.md, "Tensor-parallel ranks"):

- a host collective: each rank leaves at the last rank's arrival plus its cost (plus its
  wake-up when it waited and waits by blocking);
- a device collective kernel begins by the stream rules and completes on each rank at the
  last rank's begin plus its own duration.

Returns one Trace per rank, each with ``meta["collectives"]``: the op id, host (0) or device
(1), and instance number of every collective it joined; the same instance on two ranks is
the same collective (a relation as data, never matched by time).

Imports: simpy (through the engine), :mod:`simwar.core`.
"""

from __future__ import annotations

from simwar.core.collector import gc_paused
from simwar.core.program import Program
from simwar.core.trace import Trace
from simwar.executors.engine import Engine, Group, _CountingEnvironment


class Deadlock(RuntimeError):
    """The ranks stopped with a collective some rank never reached."""


def run_ranks(programs: list[Program], progress=None) -> tuple[list[Trace], int]:
    """Simulate the ranks' Programs together: their Traces and the SimPy events scheduled."""
    env = _CountingEnvironment()
    group = Group(len(programs))
    engines = [Engine(p, progress=progress if r == 0 else None, env=env, group=group, rank=r)
               for r, p in enumerate(programs)]
    for e in engines:
        e.start()
    with gc_paused():
        env.run()
    if group.joins:
        (table, index), j = next(iter(group.joins.items()))
        missing = j.missing()
        what = "device" if table else "host"
        raise Deadlock(f"the ranks stopped at {what} collective {index}: rank(s) "
                       f"{', '.join(map(str, missing))} never reached it (ranks must issue "
                       f"the same collectives in the same order)")
    return [e.finish() for e in engines], env.scheduled
