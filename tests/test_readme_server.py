"""The guide's "Your own server" (docs/guide-your-server.md): every command it shows runs on the
shipped files and prints what it shows.

Each ``$ `` line of the section's code blocks is run (``simwar ...`` in-process, ``head -N
FILE``), in a fresh directory holding a link to ``examples/``; the lines shown after it must
appear in its output, in order (``...`` stands for lines left out; blanks at line ends are
ignored). The commands run in the order shown, so a later one reads what an earlier one wrote.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
from pathlib import Path

from docs_text import section

from simwar.cli.app import main

ROOT = Path(__file__).resolve().parents[1]


def _section() -> str:
    return section("## Your own server")


def _commands(section: str) -> list[tuple[str, list[str]]]:
    """``(command, shown lines)`` of every ``$ `` line in the section's code blocks."""
    out: list[tuple[str, list[str]]] = []
    inside = False
    for line in section.splitlines():
        if line.startswith("```"):
            inside = not inside
            current = None
            continue
        if not inside:
            continue
        if line.startswith("$ "):
            out.append((line[2:], []))
            current = out[-1]
        elif current is not None:
            current[1].append(line.rstrip())
    return out


def assert_prints(command: str, shown: list[str]) -> None:
    """``command`` prints the ``shown`` lines in this order (``...`` and blank lines stand for
    lines left out)."""
    lines = [x.rstrip() for x in _run(command).splitlines()]
    i = 0
    for want in shown:
        if want.strip() in ("...", ""):
            continue
        while i < len(lines) and lines[i] != want:
            i += 1
        assert i < len(lines), f"{command}: not printed (in this order): {want!r}"
        i += 1


def _run(command: str) -> str:
    argv = shlex.split(command)
    if argv[0] == "head":
        n = int(argv[1].lstrip("-"))
        return "".join(Path(argv[2]).read_text().splitlines(keepends=True)[:n])
    assert argv[0] == "simwar", command
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv[1:])
    assert code == 0, (command, err.getvalue())
    return out.getvalue()


def test_the_section_uses_shipped_files_only():
    section = _section()
    for name in re.findall(r"`(examples/[\w./-]+)`", section):
        assert (ROOT / name).exists(), name
    commands = _commands(section)
    assert len(commands) >= 5
    for command, _ in commands:
        for word in shlex.split(command):
            if word.startswith("examples/"):
                assert (ROOT / word).exists(), word


def test_every_command_prints_what_the_section_shows(tmp_path):
    os.symlink(ROOT / "examples", tmp_path / "examples")
    cwd = Path.cwd()
    os.chdir(tmp_path)
    try:
        for command, shown in _commands(_section()):
            assert_prints(command, shown)
    finally:
        os.chdir(cwd)
