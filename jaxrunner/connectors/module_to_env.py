"""Module-to-env connector pieces."""

from __future__ import annotations

import gymnasium as gym

from jaxrunner.connectors.actions import make_actions_for_env
from jaxrunner.connectors.base import ConnectorV2


class NormalizeAndClipActions(ConnectorV2):
    """RLlib's `NormalizeAndClipActions`: Box actions taken as lying in [-1, 1] are mapped
    to the bounds and clipped (`normalize_actions`), or only clipped (`clip_actions`);
    the result is cast to the env's action dtype. The episode keeps the module's action."""

    reads_context = False

    def __init__(self, action_space: gym.spaces.Space, *, normalize_actions: bool,
                 clip_actions: bool, env_dtype):
        self._transform = make_actions_for_env(action_space, normalize_actions=normalize_actions,
                                               clip_actions=clip_actions, env_dtype=env_dtype)

    def __call__(self, state, actions, ctx):
        return state, self._transform(actions)
