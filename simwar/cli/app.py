"""The ``simwar`` command line: :func:`main`, the parser and the table of commands.

Each command is one module of this package, listed by name in :data:`COMMANDS` (the order
of ``simwar --help``). ``simwar COMMAND ...`` imports that command's module only (its
parser is the same subparser the whole parser holds); ``simwar --help``, no command or an
unknown one import them all, for the list of commands and argparse's own errors. A command
module has
``HELP`` and ``DESCRIPTION`` (its lines in ``--help``), ``add_arguments(parser)`` and
``command(args) -> exit code``; what several commands share is :mod:`simwar.cli.common`.
The command line is the only place that chooses file names and prints: any error a user
can cause is reported as one line on stderr (``simwar: error: ...``) with a non-zero
exit, before anything is written; ``tests/data/bad`` holds the corpus.

Imports: the command modules, which import nothing heavy at their top (the simulator,
pandas, matplotlib and pydantic load inside each command), so that ``simwar --help`` and
an argument error cost no more than the standard library.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import sys

from simwar import __version__
from simwar.cli.common import UserError, start_up
from simwar.core.files import interrupts_noted

#: command name -> its module under ``simwar.cli``, in the order ``simwar --help`` lists them
COMMANDS = {
    "run": "run",
    "sweep": "sweep",
    "results": "results",
    "validate": "validate",
    "show": "show",
    "plot": "plot",
    "harness": "harness",
    "calibrate": "calibrate",
    "compare": "compare",
    "import": "capture",  # the module cannot be named after the keyword
    "explain": "explain",
    "advise": "advise",
    "races": "races",
}


def main(argv: list[str] | None = None) -> int:
    """Run ``simwar ARGV`` (default: ``sys.argv[1:]``) and return its exit code."""
    in_process = argv is not None  # called by a program that goes on after it
    try:
        return _main(sys.argv[1:] if argv is None else argv)
    finally:
        if in_process:  # its start-up's objects are garbage like any others once it returns
            gc.unfreeze()
        else:  # the process exits: its last collection would walk every object for nothing
            gc.freeze()


def _main(argv: list[str]) -> int:
    with start_up():
        parser = build_parser(argv[0] if argv and argv[0] in COMMANDS else None)
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        # lazy: start-up time of the CLI (the config schema loads pydantic)
        from simwar.config import ConfigError

    try:
        # Ctrl-C is noted as well as raised, so that one swallowed on its way (inside a
        # library call) still stops the command and no file is committed after it
        with interrupts_noted():
            return int(args.func(args) or 0)
    except (UserError, ConfigError) as e:
        print(f"simwar: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("simwar: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except OSError as e:  # a path given on the command line cannot be read or written
        print(f"simwar: error: {os_error_text(e)}", file=sys.stderr)
        return 2


def os_error_text(e: OSError) -> str:
    """``PATH: what went wrong``, one line, for an OSError (``str(e)`` when it names no file)."""
    if e.filename is None or not e.strerror:
        return str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"{e.filename}: {e.strerror[:1].lower()}{e.strerror[1:]}"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``simwar``: one subparser per entry of :data:`COMMANDS`, or, given
    ``command``, that command's alone (the others' modules are not imported: start-up time,
    each command's imports are its own)."""
    parser = argparse.ArgumentParser(
        prog="simwar", description="Simulate LLM-serving overlap scheduling and its WAR barriers.")
    parser.add_argument("--version", action="version", version=f"simwar {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        if command is not None and name != command:
            continue
        # a command's module by name: start-up time (see the module docstring)
        module = importlib.import_module(f"simwar.cli.{module_name}")
        p = sub.add_parser(name, help=module.HELP, description=module.DESCRIPTION)
        module.add_arguments(p)
        p.set_defaults(func=module.command)
    return parser


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
