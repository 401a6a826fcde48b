"""Executors: a Program (or a config's iteration plan) → times, per-step facts and races.

Named by what users type in ``engine=``:

- ``simpy``, :mod:`.engine`: the SimPy engine, the reference, which keeps the full Trace;
  :mod:`.ranks`: tensor-parallel ranks on it;
- ``fast``, :mod:`.fast`: the fast executor, one pass without SimPy, equal to the engine bit
  for bit; :mod:`.fast.ranks`: the same tensor-parallel ranks in one pass per rank, the
  engine's Traces;
- :mod:`.lockstep`: many runs of one shape at once, equal to the fast executor;
- :mod:`.host_loop`: the host side the SimPy engine and the fast executor's ranks share (the
  walk over a Program's host ops and its recorder calls), each with its own device.
- :mod:`.choice`: the table of executors, what each refuses and why, and ``choose``.

Every faster path is held equal to the SimPy engine by the tests (docs/design.md,
"Executors and exactness"). Imports: numpy, simpy (the engine only) and the layers below.
"""
