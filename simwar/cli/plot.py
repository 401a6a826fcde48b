"""``simwar plot`` and the picture options of ``simwar run``: the command line of plots and traces.

- ``simwar plot SWEEP_DIR --x KEY --y METRIC [--hue KEY] -o out.png``: a metric
  against a swept key from a sweep's ``results.parquet`` (one line per value
  of ``--hue``), or ``--kind heatmap`` (``--hue`` is then the second axis);
- ``simwar plot CONFIG.yaml -o out.png [--set K=V] [--steps-window A:B]``: a run whose
  steps differ (a ``workload``): step time and forward gap against the batch size, and
  the regime flips step by step (:func:`simwar.plots.figures.workload_figure`);
- ``simwar run ... --timeline out.png [--steps-window A:B]``: the stall
  timeline of the run (with a zoom on the first forward-stream bubble);
- ``simwar run ... --trace out.json``: Chrome trace-event JSON for Perfetto.

Drawing and export live in :mod:`simwar.plots.figures` and :mod:`simwar.plots.perfetto`;
this module parses arguments, checks paths and writes files. It uses
matplotlib's Agg canvas directly, so no display is ever needed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from simwar.cli.common import UserError

RESULTS_FILE = "results.parquet"


def register(sub) -> None:
    p = sub.add_parser(
        "plot", help="plot a sweep's results (a metric against a swept key), or a run's steps "
                     "against their batch size",
        description="Plot METRIC against swept KEY from SWEEP_DIR/results.parquet (or a "
                    ".parquet/.csv table), one line per value of --hue; repeats are drawn "
                    "as their mean and min-max band. --kind heatmap puts --hue on the y axis. "
                    "Given a YAML config instead, simulate it and plot its steps: step time "
                    "and forward gap against the batch size, and the host-/device-bound "
                    "regime step by step (--steps-window A:B).")
    p.add_argument("sweep_dir", metavar="SWEEP_DIR",
                   help="a sweep output directory, or its results.parquet / results.csv; or "
                        "a YAML config (a run's steps by batch size)")
    p.add_argument("--x", metavar="KEY", help="swept key on the x axis (sweeps)")
    p.add_argument("--y", metavar="METRIC", help="metric, e.g. step_us_mean (sweeps)")
    p.add_argument("--hue", metavar="KEY", help="one line per value of this swept key")
    p.add_argument("--kind", choices=("line", "heatmap"), default="line")
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="keep only rows where KEY equals VALUE (repeatable)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a dotted key of the config (a config's steps; repeatable)")
    p.add_argument("--steps-window", metavar="A:B",
                   help="steps drawn step by step, A and B included (a config's steps; "
                        "default: the first 72 measured)")
    p.add_argument("-o", "--out", required=True, metavar="OUT.png", help="image to write")
    p.set_defaults(func=cmd_plot)


def extend_run(run_parser) -> None:
    run_parser.add_argument("--timeline", metavar="OUT.png",
                            help="write the stall timeline of a few steps (and a zoom on the "
                                 "first GPU bubble) to this image")
    run_parser.add_argument("--steps-window", metavar="A:B",
                            help="steps shown by --timeline, A and B included: from step A's "
                                 "start to step B+1's start (default: three steps "
                                 "after warm-up)")
    run_parser.add_argument("--trace", metavar="OUT.json",
                            help="write the run as Chrome trace-event JSON (open it in "
                                 "ui.perfetto.dev or chrome://tracing)")


def before_run(args, config) -> None:
    """Check the picture options before simulating, so that a mistake is reported at once."""
    timeline_path = getattr(args, "timeline", None)
    window_text = getattr(args, "steps_window", None)
    if window_text and not timeline_path:
        raise UserError("--steps-window: only used with --timeline OUT.png")
    if timeline_path:
        _output_path(timeline_path, "--timeline", image=True)
        if window_text:
            parse_window(window_text, config.steps)
    if getattr(args, "trace", None):
        _output_path(args.trace, "--trace")


def after_run(args, result) -> None:
    timeline_path = getattr(args, "timeline", None)
    window_text = getattr(args, "steps_window", None)
    trace_path = getattr(args, "trace", None)
    before_run(args, result.config)
    if timeline_path:
        out = _output_path(timeline_path, "--timeline", image=True)
        window = parse_window(window_text, result.config.steps) if window_text else None
        from simwar import plots

        _save(plots.stall_figure(result, window), out)
        _note(args, f"simwar: wrote {out}")
    if trace_path:
        out = _output_path(trace_path, "--trace")
        from simwar.plots.perfetto import write_chrome_trace

        write_chrome_trace(result.trace, out)
        _note(args, f"simwar: wrote {out}")


def _note(args, text: str) -> None:
    if not getattr(args, "quiet", False):
        print(text, file=sys.stderr)


def parse_window(text: str, steps: int) -> tuple[int, int]:
    """``"A:B"`` -> (A, B), with 0 <= A <= B < steps."""
    parts = text.split(":")
    try:
        a, b = (int(p) for p in parts)
    except ValueError:
        raise UserError(f"--steps-window: expected A:B (two step numbers), got '{text}'") from None
    if not 0 <= a <= b < steps:
        raise UserError(f"--steps-window: expected 0 <= A <= B < {steps} (the run's steps), "
                        f"got '{text}'")
    return a, b


def _output_path(path: str, option: str, image: bool = False) -> Path:
    out = Path(path)
    if out.is_dir():
        raise UserError(f"{option} {path}: is a directory (expected the name of a file to "
                        f"write)")
    if not out.parent.is_dir():
        raise UserError(f"{option} {path}: directory {out.parent} does not exist")
    if image:
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        kinds = FigureCanvasAgg.get_supported_filetypes()
        if out.suffix.lstrip(".").lower() not in kinds:
            raise UserError(f"{option} {path}: expected an image file name ending in "
                            f"{', '.join('.' + k for k in sorted(kinds))}")
    return out


def _save(fig, out: Path) -> None:
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from simwar.core.files import write_bytes_atomic

    FigureCanvasAgg(fig)
    image = io.BytesIO()  # rendered first, then written whole: a failed save leaves nothing
    fig.savefig(image, format=out.suffix.lstrip(".").lower(), dpi=110)
    write_bytes_atomic(out, image.getvalue())


def read_results(path: str):
    """A sweep's results table from its directory or the table file itself."""
    import pandas as pd

    p = Path(path)
    if p.is_dir():
        p = p / RESULTS_FILE
        if not p.exists():
            raise UserError(f"{path}: no {RESULTS_FILE} here (run `simwar sweep SWEEP.yaml "
                            f"--out {path}` first)")
    elif not p.exists():
        raise UserError(f"{path}: no such sweep directory or results file")
    try:
        if p.suffix == ".csv":
            return pd.read_csv(p)
        return pd.read_parquet(p)
    except (OSError, ValueError) as e:  # corrupt or foreign (Arrow errors subclass these)
        raise UserError(f"{p}: cannot read a results table ({type(e).__name__}: "
                        f"{str(e).splitlines()[0] if str(e) else 'unreadable'})") from None


def _filter(df, items: list[str]):
    from simwar.config import parse_override

    for item in items:
        key, value = parse_override(item)
        if key not in df.columns:
            raise UserError(f"--where {item}: no column '{key}'")
        col = df[key]
        keep = col == value
        if not keep.any():  # tables store some values as text: compare as text too
            keep = col.astype(str) == str(value)
        df = df[keep]
        if df.empty:
            raise UserError(f"--where {item}: no rows match")
    return df


def plot_title(df, x: str, y: str, hue: str | None, kind: str = "line") -> str:
    """``Y by X [and HUE]``, and a second line saying what each point averages over."""
    import pandas as pd

    from simwar import plots

    title = f"{plots.column_label(y)} by {plots.column_label(x)}"
    if hue:
        title += f" and {plots.column_label(hue)}"
    over = plots.averaged_over(df, x, y, hue)
    if over:
        parts = [f"{n} repeats" if c == "repeat" else f"up to {n} rows" if c == "rows"
                 else f"{c} ({n} values)" for c, n in over.items()]
        spread = ("" if kind == "heatmap" else "; bars: min to max"
                  if not pd.api.types.is_numeric_dtype(df[x]) else "; band: min to max")
        title += f"\neach {'cell' if kind == 'heatmap' else 'point'} is the mean over " \
                 f"{', '.join(parts)}{spread}"
    return title


def _is_config(path: str) -> bool:
    p = Path(path)
    return p.suffix.lower() in (".yaml", ".yml") and not p.is_dir()


def cmd_plot_steps(args) -> int:
    """``simwar plot CONFIG.yaml``: the run's steps against their batch size."""
    from simwar.api import simulate
    from simwar.config import load_config

    for option, value in (("--x", args.x), ("--y", args.y), ("--hue", args.hue),
                          ("--where", args.where)):
        if value:
            raise UserError(f"{option}: only for a sweep's results (a config plots its steps "
                            f"by batch size)")
    if args.kind != "line":
        raise UserError("--kind: only for a sweep's results")
    cfg = load_config(args.sweep_dir, args.overrides)
    window = parse_window(args.steps_window, cfg.steps) if args.steps_window else None
    out = _output_path(args.out, "-o", image=True)
    from simwar import plots

    result = simulate(cfg)
    _save(plots.workload_figure(result, window), out)
    print(f"simwar: wrote {out}", file=sys.stderr)
    return 0


def cmd_plot(args) -> int:
    if _is_config(args.sweep_dir):
        return cmd_plot_steps(args)
    for option, value in (("--set", args.overrides), ("--steps-window", args.steps_window)):
        if value:
            raise UserError(f"{option}: only for a config (a sweep's results are plotted as "
                            f"they are)")
    for option, value in (("--x", args.x), ("--y", args.y)):
        if not value:
            raise UserError(f"{option}: required to plot a sweep's results (e.g. --x "
                            f"cpu.schedule_us --y step_us_mean)")
    df = _filter(read_results(args.sweep_dir), args.where)
    for option, col in (("--x", args.x), ("--y", args.y), ("--hue", args.hue)):
        if col is not None and col not in df.columns:
            cols = list(df.columns)  # sweep tables put the swept keys before run_id
            swept = cols[:cols.index("run_id")] if "run_id" in cols else []
            raise UserError(f"{option} {col}: not a column of {args.sweep_dir} (swept keys: "
                            f"{', '.join(swept) or 'none'}; metrics like step_us_mean, "
                            f"fwd_gap_us_mean, gpu_idle_us_mean)")
    if args.kind == "heatmap" and not args.hue:
        raise UserError("--kind heatmap: needs --hue KEY for the y axis")
    from simwar import plots

    if args.y not in plots.numeric_columns(df):
        raise UserError(f"--y {args.y}: not a numeric column of {args.sweep_dir} (numeric: "
                        f"{', '.join(plots.numeric_columns(df)) or 'none'})")
    out = _output_path(args.out, "-o", image=True)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 4.5), layout="constrained")
    ax = fig.add_subplot()
    if args.kind == "heatmap":
        plots.sweep_heatmap(df, args.x, args.hue, args.y, ax=ax)
        ax.set_ylabel(plots.column_label(args.hue))
        ax.images[0].colorbar.set_label(plots.column_label(args.y))
    else:
        plots.sweep_lines(df, args.x, args.y, hue=args.hue, ax=ax)
        ax.set_ylabel(plots.column_label(args.y))
    ax.set_xlabel(plots.column_label(args.x))
    ax.set_title(plot_title(df, args.x, args.y, args.hue, args.kind), loc="left", fontsize=10)
    _save(fig, out)
    print(f"simwar: wrote {out}", file=sys.stderr)
    return 0
