"""The core every other layer stands on: the Program IR, the Trace, the CUDA rules.

- :mod:`.program`: what one scheduler thread issues, in order (stdlib only: the GPU machine
  loads programs with only torch installed);
- :mod:`.trace`: what an executor saw, four tables of typed numpy columns with relations
  as ids;
- :mod:`.rules`: the CUDA stream rules, written once for every executor and reader;
- :mod:`.recorder`: the one writer of Traces, which hands out the ids;
- :mod:`.files`: atomic file writes; :mod:`.lazy`: lazy package attributes;
- :mod:`.refusals`: :class:`~simwar.core.refusals.PlanRefused`, the base of the signals an
  executor gives when planning finds it cannot take a run.

Imports: the standard library and numpy only.
"""
