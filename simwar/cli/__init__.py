"""The ``simwar`` command (the console script ``simwar.cli:main``): see :mod:`simwar.cli.app`.

The command line does no linear algebra worth a thread pool: numpy's OpenBLAS is held to one
thread unless the environment says otherwise (its pool of spinning threads cost ~70 ms of
CPU at numpy's import on this project's 2-core machine, a fifth of a short ``simwar run``,
and more on larger machines; a sweep's worker processes inherit the setting).
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from simwar.cli.app import main  # noqa: E402  (after the setting numpy reads at import)

__all__ = ["main"]
