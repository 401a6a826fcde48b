"""The pass: running a plan's blocks in order, accumulating the per-step facts as it goes.

- :func:`run_plan`: compiles each block's function (:mod:`simwar.executors.fast.codegen`)
  and calls it chunk by chunk on one ``_State`` (the host clock, stream tails, record
  history and the per-step accumulators: forward start and end, forward-stream busy and
  held time per step window, host blocked time per site, the ``run_batch`` instant); if the
  forward steps turn out issued out of order, it runs again collecting the forward-stream
  intervals instead. The races' op times are logged as :mod:`simwar.executors.fast.races`
  plans them.
- ``_Flusher`` (summary-only runs): moves the accumulators along the run and summarizes
  rows as they become final, so memory does not grow with the number of steps.
- :class:`FastRun` and ``_finish``: the per-step columns
  (:func:`~simwar.analysis.metrics.columns_from_arrays`), the summary and the races.

Imports: numpy, simwar.core and simwar.analysis, and the executor's plan, codegen and races;
must not import the package's entry points (:mod:`simwar.executors.fast` imports this).
"""

from __future__ import annotations

import math
from array import array
from collections import deque

import numpy as np

from simwar.analysis.metrics import (
    SITES,
    StepFacts,
    busy_in_windows,
    columns_from_arrays,
    idle_windows,
    summarize,
)
from simwar.core.kinds import OpKind
from simwar.executors.fast.codegen import compile_block
from simwar.executors.fast.plan import Block, Plan
from simwar.executors.fast.races import FastHazards, RacePlan

#: passes of a block run per call of its compiled function (bounds the parameter lists)
CHUNK = 1 << 15
#: host operations run per call at most: a shape with many operations runs fewer passes
#: per call, so that a call (and the time between two progress reports) stays short
CHUNK_OPS = CHUNK * 40


def nonnegative(plan: Plan, block: Block) -> bool:
    """Whether every parameter of ``block`` is a constant at or above 0 and not -0.0 (what
    :func:`~simwar.executors.fast.codegen.compile_block`'s ``nonneg`` takes; a NaN is not)."""
    return not plan.negative and all(
        c is not None and c >= 0 and math.copysign(1.0, c) > 0 for c in block.consts)


def chunk_passes(block: Block) -> int:
    """Passes of ``block`` run per call: :data:`CHUNK`, fewer for a large shape
    (:data:`CHUNK_OPS`). Depends on the shape only, so a run's chunks never vary."""
    return max(1, min(CHUNK, CHUNK_OPS // max(1, len(block.shape.host))))
_INF = float("inf")


class _State:
    """What carries from one block to the next (and the per-step accumulators).

    Accumulators are indexed by step minus ``origin``; ``rows`` (summary-only runs) gives
    them a fixed length, moved along the run by :class:`_Flusher`. The compiled block
    functions read and write its attributes (:mod:`simwar.executors.fast.codegen` lists them).
    """

    def __init__(self, lo: int, hi: int, sites, depth: int, collect: bool,
                 rows: int | None = None):
        n = rows if rows is not None else hi - lo + 1
        self.origin = lo
        self.t = 0.0
        self.tails: dict[str, float] = {}
        self.hist = [()] * depth
        self.fs = _filled(n, _INF)
        self.fe = _filled(n, -_INF)
        self.launch = _filled(n, float("nan"))
        self.done = _filled(n, float("nan"))  # result processed (runs with requests)
        self.blocked = {site: _filled(n, 0.0) for site in sites}
        self.busy = _filled(n + 1, 0.0)  # one spare slot: index -1 before the first window
        self.dep = _filled(n + 1, 0.0)
        self.cw = -1  # the step whose forward last started
        self.cl = -1  # the step whose window (ending with its forward) last closed
        self.w = 0.0
        self.dp = 0.0
        self.bad = False
        self.collect = collect
        self.kin, self.kout, self.win, self.wout = (array("d") for _ in range(4))
        self.logs: list = []  # the current block's log arrays, in its log order

    def grow(self, by: int) -> None:
        for arr, value in ((self.fs, _INF), (self.fe, -_INF), (self.launch, float("nan")),
                           (self.done, float("nan")), *((a, 0.0) for a in self.blocked.values())):
            arr.extend(_filled(by, value))
        for arr in (self.busy, self.dep):  # keep the spare slot last
            spare = arr.pop()
            arr.extend(_filled(by, 0.0))
            arr.append(spare)


def _filled(n: int, value: float) -> array:
    """``n`` doubles equal to ``value``."""
    return array("d", [value]) * n


def run_plan(plan: Plan, window: int = 2, collect: bool | None = None,
             summary_only: bool = False, feed=None, progress=None, races=None,
             codes=None, trace=None) -> FastRun:
    """Run a plan: the per-step columns, and the races (see :mod:`simwar.executors.fast`).

    ``summary_only``: keep no per-step table; rows are summarized as they become final
    (:class:`simwar.analysis.streaming.StreamingSummary`), in a window of per-step accumulators
    that moves with the run, so memory does not grow with its length.
    ``feed(block index, block, first pass)``: gives, per chunk of a block's passes, the
    callable each pass calls with its step index and the host clock before reading its
    parameters, which returns them (:func:`simwar.executors.fast.realize`).
    ``progress(step)``: called after each chunk of passes (:func:`chunk_passes`: a bounded
    amount of work, a few hundredths of a second to a few tenths) with the furthest marker
    step run so far; never with a smaller step than before.
    ``races``: the plan's :class:`~simwar.executors.fast.races.RacePlan` at ``window``, where
    made already. ``codes(block index, its logged op times)``: the compiled code to run a
    block with, where it is not the block's own (a family's union,
    :mod:`simwar.executors.fast.union`): ``(function, constants, log order)``, the log
    order giving per log of the code the index of the block's log it is (-1: none, the
    times go to a log that keeps nothing), or None for the block's own code; asked in the
    first attempt only.
    ``trace``: a :class:`simwar.executors.fast.trace.Stream` of this plan and ``window``,
    with its sink: ``(stream, take)``. The pass then also makes the run's Trace windows,
    each handed to ``take`` as its chunk is run (the blocks compiled with the trace mode's
    rows and the sums at once, a chunk the stream's): a run's summary and its trace from one
    pass. A second attempt (forward steps issued out of order) takes no trace: the first
    made every window (its times are the run's; only its sums are refused).
    """
    if trace is not None and (feed is not None or codes is not None):
        raise ValueError("a traced pass runs the plan's own code, with no feed")
    meta = plan.meta
    reached = -1  # the furthest step reported to ``progress``
    fwd = meta.get("forward_stream", "forward")
    blocks = plan.blocks
    depth = plan.depth
    races = RacePlan(plan, window) if races is None else races
    sites = set(SITES) | plan.sites
    streaming = summary_only and _monotone(blocks)
    if streaming:
        # lazy: start-up time of a run that keeps its table (every short `simwar run`)
        from simwar.executors.fast.counts import Tally
    bad = collect
    for attempt in (False, True):
        if bad is not None and attempt != bad:
            continue
        rolling = streaming and not attempt
        state = _State(plan.lo, plan.hi, sites, depth, attempt,
                       rows=min(2 * CHUNK + 64, plan.hi - plan.lo + 1) if rolling else None)
        traced = trace is not None and not attempt
        if traced:
            stream, take = trace
            stream.attach(state)
        flusher = _Flusher(state, plan, fwd, races) if rolling else None
        races.reset(tally=Tally(len(races.groups)) if rolling else None)
        for bi, b in enumerate(blocks):
            slots = tuple(c is None for c in b.consts)
            log = races.logs_of(bi)
            state.logs = races.log_arrays(bi)
            given = codes(bi, log) if codes is not None and not attempt else None
            if given is None:
                fn = compile_block(b.shape, slots, fwd, attempt, log, depth,
                                   feed=feed is not None,
                                   nonneg=feed is None and nonnegative(plan, b),
                                   trace=traced, sums=traced)
                consts = tuple(c for c in b.consts if c is not None)
            else:
                fn, consts, order = given
                own, sink = state.logs, deque(maxlen=0)  # keeps nothing, whatever the length
                state.logs = [own[j] if j >= 0 else sink for j in order]
            keys = b.steps
            chunk = stream.chunk if traced else chunk_passes(b)
            for start in range(0, b.n, chunk):
                stop = min(b.n, start + chunk)
                ks = keys[start:stop]
                if flusher is not None:
                    flusher.before(min(ks), max(ks))
                lo = state.origin
                ks = range(ks.start - lo, ks.stop - lo) if isinstance(ks, range) else \
                    [k - lo for k in ks]
                if feed is not None:
                    cols = feed(bi, b, start)
                else:
                    cols = b.columns(start, stop) if any(slots) else []
                if traced:
                    stream.rows(bi, stop - start)
                fn(ks, consts, cols, state)
                if traced:
                    made = stream.piece(bi, start, stop, cols)
                    if made is not None:
                        take(made)
                if progress is not None:
                    reached = max(reached, keys[stop - 1])
                    progress(reached)
        if attempt or not state.bad:
            break
        bad = True  # forward steps issued out of order: windows from the intervals
    if flusher is not None and not state.collect:
        summary, hazards = flusher.finish()
        return FastRun(None, plan.meta, hazards, plan.segments,
                       ("windowed" if races.windowed else "full", "streamed"),
                       summary=summary)
    out = _finish(plan, state, races, fwd)
    if summary_only:  # a fallback path: the table was computed; summarize it, then drop it
        out = FastRun(None, out.meta, out.hazards, out.segments, out.paths, out.summary)
    return out


def _monotone(blocks: list[Block]) -> bool:
    """Marker steps never decrease (rows become final in order)."""
    last = None
    for b in blocks:
        steps = b.steps
        first = steps[0] if isinstance(steps, range) else min(steps)
        if isinstance(steps, list) and steps != sorted(steps):
            return False
        if last is not None and first < last:
            return False
        last = steps[-1]
    return True


class _Flusher:
    """Moves the per-step accumulators along a run and summarizes the rows left behind.

    Before a chunk of passes, the rows no later op can write (below the chunk's first step
    plus the smallest step offset of any op that writes one, and below the open step
    window) are final. They are turned into table rows by ``columns_from_arrays``, with the
    last rows before them as context (the previous forward's end, the launch-ahead
    history) and the row after them (the next forward's start and launch), and fed to a
    :class:`~simwar.analysis.streaming.StreamingSummary`; the accumulators then shift down,
    and the races of the rows summarized are counted
    (:meth:`~simwar.executors.fast.races.RacePlan.tally`), their logged times dropped.
    """

    HISTORY = 4096  # rows kept as context for launch-ahead (forwards in flight)

    def __init__(self, state: _State, plan: Plan, fwd: str, races: RacePlan):
        self.state = state
        self.plan = plan
        self.races = races
        # lazy: start-up time of a run that keeps its table (every short `simwar run`)
        from simwar.analysis.streaming import StreamingSummary

        self.sink = StreamingSummary(plan.meta)
        self.facts = StepFacts(plan.meta)
        offs = [0]
        for b in plan.blocks:
            for h in b.shape.host:
                if h.kind in ("sync", "run_batch", "result_done"):
                    offs.append(h.off)
            for op in b.shape.ops:
                if op.kind == OpKind.KERNEL and op.lane == fwd and op.phase:
                    offs.append(op.off)
        self.min_off, self.max_off = min(offs), max(offs)
        self.marks = marks_results(plan)
        self.hist: dict | None = None  # facts of the last rows summarized
        self.dropped = 0  # rows summarized before the history

    def _views(self) -> dict:
        st = self.state
        out = {"start": st.fs, "end": st.fe, "launch": st.launch, "busy": st.busy,
               "dep": st.dep}
        if self.marks:
            out["done"] = st.done
        out.update({("blocked", site): arr for site, arr in st.blocked.items()})
        return out

    def before(self, first: int, last: int) -> None:
        st = self.state
        rows = len(st.fs)
        if last + self.max_off - st.origin < rows:
            return
        final = first + self.min_off
        if st.cw >= 0:
            final = min(final, st.origin + st.cw)
        self._emit(final - st.origin, keep_last=True)
        need = last + self.max_off - st.origin + 1
        if need > len(st.fs):
            st.grow(need - len(st.fs) + CHUNK)

    def _emit(self, upto: int, keep_last: bool) -> None:
        """Summarize the present rows below ``upto`` (all but the last, if ``keep_last``)."""
        st = self.state
        upto = max(0, min(upto, len(st.fs)))
        fs = np.frombuffer(st.fs, dtype=np.float64)
        present = np.flatnonzero(fs[:upto] < _INF)
        if keep_last:
            if len(present) == 0:
                self._shift(upto)
                return
            nxt, present = present[-1], present[:-1]
            rows = np.append(present, nxt)
        else:
            rows = present
        del fs
        facts = {key: np.frombuffer(arr, dtype=np.float64)[rows].copy()
                 for key, arr in self._views().items()}
        facts["step"] = (rows + st.origin).astype(np.int64)
        self._summarize(facts, has_next=keep_last)
        self._shift(int(rows[-1]) if keep_last else upto)

    def _summarize(self, facts: dict, has_next: bool) -> None:
        hist = self.hist
        h = 0 if hist is None else len(hist["step"])
        if hist is not None:
            facts = {k: np.concatenate([hist[k], v]) for k, v in facts.items()}
        n = len(facts["step"]) - (1 if has_next else 0)
        if n > h:
            blocked = {key[1]: v for key, v in facts.items() if isinstance(key, tuple)}
            cols = columns_from_arrays(facts["step"], facts["start"], facts["end"],
                                       facts["busy"], facts["dep"], blocked, facts["launch"],
                                       self.facts, facts.get("done"))
            ahead = cols["launch_ahead"][h:n]
            if self.dropped and np.any(ahead == np.arange(h, n)):
                raise RuntimeError("launch-ahead deeper than the streaming history")
            self.sink.add({k: v[h:n] for k, v in cols.items()})
            self.races.tally(self.sink.first, self.sink.last)
        keep = max(0, n - self.HISTORY)
        self.dropped += keep
        self.hist = {k: v[keep:n] for k, v in facts.items()}

    def _shift(self, by: int) -> None:
        if by <= 0:
            return
        st = self.state
        for key, arr in self._views().items():
            v = np.frombuffer(arr, dtype=np.float64)
            n = len(st.fs)
            v[:n - by] = v[by:n]
            v[n - by:n] = _INF if key == "start" else -_INF if key == "end" else \
                np.nan if key in ("launch", "done") else 0.0
            del v
        st.origin += by
        if st.cw >= 0:
            st.cw -= by
        st.cl -= by

    def finish(self) -> tuple[dict, object]:
        """The summary and the races (counted as the rows went, for a windowed race plan)."""
        self._emit(len(self.state.fs), keep_last=False)
        sink, races = self.sink, self.races
        hazards = races.counted(sink.first, sink.last) if races.windowed else \
            races.finish(self.state)
        return sink.result(hazards), hazards


class FastRun:
    """The result of :func:`run_plan`: per-step columns, summary, races.

    ``columns``: the per-step table as numpy columns (None for a summary-only run);
    ``meta``: the program's; ``hazards``: its :class:`~simwar.executors.fast.races.FastHazards`;
    ``segments``: how many segments ran; ``paths``: which way the races were found
    (``"windowed"`` or ``"full"``) and the step windows summed (``"stream"``: as the pass
    went, ``"collect"``: from the logged forward-stream intervals, ``"streamed"``: summarized
    as rows became final); ``summary``: given (a summary-only run) or computed from
    ``columns`` when first read.
    """

    def __init__(self, columns: dict | None, meta: dict, hazards: FastHazards, segments: int,
                 paths: tuple[str, str], summary: dict | None = None):
        self.columns = columns
        self.meta = meta
        self.hazards = hazards
        self.segments = segments
        self.paths = paths
        self._summary = summary

    @property
    def summary(self) -> dict:
        if self._summary is None:
            self._summary = summarize(self.columns, self.meta, self.hazards)
        return self._summary

    def set_summary(self, summary: dict) -> None:
        """The summary, made elsewhere from the same columns and races (runs summarized
        together: :mod:`simwar.executors.lockstep.family`)."""
        self._summary = summary


def _finish(plan: Plan, state: _State, races: RacePlan, fwd: str) -> FastRun:
    """The per-step columns from the accumulators (or the collected intervals), and the
    races."""
    fs = np.frombuffer(state.fs, dtype=np.float64)
    idx = np.flatnonzero(fs < _INF)
    steps = (idx + state.origin).astype(np.int32)
    start = fs[idx]
    end = np.frombuffer(state.fe, dtype=np.float64)[idx]
    lo, hi = idle_windows(end)
    if state.collect:
        busy = busy_in_windows(_np(state.kin), _np(state.kout), lo, hi)
        dep = busy_in_windows(_np(state.win), _np(state.wout), lo, hi)
    else:
        busy = np.frombuffer(state.busy, dtype=np.float64)[idx]
        dep = np.frombuffer(state.dep, dtype=np.float64)[idx]
    blocked = {site: np.frombuffer(vals, dtype=np.float64)[idx]
               for site, vals in state.blocked.items()}
    launch = np.frombuffer(state.launch, dtype=np.float64)[idx]
    if len(idx) == 0:  # no forward kernels: no steps (as step_columns of such a trace)
        columns = {"step": np.zeros(0, dtype=np.int32)}
    else:
        done = np.frombuffer(state.done, dtype=np.float64)[idx] if marks_results(plan) \
            else None
        columns = columns_from_arrays(steps, start, end, busy, dep, blocked, launch,
                                      StepFacts(plan.meta), done)
    hazards = races.finish(state)
    return FastRun(columns, plan.meta, hazards, plan.segments,
                   ("windowed" if races.windowed else "full",
                    "collect" if state.collect else "stream"))


def marks_results(plan: Plan) -> bool:
    """Whether the program marks each processed result (a run with requests): its table
    then has ``result_done_us``, as the trace's markers give it."""
    return any(h.kind == "result_done" for b in plan.blocks for h in b.shape.host)


def _np(a: array) -> np.ndarray:
    """A view of a double array (an empty one has no buffer to view)."""
    return np.frombuffer(a, dtype=np.float64) if len(a) else np.zeros(0)
