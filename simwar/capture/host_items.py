"""The importer's host items: their issue order and the ranges each host call lies in.

:class:`simwar.capture.to_trace.CaptureTraceBuilder` assembles a Trace in one pass over the
host items: every runtime call it keeps (the scheduler thread's, then the other threads'),
then the device work whose call is not in the capture. :func:`issue_order` orders them by
issue time (calls before device work at one time, then by index; ties kept in list order)
with one stable numpy sort of three columns, where a tuple per item used to be sorted, and
gives their issue times, from which the builder finds every item's step by one search;
:func:`indices` hands the order back as Python ints a chunk at a time.
:func:`enclosing_ranges` gives each host call the phase and site of the ``record_function``
ranges open at its start (the innermost that a phase rule, and that a site rule, matches).

Imports: numpy and the standard library.
"""

from __future__ import annotations

from itertools import chain

import numpy as np


def issue_order(items: list, n_calls: int, origin: float,
                gpu_offset: float) -> tuple[np.ndarray, np.ndarray]:
    """The indices of ``items`` in issue order, and each item's issue time: the first
    ``n_calls`` are runtime calls, issued at their start (``ts - origin``), the rest device
    work, at its start on the host clock (``ts + gpu_offset - origin``); at one time calls
    come first, then by index, and device work in list order."""
    ts = np.fromiter((x.ts for x in items), float, len(items))
    ts[:n_calls] -= origin
    ts[n_calls:] = ts[n_calls:] + gpu_offset - origin  # as ts + gpu_offset - origin
    later = np.zeros(len(items), np.int8)
    later[n_calls:] = 1
    index = np.arange(len(items))
    index[n_calls:] = -1
    return np.lexsort((index, later, ts)), ts


def indices(order: np.ndarray, chunk: int = 1 << 16):
    """The items of ``order`` as Python ints, a chunk at a time (a list of them all would
    cost 36 bytes an item at once), by ``chain`` (no generator resumed per item)."""
    return chain.from_iterable(order[lo:lo + chunk].tolist()
                               for lo in range(0, len(order), chunk))


def enclosing_ranges(calls: list, ann: list, phase_of: dict[str, str | None],
                     site_of: dict[str, str | None]) -> list:
    """For each host call (by start), ``(phase, site)``: of the ranges ``ann`` (by start, the
    outer first) open at its start, the phase of the innermost whose name a phase rule
    matches and the site of the innermost a site rule matches (None: none). ``phase_of`` and
    ``site_of``: a range name's phase and site by the mapping's rules (None: no rule
    matches; :meth:`simwar.capture.mapping.Mapping.phase_of`, each name searched once);
    ranges no rule matches are left off the stack."""
    out = []
    none = (None, None)  # shared: most calls sit in no mapped range
    stack: list[tuple[float, str | None, str | None]] = []  # (end, phase, site)
    low = float("inf")  # the earliest end on the stack (NaN: one end is NaN)
    current = none  # the answer for the stack as it is: recomputed only when it changes
    j, n = 0, len(ann)
    for c in calls:
        t = c.ts
        changed = False
        while j < n and ann[j].ts <= t:
            a = ann[j]
            j += 1
            phase, site = phase_of[a.name], site_of[a.name]
            if phase is not None or site is not None:
                end = a.ts + a.dur
                stack.append((end, phase, site))
                changed = True
                if end < low or end != end:  # a NaN end stays the low until it is dropped
                    low = end
        if not low >= t:  # a range on the stack ended before this call
            stack = [e for e in stack if e[0] >= t]
            low = float("inf")
            for e in stack:
                if e[0] < low:
                    low = e[0]
            changed = True
        if changed:
            phase = site = None
            for _, p, s in reversed(stack):  # innermost first
                if phase is None:
                    phase = p
                if site is None:
                    site = s
                if phase is not None and site is not None:
                    break
            current = none if phase is None and site is None else (phase, site)
        out.append(current)
    return out


__all__ = ["enclosing_ranges", "indices", "issue_order"]
