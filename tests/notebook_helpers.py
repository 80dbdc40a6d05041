"""Runs a notebook of notebooks/ with nbclient at small sizes (JAXRUNNER_SMALL=1) and reads
its outputs; shared by tests/test_notebooks.py and tests/test_fused_loop.py."""

from __future__ import annotations

import os
import pathlib

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
CELL_TIMEOUT_S = 600


def run_notebook(name: str):
    """The executed `nbformat.NotebookNode` of `notebooks/<name>` (raises
    `nbclient.exceptions.CellExecutionError` when a cell fails)."""
    import nbclient
    import nbformat

    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}})
    # The kernel inherits this process's environment: small sizes, the run's compilation
    # cache and most XLA optimisations off as in the test processes (tests/conftest.py).
    # At small sizes a notebook's time is its compiles: 15-28 % less this way, measured
    # on notebooks 01, 02, 03 and 05 (a user's kernel keeps XLA's defaults).
    os.environ["JAXRUNNER_SMALL"] = "1"
    try:
        client.execute()
    finally:
        os.environ.pop("JAXRUNNER_SMALL", None)
    return notebook


def outputs(notebook) -> list:
    return [out for cell in notebook.cells if cell.cell_type == "code"
            for out in cell.get("outputs", [])]


def output_text(notebook) -> str:
    """Every code cell's printed text and plain-text results, joined by newlines."""
    parts = []
    for out in outputs(notebook):
        if "text" in out:
            parts.append(out["text"])
        parts.append(out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def num_images(notebook) -> int:
    """PNG images the notebook rendered inline."""
    return sum("image/png" in out.get("data", {}) for out in outputs(notebook))
