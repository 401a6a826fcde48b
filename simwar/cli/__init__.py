"""The ``simwar`` command (the console script ``simwar.cli:main``): see :mod:`simwar.cli.app`.

The command line does no linear algebra worth a thread pool: numpy's OpenBLAS is held to one
thread unless the environment says otherwise (its pool of spinning threads cost ~70 ms of
CPU at numpy's import on this project's 2-core machine, a fifth of a short ``simwar run``,
and more on larger machines; a sweep's worker processes inherit the setting). Likewise
pydantic's plugins are off unless the environment says otherwise: looking for them scans
every installed distribution's entry points when the config's first model is built (~9 ms
of every command's start-up), and the command line uses none.

With the plugins off, :mod:`importlib.metadata` is deferred (:func:`_defer_metadata`):
pydantic's plugin loader imports it at its top, for that scan, when the config's validator
is first built, and with no scan to run, that import (with the ``email`` package it pulls
in, about 60 M instructions, a twentieth of a first ``simwar run``) buys nothing. The module
runs, whole, at the first use of any of its names, by whatever uses it (pydantic's scan
where ``PYDANTIC_DISABLE_PLUGINS`` turns the plugins back on, a library reading a version);
where it is imported already (a program calling :func:`main`), it is left alone.
"""

import _thread
import os
import sys
import types

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")

#: ``PYDANTIC_DISABLE_PLUGINS`` values that turn every plugin off (pydantic's own list,
#: ``pydantic/plugin/_loader.py``); with another, pydantic scans and nothing is deferred
PLUGINS_OFF = ("__all__", "1", "true")
#: a module's import metadata: what an import statement reads of a module it finds in
#: ``sys.modules`` (read without running a deferred module)
_IMPORT_NAMES = frozenset({"__spec__", "__name__", "__path__", "__loader__", "__package__",
                           "__file__", "__cached__", "__class__"})


class _Deferred(types.ModuleType):
    """A module whose code runs at the first use of one of its names (not at the reads of
    :data:`_IMPORT_NAMES` that an import statement makes).

    The standard library's :class:`importlib.util.LazyLoader` runs its module at any
    attribute's read, ``__spec__`` included, which Python 3.11's import statement reads of a
    module it finds in ``sys.modules``: ``import importlib.metadata`` in pydantic would run
    it there and then. Its class changes to a plain module's once its code has run (a
    thread using it meanwhile waits for that; its code's own imports, which read and set
    its names as it runs, do not)."""

    def __getattribute__(self, name):
        if name not in _IMPORT_NAMES:
            _run(self)
        return types.ModuleType.__getattribute__(self, name)

    def __setattr__(self, name, value):
        _run(self)
        types.ModuleType.__setattr__(self, name, value)

    def __delattr__(self, name):
        _run(self)
        types.ModuleType.__delattr__(self, name)


#: held while a deferred module's code runs (another thread using it waits, then finds it run)
_LOCK = _thread.RLock()
#: the deferred modules whose code is running (in the thread that holds :data:`_LOCK`)
_RUNNING: set[int] = set()


def _run(module: types.ModuleType) -> None:
    """Run a :class:`_Deferred` module's code, once; a failure is an import's (the module
    leaves ``sys.modules``, the error propagates)."""
    with _LOCK:
        if type(module) is not _Deferred or id(module) in _RUNNING:
            return  # run already (or running, in this thread: its code's own imports)
        spec = types.ModuleType.__getattribute__(module, "__spec__")
        _RUNNING.add(id(module))
        try:
            spec.loader.exec_module(module)
        except BaseException:
            sys.modules.pop(spec.name, None)
            raise
        finally:
            _RUNNING.discard(id(module))
        object.__setattr__(module, "__class__", types.ModuleType)


def _defer_metadata() -> None:
    """Make :mod:`importlib.metadata` a :class:`_Deferred` module, unless it is imported
    already or pydantic's plugins are on (see the module docstring)."""
    name = "importlib.metadata"
    if name in sys.modules or os.environ.get("PYDANTIC_DISABLE_PLUGINS") not in PLUGINS_OFF:
        return
    import importlib
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    object.__setattr__(module, "__class__", _Deferred)
    sys.modules[name] = module
    importlib.metadata = module  # as an import sets it (``import importlib.metadata as m``)


_defer_metadata()

from simwar.cli.app import main  # noqa: E402  (after the settings read at import)

__all__ = ["main"]
