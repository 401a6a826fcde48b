"""``simwar import``: read a torch.profiler (Kineto) capture, print its stalls, fit its loop.

    simwar import TRACE [--mapping MAP.yaml] [--json]
    simwar import TRACE --mapping MAP.yaml --fit -o fitted.yaml [--dist best] [--policy P]
    simwar import TRACE --mapping MAP.yaml --check fitted.yaml [--set KEY=VALUE ...]
    simwar import TRACE --mapping MAP.yaml --fit-costs -o costs.yaml

The summary is the one ``simwar run`` prints for a simulation (same metrics
code), plus event counts and HTA's idle breakdown per stream. ``--json``
prints one object. ``--fit`` writes a complete, runnable config of the
capture's loop (:mod:`simwar.fit.from_capture`): ``simwar run fitted.yaml``
reproduces it, ``--set`` asks what-if questions of it. ``--check`` simulates a
fitted config (with ``--set`` overrides, e.g. another barrier) and prints the
capture and the simulation side by side with each figure's error, judged
against the acceptance bounds (:mod:`simwar.fit.check`); it exits 1 when a
bound is missed. ``--fit-costs`` writes only per-phase duration distributions
and host costs, for ``simwar run --costs``. Progress goes to stderr while the
file is read (on a terminal).

The module is ``capture``, not ``import``: ``import`` is a Python keyword.

Imports: ``simwar.cli.common`` and ``simwar.core.files`` at the top; the importer, the fit
modules, the config schema, the simulator, yaml and tqdm inside the functions that use
them. Never another command's module.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from simwar import __version__
from simwar.cli.common import UserError, check_outputs, num, output_path, run_label, stall_lines
from simwar.core.files import jsonable, write_bytes_atomic, write_text_atomic

HELP = "import a torch.profiler (Kineto) trace and print its stall metrics"
DESCRIPTION = ("Read a Kineto Chrome-trace capture (.json or .json.gz), build a simwar trace "
               "from it and print the same step metrics a simulation reports.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", help="Kineto trace written by export_chrome_trace (.json, .json.gz)")
    p.add_argument("--mapping", metavar="YAML",
                   help="stream names, step/run_batch annotations, phase and site regexes")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--fit", action="store_true",
                   help="fit the capture's whole loop (phases, policy, CPU work, streams, host "
                        "costs) and write a runnable config with -o")
    p.add_argument("--fit-costs", action="store_true",
                   help="fit only per-phase durations and host costs (for simwar run --costs); "
                        "write them with -o")
    p.add_argument("-o", "--output", metavar="YAML",
                   help="where --fit (or --fit-costs) writes its config")
    p.add_argument("--dist", choices=("best", "empirical", "normal", "lognormal"),
                   default="best", help="distribution --fit writes (default: best by KS)")
    p.add_argument("--policy", metavar="BARRIER",
                   help="the barrier policy for --fit when the capture cannot show it (no CUDA "
                        "sync events, or none that name their record): fine, coarse, none or "
                        "host_sync")
    p.add_argument("--check", metavar="YAML",
                   help="simulate this fitted config and compare it with the capture (exit 1 "
                        "when step time, forward gap or launch-ahead misses its bound)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="with --check: override a key of the fitted config before simulating "
                        "(a what-if: --set policy.barrier=coarse)")
    p.add_argument("--add", dest="additions", action="append", default=[], metavar="KEY=US",
                   help="with --check: add US µs to a duration of the fitted config (a number or "
                        "a distribution, shifted), e.g. --add cpu.process_result_us=1000")
    p.add_argument("--save-trace", metavar="FILE",
                   help="also save the imported simwar trace (.json or .json.gz)")
    p.add_argument("--steps-csv", metavar="FILE", help="also write the per-step table as CSV")
    p.add_argument("--kernel-wait-us", type=float, default=None, metavar="US",
                   help="HTA's consecutive-kernel delay threshold (default 30 µs, as HTA applies "
                        "its default of 30)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def command(args) -> int:
    # lazy: start-up time of the CLI (the importer loads numpy)
    from simwar.analysis.idle import HTA_KERNEL_WAIT_US
    from simwar.capture.mapping import load_mapping  # lazy: start-up time of the CLI
    from simwar.capture.reader import KinetoFormatError  # lazy: start-up time of the CLI
    from simwar.capture.stalls import import_report  # lazy: start-up time of the CLI
    from simwar.capture.to_trace import import_kineto  # lazy: start-up time of the CLI

    if args.fit and args.fit_costs:
        raise UserError("--fit and --fit-costs: choose one")
    if (args.fit or args.fit_costs) and not args.output:
        raise UserError(f"{'--fit' if args.fit else '--fit-costs'} needs -o FILE (where to "
                        f"write the fitted config)")
    if args.output and not (args.fit or args.fit_costs):
        raise UserError("-o needs --fit or --fit-costs (what to write)")
    if (args.overrides or args.additions) and not args.check:
        raise UserError(f"{'--set' if args.overrides else '--add'} applies to --check (the "
                        f"simulation of a fitted config)")
    if args.policy is not None and not args.fit:
        raise UserError("--policy applies to --fit")
    if args.policy is not None:
        # lazy: start-up time of the CLI (the fit loads numpy)
        from simwar.fit.policy import POLICIES

        if args.policy not in POLICIES:
            raise UserError(f"--policy: '{args.policy}' is not a barrier policy "
                            f"({', '.join(POLICIES)})")
    outputs = [("--save-trace", args.save_trace), ("--steps-csv", args.steps_csv),
               ("-o", args.output)]
    for option, value in outputs:  # checked before the capture is read
        if value:
            output_path(value, option)
    # with --fit, --check may name the file -o writes: it checks the config just fitted
    check_outputs([("capture", args.trace), ("mapping", args.mapping),
                   ("config", None if args.fit else args.check)], outputs)
    check_items = _check_config(args) if args.check and not args.fit else None
    mapping = load_mapping(args.mapping)
    path = Path(args.trace)
    if not path.exists():
        raise UserError(f"{path}: file not found")
    try:
        with _ReadProgress(path, disabled=args.no_progress) as progress:
            result = import_kineto(path, mapping, progress=progress)
    except KinetoFormatError as e:
        raise UserError(str(e)) from None
    steps, report = import_report(result, args.kernel_wait_us if args.kernel_wait_us is not None
                                  else HTA_KERNEL_WAIT_US)
    if args.mapping and not (args.fit or args.check):  # those make it an error (check_mapping)
        report["warnings"] += _unmatched_warnings(result, mapping, args.mapping)
    if args.save_trace:
        result.trace.save(args.save_trace)
    if args.steps_csv:
        write_bytes_atomic(args.steps_csv, steps.to_csv(index=False).encode())
    if args.fit_costs:
        report["fit"] = _write_fit(result.trace, args.output, args.dist, path.name)
    model = None
    if args.fit:
        model = _write_model(result, mapping, args, path)
        report["fit"] = {"output": args.output, "policy": model.policy.__dict__,
                         "roles": dict(model.roles), "details": model.details}
        report["warnings"] += model.warnings
    checked = None
    if args.check:
        if check_items is None:
            check_items = _check_config(args)
        checked = _check(result, mapping, args, check_items, report)
        report["check"] = checked
    for w in report["warnings"]:
        print(f"simwar: warning: {w}", file=sys.stderr)
    if args.json:
        print(json.dumps(jsonable(report), sort_keys=True))
    else:
        print(format_report(report))
        if args.fit_costs:
            print(f"  fitted              {len(report['fit'])} distributions -> {args.output}")
        if model is not None:
            print(f"  fitted              the whole loop -> {args.output}: policy "
                  f"{model.policy.barrier} ({model.policy.source}); "
                  f"{len(model.config['phases'])} phases")
        if checked is not None:
            print(checked["text"])
    if checked is not None and not checked["ok"]:
        return 1
    return 0


def _unmatched_warnings(result, mapping, name: str) -> list[str]:
    """The mapping's ``phases``, ``sites`` and ``cpu`` rules that match nothing in the capture
    (the reader already warns about ``steps`` and ``run_batch``), one warning each."""
    # lazy: start-up time of the CLI (the importer loads numpy)
    from simwar.capture.mapping import unmatched_keys

    bad = unmatched_keys(mapping, result.device_names, [a[0] for a in result.annotations])
    return [f"{name}: {text}" + ("; it is used by --fit only" if text.startswith("cpu ") else "")
            for text in bad if text.split(" ", 1)[0] in ("phases", "sites", "cpu")]


def _check_config(args):
    """The fitted config ``--check`` simulates, loaded (with ``--set``) before the capture is
    read, so that a bad file or override costs no import."""
    # lazy: start-up time of the CLI (the config schema loads pydantic)
    from simwar.config import load_config, override_list

    items = _additions(args.check, args.additions) + override_list(args.overrides)
    return load_config(args.check, items), items


def _additions(path: str, additions: list[str]) -> list:
    """``--add KEY=US`` as overrides: the fitted file's duration at KEY, shifted by US µs."""
    # lazy: start-up time of the CLI (the config schema loads pydantic)
    from simwar.config import ConfigError, Override, load_config

    if not additions:
        return []
    cfg = load_config(path).model_dump()
    out = []
    for item in additions:
        key, _, text = item.partition("=")
        key = key.strip()
        try:
            us = float(text)
        except ValueError:
            raise UserError(f"--add {item}: expected KEY=US (a number of µs)") from None
        try:
            value = _dotted(cfg, key)
        except (KeyError, IndexError, TypeError, StopIteration):
            raise UserError(f"--add {item}: {key} is not a key of {path}") from None
        try:
            shifted = _shift(value, us)
        except (TypeError, ValueError) as e:
            raise UserError(f"--add {item}: {key}: {e}") from None
        out.append(Override(key, shifted, f"--add {item}"))
    try:  # the shifted file must still be valid (a duration pushed below 0 is not)
        load_config(path, out)
    except ConfigError as e:
        raise UserError(str(e)) from None
    return out


def _dotted(cfg: dict, key: str):
    node = cfg
    parts = key.split(".")
    for part in parts:
        if isinstance(node, list):
            node = next(p for p in node if p.get("name") == part) if not part.isdigit() \
                else node[int(part)]
        else:
            node = node[part]
    return node


def _shift(value, us: float):
    """A duration plus ``us`` µs: a number, or a distribution moved as a whole."""
    if isinstance(value, bool) or value is None:
        raise TypeError("not a duration")
    if isinstance(value, (int, float)):
        return float(value) + us
    if not isinstance(value, dict) or "dist" not in value:
        raise TypeError("not a duration")
    d = {k: v for k, v in value.items() if v is not None}
    if d["dist"] in ("normal", "lognormal"):
        d["mean"] = d["mean"] + us
    elif d["dist"] == "uniform":
        d["low"], d["high"] = d["low"] + us, d["high"] + us
    else:
        d["values"] = [v + us for v in d["values"]]
    return d


def _check(result, mapping, args, loaded, report) -> dict:
    """Simulate the ``--check`` config and compare it with the capture's ``report``."""
    # lazy: start-up time of the CLI (the simulator)
    from simwar.api import simulate
    from simwar.fit.check import (  # lazy: start-up time
        accepted,
        check_rows,
        format_rows,
        relaunch,
    )
    from simwar.fit.from_capture import FitError, check_mapping  # lazy: start-up time of the CLI

    try:
        check_mapping(result, mapping, args.mapping or "mapping")
    except FitError as e:
        raise UserError(str(e)) from None
    cfg, items = loaded
    if args.fit:  # the file just written
        cfg = _check_config(args)[0]
    sim = simulate(cfg)
    label = run_label(cfg.name, items)
    summary = sim.summary
    if mapping.run_batch is None:  # the capture's launches are its first forward launches
        summary = relaunch(sim.trace, summary)
    rows = check_rows(report["metrics"], summary)
    ok = accepted(rows)
    races = {"latent": sim.summary.get("races", 0), "overlaps": sim.summary.get("overlaps", 0)}
    m = report["metrics"]
    head = (f"check: {label} (simulated {sim.summary.get('steps_measured', 0)} steps) against "
            f"{report['file']} ({m.get('steps_measured', 0)} steps measured)")
    verdict = ("  verdict             within the bounds (step time 2%, forward gap max(10 µs, "
               "10%), launch-ahead 0.05)" if ok else
               "  verdict             MISSED: " + ", ".join(
                   r.label for r in rows if r.ok is False))
    text = "\n".join([head, format_rows(rows, races), verdict])
    return {"name": label, "ok": ok, "text": text, "races": races,
            "rows": [r._asdict() for r in rows], "simulated": summary}


def _write_model(result, mapping, args, path: Path):
    """Fit the capture's whole loop (``--fit``) and write it as a config with ``-o``."""
    # lazy: start-up time of the CLI (yaml; the fit loads numpy)
    import yaml

    from simwar.fit.from_capture import FitError, fit_model  # lazy: start-up time of the CLI

    try:
        model = fit_model(result, mapping, capture=path.name, mapping_name=args.mapping or "",
                          dist=args.dist, policy=args.policy, version=__version__,
                          where=str(path))
    except FitError as e:
        raise UserError(str(e)) from None
    lines = [f"# {line}" for line in model.header]
    fits = [(k, d) for k, d in model.details.items() if "ks" in d]
    if fits:
        lines.append("# Fits compared (KS distance; a fit is rejected above the critical "
                     "value):")
        for key, d in fits:
            ks = ", ".join(f"{k} {v}" for k, v in d["ks"].items())
            lines.append(f"#   {key}: n={d['n']} mean={d['mean']} std={d['std']} KS: {ks} "
                         f"(critical {d['ks_critical']}) -> {d['chosen']}")
    text = "\n".join(lines) + "\n" + yaml.safe_dump(model.config, sort_keys=False,
                                                    default_flow_style=None, width=100)
    write_text_atomic(args.output, text)
    return model


class _ReadProgress:
    """A tqdm bar over the file's bytes, as a ``progress(done, total)`` callback."""

    def __init__(self, path: Path, disabled: bool):
        self.path = path
        self.disabled = disabled
        self.bar = None

    def __enter__(self):
        # lazy: start-up time of the CLI (tqdm)
        from tqdm import tqdm

        self.bar = tqdm(total=self.path.stat().st_size, unit="B", unit_scale=True,
                        desc=f"reading {self.path.name}", file=sys.stderr, leave=False,
                        disable=True if self.disabled else None)
        return self.update

    def update(self, done: int, total: int) -> None:
        self.bar.update(max(0, done - self.bar.n))

    def __exit__(self, *exc):
        self.bar.close()
        return False


def _write_fit(trace, output: str, dist: str, source: str) -> dict:
    """Fit per-phase durations and host costs (``--fit-costs``) and write them to ``output``."""
    # lazy: start-up time of the CLI (yaml; the fit loads numpy)
    import yaml

    from simwar.fit.durations import fit_durations  # lazy: start-up time of the CLI

    fit = fit_durations(trace, dist)
    lines = [f"# Durations fitted by `simwar import --fit-costs` from {source} "
             f"(steps after warm-up {trace.meta.get('warmup_steps', 0)}).",
             "# GPU time per phase is written as body_us (a capture does not show the "
             "load_batch/prep split).",
             "# Fits compared (KS distance; a fit is rejected above the critical value):"]
    for key, d in fit.details.items():
        if "ks" in d:
            ks = ", ".join(f"{k} {v}" for k, v in d["ks"].items())
            lines.append(f"#   {key}: n={d['n']} mean={d['mean']} std={d['std']} KS: {ks} "
                         f"(critical {d['ks_critical']}) -> {d['chosen']}")
        else:
            lines.append(f"#   {key}: n={d['n']} constant {d['mean']}")
    text = "\n".join(lines) + "\n" + yaml.safe_dump(fit.config, sort_keys=False,
                                                    default_flow_style=None, width=100)
    write_text_atomic(output, text)
    return fit.details


def format_report(r: dict) -> str:
    """What ``simwar import`` prints: event counts, the stall lines, HTA's breakdowns."""
    f = num  # never -0.0
    c = r["counts"]
    s = r["metrics"]
    lines = [f"{r['file']}: {c['kernels']} kernels, {c['memcpys']} memcpys, {c['memsets']} "
             f"memsets, {c['sync_events']} sync events, {c['host_runtime_calls']} host runtime "
             f"calls, {c['ignored_events']} ignored events",
             f"  steps               {r['steps']} in the capture; {s.get('steps_measured', 0)} "
             f"measured; forward stream '{r['forward_stream']}'"]
    if s.get("steps_measured", 0) > 0:
        lines += stall_lines(s)
    else:
        lines.append("  (no measured steps: need at least two steps with forward kernels "
                     "after warm-up)")
    t = r.get("temporal")
    if t and t["span_us"] > 0:
        lines.append(f"  device time (HTA)   span {t['span_us']:.1f} µs: idle "
                     f"{100 * t['idle_share']:.2f}%, compute {100 * t['compute_share']:.2f}%, "
                     f"non-compute {100 * t['non_compute_share']:.2f}%")
    if r["idle"]:
        lines.append("  stream idle (HTA)   µs after warm-up: busy / idle = host-wait + "
                     "kernel-wait + dependency + other")
        for lane, d in r["idle"].items():
            lines.append(f"    {lane:<17} {f(d['busy_us'])} / {f(d['idle_us'])} = "
                         f"{f(d['host_wait_us'])} + {f(d['kernel_wait_us'])} + "
                         f"{f(d['dependency_us'])} + {f(d['other_us'])}")
    return "\n".join(lines)
