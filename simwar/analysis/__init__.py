"""Analyses of a Trace, one question each, every one a function of the Trace.

- :mod:`.metrics`: the per-step table and the summary (step time, forward
  gap, GPU idle by cause, CPU blocked by site, launch lead and launch-ahead);
- :mod:`.hazards`: latent races by happens-before and observed overlaps;
- :mod:`.idle`: each stream's idle time split by cause and the device's
  temporal breakdown, as HolisticTraceAnalysis computes them;
- :mod:`.bubbles`: forward-stream bubbles and the chain of waits (or the
  host) that caused each;
- :mod:`.views`: windows of steps, lanes, launch links and the look-ups
  plots and exporters need, each costing what its window costs.
- :mod:`.critical_path`: per step, the chain of binding constraints behind each
  forward's start, its forward gap and its step time, cut into causes in µs (its words:
  :mod:`.chain_words`; a measured trace's host time named by :mod:`.host_ranges`;
  :mod:`.critical_stream`: the same of a run streamed in windows).

They read the Trace's columns and its explicit relations (op ids, the
issuing call of each op, the record each wait or sync bound to); none
parses a label or matches times. Plots and exporters draw what these
return. The names below load their modules on first use.
"""

from __future__ import annotations

from simwar.core.lazy import lazy_getattr

_LAZY = {
    "analyze": ("simwar.analysis.metrics", "analyze"),
    "step_frame": ("simwar.analysis.metrics", "step_frame"),
    "summarize": ("simwar.analysis.metrics", "summarize"),
    "measured": ("simwar.analysis.metrics", "measured"),
    "detect": ("simwar.analysis.hazards", "detect"),
    "HazardReport": ("simwar.analysis.hazards", "HazardReport"),
    "Race": ("simwar.analysis.hazards", "Race"),
    "idle_breakdown": ("simwar.analysis.idle", "idle_breakdown"),
    "temporal_breakdown": ("simwar.analysis.idle", "temporal_breakdown"),
    "gap_cause": ("simwar.analysis.idle", "gap_cause"),
    "bubbles": ("simwar.analysis.bubbles", "bubbles"),
    "story": ("simwar.analysis.bubbles", "story"),
    "Bubble": ("simwar.analysis.bubbles", "Bubble"),
    "Hop": ("simwar.analysis.bubbles", "Hop"),
    "window": ("simwar.analysis.views", "window"),
    "launch_links": ("simwar.analysis.views", "launch_links"),
    "critical_path": ("simwar.analysis.critical_path", "critical_path"),
    "CriticalPath": ("simwar.analysis.critical_path", "CriticalPath"),
    "critical_path_stream": ("simwar.analysis.critical_stream", "critical_path_stream"),
}

__all__ = sorted(_LAZY)

__getattr__ = lazy_getattr("simwar.analysis", _LAZY, globals())
