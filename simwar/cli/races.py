"""``simwar races``: the latent races of a torch.profiler capture of your own server.

    simwar races CAPTURE [--mapping MAP.yaml | --preset sglang|vllm] [--pairs] [--json]
                         [--window N] [--fail-on-race]

A trace shows what overlapped; this shows what *could*: every write to a shared buffer and
read of it (or write) by another step, on another stream, with no happens-before path
between them through stream order, the waits and host syncs bound to their records
(:mod:`simwar.capture.binding`), in-graph record nodes, blocking copies, device synchronizes
and each host thread's program order (:mod:`simwar.analysis.happens_before`, the vector
clocks of the simulator's own race detector). Which device ops read and write which buffers
the mapping says (``reads:``, ``writes:``; a preset knows SGLang's ``req_to_token`` and
vLLM's block table where their names show them: :mod:`simwar.capture.accesses`).

The races are printed by kind (the same buffer, streams, phases or kernels, and step
distance), each with the missing edge in words, the steps it happens in and in how many of
them the two accesses also overlapped in time; ``--pairs`` adds one line per access pair,
``--json`` prints one object with every pair. ``--fail-on-race`` exits 1 when there is a
latent race (for CI). The steps are every step of the capture, warm-up included; pairs at
most ``--window`` steps apart are compared (default 2, as the simulator).

The capture is opened as ``simwar import`` opens it (:func:`simwar.capture.open.open_capture`).

Imports: ``simwar.cli.common`` at the top; the importer, the race analysis and the fit's
stream roles inside :func:`command`. Never another command's module.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from simwar.cli.common import UserError, num, race_line
from simwar.core.files import jsonable

HELP = "list the latent races of a Kineto capture (write-after-read hazards on shared buffers)"
DESCRIPTION = ("Read a Kineto capture of a server, map its shared-buffer reads and writes "
               "(--mapping, --preset) and list every pair of accesses that no happens-before "
               "path orders: a race even if this run's timing avoided it.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", help="Kineto trace written by export_chrome_trace (.json, .json.gz)")
    p.add_argument("--mapping", metavar="YAML",
                   help="names, streams, and the shared buffers each kernel or range reads "
                        "and writes (reads:, writes:); replaces the preset's keys")
    p.add_argument("--preset", metavar="NAME",
                   help="a server's own names and shared buffers: sglang or vllm (default: "
                        "detected from the capture when no --mapping is given)")
    p.add_argument("--pairs", action="store_true", help="also print every access pair")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--window", type=int, default=2, metavar="N",
                   help="compare accesses at most N steps apart (default 2)")
    p.add_argument("--fail-on-race", action="store_true",
                   help="exit 1 when there is a latent race (for CI)")


def command(args) -> int:
    # lazy: start-up time of the CLI (the importer loads numpy, the fit the roles)
    from simwar.analysis.happens_before import missing_edge, race_groups
    from simwar.capture.accesses import capture_races  # lazy: start-up time of the CLI
    from simwar.capture.open import open_capture  # lazy: start-up time of the CLI
    from simwar.capture.presets import load_preset  # lazy: start-up time of the CLI
    from simwar.capture.reader import KinetoFormatError  # lazy: start-up time of the CLI
    from simwar.config import ConfigError  # lazy: start-up time of the CLI
    from simwar.fit.policy import detect_roles  # lazy: start-up time of the CLI

    if args.window < 1:
        raise UserError(f"--window: expected a positive number of steps, got {args.window}")
    path = Path(args.trace)
    try:
        if args.preset is not None:  # an unknown preset fails before anything is read
            load_preset(args.preset)
        if not path.exists():
            raise UserError(f"{path}: file not found")
        cap = open_capture(path, args.mapping, args.preset)
        result, mapping = cap.bound, cap.mapping
        races = capture_races(result, mapping, cap.label, args.window)
    except (KinetoFormatError, ConfigError) as e:
        raise UserError(str(e)) from None
    trace = result.trace
    roles, _ = detect_roles(trace, mapping)
    role_of = {lane: role for role, lane in roles.items()}

    def lane_name(lane: str) -> str:
        role = role_of.get(lane)
        return f"{lane} ({role})" if role and role != lane else lane

    report = races.report
    groups = race_groups(trace, report, lane_name, races.name_of)
    pairs = [_pair(trace, r, report.known[i], report.known_added[i], lane_name, missing_edge,
                   races.name_of) for i, r in enumerate(report.races) if r.latent]
    out = {"file": path.name, "mapping": _mapping(mapping, races), "summary": races.summary(),
           "streams": {lane: role for lane, role in role_of.items()},
           "notes": list(races.notes), "races": [_group(g, lane_name) for g in groups],
           "pairs": pairs}
    for w in result.warnings:
        print(f"simwar: warning: {w}", file=sys.stderr)
    if args.json:
        print(json.dumps(jsonable(out), sort_keys=True))
    else:
        print("\n".join(format_races(out, args.pairs, args.fail_on_race)))
    return 1 if args.fail_on_race and report.latent else 0


def _mapping(mapping, races) -> dict:
    # lazy: start-up time of the CLI (the importer loads numpy)
    from simwar.capture.presets import preset_line

    return {"preset": mapping.origin[0], "preset_line": preset_line(mapping),
            "rules": [{"rule": r.words(), "device_ops": r.hits} for r in races.accesses.rules],
            "dropped": [r.words() for r in races.accesses.dropped]}


def _side(trace, race, first: bool) -> dict:
    pre = "first_" if first else "second_"
    mode = {"WAR": ("read", "write"), "RAW": ("write", "read")}.get(race.kind,
                                                                     ("write", "write"))
    return {"step": getattr(race, pre + "step"), "kernel": getattr(race, pre + "label"),
            "stream": getattr(race, pre + "lane"), "phase": getattr(race, pre + "phase"),
            "access": mode[0 if first else 1], "op": getattr(race, pre + "op")}


def _pair(trace, race, known, added, lane_name, missing_edge, name_of) -> dict:
    return {"buffer": race.buffer, "kind": race.kind, "first": _side(trace, race, True),
            "second": _side(trace, race, False), "observed": race.observed,
            "overlap_us": race.overlap_us,
            "missing_edge": missing_edge(trace, race, known, added, lane_name,
                                         name_of=name_of)}


def _group(g: dict, lane_name) -> dict:
    return {"buffer": g["buffer"], "kind": g["kind"], "distance": g["distance"],
            "first": {"stream": g["first"]["lane"], "stream_name": lane_name(g["first"]["lane"]),
                      "name": g["first"]["name"], "kernels": g["first"]["ops"],
                      "rules": g["first"]["rules"]},
            "second": {"stream": g["second"]["lane"],
                       "stream_name": lane_name(g["second"]["lane"]),
                       "name": g["second"]["name"], "kernels": g["second"]["ops"],
                       "rules": g["second"]["rules"]},
            "pairs": len(g["races"]), "steps": g["steps"],
            "observed_steps": g["observed_steps"],
            "missing_edge": [{"words": w, "pairs": n} for w, n in g["edges"]]}


def format_races(out: dict, pairs: bool = False, fail: bool = False) -> list[str]:
    """What ``simwar races`` prints (``out``: its JSON object)."""
    # lazy: start-up time of the CLI (the analysis loads numpy)
    from simwar.analysis.happens_before import short_label

    s = out["summary"]
    lines = [f"{out['file']}: {race_line(s)}"]
    m = out["mapping"]
    if m["preset_line"]:
        lines.append(f"  mapping             {m['preset_line']}")
    for r in m["rules"]:
        lines.append(f"  accesses            {r['rule']}: {r['device_ops']} device ops")
    if m["dropped"]:
        lines.append(f"  not in the capture  {', '.join(m['dropped'])} (a preset's: dropped)")
    if out["streams"]:
        lines.append("  streams             " + ", ".join(
            f"{lane} {role}" for lane, role in out["streams"].items()))
    for note in out["notes"]:
        lines.append(f"  note                {note}")
    if s["ordered_overlaps"]:
        lines.append(f"  note                {s['ordered_overlaps']} access pairs that the "
                     f"happens-before orders overlapped in time: it assumed an edge the run "
                     f"did not have (an in-graph record node placed after reads it did not "
                     f"follow, or a binding of simwar.capture.binding), so the verdicts rest "
                     f"on that assumption")
    for n, g in enumerate(out["races"], 1):
        first, second = g["first"], g["second"]
        fm, sm = {"WAR": ("read", "write"), "RAW": ("write", "read")}.get(g["kind"],
                                                                          ("write", "write"))
        d = g["distance"]
        lines.append(f"  race {n:<15}{g['kind']} on {g['buffer']}: "
                     f"{_who(first, fm)} on {first['stream_name']}, step k -> "
                     f"{_who(second, sm)} on {second['stream_name']}, step k{d:+d}")
        for side, mode, step in ((first, fm, "k"), (second, sm, f"k{d:+d}")):
            kernels = sorted(side["kernels"].items(), key=lambda x: (-x[1], x[0]))
            shown = ", ".join(short_label(k, 60) for k, _ in kernels[:2])
            more = f", and {len(kernels) - 2} more" if len(kernels) > 2 else ""
            rules = "; ".join(side["rules"])
            lines.append(f"    {mode:<18}step {step}: {len(kernels)} device op"
                         f"{'s' if len(kernels) > 1 else ''} ({shown}{more})"
                         + (f" by {rules}" if rules else ""))
        words, n_pairs = g["missing_edge"][0]["words"], g["missing_edge"][0]["pairs"]
        share = "" if n_pairs == g["pairs"] else f" (in {n_pairs} of its {g['pairs']} pairs)"
        lines.append(f"    missing edge      {words}{share}")
        obs = g["observed_steps"]
        lines.append(f"    steps             k = {_ranges(g['steps'])}: {len(g['steps'])} "
                     f"steps, {g['pairs']} access pairs; observed overlapping in "
                     + (f"{len(obs)} ({_ranges(obs)})" if obs else "none"))
    if pairs:
        for p in out["pairs"]:
            a, b = p["first"], p["second"]
            seen = f"overlapped {num(p['overlap_us'])} µs" if p["observed"] else \
                "did not overlap"
            lines.append(f"  pair                {p['buffer']} {p['kind']}: step {a['step']} "
                         f"{a['access']} {short_label(a['kernel'], 40)} on {a['stream']} -> "
                         f"step {b['step']} {b['access']} {short_label(b['kernel'], 40)} on "
                         f"{b['stream']}: {seen}")
    if s["latent"]:
        lines.append(f"  verdict             {s['latent']} latent races"
                     + (": exit 1 (--fail-on-race)" if fail else ""))
    elif s["writes"] and s["reads"]:
        lines.append("  verdict             no latent race")
    else:
        lines.append("  verdict             nothing checked: "
                     + ("no device op writes a mapped buffer (writes: in the mapping)"
                        if not s["writes"] else "no device op reads a mapped buffer (reads: in "
                                                "the mapping)"))
    return lines


def _who(side: dict, mode: str) -> str:
    return f"{side['name']}'s {mode}"


def _ranges(steps: list[int]) -> str:
    """``1-3, 5, 7-9``."""
    out = []
    for s in steps:
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            out.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in out)
