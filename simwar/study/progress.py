"""A sweep's progress: a bar on a terminal, lines in a log, or a callback.

:func:`progress_reporter` gives :func:`simwar.study.sweeps.sweep` a :class:`_Report` to
call as runs are simulated (``done``) or found already stored (``skipped``): a tqdm bar on
stderr when it is a terminal, else one line every 5 % of the runs (and at most
:data:`LOG_EVERY_S` apart), so that a log gets lines, never a redrawn bar; or the caller's
callable, given the runs newly simulated. Both say the runs simulated per second and the
time left (tqdm's ``run/s`` and remaining time; a line's ``about N s left``), whichever
backend runs them (a Ray cluster's batches report as they come back).

Imports: the standard library; tqdm only when a bar is drawn.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from typing import Callable, Iterator

__all__ = ["LOG_EVERY_S", "LOG_LINES", "progress_reporter"]


class _Report:
    """Where a sweep's progress goes: ``done(n)`` runs simulated, ``skipped(n)`` runs found
    stored or identical to one already run (they count towards the total, not as work)."""

    def __init__(self, done=lambda n: None, skipped=lambda n: None):
        self.done = done
        self.skipped = skipped


class _Lines:
    """Progress as a line every ``every`` runs (5 % of them), at most :data:`LOG_EVERY_S`
    apart while runs finish, and at the end (stderr not a terminal: a log gets lines, never
    a redrawn bar)."""

    def __init__(self, total: int, stream):
        self.total = total
        self.stream = stream
        self.every = max(1, math.ceil(total / LOG_LINES))
        self.n = self.simulated = 0
        self.started = self.last = time.perf_counter()

    def add(self, n: int, simulated: bool) -> None:
        before = self.n
        self.n += n
        self.simulated += n if simulated else 0
        now = time.perf_counter()
        if self.n // self.every > before // self.every or self.n == self.total \
                or now - self.last >= LOG_EVERY_S:
            self.last = now
            elapsed = now - self.started
            rate = ""
            if self.simulated and elapsed:
                per_s = self.simulated / elapsed
                rate = f", {per_s:.2f} runs/s"
                if self.n < self.total:
                    rate += f", about {(self.total - self.n) / per_s:.0f} s left"
            print(f"simwar: sweep {self.n}/{self.total} runs ({100 * self.n / self.total:.0f}%;"
                  f" {self.simulated} simulated in {elapsed:.1f} s{rate})", file=self.stream,
                  flush=True)


#: lines a sweep's progress log has for its share of runs (stderr not a terminal), and the
#: most seconds between two lines while runs finish
LOG_LINES = 20
LOG_EVERY_S = 30.0


@contextlib.contextmanager
def progress_reporter(progress: bool | Callable[[int], None],
                      total: int) -> Iterator[_Report]:
    """Where a sweep of ``total`` runs reports: ``progress`` a callable (given the runs newly
    simulated), True (a bar on a terminal, else lines), or False (nowhere)."""
    if callable(progress):
        yield _Report(done=progress)
    elif progress and not sys.stderr.isatty():
        lines = _Lines(total, sys.stderr)
        yield _Report(done=lambda n: lines.add(n, True), skipped=lambda n: lines.add(n, False))
    elif progress:
        from tqdm import tqdm

        with tqdm(total=total, unit="run", file=sys.stderr, dynamic_ncols=True,
                  smoothing=0.1) as bar:
            yield _Report(done=bar.update, skipped=bar.update)
    else:
        yield _Report()
