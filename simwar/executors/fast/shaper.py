"""Iteration shapes: a segment's host ops read into its structure (hashable) and parameters.

- :class:`DeviceOp`, :class:`Shape`: the structure of one *segment* (the host ops from one step
  marker to the next: one scheduler iteration), with each wait's and sync's binding resolved
  as "record ``i`` of the segment ``d`` back";
- ``_Shaper``: makes them from host ops, in program order; ``_segments`` cuts a program at its
  step markers;
- :class:`ShapeMemo`: what the shaper read of a family's ops, for its members (configs that
  differ only in where a record goes: ``advise``'s families), read once.

:mod:`simwar.executors.fast.plan` groups shapes into blocks and plans (and re-exports these).

Imports: simwar.core and the plan's records (:mod:`simwar.executors.fast.records`); must not
import the executor's other parts.
"""

from __future__ import annotations

from simwar.builder.draws import Sum, Use
from simwar.core.frozen import MutableRecord
from simwar.core.kinds import Mode, OpKind
from simwar.core.program import (
    Collective,
    CpuWork,
    GraphLaunch,
    GraphRecord,
    HostCollective,
    Launch,
    Marker,
    Record,
    StepMarker,
    Synchronize,
    WaitEvent,
    WaitStream,
)
from simwar.core.refusals import PlanRefused
from simwar.executors.fast.records import MARKS, SyncBinding, device_ops, host_records


class RanksOnly(PlanRefused):
    """A tensor-parallel collective (a host collective, or a collective kernel of a graph):
    the fast executor's plans run one rank; its ranks run in :mod:`simwar.executors.fast.ranks`
    (the choice table refuses tensor-parallel configs before planning, so this is what a
    Program built by hand meets)."""


class DeviceOp(MutableRecord):
    """One device-visible op of a shape, in issue order (its op id is base + index)."""

    _fields = ("kind", "lane", "off", "label", "phase", "accesses", "bind", "bound_op", "coll")

    def __init__(self, kind: int, lane: str, off: int, label: str = "", phase: str = "",
                 accesses: tuple = (), bind: SyncBinding | None = None,
                 bound_op: int | None = None, coll: str = ""):
        self.kind = kind  # OpKind
        self.lane = lane
        self.off = off  # step offset from the segment's step
        self.label = label
        self.phase = phase
        self.accesses = accesses  # ((buffer, Mode), ...) in the engine's order: reads, writes
        self.bind = bind  # waits and syncs (None: bound to nothing)
        self.bound_op = bound_op  # a wait_stream's wait: the device op index of its record
        #: a collective's (tensor-parallel ranks): "host" (a host collective, the sync op the
        #: engine records for it) or "device" (a collective kernel); "" for every other op
        self.coll = coll


class Shape:
    """The structure of one segment, hashable; ``params`` slots are filled per segment.

    ``host`` lists the host operations as tuples (see :meth:`_Shaper.segment`); ``ops`` the
    device ops they issue; ``records`` maps a record index to its device op index.
    """

    __slots__ = ("host", "ops", "records", "nparams", "_hash")

    def __init__(self, host: tuple, ops: list[DeviceOp], records: list[int], nparams: int):
        self.host = host
        self.ops = ops
        self.records = records
        self.nparams = nparams
        self._hash = hash(host)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other) -> bool:
        return isinstance(other, Shape) and self.host == other.host


def _accesses(k) -> tuple:
    return tuple((b, Mode.READ) for b in k.reads) + tuple((b, Mode.WRITE) for b in k.writes)


class _Shaper:
    """Turns segments (lists of host ops) into shapes and parameter lists, in program order.

    Bindings are resolved across segments as the engine resolves them at the host call:
    a wait or sync binds to the most recent record of its event issued before it.

    A segment's host tuple (its structure) and parameters are read in one pass; its device
    ops are built only for a structure not seen before (shapes are kept by host tuple), so
    a program of many alike iterations costs little more than reading its ops. For the same
    reason each host op is read into a plain tuple in its record's field order
    (:data:`HOST_RECORDS`; a NamedTuple costs several times a tuple to make, per op of the
    program): equal to, and hashed as, the records a new shape is then made of
    (:func:`host_records`).
    """

    def __init__(self, symbolic: bool = False, ranks: bool = False,
                 memo: ShapeMemo | None = None, store: bool = False) -> None:
        # symbolic: parameters may be draws and references to config keys (plan_template),
        # which must never be compared (a traced reference records the comparison)
        self.symbolic = symbolic
        # memo: what a family's first plan read of its ops (ShapeMemo), looked up by the
        # other members' plans (whose iterations are the same op objects but one moved
        # record); store: this plan's ops go into it
        self.memo = memo
        self.store = store
        self.keys: list = []  # with a memo: the last segment's parameters as _template's
        # ranks: collectives are shaped (a lockstep over tensor-parallel ranks), not refused
        self.ranks = ranks
        self.latest: dict[str, tuple[int, int, str]] = {}  # event -> (segment, record, lane)
        self.negative = False  # a negative number was seen (the overlap shortcut needs >= 0)
        self.offsets: set[int] = set()  # step offsets of accesses
        self.shapes: dict[tuple, Shape] = {}
        self._acc: dict[tuple, tuple] = {}  # (reads, writes) -> accesses

    def _access(self, k) -> tuple:
        key = (k.reads, k.writes)
        acc = self._acc.get(key)
        if acc is None:
            acc = self._acc[key] = _accesses(k)
        return acc

    def _below(self, params) -> bool:
        """Whether a parameter is a number below 0."""
        if self.symbolic:  # only numbers count
            return any(isinstance(x, (int, float)) and x < 0 for x in params)
        return min(params, default=0) < 0  # a Program's: numbers only, compared in C

    def segment(self, g: int, base: int, ops) -> tuple[Shape, list]:
        memo = self.memo
        parts = None  # a spliced segment's parts (ShapeMemo.build)
        if memo is None:
            host, params = self._read(g, base, ops)
            if not self.negative:
                self.negative = self._below(params)
            events = None
        else:  # a family's: read once for its first, spliced for the others
            spliced = None if self.store else memo.splice(self, g, base, ops)
            if spliced is None:
                if self.store:
                    memo.keep(self, base, ops)
                host, params = self._read(g, base, ops)
                self.keys = _template(params)
                self.negative = self.negative or self._below(params)
                events = _events(ops)
            else:
                host, params, self.keys, events, parts = spliced
        key = tuple(host)  # equal to, and hashed as, the shape's records
        shape = self.shapes.get(key)
        if shape is None:
            if memo is not None:  # a family's members share their equal shapes
                shape = memo.shapes.get((key, events))
            if shape is None:
                if memo is None:
                    named = host_records(key)
                    dev, records = _devices(named, ops)
                elif parts is None:
                    named = memo.records(key)
                    dev, records = _devices(named, ops, memo.kernels)
                else:  # spliced as its host tuples were
                    named, dev, records = memo.build(base, parts)
                shape = Shape(named, dev, records, len(params))
                if memo is not None:
                    memo.shapes[(key, events)] = shape
            self.shapes[key] = shape
        return shape, params

    def _read(self, g: int, base: int, ops, bounds: list | None = None) -> tuple[list, list]:
        """A segment's host tuples and parameters (``bounds``: gets, after each op, how many
        of each there are so far)."""
        host: list[tuple] = []
        params: list = []
        latest = self.latest
        nrec = 0  # records of this segment so far
        add, num = host.append, params.append
        access = self._access
        offsets = self.offsets
        for op in ops:
            kind = type(op)
            if kind is CpuWork:
                add(("cpu",))
                num(op.duration_us)
            elif kind is Launch:
                k = op.kernel
                off = op.step - base
                acc = access(k)
                add(("launch", op.stream, off, k.label, k.phase, acc))
                num(op.host_us)
                num(k.duration_us)
                if acc:
                    offsets.add(off)
            elif kind is GraphLaunch:
                off = op.step - base
                nodes = []
                num(op.host_us)
                stream = op.stream
                for node in op.nodes:
                    if type(node) is GraphRecord:
                        nodes.append(("r",))
                        latest[node.event] = (g, nrec, stream)
                        nrec += 1
                    elif type(node) is Collective:
                        if self.ranks:  # a lockstep over ranks (executors/lockstep/ranks.py)
                            nodes.append(("c", node.label, node.phase))
                            num(node.duration_us)
                            continue
                        raise RanksOnly(f"a Collective node ({node.label}) of graph {op.graph}: "
                                        f"the fast executor's plans run one rank")
                    else:
                        acc = access(node)
                        nodes.append(("k", node.label, node.phase, acc))
                        num(node.duration_us)
                        if acc:
                            offsets.add(off)
                add(("graph", stream, off, tuple(nodes)))
            elif kind is Record:
                off = op.step - base
                add(("record", op.stream, off))
                num(op.host_us)
                latest[op.event] = (g, nrec, op.stream)
                nrec += 1
            elif kind is WaitStream:
                add(("wait_stream", op.stream, op.other, op.step - base))
                num(op.host_us)
                num(op.latency_us)
            elif kind is WaitEvent:
                b = latest.get(op.event)
                add(("wait_event", op.stream, op.step - base,
                     None if b is None else (g - b[0], b[1], b[2] == op.stream)))
                num(op.host_us)
                num(op.latency_us)
            elif kind is Synchronize:
                b = latest.get(op.event)
                add(("sync", op.step - base, op.site, None if b is None else (g - b[0], b[1])))
                num(op.host_us)
                num(op.wake_us)
            elif kind is Marker:
                if op.name in MARKS:
                    add((op.name, op.step - base))
            elif kind is StepMarker:
                pass
            elif kind is HostCollective:
                if self.ranks:  # its site: its name, as the engine records it
                    add(("hcoll", op.step - base, op.name))
                    num(op.cost_us)
                    num(op.wake_us)
                else:
                        raise RanksOnly(f"a HostCollective ({op.name}): the fast executor's plans "
                                    f"run one rank")
            else:
                raise TypeError(f"unknown host op {op!r}")
            if bounds is not None:
                bounds.append((len(host), len(params)))
        return host, params

    def _below(self, params) -> bool:
        """Whether a parameter is a number below 0."""
        if self.symbolic:  # only numbers count
            return any(isinstance(x, (int, float)) and x < 0 for x in params)
        return min(params, default=0) < 0  # a Program's: numbers only, compared in C


def _placed(op) -> bool:
    """Whether a host op is, or binds to, a record (what a family's members move): its host
    tuple depends on the records before it."""
    kind = type(op)
    return kind in _PLACED or (kind is GraphLaunch
                               and any(type(n) is GraphRecord for n in op.nodes))


def _with_node(op, first) -> bool:
    """Whether ``op`` is the first's graph launch ``first`` given in-graph record nodes (a
    member whose read-done is such a node: :mod:`simwar.builder.moves`)."""
    return (type(op) is GraphLaunch and type(first) is GraphLaunch and _placed(op)
            and (op.stream, op.graph, op.step, op.phase, op.host_us)
            == (first.stream, first.graph, first.step, first.phase, first.host_us)
            and tuple(x for x in op.nodes if type(x) is not GraphRecord) == first.nodes)


def _events(ops) -> tuple:
    """The events of a segment's records, waits and syncs (its shape's device ops name them;
    its host tuples do not)."""
    return tuple(op.event if type(op) is not GraphLaunch else
                 tuple(n.event for n in op.nodes if type(n) is GraphRecord)
                 for op in ops if _placed(op))


#: host ops whose host tuple depends on the records before them (a member moves one)
_PLACED = frozenset({Record, WaitEvent, Synchronize})


class ShapeMemo:
    """A family's first plan's segments, read apart, for its other members
    (:func:`plan_template`'s ``memo``).

    A member's iterations are the first's op objects with one record moved
    (:mod:`simwar.builder.moves`; a member whose record is an in-graph node has, in place
    of one of the first's graph launches, that launch with the node, which is its own op
    here). An op that neither is nor binds to a record (*pure*: a
    launch, a graph without record nodes, CPU work, a stream wait, a marker) gives the same
    host tuple and parameters wherever it is, and reading a record, wait or sync depends
    only on the records before it. So the first's segment is kept as its pure ops' host
    tuples, parameters, their :func:`_template` keys, access offsets and sign, read once
    (:meth:`keep`), and a member's segment is those spliced around its own records, waits
    and syncs, read by the member's shaper in order (:meth:`splice`): what reading the
    member's whole segment gives (the tests hold the two plans equal for every candidate
    of the shipped configs and the benchmark). The members' equal shapes (equal host
    tuples and record, wait and sync events) are one object, and a member's new shape is
    spliced too: its records and device ops are the first's pure ops', made once, around its
    own (:meth:`build`).
    """

    def __init__(self) -> None:
        self.kept: dict = {}  # segment's base -> the pure ops' reading (see keep)
        self.shapes: dict = {}  # (host tuple, events) -> Shape
        self.kernels: dict = {}  # a launched kernel's device op, by what it is made of
        self._named: dict = {}  # host tuple -> its record
        self._devs: dict = {}  # segment's base -> its pure ops' records and device ops
        self._shifted: dict = {}  # (base, device op, shift) -> a stream wait's wait moved

    def keep(self, shaper: _Shaper, base: int, ops) -> None:
        """Read the pure ops of the first's segment at ``base`` apart (a shaper of its own:
        they touch no record)."""
        pure = [op for op in ops if not _placed(op)]
        own = _Shaper(symbolic=shaper.symbolic, ranks=shaper.ranks)
        bounds: list = [(0, 0)]
        host, params = own._read(base, base, pure, bounds)
        self.kept[base] = (pure, host, params, _template(params), bounds, own.offsets,
                           own._below(params))

    def splice(self, shaper: _Shaper, g: int, base: int, ops):
        """``(host, params, keys, events)`` of a member's segment from the first's (None
        where its ops are not the first's pure ops, in order, around records, waits and
        syncs)."""
        kept = self.kept.get(base)
        if kept is None:
            return None
        pure, host0, params0, keys0, bounds0, offsets, negative = kept
        # the member's own ops (each with the first's pure ops before it, and whether it
        # takes the place of the next: a graph launch given an in-graph record node), the
        # first's pure ops around them
        at: list[tuple[int, int, bool]] = []
        q, n = 0, len(pure)
        for j, op in enumerate(ops):
            if q < n and op is pure[q]:
                q += 1
            elif q < n and _with_node(op, pure[q]):
                at.append((j, q, True))
                q += 1
            else:
                at.append((j, q, False))
        placed = [ops[j] for j, _, _ in at]
        if q != n or not all(map(_placed, placed)):
            return None
        bounds: list = [(0, 0)]
        host1, params1 = shaper._read(g, base, placed, bounds)
        keys1 = _template(params1)
        host: list = []
        params: list = []
        keys: list = []
        q0 = 0
        for k, (_, q, replaces) in enumerate(at):
            (h0, p0), (h1, p1) = bounds0[q0], bounds0[q]
            host += host0[h0:h1]
            params += params0[p0:p1]
            keys += keys0[p0:p1]
            (h0, p0), (h1, p1) = bounds[k], bounds[k + 1]
            host += host1[h0:h1]
            params += params1[p0:p1]
            keys += keys1[p0:p1]
            q0 = q + replaces
        h0, p0 = bounds0[q0]
        host += host0[h0:]
        params += params0[p0:]
        keys += keys0[p0:]
        shaper.offsets |= offsets
        shaper.negative = shaper.negative or negative or shaper._below(params1)
        return host, params, keys, _events(placed), (at, placed, host1, bounds)

    def build(self, base: int, parts: tuple) -> tuple[tuple, list, list[int]]:
        """The records, device ops and record indices (:func:`_devices`) of a member's new
        shape from :meth:`splice`'s ``parts``, spliced as its host tuples are: the first's
        pure ops' device ops, made once (a stream wait's wait, which names its record's
        index, moved with it), around the member's own ops' (equal to reading the whole
        segment: the tests compare every device op)."""
        at, placed, host1, bounds = parts
        named0, dev0, dcum, waits = self._pure_devices(base)
        pure, _, _, _, bounds0 = self.kept[base][:5]
        named: list = []
        dev: list = []
        records: list[int] = []

        def span(qa: int, qb: int) -> None:
            h0, h1 = bounds0[qa][0], bounds0[qb][0]
            named.extend(named0[h0:h1])
            d0, d1 = dcum[h0], dcum[h1]
            piece = dev0[d0:d1]
            shift = len(dev) - d0
            if shift:
                for i in waits:
                    if d0 <= i < d1:
                        piece[i - d0] = self._shift(base, i, shift)
            dev.extend(piece)

        q0 = 0
        for k, (_, q, replaces) in enumerate(at):
            span(q0, q)
            own = self.records(tuple(host1[bounds[k][0]:bounds[k + 1][0]]))
            named.extend(own)
            more, recs = _devices(own, (placed[k],), self.kernels)
            records.extend(len(dev) + r for r in recs)
            dev.extend(more)
            q0 = q + replaces
        span(q0, len(pure))
        return tuple(named), dev, records

    def _pure_devices(self, base: int) -> tuple:
        """The first's pure ops at ``base``: their records, device ops, the device ops before
        each host op (and after the last), and which device ops are stream waits' waits."""
        got = self._devs.get(base)
        if got is None:
            pure, host0 = self.kept[base][:2]
            named0 = self.records(tuple(host0))
            dev0, records = _devices(named0, pure, self.kernels)
            assert not records  # (a pure op is no record)
            dcum = [0]
            for h in named0:
                dcum.append(dcum[-1] + device_ops(h))
            waits = [i for i, d in enumerate(dev0) if d.bound_op is not None]
            got = self._devs[base] = (named0, dev0, dcum, waits)
        return got

    def _shift(self, base: int, i: int, shift: int) -> DeviceOp:
        """Device op ``i`` of the first's pure ops at ``base``, a stream wait's wait, its
        record's index moved by ``shift`` (made once)."""
        key = (base, i, shift)
        moved = self._shifted.get(key)
        if moved is None:
            wait = self._devs[base][1][i]
            moved = self._shifted[key] = DeviceOp(
                wait.kind, wait.lane, wait.off, wait.label, wait.phase, wait.accesses,
                wait.bind, wait.bound_op + shift, wait.coll)
        return moved

    def records(self, host: tuple) -> tuple:
        """:func:`~simwar.executors.fast.records.host_records` of ``host``, each host op's
        record made once for the family (its members' shapes share most of their ops)."""
        named = self._named
        out = []
        for h in host:
            rec = named.get(h)
            if rec is None:
                rec = named[h] = host_records((h,))[0]
            out.append(rec)
        return tuple(out)


def _devices(host: tuple, ops, kernels: dict | None = None
             ) -> tuple[list[DeviceOp], list[int]]:
    """The device ops a segment's host ops issue (in issue order), and which are records
    (``kernels``: a family's launched kernels' device ops, each made once for its members:
    nothing changes a device op once made)."""
    dev: list[DeviceOp] = []
    records: list[int] = []
    it = iter(host)
    for op in ops:
        kind = type(op)
        if kind is StepMarker or (kind is Marker and op.name not in MARKS):
            continue
        h = next(it)
        if kind is Launch:
            k = op.kernel
            if kernels is None:
                dev.append(DeviceOp(OpKind.KERNEL, op.stream, h.off, k.label, k.phase,
                                    h.accesses))
                continue
            key = (op.stream, h.off, k.label, k.phase, h.accesses)
            made = kernels.get(key)
            if made is None:
                made = kernels[key] = DeviceOp(OpKind.KERNEL, op.stream, h.off, k.label,
                                               k.phase, h.accesses)
            dev.append(made)
        elif kind is GraphLaunch:
            for node, n in zip(op.nodes, h.nodes):
                if n.kind == "r":
                    records.append(len(dev))
                    dev.append(DeviceOp(OpKind.RECORD, op.stream, h.off, node.event))
                elif n.kind == "c":  # a collective kernel: the engine's op, no accesses
                    dev.append(DeviceOp(OpKind.KERNEL, op.stream, h.off, node.label,
                                        node.phase, coll="device"))
                elif kernels is None:
                    dev.append(DeviceOp(OpKind.KERNEL, op.stream, h.off, node.label,
                                        node.phase, n.accesses))
                else:
                    key = (op.stream, h.off, node.label, node.phase, n.accesses)
                    made = kernels.get(key)
                    if made is None:
                        made = kernels[key] = DeviceOp(OpKind.KERNEL, op.stream, h.off,
                                                       node.label, node.phase, n.accesses)
                    dev.append(made)
        elif kind is Record:
            records.append(len(dev))
            dev.append(DeviceOp(OpKind.RECORD, op.stream, h.off, op.event))
        elif kind is WaitStream:
            # the two device ops of WaitStream's rule: the record, then the wait bound to it
            dev.append(DeviceOp(OpKind.RECORD, h.other, h.off, h.tail_event))
            dev.append(DeviceOp(OpKind.WAIT, h.stream, h.off, h.tail_event,
                                bound_op=len(dev) - 1))
        elif kind is WaitEvent:
            bind = h.bind
            dev.append(DeviceOp(OpKind.WAIT, op.stream, h.off, op.event,
                                bind=None if bind is None else SyncBinding(bind.back, bind.record)))
        elif kind is Synchronize:
            dev.append(DeviceOp(OpKind.SYNC, "cpu", h.off, op.event, bind=h.bind))
        elif kind is HostCollective:  # the engine records it as a sync op bound to nothing
            dev.append(DeviceOp(OpKind.SYNC, "cpu", h.off, op.name, coll="host"))
    return dev, records


def _segments(ops) -> list[tuple[int | None, list]]:
    """Cut host ops at step markers: ``(step or None for a prefix, ops)``."""
    out: list[tuple[int | None, list]] = []
    cur: list = []
    step = None
    for op in ops:
        if type(op) is StepMarker:
            if cur or step is not None:
                out.append((step, cur))
            cur, step = [op], op.step
        else:
            cur.append(op)
    if cur or step is not None:
        out.append((step, cur))
    return out


def _template(params: list) -> list:
    """A segment's parameters as compared between iterations: the same constants in the same
    slots and draws of the same distributions give equal templates."""

    def key(x):
        t = type(x)
        if t is float or t is int:  # first: most parameters are numbers
            return ("c", str(x))
        if isinstance(x, Use):
            return ("u", x.key, x.index)
        if isinstance(x, Sum):
            return ("s", key(x.a), key(x.b))
        return ("r", x.key)  # a Ref: a duration of the config

    return [key(x) for x in params]
