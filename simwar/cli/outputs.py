"""The picture and trace options of ``simwar run``: ``--timeline``, ``--steps-window``, ``--trace``.

``simwar.cli.run`` calls the steps explicitly: :func:`add_arguments` to its parser,
:func:`check_paths` before reading the config (a wrong path costs nothing and overwrites no
input), :func:`check` before simulating (nor does a wrong window cost a run), :func:`write`
after.
``--timeline`` draws :func:`simwar.plots.stall_figure` (the stall timeline of a few steps
and a zoom on the first forward-stream bubble) from the run's Trace: :func:`trace_options`
names it, so that ``run`` picks an executor that keeps it. ``--trace`` writes Chrome trace-event
JSON for Perfetto (:mod:`simwar.plots.perfetto`) as the run is simulated, its windows made
by the one-pass executor's own pass (:func:`traced_run`: the summary and the trace of one
pass; a workload realized as it runs, or ``--timeline`` beside it: by its trace mode
after the run, :func:`simwar.api.trace_windows`): memory of one window, whatever the
run's length, the file written as it is produced (and nothing left of it after a failure
or Ctrl-C); a run that kept its trace (``--engine simpy``, or a tensor-parallel run on
any engine: its ranks side by side) exports that.
``--steps-window`` limits both to steps A..B.

Imports: ``simwar.cli.common`` at the top; matplotlib and the plots inside :func:`write`.
Never a command's module (``run`` imports this one).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simwar.cli.common import (
    UserError,
    check_outputs,
    output_path,
    parse_window,
    save_figure,
    work_bar,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--timeline", metavar="OUT.png",
                        help="write the stall timeline of a few steps (and a zoom on the "
                             "first GPU bubble) to this image")
    parser.add_argument("--steps-window", metavar="A:B",
                        help="steps shown by --timeline and written by --trace, A and B "
                             "included: from step A's start to the end of step B's work, "
                             "nothing of step B+1 (--timeline's default: three steps after "
                             "warm-up; --trace's: every step)")
    parser.add_argument("--trace", metavar="OUT.json",
                        help="write the run as Chrome trace-event JSON (open it in "
                             "ui.perfetto.dev or chrome://tracing; .json.gz: gzipped), as it "
                             "is simulated: a run of any length fits in memory")


def trace_options(args) -> list[str]:
    """The options given that need the run's Trace kept (``--trace`` streams its own)."""
    return ["--timeline"] if args.timeline else []


def check_paths(args) -> None:
    """Check the files the options write before anything is read or simulated: each is a
    file simwar may write, and none is an input or the other output."""
    if args.steps_window and not (args.timeline or args.trace):
        raise UserError("--steps-window: only used with --timeline OUT.png or --trace "
                        "OUT.json")
    if args.timeline is not None:  # given, even empty: checked
        output_path(args.timeline, "--timeline", image=True)
    if args.trace is not None:
        output_path(args.trace, "--trace")
    check_outputs([("config", args.config), ("costs file", args.costs)],
                  [("--timeline", args.timeline), ("--trace", args.trace)])


def check(args, config) -> None:
    """Check the picture options before simulating, so that a mistake is reported at once."""
    check_paths(args)
    if args.steps_window:
        parse_window(args.steps_window, config.steps)


def trace_stream(args, runner):
    """The windows ``--trace`` writes, made by the run's own pass (:func:`traced_run`):
    the runner's :meth:`~simwar.api.Runner.trace_stream`, or None where the trace is
    written after the run (:func:`write`: no ``--trace``, ``--timeline`` beside it, a run
    the one pass cannot trace; the trace mode refusing the run is told there)."""
    if not args.trace or trace_options(args):
        return None
    from simwar.executors.fast.trace import TraceUnsupported  # lazy: start-up time

    window = parse_window(args.steps_window, runner.config.steps) if args.steps_window \
        else None
    try:
        return runner.trace_stream(window)
    except TraceUnsupported:  # names the trace mode cannot make: the run's Trace, after it
        return None


def traced_run(args, runner, stream, progress):
    """The run, its ``--trace`` written by its one pass as it goes (``stream``:
    :func:`trace_stream`'s): the Result, the file noted on stderr (unless ``--quiet``)."""
    from simwar.plots.perfetto import run_writer  # lazy: start-up time of the CLI

    out = output_path(args.trace, "--trace")
    with run_writer(stream.lanes, stream.meta, out, stream.steps) as take:
        result = runner.run(progress=progress, trace=(stream, take))
    _note(args, f"simwar: wrote {out}")
    return result


def write(args, result, traced: bool = False) -> None:
    """Write what the options ask for, each file noted on stderr (unless ``--quiet``);
    ``traced``: ``--trace`` was written by the run's pass already (:func:`traced_run`)."""
    check(args, result.config)
    if args.timeline:
        out = output_path(args.timeline, "--timeline", image=True)
        window = (parse_window(args.steps_window, result.config.steps) if args.steps_window
                  else None)
        # lazy: start-up time of the CLI (matplotlib, pandas)
        from simwar.plots.timelines import stall_figure

        save_figure(stall_figure(result, window), out)
        _note(args, f"simwar: wrote {out}")
    if args.trace and not traced:
        out = output_path(args.trace, "--trace")
        window = parse_window(args.steps_window, result.config.steps) if args.steps_window \
            else None
        write_trace(result, out, window, note=lambda text: _note(args, text),
                    quiet=args.quiet)
        _note(args, f"simwar: wrote {out}")


def write_trace(result, out, window: tuple[int, int] | None = None, note=None,
                quiet: bool = False) -> None:
    """The run as Chrome trace-event JSON: its kept trace, or streamed in trace mode (with a
    bar over its steps on a terminal, unless ``quiet``); ``note(line)``: told why, when the
    trace mode refuses the run, its Trace is read instead."""
    # lazy: start-up time of the CLI (the simulator)
    from simwar.api import trace_windows
    from simwar.executors.fast.trace import TraceUnsupported  # lazy: start-up time
    from simwar.plots.perfetto import write_chrome_trace, write_run  # lazy: start-up time

    if result.engine != "simpy" and result.combined is None:  # ranks keep their Traces
        try:
            parts, lanes, meta = trace_windows(result.config, steps=window)
        except TraceUnsupported as signal:  # names the trace mode cannot make: the Trace
            parts = None
            if note is not None:
                note(f"simwar: --trace: trace mode refused: {signal}")
        if parts is not None:
            lo, hi = window if window is not None else (0, result.config.steps - 1)
            with work_bar(f"writing {Path(out).name}", "step", quiet) as bar:
                def progress(done: int) -> None:
                    if bar is not None:
                        bar(min(max(done - lo, 0), hi - lo + 1), hi - lo + 1)

                write_run(parts, lanes, meta, out, window, progress)
            return
    # tensor-parallel ranks: every rank's lanes side by side
    write_chrome_trace(result.combined if result.combined is not None else result.trace, out,
                       window)


def _note(args, text: str) -> None:
    if not args.quiet:
        print(text, file=sys.stderr)
