"""Many runs in lockstep: a sweep's runs that share their iteration shapes, executed together.

The fast executor (:mod:`simwar.executors.fast`) turns a config's run into a few blocks
of one iteration shape each, compiled into straight-line Python over floats. Runs of a
sweep mostly differ in numbers only (a CPU time, a kernel's duration, the seed): their
plans have the same blocks, and only the parameters differ. So a group of them runs as one:
each op's start is ``max(stream tail, issue time)`` over an array of the runs, records,
waits and host syncs are the same rules over arrays (:mod:`simwar.core.rules`), in the
same order, so each run's numbers are the fast executor's, bit for bit
(``tests/test_lockstep.py``: every summary key of random grids, stochastic durations and
workloads included). The interpreter's cost per op is paid once for the group instead of
once per run.

- :func:`~simwar.executors.lockstep.execute.run_group`: the summaries of runs whose plans
  share a :func:`~simwar.executors.lockstep.execute.group_key`, in batches of at most
  :func:`batch_size` runs (:func:`simwar.api.simulate_many` plans, groups and batches a
  sweep's runs; what cannot run in lockstep runs alone);
- :func:`realize_group`: the same for runs whose batches depend on their own times
  (arrivals, requests whose results are marked): each run's sizes fixed as the group goes
  (:func:`~simwar.executors.lockstep.execute.realize_group`); runs that pick their step
  shapes as they go (``scheduling.rule: sglang``) each pick theirs from their own queue, and
  each step's block runs over the runs that picked it
  (:func:`~simwar.executors.lockstep.shapes.realize_shape_group`);
- :func:`~simwar.executors.lockstep.united.run_united`: groups that differ in an op or two
  a step (two barriers: a stream wait in one, a wait on an event in the other) as one pass
  over their blocks' unions, a lane per run (:func:`~.united.unite` finds them);
- :mod:`.family`: the members of an ``advise`` family (candidates that differ only in where
  read-done is published) as lanes of one pass over their blocks' unions, each guarded op
  kept in the lanes of the members that have it
  (:func:`~simwar.executors.lockstep.family.run_family`, which ``advise``'s screen runs);
- :mod:`.ranks`: the ranks of one tensor-parallel run in lockstep, a lane per rank, met at
  their collectives (``engine: fast`` with ``parallel.tp > 1``, no Trace asked for);
- :mod:`.execute`: the pass and the summaries; the blocks are compiled by the one-pass
  executor's code generator in its array target (:mod:`simwar.executors.fast.codegen`).

Imports: this package's parts (numpy, simwar.core, simwar.analysis, the one-pass
executor's plans and races).
"""

from __future__ import annotations

from simwar.executors.lockstep import execute
from simwar.executors.lockstep.execute import NotLockstep, group_key, run_group
from simwar.executors.lockstep.shapes import realize_shape_group
from simwar.executors.lockstep.united import run_united, unite

#: bytes of per-step facts a batch may hold (a row per step, a column per run: forward start
#: and end, launch, busy and held time, blocked time at one or two sites)
BATCH_BYTES = 512 << 20
#: the most runs in one batch
MAX_BATCH = 4096


def realize_group(cfgs: list, window: int = 2) -> list[dict]:
    """The summaries of runs whose batches depend on their own times, in lockstep, each
    ``simulate(cfg).summary`` bit for bit: runs that pick their step shapes as they go
    (``scheduling.rule: sglang``) by :func:`~.shapes.realize_shape_group`, the others by
    :func:`~.execute.realize_group`. Raises :class:`NotLockstep` for runs that cannot run
    together (a mix of the two included)."""
    picking = [cfg.shapes_vary for cfg in cfgs]
    if any(picking):
        if not all(picking):
            raise NotLockstep("runs of different structures")
        return realize_shape_group(cfgs, window)
    return execute.realize_group(cfgs, window)


def batch_size(steps: int) -> int:
    """Runs of ``steps`` steps in one lockstep batch (bounded by :data:`BATCH_BYTES`)."""
    return max(1, min(MAX_BATCH, BATCH_BYTES // (7 * 8 * (steps + 2))))


__all__ = ["BATCH_BYTES", "MAX_BATCH", "NotLockstep", "batch_size", "group_key", "realize_group",
           "run_group", "run_united", "unite"]
