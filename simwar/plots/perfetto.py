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
as blocks of fixed-width rows copied column by column (:mod:`simwar.plots.jsoncols`:
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
import gzip
import io
import json
from pathlib import Path

import numpy as np

from simwar.analysis.views import ordered_lanes
from simwar.core.files import atomic_file, check_interrupt
from simwar.core.run_meta import RunMeta
from simwar.core.trace import CALLS, HOST, SPAN_KINDS, Call, OpKind, SpanKind, Trace, window_of
from simwar.plots.jsoncols import (
    TS_DIGITS,
    Text,
    choose,
    compose,
    constant,
    dense,
    escaped,
    group_order,
    int_text,
    json_str,
    number_text,
    present,
    round_ns,
    rows,
)

__all__ = ["ChromeTraceWriter", "chrome_trace", "write_chrome_trace", "write_run"]

HOST_PID = 1
_INF = float("inf")
_HISTORY = 4096  # forward ends kept for the launch-ahead counter


# --------------------------------------------------------------------------- the writer
class ChromeTraceWriter:
    """Writes Chrome trace-event JSON to ``handle`` (binary) as windows of a run come.

    ``lanes``: every lane of the run (the processes, in display order); ``meta``: the run's
    (``otherData``); ``steps`` (A, B): export the spans, records, flows and counter samples
    of steps A..B only. :meth:`add` each window in order, then :meth:`close`.
    """

    def __init__(self, handle, lanes, meta: dict, steps: tuple[int, int] | None = None):
        self.out = handle
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

    def _write(self, block: np.ndarray) -> None:
        """Write a block of event rows (:func:`~simwar.plots.jsoncols.rows`; each row begins
        with its comma)."""
        if block.size:
            self.out.write(memoryview(np.ascontiguousarray(block)).cast("B"))

    # ---- one window
    def add(self, window) -> None:
        """Write the events of one window (a Trace is a window of itself)."""
        w = window_of(window)
        check_interrupt()  # a long export stops at the next window after Ctrl-C
        sp, ops = w.spans, w.ops
        texts = w.strings + [""]
        esc = escaped(texts)
        lane_pid = np.zeros(len(texts), dtype=np.int64)
        for c in np.union1d(present(sp.lane), present(ops.lane)).tolist():
            lane_pid[c] = self.pid.get(texts[c], 0)
        self._none = len(texts) - 1  # the code of "" in ``esc`` for a code of -1
        self._empty = w.code("")
        core = np.flatnonzero(w.span_core) if w.span_core is not None else np.arange(len(sp))
        start_ns, end_ns = round_ns(sp.start_us), round_ns(sp.end_us)
        start_r, end_r = start_ns / 1000.0, end_ns / 1000.0
        pid = lane_pid[sp.lane]
        tid = np.ones(len(sp), dtype=np.int64)
        self._tracks(w, core, start_r, end_r, tid, texts)
        keep = core if self.steps is None else core[(sp.step[core] >= self.steps[0])
                                                   & (sp.step[core] <= self.steps[1])]
        self._slices(w, keep, esc, pid, tid, start_ns, end_ns, start_r, end_r)
        self._records(w, esc, lane_pid)
        self.counters.add(w)
        self._flows(w, esc, pid, tid, start_r, end_r, texts)

    def _tracks(self, w, core, start_r, end_r, tid, texts) -> None:
        """Each core span's track: the first of its lane's tracks it fits after (greedy over
        the lane's spans by start, end and id), carried from window to window."""
        sp = w.spans
        lanes = sp.lane[core]
        for code in present(lanes).tolist():  # a few lanes: a pass each, no sort
            group = core[lanes == code]
            s, e = start_r[group], end_r[group]
            if not bool(np.all((s[1:] > s[:-1]) | ((s[1:] == s[:-1]) & (e[1:] >= e[:-1])))):
                group = group[np.lexsort((group, e, s))]  # by start, end and id
                s, e = start_r[group], end_r[group]
            lane = texts[code]
            ends = self.tracks.setdefault(lane, [])
            if len(ends) <= 1:  # the usual case: each span after the one before it
                before = np.r_[ends[0] if ends else -_INF, e[:-1]]
                if bool(np.all(s >= before)):
                    ends[:] = [float(e[-1])]
                    continue
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

    def _slices(self, w, ids, esc, pid, tid, start_ns, end_ns, start_r, end_r) -> None:
        """The ``X`` events of spans ``ids``, a group of alike spans at a time."""
        if not len(ids):
            return
        sp = w.spans
        kind, call = sp.kind[ids], sp.call[ids]
        phase, site = sp.phase[ids], sp.site[ids]
        # one small integer per alike group: the fields combined, made dense
        fields = [pid[ids], tid[ids], kind.astype(np.int64), call.astype(np.int64),
                  dense(phase), dense(site)]
        key = np.zeros(len(ids), dtype=np.int64)
        for values in fields:
            key = key * (int(values.max()) + 1) + values
        key = dense(key)
        order = group_order(key)
        cuts = np.flatnonzero(np.diff(key[order])) + 1
        first = order[np.r_[0, cuts]]
        groups = np.stack([pid[ids][first], tid[ids][first], kind[first], call[first],
                           phase[first], site[first]], axis=1)
        end_ns, begin_ns = end_ns[ids], start_ns[ids]
        if max(int(end_ns.max()), -int(end_ns.min()), int(begin_ns.max()),
               -int(begin_ns.min())) < 2 ** 43:
            # (end - start) of the rounded times, rounded to the ns, is the difference of
            # their ns (the float's error far below half a ns; never -0.0, both times being
            # made from integer ns)
            dur_ns_all = end_ns - begin_ns
        else:
            dur_ns_all = round_ns(end_r[ids] - start_r[ids])
        texts = w.strings + [""]
        for g, part in zip(groups.tolist(), np.split(order, cuts)):
            p, t, k, c, ph, si = g
            sel = ids[part]
            name = self._name_of(w, sel, k, c, esc)
            args = f',"kind":"{SPAN_KINDS[k]}"'
            if texts[ph]:
                args += f',"phase":{json_str(texts[ph])}'
            if texts[si]:
                args += f',"site":{json_str(texts[si])}'
            if c != Call.NONE:
                args += f',"call":"{CALLS[c]}"'
            head = ',{"ph":"X","name":"'
            mid = f'","cat":"{SPAN_KINDS[k]}","pid":{p},"tid":{t},"ts":'
            self._write(rows(head, name.inside(), mid,
                             *number_text(start_ns[sel], sp.start_us[sel], ',"dur":'),
                             *number_text(dur_ns_all[part], dur_ns_all[part],
                                          ',"args":{"step":'),
                             int_text(sp.step[sel]), args + "}}"))

    def _take(self, esc, codes) -> Text:
        codes = np.asarray(codes)
        return Text(esc, np.where(codes >= 0, codes, self._none))

    def _name_of(self, w, rows, kind: int, call: int, esc) -> Text:
        """The slice names of spans ``rows`` (all of one kind and call kind): host calls by
        their call kind, label and op's lane, waits by what they wait for, others' labels."""
        sp, ops = w.spans, w.ops
        label = sp.label[rows]
        if call in (Call.WAIT_EVENT, Call.WAIT_STREAM, Call.RECORD, Call.SYNCHRONIZE):
            op = sp.op[rows]
            has = op >= 0
            safe = np.where(has, op, 0)
            event = np.where(has, ops.event[safe], -1)
            named = (event >= 0) & (event != self._empty)
            event_or_label = np.where(named, event, label)
            if call in (Call.WAIT_STREAM, Call.WAIT_EVENT):
                lane = self._take(esc, np.where(has, ops.lane[safe], -1))
                lane_text = choose(has, lane, constant("?", len(rows)))
                if call == Call.WAIT_STREAM:
                    return compose(lane_text, ".wait_stream(", self._take(esc, label), ")")
                return compose(lane_text, ".wait_event(", self._take(esc, event_or_label), ")")
            word = "record " if call == Call.RECORD else "sync "
            return compose(word, self._take(esc, event_or_label))
        if call == Call.NONE and kind == SpanKind.WAIT:
            op = sp.op[rows]
            has = op >= 0
            safe = np.where(has, op, 0)
            c = np.where(has, ops.call[safe], -1)
            by_stream = (c >= 0) & (sp.call[np.maximum(c, 0)] == Call.WAIT_STREAM)
            ev = ops.event[safe]
            what = np.where(by_stream, sp.label[np.maximum(c, 0)],
                            np.where((ev >= 0) & (ev != self._empty), ev, ops.label[safe]))
            named = compose("wait for ", self._take(esc, what))
            return choose(has, named, self._take(esc, label))
        return self._take(esc, label)

    def _records(self, w, esc, lane_pid) -> None:
        ops = w.ops
        ids = np.arange(w.core_op, len(ops))
        ids = ids[(ops.kind[ids] == OpKind.RECORD) & (ops.start_us[ids] >= 0)]
        if self.steps is not None:
            st = ops.step[ids]
            ids = ids[(st >= self.steps[0]) & (st <= self.steps[1])]
        if not len(ids):
            return
        x = ops.start_us[ids]
        ev = self._take(esc, ops.event[ids]).inside()  # its cells made once, taken twice
        pids = lane_pid[ops.lane[ids]]
        self._write(rows(',{"ph":"i","s":"t","name":"record ', ev,
                         '","cat":"record","pid":', int_text(pids), ',"tid":1,"ts":',
                         *number_text(round_ns(x), x, ',"args":{"step":'),
                         int_text(ops.step[ids]), ',"event":"', ev, '"}}'))

    # ---- flows
    def _flows(self, w, esc, pid, tid, start_r, end_r, texts) -> None:
        sp, ops = w.spans, w.ops
        n = len(ops)
        core = np.arange(w.core_op, n)
        op_span = np.full(n, -1, dtype=np.int64)
        kinds = sp.kind
        dev = np.flatnonzero((sp.op >= 0) & ((kinds == SpanKind.KERNEL) | (kinds == SpanKind.WAIT)
                                             | (kinds == SpanKind.BLOCKED)))
        op_span[sp.op[dev][::-1]] = dev[::-1]  # the first span of an op wins

        def near(spans, at_end) -> np.ndarray:
            """Where a flow binds to a span: just inside its end or start, in integer ns
            (the rounded µs times 1000; the flows' times are carried so)."""
            a, b = start_r[spans], end_r[spans]
            inset = np.minimum(10 ** -TS_DIGITS, (b - a) / 2)
            if isinstance(at_end, bool):  # one end for all: the other is not computed
                return round_ns(b - inset) if at_end else round_ns(a + inset)
            return np.where(at_end, round_ns(b - inset), round_ns(a + inset))

        def exported(spans) -> np.ndarray:
            if self.steps is None:
                return np.ones(len(spans), dtype=bool)
            st = sp.step[spans]
            return (st >= self.steps[0]) & (st <= self.steps[1])

        # launch: each kernel from the host call that issued it
        kern = core[(ops.kind[core] == OpKind.KERNEL) & (ops.call[core] >= 0)]
        kern = kern[op_span[kern] >= 0]
        src, dst = ops.call[kern], op_span[kern]
        ok = exported(src) & exported(dst)
        src, dst = src[ok], dst[ok]
        graph = sp.call[src] == Call.GRAPH_LAUNCH
        name = self._take(esc, sp.label[src])
        args = choose(graph, constant(',"graph":true}}', len(graph)),
                      constant(',"graph":false}}', len(graph)))
        self._emit("launch", name, pid[src], tid[src], near(src, True), pid[dst], tid[dst],
                   near(dst, False), sp.step[dst], args)

        # the kernel each record captured: the last one issued on its lane before it
        neighbours = _KernelNeighbours(ops, core)
        recs = core[ops.kind[core] == OpKind.RECORD]
        # pid, tid, ts (ns), step of the captured kernel
        info = np.full((len(recs), 4), np.nan)
        local = neighbours.before(recs)
        has = local >= 0
        ks = op_span[local[has]]
        info[has] = np.stack([pid[ks], tid[ks], near(ks, True), sp.step[ks]], axis=1)
        for i in np.flatnonzero(~has).tolist():
            carried = self.last_kernel.get(texts[int(ops.lane[recs[i]])])
            if carried is not None:
                info[i] = carried
        rec_ids = recs + w.op_base
        old_ids, old_info = self.records
        keep = old_ids >= w.op_base  # records still in reach (the window's margin)
        all_ids = np.concatenate([old_ids[keep], rec_ids])
        all_info = np.concatenate([old_info[keep], info])
        self.records = (all_ids, all_info)
        # the last kernel of each lane, for the next windows' records
        for lane_code in np.unique(ops.lane[core]).tolist():
            on = core[(ops.lane[core] == lane_code) & (ops.kind[core] == OpKind.KERNEL)]
            if len(on):
                s = op_span[on[-1]]
                self.last_kernel[texts[lane_code]] = (pid[s], tid[s], near(np.array([s]),
                                                                          True)[0], sp.step[s])
        # pending waits whose next kernel is in this window
        for lane, flows in list(self.pending_waits.items()):
            on = core[(ops.kind[core] == OpKind.KERNEL) & (ops.lane[core] == w.code(lane))]
            if not len(on):
                continue
            s = op_span[on[0]]
            for f in flows:
                if self.steps is None or self.steps[0] <= sp.step[s] <= self.steps[1]:
                    self._emit_one(f, pid[s], tid[s], float(near(np.array([s]), False)[0]))
            del self.pending_waits[lane]

        for kind, cat in ((OpKind.WAIT, "record_wait"), (OpKind.SYNC, "record_sync")):
            users = core[(ops.kind[core] == kind) & (ops.bound[core] >= 0)]
            if not len(users):
                continue
            where = np.searchsorted(all_ids, ops.bound[users] + w.op_base)
            where = np.minimum(where, len(all_ids) - 1)
            found = all_ids[where] == ops.bound[users] + w.op_base
            src_info = all_info[where]
            ok = found & ~np.isnan(src_info[:, 0])
            users, src_info = users[ok], src_info[ok]
            dst = op_span[users]
            later = dst < 0  # a wait that never held its stream: its lane's next kernel
            if kind == OpKind.WAIT and later.any():
                nk = neighbours.after(users[later])
                here = nk >= 0
                idx = np.flatnonzero(later)
                dst[idx[here]] = op_span[nk[here]]
                for i in idx[~here].tolist():  # its next kernel comes in a later window
                    u = users[i]
                    if self._src_exported(src_info[i]):
                        self.pending_waits.setdefault(texts[int(ops.lane[u])], []).append(
                            (cat, texts[int(ops.event[u])], src_info[i], int(ops.step[u])))
            sel = dst >= 0
            users, src_info, dst = users[sel], src_info[sel], dst[sel]
            ok = np.asarray([self._src_exported(r) for r in src_info], dtype=bool) \
                if self.steps is not None else np.ones(len(users), dtype=bool)
            ok &= exported(dst)
            users, src_info, dst = users[ok], src_info[ok], dst[ok]
            held = (sp.kind[dst] == SpanKind.WAIT) | (sp.kind[dst] == SpanKind.BLOCKED)
            event = self._take(esc, ops.event[users])
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
            ts = np.asarray(ts).astype(np.int64)  # ns (exact integers when carried as floats)
            self._write(rows(f',{{"ph":"{ph}","id":', ids, f',"cat":"{cat}","name":"',
                             name, '","pid":', int_text(p), ',"tid":',
                             int_text(t), ',"ts":',
                             *number_text(ts, ts, ',"bp":"e","args":{"step":'),
                             steps,
                             args))

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


class _KernelNeighbours:
    """The kernel ops of each lane among the core ops ``core`` (ascending op ids), to find
    an op's neighbours on its lane: the last kernel issued before it and the first after it
    (-1: none). Only the ops asked about are looked up (records, and waits that never held
    their stream: a few per step)."""

    def __init__(self, ops, core: np.ndarray):
        self.lane = ops.lane
        self.span = len(ops) + 1  # lane * span + op id: by lane, then by op id
        kernels = core[ops.kind[core] == OpKind.KERNEL]
        keys = self.lane[kernels].astype(np.int64) * self.span + kernels
        self.keys = keys[group_order(self.lane[kernels])]  # ascending: ids ascend per lane
        self.kernels = self.keys % self.span

    def _at(self, ops: np.ndarray, shift: int) -> np.ndarray:
        if not len(self.keys):
            return np.full(len(ops), -1, dtype=np.int64)
        key = self.lane[ops].astype(np.int64) * self.span + ops
        i = np.searchsorted(self.keys, key) + shift  # the kernel just before or after it
        ok = (i >= 0) & (i < len(self.keys))
        i = np.where(ok, i, 0)
        ok &= self.keys[i] // self.span == key // self.span  # ... on its own lane
        return np.where(ok, self.kernels[i], -1)

    def before(self, ops: np.ndarray) -> np.ndarray:
        """Per op, the last kernel op issued on its lane before it."""
        return self._at(np.asarray(ops, dtype=np.int64), -1)

    def after(self, ops: np.ndarray) -> np.ndarray:
        """Per op (none a kernel), the first kernel op issued on its lane after it."""
        return self._at(np.asarray(ops, dtype=np.int64), 0)


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

    def add(self, w) -> None:
        m = w.markers
        core = np.flatnonzero(w.marker_core) if w.marker_core is not None else \
            np.arange(len(m))
        rb = core[m.name[core] == w.code("run_batch")]
        self.launch = _merge(self.launch, m.step[rb].astype(np.int64), m.time_us[rb], None)
        ops = w.ops
        fwd = w.code(self.w.forward)
        ids = np.arange(w.core_op, len(ops))
        kern = ids[(ops.kind[ids] == OpKind.KERNEL) & (ops.lane[ids] == fwd)
                   & (ops.phase[ids] != w.code(""))]
        if len(kern):
            self.end = _merge(self.end, ops.step[kern].astype(np.int64), ops.end_us[kern],
                              np.maximum)
        self._advance(w.complete_below, w.clock)

    def _advance(self, below: float, clock: float) -> None:
        (ls, lt), (es, et) = self.launch, self.end
        nl, ne = int(np.searchsorted(ls, below)), int(np.searchsorted(es, below))  # < below
        steps = np.union1d(ls[:nl], es[:ne])
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
        self.w._write(rows(f',{{"ph":"C","name":"{name}","pid":{HOST_PID},"tid":0,"ts":',
                           *number_text(round_ns(t), t, f',"args":{{"{arg}":'), int_text(v),
                           "}}"))

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
    path = Path(path)
    with atomic_file(path) as handle:
        gz = gzip.GzipFile(filename=path.name, mode="wb", fileobj=handle) \
            if path.suffix == ".gz" else None
        writer = ChromeTraceWriter(gz or handle, lanes, meta, steps)
        for w in windows:
            writer.add(w)
            if progress is not None:
                step = window_of(w).spans.step
                if len(step):
                    progress(int(step.max()) + 1)
        writer.close()
        if gz is not None:
            gz.close()
    return path
