"""Tensor-parallel ranks: per-rank and overall step time, collective waits, the straggler.

Functions of the ranks' Traces (one per rank, simulated or imported), each carrying
``meta["collectives"]``: per collective it joined, its op id, whether it is a device
collective, and its instance number; the same instance on every rank is the same
collective (relations as data). From them (docs/design.md, "Tensor-parallel ranks"):

- a collective's **arrival** on a rank is its op's start (the host reaching a host
  collective; a device collective kernel beginning on its stream); its **skew** is the last
  arrival minus the first; the **late rank** the one that arrived last;
- a rank's **collective wait** is, summed over the collectives of a step, the last rank's
  arrival minus its own (what it spent waiting for the slowest, spinning or blocked), split
  into host (``host_wait``) and device (``device_wait``) collectives;
- the **straggler** of a step is the rank that held the others longest alone: summed over
  the step's collectives where it arrived last, its arrival minus the next latest rank's
  (**by how much**); none (-1) in a step where no rank was ever alone last;
- the **overall step time** of a step is the slowest rank's.

:func:`rank_columns` is the per-step table of the group, :func:`rank_summary` its summary
keys (flat, added to the run's summary). Imports: numpy and :mod:`simwar.core.trace`.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simwar.analysis.summary import measured_mask
from simwar.core.trace import Trace

#: a wait or skew below this is none: a capture's times are whole ns (Kineto's ``ts``)
RESOLUTION_US = 1e-3



class LateArrival(NamedTuple):
    """What held one rank at one collective: the rank that came last to it."""

    rank: int  # the late rank
    wait_us: float  # how long this rank waited for it (0: this rank came last)
    collective: str  # the collective's name

class Collectives:
    """The instances every rank joined, with each rank's arrival and leaving time.

    Built from one table per rank (:func:`simulated_table`, or a capture's): ``key`` (what
    names the instance: the same key on two ranks is the same collective), ``device``,
    ``name``, ``step``, ``op`` (the op id, -1: none), ``arrive``, ``leave``. Instances are
    those every rank has, in rank 0's order. ``device[i]``, ``name[i]``, ``step[i]``: rank
    0's; ``op``, ``arrive``, ``leave``: arrays ``(instances, ranks)``.
    """

    def __init__(self, tables: list[dict]):
        m = len(tables)
        first_keys = tables[0]["key"] if tables else []
        if m and all(t["key"] == first_keys for t in tables[1:]) and \
                len(set(first_keys)) == len(first_keys):
            # every rank has the same instances in the same order (simulated ranks): the
            # rows the general matching below finds, without matching
            n = len(first_keys)
            rows = np.repeat(np.arange(n, dtype=np.int64)[:, None], m, axis=1)
        else:
            index = [{k: i for i, k in enumerate(t["key"])} for t in tables]
            common = set(index[0]).intersection(*index[1:]) if index else set()
            keys = sorted(common, key=lambda k: index[0][k])  # rank 0's order
            n = len(keys)
            rows = np.array([[ix[k] for ix in index] for k in keys],
                            dtype=np.int64).reshape(n, m)
        self.ranks = m
        self.op = np.empty((n, m), dtype=np.int64)
        self.arrive = np.empty((n, m))
        self.leave = np.empty((n, m))
        for r, t in enumerate(tables):
            self.op[:, r] = np.asarray(t["op"], dtype=np.int64)[rows[:, r]] if n else []
            self.arrive[:, r] = np.asarray(t["arrive"], dtype=float)[rows[:, r]] if n else []
            self.leave[:, r] = np.asarray(t["leave"], dtype=float)[rows[:, r]] if n else []
        first = rows[:, 0] if m else np.zeros(0, dtype=np.int64)
        t0 = tables[0] if tables else {"device": [], "step": [], "name": []}
        self.device = np.asarray(t0["device"], dtype=bool)[first] if n else np.zeros(0, bool)
        self.step = np.asarray(t0["step"], dtype=np.int64)[first] if n else np.zeros(0, np.int64)
        self.name = [t0["name"][i] for i in first.tolist()]
        self.unmatched = sum(len(t["key"]) for t in tables) - n * m

    @classmethod
    def of_traces(cls, traces: list[Trace]) -> Collectives:
        """Of simulated ranks (:func:`simulated_table` of each)."""
        return cls([simulated_table(t) for t in traces])

    def __len__(self) -> int:
        return len(self.device)

    def skew(self) -> np.ndarray:
        """Per instance: the last arrival minus the first."""
        return self.arrive.max(axis=1) - self.arrive.min(axis=1)

    def late_rank(self) -> np.ndarray:
        """Per instance: the rank that arrived last (the lowest such rank on a tie)."""
        return self.arrive.argmax(axis=1)

    def lead(self) -> np.ndarray:
        """Per instance: the last arrival minus the next latest (0 with one rank)."""
        if self.ranks < 2:
            return np.zeros(len(self))
        s = np.sort(self.arrive, axis=1)
        return s[:, -1] - s[:, -2]

    def late_of(self, rank: int) -> dict[int, LateArrival]:
        """Rank ``rank``'s collectives: op id -> its :class:`LateArrival`, for
        :func:`~simwar.analysis.critical_path.critical_path`."""
        waits = self.waits()[:, rank]
        late = self.late_rank()
        return {int(self.op[i, rank]): LateArrival(int(late[i]), float(waits[i]), self.name[i])
                for i in range(len(self)) if self.op[i, rank] >= 0}

    def waits(self) -> np.ndarray:
        """Per instance and rank: the last arrival minus the rank's own."""
        return self.arrive.max(axis=1, keepdims=True) - self.arrive


def skew_report(col: Collectives) -> list[dict]:
    """Per collective name: its instances, their arrival skew (p50, p90, max, µs) and the rank
    most often late (with the share of the instances it was)."""
    skew, late = col.skew(), col.late_rank()
    names = np.array(col.name, dtype=object)
    out = []
    for name in dict.fromkeys(col.name):
        pick = names == name
        s, lt = skew[pick], late[pick][skew[pick] > RESOLUTION_US]
        counts = np.bincount(lt, minlength=col.ranks) if len(lt) else np.zeros(col.ranks, int)
        r = int(counts.argmax())
        out.append({"collective": name, "device": bool(col.device[pick][0]),
                    "instances": int(pick.sum()), "skew_us_p50": float(np.percentile(s, 50)),
                    "skew_us_p90": float(np.percentile(s, 90)), "skew_us_max": float(s.max()),
                    "late_rank": r if len(lt) else None,
                    "late_share": float(counts[r] / pick.sum()) if len(lt) else 0.0})
    return out


def simulated_table(trace: Trace) -> dict:
    """A simulated rank's collectives (``meta["collectives"]``, written by the engine, read as
    ``trace.run.collectives``): keyed by (device, instance number), timed by their ops."""
    c = trace.run.collectives or {"op": [], "device": [], "instance": []}
    op = np.asarray(c["op"], dtype=np.int64)
    ops = trace.ops
    return {"key": list(zip(c["device"], c["instance"])), "device": list(c["device"]),
            "name": [trace.text(x) for x in ops.label[op]], "step": ops.step[op].tolist(),
            "op": op, "arrive": ops.start_us[op], "leave": ops.end_us[op]}


def late_arrivals(col: Collectives, rank: int, steps: tuple[int, int] | None = None,
                  lanes: list[str] | None = None) -> list[dict]:
    """What rank ``rank`` waited for at the collectives of ``steps`` (inclusive; default all),
    per collective name and late rank, most first: the steps it waited in, their share,
    the mean wait per such step, and its words ("rank 1's host work arrived 640 µs late at
    the broadcast"). ``lanes``: each instance's lane on ``rank`` (device collectives)."""
    waits = col.waits()[:, rank]
    late = col.late_rank()
    pick = waits > RESOLUTION_US
    if steps is not None:
        pick &= (col.step >= steps[0]) & (col.step <= steps[1])
    n_steps = len(np.unique(col.step[(col.step >= steps[0]) & (col.step <= steps[1])])
                  if steps is not None else np.unique(col.step))
    groups: dict[tuple, dict[int, float]] = {}
    for i in np.flatnonzero(pick):
        per = groups.setdefault((col.name[i], bool(col.device[i]), int(late[i])), {})
        per[int(col.step[i])] = per.get(int(col.step[i]), 0.0) + float(waits[i])
    out = []
    for (name, device, r), per in groups.items():
        us = float(np.mean(list(per.values())))
        if device:
            lane = lanes[0] if lanes else "forward"
            words = f"rank {r}'s {lane} stream arrived {us:.0f} µs late at {name}"
        else:
            words = f"rank {r}'s host work arrived {us:.0f} µs late at the {name}"
        out.append({"collective": name, "device": device, "late_rank": r, "steps": len(per),
                    "share": len(per) / n_steps if n_steps else 0.0, "us_mean": us,
                    "us_per_step": us * len(per) / n_steps if n_steps else 0.0,
                    "words": words})
    out.sort(key=lambda d: -d["us_per_step"])
    return out


def rank_columns(traces: list[Trace], columns: list[dict]) -> dict[str, np.ndarray]:
    """:func:`group_columns` of the ranks' Traces' collectives."""
    return group_columns(Collectives.of_traces(traces), columns)


def group_columns(col: Collectives, columns: list[dict]) -> dict[str, np.ndarray]:
    """The group's per-step table from the ranks' collectives ``col`` and each rank's
    per-step ``columns``
    (:func:`simwar.analysis.metrics.step_columns`): ``step``, ``step_us`` (the slowest
    rank's), per rank ``rank<r>_step_us``, ``rank<r>_host_wait_us``,
    ``rank<r>_device_wait_us``, ``straggler`` (-1: none), ``straggler_lead_us`` (by how
    much) and ``skew_us`` (the largest arrival skew of the step's collectives)."""
    steps = columns[0]["step"]
    n = len(steps)
    out: dict[str, np.ndarray] = {"step": steps}
    per = np.full((len(columns), n), np.nan)
    for r, c in enumerate(columns):
        pos = np.searchsorted(steps, c["step"])
        ok = (pos < n) & (steps[np.minimum(pos, n - 1)] == c["step"])
        per[r, pos[ok]] = c["step_us"][ok]
    out["step_us"] = per.max(axis=0) if len(columns) else np.zeros(n)
    row = np.searchsorted(steps, col.step)
    inside = (row < n) & (steps[np.minimum(row, n - 1)] == col.step)
    waits = col.waits()
    for r in range(len(columns)):
        out[f"rank{r}_step_us"] = per[r]
        for kind, pick in (("host", ~col.device), ("device", col.device)):
            w = np.zeros(n)
            np.add.at(w, row[inside & pick], waits[inside & pick, r])
            out[f"rank{r}_{kind}_wait_us"] = w
    # what each rank held the others for alone, per step: its lead where it came last
    held = np.zeros((len(columns), n))
    late, leads = col.late_rank(), col.lead()
    np.add.at(held, (late[inside], row[inside]), leads[inside])
    straggler = np.where(held.max(axis=0) > RESOLUTION_US, held.argmax(axis=0), -1) \
        if len(columns) \
        else np.full(n, -1)
    lead = held.max(axis=0) if len(columns) else np.zeros(n)
    skew = np.full(n, np.nan)
    np.fmax.at(skew, row[inside], col.skew()[inside])
    out.update(straggler=straggler, straggler_lead_us=lead, skew_us=skew)
    return out


def rank_summary(cols: dict[str, np.ndarray], tp: int, warmup: int, races: list[int]) -> dict:
    """The flat summary keys of a tensor-parallel run (measured steps only): ``tp``, the
    overall ``tp_step_us_*``, per rank its step time, waits and races, the straggler
    (``straggler_rank``: most often the straggler, ``straggler_share``: the fraction of steps
    it was, ``straggler_lead_us_mean``: by how much, over those steps) and the steps'
    largest arrival skew (``skew_us_p50``, ``_p90``, ``_max``)."""
    keep = measured_mask(cols["step"], cols["step_us"], warmup)
    step = cols["step_us"][keep]
    out: dict = {"tp": tp}
    if not len(step):
        return out
    out.update(tp_step_us_mean=float(step.mean()), tp_step_us_p50=float(np.percentile(step, 50)),
               tp_step_us_p99=float(np.percentile(step, 99)))
    for r in range(tp):
        host = cols[f"rank{r}_host_wait_us"][keep]
        dev = cols[f"rank{r}_device_wait_us"][keep]
        out[f"rank{r}_step_us_mean"] = float(np.nanmean(cols[f"rank{r}_step_us"][keep]))
        out[f"rank{r}_collective_wait_us_mean"] = float((host + dev).mean())
        out[f"rank{r}_host_wait_us_mean"] = float(host.mean())
        out[f"rank{r}_device_wait_us_mean"] = float(dev.mean())
        out[f"rank{r}_races"] = int(races[r])
    who = cols["straggler"][keep]
    who_ok = who[who >= 0]
    if len(who_ok):
        counts = np.bincount(who_ok, minlength=tp)
        s = int(counts.argmax())
        out.update(straggler_rank=s, straggler_share=float(counts[s] / len(who)),
                   straggler_lead_us_mean=float(cols["straggler_lead_us"][keep][who == s].mean()))
    skew = cols["skew_us"][keep]
    skew = skew[~np.isnan(skew)]
    if len(skew):
        out.update(skew_us_p50=float(np.percentile(skew, 50)),
                   skew_us_p90=float(np.percentile(skew, 90)), skew_us_max=float(skew.max()))
    return out


__all__ = ["RESOLUTION_US", "Collectives", "group_columns", "late_arrivals", "rank_columns",
           "rank_summary", "simulated_table", "skew_report"]
