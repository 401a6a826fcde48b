"""The ``simwar`` command (the console script ``simwar.cli:main``): see :mod:`simwar.cli.app`."""

from simwar.cli.app import main

__all__ = ["main"]
