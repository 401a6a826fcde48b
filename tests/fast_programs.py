"""Random multi-step host programs for the exactness tests of the one-pass executor.

Programs look like the builder's (a step marker per iteration, forward kernels with
phases, shared-buffer accesses on several streams, records, waits, syncs, ``run_batch``
markers, graph launches with in-graph records) but are otherwise arbitrary: ops labelled
with a neighbouring step, markers skipped, repeated or out of order, events never recorded
or re-recorded, zero and fractional durations.
"""

from __future__ import annotations

from hypothesis import strategies as st

from simwar.core.program import (
    CpuWork,
    GraphLaunch,
    GraphRecord,
    Kernel,
    Launch,
    Marker,
    Program,
    Record,
    StepMarker,
    Synchronize,
    WaitEvent,
    WaitStream,
)

STREAMS = ("forward", "schedule", "copy")
BUFFERS = ("b0", "b1")
EVENTS = ("e0", "e1", "e2")
SITES = ("result_copy", "barrier", "other")

durations = st.one_of(st.sampled_from([0.0, 1.0, 2.5, 10.0, 100.0]),
                      st.floats(0, 200, allow_nan=False, allow_infinity=False))
small = st.one_of(st.just(0.0), st.floats(0, 10, allow_nan=False, allow_infinity=False))


@st.composite
def kernels(draw, i: int):
    reads = tuple(draw(st.lists(st.sampled_from(BUFFERS), max_size=2, unique=True)))
    writes = tuple(draw(st.lists(st.sampled_from(BUFFERS), max_size=1, unique=True)))
    phase = draw(st.sampled_from(["", "p1", "p2"]))
    return Kernel(f"k{i}", draw(durations), reads, writes, phase)


@st.composite
def programs(draw, weird: bool = True):
    """A program of 1-6 iterations; ``weird``: also irregular steps and markers."""
    ops: list = []
    n = draw(st.integers(1, 6))
    event = st.sampled_from(EVENTS)
    for k in range(n):
        marker = k
        if weird and draw(st.integers(0, 9)) == 0:
            marker = draw(st.sampled_from([k - 1, k + 1, k + 3]))
        if not (weird and k > 0 and draw(st.integers(0, 14)) == 0):  # sometimes no marker
            ops.append(StepMarker(marker))
        for i in range(draw(st.integers(1, 14))):
            step = k
            if weird and draw(st.integers(0, 19)) == 0:
                step = draw(st.sampled_from([k - 1, k + 1]))
            kind = draw(st.sampled_from(["launch", "launch", "launch", "graph", "record",
                                         "wait", "waitstream", "sync", "cpu", "run_batch"]))
            s = draw(st.sampled_from(STREAMS))
            host = draw(small)
            tag = f"{k}.{i}"
            if kind == "launch":
                ops.append(Launch(s, draw(kernels(tag)), step, host_us=host))
            elif kind == "graph":
                nodes = []
                for j in range(draw(st.integers(1, 3))):
                    if draw(st.integers(0, 2)) == 0:
                        nodes.append(GraphRecord(draw(event)))
                    else:
                        nodes.append(draw(kernels(f"{tag}.{j}")))
                ops.append(GraphLaunch(s, "g", tuple(nodes), step, host_us=host))
            elif kind == "record":
                ops.append(Record(draw(event), s, step, host_us=host))
            elif kind == "wait":
                ops.append(WaitEvent(s, draw(event), step, host_us=host,
                                     latency_us=draw(small)))
            elif kind == "waitstream":
                ops.append(WaitStream(s, draw(st.sampled_from(STREAMS)), step, host_us=host,
                                      latency_us=draw(small)))
            elif kind == "sync":
                ops.append(Synchronize(draw(event), step, draw(st.sampled_from(SITES)),
                                       host_us=host, wake_us=draw(small)))
            elif kind == "cpu":
                ops.append(CpuWork("cpu", draw(durations), step))
            else:
                ops.append(Marker("run_batch", step))
    if weird and draw(st.integers(0, 4)) == 0:
        ops.insert(0, Record(draw(event), draw(st.sampled_from(STREAMS)), 0))  # a prefix
    meta = {"warmup_steps": draw(st.integers(0, 2)), "forward_stream": "forward",
            "accept_tokens": 2.0, "batch_size": 4, "name": "random"}
    return Program(ops, streams=STREAMS, meta=meta)
