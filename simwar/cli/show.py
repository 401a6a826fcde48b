"""``simwar show``: a config with every default filled in, or a sweep with its runs.

For a config: its resolved YAML. For a sweep: the sweep with its base inlined, then a
comment table of its runs (run id, repeat, seed, config hash and each swept value).

Imports: ``simwar.cli.common`` at the top; yaml, the config schema and the sweep module
inside :func:`command`. Never another command's module.
"""

from __future__ import annotations

import argparse
import itertools
import json

from simwar.cli.common import is_sweep_file

HELP = "print a config (or sweep) with every default resolved"
DESCRIPTION = ("Print the resolved config with defaults as YAML; for a sweep, print it with "
               "the base inlined and list its runs.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("file", metavar="CONFIG", nargs="?",
                   help="config or sweep file (default: the packaged dspark-fine config)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted key (repeatable)")
    p.add_argument("--yes", action="store_true",
                   help="list a sweep of more than 100000 runs (refused without it)")


def command(args) -> int:
    # lazy: start-up time of the CLI (yaml; the config schema loads pydantic)
    import yaml

    from simwar.config import load_config  # lazy: start-up time of the CLI
    from simwar.study.sweeps import MAX_RUNS, load_sweep  # lazy: start-up time of the CLI

    if args.file and is_sweep_file(args.file):
        plan = load_sweep(args.file, args.overrides, max_runs=None if args.yes else MAX_RUNS)
        print(yaml.safe_dump(plan.resolved(), sort_keys=False), end="")
        print(f"# {plan.count} runs")
        keys = plan.spec.swept_keys
        header = ["run_id", "repeat", "seed", "config_hash", *keys]
        runs = plan.iter_runs()
        # column widths from the first rows, then one row at a time (a sweep is not expanded
        # whole to be printed)
        first = [_row(r, keys) for r in itertools.islice(runs, WIDTH_ROWS)]
        widths = [max(len(h), *(len(row[i]) for row in first)) for i, h in enumerate(header)]
        for row in itertools.chain([header], first, (_row(r, keys) for r in runs)):
            print("# " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        return 0
    cfg = load_config(args.file, args.overrides)
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")
    return 0


#: rows whose cells set the column widths of a sweep's run table
WIDTH_ROWS = 1000


def _row(r, keys) -> list[str]:
    return [str(r.run_id), str(r.repeat), str(r.seed), r.config_hash,
            *(_cell(r.values[k]) for k in keys)]


def _cell(value) -> str:
    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
