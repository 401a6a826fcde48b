"""The notebooks run top to bottom, headless, and are stored with their outputs stripped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_the_notebooks_are_there():
    assert [p.name for p in NOTEBOOKS] == ["01_quickstart.ipynb", "02_barrier_policies.ipynb",
                                           "03_sweeps.ipynb", "04_dflash_verify_done.ipynb",
                                           "05_workloads.ipynb", "06_explain_and_advise.ipynb",
                                           "07_overlap_on_off.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs(path):
    book = nbformat.read(path, as_version=4)
    nbformat.validate(book)
    for cell in book.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, \
                f"{path.name}: strip outputs before committing"


@pytest.mark.slow  # a kernel start and a few short simulations each: ~5-15 s per notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_executes_headless(path, monkeypatch):
    # Jupyter's own inline backend (renders PNGs, needs no display): a figure that would show
    # as the text "<Figure size ...>" in a notebook shows so here too
    pytest.importorskip("matplotlib_inline")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    # the kernel imports the simwar of this checkout, not whichever one is installed
    inherited = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", str(ROOT) + (os.pathsep + inherited if inherited else ""))
    book = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(book, timeout=180, kernel_name="python3",
                                     resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError, with the cell and traceback, on any failure
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
    as_text = [i for i, c in enumerate(book.cells) if c.cell_type == "code" for o in c.outputs
               if "image/png" not in o.get("data", {})
               and o.get("data", {}).get("text/plain", "").startswith("<Figure size")]
    assert not as_text, f"{path.name}: cells {as_text} show a figure as text, not an image"
    assert any("image/png" in o.get("data", {}) for c in book.cells
               if c.cell_type == "code" for o in c.outputs), f"{path.name}: no figure shown"
