"""The shared-buffer accesses of an imported capture, by its mapping, and its latent races.

A profile shows which kernels ran and how the streams waited on each other, not which buffers
a kernel touched: the mapping says that (:class:`simwar.capture.mapping.Mapping`):

- ``writes: {REGEX: [buffers]}``: a device op (kernel, memcpy, memset) writes the buffers
  when REGEX matches its name, or the name of a range around its launch (the scheduler
  thread's ``record_function`` ranges, innermost first: ``'^scheduler\\.prepare_for_decode$'``
  takes every device op launched in that range);
- ``reads: {KEY: [buffers]}``: KEY a phase (one the capture's ops have, or one the mapping's
  ``phases``/``default_phase`` name): every device op of that phase reads them, as ``--fit``
  reads it; any other KEY is a regex, as for ``writes``.

A mapping file's regex that maps no device op is an error, one line naming the file and the
key (:class:`simwar.config.ConfigError`); a preset's is dropped (a real profile holds some of
a server's stages, not all). The presets name the shared buffers of SGLang and vLLM where
their kernel and range names make the accesses identifiable (``simwar/data/presets/``).

:func:`hb_facts` reads, from the import, what its happens-before needs beyond the Trace's
ids (:class:`simwar.analysis.happens_before.HbFacts`):

- **blocking copies**: a D2H copy into pageable memory returns from its call only once it
  completed (CUDA's rule for ``cudaMemcpyAsync`` to pageable memory; torch performs a copy
  into a strided pinned slice that way): the host is ordered after it;
- **device synchronizes** (:attr:`~simwar.capture.to_trace.KinetoImport.device_syncs`);
- **in-graph record nodes**: a record node inside a CUDA graph (an ``Event(external=True)``
  recorded during capture) is not in a profile, only the waits on it
  (:mod:`simwar.capture.binding`), so where in its graph it sits is not known; a node is a
  graph's read-done, so it is taken to follow the last device op of its launch that reads a
  mapped buffer (before them all when none does). A node placed before an in-graph read
  that it should follow is therefore not seen.

:func:`capture_races` puts them together: the accesses, the facts, the races
(:func:`simwar.analysis.happens_before.latent_races`) and what the analysis lacks (waits and
syncs the binding left unbound: edges missing here, so a race across one may in fact be
ordered).

Imports: simwar's analysis, capture, config and core modules, numpy; never the simulator.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from simwar.analysis.happens_before import (
    Accesses,
    HbFacts,
    RaceReport,
    latent_races,
    short_label,
)
from simwar.capture.mapping import Mapping
from simwar.capture.to_trace import KinetoImport
from simwar.config import ConfigError
from simwar.core.trace import HOST, Call, Mode, OpKind, Trace

#: a memcpy kind (:func:`simwar.capture.reader.copy_kind`) whose call returns only once the copy
#: completed (CUDA: a D2H copy into pageable host memory)
BLOCKING_COPY = re.compile(r"^DtoH \(Device -> Pageable\)$")


class Rule:
    """One ``reads``/``writes`` entry: a phase or a regex, its buffers and mode."""

    def __init__(self, key: str, pattern: str, buffers: list[str], mode: Mode, phase: bool,
                 soft: bool, where: str):
        self.key, self.pattern, self.buffers, self.mode = key, pattern, list(buffers), mode
        self.phase, self.soft = phase, soft
        self.rx = None
        if not phase:
            try:
                self.rx = re.compile(pattern)
            except re.error as e:
                raise ConfigError(f"{where}: {key}: invalid regex '{pattern}': {e}") from None
        self.hits = 0  # device ops it mapped

    def words(self, via: str = "") -> str:
        if self.phase:
            return f"{self.key} {self.pattern} (phase)"
        return f"{self.key} '{self.pattern}' ({via})" if via else f"{self.key} '{self.pattern}'"


def access_rules(mapping: Mapping, phases, where: str = "mapping") -> list[Rule]:
    """The mapping's ``writes`` and ``reads`` as rules; ``phases``: the capture's phase names
    (a ``reads`` key that is one of them, or a phase the mapping names, is a phase)."""
    named = set(phases) | set(mapping.phases.values())
    if mapping.default_phase:
        named.add(mapping.default_phase)
    soft = mapping.soft
    rules = [Rule("writes", p, b, Mode.WRITE, False, p in soft.get("writes", ()), where)
             for p, b in mapping.writes.items()]
    rules += [Rule("reads", k, b, Mode.READ, k in named, k in soft.get("reads", ()), where)
              for k, b in mapping.reads.items()]
    return rules


@dataclass
class CaptureAccesses:
    """The accesses of a capture (:class:`~simwar.analysis.happens_before.Accesses`), the
    rules that named them (with how many device ops each mapped) and the preset's rules that
    mapped nothing (dropped)."""

    accesses: Accesses
    rules: list[Rule]
    dropped: list[Rule] = field(default_factory=list)

    def count(self, mode: Mode) -> int:
        return sum(1 for m in self.accesses.mode if m == mode)

    def buffers(self) -> list[str]:
        return sorted(set(self.accesses.buffer))


def launch_ranges(trace: Trace, annotations) -> dict[int, tuple[str, ...]]:
    """Per host launch span of the scheduler thread, the names of the ranges around it,
    innermost first (``annotations``: :attr:`KinetoImport.annotations`, by start)."""
    spans = trace.spans
    host = trace.code(HOST)
    calls = np.flatnonzero((spans.lane == host) & np.isin(spans.call, (Call.LAUNCH,
                                                                       Call.GRAPH_LAUNCH)))
    calls = calls[np.argsort(spans.start_us[calls], kind="stable")]
    ann = sorted(annotations, key=lambda a: (a[1], -a[2]))
    out: dict[int, tuple[str, ...]] = {}
    stack: list[tuple[str, float, float]] = []
    j = 0
    for c, t in zip(calls.tolist(), spans.start_us[calls].tolist()):
        while j < len(ann) and ann[j][1] <= t:
            stack.append(ann[j])
            j += 1
        stack = [a for a in stack if a[2] >= t]
        out[c] = tuple(a[0] for a in reversed(stack))
    return out


def capture_accesses(imp: KinetoImport, mapping: Mapping, where: str = "mapping"
                     ) -> CaptureAccesses:
    """The device ops' accesses by the mapping's rules (see the module docstring); a mapping
    file's regex that maps no device op is a :class:`ConfigError` naming ``where`` and the
    key."""
    trace = imp.trace
    ops = trace.ops
    dev = np.flatnonzero(ops.kind == OpKind.KERNEL)
    phases = {trace.text(int(c)) for c in np.unique(ops.phase[dev])} - {""}
    rules = access_rules(mapping, phases, where)
    ranges = launch_ranges(trace, imp.annotations) if any(not r.phase for r in rules) else {}
    out = Accesses([], [], [], [])
    cache: dict[tuple, list[tuple[Rule, str]]] = {}
    labels, phase_of, calls = ops.label[dev].tolist(), ops.phase[dev].tolist(), \
        ops.call[dev].tolist()
    for op, label, ph, call in zip(dev.tolist(), labels, phase_of, calls):
        key = (label, ph, ranges.get(call, ()))
        hits = cache.get(key)
        if hits is None:
            hits = cache[key] = _matches(rules, trace.text(label), trace.text(ph), key[2])
        seen = set()
        for rule, via in hits:
            for b in rule.buffers:
                if (b, rule.mode) in seen:
                    continue
                seen.add((b, rule.mode))
                out.op.append(op)
                out.buffer.append(b)
                out.mode.append(int(rule.mode))
                out.rule.append(rule.words(via))
    counts: Counter = Counter()
    for label, ph, call in zip(labels, phase_of, calls):
        for rule, _ in cache[(label, ph, ranges.get(call, ()))]:
            counts[id(rule)] += 1
    for rule in rules:
        rule.hits = counts[id(rule)]
    missing = [r for r in rules if r.hits == 0 and not r.soft]
    if missing:
        r = missing[0]
        raise ConfigError(f"{where}: {_unmatched(r, trace, dev, ranges, phases)}" + (
            f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""))
    dropped = [r for r in rules if r.hits == 0]
    return CaptureAccesses(out, [r for r in rules if r.hits], dropped)


def _matches(rules: list[Rule], label: str, phase: str, ranges: tuple[str, ...]
             ) -> list[tuple[Rule, str]]:
    """The rules a device op matches, each with how (``kernel name``, ``range NAME``)."""
    out = []
    for rule in rules:
        if rule.phase:
            if phase == rule.pattern:
                out.append((rule, "phase"))
            continue
        if rule.rx.search(label):
            out.append((rule, "kernel name"))
            continue
        hit = next((r for r in ranges if rule.rx.search(r)), None)
        if hit is not None:
            out.append((rule, f"range {hit}"))
    return out


def _unmatched(rule: Rule, trace: Trace, dev: np.ndarray, ranges, phases) -> str:
    """The sentence for a rule that maps no device op."""
    if rule.phase:  # a phase the capture lacks: cannot be (phases come from the capture)
        return f"{rule.key}: phase '{rule.pattern}' has no device op in the capture"
    names = sorted({trace.text(int(c)) for c in np.unique(trace.ops.label[dev])})
    around = sorted({n for rs in ranges.values() for n in rs})
    shapes = sorted({re.sub(r"\d+", "N", short_label(n, 40)) for n in names + around})
    some = ", ".join(shapes[:5]) + (", ..." if len(shapes) > 5 else "")
    what = "a phase of the capture" + (f" ({', '.join(sorted(phases))})" if phases else "")
    lead = f"{rule.key} '{rule.pattern}' " + ("is not " + what + " and as a regex " if
                                              rule.key == "reads" else "")
    return (f"{lead}matches none of the capture's {len(names)} device op names and the "
            f"{len(around)} ranges around their launches" + (f" ({some})" if some else ""))


def hb_facts(imp: KinetoImport, accesses: Accesses) -> HbFacts:
    """What the capture adds to its Trace's happens-before (see the module docstring)."""
    trace = imp.trace
    ops = trace.ops
    blocking = tuple(sorted(op for op, info in imp.device_info.items()
                            if info.kind == "memcpy" and BLOCKING_COPY.match(info.copy or "")))
    reads = sorted({op for op, m in zip(accesses.op, accesses.mode) if m == Mode.READ})
    node_after: dict[int, int] = {}
    nodes = np.flatnonzero(trace.graph_node() & (ops.kind == OpKind.RECORD))
    if len(nodes) and reads:
        read_calls: dict[int, int] = {}  # launch call -> its last reading op
        for op in reads:
            c = int(ops.call[op])
            if c >= 0:
                read_calls[c] = max(read_calls.get(c, -1), op)
        for rec in nodes.tolist():
            last = read_calls.get(int(ops.call[rec]))
            if last is not None and last > rec:
                node_after[rec] = last
    return HbFacts(blocking, tuple(imp.device_syncs), node_after)


@dataclass
class CaptureRaces:
    """:func:`capture_races`'s answer: the report, the accesses, the facts and the notes on
    what the analysis lacks or assumed (one sentence each); :meth:`name_of` names an
    access's side in a report's words."""

    report: RaceReport
    accesses: CaptureAccesses
    facts: HbFacts
    notes: list[str]
    window: int
    trace: Trace
    #: per launch span, the ranges around it (innermost first); the mapping's own phases
    ranges: dict = field(default_factory=dict)
    phases: frozenset = frozenset()

    def name_of(self, op: int) -> str:
        """An access's side in words: its phase where the mapping names it (``verify``), else
        the innermost range around its launch (``scheduler.prepare_for_decode``), else its
        kernel."""
        trace = self.trace
        phase = trace.text(int(trace.ops.phase[op]))
        if phase in self.phases:
            return phase
        around = self.ranges.get(int(trace.ops.call[op]))
        if around:
            return around[0]
        return phase or short_label(trace.text(int(trace.ops.label[op])), 40)

    @property
    def latent(self):
        return self.report.latent

    def steps(self) -> list[int]:
        """The steps of the later accesses of the latent races."""
        return sorted({r.second_step for r in self.report.latent})

    def summary(self) -> dict:
        """The figures a report line gives: latent races (access pairs), the steps of their
        later accesses, how many also overlapped in time, ordered pairs that overlapped
        (an edge assumed that the run did not have), and what was mapped."""
        races = self.report.races
        latent = self.report.latent
        return {"latent": len(latent), "steps": len(self.steps()),
                "observed": sum(1 for r in latent if r.observed),
                "ordered_overlaps": sum(1 for r in races if r.observed and not r.latent),
                "buffers": sorted({r.buffer for r in latent}),
                "reads": self.accesses.count(Mode.READ),
                "writes": self.accesses.count(Mode.WRITE),
                "mapped_buffers": self.accesses.buffers(), "window": self.window}


def capture_races(imp: KinetoImport, mapping: Mapping, where: str = "mapping",
                  window: int = 2) -> CaptureRaces:
    """The latent races of an imported capture under its mapping's accesses (see the module
    docstring); ``where`` names the mapping in an error."""
    acc = capture_accesses(imp, mapping, where)
    facts = hb_facts(imp, acc.accesses)
    report = latent_races(imp.trace, acc.accesses, facts, window)
    phases = frozenset(mapping.phases.values()) - {mapping.unmatched_phase()}
    return CaptureRaces(report, acc, facts, _notes(imp, acc, facts), window, imp.trace,
                        launch_ranges(imp.trace, imp.annotations), phases)


def _notes(imp: KinetoImport, acc: CaptureAccesses, facts: HbFacts) -> list[str]:
    trace = imp.trace
    ops = trace.ops
    notes = []
    nodes = int(np.count_nonzero(trace.graph_node() & (ops.kind == OpKind.RECORD)))
    if nodes:
        after = len(facts.node_after)
        notes.append(f"{nodes} in-graph record nodes: {after} taken to follow their graph's "
                     f"last mapped read, {nodes - after} to come first in their graph (no "
                     f"mapped read in it); a capture does not say where in a graph a node sits")
    if facts.blocking:
        notes.append(f"{len(facts.blocking)} blocking copies (D2H into pageable memory): the "
                     f"host is ordered after each")
    if facts.device_syncs:
        notes.append(f"{len(facts.device_syncs)} device synchronizes: the host is ordered "
                     f"after every stream")
    c = imp.counts
    waits = int(c.get("waits_unbound", 0))
    syncs = max(0, int(c.get("syncs_unbound", 0)) - len(facts.device_syncs))
    unbound = [f"{n} {what}{'s' if n > 1 else ''}" for n, what in
               ((waits, "stream wait"), (syncs, "host sync")) if n]
    if unbound:
        notes.append(f"{' and '.join(unbound)} bound to no record (simwar.capture.binding): "
                     f"the {'edges they carry are' if waits + syncs > 1 else 'edge it carries is'} "
                     f"missing here, so a race across one may be ordered in fact")
    other = {int(h) for h in np.unique(trace.spans.lane)} - {trace.code(HOST)}
    launches = int(c.get("launches_other_threads", 0))
    if launches and other:
        notes.append(f"{launches} launches from other host threads: each thread has its own "
                     f"clock (no host edge between threads)")
    if not any(m == Mode.WRITE for m in acc.accesses.mode):
        notes.append("no device op writes a mapped buffer (writes: in the mapping): no race "
                     "can be found")
    return notes


__all__ = ["BLOCKING_COPY", "CaptureAccesses", "CaptureRaces", "Rule", "access_rules",
           "capture_accesses", "capture_races", "hb_facts", "launch_ranges"]
