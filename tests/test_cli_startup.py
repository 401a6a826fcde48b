"""The command line's start-up settings (simwar.cli): with pydantic's plugins off,
``importlib.metadata`` is deferred and stays unrun through a ``simwar run``; it runs, whole,
at the first use of one of its names (by a ``from`` import too, and from several threads at
once), and is imported as usual when the plugins are on or it was imported already."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: prints the type of ``importlib.metadata`` after a ``simwar run`` (its arguments)
AFTER_RUN = ("import sys; from simwar.cli import main; code = main(); "
             "print(type(sys.modules['importlib.metadata']).__name__, code)")


def python(code: str, *args: str, **env: str) -> str:
    """The last line of ``python -c code args``' stdout, in a fresh process with ``env``
    added to this one's, the cache of validated configs off (a run builds the validator)."""
    environ = {**os.environ, "PYTHONPATH": str(REPO), "SIMWAR_NO_CACHE": "1"}
    environ.pop("PYDANTIC_DISABLE_PLUGINS", None)
    environ.update(env)
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=environ,
                         capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_a_run_leaves_importlib_metadata_unrun():
    assert python(AFTER_RUN, "run", "--set", "steps=30", "--set", "warmup_steps=5",
                  "--quiet") == "_Deferred 0"


def test_with_plugins_on_it_is_imported_as_usual():
    assert python(AFTER_RUN, "run", "--set", "steps=30", "--set", "warmup_steps=5",
                  "--quiet", PYDANTIC_DISABLE_PLUGINS="some_plugin") == "module 0"


def test_a_deferred_module_runs_at_its_first_use():
    code = """
import sys, threading
import simwar.cli
import importlib.metadata as m
import pydantic.plugin._loader  # imports it by name: not a use
assert type(m).__name__ == "_Deferred" and m is sys.modules["importlib.metadata"]
assert m.__name__ == "importlib.metadata" and m.__spec__.name == "importlib.metadata"
import pydantic
found = []
threads = [threading.Thread(target=lambda: found.append(m.version("pydantic")))
           for _ in range(8)]
for t in threads: t.start()
for t in threads: t.join()
from importlib.metadata import distributions
assert found == [pydantic.VERSION] * 8 and type(m).__name__ == "module"
assert any(d.metadata["Name"] == "pydantic" for d in distributions())
print("ok")
"""
    assert python(code) == "ok"


def test_an_imported_module_is_left_alone():
    code = ("import importlib.metadata as m, sys; import simwar.cli; "
            "print(type(m).__name__, sys.modules['importlib.metadata'] is m)")
    assert python(code) == "module True"
