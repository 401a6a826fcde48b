"""The mini-server's cases, suites and named loads: pure Python, no torch.

A :class:`Case` is one run of :mod:`lab.server`'s loop (its fields are the
command line's flags, described with the loop in that module's docstring, as are the suites
and the loads); :func:`suite_cases` lists a suite's cases with their fixed seeds;
:class:`Loads` turns a named load into arrivals from the pilots' measured step times;
:func:`select_cases` picks the cases of a command line (suites, overrides, the dry run's
caps).

Imports: the standard library and :mod:`lab.server_requests`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace

from lab.server_requests import (
    POLICIES,
    Arrivals,
    Dist,
    Ramp,
    mean_decode_steps,
    rate_for,
)

BARRIERS = ("fine", "coarse", "none", "planted")
LOADS = ("light", "medium", "saturated", "ramp", "prefill_light", "prefill_medium",
         "shapes_light", "shapes_medium", "closed")
#: load -> requests in the system it aims at, and whether its requests are prefilled
TARGETS = {"light": (5, False), "medium": (20, False), "saturated": (64, False),
           "prefill_light": (6, True), "prefill_medium": (20, True)}
#: the shapes suite's loads: a share of the pilot closed loop's request rate
#: (:data:`SHAPES_PILOT` requests, SGLang's default scheduling, the suite's lengths)
SHAPES_LOADS = {"shapes_light": 0.3, "shapes_medium": 0.6}
SHAPES_PILOT = 16
#: the shapes suite's lengths: prompts longer than the chunk budget are carried over
SHAPES_LENGTHS = {"prompt_tokens": "256..4096", "chunk_tokens": 2048,
                  "output_tokens": "16..128"}


@dataclass(frozen=True)
class Case:
    """One run of the loop (:mod:`lab.server` describes the fields)."""

    name: str
    steps: int
    load: str = "medium"
    barrier: str = "fine"
    seed: int = 0
    profiled: bool = False
    overlap: bool = True
    hidden_sync: bool = False
    eager: bool = False
    csan: bool = False
    prompt_tokens: str | None = None  # a Dist; None: decode-only requests
    chunk_tokens: int = 256
    concurrency: int | None = None
    rate: float | None = None  # req/s, overrides the load's
    output_tokens: str = "16..128"
    context_tokens: str = "32..256"
    host_scale: float = 1.0  # × the Python padding (0: the scheduler's own work only)
    warmup: int | None = None  # default: steps // 10
    schedule: str = "mixed"  # lab.server_requests.POLICIES

    def __post_init__(self):
        if self.barrier not in BARRIERS:
            raise ValueError(f"{self.name}: barrier {self.barrier!r} not in {BARRIERS}")
        if self.load not in LOADS:
            raise ValueError(f"{self.name}: load {self.load!r} not in {LOADS}")
        if self.csan and not self.eager:
            raise ValueError(f"{self.name}: --csan needs --eager (CSAN does not see graphs)")
        if self.schedule not in POLICIES:
            raise ValueError(f"{self.name}: schedule {self.schedule!r} not in {POLICIES}")
        if self.schedule == "sglang" and not self.prompt_tokens:
            raise ValueError(f"{self.name}: schedule sglang needs prompts (--prompt-tokens)")
        if self.load == "closed" and not self.concurrency:
            raise ValueError(f"{self.name}: a closed load needs a concurrency")
        for text in (self.prompt_tokens, self.output_tokens, self.context_tokens):
            if text is not None:
                Dist.parse(text)

    def warmup_steps(self) -> int:
        return self.steps // 10 if self.warmup is None else self.warmup


def suite_cases(name: str) -> list[Case]:
    """The cases of one suite (module docstring)."""
    prompts = "64..512"
    if name == "fit":
        return [Case("fit_ramp_profiled", 200, "ramp", profiled=True, seed=1),
                Case("fit_ramp", 200, "ramp", seed=1)]
    if name == "loads":
        return [Case(f"loads_{load}_{b}_r{r}", 400, load, b, seed=100 + r)
                for load in ("light", "medium", "saturated") for b in ("fine", "coarse", "none")
                for r in range(3)]
    if name == "races":
        # the next step's write can overtake the verify graph's gather only while the host
        # is ahead of the device: no padding, and every forward starts with a 1024-token
        # prefill chunk (long prompts, short outputs) that runs longer than its launches
        fast_host = {"load": "closed", "concurrency": 16, "host_scale": 0.0, "seed": 7,
                     "prompt_tokens": "600..900", "output_tokens": "8..24",
                     "chunk_tokens": 1024}
        return ([Case(f"races_{b}", 60, barrier=b, profiled=True, **fast_host)
                 for b in ("none", "fine", "coarse", "planted")]
                + [Case(f"races_csan_{b}", 20, barrier=b, eager=True, csan=True, warmup=2,
                        **fast_host) for b in ("none", "fine", "coarse", "planted")])
    if name == "hostsync":
        return [Case("hostsync_medium", 120, "medium", seed=3, profiled=True, hidden_sync=True)]
    if name == "prefill":
        loads = [("light", "prefill_light", None), ("medium", "prefill_medium", None),
                 ("closed8", "closed", 8)]
        return ([Case(f"prefill_{tag}_{'overlap' if ov else 'normal'}_r{r}", 250, load,
                      seed=200 + r, overlap=ov, prompt_tokens=prompts, concurrency=conc,
                      warmup=40)
                 for tag, load, conc in loads for ov in (True, False) for r in range(2)]
                + [Case("prefill_light_overlap_profiled", 120, "prefill_light", seed=200,
                        profiled=True, prompt_tokens=prompts, warmup=30)])
    if name == "shapes":
        return _shapes_cases()
    if name == "shapes_normal":
        return _shapes_normal_cases()
    if name == "smoke":
        return [Case("smoke_decode", 40, "medium", seed=5),
                Case("smoke_prefill_profiled", 30, "closed", concurrency=4, seed=5,
                     profiled=True, prompt_tokens="64..300"),
                Case("smoke_eager", 20, "light", "planted", seed=5, eager=True)]
    raise ValueError(f"--suite: {name!r} is not a suite (fit, loads, races, hostsync, "
                     f"prefill, shapes, shapes_normal, smoke)")


#: the shapes suite's timed repeats per case (seeds 300, 301, ...)
SHAPES_REPEATS = 3


def _shapes_cases() -> list[Case]:
    """The shapes suite, interleaved: round r runs repeat r of every (mode, load, loop),
    each round's order rotated by a third of it, so that a stretch of slow host (the H200
    machine's ran at x0.56-1.60 for tens of seconds) takes one repeat of a few cases rather
    than every repeat of one; the two profiled cases run between the second and third
    rounds, mid-suite, where the host-speed rule measures the timed repeats against them."""
    loads = [("light", "shapes_light", None), ("medium", "shapes_medium", None),
             ("closed16", "closed", 16)]
    combos = [(mode, tag, load, conc, ov) for tag, load, conc in loads
              for ov in (True, False) for mode in POLICIES[::-1]]
    rounds = []
    for r in range(SHAPES_REPEATS):
        turn = r * len(combos) // SHAPES_REPEATS
        rounds.append([Case(f"shapes_{mode}_{tag}_{'overlap' if ov else 'normal'}_r{r}", 400,
                            load, seed=300 + r, overlap=ov, schedule=mode, concurrency=conc,
                            warmup=40, **SHAPES_LENGTHS)
                       for mode, tag, load, conc, ov in combos[turn:] + combos[:turn]])
    profiled = [Case(f"shapes_{mode}_medium_overlap_profiled", 200, "shapes_medium", seed=300,
                     profiled=True, schedule=mode, warmup=20, **SHAPES_LENGTHS)
                for mode in POLICIES[::-1]]
    return rounds[0] + rounds[1] + profiled + [c for rd in rounds[2:] for c in rd]


def _shapes_normal_cases() -> list[Case]:
    """The profiler's effect on a step that prefills, by loop: the medium load of each mode
    profiled in the normal loop too (``shapes_<mode>_medium_normal_profiled``), each profiled
    case between timed twins of its own loop (``..._r0`` before it, ``..._r1`` after, the
    shapes suite's seeds), so that a prefill forward's profiled and unprofiled spans can be
    set side by side in each loop (calibration/README.md, "Each launch its own share")."""
    out = []
    for mode in POLICIES[::-1]:
        for ov in (False, True):
            loop = "overlap" if ov else "normal"
            timed = [Case(f"shapes_{mode}_medium_{loop}_r{r}", 400, "shapes_medium",
                          seed=300 + r, overlap=ov, schedule=mode, warmup=40,
                          **SHAPES_LENGTHS) for r in range(2)]
            out += [timed[0], Case(f"shapes_{mode}_medium_{loop}_profiled", 200,
                                   "shapes_medium", seed=300, profiled=True, overlap=ov,
                                   schedule=mode, warmup=20, **SHAPES_LENGTHS), timed[1]]
    return out


@dataclass(frozen=True)
class Loads:
    """The named loads' arrivals, from the pilots' mean step times (module docstring)."""

    pilot_step_us: dict  # "<N>" (decode) or "prefill_<N>" -> µs
    accept: float
    output: Dist = Dist(16, 128)
    prompt: Dist = Dist(64, 512)
    chunk_tokens: int = 256
    #: "shapes_<N>" -> the pilot closed loop's requests per second (N / its mean latency)
    pilot_rps: dict = field(default_factory=dict)

    @staticmethod
    def pilot_key(n: int, prefill: bool) -> str:
        return f"prefill_{n}" if prefill else str(n)

    def steps_per_request(self, prefill: bool) -> float:
        decode = mean_decode_steps(self.output, self.accept, prefill)
        extra = 1.0 + 0.5  # the overlap's extra step, waiting for admission
        if prefill:
            extra += 1.0 + self.prompt.mean() / self.chunk_tokens
        return decode + extra

    def rate(self, load: str) -> float:
        if load in SHAPES_LOADS:
            return SHAPES_LOADS[load] * self.pilot_rps[f"shapes_{SHAPES_PILOT}"]
        n, prefill = TARGETS[load]
        step = self.pilot_step_us[self.pilot_key(n, prefill)]
        r = rate_for(n, step, self.steps_per_request(prefill))
        return 1.15 * r if load == "saturated" else r

    def ramp(self, steps: int) -> Ramp:
        return Ramp(0.5 * self.rate("light"), 1.1 * self.rate("saturated") / 1.15,
                    steps * self.pilot_step_us["20"] * 1e-6, rise=0.5)

    def arrivals(self, case: Case) -> Arrivals:
        prompt = Dist.parse(case.prompt_tokens) if case.prompt_tokens else None
        kw = {"seed": case.seed, "output": Dist.parse(case.output_tokens), "prompt": prompt,
              "context": Dist.parse(case.context_tokens)}
        if case.concurrency and (case.load == "closed" or case.rate is None):
            return Arrivals(concurrency=case.concurrency, **kw)
        initial = {"light": 5, "medium": 20, "saturated": 64, "ramp": 1}.get(case.load, 0)
        if case.rate is not None:
            return Arrivals(rate=case.rate, initial=initial, **kw)
        if case.load == "ramp":
            return Arrivals(ramp=self.ramp(case.steps), initial=initial, **kw)
        return Arrivals(rate=self.rate(case.load), initial=initial, **kw)

    def describe(self, case: Case) -> dict:
        """The case's arrival side as it was resolved (for its metrics)."""
        if case.concurrency and (case.load == "closed" or case.rate is None):
            return {"concurrency": case.concurrency}
        if case.rate is not None:
            return {"rate_per_s": case.rate}
        if case.load == "ramp":
            return {"ramp": asdict(self.ramp(case.steps))}
        return {"rate_per_s": self.rate(case.load)}


def check_lengths(case: Case, accept: float, max_context: int, max_chunk: int) -> None:
    """A request's context must fit ``max_context`` slots until it leaves, a chunk the
    staging buffer."""
    if case.prompt_tokens and not 0 < case.chunk_tokens <= max_chunk:
        raise ValueError(f"{case.name}: chunk_tokens {case.chunk_tokens} not in 1..{max_chunk}")
    need = slots_needed(case, accept)
    if need > max_context:
        first = Dist.parse(case.prompt_tokens or case.context_tokens)
        raise ValueError(f"{case.name}: prompt/context up to {first.hi} + "
                         f"{Dist.parse(case.output_tokens).hi} output tokens need {need} "
                         f"slots > max_context {max_context}")


def slots_needed(case: Case, accept: float) -> int:
    """The context slots a request of ``case`` can hold until it leaves: its longest prompt
    (or context), its longest output at ``accept`` tokens a step, and 4 spare."""
    first = Dist.parse(case.prompt_tokens or case.context_tokens)
    return first.hi + math.ceil(Dist.parse(case.output_tokens).hi / accept) + 4


#: the command line's case flags (``args`` attributes) that override a suite's cases
OVERRIDES = ("steps", "load", "rate", "concurrency", "barrier", "seed", "profiled",
             "hidden_sync", "overlap", "prompt_tokens", "chunk_tokens", "output_tokens",
             "eager", "csan", "host_scale", "schedule")


def select_cases(args) -> list[Case]:
    """The cases to run, in order: every sanitized case last (its callbacks stay)."""
    given = {k: getattr(args, k) for k in OVERRIDES if getattr(args, k) is not None}
    if args.suite:
        cases = [c for s in args.suite.split(",") if s.strip()
                 for c in suite_cases(s.strip())]
        cases = [replace(c, **given) for c in cases]
    else:
        given.setdefault("steps", 200)
        given.setdefault("load", "closed" if given.get("concurrency") else "medium")
        cases = [Case(args.name or "custom", **given)]
    if args.cases:
        keep = set(args.cases.split(","))
        cases = [c for c in cases if c.name in keep]
    if args.dry_run:
        cases = [replace(c, steps=min(c.steps, args.dry_steps),
                         warmup=min(c.warmup_steps(), min(c.steps, args.dry_steps) // 4))
                 for c in cases]
    return [c for c in cases if not c.csan] + [c for c in cases if c.csan]


def sized_for(cases: list[Case], accept: float, max_context: int, max_chunk: int
              ) -> tuple[int, int]:
    """``(max_context, max_chunk_tokens)`` that hold every case's lengths: the defaults, or
    more where a case needs it (the context rounded up to a multiple of 128)."""
    ctx, chunk = max_context, max_chunk
    for c in cases:
        ctx = max(ctx, -(-slots_needed(c, accept) // 128) * 128)
        if c.prompt_tokens:
            chunk = max(chunk, c.chunk_tokens)
    return ctx, chunk


__all__ = ["BARRIERS", "LOADS", "OVERRIDES", "SHAPES_LENGTHS", "SHAPES_LOADS", "SHAPES_PILOT",
           "SHAPES_REPEATS", "TARGETS", "Case", "Loads", "check_lengths", "select_cases",
           "sized_for", "slots_needed", "suite_cases"]
