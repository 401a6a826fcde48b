"""The ``simwar`` command (the console script ``simwar.cli:main``): see :mod:`simwar.cli.app`.

The command line does no linear algebra worth a thread pool: numpy's OpenBLAS is held to one
thread unless the environment says otherwise (its pool of spinning threads cost ~70 ms of
CPU at numpy's import on this project's 2-core machine, a fifth of a short ``simwar run``,
and more on larger machines; a sweep's worker processes inherit the setting). Likewise
pydantic's plugins are off unless the environment says otherwise: looking for them scans
every installed distribution's entry points when the config's first model is built (~9 ms
of every command's start-up), and the command line uses none.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

from simwar.cli.app import main  # noqa: E402  (after the settings read at import)

__all__ = ["main"]
