"""``simwar explain``: why each forward waited, as the critical path of every step in causes.

    simwar explain CONFIG|TRACE [--steps A:B] [--mapping MAP.yaml] [--preset NAME] [--json]
                                [--timeline PNG] [--idle-rule simwar|hta]

Walks each step's critical path (:mod:`simwar.analysis.critical_path`) and prints the
mean forward gap and step time with their causes. Its input is a config (simulated), a
saved simwar trace (``.json``/``.json.gz`` with ``"format": "simwar.trace"``) or a
torch.profiler (Kineto) capture, told apart by content (:func:`load_source`). A capture is
read with its preset and mapping as ``simwar import`` reads it
(:func:`simwar.capture.open.open_capture`), and explained in its own
code's words: its host time by the ``record_function`` range it lies in, a blocking call by
what it waited for. A run whose batch changes every step (a config's ``workload``, a
capture's batch ranges or graphs) is explained per graph bucket as well; a run with requests,
by its decode pauses behind prefill steps and its mean TTFT in parts
(:mod:`simwar.analysis.prefill`, :func:`_prefill_facts`).
``--timeline`` draws :func:`simwar.plots.chain_figure`. ``--idle-rule`` adds each stream's
idle time split by cause as HTA splits it, by simwar's rule or HTA's own
(:func:`simwar.analysis.idle.capture_idle`). The work is done by those
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
from typing import NamedTuple

from simwar.cli.common import (
    UserError,
    check_outputs,
    clip_text,
    output_path,
    save_figure,
    work_bar,
)
from simwar.core.files import jsonable

HELP = "why each forward waited: the critical path of every step, in causes"
DESCRIPTION = ("Walk back from each forward's first kernel along the constraints that bound "
               "it (stream order, host launches, record->wait, host syncs) and print the mean "
               "forward gap and step time with their causes in µs.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="CONFIG|TRACE", nargs="+",
                   help="a YAML config (simulated), a saved simwar trace (.json, .json.gz) or "
                        "a Kineto capture (with --mapping); several Kineto captures are the "
                        "per-rank files of one tensor-parallel run")
    p.add_argument("--steps", metavar="A:B",
                   help="steps to explain, inclusive (default: every measured step)")
    p.add_argument("--mapping", metavar="YAML", help="a Kineto capture's mapping (simwar import)")
    p.add_argument("--preset", metavar="NAME",
                   help="a Kineto capture's preset: sglang or vllm (default: detected when no "
                        "--mapping is given)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted key of the config (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--top", type=int, default=8, metavar="N",
                   help="causes listed per table (default 8)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (one shows on a terminal when the walk takes long)")
    p.add_argument("--timeline", metavar="OUT.png",
                   help="draw the chain of the first step asked over the timeline")
    p.add_argument("--idle-rule", choices=("simwar", "hta"),
                   help="also print each stream's idle time by cause (HTA's breakdown, over "
                        "the whole trace whatever --steps says), by simwar's rule or HTA's "
                        "own (hta: HTA 0.5.0's numbers where it and simwar part; a capture or a "
                        "saved trace, not a config)")


def command(args) -> int:
    # lazy: start-up time of the CLI (the analysis loads numpy)
    from simwar.analysis.critical_path import NoForward, critical_path, sentence
    from simwar.api import explain  # lazy: start-up time of the CLI (the simulator)
    from simwar.config import Config, ConfigError  # lazy: start-up time of the CLI (pydantic)

    if len(args.source) == 1:
        args.source = args.source[0]
    if args.top < 0:
        raise UserError(f"--top {args.top}: expected 0 or a positive number")
    if args.timeline:  # checked before anything is simulated or read
        output_path(args.timeline, "--timeline", image=True)
        sources = args.source if isinstance(args.source, list) else [args.source]
        check_outputs([("input", s) for s in sources] + [("mapping", args.mapping)],
                      [("--timeline", args.timeline)])
    src = load_source(args.source, args.mapping, args.overrides, args.preset)
    what = src.what
    if args.idle_rule and isinstance(src.trace, Config):
        raise UserError(f"--idle-rule: the idle breakdown of a capture or a saved trace; "
                        f"{src.path} is a config (save its run's trace with Trace.save and "
                        f"explain that)")
    steps = _parse_steps(args.steps) if args.steps else None
    try:
        if isinstance(src.trace, Config):  # simulated once, streamed: any length fits
            cp = explain(src.trace, steps)
        else:
            joined = src.collectives.late_of(src.rank) if src.collectives is not None else None
            # a capture whose steps pattern matched nothing is one "step" only by default: no
            # step of the loop to explain alone
            meta = src.trace.meta
            found = meta.get("source") != "kineto" or bool(meta.get("step_names"))
            with work_bar("explaining", "step", args.no_progress) as progress:
                cp = critical_path(src.trace, steps, src.host_ranges, src.device_info, joined,
                                   one_step=found, progress=progress)
    except NoForward as e:
        if what.startswith("Kineto capture") and _simwar_export(Path(src.path)):
            raise UserError(f"{src.path}: a Chrome trace simwar exported for Perfetto "
                            f"(simwar run --trace), which keeps no steps to explain: explain "
                            f"the config itself, or a trace saved with Trace.save or simwar "
                            f"import --save-trace") from None
        raise UserError(f"{src.path}: {e}{_why_no_steps(what, args.mapping)}") from None
    except ConfigError as e:  # the config's own (a ValueError too), not --steps's: found as
        # it runs (the memory check), so named with its file as a config's every other error
        raise ConfigError(f"{src.path}: {e}" if src.path and not str(e).startswith(
            f"{src.path}:") else str(e)) from None
    except ValueError as e:
        raise UserError(f"--steps {args.steps}: {e}") from None
    if args.timeline:
        out = Path(args.timeline)
        # lazy: start-up time of the CLI (matplotlib)
        from simwar.plots.chain import chain_figure

        save_figure(chain_figure(cp, cp.steps[0]), out)
        print(f"simwar: wrote {out}", file=sys.stderr)
    waited = _rank_waits(src, cp)
    prefill = _prefill_facts(src, cp.steps, per_step=args.steps is not None)
    idle = None
    if args.idle_rule:
        from simwar.analysis.idle import capture_idle  # lazy: start-up time (numpy)

        idle = capture_idle(src.trace, args.idle_rule)
    if args.json:
        d = cp.to_dict()
        d.update(prefill)
        if idle is not None:
            d["idle"] = {"rule": args.idle_rule, "streams": idle}
        d["source"] = what
        d["sentence"] = sentence(cp)
        if src.notes:
            d["read_with"] = src.notes
        if waited is not None:
            d["ranks"] = waited
        print(json.dumps(jsonable(d), sort_keys=True))
    else:
        text = format_explain(cp, what, args.top, src.notes)
        print("\n".join([text, *_prefill_lines(prefill)]) if waited is None else
              "\n".join([text, *_rank_lines(waited, args.top, src.rank)]))
        if idle is not None:
            print("\n".join(idle_lines(idle, args.idle_rule)))
    return 0


def idle_lines(idle: dict, rule: str) -> list[str]:
    """The ``--idle-rule`` section: each stream's busy and idle µs, idle by cause."""
    by = "HTA's own rule" if rule == "hta" else "simwar's rule"
    lines = [f"stream idle (HTA's breakdown, {by}), µs over the trace: busy / idle = "
             f"host-wait + kernel-wait + dependency + other"]
    for lane, d in idle.items():
        lines.append(f"  {lane:<17} {d['busy_us']:.1f} / {d['idle_us']:.1f} = "
                     f"{d['host_wait_us']:.1f} + {d['kernel_wait_us']:.1f} + "
                     f"{d['dependency_us']:.1f} + {d['other_us']:.1f}")
    return lines


def _prefill_facts(src, steps: tuple[int, int], per_step: bool) -> dict:
    """A run with requests: its decode pauses behind prefill steps over ``steps``
    (``prefill_pauses``, per step only with ``--steps``) and the mean TTFT in parts of the
    requests whose first token came in ``steps`` among those finished in the measured steps
    (``Result.requests``' rows: ``ttft``); empty otherwise. A config is
    run once more for its per-step table (the fast executor: the walk's trace is streamed)."""
    # lazy: start-up time of the CLI (the analysis loads numpy)
    from simwar.analysis.metrics import request_table, step_columns
    from simwar.analysis.prefill import prefill_pauses  # lazy: as above
    from simwar.config import Config  # lazy: start-up time of the CLI (pydantic)
    from simwar.config.schema import REQUEST_SOURCES  # lazy: as above

    if isinstance(src.trace, Config):
        if getattr(src.trace.workload, "source", None) not in REQUEST_SOURCES:
            return {}
        from simwar.api import simulate  # lazy: start-up time of the CLI (the simulator)

        run = simulate(src.trace)
        columns, meta = run.columns, run.meta
    else:
        if not (src.trace.meta.get("workload") or {}).get("requests"):
            return {}
        columns, meta = step_columns(src.trace), src.trace.meta
    out: dict = {}
    pauses = prefill_pauses(columns, meta, steps)
    if pauses is not None:
        if not per_step:
            del pauses["per_step"]
        out["prefill_pauses"] = pauses
    rows = request_table(columns, meta)
    if rows:
        pick = (rows["first_step"] >= steps[0]) & (rows["first_step"] <= steps[1])
        parts = [c for c in ("request_ttft_us", "ttft_queue_us", "ttft_prefill_us",
                             "ttft_chunks", "ttft_chunk_fwd_us", "ttft_other_us",
                             "ttft_result_wait_us") if c in rows]
        out["ttft"] = {"requests": int(pick.sum()),
                       **{c: float(rows[c][pick].mean()) if pick.any() else float("nan")
                          for c in parts}}
    return out


def _prefill_lines(facts: dict) -> list[str]:
    """The text of :func:`_prefill_facts`."""
    # lazy: start-up time of the CLI (the analysis loads numpy)
    from simwar.analysis.prefill import pause_words

    lines = []
    p = facts.get("prefill_pauses")
    if p is not None:
        lines.append(f"  decode paused       after a run of prefill steps in {p['count']} of "
                     f"{p['decode_steps']} decode steps"
                     + (f" ({p['total_us'] / 1e3:.1f} ms in all)" if p["count"] else ""))
        if p["count"]:
            lines.append(f"                      {p['mean_pause_us'] / 1e3:.1f} ms on average, "
                         f"for a prefill of {p['mean_prefill_tokens']:.0f} tokens, "
                         f"{p['mean_requests']:.1f} requests, {p['mean_prefill_steps']:.1f} "
                         f"prefill steps;")
            lines.append(f"                      {p['mean_paused']:.1f} requests paused")
        for row in p.get("per_step", []):
            lines.append(f"    step {row['step']:<14} {pause_words(row)}")
    t = facts.get("ttft")
    if t is not None and t["requests"]:
        lines.append(f"  TTFT                {t['request_ttft_us'] / 1e3:.2f} ms mean over "
                     f"{t['requests']} requests: queueing {t['ttft_queue_us'] / 1e3:.2f}, "
                     f"prefill {t['ttft_prefill_us'] / 1e3:.2f}, result wait "
                     f"{t['ttft_result_wait_us'] / 1e3:.2f}")
        if "ttft_chunks" in t:
            lines.append(f"                      prefill: {t['ttft_chunks']:.2f} chunks, their "
                         f"forwards {t['ttft_chunk_fwd_us'] / 1e3:.2f} ms, other steps and gaps "
                         f"between {t['ttft_other_us'] / 1e3:.2f} ms")
    return lines


def _rank_waits(src, cp) -> list[dict] | None:
    """Of a tensor-parallel source: what rank 0 waited for at the collectives, by late rank."""
    if src.collectives is None:
        return None
    # lazy: start-up time of the CLI (the analysis loads numpy)
    from simwar.analysis.ranks import late_arrivals

    return late_arrivals(src.collectives, src.rank, cp.steps,
                         [cp.trace.run.forward_stream])


def _rank_lines(waited: list[dict], top: int, rank: int) -> list[str]:
    lines = [f"  rank {rank} waited at the collectives (mean per step it waited; share of "
             f"steps)"]
    if not waited:
        lines.append(f"    (none: rank {rank} never waited for another rank)")
    for w in waited[:top]:
        lines.append(f"    {w['words']}: in {100 * w['share']:.0f}% of the steps "
                     f"({w['us_per_step']:.1f} µs per step explained)")
    return lines


def _parse_steps(text: str) -> tuple[int, int]:
    parts = text.split(":")
    try:
        a, b = (int(p) for p in parts)
    except ValueError:
        raise UserError(f"--steps: expected A:B (two step numbers), got '{text}'") from None
    if a > b:
        raise UserError(f"--steps {text}: A must be <= B")
    return a, b


class Source(NamedTuple):
    """What ``explain`` reads: the trace (a config's Config, simulated by the caller), its
    description, and for a capture its host ranges, device facts and what it was read with."""

    trace: object
    what: str
    host_ranges: list | None = None
    device_info: dict | None = None
    notes: list = []
    #: tensor-parallel ranks: their collectives (:class:`simwar.analysis.ranks.Collectives`)
    #: and which rank ``trace`` is
    collectives: object = None
    rank: int = 0
    path: str = ""


def load_source(path: str | list, mapping: str | None = None, overrides=(),
                preset: str | None = None) -> Source:
    """A :class:`Source` from a config (its Config, in ``trace``: simulated by the caller,
    :func:`simwar.api.explain`; a tensor-parallel config's rank 0, simulated here), a saved
    simwar trace or a Kineto capture (a list: per-rank captures).

    Told apart by content: a simwar trace's JSON starts with ``"format": "simwar.trace"``;
    other JSON is read as a Kineto capture; anything else as a YAML config.
    """
    if isinstance(path, list):
        for q in path:
            if not Path(q).exists():
                raise UserError(f"{q}: file not found")
            head = _peek(Path(q))
            if not head.lstrip().startswith(("{", "[")) or '"simwar.trace"' in head:
                raise UserError(f"{q}: several sources are the per-rank Kineto captures of "
                                f"one run; this is not a Kineto capture")
        if overrides:
            raise UserError("--set: only for a config; the sources are Kineto captures")
        return _load_capture([Path(q) for q in path], mapping, preset)._replace(
            path=str(path[0]))
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
    if preset and kind != "kineto":
        raise UserError(f"--preset: only for a Kineto capture; {p} is a {kind} file")
    if kind == "config":
        # lazy: start-up time of the CLI (the config schema loads pydantic)
        from simwar.config import load_config, parse_override

        cfg = load_config(str(p), dict(parse_override(o) for o in overrides))
        what = f"config {p} (simulated, {cfg.steps} steps)"
        if cfg.tp > 1:  # every rank simulated at once: rank 0's trace, the ranks' collectives
            # lazy: start-up time of the CLI (the analysis loads numpy)
            from simwar.analysis.ranks import Collectives
            from simwar.api import simulate  # lazy: start-up time of the CLI (the simulator)

            result = simulate(cfg)
            return Source(result.ranks[0].trace, f"{what}, rank 0 of {cfg.tp}",
                          collectives=Collectives.of_traces([r.trace for r in result.ranks]),
                          path=str(p))
        return Source(cfg, what, path=str(p))
    if kind == "trace":
        # lazy: start-up time of the CLI (numpy)
        from simwar.core.trace import Trace

        try:
            return Source(Trace.load(p), f"simwar trace {p}", path=str(p))
        except (ValueError, KeyError, OSError) as e:
            raise UserError(f"{p}: {e}") from None
    return _load_capture(p, mapping, preset)


def _load_capture(p: Path | list, mapping: str | None, preset: str | None) -> Source:
    """A Kineto capture as ``simwar import`` reads it (preset, mapping, sizes), with its
    host ranges named as the code named them (a mapped CPU range also by its config item)."""
    import re  # lazy: start-up time of the CLI

    # lazy: start-up time of the CLI (the importer loads numpy)
    from simwar.capture.frames import short_name
    from simwar.capture.open import open_capture  # lazy: start-up time of the CLI (numpy)
    from simwar.capture.presets import preset_line  # lazy: start-up time of the CLI
    from simwar.capture.reader import KinetoFormatError  # lazy: start-up time of the CLI
    from simwar.capture.sizes import SizesError  # lazy: start-up time of the CLI
    from simwar.config import ConfigError  # lazy: start-up time of the CLI

    try:
        cap = open_capture(p, mapping, preset)
        sizes = cap.sized()
    except (KinetoFormatError, SizesError, ConfigError) as e:
        raise UserError(str(e)) from None
    result, m = cap.bound, cap.mapping
    skip = [re.compile(x) for x in (m.steps, m.batch) if x]
    item_of = m.cpu_item_of()
    ranges = []
    for name, a, b in result.annotations:
        if any(rx.search(name) for rx in skip):
            continue
        item = item_of[name]
        shown = short_name(name)
        ranges.append((f"{shown} ({item})" if item and item not in name.split(".")[-1] else shown,
                       a, b))
    notes = [n for n in (preset_line(m),) if n] + (sizes.notes if sizes.varying else [])
    run = result.trace.run
    host = run.host_thread
    who = (f" (scheduler thread {run.host_thread_name or host[1]}, tid {host[1]}: "
           f"{run.host_thread_reason})") if host and len(run.launch_threads or []) > 1 else ""
    if isinstance(p, list):
        rank = result.primary.rank
        return Source(result.trace, f"Kineto captures {', '.join(map(str, p))}, rank {rank} of "
                      f"{len(result.ranks)}{who}", ranges, result.device_info, notes,
                      result.collectives, rank)
    return Source(result.trace, f"Kineto capture {p}{who}", ranges, result.device_info, notes,
                  path=str(p))


def _why_no_steps(what: str, mapping: str | None) -> str:
    """A hint of why a capture has no measured steps: read without (or with a wrong)
    mapping."""
    if not what.startswith("Kineto capture"):
        return ""
    if mapping is None:
        return (" (read without --mapping: steps are ProfilerStep#N ranges and the forward is "
                "the busiest stream's kernels; give --mapping MAP.yaml with the capture's "
                "steps pattern and phases, see simwar import)")
    return (f" (check the steps pattern and phases of {mapping}: simwar import CAPTURE "
            f"--mapping {mapping} warns of the rules that match nothing)")


def _simwar_export(path: Path) -> bool:
    """Whether a Chrome trace JSON is simwar's own export (``otherData.generator``, written
    last: the file's tail is read)."""
    tail = b""
    try:
        with open(path, "rb") as fh:
            magic = fh.read(2)
        opener = gzip.open if magic == b"\x1f\x8b" else open
        with opener(path, "rb") as fh:
            while chunk := fh.read(1 << 20):
                tail = (tail + chunk)[-(1 << 16):]
    except OSError:
        return False
    return b'"generator":"simwar"' in tail.replace(b" ", b"")


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
    run = trace.run
    name = run.name or run.file or Path(what.split()[-1]).name
    bits = []
    if run.algorithm:
        bits.append(str(run.algorithm))
    if run.barrier:
        bits.append(f"barrier {run.barrier}" + (f" (applied: {run.applied_barrier}"
                                                 + (f", {run.placement})" if run.placement
                                                    else ")")))
    return f"{name}: " + ", ".join(bits) + f"; from {what}" if bits else f"{name}: from {what}"


def format_explain(cp, what: str, top: int = 8, notes=()) -> str:
    """What ``simwar explain`` prints: the means, the sentence and the two cause tables, and
    per graph bucket the same where the batch changes."""
    a, b = cp.steps
    lines = [_header(cp.trace, what)]
    lines += [f"  read with           {n}" for n in notes]
    if getattr(cp, "one_step", False):
        # lazy: start-up time of the CLI (the analysis loads numpy)
        from simwar.analysis.critical_path import NEEDS_STEPS

        lines.append(f"  steps               {a} (the capture's one step with forward work: its "
                     f"critical path from its start to its forward's end)")
        lines.append(f"  needs more steps    {'; '.join(NEEDS_STEPS)}")
        lines.append(f"  launches            {_launch_words(cp.launches)}")
    else:
        lines.append(f"  steps               {a}..{b} ({cp.n_steps} explained, means per step)")
    lines += _explained(cp, top)
    for bucket, sub in cp.by_bucket().items():
        lines.append(f"  bucket {bucket:<12} {sub.n_steps} steps explained")
        lines += _explained(sub, max(3, top // 2), indent="  ")
    return "\n".join(lines)


def _launch_words(f: dict) -> str:
    """A one-step trace's launches: ``1 graph launch (544 device ops; 1572.6 µs on the host),
    7 eager launch and copy calls (36.9 µs on the host), 3 copies (768 B)``."""
    parts = []
    if f.get("graph_launches"):
        n, ops = f["graph_launches"], f["graph_ops"]
        fan = (f"{ops[0]} device ops" if len(ops) == 1
               else f"{min(ops)}..{max(ops)} device ops each, {sum(ops)} in all")
        parts.append(f"{n} graph launch{'es' if n != 1 else ''} ({fan}; "
                     f"{f['graph_launch_us']:.1f} µs on the host)")
    n = f.get("launches", 0)
    parts.append(f"{n} eager launch and copy call{'s' if n != 1 else ''} "
                 f"({f.get('launch_us', 0.0):.1f} µs on the host)")
    if f.get("copies"):
        parts.append(f"{f['copies']} cop{'ies' if f['copies'] != 1 else 'y'} "
                     f"({f['copy_bytes']} B)")
    return ", ".join(parts)


def _explained(cp, top: int, indent: str = "") -> list[str]:
    """The means, the sentence and the two cause tables of one set of chains."""
    # lazy: start-up time of the CLI (the analysis loads numpy)
    from simwar.analysis.critical_path import sentence

    one = getattr(cp, "one_step", False)
    lines = [f"{indent}  step time           {cp.step_us:.1f} µs"
             + ("" if one else f"; forward gap before each forward {cp.fwd_gap_us:.1f} µs")]
    lines += textwrap.wrap(sentence(cp), width=100,
                           initial_indent=f"{indent}  in words            ",
                           subsequent_indent=" " * (22 + len(indent)))
    tables = (("forward gap by cause", cp.gap_causes()), ("step time by cause", cp.step_causes()))
    if one:  # no gap in a trace of one step: the table would only say so
        tables = tables[1:]
    width = min(72, max([len(title) - 2 for title, _ in tables]
                        + [len(r["cause"]) for _, rows in tables for r in rows[:top]]))
    for title, rows in tables:
        lines.append(f"{indent}  {title:<{width + 2}} {'µs':>8} {'share':>7}  {'kind':<14} "
                     f"after")
        if not rows:
            lines.append(f"{indent}    (none: no time to explain)")
        for r in rows[:top]:
            after = "" if r["after"] and r["after"] in r["cause"] else r["after"]
            lines.append(f"{indent}    {clip_text(r['cause'], width):<{width}} {r['us']:>8.1f} "
                         f"{100 * r['share']:>6.1f}%  {r['kind']:<14} {after}".rstrip())
        if len(rows) > top:
            rest = sum(r["us"] for r in rows[top:])
            lines.append(f"{indent}    ... {len(rows) - top} more causes, {rest:.1f} µs")
    return lines
