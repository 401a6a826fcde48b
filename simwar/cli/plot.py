"""``simwar plot``: a sweep's results as a figure, or a run's steps against their batch.

- ``simwar plot SWEEP_DIR --x KEY --y METRIC [--hue KEY] [--facet KEY] -o out.png``: a
  metric against a swept key from a sweep's ``results.parquet`` (one line per value
  of ``--hue``, one panel per value of ``--facet``), or ``--kind heatmap`` (``--hue`` is
  then the second axis); the title says the ``--where`` filters and what each point
  averages over (:func:`plot_title`: repeats and numeric swept keys; a categorical swept
  key is never averaged over: it must be plotted or filtered to one value);
- ``simwar plot CONFIG.yaml -o out.png [--set K=V] [--steps-window A:B]``: a run whose
  steps differ (a ``workload``): step time and forward gap against the batch size, and
  the regime flips step by step (:func:`simwar.plots.workload_figure`);
- ``simwar plot CONFIG.yaml --on-off -o out.png [--rates R,...] [--scales S,...]``: a config
  with requests, overlap on against off across the arrival rate and the forward's length,
  with the crossover drawn (:func:`simwar.study.overlap.on_off_grid`,
  :func:`simwar.plots.overlap.decision_figure`).

The pictures of ``simwar run`` (``--timeline``, ``--trace``) are :mod:`simwar.cli.outputs`'.
Drawing lives in :mod:`simwar.plots`; this module parses arguments, checks paths and
columns, and writes the image through matplotlib's Agg canvas (no display needed).

Imports: ``simwar.cli.common`` at the top; pandas, matplotlib, the plots and the
simulator inside the functions that use them (start-up time of the CLI). Never another
command's module.
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

from simwar.cli.common import (
    UserError,
    check_outputs,
    filter_rows,
    output_path,
    parse_window,
    read_results,
    results_file,
    save_figure,
)

HELP = ("plot a sweep's results (a metric against a swept key), or a run's steps against "
        "their batch size")
DESCRIPTION = ("Plot METRIC against swept KEY from SWEEP_DIR/results.parquet (or a "
               ".parquet/.csv table), one line per value of --hue; repeats are drawn as their "
               "mean and min-max band. --kind heatmap puts --hue on the y axis. Given a YAML "
               "config instead, simulate it and plot its steps: step time and forward gap "
               "against the batch size, and the host-/device-bound regime step by step "
               "(--steps-window A:B).")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("sweep_dir", metavar="SWEEP_DIR",
                   help="a sweep output directory, or its results.parquet / results.csv; or "
                        "a YAML config (a run's steps by batch size)")
    p.add_argument("--x", metavar="KEY", help="swept key on the x axis (sweeps)")
    p.add_argument("--y", metavar="METRIC", help="metric, e.g. step_us_mean (sweeps)")
    p.add_argument("--hue", metavar="KEY", help="one line per value of this swept key")
    p.add_argument("--kind", choices=("line", "heatmap"), default="line")
    p.add_argument("--facet", metavar="KEY",
                   help="one panel per value of this swept key, side by side")
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="keep only rows where KEY equals VALUE (repeatable)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted key of the config (a config's steps; repeatable)")
    p.add_argument("--steps-window", metavar="A:B",
                   help="steps drawn step by step, A and B included (a config's steps; "
                        "default: the first 72 measured)")
    p.add_argument("--on-off", action="store_true",
                   help="a config with requests: overlap on against off across the arrival "
                        "rate (--rates) and the forward's length (--scales), the crossover "
                        "drawn")
    p.add_argument("--rates", default="10,25,50,75,100", metavar="R,...",
                   help="arrival rates per second for --on-off (default 10,25,50,75,100)")
    p.add_argument("--scales", default="0.25,0.5,1,2,4", metavar="S,...",
                   help="factors of every phase's device time for --on-off (default "
                        "0.25,0.5,1,2,4)")
    p.add_argument("-o", "--out", required=True, metavar="OUT.png", help="image to write")


def plot_title(df, x: str, y: str, hue: str | None, kind: str = "line",
               facet: str | None = None, where: list[str] = ()) -> str:
    """``Y by X [and HUE] [, one panel per FACET]``, then ``where`` filters, then what each
    point averages over (repeats, numeric swept keys not plotted), one line each."""
    # lazy: start-up time of the CLI (pandas, matplotlib)
    import pandas as pd

    from simwar.plots.sweeps import averaged_over, column_label  # lazy: start-up time of the CLI

    lines = [f"{column_label(y)} by {column_label(x)}"
             + (f" and {column_label(hue)}" if hue else "")
             + (f", one panel per {column_label(facet)}" if facet else "")]
    if where:
        lines.append("where " + ", ".join(where))
    over = averaged_over(df, x, y, hue, facet)
    if over:
        parts = [f"{n} repeats" if c == "repeat" else f"up to {n} rows" if c == "rows"
                 else f"{c} ({n} values)" for c, n in over.items()]
        spread = ("" if kind == "heatmap" else "; bars: min to max"
                  if not pd.api.types.is_numeric_dtype(df[x]) else "; band: min to max")
        lines.append(f"each {'cell' if kind == 'heatmap' else 'point'} is the mean over "
                     f"{', '.join(parts)}{spread}")
    return "\n".join(lines)


def _wrapped(title: str, width_in: float, fontsize: float) -> str:
    """``title``'s lines wrapped to fit a figure ``width_in`` inches wide (a character of
    DejaVu Sans averages ~0.55 of the font size)."""
    chars = max(20, int(width_in * 72 / (0.55 * fontsize)) - 4)
    return "\n".join(textwrap.fill(line, chars) for line in title.splitlines())


def _is_config(path: str) -> bool:
    p = Path(path)
    return p.suffix.lower() in (".yaml", ".yml") and not p.is_dir()


def plot_steps(args) -> int:
    """``simwar plot CONFIG.yaml``: the run's steps against their batch size."""
    # lazy: start-up time of the CLI (the simulator; the config schema loads pydantic)
    from simwar.api import simulate
    from simwar.config import load_config  # lazy: start-up time of the CLI

    for option, value in (("--x", args.x), ("--y", args.y), ("--hue", args.hue),
                          ("--where", args.where)):
        if value:
            raise UserError(f"{option}: only for a sweep's results (a config plots its steps "
                            f"by batch size)")
    if args.kind != "line":
        raise UserError("--kind: only for a sweep's results")
    out = output_path(args.out, "-o", image=True)
    check_outputs([("config", args.sweep_dir)], [("-o", args.out)])
    cfg = load_config(args.sweep_dir, args.overrides)
    if args.on_off:
        return plot_on_off(args, cfg)
    window = parse_window(args.steps_window, cfg.steps) if args.steps_window else None
    # lazy: start-up time of the CLI (matplotlib, pandas)
    from simwar.plots.workload import workload_figure

    result = simulate(cfg)
    save_figure(workload_figure(result, window), out)
    print(f"simwar: wrote {out}", file=sys.stderr)
    return 0


def _numbers(text: str, option: str) -> list[float]:
    try:
        out = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        out = []
    if not out or not all(x > 0 for x in out):
        raise UserError(f"{option} {text}: expected positive numbers separated by commas")
    return out


def plot_on_off(args, cfg) -> int:
    """``simwar plot CONFIG.yaml --on-off``: overlap on against off, with the crossover."""
    if args.steps_window:
        raise UserError("--steps-window: not with --on-off")
    rates, scales = _numbers(args.rates, "--rates"), _numbers(args.scales, "--scales")
    out = output_path(args.out, "-o", image=True)
    # lazy: start-up time of the CLI (matplotlib, pandas)
    from simwar.plots.overlap import decision_figure
    from simwar.study.overlap import on_off_grid  # lazy: start-up time (the simulator)

    df = on_off_grid(cfg, rates, scales)
    save_figure(decision_figure(df, f"{cfg.name}: overlap on or off; black line: no change"),
                out)
    print(f"simwar: wrote {out}", file=sys.stderr)
    return 0


def command(args) -> int:
    if _is_config(args.sweep_dir):
        return plot_steps(args)
    for option, value in (("--set", args.overrides), ("--steps-window", args.steps_window),
                          ("--on-off", args.on_off)):
        if value:
            raise UserError(f"{option}: only for a config (a sweep's results are plotted as "
                            f"they are)")
    for option, value in (("--x", args.x), ("--y", args.y)):
        if not value:
            raise UserError(f"{option}: required to plot a sweep's results (e.g. --x "
                            f"cpu.schedule_us --y step_us_mean)")
    out = output_path(args.out, "-o", image=True)
    check_outputs([("results table", results_file(args.sweep_dir))], [("-o", args.out)])
    df = filter_rows(read_results(args.sweep_dir), args.where)
    for option, col in (("--x", args.x), ("--y", args.y), ("--hue", args.hue),
                        ("--facet", args.facet)):
        if col is not None and col not in df.columns:
            cols = list(df.columns)  # sweep tables put the swept keys before run_id
            swept = cols[:cols.index("run_id")] if "run_id" in cols else []
            raise UserError(f"{option} {col}: not a column of {args.sweep_dir} (swept keys: "
                            f"{', '.join(swept) or 'none'}; metrics like step_us_mean, "
                            f"fwd_gap_us_mean, gpu_idle_us_mean)")
    if args.kind == "heatmap" and not args.hue:
        raise UserError("--kind heatmap: needs --hue KEY for the y axis")
    plotted = [c for c in (args.x, args.hue, args.facet) if c]
    if len(set(plotted)) < len(plotted):
        raise UserError("--x, --hue and --facet: give each a different key")
    # lazy: start-up time of the CLI (matplotlib)
    from matplotlib.figure import Figure

    # lazy: start-up time of the CLI (the plots load pandas)
    from simwar.plots.sweeps import (
        categorical_averaged,
        numeric_columns,
        sweep_facets,
        sweep_heatmap,
        sweep_lines,
    )

    if args.y not in numeric_columns(df):
        raise UserError(f"--y {args.y}: not a numeric column of {args.sweep_dir} (numeric: "
                        f"{', '.join(numeric_columns(df)) or 'none'})")
    over = categorical_averaged(df, *plotted)
    if over:  # never a mean over a categorical swept key: a configuration that does not exist
        key, values = next(iter(over.items()))
        shown = ", ".join(map(str, values[:6])) + (", ..." if len(values) > 6 else "")
        raise UserError(f"{key} takes {len(values)} values ({shown}) in {args.sweep_dir} and "
                        f"is not plotted: each point would average them, a configuration "
                        f"that does not exist; keep one with --where {key}={values[0]}, or "
                        f"show it with --hue {key} or --facet {key}")
    if args.facet:
        fig = sweep_facets(df, args.x, args.y, args.facet, hue=args.hue, kind=args.kind)
        title = plot_title(df, args.x, args.y, args.hue, args.kind, args.facet, args.where)
        fig.suptitle(_wrapped(title, fig.get_figwidth(), 10), x=0.01, ha="left",
                     fontsize=10)
    else:
        fig = Figure(figsize=(7.5, 4.5), layout="constrained")
        ax = fig.add_subplot()
        if args.kind == "heatmap":
            sweep_heatmap(df, args.x, args.hue, args.y, ax=ax)
        else:
            sweep_lines(df, args.x, args.y, hue=args.hue, ax=ax)
        title = plot_title(df, args.x, args.y, args.hue, args.kind, where=args.where)
        ax.set_title(_wrapped(title, fig.get_figwidth(), 10), loc="left", fontsize=10)
    save_figure(fig, out)
    print(f"simwar: wrote {out}", file=sys.stderr)
    return 0
