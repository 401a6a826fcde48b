"""Config → Program, following SGLang's overlap loop (DESIGN.md, reference §(b)).

One scheduler iteration ``k`` issues, in order:

1. ``[loop_top]`` the WAR barrier for forward k-1 (before #31687);
2. ingest (CPU), schedule (CPU);
3. ``[host_sync, loop_top]`` the legacy DFLASH ``verify_done.synchronize()``
   at the start of prepare; prepare (CPU); the shared-buffer writes for step k
   on the schedule stream, or on the plan stream (``plan.wait_stream(schedule)``,
   writes, ``schedule.wait_stream(plan)``);
4. ``run_batch``: ``[needs_cpu_seq_lens]`` host block on forward k-1's
   FutureMap publish; ``forward.wait_stream(schedule)``; each phase
   (dispatch CPU, ``load_batch`` kernels, graph launch with in-graph prep and
   body, read-done record per the publish rule); the FutureMap publish record;
   the result copy (``copy.wait_stream(forward)``, D2H, ``copy_done[k]``);
5. ``[after_launch]`` the WAR barrier for forward k; post-launch host work
   (``cpu.post_launch_us``, none by default);
6. process the result of step k-1: ``copy_done[k-1].synchronize()``, CPU
   work, result-processing writes (radix insert, frees) on the schedule stream.

A final drain processes the last result.

Durations come from one generator seeded by ``config.seed``: each distribution is
drawn in a single call holding all of its uses in program order (distributions in order
of first use), before the ops are built (:class:`_Sampler`). The same iteration code,
given symbolic durations, builds the first iterations and the drain as templates
(:func:`plan_iterations`), from which :mod:`simwar.fast` runs a config without building
its Program; both take the same numbers from the same draws. Imports: numpy, no simpy.
"""

from __future__ import annotations

import numpy as np

from .config import Config, Dist, Phase
from .policies import PublishPoint, barrier, publish_point
from .program import (
    CpuWork,
    GraphLaunch,
    GraphRecord,
    HostOp,
    Kernel,
    Launch,
    Marker,
    Program,
    Record,
    StepMarker,
    Synchronize,
    WaitEvent,
    WaitStream,
)


class _Sampler:
    """Draws every duration of a run up front: one generator call per distribution.

    The distributions (config values that are a :class:`Dist`) are drawn in order of their
    first use in the program, each as one array holding all of its uses in program order
    (iteration by iteration, and within one in the order the builder asks). Constants never
    touch the generator. ``next_value(d)`` hands out the draws in that order.
    """

    def __init__(self, seed: int, counts: dict[int, tuple[Dist, int]]):
        # (numpy.random is imported only when there is something to draw)
        rng = np.random.default_rng(seed) if counts else None
        self.arrays: dict[int, np.ndarray] = {key: _sample(rng, d, n)
                                              for key, (d, n) in counts.items()}
        self._next: dict[int, object] = {}

    def __call__(self, d):
        it = self._next.get(id(d))
        if it is None:
            if not isinstance(d, Dist):
                return d
            it = self._next[id(d)] = iter(self.arrays[id(d)].tolist())
        return next(it)


def _sample(rng: np.random.Generator, d: Dist, n: int) -> np.ndarray:
    """``n`` draws of ``d`` in one call, clipped at ``d.min``."""
    if d.dist == "normal":
        x = rng.normal(d.mean, d.std, n)
    elif d.dist == "lognormal":
        # parameters of the distribution itself: mean and std of the samples
        var = np.log1p((d.std / d.mean) ** 2)
        x = rng.lognormal(np.log(d.mean) - var / 2, np.sqrt(var), n)
    elif d.dist == "uniform":
        x = rng.uniform(d.low, d.high, n)
    else:
        x = np.asarray(d.values, dtype=float)[rng.integers(len(d.values), size=n)]
    return np.maximum(float(d.min), x)


class Use:
    """A symbolic draw: use ``index`` (within one iteration) of distribution ``key``."""

    __slots__ = ("key", "index")

    def __init__(self, key: int, index: int):
        self.key = key
        self.index = index

    def __add__(self, other):
        return Sum(self, other)

    def __radd__(self, other):
        return Sum(other, self)

    def __gt__(self, other) -> bool:  # a drawn duration may be positive: the op is kept
        return True

    def __repr__(self) -> str:
        return f"Use({self.key}, {self.index})"


class Sum:
    """A symbolic host-call cost: ``a + b``, each a constant or a :class:`Use`."""

    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a = a
        self.b = b

    def __gt__(self, other) -> bool:
        return True

    def __repr__(self) -> str:
        return f"Sum({self.a!r}, {self.b!r})"


class _Symbolic:
    """A drawer that hands out :class:`Use` placeholders instead of numbers (templates)."""

    def __init__(self) -> None:
        self.dists: dict[int, Dist] = {}  # key -> Dist, in order of first use
        self.uses: dict[int, int] = {}  # key -> uses in the current iteration

    def new_iteration(self) -> dict[int, int]:
        done, self.uses = self.uses, {}
        return done

    def __call__(self, d):
        if not isinstance(d, Dist):
            return d
        key = id(d)
        self.dists.setdefault(key, d)
        n = self.uses.get(key, 0)
        self.uses[key] = n + 1
        return Use(key, n)


def build_program(cfg: Config) -> Program:
    """The run's Program: every host operation of every iteration, durations drawn (a
    validated Config: ``simwar.load_config`` validates)."""
    return _drawing_builder(cfg).build()


def _drawing_builder(cfg: Config) -> _Builder:
    plan = plan_iterations(cfg)
    return _Builder(cfg, _Sampler(cfg.seed, plan.draw_counts()), plan.phases)


#: iterations built symbolically to find the steady-state iteration (see :func:`plan_iterations`)
SKELETON = 6


class IterationPlan:
    """The run as iteration templates: which template each iteration (and the drain) uses.

    ``ops[i]`` is the host ops of skeleton iteration i (durations as numbers or :class:`Use`),
    ``uses[i]`` its draws per distribution; ``role(k)`` maps run iteration k (``steps`` is the
    drain) to its skeleton iteration. Iterations from the third on are identical up to the
    step number (checked by :mod:`simwar.fast` on the skeleton), so a run of any length is the
    first iterations, the steady one repeated, and the drain.
    """

    def __init__(self, cfg: Config, ops: list[list], uses: list[dict], dists: dict, meta: dict,
                 phases: list[Phase]):
        self.cfg = cfg
        self.phases = phases
        self.ops = ops
        self.uses = uses
        self.dists = dists
        self.meta = meta
        self.steps = cfg.steps

    def role(self, k: int) -> int:
        """Skeleton iteration standing for run iteration ``k`` (``steps``: the drain)."""
        n = len(self.ops) - 1  # skeleton iterations (the last entry is the drain)
        if k >= self.steps:
            return n
        return k if k < n - 1 else n - 1

    def counts(self, k: int) -> dict[int, int]:
        return self.uses[self.role(k)]

    def draw_counts(self) -> dict[int, tuple[Dist, int]]:
        """Per distribution (in order of first use): the Dist and its draws in the whole run."""
        total: dict[int, int] = {key: 0 for key in self.dists}
        n = len(self.ops) - 1
        if self.steps <= n:
            for uses in self.uses:
                for key, c in uses.items():
                    total[key] += c
        else:
            for i in range(n):
                times = 1 if i < n - 1 else self.steps - (n - 1)
                for key, c in self.uses[i].items():
                    total[key] += c * times
            for key, c in self.uses[n].items():
                total[key] += c
        return {key: (self.dists[key], total[key]) for key in self.dists}


def plan_iterations(cfg: Config) -> IterationPlan:
    """Build the first iterations and the drain symbolically (no numbers drawn)."""
    sym = _Symbolic()
    b = _Builder(cfg, sym)
    n = min(cfg.steps, SKELETON)
    ops: list[list] = []
    uses: list[dict] = []
    sym.new_iteration()
    for k in range(n):
        start = len(b.ops)
        b.iteration(k)
        ops.append(b.ops[start:])
        uses.append(sym.new_iteration())
    start = len(b.ops)
    b.drain(n)
    ops.append(b.ops[start:])
    uses.append(sym.new_iteration())
    return IterationPlan(cfg, ops, uses, dict(sym.dists), b.meta(), b.phases)


def stream_program(cfg: Config) -> Program:
    """The same Program with its ops generated one iteration at a time as they are read.

    For executors that read the ops once, in order (the SimPy engine): a long run
    then never holds the whole op list. ``ops`` is a one-shot iterator; use
    :func:`build_program` for a Program to inspect, serialize or replay.
    """
    builder = _drawing_builder(cfg)
    return Program(ops=builder.iter_ops(), meta=builder.meta())


class _Builder:
    def __init__(self, cfg: Config, draw, phases: list[Phase] | None = None):
        self.cfg = cfg
        # distributions are keyed by object: builders of one run share the phase table
        self.phases: list[Phase] = phases if phases is not None else cfg.phase_table()
        pol = cfg.policy
        self.point: PublishPoint = publish_point(self.phases, pol.publish_phase,
                                                 pol.external_events, pol.in_replay_fallback)
        self.policy = barrier(pol.barrier).resolve(self.point)
        self.barrier = self.policy.name
        self.draw = draw
        self.ops: list[HostOp] = []
        self.writes = tuple(cfg.gpu.writes)
        # the step-k event each barrier kind waits/syncs on
        self.read_done: dict[int, str] = {}

    # ---- host API calls, with their costs drawn per call
    def _cost(self, d) -> float:
        return self.draw(d) + self.draw(self.cfg.costs.host_call_us)

    def launch(self, stream: str, label: str, dur, step: int, phase: str = "",
               reads=(), writes=()) -> None:
        k = Kernel(label, self.draw(dur), tuple(reads), tuple(writes), phase)
        self.ops.append(Launch(stream, k, step, self._cost(self.cfg.costs.launch_us)))

    def record(self, event: str, stream: str, step: int) -> None:
        self.ops.append(Record(event, stream, step, self._cost(self.cfg.costs.event_record_us)))

    def wait_event(self, stream: str, event: str, step: int) -> None:
        c = self.cfg.costs
        self.ops.append(WaitEvent(stream, event, step, self._cost(c.wait_event_us),
                                  self.draw(c.cross_stream_us)))

    def wait_stream(self, stream: str, other: str, step: int) -> None:
        c = self.cfg.costs
        self.ops.append(WaitStream(stream, other, step, self._cost(c.wait_stream_us),
                                   self.draw(c.cross_stream_us)))

    def sync(self, event: str, step: int, site: str) -> None:
        c = self.cfg.costs
        self.ops.append(Synchronize(event, step, site, self._cost(c.sync_us),
                                    self.draw(c.sync_wake_us)))

    def cpu(self, label: str, dur, step: int) -> None:
        d = self.draw(dur)
        if d > 0:
            self.ops.append(CpuWork(label, d, step))

    # ---- the loop
    def build(self) -> Program:
        ops = list(self.iter_ops())
        return Program(ops=ops, meta=self.meta())

    def iter_ops(self):
        """The ops of every iteration and the final drain, generated iteration by iteration."""
        for k in range(self.cfg.steps):
            self.iteration(k)
            yield from self.ops
            self.ops.clear()
        self.drain(self.cfg.steps)
        yield from self.ops
        self.ops.clear()

    def meta(self) -> dict:
        cfg, p = self.cfg, self.point
        return {
            "name": cfg.name, "seed": cfg.seed, "steps": cfg.steps,
            "warmup_steps": cfg.warmup_steps, "algorithm": cfg.algorithm,
            "batch_size": cfg.batch_size, "accept_tokens": cfg.accept.tokens,
            "barrier": cfg.policy.barrier, "barrier_effective": self.barrier,
            "placement": cfg.policy.placement, "publish_phase": p.phase,
            "publish_position": p.position, "publish_reason": p.reason,
            "forward_stream": "forward",
        }

    def iteration(self, k: int) -> None:
        cfg, pol = self.cfg, self.cfg.policy
        self.ops.append(StepMarker(k))
        loop_top = pol.placement == "loop_top" and k > 0
        if loop_top and not self.policy.blocks_at_prepare:
            self.policy.fence(self, k - 1)
        self.cpu("ingest", cfg.cpu.ingest_us, k)
        self.cpu("schedule", cfg.cpu.schedule_us, k)
        if loop_top and self.policy.blocks_at_prepare:
            self.policy.before_prepare(self, k)
        self.cpu("prepare", cfg.cpu.prepare_us, k)
        self.schedule_writes(k)
        self.run_batch(k)
        if pol.placement == "after_launch":
            self.policy.fence(self, k)
        self.cpu("post_launch", cfg.cpu.post_launch_us, k)
        if k > 0:
            self.process_result(k - 1, k)

    def drain(self, k: int) -> None:
        self.ops.append(StepMarker(k))
        self.process_result(k - 1, k)

    def schedule_writes(self, k: int) -> None:
        gpu = self.cfg.gpu
        stream = "plan" if self.cfg.policy.plan_stream else "schedule"
        if stream == "plan":
            self.wait_stream("plan", "schedule", k)
        if _positive(gpu.schedule_prep_us):  # schedule-stream work before the write itself
            self.launch(stream, "schedule_prep", gpu.schedule_prep_us, k)
        self.launch(stream, "schedule_writes", gpu.schedule_writes_us, k, writes=self.writes)
        if stream == "plan":
            self.wait_stream("schedule", "plan", k)

    def run_batch(self, k: int) -> None:
        cfg, pol = self.cfg, self.cfg.policy
        self.ops.append(Marker("run_batch", k))
        if pol.needs_cpu_seq_lens and k > 0:
            # resolve_seq_lens_cpu: a D2H on a private stream gated on the publish of k-1,
            # then a host block on it
            self.wait_event("d2h", f"publish_ready[{k - 1}]", k)
            self.launch("d2h", "seq_lens_d2h", cfg.gpu.seq_lens_copy_us, k)
            self.record(f"seq_lens_d2h[{k}]", "d2h", k)
            self.sync(f"seq_lens_d2h[{k}]", k, "seq_lens")
        self.wait_stream("forward", "schedule", k)
        for i, phase in enumerate(self.phases):
            self.phase(k, i, phase)
            if phase.future_publish:
                self.record(f"publish_ready[{k}]", "forward", k)
        self.policy.after_phases(self, k)
        copy_stream = cfg.gpu.result_copy_stream
        if copy_stream != "forward":
            self.wait_stream(copy_stream, "forward", k)
        self.launch(copy_stream, "result_copy", cfg.gpu.result_copy_us, k)
        self.record(f"copy_done[{k}]", copy_stream, k)

    def phase(self, k: int, i: int, ph: Phase) -> None:
        costs = self.cfg.costs
        publishes = self.point.index == i and self.point.phase is not None
        pos = self.point.position if publishes else None
        reads = tuple(ph.reads)
        name = ph.name
        self.cpu(f"{name}.dispatch", ph.host_us, k)
        if _positive(ph.load_batch_us):
            self.launch("forward", f"{name}.load_batch", ph.load_batch_us, k, name, reads=reads)
        body_reads = reads if ph.graph == "breakable" else ()
        if ph.graph == "eager":
            if pos == "pre_replay":
                self.publish_record(k)
            if _positive(ph.prep_us):
                self.launch("forward", f"{name}.prep", ph.prep_us, k, name, reads=reads)
            if pos == "in_replay":
                self.publish_record(k)
            self.launch("forward", f"{name}.body", ph.body_us, k, name)
            if pos == "post_replay":
                self.publish_record(k)
            return
        if pos == "pre_replay":
            self.publish_record(k)
        nodes: list = []
        if _positive(ph.prep_us):
            nodes.append(Kernel(f"{name}.prep", self.draw(ph.prep_us), reads, (), name))
        if pos == "in_replay" and self.point.in_graph:
            event = f"{name}.read_done"
            nodes.append(GraphRecord(event))
            self.read_done[k] = event
        nodes.append(Kernel(f"{name}.body", self.draw(ph.body_us), body_reads, (), name))
        self.ops.append(GraphLaunch("forward", f"{name}.graph", tuple(nodes), k, name,
                                    self._cost(costs.graph_launch_us)))
        if pos == "post_replay" or (pos == "in_replay" and not self.point.in_graph):
            self.publish_record(k)

    def publish_record(self, k: int) -> None:
        event = f"read_done[{k}]"
        self.record(event, "forward", k)
        self.read_done[k] = event

    def process_result(self, j: int, k: int) -> None:
        """Iteration k processes the result of step j = k-1."""
        cfg = self.cfg
        self.sync(f"copy_done[{j}]", k, "result_copy")
        self.cpu("process_result", cfg.cpu.process_result_us, k)
        if _positive(cfg.gpu.result_writes_us):
            self.launch("schedule", "result_writes", cfg.gpu.result_writes_us, k,
                        writes=self.writes)


def _positive(d) -> bool:
    return isinstance(d, Dist) or d > 0
