"""``simwar validate``: check config and sweep files and say what each one is.

One line per file on stdout (``FILE: ok (...)``), one error line per invalid file on
stderr (and a warning line per distribution a config clips often); exit 2 when any file is
invalid. Files are told apart by :func:`simwar.cli.common.is_sweep_file`. Every run of a
sweep is checked, one at a time (a bar on a terminal when it takes long); a sweep of more
than :data:`simwar.study.sweeps.MAX_RUNS` runs is refused (counted, not expanded) unless
``--yes``, which checks each swept value once, in the first run that holds it, and swept
durations of plain numbers at the ends of their ranges
(:func:`simwar.study.sweeps.load_sweep` does): expanding and validating every run of such
a sweep takes minutes, and a run invalid only in combination is still refused, with the
same line, when ``simwar sweep`` expands it, before its batch runs.

Imports: ``simwar.cli.common`` at the top; the config schema and the sweep module inside
:func:`command`. Never another command's module.
"""

from __future__ import annotations

import argparse
import sys

from simwar.cli.common import is_sweep_file, work_bar

HELP = "check config and sweep files"
DESCRIPTION = ("Validate each config or sweep file; print one line per file. Exit 2 if any is "
               "invalid.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("--yes", action="store_true",
                   help="check a sweep of more than 100000 runs (refused without it): each "
                        "swept value once, in the first run that holds it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")


def command(args) -> int:
    # lazy: start-up time of the CLI (the config schema loads pydantic)
    from simwar.config import ConfigError, load_config
    from simwar.config.budget import check_memory  # lazy: start-up time of the CLI
    from simwar.config.clipping import clipping_warnings  # lazy: start-up time of the CLI
    from simwar.study.sweeps import MAX_RUNS, load_sweep  # lazy: start-up time of the CLI

    failures = 0
    for path in args.files:
        try:
            if is_sweep_file(path):
                plan = load_sweep(path, max_runs=None if args.yes else MAX_RUNS)
                checked = ""
                if plan.count <= MAX_RUNS:
                    with work_bar("validating", "run", args.no_progress) as progress:
                        for i, _ in enumerate(plan.iter_runs()):  # one config at a time
                            if progress is not None:
                                progress(i + 1, plan.count)
                elif plan.ranged:  # load_sweep checked those at their ends, the rest once
                    checked = (f"; {', '.join(plan.ranged)} checked at the ends of "
                               f"{'their ranges' if len(plan.ranged) > 1 else 'its range'}"
                               f", each other swept value in its first run")
                else:  # load_sweep checked the first run of each swept value
                    checked = "; each swept value checked in its first run"
                swept = ", ".join(plan.spec.swept_keys) or "nothing swept"
                print(f"{path}: ok (sweep of {plan.count} runs over {swept}{checked})")
            else:
                cfg = load_config(path)
                try:
                    check_memory(cfg)  # a config the machine cannot run is not ok
                except ConfigError as e:
                    raise ConfigError(f"{path}: {e}") from None
                print(f"{path}: ok (config {cfg.name}: {cfg.algorithm}, barrier "
                      f"{cfg.policy.barrier}, {cfg.policy.placement})")
                for warning in clipping_warnings(cfg):
                    print(f"simwar: warning: {path}: {warning}", file=sys.stderr)
        except ConfigError as e:
            failures += 1
            print(f"simwar: error: {e}", file=sys.stderr)
    return 2 if failures else 0
