"""``simwar explain`` and ``simwar advise``: why each bubble happened, and what to change.

    simwar explain CONFIG|TRACE [--steps A:B] [--mapping MAP.yaml] [--json] [--timeline PNG]
    simwar advise CONFIG [--objective step_us_mean|tokens_per_s|p99] [--json] [-o FILE]

``explain`` walks each step's critical path (:mod:`simwar.analysis.critical_path`)
and prints the mean forward gap and step time with their causes. Its input is
a config (simulated), a saved simwar trace (``.json``/``.json.gz`` with
``"format": "simwar.trace"``) or a torch.profiler (Kineto) capture, told apart
by content. ``advise`` searches the barrier-policy space of a config
(:mod:`simwar.study.advise`) and prints a ranked table and the best policy as
``--set`` items and a config diff. The work is done by those modules; this one
parses arguments and prints.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser(
        "explain", help="why each forward waited: the critical path of every step, in causes",
        description="Walk back from each forward's first kernel along the constraints that "
                    "bound it (stream order, host launches, record->wait, host syncs) and "
                    "print the mean forward gap and step time with their causes in µs.")
    p.add_argument("source", metavar="CONFIG|TRACE",
                   help="a YAML config (simulated), a saved simwar trace (.json, .json.gz) or "
                        "a Kineto capture (with --mapping)")
    p.add_argument("--steps", metavar="A:B",
                   help="steps to explain, inclusive (default: every measured step)")
    p.add_argument("--mapping", metavar="YAML", help="a Kineto capture's mapping (simwar import)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted key of the config (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--top", type=int, default=8, metavar="N",
                   help="causes listed per table (default 8)")
    p.add_argument("--timeline", metavar="OUT.png",
                   help="draw the chain of the first step asked over the timeline")
    p.set_defaults(func=cmd_explain)

    p = sub.add_parser(
        "advise", help="search the barrier-policy space for the fastest race-free policy",
        description="Simulate every barrier policy, read-done publish point, barrier placement, "
                    "plan-stream and CPU seq_lens choice for this config's workload, check each "
                    "for latent races, and print them ranked with the best as a config diff.")
    p.add_argument("config", metavar="CONFIG", help="YAML config")
    p.add_argument("--objective", default="step_us_mean", metavar="NAME",
                   help="step_us_mean (default), tokens_per_s or p99")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted key of the config before the search (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--top", type=int, default=10, metavar="N",
                   help="race-free candidates listed (default 10; --json lists all)")
    p.add_argument("--screen-steps", type=int, default=None, metavar="N",
                   help="steps each candidate is simulated for (default 200; the best and the "
                        "input are re-run at the config's own length)")
    p.add_argument("-o", "--output", metavar="YAML",
                   help="write the input config with the best policy applied")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_advise)


# --------------------------------------------------------------------------- explain
def cmd_explain(args) -> int:
    from simwar.analysis.critical_path import NoForward, critical_path, sentence
    from simwar.cli.common import UserError, jsonable

    trace, what = load_source(args.source, args.mapping, args.overrides)
    steps = _parse_steps(args.steps) if args.steps else None
    try:
        cp = critical_path(trace, steps)
    except NoForward as e:
        raise UserError(f"{args.source}: {e}") from None
    except ValueError as e:
        raise UserError(f"--steps {args.steps}: {e}") from None
    if args.timeline:
        out = _image_path(args.timeline)
        fig = chain_figure(cp, cp.steps[0])
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
        fig.savefig(out, dpi=110)
        print(f"simwar: wrote {out}", file=sys.stderr)
    if args.json:
        d = cp.to_dict()
        d["source"] = what
        d["sentence"] = sentence(cp)
        print(json.dumps(jsonable(d), sort_keys=True))
    else:
        print(format_explain(cp, what, args.top))
    return 0


def _parse_steps(text: str) -> tuple[int, int]:
    from simwar.cli.common import UserError

    parts = text.split(":")
    try:
        a, b = (int(p) for p in parts)
    except ValueError:
        raise UserError(f"--steps: expected A:B (two step numbers), got '{text}'") from None
    if a > b:
        raise UserError(f"--steps {text}: A must be <= B")
    return a, b


def _image_path(path: str) -> Path:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from simwar.cli.common import UserError

    out = Path(path)
    if not out.parent.exists():
        raise UserError(f"--timeline: directory {out.parent} does not exist")
    kinds = FigureCanvasAgg.get_supported_filetypes()
    if out.suffix.lstrip(".").lower() not in kinds:
        raise UserError(f"--timeline: {out.name}: expected an image file name ending in "
                        f"{', '.join('.' + k for k in sorted(kinds))}")
    return out


def load_source(path: str, mapping: str | None = None, overrides=()):
    """(Trace, what) from a config (simulated), a saved simwar trace or a Kineto capture.

    Told apart by content: a simwar trace's JSON starts with ``"format": "simwar.trace"``;
    other JSON is read as a Kineto capture; anything else as a YAML config.
    """
    from simwar.cli.common import UserError

    p = Path(path)
    if not p.exists():
        raise UserError(f"{p}: file not found")
    head = "" if p.suffix in (".yaml", ".yml") else _peek(p)
    kind = ("config" if not head.lstrip().startswith(("{", "["))
            else "trace" if '"simwar.trace"' in head else "kineto")
    if overrides and kind != "config":
        raise UserError(f"--set: only for a config; {p} is a {kind} file")
    if mapping and kind != "kineto":
        raise UserError(f"--mapping: only for a Kineto capture; {p} is a {kind} file")
    if kind == "config":
        from simwar.api import simulate
        from simwar.config.schema import load_config, parse_override

        cfg = load_config(str(p), dict(parse_override(o) for o in overrides))
        return simulate(cfg).trace, f"config {p} (simulated, {cfg.steps} steps)"
    if kind == "trace":
        from simwar.core.trace import Trace

        try:
            return Trace.load(p), f"simwar trace {p}"
        except (ValueError, KeyError, OSError) as e:
            raise UserError(f"{p}: {e}") from None
    from simwar.capture.mapping import load_mapping
    from simwar.capture.reader import KinetoFormatError
    from simwar.capture.to_trace import import_kineto

    try:
        result = import_kineto(p, load_mapping(mapping))
    except KinetoFormatError as e:
        raise UserError(str(e)) from None
    return result.trace, f"Kineto capture {p}"


def _peek(path: Path, size: int = 4096) -> str:
    with open(path, "rb") as fh:
        magic = fh.read(2)
    opener = gzip.open if magic == b"\x1f\x8b" else open
    try:
        with opener(path, "rb") as fh:
            return fh.read(size).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _header(trace, what: str) -> str:
    m = trace.meta
    name = m.get("name") or Path(what.split()[-1]).name
    bits = []
    if m.get("algorithm"):
        bits.append(str(m["algorithm"]))
    if m.get("barrier"):
        applied = m.get("barrier_effective", m["barrier"])
        bits.append(f"barrier {m['barrier']}" + (f" (applied: {applied}"
                                                  + (f", {m['placement']})" if m.get("placement")
                                                     else ")")))
    return f"{name}: " + ", ".join(bits) + f"; from {what}" if bits else f"{name}: from {what}"


def format_explain(cp, what: str, top: int = 8) -> str:
    import textwrap

    from simwar.analysis.critical_path import sentence

    a, b = cp.steps
    lines = [_header(cp.trace, what),
             f"  steps               {a}..{b} ({len(cp.periods)} explained, means per step)",
             f"  step time           {cp.step_us:.1f} µs; forward gap before each forward "
             f"{cp.fwd_gap_us:.1f} µs"]
    lines += textwrap.wrap(sentence(cp), width=100, initial_indent="  in words            ",
                           subsequent_indent=" " * 22)
    tables = (("forward gap by cause", cp.gap_causes()), ("step time by cause", cp.step_causes()))
    width = min(72, max([len(title) - 2 for title, _ in tables]
                        + [len(r["cause"]) for _, rows in tables for r in rows[:top]]))
    for title, rows in tables:
        lines.append(f"  {title:<{width + 2}} {'µs':>8} {'share':>7}  {'kind':<14} after")
        if not rows:
            lines.append("    (none: no time to explain)")
        for r in rows[:top]:
            after = "" if r["after"] and r["after"] in r["cause"] else r["after"]
            lines.append(f"    {_clip(r['cause'], width):<{width}} {r['us']:>8.1f} "
                         f"{100 * r['share']:>6.1f}%  {r['kind']:<14} {after}".rstrip())
        if len(rows) > top:
            rest = sum(r["us"] for r in rows[top:])
            lines.append(f"    ... {len(rows) - top} more causes, {rest:.1f} µs")
    return "\n".join(lines)


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


# --------------------------------------------------------------------------- the figure
KIND_COLORS = {"device": "#1f77b4", "cross_stream": "#9467bd", "host": "#2ca02c",
               "host_api": "#17becf", "wake_up": "#d62728", "launch_latency": "#ff7f0e",
               "unexplained": "#7f7f7f"}


def chain_figure(cp, step: int, figsize=(13, 4.6)):
    """A timeline of steps ``step``..``step+1`` with the step chain of ``step`` drawn over it.

    Every span in the window is drawn in grey on its lane (the CPU thread on top, then
    each stream; waits and host blocks hatched); the chain's segments are drawn in colour
    by kind on the lane they belong to, joined in time order, and the gap sentence is
    written below.
    """
    import textwrap

    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    from simwar.analysis.critical_path import sentence
    from simwar.core.trace import HOST, SpanKind

    chain = next((c for c in cp.periods if c.step == step), None)
    if chain is None:
        raise ValueError(f"step {step} has no step chain in this critical path")
    trace = cp.trace
    spans = trace.spans
    x0, x1 = chain.start_us - 0.05 * chain.us, chain.end_us + 0.05 * chain.us
    inside = (spans.end_us >= x0) & (spans.start_us <= x1)
    lanes = [HOST] + [lane for lane in trace.lanes() if lane != HOST
                      and (inside & (spans.lane == trace.code(lane))).any()]
    lanes += [s.lane for s in chain.segments if s.lane not in lanes]
    y = {lane: i for i, lane in enumerate(dict.fromkeys(lanes))}
    fig = Figure(figsize=figsize, layout="constrained")
    ax = fig.add_subplot()
    ms = 1e-3
    held = (spans.kind == SpanKind.WAIT) | (spans.kind == SpanKind.BLOCKED)
    for lane, i in y.items():
        for waiting in (False, True):
            pick = inside & (spans.lane == trace.code(lane)) & (held == waiting)
            bars = [(s * ms, (e - s) * ms) for s, e in zip(spans.start_us[pick].tolist(),
                                                           spans.end_us[pick].tolist())]
            ax.broken_barh(bars, (i - 0.3, 0.6), facecolors="#f4f4f4" if waiting else "#d8d8d8",
                           edgecolors="#bbbbbb" if waiting else "white", linewidth=0.4,
                           hatch="////" if waiting else None)
    points = []
    for s in chain.segments:
        i = y[s.lane]
        ax.broken_barh([(s.start_us * ms, s.us * ms)], (i - 0.36, 0.72), facecolors="none",
                       edgecolors=KIND_COLORS.get(s.kind, "black"), linewidth=2.0)
        points += [(s.start_us * ms, i), (s.end_us * ms, i)]
    if points:
        xs, ys = zip(*points)
        ax.plot(xs, ys, color="black", linewidth=0.8, alpha=0.6)
    ax.set_xlim(x0 * ms, x1 * ms)
    ax.set_ylim(len(y) - 0.5, -0.5)
    ax.set_yticks(range(len(y)), ["CPU thread" if lane == HOST else lane for lane in y])
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", color="#eeeeee", linewidth=0.6)
    ax.set_axisbelow(True)
    used = dict.fromkeys(s.kind for s in chain.segments)
    ax.legend(handles=[Patch(facecolor="none", edgecolor=KIND_COLORS.get(k, "black"),
                             linewidth=2, label=k) for k in used],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, title="chain")
    m = trace.meta
    ax.set_title(f"{m.get('name', '')}: the chain behind step {step} ({chain.us:.0f} µs, from "
                 f"forward {step}'s start to forward {step + 1}'s)", loc="left", fontsize=10)
    fig.supxlabel("\n".join(textwrap.wrap(sentence(cp), 160)), fontsize=8, x=0.01,
                  ha="left")
    return fig


# --------------------------------------------------------------------------- advise
def cmd_advise(args) -> int:
    from simwar.cli.common import UserError, jsonable
    from simwar.config.schema import load_config, parse_override
    from simwar.study.advise import OBJECTIVES, SCREEN_STEPS, AdviseError, advise

    if args.objective not in OBJECTIVES:
        raise UserError(f"--objective {args.objective}: not known (expected one of "
                        f"{', '.join(OBJECTIVES)})")
    if args.screen_steps is not None and args.screen_steps < 2:
        raise UserError(f"--screen-steps {args.screen_steps}: expected at least 2")
    overrides = dict(parse_override(o) for o in args.overrides)
    cfg = load_config(args.config, overrides)
    if args.output and not Path(args.output).parent.exists():
        raise UserError(f"-o: directory {Path(args.output).parent} does not exist")
    bar = _Bar(disabled=args.no_progress)
    try:
        advice = advise(cfg, args.objective,
                        screen_steps=args.screen_steps or SCREEN_STEPS, progress=bar)
    except AdviseError as e:
        raise UserError(f"{args.config}: {e}") from None
    finally:
        bar.close()
    if args.output and advice.best is not None:
        import yaml

        best = load_config(args.config, {**overrides, **advice.best.overrides})
        Path(args.output).write_text(
            f"# {args.config} with the policy `simwar advise` found best\n"
            + yaml.safe_dump(best.model_dump(mode="json"), sort_keys=False))
        print(f"simwar: wrote {args.output}", file=sys.stderr)
    if args.json:
        print(json.dumps(jsonable(advice.to_dict()), sort_keys=True))
    else:
        print(format_advice(advice, args.config, args.overrides, args.top))
    return 0


class _Bar:
    """A tqdm bar over the candidates, as a ``progress(done, total)`` callback."""

    def __init__(self, disabled: bool):
        self.disabled = disabled
        self.bar = None

    def __call__(self, done: int, total: int) -> None:
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(total=total, unit="policy", desc="simulating", file=sys.stderr,
                            leave=False, disable=True if self.disabled else None)
        self.bar.update(done - self.bar.n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def format_advice(advice, config_path: str, input_sets=(), top: int = 10) -> str:
    from simwar.config.policies import publish_point
    from simwar.study.advise import OBJECTIVES

    cfg = advice.config
    pol = cfg.policy
    point = publish_point(cfg.phase_table(), pol.publish_phase, pol.external_events,
                          pol.in_replay_fallback)
    base = advice.baseline
    bf = base.figures()
    key, direction = OBJECTIVES[advice.objective]
    unit = "tokens/s" if key == "tokens_per_s" else "µs"
    lines = [
        f"{cfg.name}: {cfg.algorithm}, barrier {pol.barrier} (applied: "
        f"{bf.get('barrier_effective')}, {pol.placement}); read-done: {point.reason}",
        f"  input               {bf['step_us_mean']:.1f} µs/step (p99 {bf['step_us_p99']:.1f}), "
        f"{bf['tokens_per_s']:.0f} tokens/s, {base.races} latent races"
        + ("  <- RACY" if base.racy else "")
        + (f"  [{cfg.steps} steps]" if base.confirmed is not None else ""),
        f"  searched            {len(advice.candidates)} policies, each simulated for "
        f"{advice.screen_steps} steps (warm-up {advice.screen_warmup}, seed {cfg.seed}) and "
        f"checked for races",
        f"  objective           {advice.objective} ({'larger' if direction > 0 else 'smaller'} "
        f"is better)",
    ]
    safe = [c for c in advice.candidates if not c.racy]
    racy = [c for c in advice.candidates if c.racy]
    w = min(80, max(len(c.description) for c in safe[:top] + racy[:3]))
    lines += ["", f"  {'rank':>4}  {'policy':<{w}} {'step µs':>8} {'saving':>8} {'races':>6}"]
    base_screen = base.summary["step_us_mean"]
    for i, c in enumerate(safe[:top], 1):
        s = c.summary["step_us_mean"]
        mark = "  <- advised" if c is advice.best else ""
        mark += "  (input)" if not c.overrides else ""
        unsafe = "" if c.safe_policy else "  (unsafe policy: never advised)"
        lines.append(f"  {i:>4}  {_clip(c.description, w):<{w}} {s:>8.1f} "
                     f"{base_screen - s:>8.1f} {c.races:>6}{mark}{unsafe}")
    if len(safe) > top:
        lines.append(f"        ... {len(safe) - top} more race-free policies (--top, --json)")
    if racy:
        lines.append(f"  racy: {len(racy)} policies reported, never advised, e.g.")
        for c in racy[:3]:
            s = c.summary["step_us_mean"]
            lines.append(f"        {_clip(c.description, w):<{w}} {s:>8.1f} "
                         f"{base_screen - s:>8.1f} {c.races:>6}"
                         + ("  (input)" if not c.overrides else ""))
    lines.append("")
    best = advice.best
    if best is None:
        lines.append("  advised: nothing (no race-free policy found)")
        return "\n".join(lines)
    f = best.figures()
    if not best.overrides:
        lines.append(f"  advised: keep the input policy ({best.description}): no race-free "
                     f"policy does better on {advice.objective}")
        return "\n".join(lines)
    pct = 100 * advice.saving_us / bf["step_us_mean"] if bf["step_us_mean"] else 0.0
    value = f.get(key)
    lines += [
        f"  advised: {best.description}",
        f"    {f['step_us_mean']:.1f} µs/step at {cfg.steps} steps (input {bf['step_us_mean']:.1f})"
        f": saving {advice.saving_us:.1f} µs ({pct:.1f}%), {best.races} races; "
        f"{advice.objective} {value:.1f} {unit if key != 'step_us_p99' else 'µs'}",
        "    changes: " + "; ".join(best.changes),
    ]
    for need in best.needs:
        lines.append(f"    needs: {need}")
    sets = " ".join(f"--set {s}" for s in [*input_sets, *best.set_items()])
    lines.append(f"    run it: simwar run {config_path} {sets}")
    lines.append("    config diff:")
    lines += [f"      {line}" for line in advice.config_diff().splitlines()]
    return "\n".join(lines)
