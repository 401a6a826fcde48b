"""A shape compiled into the function that runs a block of it for many runs at once.

The one-pass executor's generated code (:mod:`simwar.executors.fast.codegen`) runs one run:
each variable (the host clock, a stream's tail, an op's start) is a float. Here the same
text is generated with each of them an array of one element per run, and each rule of
:mod:`simwar.core.rules` in its form over arrays (``begins_many``, ``released_many``,
``returns_many``): the same operations in the same order, element by element, so every
run's numbers are the one-pass executor's, bit for bit. What is structure there (the step
window being summed, which step a fact goes to) is structure here too: the same for every
run of a group, so it stays plain Python on integers.

:func:`compile_block` makes ``block(KS, K, C, S)``: ``KS`` the passes' step indices,
``K`` the block's constant parameters (a number, or an array of one per run), ``C`` its
parameter columns (one 2-d array per column, a row per pass of the chunk), ``S`` the state
(:class:`simwar.executors.lockstep.execute.State`): the clock ``t``, ``tails``, ``hist``,
the per-step rows ``fs``, ``fe``, ``launch``, ``blocked``, ``busy``, ``dep`` (2-d: a row per
step, a column per run), the window ``cw``, ``cl``, ``w``, ``dp``, ``bad``, and ``logs`` (lists the
logged op times are appended to, for the races). Every value an op gives is a new array
(a value appended to a log or kept in a tail stays what it was); only the host clock and
the window's sums, which nothing else holds, are added to in place.

Imports: simwar.core and the one-pass executor's plan types.
"""

from __future__ import annotations

from collections import OrderedDict

from simwar.core import rules
from simwar.core.trace import OpKind
from simwar.executors.fast.plan import Shape

_CODE: OrderedDict = OrderedDict()
_CODE_LIMIT = 256


def compile_block(shape: Shape, slots: tuple, fwd: str, log: tuple, depth: int):
    """The function running a block of ``shape`` for many runs (cached); the arguments are
    those of :func:`simwar.executors.fast.codegen.compile_block` (no ``collect``: a plan
    whose forward steps are issued out of order is not run in lockstep)."""
    key = (shape.host, slots, fwd, log, depth)
    fn = _CODE.get(key)
    if fn is not None:
        _CODE.move_to_end(key)
        return fn
    fn = _generate(shape, slots, fwd, log, depth)
    _CODE[key] = fn
    if len(_CODE) > _CODE_LIMIT:
        _CODE.popitem(last=False)
    return fn


def _generate(shape: Shape, slots: tuple, fwd: str, log: tuple, depth: int):
    lines: list[str] = []
    body: list[tuple[str, int]] = []
    lanes: dict[str, str] = {}
    params = [f"k{j}" if not col else f"c{j}" for j, col in enumerate(slots)]
    pi = iter(params)
    logs = {entry: f"LG{n}" for n, entry in enumerate(log)}
    nrec = len(shape.records)
    sites = sorted({h[2] for h in shape.host if h[0] == "sync"})

    def emit(line: str, indent: int = 2) -> None:
        body.append((line, indent))

    def lane(name: str) -> str:
        if name not in lanes:
            lanes[name] = f"T{len(lanes)}"
        return lanes[name]

    def step_index(off: int) -> str:
        return "ki" if off == 0 else f"(ki + {off})" if off > 0 else f"(ki - {-off})"

    def fired(bind) -> str:
        return f"r{bind[1]}" if bind[0] == 0 else f"H{bind[0]}[{bind[1]}]"

    def log_times(dev_index: int, s: str, e: str) -> None:
        if (dev_index, "s") in logs:
            emit(f"{logs[(dev_index, 's')]}({s})")
        if (dev_index, "e") in logs:
            emit(f"{logs[(dev_index, 'e')]}({e})")

    fwd_kernels = [(i, op) for i, op in enumerate(shape.ops)
                   if op.kind == OpKind.KERNEL and op.lane == fwd and op.phase]
    first_of: dict[int, int] = {}
    last_of: dict[int, int] = {}
    for i, op in fwd_kernels:
        first_of.setdefault(op.off, i)
        last_of[op.off] = i

    def kernel(dev_index: int, name: str, dur: str) -> None:
        op = shape.ops[dev_index]
        tv = lane(name)
        emit(f"s = begins({tv}, t)")
        emit(f"{tv} = e = s + {dur}")
        if name == fwd:
            ks = step_index(op.off)
            if op.phase:
                if first_of.get(op.off) == dev_index:
                    emit(f"if {ks} != cw:")
                    emit(f"if {ks} < cw: bad = True", 3)
                    emit(f"cw = {ks}; FS[cw] = s", 3)
                if last_of.get(op.off) == dev_index:
                    emit(f"FE[{ks}] = e")
            emit("W += e - s")
            if op.phase and last_of.get(op.off) == dev_index:
                # the window of step k ends with forward k: [end of k-1, end of k), as the
                # one-pass executor's; a step closed twice makes the batch run one by one
                emit(f"if {ks} <= cl: bad = True")
                emit(f"BU[{ks}] = W; DE[{ks}] = Dp; W = 0.0; Dp = 0.0; cl = {ks}")
        log_times(dev_index, "s", "e")

    dev = 0
    rec = 0
    for h in shape.host:
        kind = h[0]
        if kind == "cpu":
            emit(f"t += {next(pi)}")
        elif kind == "launch":
            emit(f"t += {next(pi)}")
            kernel(dev, h[1], next(pi))
            dev += 1
        elif kind == "graph":
            emit(f"t += {next(pi)}")
            tv = lane(h[1])
            for node in h[3]:
                if node[0] == "r":
                    emit(f"r{rec} = {tv} = begins({tv}, t)")
                    log_times(dev, f"r{rec}", f"r{rec}")
                    rec += 1
                else:
                    kernel(dev, h[1], next(pi))
                dev += 1
        elif kind == "record":
            emit(f"t += {next(pi)}")
            tv = lane(h[1])
            emit(f"r{rec} = {tv} = begins({tv}, t)")
            log_times(dev, f"r{rec}", f"r{rec}")
            rec += 1
            dev += 1
        elif kind == "wait_stream":
            stream, other = h[1], h[2]
            host, lat = next(pi), next(pi)
            emit(f"t += {host}")
            to, ts = lane(other), lane(stream)
            emit(f"x = {to} = begins({to}, t)")
            log_times(dev, "x", "x")
            emit(f"reach = begins({ts}, t)")
            emit(f"{ts} = rel = released(reach, x, {lat}, {stream == other})")
            if stream == fwd:  # adds 0.0 where the wait held nothing: the same sum
                emit("Dp += rel - reach")
            log_times(dev + 1, "reach", "rel")
            dev += 2
        elif kind == "wait_event":
            stream, bind = h[1], h[3]
            host, lat = next(pi), next(pi)
            emit(f"t += {host}")
            ts = lane(stream)
            if bind is None:
                emit(f"{ts} = reach = rel = begins({ts}, t)")
            else:
                emit(f"reach = begins({ts}, t)")
                emit(f"{ts} = rel = released(reach, {fired(bind)}, {lat}, {bind[2]})")
                if stream == fwd:
                    emit("Dp += rel - reach")
            log_times(dev, "reach", "rel")
            dev += 1
        elif kind == "sync":
            off, site, bind = h[1], h[2], h[3]
            host, wake = next(pi), next(pi)
            f = "None" if bind is None else fired(bind)
            emit("t0 = t")
            emit(f"t = returns(t0, {host}, {f}, {wake})")
            emit(f"B{sites.index(site)}[{step_index(off)}] += t - t0")
            dev += 1
        elif kind == "run_batch":
            emit(f"LA[{step_index(h[1])}] = t")
        else:  # pragma: no cover
            raise AssertionError(kind)
    if depth:
        for d in range(depth, 1, -1):
            emit(f"H{d} = H{d - 1}")
        emit("H1 = (" + "".join(f"r{i}, " for i in range(nrec)) + ")")

    cols = [p for p in params if p.startswith("c")]
    consts = [p for p in params if p.startswith("k")]

    def src(line: str, indent: int) -> None:
        lines.append("    " * indent + line)

    src("def block(KS, K, C, S):", 0)
    if consts:
        src(f"({', '.join(consts)},) = K", 1)
    src("t = S.t", 1)
    src("TL = S.tails", 1)
    for name, var in lanes.items():
        src(f"{var} = TL.get({name!r}, 0.0)", 1)
    for d in range(1, depth + 1):
        src(f"H{d} = S.hist[{d - 1}]", 1)
    src("FS = S.fs; FE = S.fe; LA = S.launch", 1)
    for n, site in enumerate(sites):
        src(f"B{n} = S.blocked[{site!r}]", 1)
    src("BU = S.busy; DE = S.dep; cw = S.cw; cl = S.cl; W = S.w; Dp = S.dp; bad = S.bad", 1)
    for n, var in enumerate(logs.values()):
        src(f"{var} = S.logs[{n}].append", 1)
    src("begins = _begins; released = _released; returns = _returns", 1)
    if cols:
        src(f"({', '.join(f'C{i}' for i in range(len(cols)))},) = C", 1)
        src("for pi, ki in enumerate(KS):", 1)
        src("".join(f"{c} = C{i}[pi]; " for i, c in enumerate(cols)), 2)
    else:
        src("for ki in KS:", 1)
    for line, indent in body:
        src(line, indent)
    if not body:
        src("pass", 2)
    src("S.t = t", 1)
    for name, var in lanes.items():
        src(f"TL[{name!r}] = {var}", 1)
    if depth:
        src("S.hist = [" + "".join(f"H{d}, " for d in range(1, depth + 1)) + "]", 1)
    src("S.cw = cw; S.cl = cl; S.w = W; S.dp = Dp; S.bad = bad", 1)
    code = "\n".join(lines) + "\n"
    namespace = {"_begins": rules.begins_many, "_released": rules.released_many,
                 "_returns": rules.returns_many}
    filename = f"<simwar.executors.lockstep block {abs(hash(shape)):x}>"
    exec(compile(code, filename, "exec"), namespace)
    fn = namespace["block"]
    fn.source = code
    return fn
