"""The threads of a capture's process: which one is the scheduler, which launched, their names.

:class:`simwar.capture.to_trace.CaptureTraceBuilder` puts the scheduler thread's calls on
lane ``cpu`` and every other thread that launched device work on a lane of its own;
:func:`host_thread` is the rule that picks the scheduler thread (and says why),
:func:`launch_threads` counts each thread's launches, and :class:`ThreadNames` names a
thread as the metadata does.

Imports: the standard library and :mod:`simwar.capture.records`.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

from simwar.capture.mapping import Mapping
from simwar.capture.records import CaptureEvents

_GENERIC = re.compile(r"thread \d+ \((.+)\)")


def host_thread(cap: CaptureEvents, mapping: Mapping, is_step: Callable[[str], bool],
                by_corr: dict) -> tuple[tuple[int, int] | None, str, str | None]:
    """``(thread, reason, warning)``: the scheduler thread ``(pid, tid)``, the mapping's
    ``host_thread``, else the thread with the most step ranges (``is_step`` of a range's
    name: the loop that explain and --fit read), else the one with the most ranges, launches
    (``by_corr``: the correlation ids that issued device work), runtime calls; why it was
    chosen; and a warning where the mapping's thread is not in the capture."""
    calls = cap.runtime_calls
    if mapping.host_thread is not None:
        reason = "the mapping's host_thread"
        for c in calls:
            if c.tid == mapping.host_thread:
                return (c.pid, c.tid), reason, None
        for a in cap.annotations:
            if a.tid == mapping.host_thread:
                return (a.pid, a.tid), reason, None
        return None, reason, (f"mapping host_thread {mapping.host_thread}: no runtime call or "
                              f"annotation on that thread")
    steps = Counter((a.pid, a.tid) for a in cap.annotations if is_step(a.name))
    if steps:
        return steps.most_common(1)[0][0], "the thread with the step ranges", None
    ranges = Counter((a.pid, a.tid) for a in cap.annotations)
    if ranges:  # the user's own code (record_function ranges), not a runtime's thread
        return (ranges.most_common(1)[0][0],
                "the thread with the most annotations (no step ranges)", None)
    launches = Counter((c.pid, c.tid) for c in calls if c.correlation in by_corr)
    if launches:
        return (launches.most_common(1)[0][0],
                "the thread with the most launches (no step ranges)", None)
    any_calls = Counter((c.pid, c.tid) for c in calls)
    if any_calls:
        return any_calls.most_common(1)[0][0], "the thread with the most runtime calls", None
    return None, "", None


def launch_threads(cap: CaptureEvents, by_corr: dict,
                   names: ThreadNames) -> list[tuple[str, int, int]]:
    """Every thread that launched device work: ``(name, tid, launches)``, most first."""
    launches = Counter((c.pid, c.tid) for c in cap.runtime_calls if c.correlation in by_corr)
    return [(names(key), key[1], n) for key, n in launches.most_common()]


class ThreadNames:
    """``names((pid, tid))``: a thread's own name from the metadata (``pt_autograd_0`` out of
    torch's ``thread 684 (pt_autograd_0)``; of several, the one fewest threads share: torch
    also writes the generic ``(python)``), else ``thread <tid>``."""

    def __init__(self, thread_names: dict):
        self.thread_names = thread_names
        self._uses: Counter | None = None

    def __call__(self, key: tuple[int, int]) -> str:
        names = [_bare(n) for n in self.thread_names.get(key, ())]
        if not names:
            return f"thread {key[1]}"
        if self._uses is None:
            self._uses = Counter(_bare(n) for ns in self.thread_names.values() for n in set(ns))
        uses = self._uses
        return min(names, key=lambda n: (uses[n], names.index(n)))


def _bare(name: str) -> str:
    m = _GENERIC.fullmatch(name)
    return m.group(1) if m else name


__all__ = ["ThreadNames", "host_thread", "launch_threads"]
