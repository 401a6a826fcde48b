"""The host-program IR: what one scheduler thread issues, in order.

A :class:`Program` is the contract between the builder and every executor
(the SimPy engine, the GPU harness). It is a flat list of host operations:
CPU work, kernel launches on named streams, CUDA-graph launches, event
records, stream waits, host synchronizations and step markers. All
durations are already drawn (the builder samples them once from a seeded
generator), so the program never branches on timing and every executor
replays exactly the same schedule.

Imports: the standard library only (and :mod:`simwar.core.frozen`, the same). The GPU
harness loads programs on a machine that has torch but none of simwar's other
dependencies, so this module must stay importable there (``Program.from_json``).
"""

from __future__ import annotations

import json
from typing import Union

from simwar.core.frozen import Frozen, set_field

FORMAT_VERSION = 1

#: Streams known to the builder; executors accept any name.
STREAMS = ("schedule", "forward", "plan", "copy", "d2h")


# --------------------------------------------------------------------------- names
class StepName(str):
    """A name made of a template and a number that follows the step: ``copy_done[5]`` is
    ``StepName("copy_done[{}]", 5)``, ``verify.graph@32`` (the graph of step 7's bucket) is
    ``StepName("verify.graph@{}", 7, "bucket", 32)``.

    It is the text itself (a ``str``: equal to, hashed and written as its text); the
    template lets the fast executor's trace mode name step k's operations without
    building them (:mod:`simwar.executors.fast.trace`). ``key`` says what fills the
    template: ``step`` (the step itself) or ``bucket`` (the step's graph bucket).
    """

    def __new__(cls, template: str, step: int, key: str = "step", value=None):
        self = super().__new__(cls, template.format(step if value is None else value))
        self.template, self.step, self.key = template, int(step), key
        return self

    def __reduce__(self):
        return (_step_name, (self.template, self.step, self.key, str(self)))


def _step_name(template: str, step: int, key: str, text: str) -> StepName:
    name = str.__new__(StepName, text)
    name.template, name.step, name.key = template, step, key
    return name


# --------------------------------------------------------------------------- device work
class Kernel(Frozen):
    """Device work of a given length; ``reads``/``writes`` name shared buffers."""

    __slots__ = ("label", "duration_us", "reads", "writes", "phase")

    def __init__(self, label: str, duration_us: float, reads: tuple[str, ...] = (),
                 writes: tuple[str, ...] = (), phase: str = ""):
        set_field(self, "label", label)
        set_field(self, "duration_us", duration_us)
        set_field(self, "reads", reads)
        set_field(self, "writes", writes)
        set_field(self, "phase", phase)


class GraphRecord(Frozen):
    """An in-graph event-record node (``Event(external=True)`` recorded at capture).

    It fires when graph execution reaches it; each launch of the graph re-arms
    it, so a wait issued after the launch binds to this launch's node.
    """

    __slots__ = ("event",)

    def __init__(self, event: str):
        set_field(self, "event", event)


class Collective(Frozen):
    """A device collective kernel (an NCCL all-reduce) of a tensor-parallel rank.

    It begins by the stream rules like any kernel and completes at the latest rank's begin
    of the same collective plus ``duration_us``: the early ranks spin in it. The k-th
    collective a rank issues is the k-th of every rank (the ranks issue the same program
    structure); a single-rank executor runs it as a kernel of ``duration_us``.
    """

    __slots__ = ("label", "duration_us", "phase")

    def __init__(self, label: str, duration_us: float, phase: str = ""):
        set_field(self, "label", label)
        set_field(self, "duration_us", duration_us)
        set_field(self, "phase", phase)


GraphNode = Union[Kernel, GraphRecord, Collective]


# --------------------------------------------------------------------------- host operations
class StepMarker(Frozen):
    """Start of scheduler iteration ``step`` (no host time)."""

    __slots__ = ("step",)

    def __init__(self, step: int):
        set_field(self, "step", step)


class CpuWork(Frozen):
    """Host busy time (Python scheduling, result processing, dispatch)."""

    __slots__ = ("label", "duration_us", "step")

    def __init__(self, label: str, duration_us: float, step: int):
        set_field(self, "label", label)
        set_field(self, "duration_us", duration_us)
        set_field(self, "step", step)


class Launch(Frozen):
    """Launch one kernel on ``stream``; the host call costs ``host_us``."""

    __slots__ = ("stream", "kernel", "step", "host_us")

    def __init__(self, stream: str, kernel: Kernel, step: int, host_us: float = 0.0):
        set_field(self, "stream", stream)
        set_field(self, "kernel", kernel)
        set_field(self, "step", step)
        set_field(self, "host_us", host_us)


class GraphLaunch(Frozen):
    """``cudaGraphLaunch`` of graph ``graph`` on ``stream``.

    Launches with the same ``graph`` name share one captured graph: executors
    that capture (the harness) capture it once and replay it.
    """

    __slots__ = ("stream", "graph", "nodes", "step", "phase", "host_us")

    def __init__(self, stream: str, graph: str, nodes: tuple[GraphNode, ...], step: int,
                 phase: str = "", host_us: float = 0.0):
        set_field(self, "stream", stream)
        set_field(self, "graph", graph)
        set_field(self, "nodes", nodes)
        set_field(self, "step", step)
        set_field(self, "phase", phase)
        set_field(self, "host_us", host_us)


class Record(Frozen):
    """``event.record(stream)``: captures the tail of ``stream`` at the host call."""

    __slots__ = ("event", "stream", "step", "host_us")

    def __init__(self, event: str, stream: str, step: int, host_us: float = 0.0):
        set_field(self, "event", event)
        set_field(self, "stream", stream)
        set_field(self, "step", step)
        set_field(self, "host_us", host_us)


class WaitEvent(Frozen):
    """``stream.wait_event(event)``: binds to the latest record issued before it."""

    __slots__ = ("stream", "event", "step", "host_us", "latency_us")

    def __init__(self, stream: str, event: str, step: int, host_us: float = 0.0,
                 latency_us: float = 0.0):
        set_field(self, "stream", stream)
        set_field(self, "event", event)
        set_field(self, "step", step)
        set_field(self, "host_us", host_us)
        set_field(self, "latency_us", latency_us)  # device latency when released by another stream


def tail_event(other: str) -> str:
    """The event a ``wait_stream`` on ``other`` records (``other``'s tail at the call)."""
    return other + ".tail"


class WaitStream(Frozen):
    """``stream.wait_stream(other)``: a fresh record on ``other`` plus a wait.

    The rule every executor applies: at the host call, a record of :attr:`tail_event` on
    ``other`` (a device op of its own), then a wait on ``stream`` bound to that record, its
    latency paid unless :attr:`same_stream`.
    """

    __slots__ = ("stream", "other", "step", "host_us", "latency_us")

    def __init__(self, stream: str, other: str, step: int, host_us: float = 0.0,
                 latency_us: float = 0.0):
        set_field(self, "stream", stream)
        set_field(self, "other", other)
        set_field(self, "step", step)
        set_field(self, "host_us", host_us)
        set_field(self, "latency_us", latency_us)

    @property
    def tail_event(self) -> str:
        return tail_event(self.other)

    @property
    def same_stream(self) -> bool:
        return self.stream == self.other


class Synchronize(Frozen):
    """Host blocks until ``event`` completes (``site`` names the block for metrics)."""

    __slots__ = ("event", "step", "site", "host_us", "wake_us")

    def __init__(self, event: str, step: int, site: str, host_us: float = 0.0,
                 wake_us: float = 0.0):
        set_field(self, "event", event)
        set_field(self, "step", step)
        set_field(self, "site", site)
        set_field(self, "host_us", host_us)
        set_field(self, "wake_us", wake_us)  # host wake-up latency when it really blocked


class Marker(Frozen):
    """A named instant on the host timeline (e.g. ``run_batch``) used by metrics."""

    __slots__ = ("name", "step")

    def __init__(self, name: str, step: int):
        set_field(self, "name", name)
        set_field(self, "step", step)


class HostCollective(Frozen):
    """A host collective across tensor-parallel ranks (SGLang's per-step request broadcast
    over the CPU group, a DP-attention all-gather): the host leaves when the last rank
    arrives plus ``cost_us``, and ``wake_us`` later when it waited (a blocking wait). The
    k-th host collective of a rank is the k-th of every rank."""

    __slots__ = ("name", "step", "cost_us", "wake_us")

    def __init__(self, name: str, step: int, cost_us: float, wake_us: float = 0.0):
        set_field(self, "name", name)
        set_field(self, "step", step)
        set_field(self, "cost_us", cost_us)
        set_field(self, "wake_us", wake_us)


HostOp = Union[StepMarker, CpuWork, Launch, GraphLaunch, Record, WaitEvent, WaitStream,
               Synchronize, Marker, HostCollective]

_OP_TYPES = {cls.__name__: cls for cls in (StepMarker, CpuWork, Launch, GraphLaunch, Record,
                                           WaitEvent, WaitStream, Synchronize, Marker,
                                           HostCollective)}


# --------------------------------------------------------------------------- program
class Program:
    """An ordered host program.

    ``meta`` carries run facts metrics need (steps, warm-up, batch size,
    accepted tokens per step, config name) and is copied into the Trace.
    """

    __slots__ = ("ops", "streams", "meta")

    def __init__(self, ops: list[HostOp], streams: tuple[str, ...] = STREAMS,
                 meta: dict | None = None):
        self.ops = ops
        self.streams = streams
        self.meta = {} if meta is None else meta

    def __eq__(self, other):
        if other.__class__ is self.__class__:
            return (self.ops, self.streams, self.meta) == (other.ops, other.streams, other.meta)
        return NotImplemented

    __hash__ = None  # mutable, as a dataclass that is not frozen

    def __repr__(self) -> str:
        return f"Program(ops={self.ops!r}, streams={self.streams!r}, meta={self.meta!r})"

    def __reduce__(self):
        return Program, (self.ops, self.streams, self.meta)

    # ---- inspection
    def steps(self) -> int:
        return sum(1 for op in self.ops if type(op) is StepMarker)

    def buffers(self) -> set[str]:
        out: set[str] = set()
        for op in self.ops:
            for k in _kernels_of(op):
                out.update(k.reads)
                out.update(k.writes)
        return out

    def graphs(self) -> dict[str, tuple[GraphNode, ...]]:
        """Distinct graphs by name (first launch's nodes)."""
        out: dict[str, tuple[GraphNode, ...]] = {}
        for op in self.ops:
            if type(op) is GraphLaunch and op.graph not in out:
                out[op.graph] = op.nodes
        return out

    # ---- serialization (stdlib JSON; versioned)
    def to_dict(self) -> dict:
        ops = []
        for op in self.ops:
            d = op.as_dict()
            d["op"] = type(op).__name__
            if type(op) is GraphLaunch:
                d["nodes"] = [dict(n.as_dict(), node=type(n).__name__) for n in op.nodes]
            ops.append(d)
        return {
            "format": "simwar.program",
            "version": FORMAT_VERSION,
            "streams": list(self.streams),
            "meta": self.meta,
            "ops": ops,
        }

    @classmethod
    def from_dict(cls, data: dict) -> Program:
        if data.get("format") != "simwar.program":
            raise ValueError("not a simwar program (missing format: simwar.program)")
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"program format version {data.get('version')} is not "
                             f"{FORMAT_VERSION}")
        ops: list[HostOp] = []
        for d in data["ops"]:
            d = dict(d)
            kind = _OP_TYPES[d.pop("op")]
            if kind is Launch:
                d["kernel"] = _kernel(d["kernel"])
            elif kind is GraphLaunch:
                d["nodes"] = tuple(_node(n) for n in d["nodes"])
            ops.append(kind(**d))
        return cls(ops=ops, streams=tuple(data["streams"]), meta=data.get("meta", {}))

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, text: str) -> Program:
        return cls.from_dict(json.loads(text))


def _kernel(d: dict) -> Kernel:
    d = dict(d)
    d.pop("node", None)
    d["reads"] = tuple(d.get("reads", ()))
    d["writes"] = tuple(d.get("writes", ()))
    return Kernel(**d)


def _node(d: dict) -> GraphNode:
    if d.get("node") == "GraphRecord":
        return GraphRecord(event=d["event"])
    if d.get("node") == "Collective":
        return Collective(label=d["label"], duration_us=d["duration_us"],
                          phase=d.get("phase", ""))
    return _kernel(d)


def _kernels_of(op: HostOp) -> tuple[Kernel, ...]:
    if type(op) is Launch:
        return (op.kernel,)
    if type(op) is GraphLaunch:
        return tuple(n for n in op.nodes if type(n) is Kernel)
    return ()
