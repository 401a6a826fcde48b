"""The user documentation as tests read it: README.md and docs/*.md, one section by its heading.

Tests that check what the docs show (commands and their output, figures) find the section by
its heading wherever it lives, so moving text between the README and a guide moves nothing in
the tests.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: every user document, the README first
DOCUMENTS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))


def section(heading: str) -> str:
    """The text from ``heading`` (a whole line, ``## Title``) to the next heading of the same
    or a higher level, in the one document that holds it."""
    level = len(heading) - len(heading.lstrip("#"))
    found = []
    for path in DOCUMENTS:
        lines = path.read_text().splitlines(keepends=True)
        levels = _levels(lines)
        for i, line in enumerate(lines):
            if levels[i] and line.rstrip("\n") == heading:
                end = next((j for j in range(i + 1, len(lines)) if 0 < levels[j] <= level),
                           len(lines))
                found.append("".join(lines[i:end]))
    assert len(found) == 1, f"{heading!r}: in {len(found)} documents, expected one"
    return found[0]


def _levels(lines: list[str]) -> list[int]:
    """Each line's heading level (0: not a heading); a ``#`` inside a fenced code block is
    code (a YAML comment, a shell prompt), not a heading."""
    out, fenced = [], False
    for line in lines:
        if line.startswith("```"):
            fenced = not fenced
        marks = len(line) - len(line.lstrip("#"))
        out.append(marks if not fenced and marks and line[marks:marks + 1] == " " else 0)
    return out
