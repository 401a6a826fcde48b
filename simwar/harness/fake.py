"""A deterministic stream backend on a virtual clock, for testing the harness without a GPU.

It implements the replay's :class:`~simwar.harness.replay.Backend` with the
CUDA rules (docs/design.md, "CUDA semantics") resolved eagerly at each host call (which is
exact: every operation's inputs — its stream's tail and the record a wait bound to — are
known when it is issued), with ``cross_stream_us`` and ``sync_wake_us`` as the device's
latencies. Each host call costs the
``costs`` entry of its kind (config names: ``launch_us``, ``graph_launch_us``,
``event_record_us``, ``wait_event_us``, ``wait_stream_us``, ``sync_us``);
timing points cost nothing. Buffers keep their write history, so each read
snapshot is the stamp of the latest write that *started* before the read
*ended* — the simulator's definition of an observed overlap — or exactly when
it ended, if it was issued before the read (stream order: a zero-length
kernel reads its own write, and a zero-length read sees a write ordered
before it that starts at the same instant).

With costs equal to a program's ``host_us`` the fake reproduces the SimPy
engine's timeline, which is what the CPU tests check. ``costs="program"``
takes each call's cost from its own op instead (``host_us``), and each
synchronize's wake-up and each wait's cross-stream latency from the op too
(``wake_us``, ``latency_us``), as the engine does: then the fake reproduces
the engine on any program, whatever its per-op costs (``info()`` says
``latency: program`` so that the assembly places waits with each op's own
latency).

The rules are :mod:`simwar.core.rules`, the functions every executor uses.

Imports: the standard library and simwar's stdlib-only modules.
"""

from __future__ import annotations

import bisect
from collections import deque

from simwar.core.program import Record, Synchronize, WaitEvent, WaitStream
from simwar.core.rules import begins, fires, released, returns
from simwar.harness.plan import GraphStep, KernelStep, ReplayPlan

#: the cost kind of each call, by plan step type
_CALL_KIND = {KernelStep: "launch_us", GraphStep: "graph_launch_us", Record: "event_record_us",
              WaitEvent: "wait_event_us", WaitStream: "wait_stream_us", Synchronize: "sync_us"}


class FakeBackend:
    def __init__(self, costs: dict | str | None = None, *, sync_wake_us: float = 0.0,
                 cross_stream_us: float = 0.0):
        self.per_op = costs == "program"
        self.costs = {} if self.per_op else dict(costs or {})
        self.sync_wake_us = sync_wake_us
        self.cross_stream_us = cross_stream_us

    # ---- lifecycle
    def setup(self, plan: ReplayPlan) -> None:
        self.plan = plan
        self.now = 0.0
        self.tail: dict[str, float] = {}
        self.points = [float("nan")] * plan.timing_points
        self.events: dict[tuple, tuple[float, str]] = {}
        self.writes: list[list[tuple[float, int]]] = [[] for _ in plan.buffers]
        self.read_at: dict[int, tuple[int, float, int]] = {}  # slot -> (buffer, end, issued)
        self.issued = 0  # the latest stamp issued so far (stamps follow issue order)
        self.calls: list[str] = []  # the call log, for tests
        # program mode: (kind, host_us, wake_us, latency_us) of each call, in call order
        self.pending: deque = deque()
        if self.per_op:
            ops = plan.program.ops
            for st in plan.steps:
                kind = _CALL_KIND.get(type(st))
                if kind is None:
                    continue
                op = ops[st.index] if kind in ("launch_us", "graph_launch_us") else st
                self.pending.append((kind, op.host_us, getattr(op, "wake_us", 0.0),
                                     getattr(op, "latency_us", 0.0)))
        # the current call's device latencies (the op's own in program mode)
        self.wake_us = self.sync_wake_us
        self.latency_us = self.cross_stream_us

    def info(self) -> dict:
        out = {"backend": "fake", "cross_stream_us": self.cross_stream_us}
        if self.per_op:
            out["latency"] = "program"
        return out

    def finish(self) -> tuple[list[float], list[int]]:
        snaps = [0] * self.plan.snapshot_slots
        for slot, (buf, t, issued) in self.read_at.items():
            hist = self.writes[buf]
            # latest write that started before the read ended, or when it ended if issued
            # before it (issue order breaks ties)
            i = bisect.bisect_right(hist, (t, issued))
            snaps[slot] = hist[i - 1][1] if i else 0
        return self.points, snaps

    # ---- host clock
    def clock_us(self) -> float:
        return self.now

    def busy_until(self, t_us: float) -> float:
        self.now = max(self.now, t_us)
        return self.now

    def _call(self, kind: str, name: str) -> float:
        if self.per_op:
            expected, cost, self.wake_us, self.latency_us = self.pending.popleft()
            if expected != kind:
                raise RuntimeError(f"call {name!r} out of program order (expected {expected})")
            self.now += cost
        else:
            self.now += self.costs.get(kind, 0.0)
        self.calls.append(name)
        return self.now

    # ---- device work
    def _run(self, stream: str, ready: float, duration: float, writes, reads) -> float:
        start = begins(self.tail.get(stream, 0.0), ready)
        for buf, stamp in writes:
            bisect.insort(self.writes[buf], (start, stamp))
            self.issued = max(self.issued, stamp)
        end = start + duration
        for buf, slot in reads:
            self.read_at[slot] = (buf, end, self.issued)
        self.tail[stream] = end
        return end

    def kernel(self, step: KernelStep) -> float:
        ready = self._call("launch_us", f"launch {step.stream} {step.kernel.label}")
        self._run(step.stream, ready, step.kernel.duration_us,
                  [(w.buffer, w.stamp) for w in step.writes],
                  [(r.buffer, r.slot) for r in step.reads])
        return ready

    def graph_launch(self, step: GraphStep) -> float:
        ready = self._call("graph_launch_us", f"graph {step.stream} {step.graph}")
        arrays = self.plan.stamp_arrays
        for node in self.plan.graphs[step.graph].nodes:
            if node.kernel is None:
                t = fires(self.tail.get(step.stream, 0.0), ready)
                self.events[("graph", step.graph, node.event)] = (t, step.stream)
                continue
            self._run(step.stream, ready, node.kernel.duration_us,
                      [(w.buffer, arrays[w.stamp][step.launch]) for w in node.writes],
                      [(r.buffer, r.slot + step.launch) for r in node.reads])
        return ready

    def record_point(self, point: int, stream: str) -> None:
        t = fires(self.tail.get(stream, 0.0), self.now)
        self.points[point] = t
        self.tail[stream] = t

    def record(self, event: str, stream: str) -> None:
        ready = self._call("event_record_us", f"record {event} {stream}")
        t = fires(self.tail.get(stream, 0.0), ready)
        self.events[("host", event)] = (t, stream)
        self.tail[stream] = t

    def _hold(self, stream: str, ready: float, fired: float, lane: str) -> None:
        reach = begins(self.tail.get(stream, 0.0), ready)
        self.tail[stream] = released(reach, fired, self.latency_us, lane == stream)

    def wait_event(self, stream: str, key: tuple | None) -> None:
        ready = self._call("wait_event_us", f"wait_event {stream} {key and key[-1]}")
        if key is None:
            return
        fired, lane = self.events[key]
        self._hold(stream, ready, fired, lane)

    def wait_stream(self, stream: str, other: str) -> None:
        ready = self._call("wait_stream_us", f"wait_stream {stream} {other}")
        fired = fires(self.tail.get(other, 0.0), ready)
        self.tail[other] = fired
        self._hold(stream, ready, fired, other)

    def synchronize(self, key: tuple | None) -> None:
        t1 = self._call("sync_us", f"synchronize {key and key[-1]}")
        if key is None:
            return
        fired, _ = self.events[key]
        self.now = returns(t1, 0.0, fired, self.wake_us)  # t1: the call, cost included
