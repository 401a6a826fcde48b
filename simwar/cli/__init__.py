"""The ``simwar`` command."""

from simwar.cli.app import main

__all__ = ["main"]
