"""The GPU harness: replay a Program on real CUDA streams and calibrate the model.

- ``plan``: Program → replay plan (stamps, snapshot slots, graph grouping,
  timing points); stdlib only.
- ``replay``: walks a plan on a stream backend and assembles a Trace in the
  simulator's schema, with the value check (measured races); stdlib and numpy.
- ``fake``: a deterministic virtual-clock backend for CPU tests.
- ``cuda``: the PyTorch backend (spin kernels, real events, captured graphs):
  the replay's torch backend (CSAN and the lab's probe and mini-server import torch too).
- ``bench``: primitive micro-benchmarks (torch).
- ``gpu_main``: the entry point run on the GPU machine (torch + stdlib).
- ``suite``: the committed suite of cases (it imports simwar's full stack and
  runs where simulation runs).
- ``csan``: PyTorch's CUDA sanitizer, its reports collected and classified (torch).

The probe and the mini-server of SGLang's overlap loop on real kernels are the lab's
(``lab/`` in a source checkout, not installed: ``python -m lab.probe``, ``python -m
lab.server``); they import this package's CSAN collector, and nothing here imports them.

Calibration from the measured traces and the sim-vs-real error table are
:mod:`simwar.fit.replays`'s; reading profiler captures is :mod:`simwar.capture`'s,
which nothing here imports. Importing this package imports nothing beyond the
standard library and numpy: the GPU machine has torch and numpy but none of simwar's other
dependencies.
"""

from __future__ import annotations

from simwar.harness.plan import ReplayPlan, make_plan
from simwar.harness.replay import replay

__all__ = ["ReplayPlan", "make_plan", "replay"]
