"""The GPU harness: replay a Program on real CUDA streams and calibrate the model.

- ``plan``: Program → replay plan (stamps, snapshot slots, graph grouping,
  timing points); stdlib only.
- ``replay``: walks a plan on a stream backend and assembles a Trace in the
  simulator's schema, with the value check (measured races); stdlib and numpy.
- ``fake``: a deterministic virtual-clock backend for CPU tests.
- ``cuda``: the PyTorch backend (spin kernels, real events, captured graphs):
  the only module of simwar that imports torch.
- ``bench``: primitive micro-benchmarks (torch).
- ``gpu_main``: the entry point run on the GPU machine (torch + stdlib).
- ``server`` (and ``server_*``): a mini-server of SGLang's overlap loop on real kernels (torch).
- ``suite``: the committed suite of cases; ``fit``: calibration from measured
  traces and the sim-vs-real error table (these two import simwar's full
  stack and run where simulation runs).

Importing this package imports nothing beyond the standard library: the
GPU machine has torch but none of simwar's other dependencies.
"""

from __future__ import annotations

from simwar.harness.plan import ReplayPlan, make_plan
from simwar.harness.replay import replay

__all__ = ["ReplayPlan", "make_plan", "replay"]
