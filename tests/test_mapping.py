"""`policy_mapping_fn` errors: Python branching on episode values, and `episode.coin`."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxrunner.core import mapping as mapping_module
from jaxrunner.core.mapping import ModuleChoice, mapping_episode, trace_mapping

AGENTS = ("player_o", "player_x")
MODULES = ("main", "opponent")


def _python_if_on_coin(agent_id, episode):
    if episode.coin():  # a Python branch on a traced () bool
        return "main"
    return "opponent"


def _python_int_on_index(agent_id, episode):
    return MODULES[int(episode.index) % 2]


@pytest.mark.parametrize("fn", [_python_if_on_coin, _python_int_on_index])
def test_mapping__python_branch_is_the_documented_type_error(fn):
    with pytest.raises(TypeError, match=r"episode\.choose\(condition") as info:
        trace_mapping(fn, AGENTS, MODULES)
    # The tracer error is the cause, not what the user sees.
    assert not isinstance(info.value, jax.errors.JAXTypeError)
    assert isinstance(info.value.__cause__, jax.errors.JAXTypeError)
    assert isinstance(info.value, mapping_module.MappingTraceError)


def test_mapping__coin_is_shared_by_all_agents_and_drives_choose():
    def mapping(agent_id, episode):
        return episode.choose(episode.coin() == (agent_id == "player_x"), "main", "opponent")

    traced = trace_mapping(mapping, AGENTS, MODULES)
    assert traced.candidates == {"player_o": MODULES, "player_x": MODULES}
    key = jax.random.key(3)
    sides = []
    for index in range(32):
        episode = mapping_episode(key, 0, index, MODULES)
        coin = episode.coin()
        assert coin.shape == () and coin.dtype == np.bool_
        assert bool(coin) == bool(episode.coin())  # same draw on every call
        choice = [mapping(agent, episode) for agent in AGENTS]
        assert all(isinstance(c, ModuleChoice) for c in choice)
        # Exactly one side plays "main" in each episode.
        assert sorted(c.module_id for c in choice) == ["main", "opponent"]
        sides.append(bool(coin))
    assert 0 < sum(sides) < len(sides)  # both sides come up over 32 episodes
