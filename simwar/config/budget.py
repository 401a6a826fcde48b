"""The memory a run will need, estimated from its config before anything is allocated.

A config can ask for more than the machine holds (``steps: 1000000000000``, a collective of
10⁸ kernels, ``parallel.tp: 100000``, requests arriving at ``rate_per_s: 1e12``): simulated
as asked, it works for a minute and then fails with ``MemoryError`` or is killed. The one
estimate here is checked before a run starts (:func:`check_memory`, called by
:mod:`simwar.api`): what the run holds grows with its operations (steps × ranks ×
operations a step) and, with arriving requests, with the requests that arrive (at least
the rate × the CPU's fixed work of every step: a step never takes less). The figures per
operation and per request are measured peaks of the executors (``tracemalloc`` of
``configs/dspark_fine.yaml``: about 250 B per operation for ``fast``, 450 for ``simpy``),
rounded up; a run the estimate refuses would need several times the memory available.

Imports: the config schema only (the config layer).
"""

from __future__ import annotations

import os
import time
from typing import Any

from simwar.config.base import ConfigError

#: bytes a run holds per simulated operation (a kernel, an event, a host block), per rank
BYTES_PER_OP = 400
#: bytes a run holds per request that arrives (its arrival, tokens, admission and finish)
BYTES_PER_REQUEST = 200
#: host operations of an iteration besides its phases' (schedule, writes, copies, syncs)
HOST_OPS = 8
#: kernels and events a phase issues besides its collectives' (load, prep, body, record)
PHASE_OPS = 4


#: the last reading of the available memory, ``(monotonic time, bytes)``: a sweep checks
#: every run, and the figure moves slowly
_LAST: list = [-1.0, None]


def available_bytes() -> int | None:
    """The memory this process can still take (``MemAvailable``, read at most once a second;
    None when unknown)."""
    now = time.monotonic()
    if _LAST[0] >= 0 and now - _LAST[0] < 1.0:
        return _LAST[1]
    _LAST[:] = [now, _read_available()]
    return _LAST[1]


def _read_available() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _floor_us(duration: Any) -> float:
    """The least a duration can be (µs): a number, a distribution's clip or lower end."""
    if isinstance(duration, (int, float)):
        return float(duration)
    low = getattr(duration, "min", 0.0) or 0.0
    if getattr(duration, "dist", None) == "uniform":
        low = max(low, duration.low)
    elif getattr(duration, "dist", None) == "empirical":
        low = max(low, min(duration.values))
    return low


def memory_inputs(cfg) -> dict:
    """What :func:`memory_estimate` reads of a config, by key: two configs equal in it need
    the same memory (``simwar.api.Runner`` holds a variant to its base's check by it)."""
    return {"steps": cfg.steps, "parallel.tp": cfg.tp, "workload": cfg.workload, "cpu": cfg.cpu,
            "phases' collectives": [sum(c.count for c in p.collectives)
                                    for p in cfg.phase_table()]}


def memory_estimate(cfg) -> tuple[int, str]:
    """``(bytes, what)``: the memory a run of ``cfg`` needs at least, and what it grows
    with, in words."""
    phases = cfg.phase_table()
    ops = HOST_OPS + sum(PHASE_OPS + sum(c.count for c in p.collectives) for p in phases)
    need = cfg.steps * cfg.tp * ops * BYTES_PER_OP
    # the key to blame: the largest of the three factors
    counts = [(c.count, f"phases.{p.name}.collectives.{i}.count")
              for p in phases for i, c in enumerate(p.collectives)]
    key = max([(cfg.steps, "steps"), (cfg.tp, "parallel.tp"), *counts])[1]
    what = f"{key}: {cfg.steps} steps × {cfg.tp} rank(s) × {ops} operations a step"
    wl = cfg.workload
    rate = getattr(getattr(wl, "arrivals", None), "rate_per_s", None)
    if rate:
        c = cfg.cpu
        step_us = sum(_floor_us(d) for d in (c.ingest_us, c.schedule_us, c.prepare_us,
                                             c.process_result_us, c.post_launch_us))
        requests = rate * cfg.steps * step_us / 1e6
        if requests * BYTES_PER_REQUEST > need:
            need = int(requests * BYTES_PER_REQUEST)
            what = (f"workload.arrivals.rate_per_s: {rate:g} requests/s over {cfg.steps} steps "
                    f"of at least {step_us:g} µs: {requests:.3g} requests")
    return int(need), what


def _size(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n / 1e3:.3g} kB"


def check_memory(cfg) -> None:
    """Refuse, in one line, a run that needs more memory than is available (see the module
    docstring); nothing when the available memory cannot be read."""
    have = available_bytes()
    if have is None:
        return
    need, what = memory_estimate(cfg)
    if need > have:
        raise ConfigError(f"{what} need about {_size(need)} of memory, more than the "
                          f"{_size(have)} available")


__all__ = ["available_bytes", "check_memory", "memory_estimate"]
