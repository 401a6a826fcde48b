"""The run facts every analysis reads, as one typed record: :class:`RunMeta`.

A Trace carries its run's facts in ``Trace.meta``, a dict that each writer fills with its
own keys (the program builder: the config's name, steps, batch and barrier; the Kineto
importer: the scheduler thread and the capture's file; the ranks' executor: the
collectives; the GPU replay: the races it measured). Most keys are read by one writer's
own code; a few are read by every analysis, plot and command, each with its default. Those
are :class:`RunMeta`'s fields, read once and in one place (:meth:`RunMeta.from_meta`), with
the defaults the readers used, so a reader names ``trace.run.warmup_steps`` and not the
string ``"warmup_steps"`` and its default again.

The record is built from the dict, never stored apart from it: writers keep writing
``meta`` (and may add to it after the Trace is made), and ``Trace.run`` reads it each time.
The keys are the record's field names, so a trace file (format version 3) keeps them apart
from the writers' other keys (:meth:`RunMeta.split`); a file of version 2 has them among the
others and reads the same.

A field whose absence differs from any value (the barrier a config asked for, when the run
came from a capture) is None when the key is absent.

Imports: the standard library and :mod:`simwar.core.frozen`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from simwar.core.frozen import Frozen, set_field

__all__ = ["RunMeta"]


class RunMeta(Frozen):
    """The typed run facts of a Trace's ``meta`` (see the module docstring).

    Every field is the meta key of the same name; a key that is absent takes the default.
    """

    __slots__ = ("name", "source", "file", "algorithm", "seed", "steps", "warmup_steps",
                 "batch_size", "accept_tokens", "workload", "slo", "forward_stream", "barrier",
                 "barrier_effective", "placement", "publish_phase", "publish_position",
                 "publish_reason", "overlap", "rank", "tp", "rank_seed", "collectives",
                 "host_thread", "host_thread_name", "host_thread_reason", "launch_threads")

    def __init__(self, name: str = "", source: str = "", file: str | None = None,
                 algorithm: str = "", seed: int | None = None, steps: int | None = None,
                 warmup_steps: int = 0, batch_size: float = 1, accept_tokens: float = 1.0,
                 workload: Mapping | None = None, slo: Mapping | None = None,
                 forward_stream: str = "forward", barrier: str | None = None,
                 barrier_effective: str | None = None, placement: str | None = None,
                 publish_phase: str | None = None, publish_position: str | None = None,
                 publish_reason: str | None = None, overlap: bool | None = None,
                 rank: int | None = None, tp: int | None = None, rank_seed: int | None = None,
                 collectives: Mapping | None = None, host_thread: list | None = None,
                 host_thread_name: str | None = None, host_thread_reason: str | None = None,
                 launch_threads: list | None = None):
        #: the config's name (a capture's, or empty)
        set_field(self, "name", name)
        #: which executor or importer wrote the trace: ``sim``, ``kineto``, ``replay``, ...
        set_field(self, "source", source)
        #: the file a capture was read from
        set_field(self, "file", file)
        #: the speculative-decoding algorithm (``dflash``, ``eagle``, ...; empty for a capture)
        set_field(self, "algorithm", algorithm)
        set_field(self, "seed", seed)
        #: scheduler iterations run, and the first of them that the figures count
        set_field(self, "steps", steps)
        set_field(self, "warmup_steps", warmup_steps)
        #: the batch and tokens accepted per request per step of a run of one size
        set_field(self, "batch_size", batch_size)
        set_field(self, "accept_tokens", accept_tokens)
        #: a run whose batch changes every step: per-step arrays (``batch_size``,
        #: ``graph_bucket``, ``accept_tokens``, ...) and the requests that arrived
        set_field(self, "workload", workload)
        #: request latency bounds (``ttft_ms``, ...) of a run with requests
        set_field(self, "slo", slo)
        #: the lane of the forward stream
        set_field(self, "forward_stream", forward_stream)
        #: the barrier the config asked for, the one the run applied, and where it sits
        set_field(self, "barrier", barrier)
        set_field(self, "barrier_effective", barrier_effective)
        set_field(self, "placement", placement)
        #: where the read-done is recorded, and why there
        set_field(self, "publish_phase", publish_phase)
        set_field(self, "publish_position", publish_position)
        set_field(self, "publish_reason", publish_reason)
        #: False for a run with overlap scheduling off (the normal loop)
        set_field(self, "overlap", overlap)
        #: a tensor-parallel rank: its rank, the ranks, its seed and its collectives (op ids,
        #: host or device, instance)
        set_field(self, "rank", rank)
        set_field(self, "tp", tp)
        set_field(self, "rank_seed", rank_seed)
        set_field(self, "collectives", collectives)
        #: a capture's scheduler thread ``[pid, tid]``, its name, why it was chosen, and every
        #: thread that launched work ``[name, tid, launches]``
        set_field(self, "host_thread", host_thread)
        set_field(self, "host_thread_name", host_thread_name)
        set_field(self, "host_thread_reason", host_thread_reason)
        set_field(self, "launch_threads", launch_threads)

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> RunMeta:
        """The record of a Trace's ``meta`` (a dict of any keys), with the types the
        readers take: ``warmup_steps`` an int, ``accept_tokens`` a float."""
        given = {k: meta[k] for k in _KEYS if k in meta}
        if "warmup_steps" in given:
            given["warmup_steps"] = int(given["warmup_steps"])
        if "accept_tokens" in given:
            given["accept_tokens"] = float(given["accept_tokens"])
        return cls(**given)

    @classmethod
    def of(cls, meta: Mapping[str, Any] | RunMeta) -> RunMeta:
        """``meta`` as a record (a record as it is)."""
        return meta if isinstance(meta, RunMeta) else cls.from_meta(meta)

    @staticmethod
    def split(meta: Mapping[str, Any]) -> tuple[dict, dict]:
        """``meta``'s keys in two: the record's (as written) and the others, in order."""
        run = {k: v for k, v in meta.items() if k in _KEYS}
        rest = {k: v for k, v in meta.items() if k not in _KEYS}
        return run, rest

    @property
    def requests(self) -> Mapping | None:
        """The requests of a run they arrived in (``workload.requests``: per request its
        arrival, lengths and steps), or None."""
        return (self.workload or {}).get("requests")

    @property
    def graph_bucket(self) -> Sequence | None:
        """Per step, the graph bucket of a run whose batch changes (``workload.graph_bucket``),
        or None."""
        return (self.workload or {}).get("graph_bucket")

    @property
    def applied_barrier(self) -> str | None:
        """The barrier the run applied: ``barrier_effective``, else the one asked for."""
        return self.barrier if self.barrier_effective is None else self.barrier_effective


_KEYS = frozenset(RunMeta.__slots__)
