"""Primitive micro-benchmarks on a real GPU: the host and device costs the model needs.

Host costs are the median over several batches of the per-call host time of
a tight loop of one call (the device kept busy where that matters, so no
call waits on it). Device latencies are timed with timing events. Results
are one flat mapping of µs figures (``sleep_*`` and ``*_cycles_*`` excepted),
named as in ``data/h200_overlap_run1.json`` where the figure is the same:

- launch of a small kernel and of the spin kernel, ``Event.record``,
  ``Stream.wait_event``, ``Stream.wait_stream``, ``Event.query``;
- graph launch host cost and device time against the number of nodes;
- small pinned H2D and D2H copies (non-blocking), host cost;
- ``synchronize`` wake-up: host return minus the event's firing, after a spin
  of 50/200/1000 µs, for spinning and for blocking-sync events;
- cross-stream dependency latency: a wait released by another stream's
  record, from the record firing to the waiting stream's next event;
- host drift (:func:`host_drift`): the per-call host time of a spin launch
  and of a fixed piece of pure-Python work, window by window over several
  seconds, to tell a host that changes speed from a noisy driver call.

Imports: torch and the standard library.
"""

from __future__ import annotations

import statistics
import time

import torch

from simwar.harness.cuda import calibrate_device, cross_stream_latency, device_info


def _host_us(fn, n: int = 200, batches: int = 7, before=None) -> float:
    out = []
    for _ in range(batches):
        if before is not None:
            before()
        t = time.perf_counter_ns()
        for _ in range(n):
            fn()
        out.append((time.perf_counter_ns() - t) / 1e3 / n)
    torch.cuda.synchronize()
    return statistics.median(out)


def run_benchmarks() -> dict:
    cal = calibrate_device()
    rate = cal["sleep_cycles_per_us"]
    s = torch.cuda.current_stream()
    other = torch.cuda.Stream()
    x = torch.zeros(1, dtype=torch.int64, device="cuda")
    ev = torch.cuda.Event()
    timing_ev = torch.cuda.Event(enable_timing=True)

    def busy():  # a long spin so that the loop's calls never wait on the device
        torch.cuda._sleep(int(20_000 * rate))

    res: dict = dict(cal)
    res["launch_small_kernel_us"] = _host_us(lambda: x.add_(1), before=busy)
    res["launch_sleep_kernel_us"] = _host_us(lambda: torch.cuda._sleep(0), before=busy)
    res["event_record_us"] = _host_us(lambda: ev.record(s), before=busy)
    res["event_record_timing_us"] = _host_us(lambda: timing_ev.record(s), before=busy)
    res["stream_wait_event_us"] = _host_us(lambda: other.wait_event(ev), before=busy)
    res["stream_wait_stream_us"] = _host_us(lambda: other.wait_stream(s), before=busy)
    torch.cuda.synchronize()
    res["event_query_us"] = _host_us(ev.query)
    res["set_stream_us"] = _host_us(lambda: (torch.cuda.set_stream(other),
                                             torch.cuda.set_stream(s)), n=100) / 2
    pinned = torch.zeros(1, dtype=torch.int64).pin_memory()
    res["h2d_small_nonblocking_us"] = _host_us(lambda: x.copy_(pinned, non_blocking=True),
                                               before=busy)
    res["d2h_small_nonblocking_us"] = _host_us(lambda: pinned.copy_(x, non_blocking=True),
                                               before=busy)

    # graph launch vs node count (each node a spin of ~1 µs)
    for nodes in (1, 5, 20, 50):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(nodes):
                torch.cuda._sleep(int(rate))
        g.replay()  # the first replay uploads the graph
        torch.cuda.synchronize()
        res[f"graph_launch_{nodes}n_host_us"] = _host_us(g.replay, n=50, before=busy)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record(s)
        g.replay()
        b.record(s)
        b.synchronize()
        res[f"graph_{nodes}n_device_us"] = a.elapsed_time(b) * 1e3

    # synchronize wake-up latency, spinning and blocking-sync events
    for blocking in (False, True):
        for spin_us in (50, 200, 1000):
            wakes = []
            for _ in range(15):
                start = torch.cuda.Event(enable_timing=True)
                done = torch.cuda.Event(enable_timing=True, blocking=blocking)
                torch.cuda.synchronize()
                torch.cuda._sleep(int(100 * rate))  # the host polls 'start' before it fires
                start.record(s)
                torch.cuda._sleep(int(spin_us * rate))
                done.record(s)
                # host time of 'start' firing: poll it, then block on 'done'
                while not start.query():
                    pass
                t_start = time.perf_counter_ns()
                done.synchronize()
                t_end = time.perf_counter_ns()
                wakes.append((t_end - t_start) / 1e3 - start.elapsed_time(done) * 1e3)
            key = "blocking_" if blocking else ""
            res[f"{key}sync_wake_after_{spin_us}us_us"] = statistics.median(wakes)

    res["cross_stream_us"] = cross_stream_latency(rate)
    torch.cuda.synchronize()
    return {"info": device_info(), "primitives": res, "host_drift": host_drift(rate)}


def _python_work() -> int:
    total = 0
    for i in range(200):
        total += i * i
    return total


def host_drift(cycles_per_us: float, windows: int = 120, calls: int = 400) -> dict:
    """Per-call host time of a spin launch and of fixed Python work, per window (µs).

    Each window (about 35 ms; a few seconds in all, the host always busy)
    times ``calls`` launches behind a long spin, so none waits on the device,
    and ``calls`` runs of the Python work, then lets the device drain. A host
    whose speed drifts moves both together; a noisy driver path moves only
    the launch.
    """
    launch, python = [], []
    for _ in range(windows):
        torch.cuda._sleep(int(30_000 * cycles_per_us))
        t = time.perf_counter_ns()
        for _ in range(calls):
            torch.cuda._sleep(0)
        launch.append((time.perf_counter_ns() - t) / 1e3 / calls)
        t = time.perf_counter_ns()
        for _ in range(calls):
            _python_work()
        python.append((time.perf_counter_ns() - t) / 1e3 / calls)
        torch.cuda.synchronize()

    def spread(v):
        v = sorted(v)
        return {"min": v[0], "p10": v[len(v) // 10], "median": v[len(v) // 2],
                "p90": v[len(v) * 9 // 10], "max": v[-1]}

    return {"windows": windows, "calls": calls, "launch_sleep_kernel_us": spread(launch),
            "python_work_us": spread(python)}
