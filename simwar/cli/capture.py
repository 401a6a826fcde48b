"""``simwar import``: read a torch.profiler (Kineto) capture, print its stalls, fit its loop.

    simwar import TRACE [TRACE ...] [--preset sglang|vllm] [--mapping MAP.yaml] [--json]
                        [--strict]
    simwar import TRACE [--mapping MAP.yaml] --fit -o fitted.yaml [--dist best] [--policy P]
                        [--unprofiled-step-us US|BUCKET=US,...] [--keep-profiler-cost]
                        [--extrapolate-buckets] [--launch-shares]
    simwar import TRACE [--mapping MAP.yaml] --check fitted.yaml [--set KEY=VALUE ...]
    simwar import TRACE --mapping MAP.yaml --fit-costs -o costs.yaml

The capture is opened by :func:`simwar.capture.open.open_capture`, as ``explain`` and
``races`` open theirs. Without ``--preset`` and ``--mapping`` the preset is detected from the
capture's range names (:mod:`simwar.capture.presets`) and the import says which; a mapping
file replaces any key of the preset. A capture whose batch changes every step (the mapping's
``batch`` regex, or the graphs that ran: :mod:`simwar.capture.sizes`) is reported per graph
bucket, and ``--fit`` writes its batch sequence beside the config (``fitted.batches.csv``
for ``fitted.yaml``).

The summary is the one ``simwar run`` prints for a simulation (same metrics
code), plus event counts and HTA's idle breakdown per stream, the scheduler thread and the
threads that launched, how waits and syncs were bound, the latent races by the mapping's
``reads:`` and ``writes:`` (``simwar races`` lists them), and, given several per-rank
captures (or a file with several processes), each rank and the skew of their step
starts. ``--json`` prints one object; ``--strict`` makes any warning (a dropped or
implausible event, an unmatched mapping key, ...) an error. ``--fit`` writes a complete,
runnable config of the capture's loop (:mod:`simwar.fit.from_capture`): ``simwar run fitted.yaml``
reproduces it, ``--set`` asks what-if questions of it; its host times are net of the
profiler's own cost, counted per event (:mod:`simwar.fit.profiler_cost`; ``--keep-profiler-cost``
keeps it; ``--check`` adds it back to the config it simulates, as the profiled capture ran,
unless ``--keep-profiler-cost`` says the config holds it). ``--check`` simulates a
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
import re
import sys
from pathlib import Path

from simwar import __version__
from simwar.cli.common import (
    UserError,
    bucket_lines,
    check_outputs,
    num,
    output_path,
    race_line,
    run_label,
    stall_lines,
    work_bar,
)
from simwar.core.files import jsonable, write_bytes_atomic, write_text_atomic

HELP = "import a torch.profiler (Kineto) trace and print its stall metrics"
DESCRIPTION = ("Read a Kineto Chrome-trace capture (.json or .json.gz), build a simwar trace "
               "from it and print the same step metrics a simulation reports.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("trace", nargs="+",
                   help="Kineto trace written by export_chrome_trace (.json, .json.gz); "
                        "several per-rank captures import as ranks side by side")
    p.add_argument("--strict", action="store_true",
                   help="any warning (dropped or implausible events, ...) is an error")
    p.add_argument("--mapping", metavar="YAML",
                   help="stream names, step/run_batch/batch annotations, phase and site regexes "
                        "(replaces the preset's keys)")
    p.add_argument("--preset", metavar="NAME",
                   help="a server's own range names: sglang or vllm (default: detected from the "
                        "capture when no --mapping is given)")
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
                   default="best", help="distribution --fit writes (default: best by KS); with "
                   "--check alone: the one the checked file was fitted with")
    p.add_argument("--policy", metavar="BARRIER",
                   help="the barrier policy for --fit when the capture cannot show it (no CUDA "
                        "sync events, or none that name a record or an event): fine, coarse, "
                        "none or host_sync; with --check alone: the one the checked file was "
                        "fitted with, as --dist, --unprofiled-step-us and --extrapolate-buckets "
                        "(the profiler's cost --check adds back is measured by a fit that keeps "
                        "it, made with the same)")
    p.add_argument("--unprofiled-step-us", default=None, metavar="US|BUCKET=US,...",
                   help="with --fit: the loop's mean step time without the profiler (from the "
                        "server's own log): every device time is rescaled to meet it; or per "
                        "graph bucket (8=1682,16=1726,...): device and host time rescaled; with "
                        "--check alone: the one the checked file was fitted with")
    p.add_argument("--keep-profiler-cost", action="store_true",
                   help="with --fit: keep the profiler's own host cost in the fitted host times "
                        "(default: subtracted by the capture's event counts at the measured "
                        "µs per event, docs/profiler-cost.md); with --check: the checked config "
                        "holds it (default: added back before comparing with the capture)")
    p.add_argument("--extrapolate-buckets", action="store_true",
                   help="with --fit: a graph phase's per-bucket durations also give the graph "
                        "buckets the capture never ran, from the line over the measured "
                        "buckets (without it a run reaching one is refused); with --check alone: "
                        "the checked file was fitted with it")
    p.add_argument("--launch-shares", action="store_true",
                   help="with --fit: an eager prefill's launches each take their measured "
                        "share of its host and device time (prefill.host_shares, "
                        "device_shares; default: equal shares, calibration/README.md says "
                        "why); with --check alone: the checked file was fitted with it")
    p.add_argument("--check", metavar="YAML",
                   help="simulate this fitted config and compare it with the capture (exit 1 "
                        "when step time, forward gap or launch-ahead misses its bound)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="with --check: override a key of the fitted config before simulating "
                        "(a what-if: --set policy.barrier=coarse)")
    p.add_argument("--add", dest="additions", action="append", default=[], metavar="KEY=US",
                   help="with --check: add US µs to a duration of the fitted config (a number, "
                        "a distribution shifted, a line's base, each entry of a per-bucket "
                        "table), e.g. --add cpu.process_result_us=1000")
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
    from simwar.capture.open import open_capture  # lazy: start-up time of the CLI
    from simwar.capture.reader import KinetoFormatError  # lazy: start-up time of the CLI
    from simwar.capture.sizes import SizesError  # lazy: start-up time of the CLI
    from simwar.capture.stalls import import_report  # lazy: start-up time of the CLI
    from simwar.config import ConfigError  # lazy: start-up time of the CLI

    if args.fit and args.fit_costs:
        raise UserError("--fit and --fit-costs: choose one")
    if (args.fit or args.fit_costs) and not args.output:
        raise UserError(f"{'--fit' if args.fit else '--fit-costs'} needs -o FILE (where to "
                        f"write the fitted config)")
    if args.output and not (args.fit or args.fit_costs):
        raise UserError("-o needs --fit or --fit-costs (what to write)")
    if args.output is not None:  # a bad output path costs no import, nothing half-written
        output_path(args.output, "-o")
    if (args.overrides or args.additions) and not args.check:
        raise UserError(f"{'--set' if args.overrides else '--add'} applies to --check (the "
                        f"simulation of a fitted config)")
    # with --check alone: how the checked file was fitted (the fit that keeps the profiler's
    # cost, which --check adds back, is made with the same)
    if args.policy is not None and not (args.fit or args.check):
        raise UserError("--policy applies to --fit and --check")
    if args.unprofiled_step_us is not None and not (args.fit or args.check):
        raise UserError("--unprofiled-step-us applies to --fit and --check")
    if args.keep_profiler_cost and not (args.fit or args.check):
        raise UserError("--keep-profiler-cost applies to --fit and --check")
    if args.extrapolate_buckets and not (args.fit or args.check):
        raise UserError("--extrapolate-buckets applies to --fit and --check")
    if args.launch_shares and not (args.fit or args.check):
        raise UserError("--launch-shares applies to --fit and --check")
    unprofiled = None
    if args.unprofiled_step_us is not None:
        # lazy: start-up time of the CLI (the fit loads numpy and the simulator)
        from simwar.fit.profiler import parse_unprofiled

        try:
            unprofiled = parse_unprofiled(args.unprofiled_step_us)
        except ValueError as e:
            raise UserError(str(e)) from None
    args.unprofiled = unprofiled
    if args.policy is not None:
        # lazy: start-up time of the CLI (the fit loads numpy)
        from simwar.fit.policy import POLICIES

        if args.policy not in POLICIES:
            raise UserError(f"--policy: '{args.policy}' is not a barrier policy "
                            f"({', '.join(POLICIES)})")
    outputs = [("--save-trace", args.save_trace), ("--steps-csv", args.steps_csv),
               ("-o", args.output)]
    for option, value in outputs:  # checked before the capture is read
        if value is not None:  # given, even empty: checked
            output_path(value, option)
    # with --fit, --check may name the file -o writes: it checks the config just fitted
    check_outputs([*(("capture", t) for t in args.trace), ("mapping", args.mapping),
                   ("config", None if args.fit else args.check)], outputs)
    check_items = _check_config(args) if args.check and not args.fit else None
    paths = [Path(t) for t in args.trace]
    if len(paths) > 1 and (args.fit or args.fit_costs or args.check):
        raise UserError("--fit, --fit-costs and --check read one capture (the scheduler's "
                        "rank); give one file")
    path = paths[0]
    try:
        if args.preset is not None:  # an unknown preset fails before anything is read
            from simwar.capture.presets import load_preset  # lazy: start-up time of the CLI

            load_preset(args.preset)
        for p in paths:
            if not p.exists():
                raise UserError(f"{p}: file not found")
        with _ReadProgress(paths, disabled=args.no_progress) as progress:
            cap = open_capture(paths if len(paths) > 1 else path, args.mapping, args.preset,
                               progress=progress)
        sizes = cap.sized()
    except (KinetoFormatError, SizesError, ConfigError) as e:
        raise UserError(str(e)) from None
    result, mapping = cap.bound, cap.mapping
    if args.strict and result.warnings:
        more = f" (and {len(result.warnings) - 1} more)" if len(result.warnings) > 1 else ""
        raise UserError(f"{path}: {result.warnings[0]}{more} (--strict)")
    steps, report = import_report(result, args.kernel_wait_us if args.kernel_wait_us is not None
                                  else HTA_KERNEL_WAIT_US)
    if args.mapping and not (args.fit or args.check):  # those make it an error (check_mapping)
        report["warnings"] += _unmatched_warnings(result, mapping, args.mapping)
    report["mapping"] = _mapping_report(mapping, sizes)
    report["shapes"] = [s._asdict() for s in cap.shapes]
    report["frames"] = cap.n_frames
    if args.save_trace:
        result.trace.save(args.save_trace)
    if args.steps_csv:
        write_bytes_atomic(args.steps_csv, steps.to_csv(index=False).encode())
    if args.fit_costs:
        report["fit"] = _write_fit(result.trace, args.output, args.dist, path.name)
    model = None
    if args.fit:
        model = _write_model(cap, args, path)
        report["fit"] = {"output": args.output, "policy": model.policy.__dict__,
                         "roles": dict(model.roles), "details": model.details}
        report["warnings"] += model.warnings
    checked = None
    if args.check:
        if check_items is None:
            check_items = _check_config(args)
        checked = _check(cap, args, check_items, report, steps)
        report["check"] = checked
    report["races"] = _races(cap)
    for w in report["warnings"]:
        print(f"simwar: warning: {w}", file=sys.stderr)
    if args.json:
        print(json.dumps(jsonable(report), sort_keys=True))
    else:
        print(format_report(report))
        for line in _sizes_lines(report):
            print(line)
        c = report["counts"]
        if c["kernels"] or c["memcpys"] or c["memsets"]:
            print(f"  races               {race_line(report['races'])}"
                  + ("; simwar races lists them" if report["races"]["latent"] else ""))
        if args.fit_costs:
            print(f"  fitted              {len(report['fit'])} distributions -> {args.output}")
        if model is not None:
            wl = model.config.get("workload")
            print(f"  fitted              the whole loop -> {args.output}: policy "
                  f"{model.policy.barrier} ({model.policy.source}); "
                  f"{len(model.config['phases'])} phases"
                  + (f"; the capture's {len(wl['batch_sizes'])} batches -> "
                     f"{Path(args.output).name.rsplit('.', 1)[0]}.batches.csv"
                     if wl and "batch_sizes" in wl else "")
                  + (f"; a prefill, scheduling.rule {model.config['scheduling']['rule']}"
                     if "scheduling" in model.config else ""))
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


def _races(cap) -> dict:
    """The capture's latent races by the mapping's reads and writes (``simwar races`` lists
    them): :meth:`simwar.capture.accesses.CaptureRaces.summary`."""
    from simwar.capture.accesses import capture_races  # lazy: start-up time of the CLI
    from simwar.config import ConfigError  # lazy: start-up time of the CLI

    try:
        return capture_races(cap.bound, cap.mapping, cap.label).summary()
    except ConfigError as e:
        raise UserError(str(e)) from None


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
    from simwar.config.load import get_dotted  # lazy: start-up time of the CLI
    from simwar.fit.durations import shift  # lazy: start-up time of the CLI (numpy)

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
            value = get_dotted(cfg, key)
        except KeyError:
            raise UserError(f"--add {item}: {key} is not a key of {path}") from None
        try:
            shifted = shift(value, us)
        except (TypeError, ValueError) as e:
            raise UserError(f"--add {item}: {key}: {e}") from None
        out.append(Override(key, shifted, f"--add {item}"))
    try:  # the shifted file must still be valid (a duration pushed below 0 is not)
        load_config(path, out)
    except ConfigError as e:
        raise UserError(str(e)) from None
    return out


def _check(cap, args, loaded, report, steps) -> dict:
    """Simulate the ``--check`` config and compare it with the capture's ``report`` (``steps``:
    its per-step table): :func:`simwar.fit.check.check_fit`."""
    from simwar.config import load_config  # lazy: start-up time of the CLI (pydantic)

    # lazy: start-up time of the CLI (the check runs the simulator)
    from simwar.fit.check import check_fit
    from simwar.fit.from_capture import FitError  # lazy: start-up time of the CLI

    cfg, items = loaded
    if args.fit:  # the file just written
        cfg = _check_config(args)[0]
    # the profiler's cost is added back as the file was fitted: the file without --set and
    # --add, and the fit's own arguments (a fit that kept the cost, made with the same)
    fitted = load_config(args.check) if items else cfg
    fit_args = {"dist": args.dist, "policy": args.policy,
                "unprofiled_step_us": args.unprofiled,
                "extrapolate_buckets": args.extrapolate_buckets,
                "launch_shares": args.launch_shares}
    try:
        return check_fit(cap, cfg, run_label(cfg.name, items), steps, report["file"],
                         profiler_cost=not args.keep_profiler_cost, fitted=fitted,
                         fit_args=fit_args)
    except FitError as e:
        raise UserError(str(e)) from None


def _mapping_report(mapping, sizes) -> dict:
    """What the capture was read with: the preset and how, the sizes and where from."""
    # lazy: start-up time of the CLI (the importer loads numpy)
    from simwar.capture.presets import dropped_entries, entry_lines, preset_line

    return {"preset": mapping.origin[0], "preset_line": preset_line(mapping),
            "entries": entry_lines(mapping),
            "matched": {k: sorted(v) for k, v in mapping.soft.items() if k != "reads"},
            "unmatched": dropped_entries(mapping),
            "sizes": sizes.source, "size_notes": list(sizes.notes),
            "graph_buckets": sizes.buckets}


def _sizes_lines(r: dict) -> list[str]:
    """The lines after the report: the preset, the sizes and the figures per graph bucket."""
    f = num
    m = r.get("mapping") or {}
    lines = []
    if m.get("preset_line"):
        lines.append(f"  mapping             {m['preset_line']}")
        lines += [f"    {e}" for e in m.get("entries", [])]
    if r.get("frames"):
        lines.append(f"  python frames       {r['frames']} of the engine's own, read as host "
                     f"ranges (with_stack)")
    if r.get("shapes"):
        # lazy: start-up time of the CLI (the importer)
        from simwar.capture.step_shapes import StepShape, shape_summary

        lines.append(f"  step shapes         "
                     f"{shape_summary(StepShape(**x) for x in r['shapes'])}")
    s = r["metrics"]
    if "by_bucket" in s and s.get("steps_measured", 0) > 0:
        for note in m.get("size_notes", []):
            lines.append(f"  sizes               {note}")
        lines.append(f"  batch               mean {f(s['batch_size_mean'])}")
        lines += bucket_lines(s["by_bucket"])
    return lines


def _check_fit_steps(cap, path: Path) -> None:
    """A capture of one step cannot be fitted (a fit reads step periods and the gaps between
    forwards): one line saying so and what reads one step, before the fit runs."""
    # lazy: start-up time of the CLI (the analysis loads numpy)
    from simwar.analysis.critical_path import NoForward, forward_extents

    try:
        n = len(forward_extents(cap.trace)[0])
    except NoForward:
        return  # the fit says what it lacks
    if n == 1:
        raise UserError(f"{path}: --fit: the capture holds one step with forward work; a fit "
                        f"needs at least two after the warm-up ({cap.trace.run.warmup_steps}) "
                        f"(simwar explain {path} gives the one step's critical path)")


def _write_model(cap, args, path: Path):
    """Fit the capture's whole loop (``--fit``) and write it as a config with ``-o``."""
    # lazy: start-up time of the CLI (yaml; the fit loads numpy)
    import yaml

    from simwar.fit.from_capture import (  # lazy: start-up time of the CLI
        FitError,
        batches_csv,
        fit_model,
    )

    _check_fit_steps(cap, path)
    try:
        with work_bar("fitting", "stage", args.no_progress) as progress:
            model = fit_model(cap, dist=args.dist, policy=args.policy, version=__version__,
                              where=str(path), unprofiled_step_us=args.unprofiled,
                              profiler_cost=not args.keep_profiler_cost,
                              extrapolate_buckets=args.extrapolate_buckets,
                              launch_shares=args.launch_shares, progress=progress)
    except FitError as e:
        raise UserError(str(e)) from None
    config = model.config
    csv = None
    if model.batches is not None:  # the capture's batch sequence, beside the config
        out = Path(args.output)
        csv = out.with_name(re.sub(r"\.(ya?ml)$", "", out.name) + ".batches.csv")
        _check_companion(out, csv)
        config = model.config_for_file(csv.name)
    lines = [f"# {line}" for line in model.header]
    fits = [(k, d) for k, d in model.details.items() if "ks" in d]
    if fits:
        lines.append("# Fits compared (KS distance; a fit is rejected above the critical "
                     "value):")
        for key, d in fits:
            ks = ", ".join(f"{k} {v}" for k, v in d["ks"].items())
            lines.append(f"#   {key}: n={d['n']} mean={d['mean']} std={d['std']} KS: {ks} "
                         f"(critical {d['ks_critical']}) -> {d['chosen']}")
    text = "\n".join(lines) + "\n" + yaml.safe_dump(config, sort_keys=False,
                                                    default_flow_style=None, width=100)
    if csv is not None:
        write_text_atomic(csv, batches_csv(model.batches))
    write_text_atomic(args.output, text)
    return model


def _check_companion(out: Path, csv: Path) -> None:
    """``-o OUT.yaml`` replaces OUT.yaml, as asked, and the batch file beside it only when it
    is OUT.yaml's own (the file OUT.yaml names): any other file of that name is refused."""
    if not csv.exists():
        return
    # lazy: start-up time of the CLI (the config schema loads pydantic)
    from simwar.config import ConfigError, read_yaml

    try:
        named = (read_yaml(out).get("workload") or {}).get("batch_sizes_file")
    except (ConfigError, AttributeError):
        named = None
    if named != csv.name:
        raise UserError(f"-o {out}: would replace {csv}, which is not {out.name}'s batch file "
                        f"(-o writes the capture's batches beside the config); move it, or "
                        f"choose another -o")


class _ReadProgress:
    """A tqdm bar over the files' bytes, as a ``progress(done, total)`` callback (called per
    file, in order)."""

    def __init__(self, paths: list[Path], disabled: bool):
        self.paths = paths
        self.disabled = disabled
        self.bar = None
        self.before = 0  # bytes of the files already read
        self.last_total = None

    def __enter__(self):
        # lazy: start-up time of the CLI (tqdm)
        from tqdm import tqdm

        name = self.paths[0].name + (f" and {len(self.paths) - 1} more"
                                     if len(self.paths) > 1 else "")
        self.bar = tqdm(total=sum(p.stat().st_size for p in self.paths), unit="B",
                        unit_scale=True, desc=f"reading {name}", file=sys.stderr, leave=False,
                        disable=True if self.disabled else None)
        return self.update

    def update(self, done: int, total: int) -> None:
        if done < self.bar.n - self.before:  # the next file started
            self.before = self.bar.n
        self.bar.update(max(0, self.before + done - self.bar.n))

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
             f"(steps after warm-up {trace.run.warmup_steps}).",
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
    if not (c["kernels"] or c["memcpys"] or c["memsets"]) and r.get("unmodelled"):
        return f"{r['file']}: {_unmodelled(r['unmodelled'])}"
    lines = [f"{r['file']}: {c['kernels']} kernels, {c['memcpys']} memcpys, {c['memsets']} "
             f"memsets, {c['sync_events']} sync events, {c['host_runtime_calls']} host runtime "
             f"calls, {c['ignored_events']} ignored events",
             f"  steps               {r['steps']} in the capture; {s.get('steps_measured', 0)} "
             f"measured; forward stream '{r['forward_stream']}'"]
    if s.get("steps_measured", 0) > 0:
        lines += stall_lines(s)
    elif r["steps"] == 1:  # one step: explain walks it; the figures over steps need two
        lines.append("  (one step: simwar explain gives its critical path; the stall figures "
                     "and --fit need at least two steps with forward kernels after warm-up)")
    else:
        lines.append("  (no measured steps: need at least two steps with forward kernels "
                     "after warm-up)")
    lines += report_lines(r)
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


def _unmodelled(u: dict) -> str:
    n = sum(u.values())
    kinds = ", ".join(f"{k} {v:,}" for k, v in sorted(u.items()))
    return (f"{n:,} device events of a kind simwar does not model ({kinds}: MTIA); simwar "
            f"reads CUDA and HIP device work only")


def report_lines(r: dict) -> list[str]:
    """The report's lines on threads, binding, unmodelled devices and ranks."""
    lines = []
    th = r.get("threads") or {}
    sched = th.get("scheduler") or {}
    if sched.get("tid") is not None:
        lines.append(f"  scheduler thread    {sched['name']} (tid {sched['tid']}: {sched['why']}); "
                     f"explain and --fit read it")
    if th.get("launch"):
        lines.append("  launching threads   " + ", ".join(
            f"{t['name']} {t['launches']:,} launches" for t in th["launch"]))
    b = r.get("binding") or {}
    if b.get("rules") or b.get("unbound"):
        bound = ", ".join(f"{n} {rule}" for rule, n in sorted(b.get("rules", {}).items()))
        un = sum(b.get("unbound", {}).values())
        lines.append(f"  waits/syncs bound   {bound or 'none'}" + (
            f"; {un} unbound ({'; '.join(f'{n} {why}' for why, n in sorted(b['unbound'].items()))})"
            if un else ""))
    if r.get("unmodelled"):
        lines.append(f"  not modelled        {_unmodelled(r['unmodelled'])}")
    for k in r.get("ranks", []):
        step = "-" if k["step_us_mean"] is None or not k["steps_measured"] else \
            f"{k['step_us_mean']:.1f}"
        gap = "-" if k["fwd_gap_us_mean"] is None or not k["steps_measured"] else \
            f"{k['fwd_gap_us_mean']:.1f}"
        lines.append(f"  rank {k['rank']:<14} pid {k['process']} ({k['file']}): {k['kernels']:,} "
                     f"kernels, {k['steps_measured']} steps measured, step time {step} µs, "
                     f"forward gap {gap} µs, clock {k['clock_offset_us']:+.1f} µs")
    sk = r.get("skew")
    if sk and sk.get("steps"):
        lines.append(f"  step-start skew     mean {sk['mean_us']:.1f} µs, p50 {sk['p50_us']:.1f}, "
                     f"max {sk['max_us']:.1f} over {sk['steps']} steps (latest: rank "
                     f"{sk['latest_rank']})")
    if r.get("collectives"):
        shift = ", ".join(f"{d:+.1f}" for d in r.get("clock_aligned_us", []))
        lines.append(f"  collectives         clocks aligned on them (µs per rank: {shift}); "
                     f"arrival skew per collective:")
        for c in r["collectives"]:
            late = (f"late rank {c['late_rank']} in {100 * c['late_share']:.0f}%"
                    if c["late_rank"] is not None else "no rank late")
            lines.append(f"    {c['collective']} ({'device' if c['device'] else 'host'}, "
                         f"{c['instances']}): p50 {c['skew_us_p50']:.1f} µs, p90 "
                         f"{c['skew_us_p90']:.1f}, max {c['skew_us_max']:.1f}; {late}")
    return lines
