"""The fused loop as documented: the README's "Inside your own jit" example runs as written
(small sizes) and the fused PPO notebook executes; the metrics per seed and the runner round
trip are what they say."""

from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _fused_example() -> str:
    section = README.read_text().split("## Inside your own jit", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_inside_your_own_jit__runs(capsys):
    code = _fused_example()
    small = (code.replace("num_envs_per_env_runner=64", "num_envs_per_env_runner=2")
             .replace("rollout_fragment_length=32", "rollout_fragment_length=16")
             .replace("[64, 64]", "[8]").replace("num_iterations=10", "num_iterations=3"))
    assert small.count("=2,") == 1 and "[8]" in small  # the sizes above are the README's
    namespace: dict = {}
    exec(compile(small, "README.md fused example", "exec"), namespace)  # noqa: S102
    returns = namespace["returns"]
    assert returns.shape == (8, 3)
    assert np.isfinite(returns[:, -1]).all()  # CartPole episodes end within 48 steps
    assert capsys.readouterr().out.strip() == str(3 * 16 * 2)
    state0, sampler = namespace["state0"], namespace["sampler"]
    assert int(state0.counters.vector_steps) == 3 * 16


@pytest.mark.timeout(900)
def test_notebook__05_fused_ppo():
    pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    from notebook_helpers import num_images, output_text, run_notebook

    notebook = run_notebook("05_fused_ppo.ipynb")
    text = output_text(notebook)
    assert "fused: 8 seeds x 3 iterations" in text
    assert "same episode_return_mean: True" in text
    # Random CartPole episodes last about 20 steps: every seed reaches 15 within 12 iterations.
    assert "to a return of 15.0:" in text and "seeds that reached it: 8 of 8" in text, text
    assert "back in the fused loop at" in text
    assert num_images(notebook) == 1
