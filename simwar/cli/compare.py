"""``simwar compare``: simulate each measured case and write the sim-vs-real error table.

``compare MEASURED... [--costs FILE] [--host-speed measured] --csv FILE [--plot FILE]``
simulates each measured case (its suite case, or ``--config``) and writes the error table
of :func:`simwar.fit.replays.compare` (with each varying-workload case's median per-step
error), then prints the acceptance criteria. ``--plot`` draws
:func:`simwar.plots.plot_compare`; ``--save-measured FILE`` also writes the measured
summaries read (the ``calibration/*.json`` form); ``--markdown`` a per-case table.

Imports: ``simwar.cli.common`` and ``simwar.core.files`` at the top; the fit module, the
suite, the config schema and matplotlib inside the functions that use them. Never another
command's module.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

from simwar.cli.common import (
    UserError,
    check_outputs,
    costs_overrides,
    load_measured,
    output_path,
)
from simwar.core.files import write_bytes_atomic, write_text_atomic

HELP = "simulated vs measured error table"
DESCRIPTION = ("Simulate each measured case and write config, metric, simulated, measured, abs "
               "and relative error as CSV.")


def add_arguments(m: argparse.ArgumentParser) -> None:
    m.add_argument("measured", nargs="+", help="as for calibrate")
    m.add_argument("--costs", help="calibration YAML (its costs replace each config's)")
    m.add_argument("--config", help="one YAML config for every measured case (default: the "
                                    "suite case of the same name)")
    m.add_argument("--host-speed", choices=("calibrated", "measured"), default="calibrated",
                   help="'measured' scales the host costs of each case by its own measured "
                        "launch cost over the calibrated one (the host's speed during that "
                        "replay); default: the calibrated costs as they are")
    m.add_argument("--csv", required=True, help="error table to write")
    m.add_argument("--plot", help="PNG of simulated vs measured step time and forward gap")
    m.add_argument("--save-measured", metavar="FILE",
                   help="also write the measured summaries read (a JSON file of the form "
                        "calibration/*.json holds, per-step figures of varying workloads "
                        "included)")
    m.add_argument("--description", default="",
                   help="description written into --save-measured's file")
    m.add_argument("--markdown", metavar="FILE",
                   help="also write a per-case Markdown table (step time, median per-step "
                        "error, forward gap, launch-ahead, races)")


def case_configs(names, config_path: str | None) -> dict[str, dict]:
    """Each measured case's config mapping: ``--config`` for all, else its suite case."""
    # lazy: start-up time of the CLI (the config schema loads pydantic)
    from simwar.config import load_config
    from simwar.harness import suite  # lazy: start-up time of the CLI

    known = suite.all_cases()
    out = {}
    for name in names:
        if config_path:
            out[name] = json.loads(load_config(config_path).model_dump_json())
        elif name in known:
            out[name] = suite.config_mapping(name)
        else:
            raise UserError(f"{name}: not a suite case; give its config with --config")
    return out


def table_csv(table) -> str:
    """The error table as CSV, four decimals, never ``-0.0000``: a figure that rounds to zero
    is written as zero whatever its sign (so a regeneration does not differ by a sign)."""
    # lazy: start-up time of the CLI (pandas)
    import pandas as pd

    out = table.copy()
    for column in out.columns:
        if pd.api.types.is_float_dtype(out[column]):
            out[column] = out[column].round(4) + 0.0  # -0.0 + 0.0 is 0.0
    return out.to_csv(index=False, float_format="%.4f")


def command(args) -> int:
    # lazy: start-up time of the CLI (pandas and the simulator)
    from simwar.fit.replays import criteria, error_table, markdown_table, with_host_speed

    outputs = [("--csv", args.csv), ("--plot", args.plot), ("--save-measured", args.save_measured),
               ("--markdown", args.markdown)]
    for option, value in outputs:  # checked before anything is simulated
        if value is not None:  # given, even empty: checked
            output_path(value, option, image=option == "--plot")
    check_outputs([("measured input", m) for m in args.measured]
                  + [("costs file", args.costs), ("config", args.config)], outputs)
    measured = load_measured(args.measured)
    configs = case_configs(measured, args.config)
    costs = {k[len("costs."):]: v for k, v in costs_overrides(args.costs).items()}
    for name, cfg in configs.items():
        if args.host_speed == "measured" and name in measured:
            configs[name] = with_host_speed(cfg, measured[name], costs)
        else:
            cfg["costs"] = dict(cfg.get("costs", {}), **costs)
    table = error_table(configs, measured)
    if args.save_measured:
        doc = {"format": "simwar.measured_summaries", "version": 1,
               "description": args.description, "cases": measured}
        write_text_atomic(args.save_measured, json.dumps(doc, indent=1) + "\n")
    write_bytes_atomic(args.csv, table_csv(table).encode())
    if args.markdown:
        write_text_atomic(args.markdown, markdown_table(table))
    if args.plot:
        # lazy: start-up time of the CLI (matplotlib)
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        from simwar.plots.compare import plot_compare  # lazy: start-up time of the CLI

        ax_step, _ = plot_compare(table)
        FigureCanvasAgg(ax_step.figure)
        ax_step.figure.tight_layout()
        image = io.BytesIO()  # rendered first, then written whole
        ax_step.figure.savefig(image, format=Path(args.plot).suffix.lstrip(".").lower(), dpi=90)
        write_bytes_atomic(args.plot, image.getvalue())
    c = criteria(table)
    print(f"{c['cases']} cases: step time |error| median {100 * c['step_rel_error_median']:.2f}%"
          f", max {100 * c['step_rel_error_max']:.2f}%; forward gap within max(25 µs, 10%) in "
          f"{c['fwd_gap_within_bound']}; launch-ahead |error| max "
          f"{c['launch_ahead_abs_error_max']:.3f}; race presence mismatches "
          f"{c['race_presence_mismatches']} ({c['racy_cases']} racy cases)")
    if "per_step_cases" in c:
        print(f"{c['per_step_cases']} cases with per-step figures: median per-step step-time "
              f"|error| {100 * c['per_step_rel_error_median_median']:.2f}% (median over cases)"
              f", {100 * c['per_step_rel_error_median_max']:.2f}% (worst case)")
    written = [args.csv] + [f for f in (args.plot, args.save_measured, args.markdown) if f]
    print(f"wrote {', '.join(written)}")
    return 0
