"""The host-program IR: what one scheduler thread issues, in order.

A :class:`Program` is the contract between the builder and every executor
(the SimPy engine, the GPU harness). It is a flat list of host operations:
CPU work, kernel launches on named streams, CUDA-graph launches, event
records, stream waits, host synchronizations and step markers. All
durations are already drawn (the builder samples them once from a seeded
generator), so the program never branches on timing and every executor
replays exactly the same schedule.

Imports: the standard library only. The GPU harness loads programs on a
machine that has torch but none of simwar's other dependencies, so this
module must stay importable there (``Program.from_json``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Union

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
@dataclass(frozen=True, slots=True)
class Kernel:
    """Device work of a given length; ``reads``/``writes`` name shared buffers."""

    label: str
    duration_us: float
    reads: tuple[str, ...] = ()
    writes: tuple[str, ...] = ()
    phase: str = ""


@dataclass(frozen=True, slots=True)
class GraphRecord:
    """An in-graph event-record node (``Event(external=True)`` recorded at capture).

    It fires when graph execution reaches it; each launch of the graph re-arms
    it, so a wait issued after the launch binds to this launch's node.
    """

    event: str


@dataclass(frozen=True, slots=True)
class Collective:
    """A device collective kernel (an NCCL all-reduce) of a tensor-parallel rank.

    It begins by the stream rules like any kernel and completes at the latest rank's begin
    of the same collective plus ``duration_us``: the early ranks spin in it. The k-th
    collective a rank issues is the k-th of every rank (the ranks issue the same program
    structure); a single-rank executor runs it as a kernel of ``duration_us``.
    """

    label: str
    duration_us: float
    phase: str = ""


GraphNode = Union[Kernel, GraphRecord, Collective]


# --------------------------------------------------------------------------- host operations
@dataclass(frozen=True, slots=True)
class StepMarker:
    """Start of scheduler iteration ``step`` (no host time)."""

    step: int


@dataclass(frozen=True, slots=True)
class CpuWork:
    """Host busy time (Python scheduling, result processing, dispatch)."""

    label: str
    duration_us: float
    step: int


@dataclass(frozen=True, slots=True)
class Launch:
    """Launch one kernel on ``stream``; the host call costs ``host_us``."""

    stream: str
    kernel: Kernel
    step: int
    host_us: float = 0.0


@dataclass(frozen=True, slots=True)
class GraphLaunch:
    """``cudaGraphLaunch`` of graph ``graph`` on ``stream``.

    Launches with the same ``graph`` name share one captured graph: executors
    that capture (the harness) capture it once and replay it.
    """

    stream: str
    graph: str
    nodes: tuple[GraphNode, ...]
    step: int
    phase: str = ""
    host_us: float = 0.0


@dataclass(frozen=True, slots=True)
class Record:
    """``event.record(stream)``: captures the tail of ``stream`` at the host call."""

    event: str
    stream: str
    step: int
    host_us: float = 0.0


@dataclass(frozen=True, slots=True)
class WaitEvent:
    """``stream.wait_event(event)``: binds to the latest record issued before it."""

    stream: str
    event: str
    step: int
    host_us: float = 0.0
    latency_us: float = 0.0  # device latency when released by another stream


def tail_event(other: str) -> str:
    """The event a ``wait_stream`` on ``other`` records (``other``'s tail at the call)."""
    return other + ".tail"


@dataclass(frozen=True, slots=True)
class WaitStream:
    """``stream.wait_stream(other)``: a fresh record on ``other`` plus a wait.

    The rule every executor applies: at the host call, a record of :attr:`tail_event` on
    ``other`` (a device op of its own), then a wait on ``stream`` bound to that record, its
    latency paid unless :attr:`same_stream`.
    """

    stream: str
    other: str
    step: int
    host_us: float = 0.0
    latency_us: float = 0.0

    @property
    def tail_event(self) -> str:
        return tail_event(self.other)

    @property
    def same_stream(self) -> bool:
        return self.stream == self.other


@dataclass(frozen=True, slots=True)
class Synchronize:
    """Host blocks until ``event`` completes (``site`` names the block for metrics)."""

    event: str
    step: int
    site: str
    host_us: float = 0.0
    wake_us: float = 0.0  # host wake-up latency when it really blocked


@dataclass(frozen=True, slots=True)
class Marker:
    """A named instant on the host timeline (e.g. ``run_batch``) used by metrics."""

    name: str
    step: int


@dataclass(frozen=True, slots=True)
class HostCollective:
    """A host collective across tensor-parallel ranks (SGLang's per-step request broadcast
    over the CPU group, a DP-attention all-gather): the host leaves when the last rank
    arrives plus ``cost_us``, and ``wake_us`` later when it waited (a blocking wait). The
    k-th host collective of a rank is the k-th of every rank."""

    name: str
    step: int
    cost_us: float
    wake_us: float = 0.0


HostOp = Union[StepMarker, CpuWork, Launch, GraphLaunch, Record, WaitEvent, WaitStream,
               Synchronize, Marker, HostCollective]

_OP_TYPES = {cls.__name__: cls for cls in (StepMarker, CpuWork, Launch, GraphLaunch, Record,
                                           WaitEvent, WaitStream, Synchronize, Marker,
                                           HostCollective)}


# --------------------------------------------------------------------------- program
@dataclass(slots=True)
class Program:
    """An ordered host program.

    ``meta`` carries run facts metrics need (steps, warm-up, batch size,
    accepted tokens per step, config name) and is copied into the Trace.
    """

    ops: list[HostOp]
    streams: tuple[str, ...] = STREAMS
    meta: dict = field(default_factory=dict)

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
            d = asdict(op)
            d["op"] = type(op).__name__
            if type(op) is GraphLaunch:
                d["nodes"] = [dict(asdict(n), node=type(n).__name__) for n in op.nodes]
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
