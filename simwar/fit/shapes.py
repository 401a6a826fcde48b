"""Each captured step's shape, and the prefill's costs fitted from the steps that prefill.

A server that prefills prompts runs steps of several shapes (docs/design.md, "Iteration
shapes"): a ``decode`` step (the phase table), a ``prefill`` step of its own (SGLang's
default: the prefill forward alone, the decodes paused) and a ``mixed`` step (a prefill chunk,
then the decode phases). :func:`classify` reads each step's shape from the capture, never from
its times:

- **the step's shape range** (the mapping's ``shape`` regex: :mod:`simwar.capture.step_shapes`;
  the presets read SGLang's ``step[EXTEND bs=15 toks=15360]`` and the mini-server's ``decode
  bs=B``, ``prefill bs=N toks=T``, ``mixed bs=B toks=T``): its mode word is one of
  :data:`MODES` (SGLang's forward modes EXTEND, DECODE, MIXED, IDLE and its speculative ones,
  which decode); a word the table does not name is a :class:`ShapeError` (one line);
- **the step's prefill work**: forward kernels of the phase ``prefill`` (the mapping's
  ``phases``), for a step whose range names no prompt tokens (a mixed step the range calls
  ``decode bs=B``, as older mini-server captures do).

A step whose range says it prefills tokens (a prefill or extend mode, or a token count > 0 in a
mixed one), or that has prefill work where its range names no tokens, prefills; one that also
runs decode phases (forward kernels of another phase, or a decode/mixed mode) is ``mixed``,
else ``prefill``; every other step is ``decode``. An ``idle`` step (a DP-attention idle batch)
is none of these: it is left out of the fit, and said.

:func:`split_prefill` takes the prefill's units out of the fitted steps' layouts (so that the
decode phases are fitted from decode and mixed steps alike, as one structure) and measures,
per step that prefills: the **host** time of the prefill (from the end of the host call before
its first launch to its last launch's start: its dispatch and every launch but the last, the
one launch the model issues; less the profiler's own cost there, for a graph-launched prefill
only: :data:`EAGER_PREFILL_LESS_PROFILER` says why), the **window** the decode
phases' first host region must give back (the same, to the last launch's end), and the
**device** work left once the host has issued its last launch (the prefill's kernels' busy
time from that launch's start: all of one kernel; the tail of an eager, launch-bound prefill,
which the model's one kernel after the host's work stands for). The loop's host work (its CPU
items, each phase's dispatch) is the decode steps' alone where there are enough of them
(:func:`split_host`): what a mixed step took beyond them in those keys, and what a prefill
step's CPU work around its forward took beyond theirs (:func:`prefill_step_host`), is the
prefill's host time too (scheduling a prefill batch). :func:`prefill_section` fits
``forward_us`` and ``host_us`` as ``{base, per_token}`` over the steps' prompt tokens by least
squares, clamped so that neither part is negative (at any token count: the section's own
rule), and writes ``chunk_tokens`` (the largest chunk seen), ``graph`` (eager unless the
prefill ran as a graph launch) and the scheduling rule the steps show (:func:`rule_of`:
prefill steps of their own → ``sglang``; chunks inside decode steps → ``sglang_mixed``) and
:func:`shape_workload` a workload of requests with prompts as the capture's arrived.

**The check** (``simwar import --check``, :func:`simwar.fit.check.shape_rows`): the fitted
config's run picks its shapes from its own queue, so its steps are not the capture's one for
one; each shape's figures are compared instead (:func:`shape_frame` of each side), the
simulated ones taken at the capture's sizes and after the capture's shapes
(:func:`at_sizes`), the step time (a step's gap plus its forward) within
:data:`SHAPE_STEP_REL`.

Imports: numpy, the standard library and simwar's capture and fit layout modules; never the
simulator.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field, replace

import numpy as np

from simwar.core.trace import OpKind, Trace
from simwar.fit.layout import StepLayout, columns

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
SHAPE_ORDER = ("decode", "prefill", "mixed")
#: whether an eager prefill's host figures (its dispatch, launches and window) are taken net
#: of the profiler's per-event cost (:mod:`simwar.fit.profiler_cost`): no. On the H200 the
#: mini-server's profiled and un-profiled twins (``tests/data/server/shapes/twins``, three
#: processes, ``python -m lab.shapes_check``) launched the eager prefill 0.53-0.81x as long
#: profiled as un-profiled, while their graph-launched decode steps ran 1.13-1.82x as long:
#: the per-event costs would take 22 % (420 µs a step) out of a prefill the profiler did not
#: lengthen. A graph-launched prefill is taken net like every other host figure.
EAGER_PREFILL_LESS_PROFILER = False


class ShapeError(ValueError):
    """A captured step's shape cannot be read; the message is one line."""


@dataclass
class StepKinds:
    """Per step of the capture: its shape (:data:`SHAPE_ORDER`, or ``idle``), the prompt
    tokens it prefilled (-1: its range names none) and the requests in its prefill chunk
    (-1: not named)."""

    shape: dict[int, str] = field(default_factory=dict)
    tokens: dict[int, int] = field(default_factory=dict)
    requests: dict[int, int] = field(default_factory=dict)

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
    ranged: dict[int, tuple[str, int, int, bool]] = {}
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
        mode = MODES[word]
        held = ranged.get(s.step)
        if held is None or RANK[mode] > RANK[held[0]]:  # a step of several forwards (SGLang's
            ranged[s.step] = (mode, s.batch, tokens, named)  # EXTEND, then DRAFT_EXTEND)
    out = StepKinds()
    for k in sorted(with_prefill | with_decode | set(ranged)):
        mode, batch, tokens, named = ranged.get(k, ("", -1, -1, False))
        if mode == "idle":
            out.shape[k] = "idle"
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
        if mode == "prefill" and batch >= 0:
            out.requests[k] = batch
    return out


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
    launch_us: float = 0.0  # their host time (less the profiler's cost, as host_us is)


def split_prefill(trace: Trace, lays: dict[int, StepLayout], kinds: StepKinds, prof=None
                  ) -> tuple[dict[int, StepLayout], dict[int, PrefillSample]]:
    """``(layouts, samples)``: every layout without its prefill units (a prefill step of its
    own, which has nothing else, is left out of them), and per fitted step that prefills what
    its prefill took (see the module docstring). ``prof``: the profiler's own host cost
    (:class:`simwar.fit.profiler_cost.ProfilerCost`), taken out of the host figures."""
    s0, e0 = columns(trace, "spans", "start_us", "end_us")
    op_start, op_end = columns(trace, "ops", "start_us", "end_us")
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
        got = _sample(k, shape if shape != "decode" else "decode", kinds.tokens.get(k, -1)
                      if shape != "decode" else 0, pre, lay, s0, e0, op_start, op_end, prof)
        last = pre[-1].calls[-1]  # the decode unit whose host region holds the prefill's
        got.then = next((i for i, u in enumerate(rest) if s0[u.calls[0]] > s0[last]),
                        len(rest))
        samples[k] = got  # a decode step's: an empty chunk's launch, given back all the same
    return kept, samples


def _sample(k, shape, tokens, units, lay, s0, e0, op_start, op_end, prof) -> PrefillSample:
    calls = [c for u in units for c in u.calls]
    first, last = calls[0], calls[-1]
    before = [c for c in lay.calls if e0[c] <= s0[first] and c not in calls]
    begin = max((float(e0[c]) for c in before), default=float(s0[first]))
    begin = max(begin, lay.start)
    t_last = float(s0[last])
    host = t_last - begin
    window = float(e0[last]) - begin
    graph = any(u.graph is not None for u in units)
    if prof is not None:  # the window is taken out of a host region net of the profiler
        window = prof.less(window, begin, float(e0[last]))
    if not graph and not EAGER_PREFILL_LESS_PROFILER:
        prof = None  # the profiler did not lengthen an eager prefill's launches: kept
    if prof is not None:
        host = prof.less(host, begin, t_last)
    ops = sorted((o for u in units for o in u.ops), key=lambda o: op_start[o])
    device, busy_to = 0.0, t_last
    for o in ops:  # busy time from the last launch's start on (overlaps counted once)
        a, b = max(op_start[o], busy_to), op_end[o]
        if b > a:
            device += b - a
            busy_to = b
    spent = sum(prof.less(float(e0[c] - s0[c]), float(s0[c]), float(e0[c]))
                if prof is not None else float(e0[c] - s0[c]) for c in calls)
    return PrefillSample(k, shape, tokens, max(host, 0.0), max(window, 0.0), device, graph,
                         launches=len(calls), launch_us=spent)


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


def split_host(s, samples: dict[int, PrefillSample]) -> float:
    """The loop's host work (``cpu.*``, ``phases.NAME.host_us`` in the
    :class:`simwar.fit.samples.Samples` ``s``) from the decode steps alone, and each mixed
    step's excess over their means (summed over the keys: the host work its prefill adds
    outside its dispatch, e.g. preparing the new requests) added to that step's prefill host
    time. A capture with too few decode steps (:data:`MIN_DECODE_STEPS`,
    :data:`MIN_DECODE_SHARE`) keeps every step's samples. Returns the mean excess per mixed
    step (0: not split)."""
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
        s.keep(key, lambda i, of=of: of[i] not in mixed)
    for k, extra in excess.items():
        samples[k].host_us = max(0.0, samples[k].host_us + extra)
    return float(np.mean(list(excess.values())))


def cpu_outside(trace: Trace, lay: StepLayout, units, prof=None) -> float:
    """A step's host time outside every API call (its CPU work) and outside its forward's
    window (from the end of the call before its first forward launch to its last forward
    call's end: the dispatch and launches of ``units``), less the profiler's own cost there:
    the loop's scheduling, preparing and result processing around the forward."""
    s0, e0 = columns(trace, "spans", "start_us", "end_us")
    first = units[0].calls[0]
    last = units[-1].calls[-1]
    before = [c for c in lay.calls if e0[c] <= s0[first]]
    lo = max([float(e0[c]) for c in before] + [lay.start])
    hi = float(e0[last])
    calls = sorted((float(s0[c]), float(e0[c])) for c in lay.calls)
    total, t = 0.0, lay.start
    for a, b in calls + [(lay.end, lay.end)]:
        for x, y in ((t, min(a, lo)), (max(t, hi), a)):  # the gap, less the forward window
            if y > x:
                total += prof.less(y - x, x, y) if prof is not None else y - x
        t = max(t, b)
    return total


def prefill_step_host(trace: Trace, lays: dict[int, StepLayout], decode: dict[int, StepLayout],
                      samples: dict[int, PrefillSample], prof=None) -> float:
    """Each prefill step's (of its own) CPU work around its forward (:func:`cpu_outside`)
    beyond the decode steps' mean (``decode``: their layouts without prefill units), added to
    its prefill host time: scheduling a prefill batch, which the config's loop CPU work (the
    decode steps') does not hold. Returns the mean excess (0: no prefill step, or no decode
    step to compare with)."""
    steps = [k for k, p in samples.items() if p.shape == "prefill" and k in lays]
    if not steps or not decode:
        return 0.0
    base = float(np.mean([cpu_outside(trace, lay, lay.units, prof) for lay in decode.values()]))
    out = []
    for k in steps:
        extra = cpu_outside(trace, lays[k], lays[k].units, prof) - base
        samples[k].host_us = max(0.0, samples[k].host_us + extra)
        out.append(extra)
    return float(np.mean(out))


def token_line(x, y) -> tuple[dict | float, str]:
    """``{base, per_token}`` by least squares over the steps' tokens, clamped so that neither
    is negative (a negative slope: the mean; a negative base: the line through 0); tokens
    not named (``x`` < 0): the mean. Returns the value and how it was fitted."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(y) == 0:
        return 0.0, "no sample"
    if np.any(x < 0) or np.ptp(x) == 0:
        why = "the ranges name no tokens" if np.any(x < 0) else "one token count"
        return _r(max(float(y.mean()), 0.0)), f"mean of {len(y)} ({why})"
    slope, base = np.polyfit(x, y, 1)
    how = f"least squares over {len(y)} steps, {int(x.min())}-{int(x.max())} tokens"
    if slope < 0:
        return _r(max(float(y.mean()), 0.0)), how + f"; slope {slope:.4g} < 0: the mean"
    if base < 0:
        slope = float((x * y).sum() / (x * x).sum())
        return {"base": 0.0, "per_token": _r6(max(slope, 0.0))}, how + \
            "; base < 0: the line through 0"
    return {"base": _r(base), "per_token": _r6(slope)}, how


def rule_of(kinds: StepKinds, steps) -> str:
    """The scheduling rule the steps show: prefill steps of their own → ``sglang``; prefill
    chunks inside decode steps only → ``sglang_mixed``."""
    seen = kinds.counts(steps)
    return "sglang" if seen.get("prefill") else "sglang_mixed"


def prefill_section(samples: dict[int, PrefillSample], reads: list[str], excess: float = 0.0
                    ) -> tuple[dict, list[str]]:
    """``(prefill section, header lines)`` from the steps that prefilled tokens (``excess``:
    the mean host work a mixed step added outside its prefill, :func:`split_host`)."""
    got = [p for p in samples.values() if p.shape in ("prefill", "mixed")]
    x = [p.tokens for p in got]
    forward, how_f = token_line(x, [p.device_us for p in got])
    host, how_h = token_line(x, [p.host_us for p in got])
    named = [t for t in x if t > 0]
    chunk = max(named) if named else 8192
    graph = "piecewise" if got and sum(p.graph for p in got) * 2 > len(got) else "eager"
    launches = float(np.mean([p.launches for p in got])) if got else 0.0
    section = {"chunk_tokens": int(chunk), "forward_us": forward, "host_us": host,
               "graph": graph, "reads": list(reads)}
    lines = [f"Prefill ({len(got)} steps that prefill: "
             + ", ".join(f"{n} {s}" for s, n in Counter(p.shape for p in got).items()) + "):",
             f"  prefill.forward_us {_text(forward)}: the device work left once the host "
             f"issued its last prefill launch ({how_f})",
             f"  prefill.host_us {_text(host)}: host time from the call before its first "
             f"launch to its last launch"
             + (", less the profiler's cost there" if graph != "eager"
                or EAGER_PREFILL_LESS_PROFILER else
                " (an eager prefill's: the profiler's cost kept, it did not lengthen it)")
             + (f", plus the host work its step took around it beyond the decode steps' "
                f"(mean {excess:+.1f} µs; the loop's host work is the decode steps')"
                if abs(excess) >= 0.05 else "") + f" ({how_h})",
             f"  launches: {launches:.1f} per prefill (mean; "
             f"{sum(p.launch_us for p in got) / max(sum(p.launches for p in got), 1):.2f} µs "
             f"of host each, in its host time above but the last)"
             + (": its kernels run as they are launched, which the one kernel after its host "
                "time does not model" if launches > 1.5 else ""),
             f"  prefill.chunk_tokens {chunk}: the largest chunk seen"
             + ("" if named else " (the ranges name no tokens: simwar's default)")
             + f"; prefill.graph {graph} (how its launches ran)."]
    return section, lines


def _text(v) -> str:
    if isinstance(v, dict):
        return f"{v['base']:g} + {v['per_token']:g} x tokens µs"
    return f"{v:g} µs"


def _r(v: float) -> float:
    return round(float(v), 3)


def _r6(v: float) -> float:
    return round(float(v), 6)


def prompt_groups(kinds: StepKinds, steps: list[int], chunk: int) -> list[tuple[int, int]]:
    """``(requests, tokens)`` of each run of prefill steps whose chunks carry a request over
    (every step of the run but the last is a full chunk, ``chunk`` tokens): the requests whose
    prompts it prefilled (each step's, less the one carried in from the step before) and their
    tokens. A run of one request gives its prompt exactly."""
    out: list[tuple[int, int]] = []
    cur = None
    for k in steps:
        if kinds.shape.get(k) != "prefill" or kinds.tokens.get(k, -1) < 0:
            cur = None
            continue
        n, t = kinds.requests.get(k, 1), kinds.tokens[k]
        if cur is None:
            cur = [n, t]
            out.append(cur)
        else:
            cur[0] += max(0, n - 1)
            cur[1] += t
        if t < chunk:  # the queue's prompts all prefilled: the next step starts afresh
            cur = None
    return [(max(n, 1), t) for n, t in out]


def shape_workload(kinds: StepKinds, steps: list[int], batch, accept: float, duration_us: float,
                   buckets, chunk: int) -> tuple[dict, str]:
    """``(workload, header line)``: requests arriving as the capture's did on average, so
    that the fitted config runs every shape the capture ran (its steps cannot be replayed one
    for one: a step's shape follows the simulated queue). The requests are those whose
    prompt began in a fitted step (:func:`prompt_groups` of the prefill steps; without them,
    the decode batch's growth), the rate their count over the fitted steps' time, the prompt
    a lognormal of the groups' tokens per request (their mean and spread), the output the
    decode tokens per request, plus the first."""
    groups = prompt_groups(kinds, steps, chunk)
    grown = sum(max(0, batch[k] - batch[k - 1]) for k in steps if k - 1 in batch and k in batch)
    requests = max(sum(n for n, _ in groups) or grown, 1)
    tokens = [kinds.tokens[k] for k in steps if kinds.tokens.get(k, -1) > 0]
    mean = sum(tokens) / requests if tokens else 256.0
    per = [t / n for n, t in groups]
    std = float(np.std(per)) if len(per) > 1 else 0.0
    prompt: int | dict = max(int(round(mean)), 1)
    if std > 0.05 * mean:
        prompt = {"dist": "lognormal", "mean": round(mean, 1), "std": round(std, 1)}
    decoded = sum(batch.get(k, 0) for k in steps if kinds.shape.get(k) != "prefill") * accept
    output = max(1, int(round(decoded / requests + 1)))
    rate = requests / max(duration_us, 1.0) * 1e6
    top = max([batch.get(k, 0) for k in steps] + [1])
    max_batch = top if not buckets else min(top, max(buckets))
    wl = {"arrivals": {"rate_per_s": round(rate, 3)}, "max_batch": int(max_batch),
          "initial_batch": 0, "output_tokens": output, "prompt_tokens": prompt}
    if buckets:
        wl["graph_buckets"] = list(buckets)
    shown = f"lognormal prompts (mean {mean:.0f}, std {std:.0f} tokens: the carried-over runs " \
        f"of prefill steps, per request)" if isinstance(prompt, dict) else \
        f"{prompt} prompt tokens each (their mean)"
    line = (f"Workload: requests arriving at the capture's mean rate ({requests} requests "
            f"began their prompt in the fitted steps: {rate:.1f}/s), {shown}, {output} output "
            f"tokens (their mean), max_batch {max_batch}: each run's queue picks its shapes, "
            f"so `--check` compares each shape's figures at the capture's sizes, not step for "
            f"step.")
    return wl, line



# --------------------------------------------------------------------------- the check
#: a shape's step time within this of the capture's (``--check`` of a capture that prefills)
SHAPE_STEP_REL = 0.03
#: a shape is judged where both sides ran it at least this many measured steps
SHAPE_MIN_STEPS = 3
#: the per-step figures compared per shape: (label, column). A shape's step time is its own
#: forward's end less the forward before it (``own_us``: its gap plus its forward), not the
#: table's ``step_us`` (forward start to the next forward's start), which holds the next
#: step's gap: the host work a prefill adds before its forward would be the step before's.
SHAPE_FIGURES = (("step", "own_us"), ("forward", "fwd_us"), ("forward gap", "fwd_gap_us"))


def sim_kinds(meta: dict, n: int) -> tuple[list[str], np.ndarray]:
    """A simulated run's per-step shapes and prompt tokens (``meta.workload``): its picked
    shapes, else mixed where the step prefilled tokens; decode where it prefilled none."""
    wl = meta.get("workload") or {}
    tokens = np.asarray(wl.get("prefill_tokens") or [0] * n, dtype=float)[:n]
    picked = wl.get("shape")
    out = []
    for k in range(n):
        t = tokens[k] if k < len(tokens) else 0.0
        s = picked[k] if picked is not None and k < len(picked) else "mixed"
        out.append("decode" if t <= 0 else ("prefill" if s == "prefill" else "mixed"))
    return out, tokens


#: the sizes a shape's figures follow (:func:`at_sizes`): a decode step's batch; a prefill
#: step's tokens and the batch of the step before it, whose result it processes and whose
#: requests it pauses; a mixed step's batch and tokens
SIZES = {"decode": ("batch",), "prefill": ("tokens", "before"), "mixed": ("batch", "tokens")}


def sim_waits(meta: dict) -> set[int]:
    """The steps of a simulated run of arriving requests whose iteration waited for a request
    (the host idle at its top: the capture's ``idle`` steps, which the check leaves out): the
    admission steps of the requests admitted at their own arrival time."""
    req = (meta.get("workload") or {}).get("requests") or {}
    return {int(k) for k, a, t in zip(req.get("admit_step") or [], req.get("admit_us") or [],
                                      req.get("arrival_us") or []) if k >= 0 and a == t}


def shape_frame(table, shapes: dict[int, str], tokens: dict[int, float], drop=()) -> dict:
    """Per shape, the measured steps' columns (``step``, ``step_us``, the
    :data:`SHAPE_FIGURES`, ``batch``, ``bucket``, ``tokens``, the batch of the step before,
    ``before``, and the shape of the step before, ``after``: its index in
    :data:`SHAPE_ORDER`, -1 none) of a per-step table (the capture's or a simulation's),
    without ``drop`` (the steps left out and those around them) and the steps without a
    step time."""
    cols = {c: np.asarray(table[c], dtype=float) for c in ("step", "step_us", "fwd_us",
                                                          "fwd_gap_us") if c in table}
    cols["own_us"] = cols["fwd_gap_us"] + cols["fwd_us"]
    step = cols["step"].astype(int)
    batch = np.asarray(table["batch_size"], dtype=float) if "batch_size" in table \
        else np.zeros(len(step))
    bucket = np.asarray(table["graph_bucket"], dtype=float) if "graph_bucket" in table \
        else batch
    prev = dict(zip(step.tolist(), batch.tolist()))
    out: dict[str, dict] = {}
    for i, k in enumerate(step.tolist()):
        if k in drop or not np.isfinite(cols["step_us"][i]) \
                or not np.isfinite(cols["own_us"][i]):
            continue
        s = shapes.get(k)
        if s not in SHAPE_ORDER:
            continue
        d = out.setdefault(s, {c: [] for c in (*cols, "batch", "bucket", "tokens", "before",
                                                "after")})
        for c in cols:
            d[c].append(cols[c][i])
        d["batch"].append(batch[i])
        d["bucket"].append(bucket[i])
        d["before"].append(prev.get(k - 1, batch[i]))
        last = shapes.get(k - 1)
        d["after"].append(SHAPE_ORDER.index(last) if last in SHAPE_ORDER else -1)
        d["tokens"].append(tokens.get(k, 0.0))
    return {s: {c: np.asarray(v, dtype=float) for c, v in d.items()} for s, d in out.items()}


def at_sizes(sim: dict, cap: dict, column: str, shape: str) -> float:
    """The simulation's mean of ``column`` over a shape's steps, taken at the capture's sizes
    and after the capture's shapes: the two runs' queues differ, so the capture's steps are
    not the simulation's one for one.

    The steps are grouped by the shape of the step before (a prefill step right after another
    waits for the host longer than one after a decode step) and by graph bucket (a graph's
    time is its bucket's, not a line in the batch). Each group the capture ran counts with
    its capture steps, at the simulated group's mean moved to the capture group's mean sizes
    (:data:`SIZES`, those that vary on the simulated side) along the slopes of a least-squares
    fit within the simulated groups (one slope per size for every group, each group its own
    level). A group the simulation ran fewer than :data:`SHAPE_MIN_STEPS` times takes the
    simulated steps after the same shape, else all of the shape's.
    """
    y_all = sim[column]
    ok = np.isfinite(y_all)
    if not ok.any():
        return float("nan")
    sizes = [c for c in SIZES[shape] if c in sim and np.ptp(sim[c][ok]) > 0
             and len(cap.get(c, ())) and np.all(cap[c] >= 0)]
    group = sim["after"] * 1_000_000 + sim["bucket"]
    slopes = np.zeros(len(sizes))
    if sizes:  # within-group least squares: each group's mean taken out
        y, xs = y_all[ok].copy(), np.column_stack([sim[c][ok] for c in sizes]).astype(float)
        for g in np.unique(group[ok]).tolist():
            m = group[ok] == g
            y[m] -= y[m].mean()
            xs[m] -= xs[m].mean(axis=0)
        if len(y) > len(sizes) + 1 and np.any(xs):
            slopes, *_ = np.linalg.lstsq(xs, y, rcond=None)
    total, weight = 0.0, 0
    for after, bucket in np.unique(np.column_stack([cap["after"], cap["bucket"]]),
                                   axis=0).tolist():
        mine = (cap["after"] == after) & (cap["bucket"] == bucket)
        theirs = ok
        for cand in ((sim["after"] == after) & (sim["bucket"] == bucket),
                     sim["after"] == after):
            if int((cand & ok).sum()) >= SHAPE_MIN_STEPS:
                theirs = cand & ok
                break
        v = float(y_all[theirs].mean()) + sum(
            float(b) * (float(cap[c][mine].mean()) - float(sim[c][theirs].mean()))
            for b, c in zip(slopes, sizes))
        total += int(mine.sum()) * v
        weight += int(mine.sum())
    return total / weight if weight else float(y_all[ok].mean())


__all__ = ["MODES", "PREFILL_PHASE", "PrefillSample", "RANK", "SHAPE_FIGURES", "SHAPE_MIN_STEPS",
           "SHAPE_ORDER", "SHAPE_STEP_REL", "SIZES", "ShapeError", "StepKinds", "at_sizes",
           "cpu_outside", "prefill_step_host", "split_host",
           "classify", "give_back", "prefill_section", "prompt_groups", "rule_of", "shape_frame",
           "shape_workload", "sim_kinds", "sim_waits", "split_prefill", "token_line"]
