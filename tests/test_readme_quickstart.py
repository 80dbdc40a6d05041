"""The README quickstart runs as written, also on an env whose episodes outlast the batch."""

from __future__ import annotations

import pathlib
import re

import pytest

README = pathlib.Path(__file__).resolve().parents[1] / "README.md"


def _quickstart_code() -> str:
    text = README.read_text()
    section = text.split("## Quickstart", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_readme_quickstart__runs_on_other_envs(env_id, capsys):
    code = _quickstart_code()
    small = (code.replace('"CartPole-v1"', repr(env_id))
             .replace("num_envs_per_env_runner=256", "num_envs_per_env_runner=4")
             .replace("[64, 64]", "[8]"))
    assert small != code and repr(env_id) in small  # the sizes above are still the README's
    namespace: dict = {}
    exec(compile(small, "README.md quickstart", "exec"), namespace)  # noqa: S102
    metrics, finished = namespace["metrics"], namespace["finished"]
    if env_id == "Pendulum-v1":  # 200-step episodes, 64 steps sampled: none finished
        assert metrics.get("episode_return_mean") is None and finished == []
    else:  # CartPole episodes of a random policy last about 20 steps
        assert finished and metrics["episode_return_mean"] > 0
        assert all(float(r) == int(r) > 0 for r in finished)
