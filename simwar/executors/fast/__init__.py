"""The one-pass executor."""

from simwar.executors.fast.core import *  # noqa: F401,F403
