"""``simwar explain``: why each forward waited, as the critical path of every step in causes.

    simwar explain CONFIG|TRACE [--steps A:B] [--mapping MAP.yaml] [--json] [--timeline PNG]

Walks each step's critical path (:mod:`simwar.analysis.critical_path`) and prints the
mean forward gap and step time with their causes. Its input is a config (simulated), a
saved simwar trace (``.json``/``.json.gz`` with ``"format": "simwar.trace"``) or a
torch.profiler (Kineto) capture, told apart by content (:func:`load_source`).
``--timeline`` draws :func:`simwar.plots.chain_figure`. The work is done by those
modules; this one parses arguments and prints.

Imports: ``simwar.cli.common`` and ``simwar.core.files`` at the top; the analysis, the
simulator, the importer and matplotlib inside the functions that use them. Never another
command's module.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import textwrap
from pathlib import Path

from simwar.cli.common import UserError, clip_text
from simwar.core.files import jsonable

HELP = "why each forward waited: the critical path of every step, in causes"
DESCRIPTION = ("Walk back from each forward's first kernel along the constraints that bound "
               "it (stream order, host launches, record->wait, host syncs) and print the mean "
               "forward gap and step time with their causes in µs.")


def add_arguments(p: argparse.ArgumentParser) -> None:
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


def command(args) -> int:
    # lazy: start-up time of the CLI (the analysis loads numpy)
    from simwar.analysis.critical_path import NoForward, critical_path, sentence
    from simwar.api import explain  # lazy: start-up time of the CLI (the simulator)
    from simwar.config import Config  # lazy: start-up time of the CLI (pydantic)

    source, what = load_source(args.source, args.mapping, args.overrides)
    steps = _parse_steps(args.steps) if args.steps else None
    try:
        if isinstance(source, Config):  # simulated once, streamed: any length fits
            cp = explain(source, steps)
        else:
            cp = critical_path(source, steps)
    except NoForward as e:
        raise UserError(f"{args.source}: {e}") from None
    except ValueError as e:
        raise UserError(f"--steps {args.steps}: {e}") from None
    if args.timeline:
        out = _image_path(args.timeline)
        # lazy: start-up time of the CLI (matplotlib)
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        from simwar.plots.chain import chain_figure  # lazy: start-up time of the CLI

        fig = chain_figure(cp, cp.steps[0])
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
    parts = text.split(":")
    try:
        a, b = (int(p) for p in parts)
    except ValueError:
        raise UserError(f"--steps: expected A:B (two step numbers), got '{text}'") from None
    if a > b:
        raise UserError(f"--steps {text}: A must be <= B")
    return a, b


def _image_path(path: str) -> Path:
    # lazy: start-up time of the CLI (matplotlib)
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    out = Path(path)
    if not out.parent.exists():
        raise UserError(f"--timeline: directory {out.parent} does not exist")
    kinds = FigureCanvasAgg.get_supported_filetypes()
    if out.suffix.lstrip(".").lower() not in kinds:
        raise UserError(f"--timeline: {out.name}: expected an image file name ending in "
                        f"{', '.join('.' + k for k in sorted(kinds))}")
    return out


def load_source(path: str, mapping: str | None = None, overrides=()):
    """(source, what): a config's Config (simulated by the caller), or the Trace of a saved
    simwar trace or of a Kineto capture.

    Told apart by content: a simwar trace's JSON starts with ``"format": "simwar.trace"``;
    other JSON is read as a Kineto capture; anything else as a YAML config.
    """
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
        # lazy: start-up time of the CLI (the config schema loads pydantic)
        from simwar.config import load_config, parse_override

        cfg = load_config(str(p), dict(parse_override(o) for o in overrides))
        return cfg, f"config {p} (simulated, {cfg.steps} steps)"
    if kind == "trace":
        # lazy: start-up time of the CLI (numpy)
        from simwar.core.trace import Trace

        try:
            return Trace.load(p), f"simwar trace {p}"
        except (ValueError, KeyError, OSError) as e:
            raise UserError(f"{p}: {e}") from None
    # lazy: start-up time of the CLI (the importer loads numpy)
    from simwar.capture.mapping import load_mapping
    from simwar.capture.reader import KinetoFormatError  # lazy: start-up time of the CLI
    from simwar.capture.to_trace import import_kineto  # lazy: start-up time of the CLI

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
    """What ``simwar explain`` prints: the means, the sentence and the two cause tables."""
    # lazy: start-up time of the CLI (the analysis loads numpy)
    from simwar.analysis.critical_path import sentence

    a, b = cp.steps
    lines = [_header(cp.trace, what),
             f"  steps               {a}..{b} ({cp.n_steps} explained, means per step)",
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
            lines.append(f"    {clip_text(r['cause'], width):<{width}} {r['us']:>8.1f} "
                         f"{100 * r['share']:>6.1f}%  {r['kind']:<14} {after}".rstrip())
        if len(rows) > top:
            rest = sum(r["us"] for r in rows[top:])
            lines.append(f"    ... {len(rows) - top} more causes, {rest:.1f} µs")
    return "\n".join(lines)
