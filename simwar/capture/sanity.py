"""Sanity checks of a read capture: what no real profiler writes, counted and warned about.

A capture can hold events that no GPU or profiler produces, and imported as they are they
give impossible figures with exit 0 (a negative GPU idle, thousands of races, a 4-second
step). :func:`check_capture` looks for each kind before the Trace is built and returns the
capture to build with and one counted warning per kind:

- **events recorded twice** (the same kernel, call, sync or annotation at the same time,
  with the same correlation id: a file concatenated with itself, a merge run twice): each
  kept once;
- **correlation ids used by several runtime calls of one process** (a launch and its
  device work are matched by that id, so the matches are guesses): warned;
- **kernels overlapping on one stream** (a stream runs its work in order, one at a time)
  by more than :data:`OVERLAP_TOLERANCE_US` (real captures show up to about 1 µs of clock
  jitter): warned; the GPU idle counts the union of the stream's work
  (:func:`simwar.analysis.metrics.merged`), never a negative time;
- **implausible units**: runtime calls whose median lasts more than
  :data:`CALL_MEDIAN_LIMIT_US` (a launch takes a few µs; Kineto writes µs, so a capture in
  ns reads a thousand times too long): warned, with the factor.

Imports: the standard library, numpy and :mod:`simwar.capture.reader` (the reader itself is
not changed: these are rules about what it read).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections import Counter
from operator import attrgetter

import numpy as np

from simwar.capture.reader import CaptureEvents

#: kernels on one stream may overlap by this much (clock jitter of real captures) unwarned
OVERLAP_TOLERANCE_US = 2.0
#: a median runtime call longer than this (µs) means the capture is not in µs
CALL_MEDIAN_LIMIT_US = 500.0


def _column(items: list, cols: dict, field: str, ids: bool = False) -> np.ndarray:
    """The field ``field`` of every one of ``items``: the reader's column (``cols``, see
    :func:`_columns`), else rebuilt from the records: ids by :func:`_keys`, anything else
    (times) as float64."""
    col = cols.get(field)
    if col is not None:
        return col
    values = map(attrgetter(field), items)
    return _keys(list(values)) if ids else np.fromiter(values, np.float64, len(items))


def _once(items: list, ts: np.ndarray) -> tuple[list, int]:
    """``items`` with exact repeats dropped (first kept, order kept), and how many were.
    A repeat has its original's start: only the items whose ``ts`` (their starts) another
    item shares are compared whole (most captures have none of those, and hashing every
    record whole took a twentieth of a large import)."""
    order = np.argsort(ts, kind="stable")
    same = ts[order[1:]] == ts[order[:-1]]
    if not same.any():
        return items, 0
    shared = np.zeros(len(items), dtype=bool)
    shared[order[1:][same]] = True
    shared[order[:-1][same]] = True
    seen: set = set()
    out = []
    for item, maybe in zip(items, shared.tolist()):
        if maybe:
            if item in seen:
                continue
            seen.add(item)
        out.append(item)
    return out, len(items) - len(out)


def check_capture(cap: CaptureEvents) -> tuple[CaptureEvents, list[str]]:
    """``(capture, warnings)``: the capture with events recorded twice kept once, and one
    warning per kind of implausible content (see the module docstring)."""
    warnings: list[str] = []
    lists = {}
    repeated = Counter()
    cols = _columns(cap)
    for name in ("device_events", "runtime_calls", "sync_events", "annotations"):
        items = getattr(cap, name)
        lists[name], repeated[name] = _once(items, _column(items, cols[name], "ts"))
    if sum(repeated.values()):
        cols = dict.fromkeys(cols, {})  # the lists changed: their columns no longer fit
        what = ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in repeated.items() if n)
        warnings.append(f"{what} appear more than once (the same event at the same time: a "
                        f"file joined with itself?); each is kept once")
        cap = dataclasses.replace(cap, **lists)
    shared = _shared_ids(cap.runtime_calls, cols["runtime_calls"])
    if shared:
        warnings.append(f"{shared} runtime calls share a correlation id with another call of "
                        f"their process: the device work of those ids is matched to one of "
                        f"them, a guess")
    count, worst = _overlaps(cap, cols["device_events"])
    if count:
        warnings.append(f"{count} device ops start before the previous op on their stream "
                        f"ends (by up to {worst:.1f} µs): a stream runs one op at a time, so "
                        f"the capture's times are inconsistent; busy and idle times count "
                        f"the union of each stream's work")
    calls = _column(cap.runtime_calls, cols["runtime_calls"], "dur")
    # the reader warns of a capture whose span is too long for µs: one warning of the units
    said = any("ns, not µs" in str(problem) for _, problem in cap.problems)
    if len(calls) and not said:
        # numpy's median is statistics.median's (the middle value, or the mean of the two)
        # without sorting a list of floats; a NaN, which numpy would answer, left to it
        median = statistics.median(calls.tolist()) if np.isnan(calls).any() else \
            float(np.median(calls))
        if median > CALL_MEDIAN_LIMIT_US:
            warnings.append(f"the median runtime call lasts {median:.0f} µs (a launch takes a "
                            f"few µs): the capture's times look like ns, not the µs Kineto "
                            f"writes (read as µs, every time is 1000x too long)")
    return cap, warnings


def _columns(cap: CaptureEvents) -> dict[str, dict]:
    """The columns the reader kept of each list (:attr:`CaptureEvents.columns`) where they
    fit it (taken of that very list, which holds just those records:
    :meth:`~simwar.capture.records.KeptColumns.fit`; {} for a list without: its values come
    from the records), dropped from the capture (they serve these checks once)."""
    kept, cap.columns = cap.columns or {}, None
    out = {}
    for name in ("device_events", "runtime_calls", "sync_events", "annotations"):
        k = kept.get(name)
        fits = k is not None and k.fit(getattr(cap, name))
        out[name] = {f: c for f, c in k.cols.items() if c is not None} if fits else {}
    return out


def _keys(values: list) -> np.ndarray:
    """Integer ids as an int64 column to sort and compare; where one lies beyond int64 (the
    reader keeps any JSON integer), a code per distinct value instead, of the value's sign:
    the callers only group equal ids and leave out those below 0."""
    try:
        return np.fromiter(values, np.int64, len(values))
    except OverflowError:
        codes: dict = {}
        return np.fromiter((codes.setdefault(v, len(codes) if v >= 0 else -1 - len(codes))
                            for v in values), np.int64, len(values))


def _shared_ids(calls: list, cols: dict) -> int:
    """How many of ``calls`` share their (process, correlation id) with another call (ids
    below 0, none, left out): by one sort of the two columns (``cols``: the reader's, where
    it kept them)."""
    corr = _column(calls, cols, "correlation", ids=True)
    keep = corr >= 0
    pid, corr = _column(calls, cols, "pid", ids=True)[keep], corr[keep]
    if len(corr) < 2:
        return 0
    order = np.lexsort((corr, pid))
    pid, corr = pid[order], corr[order]
    same = (pid[1:] == pid[:-1]) & (corr[1:] == corr[:-1])
    in_group = np.zeros(len(corr), dtype=bool)  # the calls whose key another call has
    in_group[1:] |= same
    in_group[:-1] |= same
    return int(in_group.sum())


def _overlaps(cap: CaptureEvents, cols: dict) -> tuple[int, float]:
    """Device ops that start more than the tolerance before the work before them on their
    stream ends: ``(count, worst overlap in µs)``. By numpy: the ops sorted by stream, start
    and end, the reach before each one the running maximum of its stream's ends (a tuple per
    op sorted in Python took a sixteenth of a large import)."""
    devs = cap.device_events
    n = len(devs)
    if n < 2:
        return 0, 0.0
    device = _column(devs, cols, "device", ids=True)
    stream = _column(devs, cols, "stream", ids=True)
    start = _column(devs, cols, "ts")
    end = start + _column(devs, cols, "dur")
    order = np.lexsort((end, start, stream, device))
    device, stream, start, end = device[order], stream[order], start[order], end[order]
    cut = np.flatnonzero((device[1:] != device[:-1]) | (stream[1:] != stream[:-1])) + 1
    count, worst = 0, 0.0
    for lo, hi in zip(np.r_[0, cut].tolist(), np.r_[cut, n].tolist()):
        reach = np.fmax.accumulate(end[lo:hi - 1])  # the reach before each later op
        over = reach - start[lo + 1:hi]
        late = over > OVERLAP_TOLERANCE_US
        if late.any():
            count += int(late.sum())
            worst = max(worst, float(over[late].max()))
    return count, worst


__all__ = ["CALL_MEDIAN_LIMIT_US", "OVERLAP_TOLERANCE_US", "check_capture"]
