"""Every file simwar writes goes through :mod:`simwar.core.files`'s atomic writer: a scan of
the source for direct writes (``Path.write_text``/``write_bytes``, ``open(..., "w")``, a
``tarfile``/``gzip`` opened on a path for writing, ``to_csv``/``to_parquet``/``savefig``/
``json.dump`` given a path) anywhere else."""

from __future__ import annotations

import ast
from pathlib import Path

SIMWAR = Path(__file__).resolve().parents[1] / "simwar"
WRITER = SIMWAR / "core" / "files.py"

#: calls that write a file when given a path (their first argument), but that simwar gives a
#: handle or a buffer (a Name) or nothing at all (``to_csv()`` returns the text)
_TO_A_HANDLE = {"to_csv", "to_parquet", "savefig", "dump"}


def _mode(call: ast.Call) -> str:
    for kw in call.keywords:
        if kw.arg == "mode" and isinstance(kw.value, ast.Constant):
            return str(kw.value.value)
    if len(call.args) >= 2 and isinstance(call.args[1], ast.Constant):
        return str(call.args[1].value)
    return "r"


def direct_writes(source: str) -> list[tuple[int, str]]:
    """The direct file writes of one module: ``(line, what)``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in ("write_text", "write_bytes") and isinstance(func, ast.Attribute):
            found.append((node.lineno, name))
        elif name == "open" and any(c in _mode(node) for c in "wax") \
                and not any(kw.arg == "fileobj" for kw in node.keywords):
            found.append((node.lineno, f"open(..., {_mode(node)!r})"))
        elif name in _TO_A_HANDLE and isinstance(func, ast.Attribute) and node.args \
                and (name != "dump" or len(node.args) > 1):  # dump(x) returns the text
            target = node.args[-1] if name == "dump" else node.args[0]
            if not isinstance(target, ast.Name):
                found.append((node.lineno, f"{name} to {ast.unparse(target)}"))
    return found


def test_the_scan_finds_direct_writes():
    assert [w for _, w in direct_writes(
        "Path(p).write_text('x')\nopen(p, 'w')\ntarfile.open(p, 'w')\nopen(p)\n"
        "df.to_csv('a.csv')\ndf.to_csv()\nfig.savefig(buf)\njson.dump(x, open(p))\n"
        "text = yaml.dump(spec(), Dumper=D)\n"
        "tarfile.open(fileobj=fh, mode='w')\n")] == [
        "write_text", "open(..., 'w')", "open(..., 'w')", "to_csv to 'a.csv'",
        "dump to open(p)"]


def test_every_write_goes_through_the_atomic_writer():
    offenders = [f"{path.relative_to(SIMWAR.parent)}:{line}: {what}"
                 for path in sorted(SIMWAR.rglob("*.py")) if path != WRITER
                 for line, what in direct_writes(path.read_text())]
    assert not offenders, "write through simwar.core.files (write_text_atomic, " \
        "write_bytes_atomic, atomic_file):\n" + "\n".join(offenders)
