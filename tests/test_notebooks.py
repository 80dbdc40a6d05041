"""Executes every notebook in notebooks/ with nbclient, at small sizes (JAXRUNNER_SMALL=1),
and checks that each ran without an error and rendered its plots inline."""

from __future__ import annotations

import os
import pathlib
import re

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
CELL_TIMEOUT_S = 600


def _run(name: str) -> "nbformat.NotebookNode":
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOKS)}})
    os.environ["JAXRUNNER_SMALL"] = "1"  # the kernel inherits this process's environment
    try:
        client.execute()
    finally:
        os.environ.pop("JAXRUNNER_SMALL", None)
    return notebook


def _outputs(notebook) -> list:
    return [out for cell in notebook.cells if cell.cell_type == "code"
            for out in cell.get("outputs", [])]


def _text(notebook) -> str:
    parts = []
    for out in _outputs(notebook):
        if "text" in out:
            parts.append(out["text"])
        parts.append(out.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def _num_images(notebook) -> int:
    return sum("image/png" in out.get("data", {}) for out in _outputs(notebook))


def test_notebooks__all_listed():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == [
        "00_quickstart.ipynb", "01_ppo_cartpole.ipynb", "02_distributed.ipynb",
        "03_custom_env.ipynb", "04_ppo_env_suites.ipynb", "05_fused_ppo.ipynb"]


@pytest.mark.timeout(900)
def test_notebook__00_quickstart():
    notebook = _run("00_quickstart.ipynb")
    text = _text(notebook)
    assert "identical next sample: True" in text
    assert "continues at t_started=" in text
    assert _num_images(notebook) == 1


@pytest.mark.timeout(900)
def test_notebook__01_ppo_cartpole():
    notebook = _run("01_ppo_cartpole.ipynb")
    text = _text(notebook)
    assert "10 iterations, 11,264 env steps" in text  # + the iteration written out
    assert "greedy mean return:" in text
    assert _num_images(notebook) == 1


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_notebook__02_distributed():
    notebook = _run("02_distributed.ipynb")
    text = _text(notebook)
    assert "driver seq: 5 runners: [5, 5]" in text  # 1 initial push + 4 iterations
    assert _num_images(notebook) == 1


@pytest.mark.timeout(900)
def test_notebook__03_custom_env():
    notebook = _run("03_custom_env.ipynb")
    text = _text(notebook)
    assert "random policy: mean return" in text and "trained policy: mean return" in text
    assert "cannot be traced by JAX" in text
    assert _num_images(notebook) == 1


@pytest.mark.timeout(900)
def test_notebook__04_ppo_env_suites():
    pytest.importorskip("brax")
    pytest.importorskip("navix")
    notebook = _run("04_ppo_env_suites.ipynb")
    text = _text(notebook)
    for env in ("brax/inverted_pendulum", "navix/Navix-Empty-5x5-v0"):
        assert f"{env}: 3 iterations, 1,536 env steps" in text  # 16 envs x 32 steps x 3
        assert re.search(re.escape(env) + r": \d+ terminated, \d+ truncated of \d+ finished",
                         text), text
    assert "mean return None" not in text  # both finished episodes while training
    assert _num_images(notebook) == 1
