"""The Python API: ``simulate(config) -> Result``.

Ties the pipeline together: config → builder → Program → SimPy engine →
Trace → metrics and hazards. Nothing here prints or writes files.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import pandas as pd

from .analysis.hazards import HazardReport
from .analysis.metrics import analyze
from .builder import build_program, stream_program
from .config import Config, load_config
from .engine import Engine
from .program import Program
from .trace import Trace


@dataclass
class Result:
    """One simulated run. ``steps``: per-step DataFrame; ``summary``: a flat dict.

    ``program`` is rebuilt from the config on first use (building is deterministic),
    so a long run does not keep its op list alongside its trace.
    """

    config: Config
    trace: Trace
    steps: pd.DataFrame
    summary: dict
    hazards: HazardReport
    events: int = 0

    @cached_property
    def program(self) -> Program:
        return build_program(self.config)

    @property
    def races(self) -> pd.DataFrame:
        """Latent races and observed overlaps after warm-up, one row per access pair."""
        return self.hazards.since(self.config.warmup_steps).frame()


def simulate(cfg: Config | dict | str | None = None, overrides=None,
             progress: Callable[[int], None] | None = None) -> Result:
    """Simulate a config (path, mapping, Config, or None for the packaged default).

    ``progress``: called with the step number as the simulation reaches each step.
    """
    cfg = load_config(cfg, overrides)
    engine = Engine(stream_program(cfg), progress=progress)
    trace = engine.run()
    steps, summary, hazards = analyze(trace)
    return Result(cfg, trace, steps, summary, hazards, engine.events)
