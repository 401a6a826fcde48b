"""One compiled code for plans that differ only in their records and what binds to them.

``advise`` screens *families* of candidates that differ only in where read-done is
published: their shapes are one *backbone* (the kernels, launches, graphs' kernel nodes,
CPU work, stream waits and markers, equal in every member) with records, waits on events
and syncs placed around it differently (a moved record renumbers every parameter, record
and logged op after it, and what binds to it). Compiling each member's shapes costs more
than running them, so a family's blocks are compiled once, as their *union*
(:func:`family_codes`): every member's ops in one shape, each op that not every member has
run only where a per-run flag says (``if G3:`` in the generated code,
:func:`simwar.executors.fast.codegen.compile_block`'s ``union``), each member run on it with
its own numbers: its parameters at the union's slots, its flags, its logged op times into
its own logs (the union logs every member's; what a member does not log goes to a log
that keeps nothing), and the records its later segments bind to picked in its own order
(``HP``). A member so runs exactly its own ops, in its own order, on its own numbers: the same
arithmetic as its own code, so every figure is bit for bit its own (the tests compare the
two on candidates of the shipped configs).

The union is made where it can be, and a member runs its own code elsewhere: blocks of
parameters that are constants (no per-pass columns), the members' plans of the same blocks
(steps, depth), one backbone per block, the union's block sites among the member's.

Imports: the plan's types only; the pass (:mod:`simwar.executors.fast.execute`) and the
code generator take what this makes.
"""

from __future__ import annotations

import operator

from simwar.executors.fast.plan import Plan, Shape
from simwar.executors.fast.records import (
    EventBinding,
    GraphRecordNode,
    HostGraph,
    HostSyncOp,
    HostWaitEvent,
    SyncBinding,
    device_ops,
    param_slots,
)

#: host ops a member may have or not, around the family's backbone
PLACED = frozenset({"record", "wait_event", "sync"})
#: ... and where members may also differ in their stream waits (a sweep's barriers: a
#: whole-forward stream wait in one, a wait on a published read-done event in another)
PLACED_WAITS = PLACED | {"wait_stream"}


def _backbone_key(h):
    if h.kind == "graph":
        return (h.kind, h.stream, h.off, tuple(n for n in h.nodes if n.kind != "r"))
    return h


def backbone_of(shape: Shape, placed: frozenset = PLACED) -> list:
    """The shape's backbone: its host ops but the ``placed`` ones (the graphs' record nodes
    left out). Shapes of different backbones have no union."""
    return [_backbone_key(h) for h in shape.host if h.kind not in placed]


def _placed_key(h):
    """What a placed op is but for its binding (members bind one op to different records)."""
    if h.kind in ("record", "wait_stream"):
        return h
    if h.kind == "wait_event":
        return (h.kind, h.stream, h.off, h.bind is None, h.bind is not None
                and h.bind.same_stream)
    return (h.kind, h.off, h.site, h.bind is None)


class _Slot:
    """A placed op of the union: its key, and each member's host op index in it."""

    __slots__ = ("key", "own")

    def __init__(self, key):
        self.key = key
        self.own: dict[int, int] = {}  # member -> its host op index


class Union:
    """The union of one block's shapes (``shape``, ``guards``: what :func:`compile_block`
    takes) and each member's numbers for it (:meth:`consts`, :meth:`log_order`)."""

    def __init__(self, shape: Shape, guards: tuple, maps: list, log: tuple):
        self.shape = shape
        self.guards = guards  # ((host index, node index or -1), ...): the flags G0, G1, ...
        self.maps = maps  # per member: (param map, dev map, flags, picked records)
        self.log = log  # the union's logged op times, sorted
        self.compiled: dict = {}  # its compiled function, per what else the code depends on
        #: per member: its records, in its order, as the union's record indices (``maps``'
        #: picks as lists: the lockstep lanes pick them per run)
        self.picks: list[list[int]] = []
        #: ``(host op index, count)``: consecutive waits (or host syncs) that are one wait
        #: (sync) of the members, each variant bound to other records (each member has one of
        #: them at most): the lockstep lanes run them as one
        #: (:func:`~simwar.executors.fast.codegen.compile_block`)
        self.merged: tuple = ()

    def set_log(self, logs: list[tuple]) -> None:
        """The union's logged op times: every member's (``logs``: per member, its own)."""
        maps = self.maps
        self.log = tuple(sorted({(maps[m][1][dev], w) for m, lg in enumerate(logs)
                                 for dev, w in lg}))

    def consts(self, m: int, consts: tuple) -> tuple:
        params, _, flags, pick = self.maps[m]
        out = [0.0] * self.shape.nparams
        for j, value in zip(params, consts):
            out[j] = value
        return (*out, *flags, pick)

    def log_order(self, m: int, log: tuple) -> list[int]:
        """Per logged time of the union, its index in the member's ``log`` (-1: none)."""
        devs = self.maps[m][1]
        mine = {(devs[d], w): i for i, (d, w) in enumerate(log)}
        if len(mine) != len(log) or not set(mine) <= set(self.log):
            raise ValueError("a member logs an op time the union does not")
        return [mine.get(entry, -1) for entry in self.log]


def pick_in_order(idx: list[int]):
    """The member's records, in its order, from the tuple of the union's."""
    if not idx:
        return lambda rec: ()
    if len(idx) == 1:
        i = idx[0]
        return lambda rec: (rec[i],)
    return operator.itemgetter(*idx)


def block_union(shapes: list[Shape], logs: list[tuple] | None = None,
                placed: frozenset = PLACED) -> Union | None:
    """The union of one block's member shapes (None where there is none, see the module);
    ``logs``: per member, its logged op times (None: set later, :meth:`Union.set_log`);
    ``placed``: the kinds of host op a member may have or not (:data:`PLACED`, or
    :data:`PLACED_WAITS`)."""
    n = len(shapes)
    backbone = None
    gaps: list[list[_Slot]] = []
    nodes: list[dict] = []  # per backbone graph (by backbone index): gap -> r count
    where: list[list] = []  # per member: per host op, ("b", j) or its _Slot
    spine: list[list[int]] = []  # per member: the host op index of each backbone op
    for m, sh in enumerate(shapes):
        keys = backbone_of(sh, placed)
        if backbone is None:
            backbone = keys
            gaps = [[] for _ in range(len(keys) + 1)]
            nodes = [{} for _ in keys]
        elif keys != backbone:
            return None
        mine: list = []
        spine.append([hi for hi, h in enumerate(sh.host) if h.kind not in placed])
        g = 0
        pos = 0  # where in the gap the next placed op may match
        for h in sh.host:
            if h.kind not in placed:
                if h.kind == "graph":  # its record nodes: a count per gap between kernels
                    counts = nodes[g]
                    for gap, k in _places(h.nodes):
                        if k >= 0:
                            counts[gap] = max(counts.get(gap, 0), k + 1)
                mine.append(("b", g))
                g += 1
                pos = 0
                continue
            key = _placed_key(h)
            slots = gaps[g]
            at = next((p for p in range(pos, len(slots)) if slots[p].key == key), None)
            if at is None:
                at = pos
                slots.insert(at, _Slot(key))
            slots[at].own[m] = len(mine)
            mine.append(slots[at])
            pos = at + 1
        where.append(mine)
    # the union's ops in order: (placed slot, or backbone index), with the records numbered
    order: list = []
    for g in range(len(backbone)):
        order += gaps[g]
        order.append(g)
    order += gaps[-1]
    rec_of: list[dict] = [{} for _ in range(n)]  # member -> its record index -> union's
    union_rec = 0
    graph_rec: dict[tuple, int] = {}  # (backbone index, gap, k) -> union record
    for item in order:
        if isinstance(item, _Slot):
            if item.key[0] == "record":
                for m, hi in item.own.items():
                    rec_of[m][("h", hi)] = union_rec
                union_rec += 1
        elif backbone[item][0] == "graph":
            counts = nodes[item]
            for gap in range(len(backbone[item][3]) + 1):
                for k in range(counts.get(gap, 0)):
                    graph_rec[(item, gap, k)] = union_rec
                    union_rec += 1
    # each member's records in its order, as the union's
    pick: list[list[int]] = []
    for m, sh in enumerate(shapes):
        mine = []
        for hi, h in enumerate(sh.host):
            if h.kind == "record":
                mine.append(rec_of[m][("h", hi)])
            elif h.kind == "graph":
                gap = run = 0
                for node in h.nodes:
                    if node.kind == "r":
                        mine.append(graph_rec[(where[m][hi][1], gap, run)])
                        run += 1
                    else:
                        gap += 1
                        run = 0
        pick.append(mine)
    # the union's host ops: a placed op bound differently by members is one op per binding
    host: list = []
    guards: list[tuple[int, int]] = []
    merged: list[tuple[int, int]] = []  # see Union.merged
    flags: list[list[bool]] = [[] for _ in range(n)]
    hmap: list[dict[int, int]] = [{} for _ in range(n)]  # member host index -> union's
    nmap: dict = {}  # (member, host index, node index) -> union node index

    def guard(hi: int, ni: int, who) -> None:
        if len(who) < n:
            guards.append((hi, ni))
            for m in range(n):
                flags[m].append(m in who)

    for item in order:
        if not isinstance(item, _Slot):
            j = item
            members = [(m, spine[m][j]) for m in range(n)]
            h = shapes[0].host[members[0][1]]
            if h.kind != "graph":
                for m, hi in members:
                    hmap[m][hi] = len(host)
                host.append(h)
                continue
            counts = nodes[j]
            kernels = backbone[j][3]
            union_nodes: list = []
            present: dict = {}  # union node index -> members that have it
            for gap in range(len(kernels) + 1):
                for _ in range(counts.get(gap, 0)):
                    present[len(union_nodes)] = set()
                    union_nodes.append(GraphRecordNode("r"))
                if gap < len(kernels):
                    union_nodes.append(kernels[gap])
            hu = len(host)
            union_of: dict = {}  # a member graph's nodes (by id) -> the union node of each
            for m, hi in members:
                hmap[m][hi] = hu
                graph_nodes = shapes[m].host[hi].nodes
                us = union_of.get(id(graph_nodes))
                if us is None:  # (most members' graphs are the same nodes)
                    us = union_of[id(graph_nodes)] = [
                        _node_index(counts, gap, k) if k >= 0 else
                        _node_index(counts, gap + 1, 0) - 1  # the kernel after gap's records
                        for gap, k in _places(graph_nodes)]
                for ni, (node, u) in enumerate(zip(graph_nodes, us)):
                    if node.kind == "r":
                        present[u].add(m)
                    nmap[(m, hi, ni)] = u
            host.append(HostGraph(h.kind, h.stream, h.off, tuple(union_nodes)))
            for u, who in present.items():
                guard(hu, u, who)
            continue
        variants: dict = {}  # the op as the union has it -> its members
        for m, hi in item.own.items():
            h = shapes[m].host[hi]
            if h.kind in ("wait_event", "sync") and h.bind is not None and h.bind.back == 0:
                bound = rec_of[m].get(("h", _host_of_record(shapes[m], h.bind.record)))
                if bound is None:
                    bound = _graph_record(shapes[m], h.bind.record, where[m], graph_rec)
                b = h.bind
                h = h._replace(bind=(EventBinding(0, bound, b.same_stream)
                                     if h.kind == "wait_event" else SyncBinding(0, bound)))
            variants.setdefault(h, []).append((m, hi))
        if len(variants) > 1 and item.key[0] in ("wait_event", "sync") and not item.key[3]:
            merged.append((len(host), len(variants)))  # one wait or sync, each its binding
        for h, who in variants.items():
            for m, hi in who:
                hmap[m][hi] = len(host)
            if h.kind == "wait_event" and h.bind is not None:
                h = HostWaitEvent(*h[:3], EventBinding(*h.bind))
            elif h.kind == "sync" and h.bind is not None:
                h = HostSyncOp(*h[:3], SyncBinding(*h.bind))
            guard(len(host), -1, {m for m, _ in who})
            host.append(h)
    # device ops, parameters and records of the union, and each member's maps onto them
    ops: list = []
    dev0: list[int] = []
    par0: list[int] = []
    nparams = 0
    for h in host:
        dev0.append(len(ops))
        par0.append(nparams)
        ops += [None] * device_ops(h)
        nparams += param_slots(h)
    records = [d for hu, h in enumerate(host) for d in
               ([dev0[hu]] if h.kind == "record" else
                [dev0[hu] + i for i, x in enumerate(h.nodes) if x.kind == "r"]
                if h.kind == "graph" else [])]
    maps = []
    for m, sh in enumerate(shapes):
        params: list[int] = []
        devs: list[int] = []
        d = 0
        for hi, h in enumerate(sh.host):
            hu = hmap[m][hi]
            if h.kind == "graph":
                p = par0[hu]
                params.append(p)
                for ni, node in enumerate(h.nodes):
                    u = nmap[(m, hi, ni)]
                    devs.append(dev0[hu] + u)
                    ops[dev0[hu] + u] = sh.ops[d]
                    d += 1
                    if node.kind != "r":
                        p += 1
                        params.append(p)
                continue
            params += range(par0[hu], par0[hu] + param_slots(h))
            for i in range(device_ops(h)):
                devs.append(dev0[hu] + i)
                ops[dev0[hu] + i] = sh.ops[d]
                d += 1
        maps.append((params, devs, tuple(flags[m]), pick_in_order(pick[m])))
    out = Union(Shape(tuple(host), ops, records, nparams), tuple(guards), maps, None)
    out.picks = pick
    out.merged = tuple(merged)
    if logs is not None:
        out.set_log(logs)
    return out


def _places(nodes) -> list[tuple[int, int]]:
    """Per graph node, ``(gap, k)``: a record node's kernel gap (the kernels before it) and
    its index among that gap's records; a kernel or collective node's index among them, -1."""
    out = []
    gap = run = 0
    for node in nodes:
        if node.kind == "r":
            out.append((gap, run))
            run += 1
        else:
            out.append((gap, -1))
            gap += 1
            run = 0
    return out


def _node_index(counts: dict, gap: int, k: int) -> int:
    """The union graph's node index of record ``k`` of kernel gap ``gap``."""
    return sum(counts.get(g, 0) + 1 for g in range(gap)) + k


def _host_of_record(shape: Shape, record: int) -> int:
    """The host op index of the shape's record ``record`` (-1: a graph's record node)."""
    dev = shape.records[record]
    d = 0
    for hi, h in enumerate(shape.host):
        if d == dev and h.kind == "record":
            return hi
        d += device_ops(h)
        if d > dev:
            return -1
    return -1


def _graph_record(shape: Shape, record: int, where: list, graph_rec: dict) -> int:
    """The union record of the shape's record ``record``, a graph's record node."""
    dev = shape.records[record]
    d = 0
    for hi, h in enumerate(shape.host):
        if h.kind == "graph" and d <= dev < d + len(h.nodes):
            return graph_rec[(where[hi][1], *_places(h.nodes)[dev - d])]
        d += device_ops(h)
    raise ValueError(f"record {record} is not a record of the shape")


def family_codes(plans: list[Plan], logs: list[list[tuple]] | None = None,
                 placed: frozenset = PLACED) -> list[Union | None] | None:
    """Per block, the union of the members' shapes (None for a block that has none), or
    None where the members' plans are not of the same blocks. ``logs``: per member, per
    block, its logged op times (:meth:`~simwar.executors.fast.races.RacePlan.logs_of`;
    None: set later, :meth:`Union.set_log`)."""
    first = plans[0]
    for p in plans:
        if len(p.blocks) != len(first.blocks) or p.depth != first.depth:
            return None
        for a, b in zip(p.blocks, first.blocks):
            if a.steps != b.steps or a.marked != b.marked:
                return None
    out: list[Union | None] = []
    for bi, _ in enumerate(first.blocks):
        blocks = [p.blocks[bi] for p in plans]
        if any(c is None for b in blocks for c in b.consts):
            out.append(None)
            continue
        out.append(block_union([b.shape for b in blocks],
                               None if logs is None else [lg[bi] for lg in logs], placed))
    return out
