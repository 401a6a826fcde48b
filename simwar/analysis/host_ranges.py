"""A host thread's ``record_function`` ranges, flattened to the innermost range at each instant.

What :mod:`simwar.analysis.critical_path` names a measured trace's host time by: a capture has
no CPU-work spans, so the time between two traced host calls is the work of the innermost
range the code wrapped it in (``scheduler.get_next_batch_to_run``), and untraced only where
no range covers it.

Imports: the standard library.
"""

from __future__ import annotations

import bisect


class HostRanges:
    """A host thread's annotation ranges, flattened: at each instant, the innermost range.

    ``ranges``: ``(name, start_us, end_us)`` (``record_function`` ranges nest on one thread);
    :meth:`split` cuts an interval into pieces, each named by the innermost range covering
    it, or None where none does.
    """

    def __init__(self, ranges):
        rs = sorted(((float(a), float(b), str(n)) for n, a, b in ranges if b > a),
                    key=lambda r: (r[0], -r[1]))
        points = sorted({x for a, b, _ in rs for x in (a, b)})
        pieces: list[tuple[float, float, str | None]] = []
        stack: list[tuple[float, float, str]] = []
        j = 0
        for x, y in zip(points, points[1:]):
            while j < len(rs) and rs[j][0] <= x:
                stack.append(rs[j])
                j += 1
            # The stack is in push order, so once its ended top is popped the top is the latest
            # pushed range still open at x: the innermost one. Ranges ended below the top stay
            # until they surface; reading only the top keeps the sweep linear in the points.
            while stack and stack[-1][1] <= x:
                stack.pop()
            name = stack[-1][2] if stack else None
            if pieces and pieces[-1][2] == name and pieces[-1][1] == x:
                pieces[-1] = (pieces[-1][0], y, name)
            else:
                pieces.append((x, y, name))
        self.pieces = pieces
        self.starts = [p[0] for p in pieces]

    def split(self, a: float, b: float) -> list[tuple[float, float, str | None]]:
        """``[a, b)`` in pieces by innermost range (None: no range), in time order."""
        out = []
        i = max(0, bisect.bisect_right(self.starts, a) - 1)
        t = a
        while t < b:
            if i >= len(self.pieces) or self.pieces[i][0] >= b:
                out.append((t, b, None))
                break
            x, y, name = self.pieces[i]
            if y <= t:
                i += 1
                continue
            if x > t:
                out.append((t, x, None))
                t = x
            end = min(y, b)
            out.append((t, end, name))
            t = end
            i += 1
        return out
