"""Config and per-step sizes → Program, following SGLang's overlap loop (docs/design.md).

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

A final drain processes the last result. ``policy.launch_ahead: 2`` (a what-if) processes
the result of step k-2 instead, so the host launches up to two forwards ahead; the drain
then processes the last two.

``policy.overlap: false`` builds SGLang's normal loop instead (``event_loop_normal``): the
same iteration, without a WAR barrier and without the FutureMap's seq_lens D2H, processing
step k's own result right after its launch (``copy_done[k].synchronize()`` then the CPU
work), so step k+1 is scheduled only once forward k has ended; the drain is empty. The host
sync orders every later write after forward k's reads, which is why no barrier is needed.

Requests with prompts (``workload.prompt_tokens``, a ``prefill:`` section) add, in
``run_batch`` before the decode phases, the step's prefill (:meth:`LoopBuilder.prefill_chunk`):
its host work and kernel (an eager launch, ``prefill.launches`` of them each after its share
of the host work, or a piecewise graph's launch) whose durations are per-step series of the
arrivals model (:data:`PREFILL_US`, :data:`PREFILL_HOST_US`, or each launch's share).
With prompts the scheduler picks each step's shape (every rule; without prompts only with
``scheduling.idle``), so each step has the shape the arrivals model picked
(``sizes.shape``): a ``mixed`` step (the rules ``sglang_mixed`` and ``vllm`` while prompt
tokens wait) runs the chunk before the decode phases, a ``decode`` step (theirs when none
waits, as the servers run one) the phases alone, a ``prefill`` step the prefill forward alone
(its read-done where ``prefill.read_ends`` says, and the FutureMap record after it), an
``idle`` step the idle forward alone
(:meth:`LoopBuilder.idle_forward`); everything else in the iteration is the same, so the WAR
barrier orders the next step's writes after this step's reads whatever the two shapes are.
Such a run draws with a :class:`StreamSampler` (iteration k's numbers never depend on the
steps to come) and is never planned from iteration templates. A run with requests marks the
host instant each step's result has been processed (``Marker("result_done", j)``): the
first-token time a client sees.

Durations come from one generator seeded by ``config.seed``: each distribution is
drawn in a single call holding all of its uses in program order (distributions in order
of first use), before the ops are built (:class:`simwar.builder.draws.Sampler`). The same
iteration code, given symbolic durations (:class:`simwar.builder.draws.Symbolic`), builds the
first iterations and the drain as templates (:func:`plan_iterations`), from which
:mod:`simwar.executors.fast` runs a config without building its Program; both take the
same numbers from the same draws.

**Durations that vary with the step.** A run's per-step sizes (batch, graph bucket,
accepted tokens: :mod:`simwar.builder.sizes`) are arrays computed before any op and given to
every function here (:func:`simwar.api.resolve_sizes` draws them, and realizes arrivals
first). An affine duration (:class:`simwar.config.schema.Affine`) is drawn like a
distribution: each use asks for the size of a step (the step being prepared, or the one
whose result is processed, see :func:`simwar.config.schema.duration_keys`) and whether it is
padded to the graph bucket; the symbolic build records that context per use, and
:class:`~simwar.builder.draws.AffineTable` evaluates every use of the run at once, vectorised,
into one array per duration in program order (its noise draws added), which the builder and
the fast executor read as they read the draws.
The structure of an iteration never depends on the sizes: only numbers do (graph launches
carry their size in their name, ``verify.graph@32``, which is not part of an iteration's
shape).

Imports: :mod:`simwar.core.program`, :mod:`simwar.config` and the other build modules; no
simpy, nothing from executors or above.
"""

from __future__ import annotations

import numpy as np

from simwar.builder.draws import (
    PREFILL_HOST_BEFORE_US,
    PREFILL_HOST_US,
    PREFILL_US,
    RECEIVED_US,
    WAIT_REQUESTS,
    AffineTable,
    Sampler,
    Series,
    Symbolic,
    launch_durations,
    sample,
)
from simwar.builder.sizes import StepSizes, has_host_before
from simwar.config.policies import PublishPoint, barrier, publish_point
from simwar.config.schema import (
    Affine,
    Config,
    ConfigError,
    Dist,
    Phase,
    affine_error,
    duration_keys,
)
from simwar.core.program import (
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
    StepName,
    Synchronize,
    WaitEvent,
    WaitStream,
)

#: the event of a step's host read-done record (:meth:`LoopBuilder.publish_record`)
READ_DONE = "read_done[{}]"


def node_event(phase: str) -> str:
    """The event of ``phase``'s in-graph read-done node (every step's launch re-arms it)."""
    return f"{phase}.read_done"


def build_program(cfg: Config, sizes: StepSizes) -> Program:
    """The run's Program: every host operation of every iteration, durations drawn (a
    validated Config: ``simwar.load_config`` validates; its sizes, arrivals realized:
    :func:`simwar.api.resolve_sizes`)."""
    return _drawing_builder(cfg, sizes).build()


def _drawing_builder(cfg: Config, sizes: StepSizes) -> LoopBuilder:
    if sizes.shape is not None:  # shapes picked as the run goes: no iteration templates
        return shaped_builder(cfg, sizes)
    plan = plan_iterations(cfg, sizes)
    return LoopBuilder(cfg, plan.sampler(), sizes, plan.phases)


def shaped_builder(cfg: Config, sizes: StepSizes) -> LoopBuilder:
    """The builder of a run whose scheduler picks each step's shape (``sizes.shape``), drawing
    with a :class:`StreamSampler`: the numbers of iteration k never depend on the steps to
    come (the fast executor's realizing pass reads the same streams:
    :func:`simwar.executors.fast.realize_shapes`)."""
    phases = cfg.phase_table()
    return LoopBuilder(cfg, StreamSampler(cfg, sizes, phases), sizes, phases)


#: the generator stream of a shape-picking run's durations: ``[seed, DRAWS, ordinal]``
DRAWS = 25
#: draws taken from a distribution's generator at a time
DRAW_CHUNK = 4096


class StreamSampler:
    """The drawer of a run whose iteration shapes are picked as it runs (``scheduling.rule:
    sglang``).

    A run of one shape draws each distribution in one generator call sized by its uses in
    the whole run (:class:`~simwar.builder.draws.Sampler`), which the shapes to come would
    decide here. So each distribution has its own generator, seeded by ``[seed,``
    :data:`DRAWS` ``, its ordinal among the config's durations]``
    (:func:`~simwar.config.schema.duration_keys`; one not listed there, such as a noise,
    takes the next ordinal at its first use) and drawn :data:`DRAW_CHUNK` at a time, in
    program order; a step-dependent duration (affine, series) is evaluated at the sizes of
    the step it uses when asked, as :meth:`~simwar.builder.draws.AffineTable.at` does. Every
    executor builds the run's ops through it, from the same sizes in the same order, so
    every executor runs the same numbers.
    """

    def __init__(self, cfg: Config, sizes: StepSizes, phases: list[Phase]):
        self.seed = cfg.seed
        self.sizes = sizes
        self.ordinal: dict[int, int] = {}
        self.names: dict[int, str] = {}
        self.dists: dict[int, Dist] = {}
        for key, value, _ in duration_keys(cfg, phases):
            if isinstance(value, (Dist, Affine)):
                self.ordinal.setdefault(id(value), len(self.ordinal))
                self.names.setdefault(id(value), key)
        for _key, value, _ in duration_keys(cfg, phases):  # then the affine durations' noises
            if isinstance(value, Affine) and value.noise is not None:
                self.ordinal.setdefault(id(value.noise), len(self.ordinal))
        #: per distribution: its draws so far, in order, and how many were handed out
        self.drawn: dict[int, list] = {}
        self.pos: dict[int, int] = {}
        self._rng: dict[int, object] = {}
        self._last = len(sizes.batch) - 1

    def draws(self, d: Dist, n: int) -> list:
        """The first ``n`` (at least) draws of ``d``, in order (its list, grown in chunks)."""
        key = id(d)
        out = self.drawn.get(key)
        if out is None:
            self.dists[key] = d
            n_ = self.ordinal.setdefault(key, len(self.ordinal))
            self._rng[key] = np.random.default_rng([self.seed, DRAWS, n_])
            out = self.drawn[key] = []
            self.pos[key] = 0
        while len(out) < n:
            out.extend(sample(self._rng[key], d, DRAW_CHUNK).tolist())
        return out

    def _next(self, d: Dist) -> float:
        key = id(d)
        i = self.pos.get(key, 0)
        out = self.drawn.get(key)
        if out is None or i >= len(out):
            out = self.draws(d, i + 1)
        self.pos[key] = i + 1
        return out[i]

    def value(self, d, at: int, padded: bool = False) -> float:
        """A step-dependent duration (affine, without its noise; series) at step ``at``'s
        sizes."""
        i = at if at < self._last else self._last
        sz = self.sizes
        if type(d) is Series:
            return d.value(getattr(sz, d.name), i)
        size = float((sz.bucket if padded else sz.batch).item(i))
        tokens = sz.accept.item(i)
        v = d.value(size, tokens)
        if v < 0:
            raise ConfigError(affine_error(self.names.get(id(d), "a duration"), d, size,
                                           tokens, v, i))
        return v

    def __call__(self, d, at: int = 0, padded: bool = False):
        kind = type(d)
        if kind is Dist:
            return self._next(d)
        if kind is not Series and kind is not Affine:
            return d
        v = self.value(d, at, padded)
        if kind is Affine and d.noise is not None:
            v = v + self._next(d.noise)
        return v


class TemplateDrawer(Symbolic):
    """The symbolic drawer of a shape-picking run's iteration templates
    (:func:`shape_template`): as :class:`~simwar.builder.draws.Symbolic`, and for each use of
    an affine duration with noise, the index of its noise's draw (``noise_use[(key,
    use)]``)."""

    def __init__(self) -> None:
        super().__init__()
        self.noise_use: dict[tuple[int, int], int] = {}

    def __call__(self, d, at: int = 0, padded: bool = False):
        if type(d) is Affine and d.noise is not None:
            m = self.uses.get(id(d.noise), 0)
            out = super().__call__(d, at, padded)
            self.noise_use[(id(d), out.index)] = m
            return out
        return super().__call__(d, at, padded)


def shape_template(cfg: Config, phases: list[Phase], sizes: StepSizes, shapes: list[int],
                   drain: bool = False):
    """Symbolic iterations at steps 0, 1, ... of the shapes ``shapes`` (codes), and the
    drain after them if ``drain``: the last one stands for a step of a shape-picking run
    whose shape and the few before it are these (what its waits and syncs bind to), at a
    step at least as far into the run (its structure depends on its step only up to
    ``policy.launch_ahead``: :func:`simwar.executors.fast.realize_shapes`). Returns ``(ops
    per iteration, the drawer, the last iteration's uses and contexts)``; ``phases``: the
    run's phase table (draws are keyed by object)."""
    n = len(shapes)
    sk = StepSizes(np.zeros(max(n, 1), dtype=np.int64), np.zeros(max(n, 1), dtype=np.int64),
                   np.zeros(max(n, 1)), sizes.buckets,
                   idle=None if sizes.idle is None else np.zeros(n + 1),
                   suffix=sizes.suffix, source=sizes.source,
                   shape=np.asarray(list(shapes) or [0], dtype=np.int8))
    drawer = TemplateDrawer()
    b = LoopBuilder(cfg, drawer, sk, phases)
    ops: list[list] = []
    uses = contexts = None
    drawer.new_iteration(0)
    for k in range(n):
        b.iteration(k)
        ops.append(b.ops)
        b.ops = []
        uses, contexts = drawer.new_iteration(k + 1)
    if drain:
        b.drain(n)
        ops.append(b.ops)
        b.ops = []
        uses, contexts = drawer.new_iteration()
    return ops, drawer, uses, contexts


#: iterations built symbolically to find the steady-state iteration (see :func:`plan_iterations`)
SKELETON = 6


class IterationPlan:
    """The run as iteration templates: which template each iteration (and the drain) uses.

    ``ops[i]`` is the host ops of skeleton iteration i (durations as numbers or
    :class:`~simwar.builder.draws.Use`), ``uses[i]`` its draws per distribution; ``role(k)``
    maps run iteration k (``steps`` is the drain) to its skeleton iteration. Iterations from
    the third on are identical up to the step number (checked by
    :mod:`simwar.executors.fast` on the skeleton), so a run of any length is the first
    iterations, the steady one repeated, and the drain.
    """

    def __init__(self, cfg: Config, ops: list[list], uses: list[dict], dists: dict, meta: dict,
                 phases: list[Phase], affines: dict | None = None,
                 contexts: list[dict] | None = None, sizes: StepSizes | None = None):
        self.cfg = cfg
        self.phases = phases
        self.ops = ops
        self.uses = uses
        self.dists = dists
        self.meta = meta
        self.steps = cfg.steps
        self.affines = affines or {}  # key -> Affine or Series (per-use arrays, not draws)
        self.contexts = contexts or [{} for _ in ops]  # per skeleton iteration
        self.sizes = sizes
        self.noise_of: dict[int, int] = {}  # affine key -> the key of its noise's draws
        #: per iteration, where a host read-done record of each publish point goes (None:
        #: not kept; :func:`plan_iterations`)
        self.spots: list[dict] | None = None

    def segments(self) -> list[tuple[int, int, int]]:
        """The run's iterations (the drain last) as ``(skeleton iteration, first, count)``."""
        n = len(self.ops) - 1
        if self.steps <= n:
            out = [(i, i, 1) for i in range(n)]
        else:
            out = [(i, i, 1) for i in range(n - 1)] + [(n - 1, n - 1, self.steps - (n - 1))]
        return out + [(n, self.steps, 1)]

    def sampler(self, fill: bool = True) -> Sampler:
        """The run's draws, and the per-use values of its affine durations
        (``fill=False``: left to :meth:`~simwar.builder.draws.AffineTable.fill`, as the sizes
        become known)."""
        sampler = Sampler(self.cfg.seed, self.draw_counts())
        if self.affines:
            table = AffineTable(self, self.sizes, sampler.arrays)
            if fill:
                table.fill(0, self.steps + 1)
            sampler.table = table
        return sampler

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
        for i, _, count in self.segments():
            for key, c in self.uses[i].items():
                if key in total:
                    total[key] += c * count
        return {key: (self.dists[key], total[key]) for key in self.dists}


def plan_iterations(cfg: Config, sizes: StepSizes, phases: list[Phase] | None = None,
                    drawer: Symbolic | None = None, spots: bool = False) -> IterationPlan:
    """Build the first iterations and the drain symbolically (no numbers drawn), at the
    run's per-step ``sizes``. An arrivals run's may not be realized yet (while
    :func:`simwar.executors.fast.realize` fixes them): the templates' structure never
    depends on the sizes, and their step-dependent values are filled later
    (:meth:`~simwar.builder.draws.AffineTable.fill`). ``phases``, ``drawer``: a phase table
    and a symbolic drawer of the caller's (:func:`simwar.builder.template.traced`).
    ``spots``: keep, per iteration, where a host read-done record of each publish point
    goes (``out.spots``: :mod:`simwar.builder.moves` moves the record there)."""
    sym = drawer if drawer is not None else Symbolic()
    b = LoopBuilder(cfg, sym, sizes, phases)
    n = min(cfg.steps, SKELETON)
    ops: list[list] = []
    uses: list[dict] = []
    contexts: list[dict] = []
    kept: list[dict] = []
    sym.new_iteration(0)
    for k in range(n):
        start = len(b.ops)
        b.spots = {} if spots else None
        b.iteration(k)
        ops.append(b.ops[start:])
        if spots:
            kept.append({key: i - start for key, i in b.spots.items()})
        u, c = sym.new_iteration(k + 1)
        uses.append(u)
        contexts.append(c)
    start = len(b.ops)
    b.spots = {} if spots else None
    b.drain(n)
    ops.append(b.ops[start:])
    if spots:
        kept.append({key: i - start for key, i in b.spots.items()})
    u, c = sym.new_iteration()
    uses.append(u)
    contexts.append(c)
    out = IterationPlan(cfg, ops, uses, dict(sym.dists), b.meta(), b.phases,
                        dict(sym.affines), contexts, sizes)
    out.noise_of = dict(sym.noise_of)
    out.spots = kept if spots else None
    return out


def stream_program(cfg: Config, sizes: StepSizes) -> Program:
    """The same Program with its ops generated one iteration at a time as they are read.

    For executors that read the ops once, in order (the SimPy engine): a long run
    then never holds the whole op list. ``ops`` is a one-shot iterator; use
    :func:`build_program` for a Program to inspect, serialize or replay.
    """
    builder = _drawing_builder(cfg, sizes)
    return Program(ops=builder.iter_ops(), meta=builder.meta())


class LoopBuilder:
    """Issues the host operations of SGLang's overlap loop for one config (module docstring).

    ``draw`` hands out each duration as it is issued (a :class:`~simwar.builder.draws.Sampler`
    for numbers, a :class:`~simwar.builder.draws.Symbolic` for templates); ``sizes``: the
    run's per-step sizes; ``phases``: the phase table (the config's by default; builders of
    one run share it, since draws are keyed by object). The barrier policy's hooks
    (:mod:`simwar.config.policies`) call its host-API methods (``launch``, ``record``,
    ``wait_event``, ``wait_stream``, ``sync``, ``cpu``).
    """

    def __init__(self, cfg: Config, draw, sizes: StepSizes, phases: list[Phase] | None = None):
        self.cfg = cfg
        self.sizes = sizes
        self._at = 0  # the step whose sizes the durations drawn now use
        # distributions are keyed by object: builders of one run share the phase table
        self.phases: list[Phase] = phases if phases is not None else cfg.phase_table()
        pol = cfg.policy
        self.point: PublishPoint = publish_point(self.phases, pol.publish_phase,
                                                 pol.external_events, pol.in_replay_fallback)
        # the normal loop syncs on each result before scheduling the next step: no barrier
        self.overlap = pol.overlap
        self.policy = barrier(pol.barrier if pol.overlap else "none").resolve(self.point)
        self.barrier = self.policy.name
        # requests arrive (arrivals, closed loop): each processed result is marked
        self.marks_results = sizes.idle is not None
        self.prefill = cfg.prefill
        #: each eager prefill launch's host and device durations (made once, not per step)
        self.launch_durations = launch_durations(cfg.prefill) if cfg.prefill else None
        self.draw = draw
        self.ops: list[HostOp] = []
        self.writes = tuple(cfg.gpu.writes)
        # the step-k event each barrier kind waits/syncs on
        self.read_done: dict[int, str] = {}
        #: where a host read-done record of each publish point goes in ``ops``, when kept
        #: (a dict: ``(phase index, position) -> index``; :mod:`simwar.builder.moves`)
        self.spots: dict | None = None

    # ---- host API calls, with their costs drawn per call
    def _draw(self, d, padded: bool = False):
        return self.draw(d, self._at, padded)

    def _cost(self, d) -> float:
        return self._draw(d) + self._draw(self.cfg.costs.host_call_us)

    def launch(self, stream: str, label: str, dur, step: int, phase: str = "",
               reads=(), writes=()) -> None:
        k = Kernel(label, self._draw(dur), tuple(reads), tuple(writes), phase)
        self.ops.append(Launch(stream, k, step, self._cost(self.cfg.costs.launch_us)))

    def record(self, event: str, stream: str, step: int) -> None:
        self.ops.append(Record(event, stream, step, self._cost(self.cfg.costs.event_record_us)))

    def wait_event(self, stream: str, event: str, step: int) -> None:
        c = self.cfg.costs
        self.ops.append(WaitEvent(stream, event, step, self._cost(c.wait_event_us),
                                  self._draw(c.cross_stream_us)))

    def wait_stream(self, stream: str, other: str, step: int) -> None:
        c = self.cfg.costs
        self.ops.append(WaitStream(stream, other, step, self._cost(c.wait_stream_us),
                                   self._draw(c.cross_stream_us)))

    def sync(self, event: str, step: int, site: str) -> None:
        c = self.cfg.costs
        self.ops.append(Synchronize(event, step, site, self._cost(c.sync_us),
                                    self._draw(c.sync_wake_us)))

    def cpu(self, label: str, dur, step: int) -> None:
        d = self._draw(dur)
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
        out = {
            "name": cfg.name, "seed": cfg.seed, "steps": cfg.steps,
            "warmup_steps": cfg.warmup_steps, "algorithm": cfg.algorithm,
            "batch_size": cfg.batch_size, "accept_tokens": cfg.accept.tokens,
            "barrier": cfg.policy.barrier, "barrier_effective": self.barrier,
            "placement": cfg.policy.placement, "publish_phase": p.phase,
            "publish_position": p.position, "publish_reason": p.reason,
            "forward_stream": "forward",
        }
        if not self.overlap:
            out["overlap"] = False
        if cfg.scheduling.rule != "sglang_mixed":
            out["scheduling"] = cfg.scheduling.rule
        if cfg.slo:
            out["slo"] = dict(cfg.slo)
        out.update(sizes_meta(self.sizes))
        return out

    def iteration(self, k: int) -> None:
        cfg, pol = self.cfg, self.cfg.policy
        self.ops.append(StepMarker(k))
        self._at = k
        if self.sizes.idle is not None:
            self.cpu("wait_requests", WAIT_REQUESTS, k)
        loop_top = pol.placement == "loop_top" and k > 0 and self.overlap
        if loop_top and not self.policy.blocks_at_prepare:
            self.policy.fence(self, k - 1)
        self.cpu("ingest", cfg.cpu.ingest_us, k)
        # arrivals: the requests received at the marker. Tested on ``idle``, not on
        # ``received_us``: a shape-picking run's realization builds its iterations from
        # :func:`shape_template`, whose sizes carry ``idle`` but no ``received_us``: there the
        # op would be missing, the waits it realizes (replayed as fixed waits) too long, and
        # the run behind by every receive before each wait (tests/test_receive.py's lone
        # requests: 2x, 3x the cost, read as a double charge)
        if self.sizes.idle is not None and cfg.cpu.receive_us.given():
            self.cpu("ingest.requests", RECEIVED_US, k)
        self.cpu("schedule", cfg.cpu.schedule_us, k)
        if loop_top and self.policy.blocks_at_prepare:
            self.policy.before_prepare(self, k)
        self.cpu("prepare", cfg.cpu.prepare_us, k)
        if self.prefills(k) and has_host_before(self.prefill):  # the prefill's own preparing
            self.cpu("prefill.prepare", PREFILL_HOST_BEFORE_US, k)  # (prepare_for_decode's)
        self.schedule_writes(k)
        early = self.consecutive_prefill(k)
        if early:  # the previous prefill step's result first: no overlap between the two
            self.process_result(k - 1, k)
        self.run_batch(k)
        if not self.overlap:  # the normal loop: this step's own result, before the next step
            self.cpu("post_launch", cfg.cpu.post_launch_us, k)
            self.process_result(k, k)
            return
        if pol.placement == "after_launch":
            self.policy.fence(self, k)
        self.cpu("post_launch", cfg.cpu.post_launch_us, k)
        depth = pol.launch_ahead
        if k >= depth and not early:
            self.process_result(k - depth, k)

    def prefills(self, k: int) -> bool:
        """Whether step k launches a prefill chunk (:meth:`run_batch`): a prefill step of its
        own, or a mixed step."""
        shape = self.sizes.shape_of(k)
        return shape == "prefill" or (self.prefill is not None
                                      and shape not in ("decode", "idle"))

    def consecutive_prefill(self, k: int) -> bool:
        """Whether iteration k processes step k-1's result before launching step k: two
        prefill steps in a row with ``scheduling.overlap_consecutive_prefill: false``
        (SGLang's ``is_disable_overlap_for_batch`` under
        ``SGLANG_DISABLE_CONSECUTIVE_PREFILL_OVERLAP``: ``pop_and_process`` before
        ``run_batch``)."""
        if self.cfg.scheduling.overlap_consecutive_prefill or k == 0 or not self.overlap:
            return False
        return self.sizes.shape_of(k) == "prefill" == self.sizes.shape_of(k - 1)

    def drain(self, k: int) -> None:
        self.ops.append(StepMarker(k))
        if self.overlap:  # the normal loop processed every result in its own iteration
            for j in range(max(0, k - self.cfg.policy.launch_ahead), k):
                self.process_result(j, k)

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
        if pol.needs_cpu_seq_lens and k > 0 and self.overlap:
            # resolve_seq_lens_cpu: a D2H on a private stream gated on the publish of k-1,
            # then a host block on it
            self.wait_event("d2h", StepName("publish_ready[{}]", k - 1), k)
            self.launch("d2h", "seq_lens_d2h", cfg.gpu.seq_lens_copy_us, k)
            self.record(StepName("seq_lens_d2h[{}]", k), "d2h", k)
            self.sync(StepName("seq_lens_d2h[{}]", k), k, "seq_lens")
        self.wait_stream("forward", "schedule", k)
        shape = self.sizes.shape_of(k)
        if shape == "prefill":  # a prefill step of its own: the decode phases do not run
            self.prefill_chunk(k, publish=True)
            self.future_publish(k)
        elif shape == "idle":  # a DP-attention idle batch: the idle forward alone
            self.idle_forward(k)
            self.future_publish(k)
        else:  # decode, or mixed: the prefill chunk before the decode phases
            if self.prefill is not None and shape != "decode":
                self.prefill_chunk(k)
            for i, phase in enumerate(self.phases):
                self.phase(k, i, phase)
                if phase.future_publish:
                    self.record(StepName("publish_ready[{}]", k), "forward", k)
        self.policy.after_phases(self, k)
        copy_stream = cfg.gpu.result_copy_stream
        if copy_stream != "forward":
            self.wait_stream(copy_stream, "forward", k)
        self.launch(copy_stream, "result_copy", cfg.gpu.result_copy_us, k)
        self.record(StepName("copy_done[{}]", k), copy_stream, k)

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
            self._spot(i, "pre_replay")
            if pos == "pre_replay":
                self.publish_record(k)
            if _positive(ph.prep_us):
                self.launch("forward", f"{name}.prep", ph.prep_us, k, name, reads=reads)
            self._spot(i, "in_replay")
            if pos == "in_replay":
                self.publish_record(k)
            self.launch("forward", f"{name}.body", ph.body_us, k, name)
            self._spot(i, "post_replay")
            if pos == "post_replay":
                self.publish_record(k)
            return
        self._spot(i, "pre_replay")
        if pos == "pre_replay":
            self.publish_record(k)
        nodes: list = []
        if _positive(ph.prep_us):
            nodes.append(Kernel(f"{name}.prep", self._draw(ph.prep_us, True), reads, (), name))
        if pos == "in_replay" and self.point.in_graph:
            event = node_event(name)
            nodes.append(GraphRecord(event))
            self.read_done[k] = event
        nodes.append(Kernel(f"{name}.body", self._draw(ph.body_us, True), body_reads, (), name))
        graph = f"{name}.graph"
        sz = self.sizes
        if sz.suffix:  # one captured graph per (phase, bucket)
            graph = StepName(graph.replace("{", "{{").replace("}", "}}") + "@{}", k, "bucket",
                             int(sz.bucket[k]))
        self.ops.append(GraphLaunch("forward", graph, tuple(nodes), k, name,
                                    self._cost(costs.graph_launch_us)))
        self._spot(i, "in_replay", "post_replay")  # a host record: after the launch
        if pos == "post_replay" or (pos == "in_replay" and not self.point.in_graph):
            self.publish_record(k)

    def _spot(self, i: int, *positions: str) -> None:
        """Where a host read-done record of phase ``i`` at ``positions`` goes: here."""
        if self.spots is not None:
            for pos in positions:
                self.spots[(i, pos)] = len(self.ops)

    def prefill_chunk(self, k: int, publish: bool = False) -> None:
        """Step k's prefill tokens (a chunk, mixed before the decode phases or in a prefill
        step of its own; the host's work on it before its step's launches,
        ``prefill.host_before_us``, is the iteration's, after ``cpu.prepare``):
        ``prefill.launches`` times host work then a kernel (eager: each launch's share of
        the step's host and device time, equal or by ``prefill.host_shares`` and
        ``device_shares``, so the GPU runs a kernel while the host dispatches the next), or
        host work then one graph launch (piecewise, or full); each nothing when no token is
        prefilled. ``publish``: a prefill step of its own,
        which records its read-done where ``prefill.read_ends`` says, when the run publishes
        one (a fine barrier then fences the step at it; publishing nothing leaves the step
        to the coarse fallback)."""
        pf = self.prefill
        ends = pf.read_ends if publish and self.point.phase is not None else None
        reads = tuple(pf.reads)
        if pf.graph != "eager":  # a graph launch: piecewise, or full (a step of its own)
            self.cpu("prefill.dispatch", PREFILL_HOST_US, k)
            if ends == "pre_replay":
                self.publish_record(k)
            node = Kernel("prefill.forward", self._draw(PREFILL_US), reads, (), "prefill")
            self.ops.append(GraphLaunch("forward", "prefill.graph", (node,), k, "prefill",
                                        self._cost(self.cfg.costs.graph_launch_us)))
        else:
            hosts, devs = self.launch_durations
            for i in range(pf.launches):
                self.cpu("prefill.dispatch", hosts[i], k)
                if i == 0 and ends == "pre_replay":
                    self.publish_record(k)
                # with in_replay the first kernel (the attention metadata) alone reads
                self.launch("forward", "prefill.forward", devs[i], k, "prefill",
                            reads=reads if i == 0 or pf.read_ends != "in_replay" else ())
                if i == 0 and ends == "in_replay":
                    self.publish_record(k)
        if ends == "post_replay":
            self.publish_record(k)

    def idle_forward(self, k: int) -> None:
        """Step k's DP-attention idle batch (``scheduling.idle``): host work, then the idle
        forward (a kernel launch, or a graph launch), which reads no shared buffer; its
        read-done after it when the run publishes one."""
        idle = self.cfg.scheduling.idle
        self.cpu("idle.dispatch", idle.host_us, k)
        if idle.graph == "eager":
            self.launch("forward", "idle.forward", idle.forward_us, k, "idle")
        else:
            node = Kernel("idle.forward", self._draw(idle.forward_us), (), (), "idle")
            self.ops.append(GraphLaunch("forward", "idle.graph", (node,), k, "idle",
                                        self._cost(self.cfg.costs.graph_launch_us)))
        if self.point.phase is not None:
            self.publish_record(k)

    def future_publish(self, k: int) -> None:
        """A step without decode phases (prefill, idle) records the FutureMap's publish where
        a decode phase would."""
        if any(ph.future_publish for ph in self.phases):
            self.record(StepName("publish_ready[{}]", k), "forward", k)

    def publish_record(self, k: int) -> None:
        event = StepName(READ_DONE, k)
        self.record(event, "forward", k)
        self.read_done[k] = event

    def process_result(self, j: int, k: int) -> None:
        """Iteration k processes the result of step j = k-1."""
        cfg = self.cfg
        at, self._at = self._at, j  # the durations of processing scale with step j's batch
        self.sync(StepName("copy_done[{}]", j), k, "result_copy")
        self.cpu("process_result", cfg.cpu.process_result_us, k)
        if _positive(cfg.gpu.result_writes_us):
            self.launch("schedule", "result_writes", cfg.gpu.result_writes_us, k,
                        writes=self.writes)
        if self.marks_results:
            self.ops.append(Marker("result_done", j))
        self._at = at


def sizes_meta(sz: StepSizes) -> dict:
    """The meta a run's per-step sizes give: for a run whose steps differ, its means in
    place of the constants, and the steps' own values (``workload``)."""
    if not sz.per_step:
        return {}
    return {"batch_size": float(sz.batch.mean()) if len(sz.batch) else 0.0,
            "accept_tokens": float(sz.accept.mean()) if len(sz.accept) else 0.0,
            "workload": sz.meta()}


def _positive(d) -> bool:
    return isinstance(d, (Dist, Affine)) or d > 0


__all__ = ["DRAWS", "SKELETON", "IterationPlan", "LoopBuilder", "StreamSampler", "TemplateDrawer",
           "build_program", "plan_iterations", "shape_template", "shaped_builder", "sizes_meta",
           "stream_program"]
