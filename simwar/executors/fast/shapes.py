"""A run whose scheduler picks each step's shape from its queue (``scheduling.rule: sglang``),
step by step: the contexts of shapes it meets, each planned and compiled once, and the
realized steps as the run's plan.

- :class:`ShapeRun`: one run's realizing walk: :meth:`~ShapeRun.pick` fixes step k's sizes
  and shape at the host clock (``model.schedule``) and gives the context the step runs in;
  :meth:`~ShapeRun.take` its parameters at step k (recorded for the plan); :meth:`~ShapeRun.plan`
  the realized steps as blocks of one kind (:func:`~simwar.executors.fast.plan.plan_segments`).
  The fast executor's :func:`~simwar.executors.fast.realize_shapes` runs one on floats; the
  lockstep executor (:mod:`simwar.executors.lockstep.shapes`) runs many side by side, each
  shape's block over the runs that picked it.
- ``_Context``: one context (a step's shape and the few before it, what its bindings
  depend on): its Shape, its constants, its compiled blocks (scalar, and array for lockstep)
  and the row function that reads its drawn parameters at a step.

Contexts of one structure share one Shape object, and contexts of one structure and the same
constants one *kind* (the tuple of constants itself): a decode step after a prefill step and
one after a decode step are, most often, one kind, so the realized plan is a block per run of
one shape, not per context (the race plan and the summary walk the blocks).

Imports: the builder (its symbolic iterations and stream sampler), the plan and codegen.
"""

from __future__ import annotations

from simwar.builder.draws import Sum, Use
from simwar.builder.loop import LoopBuilder, StreamSampler, shape_template
from simwar.executors.fast.codegen import compile_block
from simwar.executors.fast.plan import Plan, plan_segments, shape_segment

#: the forward stream of the builder's programs (what the compiled blocks sum windows of)
FORWARD = "forward"


class ShapeRun:
    """One shape-picking run, realized a step at a time (see the module docstring).

    ``cfg``, ``sizes`` (from :func:`~simwar.builder.sizes.draw_sizes`, filled as the run
    goes) and ``model`` (the workload model that fixes them:
    :class:`~simwar.builder.sizes.ArrivalProcess`); ``interned``: where contexts of one
    structure find their Shape object, shared by runs that run side by side (lockstep)."""

    def __init__(self, cfg, sizes, model, interned: dict | None = None):
        self.cfg = cfg
        self.sizes = sizes
        self.model = model
        self.phases = cfg.phase_table()
        self.sampler = StreamSampler(cfg, sizes, self.phases)
        self.steps = cfg.steps
        #: bindings reach back to the results being processed, and one more
        self.depth = cfg.policy.launch_ahead + 1
        self.contexts: dict[tuple, _Context] = {}
        self.interned: dict = {} if interned is None else interned
        self.shapes: list = []
        self.fixed: list = []
        self.rows: list = []
        self.offsets: set = set()
        self.recent: tuple = ()  # the shapes of the last depth + 1 steps

    def pick(self, k: int, t: float) -> _Context:
        """Fix step k's sizes and shape at host time ``t`` (iteration k's step marker; the
        drain, ``k == steps``: the run's end) and give the context it runs in."""
        depth = self.depth
        if k < self.steps:
            self.model.schedule(k, t)
            self.recent = (*self.recent[-depth:], self.sizes.shape.item(k))
            key = (k if k < depth else depth, self.recent)
        else:  # the drain: every step's size is fixed
            self.model.finish_run()
            key = (None, self.recent[-depth:])
        ctx = self.contexts.get(key)
        if ctx is None:
            ctx = self.contexts[key] = _Context(self.cfg, self.phases, self.sizes,
                                                self.sampler, key, depth)
            interned = self.interned
            # contexts of one structure share its Shape object (compared by identity first)
            ctx.shape = interned.setdefault(ctx.shape, ctx.shape)
            # and contexts of one structure and the same constants one kind: their steps
            # are one block (a decode step after a prefill step and after a decode step)
            # (the interned constants are these, bit for bit: ctx.consts stands as it is)
            ctx.fixed = interned.setdefault((ctx.shape, _exact(ctx.fixed)), ctx.fixed)
            # the block it runs: its structure and which parameters are drawn (a number,
            # the same for every run sharing ``interned``)
            ctx.block = interned.setdefault(("block", ctx.shape, ctx.slots), len(interned))
            self.offsets |= ctx.offsets
        return ctx

    def take(self, k: int, ctx: _Context) -> list:
        """Step k's drawn parameters in ``ctx`` (read once: the streams move past them),
        recorded as the plan's."""
        params = ctx.row(k)
        self.shapes.append(ctx.shape)
        self.fixed.append(ctx.fixed)
        self.rows.append(params)
        return params

    def plan(self) -> Plan:
        """The realized steps as the run's plan (once every step is taken)."""
        meta = LoopBuilder(self.cfg, None, self.sizes).meta()
        return plan_segments(self.shapes, self.fixed, self.rows, meta, self.offsets)


def _exact(values: tuple) -> tuple:
    """Numbers as compared exactly: equal only when of one type and, for floats, one bit
    pattern (``-0.0`` and ``0.0`` add differently; NaN equals itself)."""
    return tuple((type(x), x.hex() if type(x) is float else x) for x in values)


class _Context:
    """One context of a shape-picking run: its shape, constants, compiled block and
    parameter row function (``array_fn``: the block in the array target, compiled when the
    lockstep executor first asks)."""

    def __init__(self, cfg, phases, sizes, sampler, key, depth: int):
        drain = key[0] is None
        skeleton, drawer, uses, ctxs = shape_template(cfg, phases, sizes, list(key[1]), drain)
        self.shape, params, self.offsets = shape_segment(skeleton)
        if any(h.kind in ("wait_event", "sync") and h.bind is not None and h.bind.back > depth
               for h in self.shape.host):  # a binding further back than the state keeps
            raise RuntimeError(f"a wait binds further back than {depth} segments")
        # a parameter the template gives as a number is the same at every step of this
        # context: a constant of its block; the drawn ones (draws, step-dependent durations,
        # host costs adding them) are read per step
        self.fixed = tuple(None if isinstance(x, (Use, Sum)) else x for x in params)
        self.consts = tuple(x for x in self.fixed if x is not None)
        self.slots = tuple(x is None for x in self.fixed)
        self.depth = depth
        self.fn = compile_block(self.shape, self.slots, FORWARD, False, (), depth)
        self._array_fn = None
        self.block = None  # the block it runs, a number (ShapeRun.pick sets it)
        self.sampler = sampler
        dists = drawer.dists
        self.keys = [key for key in dists if uses.get(key)]  # the distributions it draws
        self.uses = [uses[key] for key in self.keys]
        self.dists = [dists[key] for key in self.keys]
        slot = {key: i for i, key in enumerate(self.keys)}
        names: dict[str, object] = {"V": sampler.value}
        for i, d in enumerate(self.dists):
            names[f"D{i}"] = sampler.draws(d, 0)

        def expr(x) -> str:
            if isinstance(x, Use):
                if x.key in slot:
                    i = slot[x.key]
                    return f"D{i}[P[{i}] + {x.index}]"
                obj = drawer.affines[x.key]
                off, padded = ctxs[x.key][x.index]
                name = f"A{len(names)}"
                names[name] = obj
                out = f"V({name}, k + {off}, {padded})"
                m = drawer.noise_use.get((x.key, x.index))
                if m is not None:
                    i = slot[id(obj.noise)]
                    out = f"({out} + D{i}[P[{i}] + {m}])"
                return out
            if isinstance(x, Sum):  # a host call's cost: added as the builder adds it
                return f"({expr(x.a)} + {expr(x.b)})"
            name = f"K{len(names)}"
            names[name] = x
            return name

        drawn = [x for x in params if isinstance(x, (Use, Sum))]
        code = "def row(k, P):\n    return [" + "".join(f"{expr(x)}, " for x in drawn) + "]\n"
        exec(compile(code, "<simwar.executors.fast.shapes row>", "exec"), names)
        self._row = names["row"]

    def row(self, k: int) -> list:
        """The drawn parameters of step k, in slot order (the distributions' positions
        advanced past them)."""
        s = self.sampler
        pos = s.pos
        P = [pos.get(key, 0) for key in self.keys]
        for d, p, n in zip(self.dists, P, self.uses):
            s.draws(d, p + n)
        out = self._row(k, P)
        for key, p, n in zip(self.keys, P, self.uses):
            pos[key] = p + n
        return out

    @property
    def array_fn(self):
        """The block in the array target over runs picked out of a group's
        (:mod:`simwar.executors.fast.codegen`: its ``picked`` form)."""
        if self._array_fn is None:
            self._array_fn = compile_block(self.shape, self.slots, FORWARD, False, (),
                                           self.depth, target="picked")
        return self._array_fn
