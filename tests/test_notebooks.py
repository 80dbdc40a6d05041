"""Executes every notebook in notebooks/ with nbclient, at small sizes (JAXRUNNER_SMALL=1),
and checks that each ran without an error and rendered its plots inline."""

from __future__ import annotations

import re

import pytest

pytest.importorskip("nbformat")
pytest.importorskip("nbclient")

from notebook_helpers import NOTEBOOKS, num_images, output_text, run_notebook  # noqa: E402


def test_notebooks__all_listed():
    assert sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")) == [
        "00_quickstart.ipynb", "01_ppo_cartpole.ipynb", "02_distributed.ipynb",
        "03_custom_env.ipynb", "04_ppo_env_suites.ipynb", "05_fused_ppo.ipynb"]


@pytest.mark.timeout(900)
def test_notebook__00_quickstart():
    notebook = run_notebook("00_quickstart.ipynb")
    text = output_text(notebook)
    assert "identical next sample: True" in text
    assert "continues at t_started=" in text
    assert num_images(notebook) == 1


@pytest.mark.timeout(900)
def test_notebook__01_ppo_cartpole():
    notebook = run_notebook("01_ppo_cartpole.ipynb")
    text = output_text(notebook)
    assert "10 iterations, 11,264 env steps" in text  # + the iteration written out
    assert "greedy mean return:" in text
    assert num_images(notebook) == 1


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_notebook__02_distributed():
    notebook = run_notebook("02_distributed.ipynb")
    text = output_text(notebook)
    assert "driver seq: 5 runners: [5, 5]" in text  # 1 initial push + 4 iterations
    assert num_images(notebook) == 1


@pytest.mark.timeout(900)
def test_notebook__03_custom_env():
    notebook = run_notebook("03_custom_env.ipynb")
    text = output_text(notebook)
    assert "random policy: mean return" in text and "trained policy: mean return" in text
    assert "cannot be traced by JAX" in text
    assert num_images(notebook) == 1


@pytest.mark.timeout(900)
def test_notebook__04_ppo_env_suites():
    pytest.importorskip("brax")
    pytest.importorskip("navix")
    notebook = run_notebook("04_ppo_env_suites.ipynb")
    text = output_text(notebook)
    for env in ("brax/inverted_pendulum", "navix/Navix-Empty-5x5-v0"):
        assert f"{env}: 3 iterations, 1,536 env steps" in text  # 16 envs x 32 steps x 3
        assert re.search(re.escape(env) + r": \d+ terminated, \d+ truncated of \d+ finished",
                         text), text
    assert "mean return None" not in text  # both finished episodes while training
    assert num_images(notebook) == 1
