"""``simwar sweep``: run a sweep file (locally or on Ray) into an output directory.

The work, resuming included, is :func:`simwar.study.sweeps.sweep`'s; this module parses
arguments, checks them before anything runs, and prints what was done. The progress bar
on stderr is the sweep's own.

Imports: ``simwar.cli.common`` at the top; the sweep module inside :func:`command`. Never
another command's module.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from simwar.cli.common import UserError, check_outputs, output_dir

HELP = "run a sweep file into a results table (resumable)"
DESCRIPTION = ("Expand a sweep file (base config, grid, zip, repeats), simulate every run and "
               "write DIR/results.parquet, DIR/results.csv, DIR/sweep.yaml and a table per "
               "finished batch of runs, DIR/batches/*.parquet (with --run-files, also "
               "DIR/runs/<key>.json per run). Rerunning the same sweep into DIR skips finished "
               "runs; a different sweep into a DIR that holds results is refused unless --force "
               "is given.")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep_file", metavar="SWEEP.yaml", help="sweep file")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory")
    p.add_argument("--jobs", "-j", type=int, default=1, metavar="N",
                   help="local worker processes (default 1; 0 = one per core)")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="local process pool, or Ray tasks (needs simwar[ray])")
    p.add_argument("--ray-address", metavar="ADDR",
                   help="Ray cluster to join, e.g. ray://head:10001 or auto "
                        "(default: start a local Ray)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted key of the base config (repeatable)")
    p.add_argument("--run-files", action="store_true",
                   help="also write each run's summary and config to DIR/runs/<key>.json")
    p.add_argument("--force", action="store_true",
                   help="DIR holds a different sweep's results: replace its sweep.yaml and "
                        "results tables (per-run files are kept)")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress (a bar on a terminal, else a line every 5%% of the runs) "
                        "and no run count on stderr")
    p.add_argument("--yes", action="store_true",
                   help="run a sweep of more than 100000 runs (refused without it: each run "
                        "costs time and memory before it is simulated)")


def command(args) -> int:
    # lazy: start-up time of the CLI (the sweep module loads pandas and the simulator)
    from simwar.study.sweeps import (
        MAX_RUNS,
        SweepConflict,
        SweepInterrupted,
        load_sweep,
        sweep,
    )

    if args.jobs < 0:
        raise UserError(f"--jobs {args.jobs}: expected 0 (one per core) or a positive number")
    output_dir(args.out, "--out")
    if args.ray_address and args.backend != "ray":
        raise UserError("--ray-address: only meaningful with --backend ray")
    _check_inputs_kept(args.sweep_file, args.out)
    plan = load_sweep(args.sweep_file, args.overrides, max_runs=None if args.yes else MAX_RUNS)
    if not args.no_progress:
        print(f"simwar: {args.sweep_file}: {plan.count} runs ({plan.spec.count_text()})",
              file=sys.stderr)
    started = time.perf_counter()
    try:
        frame = sweep(plan, args.out, jobs=args.jobs, backend=args.backend,
                      ray_address=args.ray_address, progress=not args.no_progress,
                      force=args.force, run_files=args.run_files)
    except SweepConflict as e:
        raise UserError(f"--out {e}") from None
    except SweepInterrupted as e:
        kept = (f"; {os.path.join(args.out, 'results.parquet')} (and .csv) hold the "
                f"{e.finished} runs that finished" if e.out_dir else "")
        print(f"simwar: interrupted{kept}; rerun the same command to finish the "
              f"{e.total} runs", file=sys.stderr)
        return 130
    elapsed = time.perf_counter() - started
    already, simulated = frame.attrs["runs_stored"], frame.attrs["runs_simulated"]
    rate = f", {simulated / elapsed:.2f} runs/s" if simulated and elapsed > 0 else ""
    print(f"{args.sweep_file}: {len(frame)} runs ({already} already done, {simulated} "
          f"simulated in {elapsed:.1f} s{rate})")
    print(f"wrote {os.path.join(args.out, 'results.parquet')} and "
          f"{os.path.join(args.out, 'results.csv')}")
    return 0


#: the files a sweep writes into its --out directory (besides runs/)
OUT_FILES = ("sweep.yaml", "results.parquet", "results.csv")


def _check_inputs_kept(sweep_file: str, out: str) -> None:
    """Neither the sweep file nor its base config is one of the files written into ``out``."""
    # lazy: start-up time of the CLI (the config schema loads pydantic)
    from simwar.config import ConfigError, read_yaml

    inputs = [("sweep file", sweep_file)]
    try:
        base = read_yaml(sweep_file).get("base")
    except ConfigError:
        base = None  # load_sweep reports it
    if isinstance(base, str):
        inputs.append(("base config", os.path.join(os.path.dirname(sweep_file), base)))
    check_outputs(inputs, [("--out", os.path.join(out, name)) for name in OUT_FILES])
