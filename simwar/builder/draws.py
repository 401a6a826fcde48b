"""Drawing a run's durations: the samples, the drawers the builder calls, the affine table.

The builder asks a *drawer* for each duration as it issues an op: ``draw(value, at,
padded)``, ``at`` the step whose sizes the duration uses and ``padded`` whether the size is
the step's graph bucket. Two drawers:

- :class:`Sampler`: numbers. Every distribution of a run is drawn up front, in one generator
  call holding all of its uses in program order (:func:`sample`); step-dependent durations
  (:class:`~simwar.config.schema.Affine`, :class:`Series`) are read from the arrays of an
  :class:`AffineTable`, laid out the same way;
- :class:`Symbolic`: placeholders (:class:`Use`, :class:`Sum` for a host call's cost),
  recording each step-dependent use's context, for the iteration templates of
  :func:`simwar.builder.loop.plan_iterations`, which the fast executor fills from the same
  arrays.

Imports: numpy and :mod:`simwar.config`; nothing from executors or above.
"""

from __future__ import annotations

import numpy as np

from simwar.config.schema import Affine, ConfigError, Dist, affine_error, duration_keys


class Sampler:
    """Draws every duration of a run up front: one generator call per distribution.

    The distributions (config values that are a :class:`Dist`) are drawn in order of their
    first use in the program, each as one array holding all of its uses in program order
    (iteration by iteration, and within one in the order the builder asks). Constants never
    touch the generator. Calling it with a config value hands out that value's draws in
    that order (a constant as it is). ``table``: the run's :class:`AffineTable` when it has
    step-dependent durations (their per-use values are in ``arrays`` too).
    """

    def __init__(self, seed: int, counts: dict[int, tuple[Dist, int]]):
        rng = np.random.default_rng(seed) if counts else None  # no generator: nothing drawn
        self.arrays: dict[int, np.ndarray] = {key: sample(rng, d, n)
                                              for key, (d, n) in counts.items()}
        self.table: AffineTable | None = None
        self._next: dict[int, object] = {}

    def __call__(self, d, at: int = 0, padded: bool = False):
        it = self._next.get(id(d))
        if it is None:
            if not isinstance(d, _DRAWN):
                return d
            it = self._next[id(d)] = iter(self.arrays[id(d)].tolist())
        return next(it)

    def unused(self) -> list[int]:
        """The arrays not handed out to the last draw (keys): one never read, or one with
        draws left. A check once a build is done (it reads one draw further)."""
        return [key for key in self.arrays
                if key not in self._next or next(self._next[key], None) is not None]


def sample(rng: np.random.Generator, d: Dist, n: int) -> np.ndarray:
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


class Series:
    """A builder-made duration read from a per-iteration array of the run's sizes
    (``idle``: the wait for a first request under arrivals), times ``scale`` when it has one
    (a launch's share of its step's prefill: :func:`launch_series`). Every drawer reads it
    through :meth:`values` and :meth:`value`: one rule, so every executor has the same
    numbers."""

    __slots__ = ("name", "scale")

    def __init__(self, name: str, scale: float | None = None):
        self.name = name
        self.scale = scale

    def values(self, sizes, idx) -> np.ndarray:
        """The values at steps ``idx`` (an index array) of ``sizes``."""
        got = getattr(sizes, self.name)[idx]
        return got if self.scale is None else got * self.scale

    def value(self, array: np.ndarray, i: int) -> float:
        """The value at step ``i`` of ``array`` (this series' array of the run's sizes), as
        :meth:`values` computes it."""
        return array.item(i) if self.scale is None else array.item(i) * self.scale

    def __repr__(self) -> str:
        return f"Series({self.name!r})" if self.scale is None else \
            f"Series({self.name!r}, {self.scale!r})"


_LAUNCH_SERIES: dict[tuple, tuple[Series, ...]] = {}


def launch_series(name: str, weights: list[float]) -> tuple[Series, ...]:
    """Each launch's share of the series ``name`` (``prefill_us`` or ``prefill_host_us``):
    ``weights[i] / sum(weights)`` of it. The same objects for the same weights in every
    build, since a run's draws are keyed by the object (its symbolic plan and its numbers
    are two builds)."""
    key = (name, tuple(weights))
    got = _LAUNCH_SERIES.get(key)
    if got is None:
        total = float(sum(weights))
        got = _LAUNCH_SERIES[key] = tuple(Series(name, float(w) / total) for w in weights)
    return got


#: the host's wait for a request at the top of an iteration (arrivals only)
WAIT_REQUESTS = Series("idle")
#: the host's work for the requests an iteration receives (``cpu.receive_us`` given only)
RECEIVED_US = Series("received_us")
#: the prefill part of a step's forward, and the host's work to prepare it (prompts only:
#: :class:`simwar.config.schema.Prefill` at the step's prefill tokens)
PREFILL_US = Series("prefill_us")
PREFILL_HOST_US = Series("prefill_host_us")
#: the host's work before the prefill's first launch (``prefill.host_before_us`` given only)
PREFILL_HOST_BEFORE_US = Series("prefill_host_before_us")
#: each launch's share of them (``prefill.launches`` > 1)
PREFILL_LAUNCH_US = Series("prefill_launch_us")
PREFILL_LAUNCH_HOST_US = Series("prefill_launch_host_us")
#: config values handed out per use from an array (the others are constants)
_DRAWN = (Dist, Affine, Series)


def launch_durations(prefill) -> tuple[tuple[Series, ...], tuple[Series, ...]]:
    """Each eager prefill launch's host and device durations (``prefill``: the config's
    :class:`~simwar.config.schema.Prefill`): the whole (one launch), an equal share
    (``prefill_launch_*``) or its weight's (``prefill.host_shares``, ``device_shares``:
    :func:`launch_series`)."""
    n = prefill.launches
    if n == 1:
        return (PREFILL_HOST_US,), (PREFILL_US,)
    hosts = launch_series("prefill_host_us", prefill.host_shares) if prefill.host_shares \
        else (PREFILL_LAUNCH_HOST_US,) * n
    devs = launch_series("prefill_us", prefill.device_shares) if prefill.device_shares \
        else (PREFILL_LAUNCH_US,) * n
    return hosts, devs


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


class Symbolic:
    """A drawer that hands out :class:`Use` placeholders instead of numbers (templates).

    For a duration that varies with the step (affine, series) it also records, per use, the
    context: the step whose sizes it takes, relative to the iteration's, and whether the
    size is padded to the graph bucket.
    """

    def __init__(self) -> None:
        self.dists: dict[int, Dist] = {}  # key -> Dist, in order of first use
        self.affines: dict[int, object] = {}  # key -> Affine or Series, in order of first use
        self.uses: dict[int, int] = {}  # key -> uses in the current iteration
        self.contexts: dict[int, list] = {}  # affine key -> [(step offset, padded)] per use
        self.noise_of: dict[int, int] = {}  # affine key -> the key of its noise's draws
        self.k = 0  # the current iteration

    def new_iteration(self, k: int = 0) -> tuple[dict[int, int], dict[int, list]]:
        done, self.uses = self.uses, {}
        ctx, self.contexts = self.contexts, {}
        self.k = k
        return done, ctx

    def __call__(self, d, at: int = 0, padded: bool = False):
        if not isinstance(d, _DRAWN):
            return d
        key = id(d)
        if type(d) is Dist:
            self.dists.setdefault(key, d)
        else:
            self.affines.setdefault(key, d)
            self.contexts.setdefault(key, []).append((at - self.k, padded))
            if type(d) is Affine and d.noise is not None:
                self.noise_of[key] = id(d.noise)
                self(d.noise)  # one noise draw per use, from the run's generator
        n = self.uses.get(key, 0)
        self.uses[key] = n + 1
        return Use(key, n)


class AffineTable:
    """The value of every use of every step-dependent duration of a run, in program order.

    One flat array per duration (``arrays[key]``), laid out as the draws of a distribution
    are: iteration by iteration, and within one in the order of its uses. A use of an
    :class:`~simwar.config.schema.Affine` at iteration ``k`` with context ``(offset, padded)`` is
    ``base + per_seq * S + per_token * S * A`` (or a per-bucket table's entry at ``S``) plus its
    noise draw, where ``S`` is the batch of step ``k + offset`` (its graph bucket if ``padded``)
    and ``A`` that step's accepted tokens;
    a :class:`Series` use is the series' value at that step. :meth:`fill` computes iterations
    ``[k0, k1)`` at once (all of them for a run whose sizes are known; one at a time while
    arrivals are realized). The noise draws are taken out of ``draws``.

    ``plan``: the run's :class:`simwar.builder.loop.IterationPlan` (its config, phase table,
    step-dependent durations, their contexts per skeleton iteration and its segments);
    ``sizes``: its :class:`simwar.builder.sizes.StepSizes`.
    """

    def __init__(self, plan, sizes, draws: dict):
        self.plan = plan
        self.sizes = sizes
        self.segments = plan.segments()
        self.names = getattr(plan, "keys", None) or \
            {id(v): key for key, v, _ in duration_keys(plan.cfg, plan.phases)}
        self.arrays: dict[int, np.ndarray] = {}
        self.offsets: dict[int, list[int]] = {}
        self.noise: dict[int, np.ndarray] = {}
        self._uses: list | None = None  # per segment, its uses flat (one iteration's fill)
        self._memo: dict = {}  # (segment, sizes) -> its uses' values (:meth:`at`)
        self._last = 0  # the segment of the last iteration asked for
        for key, obj in plan.affines.items():
            pos, offs = 0, []
            for role, _, count in self.segments:
                offs.append(pos)
                pos += count * len(plan.contexts[role].get(key, ()))
            self.arrays[key] = np.zeros(pos)
            self.offsets[key] = offs
            if type(obj) is Affine and obj.noise is not None:
                self.noise[key] = draws.pop(plan.noise_of[key])
        draws.update(self.arrays)

    def fill(self, k0: int, k1: int) -> None:
        """Evaluate every use of iterations ``k0 <= k < k1`` (the drain is ``steps``)."""
        sizes = self.sizes
        last = len(sizes.batch) - 1
        for si, (role, s0, count) in enumerate(self.segments):
            a, b = max(k0, s0), min(k1, s0 + count)
            if a >= b:
                continue
            ks = np.arange(a, b)
            for key, ctx in self.plan.contexts[role].items():
                obj = self.plan.affines[key]
                c = len(ctx)
                block = np.empty((len(ks), c))
                for j, (off, padded) in enumerate(ctx):
                    idx = np.minimum(ks + off, last)
                    if type(obj) is Series:
                        block[:, j] = obj.values(sizes, idx)
                        continue
                    size = (sizes.bucket if padded else sizes.batch)[idx].astype(float)
                    tokens = sizes.accept[idx]
                    v = obj.value(size, tokens)
                    bad = np.flatnonzero(~(v >= 0))  # negative, or a bucket a table lacks
                    if len(bad):
                        i = bad[0]
                        raise ConfigError(affine_error(
                            self.names.get(key, "a duration"), obj, float(size[i]),
                            float(tokens[i]), float(v[i]), int(idx[i])))
                    block[:, j] = v
                start = self.offsets[key][si] + (a - s0) * c
                stop = start + len(ks) * c
                flat = block.ravel()
                if key in self.noise:
                    flat = flat + self.noise[key][start:stop]
                self.arrays[key][start:stop] = flat

    def at(self, k: int) -> dict[int, tuple]:
        """The values of iteration ``k``'s uses, per duration (``{key: (use 0, use 1, ...)}``):
        what :meth:`fill` writes for it, by the same operations on Python floats (as
        arrivals are realized, iteration by iteration). An iteration's values before noise
        depend only on the sizes of the steps its uses take, so they are kept per such
        sizes (a run has few distinct ones)."""
        if self._uses is None:
            self._uses = [self._role_uses(si) for si in range(len(self.segments))]
        si = self._last
        role, s0, count = self.segments[si]
        if not s0 <= k < s0 + count:
            si = self._last = next(i for i, (_, a, c) in enumerate(self.segments)
                                   if a <= k < a + c)
            role, s0, count = self.segments[si]
        offsets, plain, noisy, series = self._uses[si]
        sizes = self.sizes
        last = len(sizes.batch) - 1
        steps = [k + off if k + off < last else last for off in offsets]  # -1: the last
        at = tuple((sizes.batch.item(i), sizes.bucket.item(i), sizes.accept.item(i))
                   for i in steps)
        memo = self._memo
        values = memo.get((si, at))
        if values is None:
            if len(memo) >= 1 << 14:  # continuous accepted tokens: keep it small
                memo.clear()
            values = memo[(si, at)] = self._values(si, steps, at)
        if not noisy and not series:
            return values
        values = dict(values)
        for key, pos, noise in noisy:
            pos += (k - s0) * len(values[key])
            values[key] = tuple(v + noise(pos + j) for j, v in enumerate(values[key]))
        for key, offs, arr, obj in series:
            values[key] = tuple(obj.value(arr, k + off if k + off < last else last)
                                for off in offs)
        return values

    def _values(self, si: int, steps: list, at: tuple) -> dict[int, tuple]:
        """Segment ``si``'s affine uses at these sizes, before noise (each checked >= 0)."""
        role = self.segments[si][0]
        offsets = self._uses[si][0]
        out = {}
        for key, ctx in self.plan.contexts[role].items():
            obj = self.plan.affines[key]
            if type(obj) is Series:
                continue
            vals = []
            for off, padded in ctx:
                n = offsets.index(off)
                batch, bucket, tokens = at[n]
                size = float(bucket if padded else batch)
                v = obj.value(size, tokens)
                if not v >= 0:  # negative, or a bucket a per-bucket table lacks (NaN)
                    raise ConfigError(affine_error(self.names.get(key, "a duration"), obj,
                                                   size, tokens, v, steps[n]))
                vals.append(v)
            out[key] = tuple(vals)
        return out

    def _role_uses(self, si: int) -> tuple:
        """Segment ``si``'s step offsets, ``None`` (its values are memoized per sizes), its
        noisy durations ``(key, position of their first use at iteration s0, noise getter)``
        and its series ``(key, step offsets, array, the Series)``."""
        role, s0, _ = self.segments[si]
        offsets, noisy, series = set(), [], []
        for key, ctx in self.plan.contexts[role].items():
            obj = self.plan.affines[key]
            offsets.update(off for off, _ in ctx)
            if type(obj) is Series:
                series.append((key, [off for off, _ in ctx], getattr(self.sizes, obj.name),
                               obj))
            elif key in self.noise:
                noisy.append((key, self.offsets[key][si], self.noise[key].item))
        return sorted(offsets), None, noisy, series
