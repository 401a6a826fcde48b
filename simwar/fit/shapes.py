"""Each captured step's shape, and the prefill's and idle step's costs fitted from the steps.

A server that prefills prompts runs steps of several shapes (docs/design.md, "Iteration
shapes"): a ``decode`` step (the phase table), a ``prefill`` step of its own (SGLang's
default: the prefill forward alone, the decodes paused) and a ``mixed`` step (a prefill chunk,
then the decode phases). :func:`classify` reads each step's shape from the capture, never from
its times:

- **the step's shape range** (the mapping's ``shape`` regex: :mod:`simwar.capture.step_shapes`;
  the presets read SGLang's ``step[EXTEND bs=15 toks=15360]`` and the mini-server's ``decode
  bs=B``, ``prefill bs=N toks=T``, ``mixed bs=B toks=T reqs=N``): its mode word is one of
  :data:`MODES` (SGLang's forward modes EXTEND, DECODE, MIXED, IDLE and its speculative ones,
  which decode); a word the table does not name is a :class:`ShapeError` (one line);
- **the step's prefill work**: forward kernels of the phase ``prefill`` (the mapping's
  ``phases``), for a step whose range names no prompt tokens (a mixed step the range calls
  ``decode bs=B``, as older mini-server captures do).

A step whose range says it prefills tokens (a prefill or extend mode, or a token count > 0 in a
mixed one), or that has prefill work where its range names no tokens, prefills; one that also
runs decode phases (forward kernels of another phase, or a decode/mixed mode) is ``mixed``,
else ``prefill``; every other step is ``decode``. An ``idle`` step (a DP-attention idle batch:
its range's mode IDLE, or a decode of no request, ``decode bs=0``, without prefill work) is
none of these: :func:`idle_samples` measures its forward (the host's work before its launch,
its kernels' device time) and :func:`idle_section` writes ``scheduling.idle`` from them.

:func:`split_prefill` takes the prefill's units out of the fitted steps' layouts (so that the
decode phases are fitted from decode and mixed steps alike, as one structure) and measures,
per step that prefills: its **window** (from the end of the host call before its first launch
to its last launch's end, less the profiler's own cost there: its dispatch and launches,
which the decode phases' first host region gives back, :func:`give_back`; the host time the
section fits keeps the profiler's cost for an eager prefill, which it did not lengthen:
:data:`EAGER_PREFILL_LESS_PROFILER` says why), its **launch
calls** and their host time, and its kernels' **device time** (busy from the first kernel's
start, overlaps counted once). The loop's host work (its CPU items, each phase's dispatch) is
the decode steps' alone where there are enough of them (:func:`split_host`): what a mixed
step took beyond them in those keys, and what a prefill step's CPU work around its forward
took beyond theirs (:func:`prefill_step_host`), is the prefill's host time too (scheduling a
prefill batch).

:func:`prefill_section` writes an eager prefill as the simulator runs it (docs/design.md,
"Prefill": ``launches`` host dispatches, each followed by its kernel): ``launches`` the mean
count of its launch calls (at most :data:`FIT_MAX_LAUNCHES`), ``forward_us`` the kernels'
whole device time, or more where the capture's forward ended later than that after the
simulated launches (:func:`launch_device`), ``host_us`` the window less that many launch
calls at the config's ``costs.launch_us``, and ``host_before_us`` the host work its step did
before the window beyond a decode step's (preparing its requests: before the first launch, as
captured, not spread over the launches, where the kernels would start under it), so that the
simulated prefill's kernels start as its launches go on and end where the capture's did (a
graph prefill: one launch, the host time before it and the device time after it). Each is
``{base, per_token}`` over the steps' prompt tokens by least squares, clamped so that no
part is negative (:func:`token_line`); ``forward_us`` also takes ``per_token_prefix`` (a
later chunk's attention over the prefix already cached) where the ranges show carried-over
chunks (:func:`prefixes`: from each step's tokens and requests, never from times;
:func:`prefix_line`). A step of the mixed rules that
prefills nothing is a decode step in the simulator as on the server (no prefill launched),
so the loop's host work is fitted as captured whatever the rule. It also writes
``chunk_tokens`` (the most a step used of it: :func:`budgeted`), ``graph`` and the
scheduling rule the steps show (:func:`rule_of`: chunks inside decode steps →
``sglang_mixed``, whose prefill steps of their own are those with nothing decoding; prefill
steps of their own alone → ``sglang``); :mod:`simwar.fit.shape_workload` writes a workload
of requests with prompts as the capture's arrived. ``--check`` compares each shape's figures:
:mod:`simwar.fit.shape_check`.

Imports: numpy, the standard library and simwar's capture and fit layout modules; never the
simulator.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from simwar.core.trace import OpKind, Trace
from simwar.fit.launches import (
    FIT_MAX_LAUNCHES,
    launch_count,
    launch_device,
    launch_shares,
    shares_device,
)
from simwar.fit.layout import StepLayout, columns
from simwar.fit.prefix import MIN_PREFIX_STEPS, _r, prefix_line, prefixes, token_line

#: the phase name whose kernels are a prefill's work (the mapping's ``phases`` name it)
PREFILL_PHASE = "prefill"
#: a shape range's mode word (lower case) → what the step runs: ``prefill`` (a prefill step
#: of its own), ``decode``, ``mixed`` or ``idle``; ``step``: the range names no mode
MODES = {"decode": "decode", "target_verify": "decode", "draft_extend": "decode",
         "draft_extend_v2": "decode", "extend": "prefill", "prefill": "prefill",
         "mixed": "mixed", "idle": "idle", "step": ""}
#: which of a step's ranges says what it runs, when it has several (one per forward: SGLang's
#: speculative EXTEND then DRAFT_EXTEND is a prefill step)
RANK = {"": 0, "idle": 1, "decode": 2, "prefill": 3, "mixed": 4}
#: the shapes a fitted config's steps have, in the order rows and the header list them
SHAPE_ORDER = ("decode", "prefill", "mixed", "idle")
#: whether an eager prefill's host figures (its dispatch, launches and host time) are taken
#: net of the profiler's per-event cost (:mod:`simwar.fit.profiler_cost`): no. On the H200 the
#: mini-server's profiled and un-profiled twins (``tests/data/server/shapes/twins``, three
#: processes, ``python -m lab.shapes_check``) launched the eager prefill 0.53-0.81x as long
#: profiled as un-profiled, while their graph-launched decode steps ran 1.13-1.82x as long:
#: the per-event costs would take 22 % (420 µs a step) out of a prefill the profiler did not
#: lengthen. The window the decode phases' first host region gives back stays net (that
#: region was taken net); a graph-launched prefill is taken net like every other host figure.
EAGER_PREFILL_LESS_PROFILER = False


class ShapeError(ValueError):
    """A captured step's shape cannot be read; the message is one line."""


@dataclass
class StepKinds:
    """Per step of the capture: its shape (:data:`SHAPE_ORDER`, or ``idle``), the prompt
    tokens it prefilled (-1: its range names none) and the requests in its prefill chunk
    (absent: not named; a prefill step's batch, or the range's ``context`` group: vLLM's
    context count, the mini-server's mixed ``reqs=N``)."""

    shape: dict[int, str] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    requests: dict[int, int] = field(default_factory=dict)
    decodes: dict[int, int] = field(default_factory=dict)  # a mixed step's, where named
    #: whether the decodes took their tokens of the chunk budget first (:func:`budgeted`)
    budgeted: bool = False

    def budget(self, k: int) -> int:
        """The tokens of ``prefill.chunk_tokens`` step k used: its prompt tokens, and its
        decodes' where they took theirs first (:attr:`budgeted`); -1 where its range names
        no tokens."""
        t = self.tokens.get(k, -1)
        return t + self.decodes.get(k, 0) if t >= 0 and self.budgeted else t

    def steps(self, *shapes: str) -> list[int]:
        return sorted(k for k, s in self.shape.items() if s in shapes)

    @property
    def prefills(self) -> bool:
        """Whether any step prefills (a prefill or a mixed step)."""
        return any(s in ("prefill", "mixed") for s in self.shape.values())

    def counts(self, steps=None) -> Counter:
        keep = self.shape if steps is None else {k: self.shape[k] for k in steps
                                                 if k in self.shape}
        return Counter(keep.values())


def _work_steps(trace: Trace) -> tuple[set[int], set[int]]:
    """``(steps with prefill kernels, steps with kernels of another phase)`` on the forward
    stream (the import's ``forward_stream``; every stream when it names none)."""
    ops = trace.ops
    kernel = ops.kind == OpKind.KERNEL
    fwd = trace.meta.get("forward_stream")
    if fwd and trace.code(fwd) >= 0:
        kernel &= ops.lane == trace.code(fwd)
    empty, pre = trace.code(""), trace.code(PREFILL_PHASE)  # -2 where absent: none
    phase, step = ops.phase[kernel], ops.step[kernel]
    return (set(step[phase == pre].tolist()),
            set(step[(phase != pre) & (phase != empty)].tolist()))


def classify(cap, where: str = "capture") -> StepKinds:
    """Each step's shape (see the module docstring) from an opened capture
    (:class:`simwar.capture.open.Capture`: its shape ranges, ``cap.shapes``, and its trace)."""
    trace = cap.bound.trace
    with_prefill, with_decode = _work_steps(trace)
    ranged: dict[int, tuple[str, int, int, bool, int]] = {}
    rx = re.compile(cap.mapping.shape) if cap.mapping.shape else None
    for s in cap.shapes:
        if s.step < 0:
            continue
        word = s.mode.lower()
        if word not in MODES:
            known = ", ".join(w.upper() for w in MODES if w != "step")
            raise ShapeError(f"{where}: step {s.step}'s range '{s.name}' names the step kind "
                             f"'{s.mode}', which simwar does not know (shape: {known}); "
                             f"rename it in the mapping's shape pattern")
        groups = (m.groupdict() if rx is not None and (m := rx.search(s.name)) is not None
                  else {})
        named = any(groups.get(g) is not None for g in ("tokens", "context_tokens"))
        tokens = s.tokens
        if (groups.get("context_tokens") or "").isdigit():  # the prompts' own (vLLM's names)
            tokens = int(groups["context_tokens"])
        # the chunk's requests where the range counts them apart from the decoding ones
        # (vLLM's context count; the mini-server's mixed ``reqs=N``): -1 where it does not
        chunk = int(groups["context"]) if (groups.get("context") or "").isdigit() else -1
        mode = MODES[word]
        # its decodes' tokens: vLLM's generation tokens (or count), else a mixed range's batch
        # where no context count sits beside it in the batch
        dec = next((int(groups[g]) for g in ("generation_tokens", "generation")
                    if (groups.get(g) or "").isdigit()), -1)
        if dec < 0 and mode == "mixed" and (groups.get("batch") or "").isdigit():
            dec = s.batch
        held = ranged.get(s.step)
        if held is None or RANK[mode] > RANK[held[0]]:  # a step of several forwards (SGLang's
            ranged[s.step] = (mode, s.batch, tokens, named, chunk, dec)  # EXTEND, DRAFT_EXTEND)
    out = StepKinds()
    for k in sorted(with_prefill | with_decode | set(ranged)):
        mode, batch, tokens, named, chunk, dec = ranged.get(k, ("", -1, -1, False, -1, -1))
        if mode == "idle" or (mode == "decode" and batch == 0 and k not in with_prefill):
            out.shape[k] = "idle"  # a forward with no request (a decode of none: the same)
            continue
        toks = tokens if named or mode == "prefill" else -1
        if mode == "decode" and named and toks >= 0 and toks == batch:
            toks = 0  # a decode step's tokens are its batch's, no prompt's
        if mode in ("prefill", "mixed"):
            prefills = toks != 0
        else:  # a decode range, or none: its prefill work says, unless it counts tokens
            prefills = (toks > 0) if named else k in with_prefill
        if not prefills:
            out.shape[k] = "decode"
            continue
        decodes = mode in ("decode", "mixed") or k in with_decode
        out.shape[k] = "mixed" if (decodes and mode != "prefill") else "prefill"
        out.tokens[k] = toks
        if out.shape[k] == "mixed" and dec > 0:
            out.decodes[k] = dec
        if chunk >= 0:  # a mixed step's (or any step's) chunk requests, named
            out.requests[k] = chunk
        elif mode == "prefill" and batch >= 0:  # a prefill step's batch is its chunk's
            out.requests[k] = batch
    out.budgeted = budgeted(out)
    return out


def budgeted(kinds: StepKinds) -> bool:
    """Whether the capture's mixed steps gave their decodes (the range's ``bs=B``, vLLM's
    generation tokens) their tokens of the chunk budget first (SGLang's mixed chunk:
    ``PrefillAdder``'s ``mixed_with_decode_tokens``; vLLM), from the ranges: then prompt plus
    decode tokens is the same on every step that filled it; with the whole budget, the prompt
    tokens are. The reading with more steps at its largest value wins (a tie, or no decodes named:
    the whole budget)."""
    steps = [k for k, t in kinds.tokens.items() if t > 0]
    if not any(k in kinds.decodes for k in steps):
        return False
    plain = [kinds.tokens[k] for k in steps]
    summed = [kinds.tokens[k] + kinds.decodes.get(k, 0) for k in steps]
    return summed.count(max(summed)) > plain.count(max(plain))


@dataclass
class PrefillSample:
    """What one step's prefill took: its host time (``host_us``), the host window the decode
    phases' first region gives back (``window_us``), the device work left after the host's
    last prefill launch (``device_us``), its prompt tokens (-1: not named) and whether it ran
    as a graph launch."""

    step: int
    shape: str
    tokens: int
    host_us: float
    window_us: float
    device_us: float
    graph: bool
    then: int = 0  # the decode unit after it (of the layout without prefill units)
    launches: int = 0  # its launch calls (kernel and graph launches)
    launch_us: float = 0.0  # their host time (less the profiler's cost where fit_window_us is)
    busy_us: float = 0.0  # its kernels' device time from the first's start (overlaps once)
    end_us: float = 0.0  # its last kernel's end from the window's start (less a stream wait)
    fit_window_us: float = 0.0  # the host time the section fits: the window as captured
    # (an eager prefill's: EAGER_PREFILL_LESS_PROFILER), else the window net
    batch: int = 0  # the decoding requests of its step (0: a prefill step of its own)
    prefix: int = -1  # its (chunk token, cached token) pairs (-1: the ranges do not say)
    extra_us: float = 0.0  # host work its step took around the forward beyond a decode step's
    extra_before_us: float = 0.0  # the part of it before the forward's window
    # per launch call in issue order: its host time (from the call before's end, the first
    # from the window's start, to its own end) and its kernels' device time (ops.call)
    call_host: np.ndarray = field(default_factory=lambda: np.zeros(0))
    call_device: np.ndarray = field(default_factory=lambda: np.zeros(0))


def split_prefill(trace: Trace, lays: dict[int, StepLayout], kinds: StepKinds, prof=None
                  ) -> tuple[dict[int, StepLayout], dict[int, PrefillSample]]:
    """``(layouts, samples)``: every layout without its prefill units (a prefill step of its
    own, which has nothing else, is left out of them), and per fitted step that prefills what
    its prefill took (see the module docstring). ``prof``: the profiler's own host cost
    (:class:`simwar.fit.profiler_cost.ProfilerCost`), taken out of the host figures."""
    s0, e0 = columns(trace, "spans", "start_us", "end_us")
    op_start, op_end, op_call = columns(trace, "ops", "start_us", "end_us", "call")
    kept: dict[int, StepLayout] = {}
    samples: dict[int, PrefillSample] = {}
    for k, lay in lays.items():
        shape = kinds.shape.get(k, "decode")
        if shape == "idle":
            continue
        pre = [u for u in lay.units if u.phase == PREFILL_PHASE]
        if shape == "prefill":
            pre = list(lay.units)  # a step of its own: all its forward is the prefill's
        rest = [u for u in lay.units if u not in pre]
        if rest:
            kept[k] = replace(lay, units=rest)
        if not pre:
            continue
        got = _sample(k, shape, kinds.tokens.get(k, -1) if shape != "decode" else 0, pre, lay,
                      s0, e0, op_start, op_end, op_call, prof)
        last = pre[-1].calls[-1]  # the decode unit whose host region holds the prefill's
        got.then = next((i for i, u in enumerate(rest) if s0[u.calls[0]] > s0[last]),
                        len(rest))
        samples[k] = got  # a decode step's: an empty chunk's launch, given back all the same
    return kept, samples


def _sample(k, shape, tokens, units, lay, s0, e0, op_start, op_end, op_call, prof
            ) -> PrefillSample:
    calls = [c for u in units for c in u.calls]
    first, last = calls[0], calls[-1]
    begin = _window_start(lay, first, s0, e0, float(s0[first]), set(calls))
    t_last = float(s0[last])
    host = t_last - begin
    window = fitted = float(e0[last]) - begin
    graph = any(u.graph is not None for u in units)
    if prof is not None:  # the window is taken out of a host region net of the profiler
        window = prof.less(window, begin, float(e0[last]))
    if not graph and not EAGER_PREFILL_LESS_PROFILER:
        prof = None  # the profiler did not lengthen an eager prefill's launches: kept
    else:
        fitted = window  # the host time the section fits, net like every other host figure
    if prof is not None:
        host = prof.less(host, begin, t_last)
    ops = sorted((o for u in units for o in u.ops), key=lambda o: op_start[o])
    device = _busy(ops, op_start, op_end, t_last)
    busy = _busy(ops, op_start, op_end, -np.inf)
    spent = sum(prof.less(float(e0[c] - s0[c]), float(s0[c]), float(e0[c]))
                if prof is not None else float(e0[c] - s0[c]) for c in calls)
    # the forward's end from the window's start, less the time its first kernel waited for
    # the stream (the step before's forward: the simulated run waits for its own)
    wait = max(0.0, float(op_start[ops[0]]) - float(e0[first])) if ops else 0.0
    end = (max(op_end[o] for o in ops) - begin - wait) if ops else 0.0
    ends = np.array([float(e0[c]) for c in calls])
    call_host = np.diff(ends, prepend=begin)
    index = {c: i for i, c in enumerate(calls)}
    call_device = np.zeros(len(calls))
    for o in ops:  # each kernel its launch call's (the trace's launch edge)
        i = index.get(int(op_call[o]), -1)
        if i >= 0:
            call_device[i] += float(op_end[o] - op_start[o])
    return PrefillSample(k, shape, tokens, max(host, 0.0), max(window, 0.0), device, graph,
                         launches=len(calls), launch_us=spent, busy_us=busy,
                         end_us=float(end), fit_window_us=max(fitted, 0.0),
                         call_host=call_host, call_device=call_device)


def _window_start(lay: StepLayout, first: int, s0, e0, default: float | None = None,
                 skip=()) -> float:
    """Where the host window of a forward whose first launch call is ``first`` starts in its
    step ``lay``: at the end of the step's last call that ended before that launch began (but
    the calls of ``skip``: the forward's own), else at ``default`` (None: the step's start);
    never before the step's start. (``s0``, ``e0``: the spans' start and end.)"""
    ends = [float(e0[c]) for c in lay.calls if e0[c] <= s0[first] and c not in skip]
    at = max(ends) if ends else (lay.start if default is None else default)
    return max(at, lay.start)


def _busy(ops, op_start, op_end, since: float) -> float:
    """The device time of ``ops`` (sorted by start) from ``since`` on, overlaps counted
    once."""
    total, busy_to = 0.0, since
    for o in ops:
        a, b = max(op_start[o], busy_to), op_end[o]
        if b > a:
            total += b - a
            busy_to = b
    return float(total)


@dataclass
class IdleSample:
    """What one idle step's forward took: the host's work before its launch (``host_us``:
    from the end of the call before it to its start, less the profiler's cost there), its
    kernels' device time (``device_us``) and whether it ran as a graph launch."""

    step: int
    host_us: float
    device_us: float
    graph: bool


def idle_samples(trace: Trace, lays: dict[int, StepLayout], kinds: StepKinds, prof=None
                 ) -> dict[int, IdleSample]:
    """Per fitted idle step (``kinds``: a forward with no request, SGLang's IDLE), what its
    forward took (:class:`IdleSample`): the simulator's idle step is host work, then one
    kernel or graph launch (``scheduling.idle``)."""
    s0, e0 = columns(trace, "spans", "start_us", "end_us")
    op_start, op_end = columns(trace, "ops", "start_us", "end_us")
    out: dict[int, IdleSample] = {}
    for k, lay in lays.items():
        if kinds.shape.get(k) != "idle" or not lay.units:
            continue
        first = lay.units[0].calls[0]
        begin = _window_start(lay, first, s0, e0)
        host = float(s0[first]) - begin
        if prof is not None:
            host = prof.less(host, begin, float(s0[first]))
        ops = sorted((o for u in lay.units for o in u.ops), key=lambda o: op_start[o])
        out[k] = IdleSample(k, max(host, 0.0), _busy(ops, op_start, op_end, -np.inf),
                            any(u.graph is not None for u in lay.units))
    return out


def idle_section(samples: dict[int, IdleSample]) -> tuple[dict, list[str]]:
    """``(scheduling.idle, header lines)`` from the idle steps: each figure their mean (the
    section's durations are drawn per idle step; the check compares means), ``graph`` full
    where most ran as a graph launch."""
    got = list(samples.values())
    fwd = _r(float(np.mean([p.device_us for p in got])))
    host = _r(float(np.mean([p.host_us for p in got])))
    graph = "full" if sum(p.graph for p in got) * 2 > len(got) else "eager"
    section = {"forward_us": fwd, "host_us": host, "graph": graph}
    return section, [f"Idle ({len(got)} steps with no request: SGLang's IDLE forward, a decode "
                     f"of none): scheduling.idle.forward_us {fwd:g} µs (its kernels' device "
                     f"time, mean), host_us {host:g} µs (the host's work before its launch, "
                     f"less the profiler's cost there, mean), graph {graph} (how it ran)."]


def give_back(s, names: list[str], samples: dict[int, PrefillSample]) -> None:
    """Take each step's prefill window out of the host region of the decode unit after it
    (``phases.NAME.host_us`` of that step, in the :class:`simwar.fit.samples.Samples` ``s``;
    ``cpu.post_launch_us`` after the last unit): it holds the prefill's dispatch and
    launches, which the prefill section models."""
    where: dict[str, dict[int, int]] = {}
    for k, got in samples.items():
        key = f"phases.{names[got.then]}.host_us" if got.then < len(names) \
            else "cpu.post_launch_us"
        if key not in where:
            where[key] = {step: i for i, step in enumerate(s.steps_of(key))}
        i = where[key].get(k)
        if i is not None:
            s[key][i] = max(0.0, s[key][i] - got.window_us)


#: the fewest decode steps (and share of the fitted steps) from which the loop's host work is
#: fitted apart from the mixed steps' (:func:`split_host`)
MIN_DECODE_STEPS, MIN_DECODE_SHARE = 10, 0.2
#: host keys whose sample in step k is step k-1's work (its result processed)
PREVIOUS = ("cpu.process_result_us",)
#: host keys of the work the loop does before it launches a step's forward
BEFORE = ("cpu.ingest_us", "cpu.schedule_us", "cpu.prepare_us")


def split_host(s, samples: dict[int, PrefillSample], first: str | None = None) -> float:
    """The loop's host work (``cpu.*``, ``phases.NAME.host_us`` in the
    :class:`simwar.fit.samples.Samples` ``s``) from the decode steps alone, and each mixed
    step's excess over their means (summed over the keys: the host work its prefill adds
    outside its dispatch, e.g. preparing the new requests) added to that step's prefill host
    time. The excess of the work the loop does before it launches the forward
    (:data:`BEFORE`) and of the first phase's host time (``first``: its name; on the server
    the rest of the batch's preparation up to its first copy) is before the step's first
    kernel, so it is also the prefill's preparation before its first launch
    (``extra_before_us``, ``prefill.host_before_us``). A capture with too few decode steps
    (:data:`MIN_DECODE_STEPS`, :data:`MIN_DECODE_SHARE`) keeps every step's samples. Returns
    the mean excess per mixed step (0: not split)."""
    mixed = {k for k, p in samples.items() if p.shape == "mixed"}
    keys = [k for k in s if k.startswith("cpu.") or (k.startswith("phases.")
                                                     and k.endswith(".host_us"))]
    if not mixed or not keys:
        return 0.0
    steps = s.steps_of(keys[0])
    decode = [k for k in steps if k not in mixed]
    if len(decode) < max(MIN_DECODE_STEPS, MIN_DECODE_SHARE * len(steps)):
        return 0.0
    excess = dict.fromkeys(mixed, 0.0)
    first_key = f"phases.{first}.host_us" if first else None
    for key in keys:
        shift = 1 if key in PREVIOUS else 0
        of = [k - shift for k in s.steps_of(key)]
        values = s[key]
        plain = [v for v, k in zip(values, of) if k not in mixed]
        if not plain:
            continue
        base = float(np.mean(plain))
        for v, k in zip(values, of):
            if k in excess:
                excess[k] += v - base
                if key in BEFORE or key == first_key:  # before its first kernel
                    samples[k].extra_before_us += v - base
        s.keep(key, lambda i, of=of: of[i] not in mixed)
    for k, extra in excess.items():
        samples[k].extra_us += extra
    return float(np.mean(list(excess.values())))


def cpu_outside(trace: Trace, lay: StepLayout, units, prof=None, before_only: bool = False,
                loop_only: bool = False) -> float:
    """A step's host time outside every API call (its CPU work) and outside its forward's
    window (from the end of the call before its first forward launch to its last forward
    call's end: the dispatch and launches of ``units``), less the profiler's own cost there:
    the loop's scheduling, preparing and result processing around the forward
    (``before_only``: the part before the window; ``loop_only``: the part before the window
    taken only up to the step's first schedule-stream call, the loop's own work, not the
    first phase's host time after it, ``phases.NAME.host_us``)."""
    s0, e0 = columns(trace, "spans", "start_us", "end_us")
    first = units[0].calls[0]
    last = units[-1].calls[-1]
    lo = _window_start(lay, first, s0, e0)
    if loop_only and lay.sched_calls:  # up to its schedule-stream calls: the loop's own
        lo = min(lo, float(s0[lay.sched_calls[0]]))
    hi = float(e0[last])
    calls = sorted((float(s0[c]), float(e0[c])) for c in lay.calls)
    total, t = 0.0, lay.start
    for a, b in calls + [(lay.end, lay.end)]:
        parts = ((t, min(a, lo)),) if before_only else ((t, min(a, lo)), (max(t, hi), a))
        for x, y in parts:  # the gap, less the forward window
            if y > x:
                total += prof.less(y - x, x, y) if prof is not None else y - x
        t = max(t, b)
    return total


def prefill_step_host(trace: Trace, lays: dict[int, StepLayout], decode: dict[int, StepLayout],
                      samples: dict[int, PrefillSample], prof=None, batch=None,
                      held=None) -> float:
    """Each prefill step's (of its own) CPU work around its forward (:func:`cpu_outside`)
    beyond the decode steps' mean (``decode``: their layouts without prefill units), added to
    its prefill host time: scheduling a prefill batch, which the config's loop CPU work (the
    decode steps') does not hold. Returns the mean excess (0: no prefill step, or no decode
    step to compare with).

    The part before the forward's window is taken beyond the decode steps' at a batch of 0
    (``batch``: each step's decode batch; the intercept of their line in it), not at their
    mean batch: the simulated loop does the work it does before a step's forward (schedule,
    prepare) at that step's batch, which is 0 for a prefill step of its own, so the decode
    steps' mean would count their per-request work against the prefill (on the H200's
    ``sglang`` capture 140 µs of scheduling, 23 µs a request at a mean batch of 6: every
    prefill step's forward started that much early in the simulation).

    The decode steps' part before the window ends at their first schedule-stream call: what
    follows it up to their forward's first launch is their first phase's host time
    (``phases.NAME.host_us``: on the server, the rest of the batch's preparation and
    ``run_batch`` up to the batch's first copy), which a simulated prefill step of its own
    does not run (it has no decode phase), so counting it in their baseline took it out of
    every prefill's preparation (on the H200's ``sglang`` captures 70-160 µs; in a simulated
    capture nothing but calls lies there, so its fit is unchanged).

    ``held``: per step, the receive ranges' ``(start, end, µs)`` (:mod:`simwar.fit.receive`;
    at the loop's top, before the forward), out of every step's CPU work here."""
    steps = [k for k, p in samples.items() if p.shape == "prefill" and k in lays]
    if not steps or not decode:
        return 0.0
    less = {k: sum(us for *_, us in v) for k, v in (held or {}).items()}
    base = float(np.mean([cpu_outside(trace, lay, lay.units, prof, loop_only=True)
                          - less.get(k, 0.0) for k, lay in decode.items()]))
    befores = {k: cpu_outside(trace, lay, lay.units, prof, True, True) - less.get(k, 0.0)
               for k, lay in decode.items()}
    first = float(np.mean(list(befores.values())))
    at_zero = first
    if batch is not None:
        xb = np.array([float(batch[k]) for k in befores if 0 <= k < len(batch)])
        yb = np.array([v for k, v in befores.items() if 0 <= k < len(batch)])
        if len(xb) > 2 and np.ptp(xb) > 0:
            slope, icpt = np.polyfit(xb, yb, 1)
            if slope > 0:  # per-request work before the forward: none at a prefill step's 0
                at_zero = float(icpt)
    out = []
    for k in steps:
        own = less.get(k, 0.0)
        extra = cpu_outside(trace, lays[k], lays[k].units, prof) - own - base + (first - at_zero)
        samples[k].extra_us += extra
        samples[k].extra_before_us += cpu_outside(trace, lays[k], lays[k].units, prof,
                                                  True) - own - at_zero
        out.append(extra)
    return float(np.mean(out))


def rule_of(kinds: StepKinds, steps) -> str:
    """The scheduling rule the steps show: any mixed step → ``sglang_mixed`` (SGLang's mixed
    chunk mixes a chunk into the running batch whenever it has one, so its prefill steps of
    their own are those with no request decoding: a capture of it at a varying load holds a
    few); prefill steps of their own and no mixed step → ``sglang``."""
    seen = kinds.counts(steps)
    return "sglang_mixed" if seen.get("mixed") or not seen.get("prefill") else "sglang"


def prefill_section(samples: dict[int, PrefillSample], reads: list[str], excess: float = 0.0,
                    launch_cost=None, kinds: StepKinds | None = None, shares: bool = False
                    ) -> tuple[dict, list[str]]:
    """``(prefill section, header lines)`` from the steps that prefilled tokens (``excess``:
    the mean host work a mixed step added outside its prefill, :func:`split_host`).

    An eager prefill (its launches as launched, ``prefill.launches``): ``launches`` the
    mean count of its launch calls (at most :data:`FIT_MAX_LAUNCHES`), ``forward_us`` its
    kernels' whole device time (or more: :func:`launch_device`), ``host_us`` its host
    window (from the call before its first launch to its last launch's end) less
    ``launches`` launch calls at the config's cost (``launch_cost(batch)``:
    ``costs.launch_us`` at the step's batch plus ``host_call_us``; the simulated prefill then
    spends the window's host time over its launches, each kernel after its own), plus its
    step's host work beyond a decode step's but the part before the window, which is
    ``host_before_us`` (before the first launch); ``shares``: each launch its measured
    share of the host and device time (``host_shares``, ``device_shares``:
    :func:`~simwar.fit.launches.launch_shares`), the device time the kernels' busy time or
    more (:func:`~simwar.fit.launches.shares_device`). A graph
    prefill: host time to its launch, the device time after it. ``kinds``: the steps'
    ranges, whose carried-over chunks give ``forward_us.per_token_prefix``
    (:func:`prefixes`)."""
    got = [p for p in samples.values() if p.shape in ("prefill", "mixed")]
    graph = "piecewise" if got and sum(p.graph for p in got) * 2 > len(got) else "eager"
    x = [p.tokens for p in got]
    # the budget: the most a step used of it (its decodes' tokens too where they took theirs
    # first: StepKinds.budget)
    used = [kinds.budget(p.step) if kinds is not None and p.step in kinds.tokens else p.tokens
            for p in got]
    named = [t for t in used if t > 0]
    chunk = max(named) if named else 8192
    launches, mean_launches = launch_count([p.launches for p in got]) if graph == "eager" \
        else (1, 0.0)
    host_w: list[float] = []
    device_w: list[float] = []
    befores: list[float] = []
    if graph == "eager":
        cost = (lambda batch: 0.0) if launch_cost is None else launch_cost
        # the host work its step did before the window (beyond a decode step's: preparing
        # its requests) is prefill.host_before_us, before the first launch as on the server,
        # not spread over the launches, where the kernels would start under it and the
        # device time would have to be stretched to end where the capture's did (by about
        # that work: 1.4 ms on the H200's mixed capture, a device-bound loop's loss)
        befores = [max(0.0, p.extra_before_us) for p in got]
        hosts = [max(0.0, p.fit_window_us - launches * cost(p.batch) + p.extra_us - b)
                 for p, b in zip(got, befores)]
        # each launch its measured share of the host and device time (launch_shares): the
        # long kernels run under the launches of the short ones after them
        if shares:
            host_w, device_w, _ = launch_shares(
                [(p.call_host, p.call_device, cost(p.batch)) for p in got], launches)
        if device_w:  # the busy time, or more where the capture's forward ended later
            devices = [max(p.busy_us, shares_device(
                p.end_us + p.extra_before_us - b, p.fit_window_us + p.extra_us - b,
                host_w or [1.0] * launches, device_w)) for p, b in zip(got, befores)]
        else:  # one launch (or no step with enough calls): the busy time, or more where the
            # capture's forward ended later than that after the simulated launch(es)
            devices = [max(p.busy_us, launch_device(p.end_us + p.extra_before_us - b,
                                                    p.fit_window_us + p.extra_us - b,
                                                    launches))
                       for p, b in zip(got, befores)]
    else:
        hosts = [max(0.0, p.host_us + p.extra_us) for p in got]
        devices = [p.device_us for p in got]
    prefix_note = ""
    forward = None
    if kinds is not None and named and all(t >= 0 for t in x):
        pre, carried = prefixes(kinds, chunk)
        for p in got:
            p.prefix = pre.get(p.step, -1)
        known = [i for i, p in enumerate(got) if p.prefix >= 0]
        over = sum(got[i].prefix > 0 for i in known)
        if over >= MIN_PREFIX_STEPS:
            forward, how_f = prefix_line([x[i] for i in known], [got[i].prefix for i in known],
                                         [devices[i] for i in known])
            left = len(got) - len(known)
            prefix_note = (f"; {carried} steps continued a carried-over request, {over} of "
                           f"them with a prefix the ranges give"
                           + (f" ({left} steps whose requests' shares the ranges do not name "
                              f"left out)" if left else ""))
        else:
            prefix_note = ("; per_token_prefix 0: the capture gave no carried chunks"
                           if not carried else
                           f"; per_token_prefix 0: {carried} steps continued a carried-over "
                           f"request, {over} with a prefix the ranges give (several "
                           f"requests in a step leave their shares unnamed; "
                           f"{MIN_PREFIX_STEPS} needed)")
    elif named or x:
        prefix_note = "; per_token_prefix 0: the ranges name no tokens, so no carried chunks"
    if forward is None:
        forward, how_f = token_line(x, devices)
    host, how_h = token_line(x, hosts)
    section = {"chunk_tokens": int(chunk), "forward_us": forward, "host_us": host,
               "graph": graph, "reads": list(reads)}
    before, how_b = token_line(x, befores) if befores else (0.0, "")
    if before and (not isinstance(before, dict) or before["base"] or before["per_token"]):
        section["host_before_us"] = before
    if launches > 1:
        section["launches"] = launches
        if host_w:
            section["host_shares"] = host_w
        if device_w:
            section["device_shares"] = device_w
    calls = max(sum(p.launches for p in got), 1)
    per_call = sum(p.launch_us for p in got) / calls
    window = float(np.mean([p.fit_window_us + p.extra_us for p in got])) if got else 0.0
    if graph == "eager":
        dev_line = ("the prefill kernels' busy device time, or more where the capture's "
                    "forward ended later than that after the simulated launches, each launch's "
                    "kernel its measured share (prefill.device_shares)" if device_w else
                    "the prefill kernels' whole device time, or more where the capture's "
                    "forward ended later than that after the simulated launches (each launch's "
                    "kernel takes its share)")
        kept = ("less the profiler's cost there" if EAGER_PREFILL_LESS_PROFILER else
                "the profiler's cost kept: it did not lengthen an eager prefill")
        host_line = (f"host window from the call before its first launch to its last "
                     f"launch's end ({kept}), less {launches} launch "
                     f"call{'s' if launches > 1 else ''} at costs.launch_us + host_call_us")
        launch_line = (f"  prefill.launches {launches}: the capture's {mean_launches:.1f} "
                       f"launches per prefill (mean; {per_call:.2f} µs of host each)"
                       + (f", modelled as {launches} (at most {FIT_MAX_LAUNCHES})"
                          if mean_launches > launches + 0.5 else "")
                       + (f"; each launch its measured share of the host and device time "
                          f"(prefill.host_shares, device_shares: the launch calls cut into "
                          f"{launches} groups in issue order; the largest device share "
                          f"{max(device_w, default=1.0) / launches:.0%}, the smallest "
                          f"{min(device_w, default=1.0) / launches:.1%}), each kernel after "
                          f"its launch" if host_w or device_w else
                          f"; each launch's host time host_us/{launches} + the launch call "
                          f"({window / max(launches, 1):.1f} µs on average: the window "
                          f"{window:.1f} µs over {launches}), each kernel after its launch"))
    else:
        dev_line = "the device work after its graph launch"
        host_line = ("host time from the call before its launch to the launch, less the "
                     "profiler's cost there")
        launch_line = f"  launches: one graph launch ({per_call:.2f} µs of host)"
    lines = [f"Prefill ({len(got)} steps that prefill: "
             + ", ".join(f"{n} {s}" for s, n in Counter(p.shape for p in got).items()) + "):",
             f"  prefill.forward_us {_text(forward)}: {dev_line} ({how_f}{prefix_note})",
             f"  prefill.host_us {_text(host)}: {host_line}"
             + (f", plus the host work its step took around it beyond the decode steps' "
                f"(mean {excess:+.1f} µs; the loop's host work is the decode steps')"
                if abs(excess) >= 0.05 else "")
             + (", less the part of it before the window (prefill.host_before_us)"
                if "host_before_us" in section else "") + f" ({how_h})",
             *([f"  prefill.host_before_us {_text(section['host_before_us'])}: the host work "
                f"its step did before the prefill's window beyond a decode step's (preparing "
                f"its requests), before its first launch ({how_b})"]
               if "host_before_us" in section else []),
             launch_line,
             f"  prefill.chunk_tokens {chunk}: the most a step used"
             + (" (its chunk and its decodes' tokens, which took theirs first)"
                if kinds is not None and kinds.budgeted else " (its chunk)")
             + ("" if named else " (the ranges name no tokens: simwar's default)")
             + f"; prefill.graph {graph} (how its launches ran)."]
    return section, lines


def _text(v) -> str:
    if isinstance(v, dict):
        return f"{v['base']:g} + {v['per_token']:g} x tokens" + (
            f" + {v['per_token_prefix']:g} x prefix" if v.get("per_token_prefix") else "") \
            + " µs"
    return f"{v:g} µs"


__all__ = ["FIT_MAX_LAUNCHES", "IdleSample", "MODES", "PREFILL_PHASE", "budgeted",
           "PrefillSample", "idle_samples", "idle_section",
           "RANK", "SHAPE_ORDER", "ShapeError", "StepKinds", "classify", "cpu_outside",
           "give_back", "launch_count", "prefill_section",
           "prefill_step_host", "rule_of",
           "split_host", "split_prefill", "token_line"]
