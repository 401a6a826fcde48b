"""Executors: a Program (or a config's iteration plan) → times, per-step facts and races.

- :mod:`.engine`: the SimPy engine, the reference, which keeps the full Trace;
- :mod:`.fast`: the one-pass executor, equal to the engine bit for bit;
- :mod:`.lockstep`: many runs of one shape at once, equal to the one-pass executor;
- :mod:`.ranks`: tensor-parallel ranks on the SimPy engine; :mod:`.onepass_ranks`: the
  same ranks in one pass per rank, the engine's Traces without SimPy;
- :mod:`.choice`: the table of executors, what each refuses and why, and ``choose``.

Every faster path is held equal to the SimPy engine by the tests (docs/design.md,
"Executors and exactness"). Imports: numpy, simpy (the engine only) and the layers below.
"""
