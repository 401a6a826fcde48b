"""``simwar sweep``, ``simwar validate`` and ``simwar show``: sweeps and configs on the CLI.

``sweep`` runs a sweep file (locally or on Ray) into an output directory, with
a progress bar on stderr; ``validate`` checks config and sweep files and says
what each one is; ``show`` prints a config with every default filled in, or a
sweep with its base inlined and its runs listed. The work is done by
:mod:`simwar.study.sweeps` and :mod:`simwar.config.schema`; this module only parses
arguments and prints.
"""

from __future__ import annotations

import os
import sys
import time

import yaml


def register(sub) -> None:
    p = sub.add_parser(
        "sweep", help="run a sweep file into a results table (resumable)",
        description="Expand a sweep file (base config, grid, zip, repeats), simulate every run "
                    "and write DIR/results.parquet, DIR/results.csv, DIR/sweep.yaml and "
                    "DIR/runs/<key>.json. Rerunning the same sweep into DIR skips finished "
                    "runs; a different sweep into a DIR that holds results is refused unless "
                    "--force is given.")
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
    p.add_argument("--force", action="store_true",
                   help="DIR holds a different sweep's results: replace its sweep.yaml and "
                        "results tables (run files are kept)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("validate", help="check config and sweep files",
                       description="Validate each config or sweep file; print one line per file. "
                                   "Exit 2 if any is invalid.")
    p.add_argument("files", nargs="+", metavar="FILE")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("show", help="print a config (or sweep) with every default resolved",
                       description="Print the resolved config with defaults as YAML; for a "
                                   "sweep, print it with the base inlined and list its runs.")
    p.add_argument("file", metavar="CONFIG", nargs="?",
                   help="config or sweep file (default: the packaged dspark-fine config)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted key (repeatable)")
    p.set_defaults(func=cmd_show)


def _is_sweep_file(path: str) -> bool:
    from simwar.config import read_yaml
    from simwar.study.sweeps import is_sweep_mapping

    return is_sweep_mapping(read_yaml(path))


# --------------------------------------------------------------------------- sweep
def cmd_sweep(args) -> int:
    from simwar.cli.common import UserError
    from simwar.study.sweeps import RunStore, SweepConflict, load_sweep, sweep

    if args.jobs < 0:
        raise UserError(f"--jobs {args.jobs}: expected 0 (one per core) or a positive number")
    if os.path.exists(args.out) and not os.path.isdir(args.out):
        raise UserError(f"--out {args.out}: exists and is not a directory")
    if args.ray_address and args.backend != "ray":
        raise UserError("--ray-address: only meaningful with --backend ray")
    plan = load_sweep(args.sweep_file, args.overrides)
    store = RunStore(args.out)
    already = sum(store.load(run) is not None for run in {r.run_key: r for r in plan.runs}
                  .values())
    started = time.perf_counter()
    try:
        frame = sweep(plan, args.out, jobs=args.jobs, backend=args.backend,
                      ray_address=args.ray_address, progress=not args.no_progress,
                      force=args.force)
    except SweepConflict as e:
        raise UserError(f"--out {e}") from None
    elapsed = time.perf_counter() - started
    simulated = len({r.run_key for r in plan.runs}) - already
    rate = f", {simulated / elapsed:.2f} runs/s" if simulated and elapsed > 0 else ""
    print(f"{args.sweep_file}: {len(frame)} runs ({already} already done, {simulated} "
          f"simulated in {elapsed:.1f} s{rate})")
    print(f"wrote {os.path.join(args.out, 'results.parquet')} and "
          f"{os.path.join(args.out, 'results.csv')}")
    return 0


# --------------------------------------------------------------------------- validate
def cmd_validate(args) -> int:
    from simwar.config import ConfigError, load_config
    from simwar.study.sweeps import load_sweep

    failures = 0
    for path in args.files:
        try:
            if _is_sweep_file(path):
                plan = load_sweep(path)
                swept = ", ".join(plan.spec.swept_keys) or "nothing swept"
                print(f"{path}: ok (sweep of {len(plan.runs)} runs over {swept})")
            else:
                cfg = load_config(path)
                print(f"{path}: ok (config {cfg.name}: {cfg.algorithm}, barrier "
                      f"{cfg.policy.barrier}, {cfg.policy.placement})")
        except ConfigError as e:
            failures += 1
            print(f"simwar: error: {e}", file=sys.stderr)
    return 2 if failures else 0


# --------------------------------------------------------------------------- show
def cmd_show(args) -> int:
    from simwar.config import load_config
    from simwar.study.sweeps import load_sweep

    if args.file and _is_sweep_file(args.file):
        plan = load_sweep(args.file, args.overrides)
        print(yaml.safe_dump(plan.resolved(), sort_keys=False), end="")
        print(f"# {len(plan.runs)} runs")
        keys = plan.spec.swept_keys
        header = ["run_id", "repeat", "seed", "config_hash", *keys]
        rows = [[str(r.run_id), str(r.repeat), str(r.seed), r.config_hash,
                 *(_cell(r.values[k]) for k in keys)] for r in plan.runs]
        widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
        for row in [header, *rows]:
            print("# " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
        return 0
    cfg = load_config(args.file, args.overrides)
    print(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), end="")
    return 0


def _cell(value) -> str:
    import json

    return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
