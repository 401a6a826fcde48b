"""The package's layering stays honest: no import cycle, no arrow that runs upward.

The layers are those of docs/design.md ("Packages and layers"). The test reads every module of
``simwar/`` with ``ast`` (imports inside functions included) and fails on:

- an import of a higher layer, or of a package of the same layer that is not listed as allowed;
- a forbidden arrow: a reader (``capture``) running the simulator, the GPU harness importing the
  capture reader;
- an import cycle between modules;
- an import of the package's own modules inside a function without a comment saying why (the
  only reasons are start-up time and the GPU side, and the comment says which);
- a module-level third-party import in ``core`` other than numpy (the GPU machine has torch
  and numpy only);
- an import of ``lab`` (the GPU scripts and the checkers of their data, beside the package in
  a source checkout and never installed: the lab imports simwar, never the reverse).
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "simwar"

#: package (first component under simwar) -> layer; top-level modules are listed by name
LAYERS = {"core": 0, "analysis": 1, "config": 1, "builder": 2, "executors": 3, "api": 4,
          "capture": 5, "harness": 6, "plots": 6, "study": 6, "fit": 6, "cli": 7,
          "__init__": 0, "__main__": 8}
#: imports between different packages of one layer that the design allows
SAME_LAYER = {("fit", "harness"), ("fit", "plots"), ("study", "plots"),
              ("__init__", "core")}  # the package's lazy attributes
#: arrows the layers would allow but the design forbids
FORBIDDEN = {("capture", "builder"): "a reader never runs the simulator",
             ("capture", "executors"): "a reader never runs the simulator",
             ("capture", "api"): "a reader never runs the simulator",
             ("harness", "capture"): "the GPU harness never imports the capture reader"}
CORE_THIRD_PARTY = {"numpy"}
#: the top-level package of the lab (lab/), which no module of simwar may import
LAB = "lab"


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _package(module: str) -> str:
    parts = module.split(".")
    return "__init__" if len(parts) == 1 else parts[1]


def _target(name: str) -> str | None:
    """The simwar module an imported name lives in (the longest known prefix)."""
    if name != "simwar" and not name.startswith("simwar."):
        return None
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, path: Path, source: str | None = None):
        self.module = module
        self.is_package = path.name == "__init__.py"
        self.lines = (path.read_text() if source is None else source).splitlines()
        self.depth = 0
        self.edges: list[tuple[str, int, bool]] = []  # (target, line, inside a function)
        self.third_party: list[tuple[str, int]] = []
        self.lab: list[int] = []  # lines importing the lab, at any depth

    def _function(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def _absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        base = self.module.split(".")
        if not self.is_package:
            base = base[:-1]
        base = base[: len(base) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))

    def visit_Import(self, node: ast.Import):
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom):
        module = self._absolute(node)
        for alias in node.names:
            candidate = f"{module}.{alias.name}"
            self._add(candidate if candidate in MODULES else module, node)

    def _add(self, name: str, node) -> None:
        target = _target(name)
        if target is None:
            top = name.split(".")[0]
            if top == LAB:
                self.lab.append(node.lineno)
                return
            # at module top only: a method may import pandas for a frame (Trace.frames)
            if top and top not in sys.stdlib_module_names and top != "__future__" \
                    and not self.depth:
                self.third_party.append((top, node.lineno))
            return
        edge = (target, node.lineno, self.depth > 0)
        if target != self.module and edge not in self.edges:
            self.edges.append(edge)


def _scan() -> dict[str, _Imports]:
    out = {}
    for module, path in MODULES.items():
        visitor = _Imports(module, path)
        visitor.visit(ast.parse(path.read_text(), str(path)))
        out[module] = visitor
    return out


SCANS = _scan()


def test_no_import_runs_upward_or_across_a_forbidden_arrow():
    bad = []
    for module, scan in SCANS.items():
        src = _package(module)
        for target, line, _ in scan.edges:
            dst = _package(target)
            if src == dst or dst == "__init__":
                continue
            where = f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} {module} -> {target}"
            if (src, dst) in FORBIDDEN:
                bad.append(f"{where}: {FORBIDDEN[src, dst]}")
            elif LAYERS[dst] > LAYERS[src]:
                bad.append(f"{where}: layer {LAYERS[src]} imports layer {LAYERS[dst]}")
            elif LAYERS[dst] == LAYERS[src] and (src, dst) not in SAME_LAYER:
                bad.append(f"{where}: same layer, not an allowed arrow")
    assert not bad, "\n".join(bad)


def test_no_import_cycle_between_modules():
    graph = defaultdict(set)
    for module, scan in SCANS.items():
        for target, _, _ in scan.edges:
            # a package's __init__ importing its own submodules is not a cycle of the design
            if not (target.startswith(module + ".") and MODULES[module].name == "__init__.py"):
                graph[module].add(target)
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in list(MODULES):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_imports_inside_functions_say_why():
    bad = []
    for module, scan in SCANS.items():
        for target, line, inside in scan.edges:
            if not inside:
                continue
            lines = scan.lines
            here = lines[line - 1]
            above = lines[line - 2] if line >= 2 else ""
            if "#" not in here and not above.strip().startswith("#"):
                bad.append(f"{MODULES[module].relative_to(PACKAGE.parent)}:{line} imports "
                           f"{target} inside a function without a comment saying why")
    assert not bad, "\n".join(bad)


def test_core_imports_only_the_standard_library_and_numpy():
    bad = [f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} imports {top}"
           for m, scan in SCANS.items() if _package(m) == "core"
           for top, line in scan.third_party if top not in CORE_THIRD_PARTY]
    assert not bad, "\n".join(bad)


def test_no_module_imports_the_lab():
    bad = [f"{MODULES[m].relative_to(PACKAGE.parent)}:{line} imports {LAB} (the lab imports "
           f"simwar, never the reverse: what both need stays in simwar)"
           for m, scan in SCANS.items() for line in scan.lab]
    assert not bad, "\n".join(bad)


def test_the_lab_scan_sees_an_import_of_the_lab():
    # the rule above holds only if the scan records such an import, wherever it is
    source = "import lab.server\ndef f():\n    from lab import check\n"
    scan = _Imports("simwar.example", PACKAGE / "example.py", source)
    scan.visit(ast.parse(source))
    assert scan.lab == [1, 3]


def test_every_package_is_in_a_layer():
    assert {_package(m) for m in MODULES} <= set(LAYERS)
