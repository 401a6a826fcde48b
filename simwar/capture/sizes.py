"""Each captured step's batch and graph bucket: what a capture says of a batch that changes.

A real server runs a different batch every step, and each batch runs the CUDA graph
captured for its bucket (the smallest captured batch size >= it). :func:`size_capture` reads
both from an imported capture (a :class:`simwar.capture.to_trace.KinetoImport`) and its
mapping, in this order:

1. **The batch, from the mapping's ``batch``**: a regex with one capture group matched
   against the host's annotation ranges that start inside each step (e.g.
   ``'^decode bs=(\\d+)$'`` on a ``record_function(f"decode bs={B}")``); the group is the
   step's batch. Two ranges of one step that give different batches are an error naming
   the step.
2. **The graph each step ran**: the step's graph launches (``cudaGraphLaunch``), each known
   by its kernels' names and launch dims (a graph captured at another batch size launches
   other dims, often other kernels): the tuple of them is the step's *graph key*. Distinct
   keys are ordered by their mean device time, the smallest first (a larger batch's graph
   takes longer), so the i-th key runs the i-th bucket.
3. **The buckets**: the mapping's ``graph_buckets`` when it names them (a batch above the
   largest is an error naming the step); else, with batches, each graph key's bucket is the
   size it was captured at: the largest batch seen with it where the next key's smallest
   batch pins it (a load that sweeps every bucket's size gives them all), else a pinned
   key's size scaled by the ratio of their kernels' grid sizes (a load that never filled the
   bucket: 14 requests at most in the bucket of 16), else the largest batch seen (name them
   in the mapping then); without batches, the i-th key gets the i-th of ``graph_buckets``,
   which the mapping must then name (one per key).

A step with forward work (phased kernels on the forward stream) but no batch (no range
matches ``batch`` in it) takes its graph's bucket as its batch; a graph of unknown size is an
error naming the step; a step that ran no graph either (the drain after the last step, a
prefill-only step) has no batch (0), and the notes count them. A capture whose
graphs never change and that names no batch keeps the mapping's constant ``batch_size``
(:attr:`CaptureSizes.varying` is False). :meth:`CaptureSizes.apply` writes the per-step
arrays into the trace's ``meta.workload``, so that every analysis of the capture
(:mod:`simwar.analysis.metrics`' ``by_bucket``, ``simwar explain`` per bucket) reads them as
it reads a simulated run's.

Imports: numpy, the standard library and simwar's capture, analysis and core modules;
never the simulator.
"""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from simwar.analysis.views import forward_kernels
from simwar.capture.imported import KinetoImport
from simwar.capture.mapping import Mapping
from simwar.core.trace import Call, OpKind, Trace


class SizesError(ValueError):
    """A capture's per-step sizes cannot be read as the mapping says; one line."""


@dataclass
class CaptureSizes:
    """Per step of a capture (index = step): its batch and graph bucket, and where from."""

    batch: np.ndarray  # int64; 0: a step without device work (and without a batch)
    bucket: np.ndarray  # int64; the batch itself where no graph ran
    buckets: list[int] | None  # the graph buckets (sorted), None: no graphs vary
    varying: bool
    source: str  # "batch ranges", "graphs", "constant"
    #: sentences for the fit's header and the import report
    notes: list[str] = field(default_factory=list)
    #: steps with device work whose batch is their graph's bucket (no batch range in them)
    from_bucket: list[int] = field(default_factory=list)
    accept: float = 1.0

    def meta(self) -> dict:
        """The ``meta.workload`` of the capture's trace (as a simulated run writes it)."""
        n = len(self.batch)
        return {"source": "capture", "batch_size": self.batch.tolist(),
                "graph_bucket": self.bucket.tolist(), "accepted_tokens": [self.accept] * n,
                "graph_buckets": self.buckets}

    def apply(self, trace: Trace) -> None:
        """Give ``trace`` these sizes (its ``meta.workload``) when they vary."""
        if self.varying:
            trace.meta["workload"] = self.meta()


def step_bounds(trace: Trace) -> list[tuple[float, float]]:
    """Per step (index = step), its host interval: its start to the next start (the last
    step: to the capture's ``end`` marker)."""
    m = trace.markers
    is_step = m.name == trace.code("step")
    starts = dict(zip(m.step[is_step].tolist(), m.time_us[is_step].tolist()))
    if not starts:
        return []
    end = m.time_us[m.name == trace.code("end")]
    last = float(end.max()) if len(end) else float("inf")
    n = max(starts) + 1
    out = []
    for k in range(n):
        a = starts.get(k, out[-1][1] if out else 0.0)
        b = starts.get(k + 1, last if k == n - 1 else a)
        out.append((float(a), float(b)))
    return out


def step_label(trace: Trace, k: int) -> str:
    """``step 12 (ProfilerStep#112)``: a step by its index and the capture's own name."""
    names = trace.meta.get("step_names") or []
    return f"step {k} ({names[k]})" if k < len(names) else f"step {k}"


def batch_ranges(imp: KinetoImport, mapping: Mapping,
                 where: str = "mapping") -> dict[int, tuple[int, str]]:
    """Per step, ``(batch, range name)`` from the mapping's ``batch`` regex (empty without one).

    A range counts for the step its start falls in; two ranges of one step that give
    different batches are a :class:`SizesError` naming the step.
    """
    if not mapping.batch:
        return {}
    rx = re.compile(mapping.batch)
    trace = imp.trace
    bounds = step_bounds(trace)
    starts = [a for a, _ in bounds]
    out: dict[int, tuple[int, str]] = {}
    for name, a, _ in imp.annotations:
        m = rx.search(name)
        if m is None:
            continue
        k = bisect.bisect_right(starts, a) - 1
        if k < 0 or a >= bounds[k][1]:
            continue
        text = m.group(1)
        if text is None or not text.strip().isdigit():
            raise SizesError(f"{where}: batch: {step_label(trace, k)}: '{name}' gives "
                             f"{text!r}, not a whole number of requests")
        value = int(text)
        if k in out and out[k][0] != value and not trace.meta.get("step_names"):
            # no range matched the steps pattern: the capture was read as one step
            raise SizesError(f"{where}: steps: no range of the capture matches "
                             f"'{mapping.steps}', so it reads as one step with several batches "
                             f"('{out[k][1]}', '{name}'); give the pattern of the capture's "
                             f"step ranges")
        if k in out and out[k][0] != value:
            raise SizesError(f"{where}: batch: {step_label(trace, k)} has two batches: "
                             f"'{out[k][1]}' and '{name}' (one range per step must give it)")
        out.setdefault(k, (value, name))
    return out


def graph_keys(imp: KinetoImport) -> dict[int, tuple]:
    """Per step that launched CUDA graphs: its graph key, the tuple of each graph launch's
    kernels as ``(name, grid, block)`` (in launch order)."""
    trace = imp.trace
    spans, ops = trace.spans, trace.ops
    graphs = np.flatnonzero(spans.call == Call.GRAPH_LAUNCH)
    graphs = graphs[np.lexsort((graphs, spans.start_us[graphs]))]
    # each graph launch's kernels, by (launch order, start, op id), in one sort
    rank = np.full(len(spans), -1, dtype=np.int64)
    rank[graphs] = np.arange(len(graphs))
    kern = _graph_kernels(trace)
    by = rank[ops.call[kern]]
    kern = kern[np.lexsort((kern, ops.start_us[kern], by))]
    bounds = np.searchsorted(rank[ops.call[kern]], np.arange(len(graphs) + 1)).tolist()
    kern_ids, labels = kern.tolist(), ops.label[kern].tolist()
    facts = imp.device_info.of_ops(kern_ids)  # each kernel's facts, by one search
    per: dict[int, list] = {}
    for i, step in enumerate(spans.step[graphs].tolist()):
        sig = []
        for j in range(bounds[i], bounds[i + 1]):
            d = facts[j]
            sig.append((trace.text(labels[j]),) + ((d.grid, d.block) if d is not None
                                                    else ((), ())))
        per.setdefault(step, []).append(tuple(sig))
    return {k: tuple(v) for k, v in per.items()}


def _graph_kernels(trace: Trace) -> np.ndarray:
    """The kernel ops a graph launch issued, by op id."""
    ops, spans = trace.ops, trace.spans
    kern = np.flatnonzero((ops.kind == OpKind.KERNEL) & (ops.call >= 0))
    return kern[spans.call[ops.call[kern]] == Call.GRAPH_LAUNCH]


def _graph_time(imp: KinetoImport, steps: list[int]) -> float:
    """Mean device time of the graph launches of ``steps`` (their kernels' lengths, summed
    launch by launch in op order)."""
    trace = imp.trace
    ops, spans = trace.ops, trace.spans
    kern = _graph_kernels(trace)
    kern = kern[np.isin(spans.step[ops.call[kern]], steps)]
    kern = kern[np.lexsort((kern, ops.call[kern]))]
    total = 0.0
    for d in (ops.end_us[kern] - ops.start_us[kern]).tolist():  # in order: the same float sum
        total += d
    return total / max(1, len(steps))


def _device_steps(trace: Trace) -> set[int]:
    """Steps with forward work (phased kernels on the forward stream): those that ran a batch."""
    return set(np.unique(trace.ops.step[forward_kernels(trace)]).tolist())


def size_capture(imp: KinetoImport, mapping: Mapping, where: str = "mapping") -> CaptureSizes:
    """The per-step sizes of an imported capture (see the module docstring).

    ``where`` is the name errors start with (the mapping's file or preset).
    """
    trace = imp.trace
    n = len(step_bounds(trace))
    accept = float(mapping.accept_tokens)
    batches = batch_ranges(imp, mapping, where)
    keys = graph_keys(imp)
    distinct = sorted({key for key in keys.values() if key},
                      key=lambda key: (_graph_time(imp, [k for k, v in keys.items()
                                                         if v == key]), repr(key)))
    rank = {key: i for i, key in enumerate(distinct)}
    device = sorted(k for k in _device_steps(trace) if 0 <= k < n)
    given = mapping.graph_buckets
    notes: list[str] = []
    n_graphs = len(distinct)
    what_graphs = (f"{n_graphs} distinct captured graph sets (by their kernels' names and "
                   f"launch dims), ordered by device time")

    if not batches:
        if n_graphs <= 1:
            b = np.full(n, int(mapping.batch_size), dtype=np.int64)
            return CaptureSizes(b, b.copy(), None, False, "constant",
                                [f"batch: the mapping's constant batch_size "
                                 f"{mapping.batch_size} (no batch ranges"
                                 + (", one captured graph set" if n_graphs else ", no graphs")
                                 + ")"], accept=accept)
        if not given or len(given) != n_graphs:
            k = next(k for k in device if keys.get(k))
            why = (f"no range matches batch '{mapping.batch}' in it" if mapping.batch
                   else "the mapping names no batch regex")
            have = f"names {len(given)}" if given else "names none"
            raise SizesError(f"{where}: batch: {step_label(trace, k)} has no batch ({why}) and "
                             f"the capture ran {n_graphs} graph sets: give their sizes as "
                             f"graph_buckets ({n_graphs} of them, smallest first; the mapping "
                             f"{have})")
        bucket_of = {key: given[rank[key]] for key in distinct}
        batch = np.zeros(n, dtype=np.int64)
        for k in device:
            key = keys.get(k)
            batch[k] = bucket_of[key] if key in bucket_of else 0
        notes.append(f"batch: each step's graph bucket ({what_graphs}, as graph_buckets "
                     f"{list(given)}); no batch ranges, so the batch is the bucket")
        bucket = batch.copy()
        return CaptureSizes(batch, bucket, list(given), True, "graphs", notes,
                            list(device), accept)

    # batches from the ranges
    batch = np.zeros(n, dtype=np.int64)
    for k, (v, _) in batches.items():
        if k < n:
            batch[k] = v
    seen: dict[tuple, int] = {}
    for k, (v, _) in batches.items():
        key = keys.get(k)
        if key:
            seen[key] = max(seen.get(key, 0), v)
    if given:
        buckets = list(given)
        bucket_of = {}
        notes.append(f"graph buckets: {buckets} (the mapping's graph_buckets)")
    elif n_graphs > 1:
        bucket_of, scaled = _graph_sizes(distinct, batches, keys)
        buckets = sorted(set(bucket_of.values()))
        how = (f"; {', '.join(map(str, scaled))} never reached: the launch dims scaled from "
               f"a bucket whose size is known" if scaled else "")
        notes.append(f"graph buckets: {buckets}, the size each of the {what_graphs}, was "
                     f"captured at (the largest batch seen with it, where the next one's "
                     f"smallest batch pins it{how}; name graph_buckets in the mapping to "
                     f"override)")
    elif n_graphs == 1:
        buckets = [max(v for v, _ in batches.values())]
        bucket_of = {distinct[0]: buckets[0]}
        notes.append(f"graph buckets: {buckets} (one captured graph set ran every batch)")
    else:
        buckets, bucket_of = None, {}
    from_bucket, unsized = [], []
    for k in device:
        if k in batches:
            continue
        key = keys.get(k)
        if key in bucket_of or (given and key in rank and len(given) == n_graphs):
            batch[k] = bucket_of.get(key, given[rank[key]] if given else 0)
            from_bucket.append(k)
            continue
        if not key:  # no batch range and no graph: no decode batch ran (a drain, a prefill)
            unsized.append(k)
            continue
        raise SizesError(f"{where}: batch: {step_label(trace, k)} has no batch: no range in it "
                         f"matches '{mapping.batch}' and its graph set's size is not known "
                         f"(name graph_buckets)")
    bucket = batch.copy()
    if buckets is not None:
        top = buckets[-1]
        for k in device:
            key = keys.get(k)
            if given or key not in bucket_of:
                if batch[k] > top:
                    raise SizesError(f"{where}: graph_buckets: {step_label(trace, k)}'s batch "
                                     f"{batch[k]} is above the largest graph bucket ({top})")
                bucket[k] = buckets[bisect.bisect_left(buckets, int(batch[k]))] \
                    if batch[k] > 0 else 0
            else:
                bucket[k] = bucket_of[key]
    src = f"batch: from the ranges matching '{mapping.batch}' ({len(batches)} steps)"
    if from_bucket:
        src += f"; {len(from_bucket)} steps without one take their graph's bucket"
    if unsized:
        src += (f"; {len(unsized)} step{'s' if len(unsized) > 1 else ''} with neither a batch "
                f"range nor a graph ({', '.join(map(str, unsized[:4]))}"
                f"{' ...' if len(unsized) > 4 else ''}): no batch")
    notes.insert(0, src)
    mixed = _mixed_graphs(keys, batches, bucket_of)
    if mixed:
        notes.append(mixed)
    varying = len(set(batch[device].tolist())) > 1 or len(set(bucket[device].tolist())) > 1
    return CaptureSizes(batch, bucket, buckets, varying, "batch ranges", notes, from_bucket,
                        accept)


def _graph_sizes(distinct: list, batches: dict, keys: dict) -> tuple[dict, list[int]]:
    """Each graph key's captured size (``distinct`` smallest first), and the sizes that were
    scaled rather than seen.

    A batch runs the smallest bucket >= it, so graph ``i``'s size lies between the largest
    batch seen with it and one below the smallest batch seen with graph ``i + 1``: where those
    meet, the size is *pinned*. Another graph's size (the largest batch seen with it need not
    be its size: a load that never filled the bucket) is a pinned graph's size times the ratio
    of their launches' grid sizes, kernel by kernel of the same name (most kernels of a
    graph captured at twice the batch launch twice the blocks), when that is a whole number
    in its range; else the largest batch seen with it.
    """
    lo: dict = {}
    low: dict = {}
    for k, (v, _) in batches.items():
        key = keys.get(k)
        if key:
            lo[key] = max(lo.get(key, 0), v)
            low[key] = min(low.get(key, v), v)
    sized = [key for key in distinct if key in lo]
    hi = {key: (low[nxt] - 1 if nxt is not None else None)
          for key, nxt in zip(sized, [*sized[1:], None])}
    pinned = {key: lo[key] for key in sized if hi[key] == lo[key]}
    out, scaled = {}, []
    for key in sized:
        if key in pinned or not pinned:
            out[key] = lo[key]
            continue
        size = None
        for ref in sorted(pinned, key=lambda r: abs(sized.index(r) - sized.index(key))):
            ratio = _grid_ratio(ref, key)
            if ratio is None:
                continue
            value = pinned[ref] * ratio
            if value.denominator == 1 and lo[key] <= value and (hi[key] is None
                                                                  or value <= hi[key]):
                size = int(value)
            break
        out[key] = size if size is not None else lo[key]
        if size is not None and size != lo[key]:
            scaled.append(size)
    return out, sorted(scaled)


def _grid_ratio(ref: tuple, key: tuple):
    """The most common ratio of ``key``'s kernels' grid sizes to ``ref``'s, kernel by kernel
    of the same name where the sizes differ (a :class:`fractions.Fraction`; None: the two
    graph sets launch different kernels)."""
    from fractions import Fraction

    if len(ref) != len(key) or any(len(a) != len(b) for a, b in zip(ref, key)):
        return None
    ratios: Counter = Counter()
    for a, b in zip(ref, key):
        for (name_a, grid_a, _), (name_b, grid_b, _) in zip(a, b):
            if name_a != name_b or not grid_a or not grid_b:
                continue
            na, nb = math.prod(grid_a), math.prod(grid_b)
            if na and nb and na != nb:
                ratios[Fraction(nb, na)] += 1
    if not ratios:
        return None
    (best, n), *rest = ratios.most_common(2) + [(None, 0)]
    return best if n > rest[0][1] else None  # a tie: no rule


def _mixed_graphs(keys: dict, batches: dict, bucket_of: dict) -> str:
    """A sentence when one batch ran two different graph sets (the graph is then not a
    function of the batch, and the buckets are approximate)."""
    by_batch: dict[int, Counter] = {}
    for k, (v, _) in batches.items():
        key = keys.get(k)
        if key:
            by_batch.setdefault(v, Counter())[key] += 1
    mixed = sorted(v for v, c in by_batch.items() if len(c) > 1)
    if not mixed:
        return ""
    return (f"batches {', '.join(map(str, mixed[:5]))}{' ...' if len(mixed) > 5 else ''} ran "
            f"more than one graph set: the graph is not a function of the batch here")
