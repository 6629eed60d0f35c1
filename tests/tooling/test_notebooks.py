"""The notebooks execute from top to bottom, within a time budget, and match their source.

Each notebook in notebooks/ is written by scripts/make_notebooks.py; here it is run with
nbclient on the ``python3`` kernel (the venv's ipykernel) in a scratch folder, so the
committed copy is never modified.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
BUDGET_SECONDS = 240  # per notebook; each needs about 10-20 s of CPU on an idle machine


def _load_generator():
    spec = importlib.util.spec_from_file_location("make_notebooks", ROOT / "scripts" / "make_notebooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATOR = _load_generator()


@pytest.mark.parametrize("name", sorted(GENERATOR.NOTEBOOKS))
def test_notebook_matches_its_source(name):
    committed = nbformat.read(NOTEBOOKS / name, as_version=4)
    expected = GENERATOR.build(GENERATOR.NOTEBOOKS[name])
    assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in expected.cells], (
        f"notebooks/{name} is stale: run `.venv/bin/python scripts/make_notebooks.py --execute`")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(GENERATOR.NOTEBOOKS))
def test_notebook_executes(name, tmp_path, monkeypatch):
    # One BLAS thread per kernel, as the studies run: the suite runs tests side by side, and
    # a kernel whose BLAS threads spin-wait for a busy core ran notebook 02's transformer cell
    # in 327 s instead of 20 s (the kernel inherits this process's environment).
    for name_of_threads in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(name_of_threads, "1")
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    start = time.perf_counter()
    client = nbclient.NotebookClient(notebook, timeout=BUDGET_SECONDS, kernel_name="python3",
                                     resources={"metadata": {"path": str(tmp_path)}})
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    elapsed = time.perf_counter() - start
    assert elapsed < BUDGET_SECONDS, f"{name} took {elapsed:.0f} s"
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if o.output_type in ("display_data", "execute_result") and "image/png" in o.data]
    assert images, f"{name} drew no figure"
