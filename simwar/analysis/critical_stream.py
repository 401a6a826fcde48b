"""The critical path of a run streamed as Trace windows: :func:`critical_path_stream`.

:func:`simwar.analysis.critical_path.critical_path` walks a whole Trace; a long run's
Trace need not exist: the fast executor's trace mode streams it in windows
(:func:`simwar.api.trace_windows`), and here each step's chains are walked in the window
where its forward is complete, with the same :class:`~simwar.analysis.critical_path.Walker`
and tallied in step order (:class:`~simwar.analysis.critical_path.CauseTally`), so the figures
and causes are those of the whole Trace, in the memory of one window.

Imports: numpy, the critical path's module and the run record (:mod:`simwar.core.run_meta`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simwar.analysis.critical_path import ChainKind, CriticalPath, NoForward, Truncated, Walker
from simwar.core.run_meta import RunMeta
from simwar.core.trace import OpKind

__all__ = ["critical_path_stream"]


@dataclass(slots=True)
class _Forward:
    """One step's forward kernels seen so far: the earliest start, its op (as the run
    numbers it), and the latest end."""

    step: int
    start_us: float
    first_op: int
    end_us: float


def critical_path_stream(windows, steps: tuple[int, int] | None = None) -> CriticalPath:
    """:func:`critical_path` of a run streamed as Trace windows (in order: the one-pass
    executor's trace mode, :func:`simwar.api.trace_windows`, with a margin of a few
    iterations), to the same figures and causes, in the memory of one window.

    Each step's forward is known once its window says the step is complete; its chains are
    walked in that window (a walk that would reach past the window's start raises
    :class:`Truncated`: stream again with a larger margin). The chains of the first step
    explained are kept, with the window they were walked in as ``trace`` (``chain_figure``).
    """
    out: CriticalPath | None = None
    partial: dict[int, _Forward] = {}  # by step, until the step is complete
    prev: _Forward | None = None  # the last complete forward
    held = None  # the default range: the last forward's gap chain, until a later one comes
    first_step = last_steps = None  # the run's first forward step; its last two
    first_usable = None  # the first forward step after warm-up
    n_forward = 0
    keep_step = None
    warm = 0
    for w in windows:
        if out is None:
            warm = w.run.warmup_steps
            out = CriticalPath(w, steps or (0, 0))
        _merge_forwards(w, partial)
        final = sorted(k for k in partial if k < w.complete_below)
        if not final:
            continue
        walker = None
        for k in final:
            cur = partial.pop(k)
            first = cur.first_op
            n_forward += 1
            first_step = k if first_step is None else first_step
            if first_usable is None and k >= warm:
                first_usable = k
            last_steps = (last_steps[1] if last_steps else None, k)
            if prev is not None:
                local = first - w.op_base
                if local < 0:
                    raise Truncated(first)
                if walker is None:
                    walker = Walker(w)
                pk = prev.step
                if held is not None:  # a later forward came: the held gap was not the last
                    out.add(held, keep=held.step == keep_step)
                    held = None
                if (pk >= warm) if steps is None else (steps[0] <= pk <= steps[1]):
                    chain = walker.chain(local, float(prev.start_us), ChainKind.STEP, pk)
                    if keep_step is None:
                        keep_step = pk
                        out.trace = w
                    out.add(chain, keep=pk == keep_step)
                if (k >= warm) if steps is None else (steps[0] <= k <= steps[1]):
                    gap = walker.chain(local, float(prev.end_us), ChainKind.GAP, k,
                                       float(cur.start_us - prev.start_us))
                    if keep_step is None:
                        keep_step = k
                        out.trace = w
                    if steps is None:
                        held = gap
                    else:
                        out.add(gap, keep=k == keep_step)
                out.gates.update(walker.gates)
            prev = cur
    if out is None or n_forward == 0:
        run = out.trace.run if out is not None else RunMeta()
        raise NoForward("no forward work: the trace has no phased kernels on the forward "
                        f"stream '{run.forward_stream}'")
    if steps is None:
        if last_steps[0] is None or first_usable is None or first_usable > last_steps[0]:
            raise NoForward(f"no measured steps: need two steps with forward work after "
                            f"warm-up ({warm}); the trace has forward work in {n_forward} "
                            f"step(s)")
        out.steps = (int(first_usable), int(last_steps[0]))
    else:
        a, b = steps
        if a > b or a < first_step or b > last_steps[1]:
            raise ValueError(f"steps {a}:{b} are outside the run: steps with forward work "
                             f"are {first_step}..{last_steps[1]}")
        out.steps = (int(a), int(b))
        if not out.n_gaps and not out.n_steps:
            raise ValueError(f"steps {a}:{b}: nothing to explain (the first forward has no "
                             "gap before it and the last no step after it)")
    return out


def _merge_forwards(w, partial: dict[int, _Forward]) -> None:
    """Add the forward kernels of a window's core to the steps' extents so far: the earliest
    start (ties: the first issued), its op as the run numbers it, and the latest end."""
    ops = w.ops
    fwd = w.code(w.run.forward_stream)
    ids = np.arange(w.core_op, len(ops))
    kern = ids[(ops.kind[ids] == OpKind.KERNEL) & (ops.lane[ids] == fwd)
               & (ops.phase[ids] != w.code(""))]
    if not len(kern):
        return
    order = np.lexsort((kern, ops.start_us[kern], ops.step[kern]))
    kern = kern[order]
    steps, first = np.unique(ops.step[kern], return_index=True)
    end = np.full(len(steps), -np.inf)
    np.maximum.at(end, np.searchsorted(steps, ops.step[kern]), ops.end_us[kern])
    for k, f, st, e in zip(steps.tolist(), (kern[first] + w.op_base).tolist(),
                           ops.start_us[kern[first]].tolist(), end.tolist()):
        had = partial.get(k)
        if had is None:
            partial[k] = _Forward(k, st, f, e)
            continue
        if st < had.start_us:  # an earlier start; on a tie the first issued (lower id) stays
            had.start_us, had.first_op = st, f
        if e > had.end_us:
            had.end_us = e
