"""Each step's shape as the engine named it: forward mode, batch and tokens.

Engines name a step by what it ran: SGLang's model runner wraps each forward in
``step[DECODE bs=32]`` or ``step[EXTEND bs=15 toks=15360]``; vLLM's worker in
``execute_context_9(8155)_generation_37(37)`` (requests in prefill and decoding, their
tokens) or, with detailed annotations, ``execute_8192_context_9(...)_generation_37(...)``.
A mapping's ``shape`` regex reads them with named groups (the presets hold the engines'
own: ``simwar/data/presets/``): ``mode``, ``batch``, ``tokens``, ``context`` and
``generation`` (request counts), ``context_tokens`` and ``generation_tokens``. What a name
leaves out is derived by one rule each, in :func:`shape_of`: the batch is the requests
(context + generation), the mode ``mixed`` when both are present, ``extend`` when only
context requests are, ``decode`` when only generation requests are, ``idle`` when none is;
a decode's tokens are its batch (one token per request).

:func:`step_shapes` reads a bound capture's shape ranges in time order, the record
``simwar import`` reports and the iteration shapes of a run are built from.

Imports: the standard library only (a caller gives the steps' bounds).
"""

from __future__ import annotations

import bisect
import re
from collections import Counter
from typing import NamedTuple


class StepShape(NamedTuple):
    """A step's shape: ``mode`` (``decode``, ``extend``, ``mixed``, or the engine's own
    word, lower case), ``batch`` (requests; -1: not named) and ``tokens`` (-1: not named)."""

    mode: str
    batch: int
    tokens: int
    name: str  # the range it was read from
    step: int = -1  # the capture's step it starts in (-1: none, or steps not given)

    def words(self) -> str:
        """``decode bs=32``, ``extend bs=15 toks=15360``."""
        out = self.mode
        if self.batch >= 0:
            out += f" bs={self.batch}"
        if self.tokens >= 0 and not (self.mode == "decode" and self.tokens == self.batch):
            out += f" toks={self.tokens}"
        return out


def shape_of(name: str, rx: re.Pattern) -> StepShape | None:
    """The shape a range's name gives (None: the regex does not match it)."""
    m = rx.search(name)
    if m is None:
        return None
    g = {k: v for k, v in m.groupdict().items() if v is not None}

    def num(key: str) -> int | None:
        return int(g[key]) if key in g and g[key].isdigit() else None

    ctx, gen = num("context"), num("generation")
    batch = num("batch")
    if batch is None and (ctx is not None or gen is not None):
        batch = (ctx or 0) + (gen or 0)
    mode = g.get("mode", "").lower()
    if not mode and (ctx is not None or gen is not None):
        mode = ("mixed" if ctx and gen else "extend" if ctx else "decode" if gen else "idle")
    tokens = num("tokens")
    if tokens is None and (num("context_tokens") is not None
                           or num("generation_tokens") is not None):
        tokens = (num("context_tokens") or 0) + (num("generation_tokens") or 0)
    if tokens is None and mode == "decode" and batch is not None:
        tokens = batch
    return StepShape(mode or "step", -1 if batch is None else batch,
                     -1 if tokens is None else tokens, name)


def step_shapes(annotations, pattern: str | None, bounds=()) -> list[StepShape]:
    """The shapes of a capture's ranges (``(name, start, end)``) that ``pattern`` reads, in
    time order, each with the step it starts in (``bounds``: each step's ``(start, end)``,
    :func:`simwar.capture.sizes.step_bounds`); empty without a pattern."""
    if not pattern:
        return []
    rx = re.compile(pattern)
    starts = [a for a, _ in bounds]
    out = []
    for name, a, _b in sorted(annotations, key=lambda r: r[1]):
        s = shape_of(name, rx)
        if s is None:
            continue
        k = bisect.bisect_right(starts, a) - 1
        if 0 <= k and a < bounds[k][1]:
            s = s._replace(step=k)
        out.append(s)
    return out


def shape_summary(shapes) -> str:
    """``decode bs=32 (1 step)``, ``mixed bs=46 toks=8192 (2 steps), ...``: each shape once,
    in the order first seen."""
    counts = Counter(s.words() for s in shapes)
    return ", ".join(f"{w} ({n} step{'s' if n != 1 else ''})" for w, n in counts.items())


__all__ = ["StepShape", "shape_of", "shape_summary", "step_shapes"]
