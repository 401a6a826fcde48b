"""The Python API: ``simulate(config) -> Result``.

Ties the pipeline together: config → builder → Program → SimPy engine →
Trace → metrics and hazards. Nothing here prints or writes files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

from .builder import build_program
from .config import Config, load_config
from .engine import Engine
from .hazards import HazardReport
from .metrics import analyze
from .program import Program
from .trace import Trace


@dataclass
class Result:
    """One simulated run. ``steps``: per-step DataFrame; ``summary``: a flat dict."""

    config: Config
    program: Program
    trace: Trace
    steps: pd.DataFrame
    summary: dict
    hazards: HazardReport
    events: int = 0

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
    program = build_program(cfg)
    engine = Engine(program, progress=progress)
    trace = engine.run()
    steps, summary, hazards = analyze(trace)
    return Result(cfg, program, trace, steps, summary, hazards, engine.events)
