"""Chrome trace-event export of a Trace, for Perfetto (ui.perfetto.dev) and chrome://tracing.

The file is the JSON object form of the Trace Event Format
(``{"traceEvents": [...]}``), laid out the way torch.profiler (Kineto) lays out
its own traces so that a simulated run can be opened next to a measured one:

- one process for the host (the scheduler thread: CPU work, host API calls,
  host blocks) and one process per stream, each named by ``M`` metadata
  events and ordered host first, then the streams in ``simwar.analysis.views.STREAM_ORDER``;
- ``X`` (complete) slices with float µs timestamps (``ts``, ``dur``, rounded to the ns);
  slices on one track never overlap: a lane whose spans do overlap (a
  measured trace can have that) is split over extra threads of its process;
  host calls are named by their call kind, label and lane
  (``forward.wait_stream(schedule)``, ``record copy_done[5]``, ``sync
  copy_done[4]``), stream waits by what they wait for;
- flow events ``s``/``f`` (binding point ``e``, as Kineto writes them):
  ``launch`` flows from each host call to the kernel(s) it issued
  (``ops.call``), ``record_wait`` flows from the work an event record
  captured (the last kernel issued on its stream before it) to the stream
  wait it released (``ops.bound``; the wait's span, or, for a wait that never
  held its stream, the next kernel issued there), ``record_sync`` flows to
  the host block of the synchronize it ended;
- counter tracks (``C``) on the host: ``forwards_in_flight`` (forwards
  launched and not yet finished, over time) and ``launch_ahead`` (the depth
  at each launch, the metric of ``simwar.analysis.metrics``);
- record operations as instant events (``i``) on their stream.

Every relation is looked up by id; nothing here parses a label.

**Streaming.** :class:`ChromeTraceWriter` writes the events of one window of a Trace at a
time (:class:`~simwar.core.trace.TraceWindow`, as the fast executor's trace mode
streams a run: :func:`write_run`), so a run of any length costs one window of memory and
is written as it is produced; a whole Trace is one window (:func:`chrome_trace`,
:func:`write_chrome_trace`). What carries from one window to the next is small: each
lane's track ends, the last kernel on each lane (the work a later record captures), the
records the next windows' waits may bind to, waits whose next kernel is still to come,
and the counters' pending changes. A streamed run's events are those of its whole Trace
exported at once; only their order in the file and the flows' ids differ (a lane whose
spans overlap across windows would be split window by window, which no simulated run
needs: its lanes never overlap). The JSON text is made a group of alike events at a time,
as fixed-width rows copied column by column and handed to the file a piece of rows at a
time, each made in cache, or made in the file's own buffer where the file is written past
the page cache (:func:`simwar.plots.jsoncols.write_rows`, ``write_rows_into``;
numbers exactly as ``json.dumps`` writes the rounded floats; a shorter value is followed by
spaces where JSON allows them, so the file parses to the same events as ``json.dumps``'s
text, a few per cent larger). JSON rather than Perfetto's protobuf format: it is what torch.profiler
writes and Perfetto, chrome://tracing and HolisticTraceAnalysis read alike, and no
well-kept library writes the protobuf from columns (the ``perfetto`` package builds one
Python message per event, slower than the text here).

Imports: numpy, ``simwar.core`` and ``simwar.analysis.views`` (the lane order);
importing it loads the package ``simwar.plots``, whose figures load lazily.
"""

from __future__ import annotations

import bisect
import contextlib
import gzip
import io
import json
from pathlib import Path

import numpy as np

from simwar.analysis.views import ordered_lanes
from simwar.core.direct_io import direct_writes
from simwar.core.files import atomic_file, check_interrupt
from simwar.core.run_meta import RunMeta
from simwar.core.trace import CALLS, HOST, SPAN_KINDS, Call, OpKind, SpanKind, Trace, window_of
from simwar.plots.jsoncols import (
    TS_DIGITS,
    Text,
    choose,
    compose,
    constant,
    escaped,
    int_text,
    json_str,
    number_text,
    present,
    round_ns,
    write_rows,
    write_rows_into,
)
from simwar.plots.perfetto_shape import Flows, WindowShape, name_text, slice_groups

__all__ = ["ChromeTraceWriter", "chrome_trace", "write_chrome_trace", "write_run", "run_writer"]

HOST_PID = 1
_INF = float("inf")
_HISTORY = 4096  # forward ends kept for the launch-ahead counter
_SHAPES = 4  # window structures kept (a steady run streams one; its first and last windows
#              are others, let go once a later structure comes)


# --------------------------------------------------------------------------- the writer
class ChromeTraceWriter:
    """Writes Chrome trace-event JSON to ``handle`` (binary) as windows of a run come.

    ``lanes``: every lane of the run (the processes, in display order); ``meta``: the run's
    (``otherData``); ``steps`` (A, B): export the spans, records, flows and counter samples
    of steps A..B only. :meth:`add` each window in order, then :meth:`close`.
    """

    def __init__(self, handle, lanes, meta: dict, steps: tuple[int, int] | None = None):
        self.out = handle
        self.into = hasattr(handle, "room")  # a DirectWriter: rows made in its buffer
        self.lanes = ordered_lanes(set(lanes) | {HOST})
        self.pid = {lane: HOST_PID + i for i, lane in enumerate(self.lanes)}
        self.meta = {k: v for k, v in meta.items() if isinstance(v, (str, int, float, bool))}
        self.forward = RunMeta.from_meta(meta).forward_stream
        self.steps = steps
        self.tracks: dict[str, list[float]] = {lane: [] for lane in self.lanes}
        self.flow_id = 0
        # the last kernel issued on each lane: (pid, tid, ts of a flow leaving it, step)
        self.last_kernel: dict[str, tuple] = {}
        # records of earlier windows that later waits may bind to: global op id -> source
        self.records = (np.zeros(0, dtype=np.int64), np.zeros((0, 4), dtype=np.float64))
        self.pending_waits: dict[str, list] = {}  # lane -> flows waiting for its next kernel
        self.counters = _Counters(self)
        self.shapes: list[WindowShape] = []  # the last windows' structures, latest first
        events = []
        for i, lane in enumerate(self.lanes):
            p = self.pid[lane]
            events.append({"ph": "M", "name": "process_name", "pid": p, "tid": 0,
                           "args": {"name": "host" if lane == HOST else f"stream {lane}"}})
            events.append({"ph": "M", "name": "process_sort_index", "pid": p, "tid": 0,
                           "args": {"sort_index": i}})
            events.append({"ph": "M", "name": "thread_name", "pid": p, "tid": 1,
                           "args": {"name": lane}})
        self._write_text('{"traceEvents":[' + ",".join(
            json.dumps(e, separators=(",", ":")) for e in events))

    # ---- output
    def _write_text(self, text: str) -> None:
        self.out.write(text.encode())

    def _write(self, *parts) -> None:
        """Write the rows of alike events made of ``parts`` (constant texts and columns:
        :func:`~simwar.plots.jsoncols.write_rows`; each row begins with its comma), made in
        the file's buffer where the handle offers it (``write_rows_into``)."""
        if self.into:
            write_rows_into(self.out, *parts)
        else:
            write_rows(self.out.write, *parts)

    # ---- one window
    def add(self, window) -> None:
        """Write the events of one window (a Trace is a window of itself)."""
        w = window_of(window)
        check_interrupt()  # a long export stops at the next window after Ctrl-C
        sp = w.spans
        texts = w.strings + [""]
        esc = escaped(texts)
        shape = self._shape(w)
        self._none = shape.none  # the code of "" in ``esc`` for a code of -1
        start_ns, end_ns = round_ns(sp.start_us), round_ns(sp.end_us)
        start_r, end_r = start_ns / 1000.0, end_ns / 1000.0
        # the times' range, found once: the slices' and the flows' integer arithmetic on ns
        # is exact below 2**43 ns, and a time's float is needed only at 0 ns or below
        first = int(start_ns.min()) if len(sp) else 0
        small = not len(sp) or max(int(end_ns.max()), -int(end_ns.min()), int(start_ns.max()),
                                   -first) < 2 ** 43
        ns = (start_ns, end_ns, small, first > 0)
        pid = shape.pid
        tid = np.ones(len(sp), dtype=np.int64)
        one_track = self._tracks(shape, start_r, end_r, tid, texts)
        core = shape.core
        if self.steps is None and one_track:
            groups = shape.groups(w)
        else:
            keep = core if self.steps is None else core[(sp.step[core] >= self.steps[0])
                                                       & (sp.step[core] <= self.steps[1])]
            groups = slice_groups(w, keep, pid, tid, shape.none, shape.empty)
        self._slices(w, groups, esc, texts, ns, start_r, end_r)
        flows = shape.flows(w)
        self._records(w, esc, shape.lane_pid, flows.recs)
        self.counters.add(w, shape)
        self._flows(w, flows, esc, pid, tid, ns, start_r, end_r, texts)

    def _shape(self, w) -> WindowShape:
        """The window's :class:`~simwar.plots.perfetto_shape.WindowShape`: one of the last
        few windows' where the structure is theirs, else made (an export of some steps only
        makes each window's: its groups are of those steps' spans)."""
        for i, shape in enumerate(self.shapes):
            if shape.matches(w):
                shape.hits += 1
                if i:
                    self.shapes.insert(0, self.shapes.pop(i))
                return shape
        shape = WindowShape(w, self.pid)
        if self.steps is None:  # those never taken again are let go (their memory too)
            self.shapes = [shape] + [s for s in self.shapes if s.hits][:_SHAPES - 1]
        return shape

    def _tracks(self, shape, start_r, end_r, tid, texts) -> bool:
        """Each core span's track: the first of its lane's tracks it fits after (greedy over
        the lane's spans by start, end and id), carried from window to window. Whether every
        span is on its lane's first track (``tid`` left 1)."""
        one_track = True
        for code, group in shape.lane_spans:  # a few lanes: a pass each, no sort
            s, e = start_r[group], end_r[group]
            lane = texts[code]
            ends = self.tracks.setdefault(lane, [])
            # the usual case in two passes: each span (none ending before it starts) starts
            # once the one before it has ended, the first after the lane's track: in order
            # by start, end and id, each after the one before it (as checked below)
            if len(ends) <= 1 and s[0] >= (ends[0] if ends else -_INF) \
                    and bool(np.all(s[1:] >= e[:-1])) and bool(np.all(e >= s)):
                ends[:] = [float(e[-1])]
                continue
            if not bool(np.all((s[1:] > s[:-1]) | ((s[1:] == s[:-1]) & (e[1:] >= e[:-1])))):
                group = group[np.lexsort((group, e, s))]  # by start, end and id
                s, e = start_r[group], end_r[group]
            if len(ends) <= 1:  # the usual case: each span after the one before it
                before = np.concatenate(([ends[0] if ends else -_INF], e[:-1]))
                if bool(np.all(s >= before)):
                    ends[:] = [float(e[-1])]
                    continue
            one_track = False
            new = []
            for span, a, b in zip(group.tolist(), s.tolist(), e.tolist()):
                for j, end in enumerate(ends):
                    if a >= end:
                        tid[span] = j + 1
                        ends[j] = b
                        break
                else:
                    ends.append(b)
                    tid[span] = len(ends)
                    if len(ends) > 1:
                        new.append(len(ends))
            for j in new:
                self._write_text("," + json.dumps(
                    {"ph": "M", "name": "thread_name", "pid": self.pid.get(lane, 0), "tid": j,
                     "args": {"name": f"{lane} (overlapping {j - 1})"}},
                    separators=(",", ":")))
        return one_track

    def _slices(self, w, groups, esc, texts, ns, start_r, end_r) -> None:
        """The ``X`` events of the spans of ``groups`` (alike spans:
        :func:`~simwar.plots.perfetto_shape.slice_groups`), a group at a time (``ns``: the
        times in ns, whether they are below 2**43 ns and whether all are above 0)."""
        if not groups:
            return
        sp = w.spans
        start_ns, end_ns, small, positive = ns
        if small:
            # (end - start) of the rounded times, rounded to the ns, is the difference of
            # their ns (the float's error far below half a ns; never -0.0, both times being
            # made from integer ns)
            dur_ns = end_ns - start_ns
        else:
            dur_ns = round_ns(end_r - start_r)
        for p, t, k, c, ph, si, sel, recipe in groups:
            name = name_text(recipe, esc)
            args = f',"kind":"{SPAN_KINDS[k]}"'
            if texts[ph]:
                args += f',"phase":{json_str(texts[ph])}'
            if texts[si]:
                args += f',"site":{json_str(texts[si])}'
            if c != Call.NONE:
                args += f',"call":"{CALLS[c]}"'
            head = ',{"ph":"X","name":"'
            mid = f'","cat":"{SPAN_KINDS[k]}","pid":{p},"tid":{t},"ts":'
            dur = dur_ns[sel]
            ts = start_ns[sel]
            self._write(head, name.inside(), mid,  # (the floats: for a time of 0 ns or less)
                        *number_text(ts, ts if positive else sp.start_us[sel], ',"dur":'),
                        *number_text(dur, dur, ',"args":{"step":'),
                        int_text(sp.step[sel]), args + "}}")

    def _take(self, esc, codes) -> Text:
        codes = np.asarray(codes)
        return Text(esc, np.where(codes >= 0, codes, self._none))

    def _records(self, w, esc, lane_pid, recs) -> None:
        """Record operations as instant events (``recs``: the core's record ops)."""
        ops = w.ops
        ids = recs[ops.start_us[recs] >= 0]
        if self.steps is not None:
            st = ops.step[ids]
            ids = ids[(st >= self.steps[0]) & (st <= self.steps[1])]
        if not len(ids):
            return
        x = ops.start_us[ids]
        ev = self._take(esc, ops.event[ids]).inside()  # its cells made once, taken twice
        pids = lane_pid[ops.lane[ids]]
        self._write(',{"ph":"i","s":"t","name":"record ', ev,
                    '","cat":"record","pid":', int_text(pids), ',"tid":1,"ts":',
                    *number_text(round_ns(x), x, ',"args":{"step":'),
                    int_text(ops.step[ids]), ',"event":"', ev, '"}}')

    # ---- flows
    def _flows(self, w, fl: Flows, esc, pid, tid, ns, start_r, end_r, texts) -> None:
        """The window's flows: the spans they join from ``fl`` (its structure's), their
        times and steps from the window, records and waits carried across windows."""
        sp, ops = w.spans, w.ops
        op_span = fl.op_span

        def inside(spans, at_end) -> np.ndarray:
            """Where a flow binds to a span: just inside its end or start, in integer ns
            (the rounded µs times 1000; the flows' times are carried so)."""
            a, b = start_r[spans], end_r[spans]
            inset = np.minimum(10 ** -TS_DIGITS, (b - a) / 2)
            if isinstance(at_end, bool):  # one end for all: the other is not computed
                return round_ns(b - inset) if at_end else round_ns(a + inset)
            return np.where(at_end, round_ns(b - inset), round_ns(a + inset))

        # times below 2**43 ns: the rounded µs are within far less than half a ns of their
        # integer ns, so a span of 2 ns or more has its flows exactly 1 ns inside it (the
        # inset a µs digit, or half of 2 ns), as ``inside`` computes them
        start_ns, end_ns, exact, _ = ns

        def near(spans, at_end) -> np.ndarray:
            """``inside``, in integer arithmetic where the span is 2 ns or more."""
            if not exact:
                return inside(spans, at_end)
            s, e = start_ns[spans], end_ns[spans]
            out = (e - 1 if at_end else s + 1) if isinstance(at_end, bool) else \
                np.where(at_end, e - 1, s + 1)
            short = (e - s) < 2
            if short.any():
                out[short] = inside(spans[short], at_end if isinstance(at_end, bool)
                                    else at_end[short])
            return out

        def exported(spans) -> np.ndarray:
            st = sp.step[spans]
            return (st >= self.steps[0]) & (st <= self.steps[1])

        # launch: each kernel from the host call that issued it
        src, dst, label, graph = fl.launch_src, fl.launch_dst, fl.launch_label, fl.launch_graph
        if self.steps is not None:
            ok = exported(src) & exported(dst)
            src, dst, label, graph = src[ok], dst[ok], label[ok], graph[ok]
        args = choose(graph, constant(',"graph":true}}', len(graph)),
                      constant(',"graph":false}}', len(graph)))
        self._emit("launch", Text(esc, label), pid[src], tid[src], near(src, True), pid[dst],
                   tid[dst], near(dst, False), sp.step[dst], args)

        # the kernel each record captured: the last one issued on its lane before it;
        # pid, tid, ts (ns), step of the captured kernel
        recs, has, ks = fl.recs, fl.rec_has, fl.rec_kernel
        info = np.full((len(recs), 4), np.nan)
        info[has] = np.stack([pid[ks], tid[ks], near(ks, True), sp.step[ks]], axis=1)
        missing = fl.rec_missing
        if len(missing):  # captured in an earlier window: its lane's last kernel, a lane at
            # a time (a lane without kernels has every record's here)
            lanes = ops.lane[recs[missing]]
            for code in present(lanes).tolist():
                carried = self.last_kernel.get(texts[code])
                if carried is not None:
                    info[missing[lanes == code]] = carried
        rec_ids = recs + w.op_base
        old_ids, old_info = self.records
        keep = old_ids >= w.op_base  # records still in reach (the window's margin)
        all_ids = np.concatenate([old_ids[keep], rec_ids])
        all_info = np.concatenate([old_info[keep], info])
        self.records = (all_ids, all_info)
        # the last kernel of each lane, for the next windows' records
        if fl.last_kernel:
            last = np.asarray([s for _, s in fl.last_kernel], dtype=np.int64)
            ts = near(last, True)
            for (lane_code, s), t in zip(fl.last_kernel, ts):
                self.last_kernel[texts[lane_code]] = (pid[s], tid[s], t, sp.step[s])
        # pending waits whose next kernel is in this window
        for lane, flows in list(self.pending_waits.items()):
            s = fl.first_kernel.get(w.code(lane))
            if s is None:
                continue
            for f in flows:
                if self.steps is None or self.steps[0] <= sp.step[s] <= self.steps[1]:
                    self._emit_one(f, pid[s], tid[s], float(near(np.array([s]), False)[0]))
            del self.pending_waits[lane]

        for kind, cat in ((OpKind.WAIT, "record_wait"), (OpKind.SYNC, "record_sync")):
            users, bound, dst, nk, event = fl.users[kind]
            if not len(users):
                continue
            bound = bound + w.op_base
            where = np.searchsorted(all_ids, bound)
            where = np.minimum(where, len(all_ids) - 1)
            found = all_ids[where] == bound
            src_info = all_info[where]
            ok = found & ~np.isnan(src_info[:, 0])
            users, src_info, dst, nk, event = users[ok], src_info[ok], dst[ok], nk[ok], event[ok]
            later = dst < 0  # a wait that never held its stream: its lane's next kernel
            if kind == OpKind.WAIT and later.any():
                nk = nk[later]
                here = nk >= 0
                idx = np.flatnonzero(later)
                dst[idx[here]] = op_span[nk[here]]
                for i in idx[~here].tolist():  # its next kernel comes in a later window
                    u = users[i]
                    if self._src_exported(src_info[i]):
                        self.pending_waits.setdefault(texts[int(ops.lane[u])], []).append(
                            (cat, texts[int(ops.event[u])], src_info[i], int(ops.step[u])))
            sel = dst >= 0
            if not sel.all():
                users, src_info, dst, event = users[sel], src_info[sel], dst[sel], event[sel]
            if self.steps is not None:
                ok = np.asarray([self._src_exported(r) for r in src_info], dtype=bool)
                ok &= exported(dst)
                users, src_info, dst, event = users[ok], src_info[ok], dst[ok], event[ok]
            held = (sp.kind[dst] == SpanKind.WAIT) | (sp.kind[dst] == SpanKind.BLOCKED)
            event = Text(esc, event)
            args = compose(',"event":"', event, '"}}')
            self._emit(cat, event, src_info[:, 0].astype(np.int64),
                       src_info[:, 1].astype(np.int64), src_info[:, 2], pid[dst], tid[dst],
                       near(dst, held), ops.step[users], args)

    def _src_exported(self, info) -> bool:
        return self.steps is None or self.steps[0] <= info[3] <= self.steps[1]

    def _emit(self, cat, name, sp, st, sts, dp, dt, dts, step, args) -> None:
        """Flow pairs: ``s`` at (sp, st, sts), ``f`` at (dp, dt, dts); args after the step.
        The times are integer ns (``near``'s, in ``_flows``)."""
        n = len(sp)
        if not n:
            return
        ids = int_text(np.arange(self.flow_id + 1, self.flow_id + 1 + n))
        self.flow_id += n
        steps = int_text(step)
        name = name.inside()  # its cells made once for both ends
        for ph, p, t, ts in (("s", sp, st, sts), ("f", dp, dt, dts)):
            ts = np.asarray(ts, dtype=np.int64)  # ns (exact integers when carried as floats)
            self._write(f',{{"ph":"{ph}","id":', ids, f',"cat":"{cat}","name":"',
                        name, '","pid":', int_text(p), ',"tid":', int_text(t), ',"ts":',
                        *number_text(ts, ts, ',"bp":"e","args":{"step":'), steps, args)

    def _emit_one(self, flow, dp: int, dt: int, dts: float) -> None:
        cat, event, info, step = flow
        self.flow_id += 1
        args = {"step": step, "event": event}
        for ph, p, t, ts in (("s", int(info[0]), int(info[1]), float(info[2])),
                             ("f", dp, dt, dts)):
            e = {"ph": ph, "id": self.flow_id, "cat": cat, "name": event, "pid": int(p),
                 "tid": int(t), "ts": ts / 1000.0, "bp": "e", "args": args}
            self._write_text("," + json.dumps(e, separators=(",", ":")))

    def close(self) -> None:
        """Write what is still pending and the end of the file."""
        self.counters.close()
        self._write_text('],"displayTimeUnit":"ms","otherData":' + json.dumps(
            {"generator": "simwar", **self.meta}, separators=(",", ":")) + "}")


class _Counters:
    """``forwards_in_flight`` and ``launch_ahead``, as steps become complete. The steps not
    yet complete are held as arrays (steps ascending), a window's at a time."""

    def __init__(self, writer: ChromeTraceWriter):
        self.w = writer
        # step -> its run_batch time (the last one wins), and its forward's end (so far)
        self.launch = (np.zeros(0, dtype=np.int64), np.zeros(0))
        self.end = (np.zeros(0, dtype=np.int64), np.zeros(0))
        self.pending = (np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))
        self.depth = 0
        self.ends = np.zeros(0)  # forward ends of the final steps with both (the last)
        self.dropped = 0  # ... and how many came before them
        self.sorted = True  # the forward ends come in order (kept whole otherwise)

    def add(self, w, shape: WindowShape) -> None:
        m = w.markers
        core = np.flatnonzero(w.marker_core) if w.marker_core is not None else \
            np.arange(len(m))
        rb = core[m.name[core] == w.code("run_batch")]
        self.launch = _merge(self.launch, m.step[rb].astype(np.int64), m.time_us[rb], None)
        ops = w.ops
        kern = shape.forward_kernels(w, w.code(self.w.forward))
        if len(kern):
            self.end = _merge(self.end, ops.step[kern].astype(np.int64), ops.end_us[kern],
                              np.maximum)
        self._advance(w.complete_below, w.clock)

    def _advance(self, below: float, clock: float) -> None:
        (ls, lt), (es, et) = self.launch, self.end
        nl, ne = int(np.searchsorted(ls, below)), int(np.searchsorted(es, below))  # < below
        a, b = ls[:nl], es[:ne]  # each ascending, each step once
        # the usual case: every step complete here has both (no sort)
        steps = a if np.array_equal(a, b) else np.union1d(a, b)
        launch = np.full(len(steps), np.nan)
        launch[np.searchsorted(steps, ls[:nl])] = lt[:nl]
        end = np.full(len(steps), np.nan)
        end[np.searchsorted(steps, es[:ne])] = et[:ne]
        self.launch, self.end = (ls[nl:], lt[nl:]), (es[ne:], et[ne:])
        both = ~np.isnan(launch) & ~np.isnan(end)
        shown = self.w.steps
        # launch_ahead at each launch: the forwards before it not yet finished (bisect over
        # the ends of the steps before it that have both, as the metric counts)
        has = ~np.isnan(launch)
        before = len(self.ends) + self.dropped + np.cumsum(both) - both  # both-steps < k
        new_ends = end[both]
        if self.sorted and len(new_ends) and (
                (len(self.ends) and new_ends[0] < self.ends[-1])
                or bool(np.any(new_ends[1:] < new_ends[:-1]))):
            self.sorted = False
        ends = np.concatenate([self.ends, new_ends])
        t = launch[has]
        b = before[has]
        if self.sorted:
            found = self.dropped + np.minimum(b - self.dropped,
                                              np.searchsorted(ends, t, side="right"))
            if self.dropped and len(t) and bool(np.any(ends[0] > t)):
                raise RuntimeError("launch-ahead deeper than the export's history")
        else:
            listed = ends.tolist()
            found = np.asarray([bisect.bisect_right(listed[:int(n)], x)
                                for n, x in zip(b.tolist(), t.tolist())], dtype=np.int64)
        pick = np.ones(len(t), dtype=bool) if shown is None else \
            (steps[has] >= shown[0]) & (steps[has] <= shown[1])
        self._write("launch_ahead", "depth", t[pick], (b - found)[pick])
        self.ends = ends
        if self.sorted and len(self.ends) > 2 * _HISTORY:
            cut = len(self.ends) - _HISTORY
            self.dropped += cut
            self.ends = self.ends[cut:].copy()
        # forwards_in_flight: changes in time order (an end before a launch at one time);
        # those before every time still to come are final
        pt, pd, ps = self.pending
        t = np.concatenate([pt, launch[both], end[both]])
        d = np.concatenate([pd, np.ones(int(both.sum()), dtype=np.int64),
                            -np.ones(int(both.sum()), dtype=np.int64)])
        s = np.concatenate([ps, steps[both], steps[both]])
        order = np.lexsort((d, t))
        t, d, s = t[order], d[order], s[order]
        horizon = min(clock, float(self.launch[1].min(initial=_INF)),
                      float(self.end[1].min(initial=_INF)))
        ready = t < horizon
        depth = self.depth + np.cumsum(d[ready])
        if ready.any():
            self.depth = int(depth[-1])
            show = np.ones(int(ready.sum()), dtype=bool) if shown is None else \
                (s[ready] >= shown[0]) & (s[ready] <= shown[1])
            self._write("forwards_in_flight", "forwards", t[ready][show], depth[show])
        self.pending = (t[~ready], d[~ready], s[~ready])

    def _write(self, name: str, arg: str, t: np.ndarray, v: np.ndarray) -> None:
        if not len(t):
            return
        self.w._write(f',{{"ph":"C","name":"{name}","pid":{HOST_PID},"tid":0,"ts":',
                      *number_text(round_ns(t), t, f',"args":{{"{arg}":'), int_text(v), "}}")

    def close(self) -> None:
        self._advance(_INF, _INF)


def _merge(held: tuple, steps: np.ndarray, values: np.ndarray, combine) -> tuple:
    """Per-step values ``held`` (steps ascending) and new ones, as arrays by step ascending:
    a step given more than once keeps its last value (``combine`` None) or ``combine`` of
    them all (``np.maximum``)."""
    hs, hv = held
    s = np.concatenate([hs, steps])
    v = np.concatenate([hv, values.astype(np.float64)])
    if not len(s) or bool(np.all(s[1:] > s[:-1])):  # ascending, each once: the usual case
        return s, v
    order = np.argsort(s, kind="stable")
    s, v = s[order], v[order]
    firsts = np.r_[True, s[1:] != s[:-1]]
    if combine is None:  # the last of each run of equal steps
        return s[np.r_[firsts[1:], True]], v[np.r_[firsts[1:], True]]
    at = np.flatnonzero(firsts)
    return s[at], combine.reduceat(v, at)


# --------------------------------------------------------------------------- entry points
def _lanes_of(trace: Trace) -> list[str]:
    codes = np.union1d(np.unique(trace.spans.lane), np.unique(trace.ops.lane))
    return [trace.text(int(c)) for c in codes]


def chrome_trace(trace: Trace) -> dict:
    """The trace as a Chrome trace-event JSON object (see the module docstring)."""
    out = io.BytesIO()
    writer = ChromeTraceWriter(out, _lanes_of(trace), trace.meta)
    writer.add(trace)
    writer.close()
    return json.loads(out.getvalue())


def write_chrome_trace(trace: Trace, path: str | Path,
                       steps: tuple[int, int] | None = None) -> Path:
    """Write :func:`chrome_trace` as JSON (``.json``; Perfetto also reads ``.json.gz``);
    ``steps`` (A, B): steps A..B only."""
    return write_run([trace], _lanes_of(trace), trace.meta, path, steps)


def write_run(windows, lanes, meta: dict, path: str | Path,
              steps: tuple[int, int] | None = None, progress=None) -> Path:
    """Write a run's windows as they come (``.gz``: gzipped); nothing is left of the file
    when this fails or is interrupted (:func:`simwar.core.files.atomic_file`).
    ``progress(steps_done)``: called after each window with the steps written so far (its
    last step + 1; the CLI's bar on a terminal)."""
    with run_writer(lanes, meta, path, steps) as take:
        for w in windows:
            take(w)
            if progress is not None:
                step = window_of(w).spans.step
                if len(step):
                    progress(int(step.max()) + 1)
    return Path(path)


@contextlib.contextmanager
def run_writer(lanes, meta: dict, path: str | Path, steps: tuple[int, int] | None = None):
    """The file of :func:`write_run`, its windows handed to the callable this gives as
    they are made (a run's pass: :func:`simwar.cli.outputs.traced_run`); the file is
    whole at a normal end, and nothing is left of it after a failure or an interrupt."""
    path = Path(path)
    # past the page cache where the file system takes it (the same bytes, less CPU)
    with atomic_file(path) as handle, direct_writes(handle) as out:
        gz = gzip.GzipFile(filename=path.name, mode="wb", fileobj=out) \
            if path.suffix == ".gz" else None
        writer = ChromeTraceWriter(gz or out, lanes, meta, steps)
        yield writer.add
        writer.close()
        if gz is not None:
            gz.close()
