"""An eager prefill's launches as a fitted config models them (``prefill.launches``,
``host_shares``, ``device_shares``).

A real eager prefill is hundreds of kernel launches; the config models it as at most
:data:`FIT_MAX_LAUNCHES`, each a host dispatch and then its kernel (docs/design.md,
"Prefill"). Those launches are not alike: the attention and the large GEMMs are long
kernels that keep the GPU busy while the host launches the short ones after them, and the
host's time per launch varies with the Python around each. Equal shares cannot show that:
measured on the H200's mixed captures of run10 and run11, the simulated forward of 32 equal
launches ended 9-13 % before the captured one, with each step's own window and kernels' busy
time; the same with each launch group's measured shares ended within 0.1-3.8 % (mean over
the steps). :func:`launch_shares` measures the shares from the capture: the launch calls of
each step that prefills, in issue order, cut into ``launches`` groups of consecutive calls
(group ``i * launches // n`` of a step's ``n`` calls), each group's host time (from the end
of the group before's last call to the end of its own last, less the modelled launch call)
and its kernels' device time (each kernel is its launch call's: the trace's ``ops.call``
edge, never a matched time), each as a share of its step's, averaged over the steps.

Imports: numpy and the standard library.
"""

from __future__ import annotations

import numpy as np

#: the most launches a fitted eager prefill models (:data:`simwar.config.schema.MAX_LAUNCHES`:
#: a capture's hundreds of kernels are modelled as at most this many launches)
FIT_MAX_LAUNCHES = 32


def launch_device(end: float, window: float, launches: int) -> float:
    """The device time of a prefill of ``launches`` equal launches whose simulated host window
    is ``window`` (each launch ``window / launches`` of host, then its kernel, ``device /
    launches``, after it and after the kernel before) that ends its last kernel at ``end``
    from the window's start: device-bound (``end >= window / launches + window``) ``end``
    less the first launch; launch-bound ``launches x`` what the last kernel runs after the
    last launch (>= 0)."""
    h = window / max(launches, 1)
    if end >= h + window:
        return end - h
    return max(0.0, launches * (end - window))


def launch_count(counts: list[int]) -> tuple[int, float]:
    """``(launches, mean)``: an eager prefill's launches per step as the config models them
    (the mean of the steps' launch call ``counts``, rounded, 1 to :data:`FIT_MAX_LAUNCHES`),
    and the mean itself."""
    mean = float(np.mean(counts)) if counts else 0.0
    return max(1, min(FIT_MAX_LAUNCHES, int(round(mean)))), mean


def launch_shares(steps: list[tuple[np.ndarray, np.ndarray, float]], launches: int
                  ) -> tuple[list[float], list[float], int]:
    """``(host weights, device weights, steps used)``: each of ``launches`` launch groups'
    mean share of its step's host and device time, as weights (``launches`` x the share,
    rounded to 3 decimals: equal shares are all 1). ``steps``: per step that prefills, its
    launch calls' host times (in issue order, each from the call before's end to its own
    end, the first from the window's start), their kernels' device times, and the modelled
    host cost of one launch call (taken out of each group's host time, since the simulated
    launch adds it). A step with fewer calls than ``launches`` is left out; none left (or
    ``launches`` 1): empty lists, equal shares."""
    hosts, devices = [], []
    for call_host, call_device, cost in steps:
        n = len(call_host)
        if launches < 2 or n < launches:
            continue
        group = (np.arange(n) * launches) // n
        h = np.maximum(np.bincount(group, call_host, launches) - cost, 0.0)
        d = np.bincount(group, call_device, launches)
        if h.sum() > 0:
            hosts.append(h / h.sum())
        if d.sum() > 0:
            devices.append(d / d.sum())

    def weights(shares: list[np.ndarray]) -> list[float]:
        if not shares:
            return []
        mean = np.mean(shares, axis=0)
        return [round(float(w), 3) for w in mean * launches / mean.sum()]
    used = max(len(hosts), len(devices))
    return weights(hosts), weights(devices), used


def shares_device(end: float, window: float, host_w: list[float], device_w: list[float]
                  ) -> float:
    """The device time of a prefill whose launches take ``host_w`` of a simulated host window
    ``window`` and ``device_w`` of the device time (weights) that ends its last kernel at
    ``end`` from the window's start (>= 0). Its last kernel ends at ``max_g (T_g + D x
    S_g)``, ``T_g`` the end of launch ``g``'s host share and ``S_g`` the device shares of
    the kernels from ``g`` on (each kernel after its launch and the kernel before): the least
    ``D`` at which one of them reaches ``end``. What the kernels waited for their launches
    inside a group (a short kernel launched after a long one ended) is in it, as on the
    GPU."""
    h = np.cumsum(np.asarray(host_w, dtype=float))
    d = np.asarray(device_w, dtype=float)
    issued = window * h / h[-1]
    after = np.cumsum(d[::-1])[::-1] / d.sum()  # each kernel's and its followers' share
    has = after > 0
    return max(0.0, float(np.min((end - issued[has]) / after[has])))


__all__ = ["FIT_MAX_LAUNCHES", "launch_count", "launch_device", "launch_shares",
           "shares_device"]
