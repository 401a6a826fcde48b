"""Processes of a capture as ranks: split per process, then side by side in one Trace.

A capture file may hold several host processes (per-rank captures merged into one
file, or two processes sharing a GPU), and several per-rank files may be given
together (SGLang writes ``{id}-TP-{r}.trace.json.gz`` per TP rank). Each host
process is one **rank**: files in the order given, the processes of a file by pid.
:func:`split_processes` makes one :class:`simwar.capture.reader.CaptureEvents` per rank:

- its host events (runtime calls, annotations) are the process's own (``pid``);
  correlation ids are per process, so the same id in two processes is two calls;
- device work and ``cuda_sync`` events carry no process (their ``pid`` is the
  device): each goes to the process that has a runtime call with its correlation
  id; when several do (ids collide), to the process that owns most of the other
  work on the same (device, stream); when none does, to that owner too (its
  launch is not in the capture), else to the file's first process. Lanes are
  therefore (process, device, stream): two processes on one device with the same
  stream ids get separate lanes.

**Clocks.** The processes of one file share a clock (one host's). Across files, each
file's ``baseTimeNanoseconds`` (the epoch time of its ``ts`` origin, which Kineto
takes from that host's own clock) puts the files on one clock: file f is shifted by
``(base_f - base_0) / 1000`` µs. A file without it is taken to share file 0's clock,
and the import says so. Nothing aligns ranks by matching events in time.

:func:`~simwar.core.ranks.side_by_side` (in core: simulated ranks are put side by side
too) puts the ranks' Traces in one Trace (lanes ``r<k>.<lane>``, ids
offset, ``meta["ranks"]`` describing each rank: its process, file, host lane, lanes,
clock offset and step starts), which a multi-rank consumer reads by rank;
:func:`step_skew` is the cross-rank spread of step starts.

Imports: numpy, the standard library, :mod:`simwar.capture.reader` and
:mod:`simwar.core.trace`; never the simulator (api, executors, build).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from simwar.capture.reader import CaptureEvents
from simwar.core.trace import Trace


@dataclass
class RankCapture:
    """One rank: the process ``pid`` of file ``file`` (index), its events, its clock shift."""

    rank: int
    file: int
    pid: int
    cap: CaptureEvents
    clock_offset_us: float = 0.0


def host_pids(cap: CaptureEvents) -> list[int]:
    """The host processes of a capture: pids with runtime calls or annotations."""
    pids = {c.pid for c in cap.runtime_calls} | {a.pid for a in cap.annotations}
    return sorted(pids)


def clock_offsets(caps: list[CaptureEvents]) -> tuple[list[float], str | None]:
    """Per file, the µs to add to its times to put it on file 0's clock, and a note when a
    file has no ``baseTimeNanoseconds`` (then taken to share file 0's clock)."""
    bases = [c.meta.get("base_time_ns") for c in caps]
    if len(caps) < 2:
        return [0.0] * len(caps), None
    if any(b is None for b in bases):
        return [0.0] * len(caps), ("not every file has baseTimeNanoseconds: the files are "
                                   "taken to share one clock")
    return [(b - bases[0]) / 1000.0 for b in bases], None


def primary_rank(ranks: list[RankCapture], mapping) -> int:
    """The rank analysed as the trace: the mapping's ``process`` (a
    :class:`~simwar.capture.mapping.Mapping`), else the one with the most step ranges, else
    rank 0."""
    if mapping.process is not None:
        for i, r in enumerate(ranks):
            if r.pid == mapping.process:
                return i
    if len(ranks) == 1:
        return 0
    is_step = mapping.step_test()
    n = [sum(1 for a in r.cap.annotations if is_step(a.name)) for r in ranks]
    return max(range(len(ranks)), key=lambda i: (n[i], -i))


def split_processes(caps: list[CaptureEvents]) -> tuple[list[RankCapture], Counter]:
    """One :class:`RankCapture` per host process of the files (see the module docstring),
    and counts of how device and sync events were given a process."""
    offsets, _ = clock_offsets(caps)
    ranks: list[RankCapture] = []
    how: Counter = Counter()
    for f, cap in enumerate(caps):
        pids = host_pids(cap)
        if len(pids) <= 1:
            ranks.append(RankCapture(len(ranks), f, pids[0] if pids else 0, cap, offsets[f]))
            continue
        owners: dict[int, set[int]] = defaultdict(set)
        for c in cap.runtime_calls:
            if c.correlation >= 0:
                owners[c.correlation].add(c.pid)
        lane_votes: dict[tuple, Counter] = defaultdict(Counter)
        for d in cap.device_events:
            o = owners.get(d.correlation, ())
            if len(o) == 1:
                lane_votes[(d.device, d.stream)][next(iter(o))] += 1

        def owner(corr: int, lane: tuple | None, owners=owners, votes=lane_votes,
                  first=pids[0]) -> int:
            o = owners.get(corr, ())
            if len(o) == 1:
                how["by_correlation"] += 1
                return next(iter(o))
            lane_votes_ = votes.get(lane) if lane is not None else None
            if lane_votes_:
                how["collision_by_lane" if o else "no_launch_by_lane"] += 1
                return lane_votes_.most_common(1)[0][0]
            how["to_first_process"] += 1
            return first

        parts = {p: CaptureEvents(meta=dict(cap.meta), thread_names={
            k: v for k, v in cap.thread_names.items() if k[0] == p},
            process_names={p: cap.process_names[p]} if p in cap.process_names else {})
            for p in pids}
        for c in cap.runtime_calls:
            parts[c.pid].runtime_calls.append(c)
        for a in cap.annotations:
            parts[a.pid].annotations.append(a)
        for cat, evs in cap.host_events.items():  # counted only: each to its process
            for e in evs:
                if e[0] in parts:
                    parts[e[0]].host_events.setdefault(cat, []).append(e)
        for d in cap.device_events:
            parts[owner(d.correlation, (d.device, d.stream))].device_events.append(d)
        for s in cap.sync_events:
            parts[owner(s.correlation, (s.device, s.stream) if s.stream is not None
                        else None)].sync_events.append(s)
        for p in pids:
            part = parts[p]
            part.profiled = cap.profiled
            part.counts = Counter({"kernel": 0, "memcpy": 0, "memset": 0})
            for d in part.device_events:
                part.counts[d.kind] += 1
            part.counts.update(runtime=len(part.runtime_calls), cuda_sync=len(part.sync_events),
                               annotation=len(part.annotations))
            if p == pids[0]:  # what was read but belongs to no process: reported once
                part.ignored = Counter(cap.ignored)
                part.problems = Counter(cap.problems)
                part.unmodelled = Counter(cap.unmodelled)
            ranks.append(RankCapture(len(ranks), f, p, part, offsets[f]))
    return ranks, how


def step_skew(traces: list[Trace]) -> dict:
    """The cross-rank spread of step starts: per step index present in every rank, the
    latest rank's start minus the earliest's (µs on the common clock)."""
    starts = []
    for t in traces:
        m = t.markers
        pick = m.name == t.code("step")
        starts.append(dict(zip(m.step[pick].tolist(), m.time_us[pick].tolist())))
    common = sorted(set.intersection(*(set(s) for s in starts))) if starts else []
    spread = [max(s[k] for s in starts) - min(s[k] for s in starts) for k in common]
    if not spread:
        return {"steps": 0}
    late = Counter(max(range(len(starts)), key=lambda r: starts[r][k]) for k in common)
    return {"steps": len(common), "mean_us": float(np.mean(spread)),
            "max_us": float(np.max(spread)), "p50_us": float(np.median(spread)),
            "latest_rank": late.most_common(1)[0][0]}
