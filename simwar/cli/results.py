"""``simwar results``: print a sweep's results table, sorted, with the columns asked for.

    simwar results OUT [--columns A,B,...] [--sort KEY ...] [--descending] [--where K=V ...]
                       [--limit N] [--csv]

``OUT`` is a sweep's output directory (its ``results.parquet``) or a results table file.
By default the columns are the swept keys and the headline metrics (step time, forward
gap, GPU idle, throughput, latent races), the rows in run order; ``--csv`` prints CSV for
another program, otherwise an aligned text table. A sweep stopped by Ctrl-C has a table of
the runs that finished, which this prints as it is.

Imports: ``simwar.cli.common`` at the top; pandas inside :func:`command` (start-up time of
the CLI). Never another command's module.
"""

from __future__ import annotations

import argparse

from simwar.cli.common import UserError, filter_rows, num, read_results

HELP = "print a sweep's results table (sorted, chosen columns, or as CSV)"
DESCRIPTION = ("Print OUT/results.parquet (or a results table file): the swept keys and the "
               "headline metrics by default, sorted by --sort, filtered by --where, as an "
               "aligned table or CSV.")
#: the metrics shown by default, after the swept keys (those the table has)
DEFAULT_METRICS = ("step_us_mean", "fwd_gap_us_mean", "gpu_idle_us_mean", "tokens_per_s",
                   "races")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("out", metavar="OUT", help="a sweep's output directory, or its "
                                              "results.parquet / results.csv")
    p.add_argument("--columns", metavar="A,B,...",
                   help="columns to print, comma-separated (default: the swept keys, "
                        + ", ".join(DEFAULT_METRICS) + ")")
    p.add_argument("--sort", action="append", default=[], metavar="KEY",
                   help="sort by this column (repeatable: later keys break ties; default: "
                        "run order)")
    p.add_argument("--descending", action="store_true", help="sort largest first")
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                   help="keep only rows where KEY equals VALUE (repeatable)")
    p.add_argument("--limit", type=int, default=None, metavar="N",
                   help="print the first N rows only")
    p.add_argument("--csv", action="store_true", help="print CSV instead of a text table")


def command(args) -> int:
    if args.limit is not None and args.limit < 0:
        raise UserError(f"--limit {args.limit}: expected 0 or a positive number")
    df = filter_rows(read_results(args.out), args.where)
    columns = list(df.columns)
    swept = columns[:columns.index("run_id")] if "run_id" in columns else []
    if args.columns:
        chosen = [c.strip() for c in args.columns.split(",") if c.strip()]
        if not chosen:
            raise UserError("--columns: expected column names, e.g. --columns "
                            "policy.barrier,step_us_mean")
    else:
        chosen = swept + [m for m in DEFAULT_METRICS if m in columns]
    for option, names in (("--columns", chosen), ("--sort", args.sort)):
        for name in names:
            if name not in columns:
                raise UserError(f"{option} {name}: not a column of {args.out} (swept keys: "
                                f"{', '.join(swept) or 'none'}; metrics like "
                                f"{', '.join(m for m in DEFAULT_METRICS if m in columns)})")
    if args.sort:
        # mergesort: stable, so rows that tie keep their run order
        df = df.sort_values(args.sort, ascending=not args.descending, kind="mergesort")
    elif args.descending:
        raise UserError("--descending: only with --sort KEY")
    table = df[chosen]
    if args.limit is not None:
        table = table.head(args.limit)
    if args.csv:
        print(table.to_csv(index=False), end="")
        return 0
    print(format_table(table))
    return 0


def format_table(table) -> str:
    """An aligned text table: numbers right-aligned (one decimal for floats, never -0.0),
    text left-aligned, one header line."""
    # lazy: start-up time of the CLI (pandas)
    import pandas as pd

    cells = {}
    right = {}
    for name in table.columns:
        col = table[name]
        numeric = pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col)
        right[name] = numeric
        if pd.api.types.is_float_dtype(col):
            cells[name] = ["" if v != v else num(v) for v in col.tolist()]
        else:
            cells[name] = ["" if v is None else str(v) for v in col.tolist()]
    widths = {n: max([len(n), *(len(c) for c in cells[n])]) for n in table.columns}

    def line(values: dict) -> str:
        return "  ".join(values[n].rjust(widths[n]) if right[n] else values[n].ljust(widths[n])
                         for n in table.columns).rstrip()

    rows = [line({n: n for n in table.columns})]
    rows += [line({n: cells[n][i] for n in table.columns}) for i in range(len(table))]
    return "\n".join(rows)
