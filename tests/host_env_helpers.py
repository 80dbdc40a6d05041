"""Envs shared by the host-env tests and the Ray workers they start (not a test module).

Pickled by value (for Ray and for gymnasium's sub-process vector envs), so workers and
sub-processes need nothing from `tests/`.
"""

from __future__ import annotations

import sys

import cloudpickle
import gymnasium as gym
import numpy as np
import ray.cloudpickle

ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Corridor(gym.Env):
    """RLlib-style gymnasium env written with a `config` constructor argument: walk right
    from 0 to `corridor_length` (reward -0.1 per step, +1 at the end), or time out."""

    def __init__(self, config=None):
        config = config or {}
        self.end = int(config.get("corridor_length", 5))
        self.observation_space = gym.spaces.Box(0.0, float(self.end), (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.vector_index = getattr(config, "vector_index", None)
        self.pos = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = 0
        return np.array([self.pos], np.float32), {}

    def step(self, action):
        self.pos = max(0, self.pos + (1 if int(action) == 1 else -1))
        terminated = self.pos >= self.end
        return (np.array([self.pos], np.float32), 1.0 if terminated else -0.1, terminated,
                False, {})


def cartpole_from_context(ctx):
    """A Tune-style creator: gymnasium's CartPole built from the `EnvContext` dict."""
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    return CartPoleEnv(**ctx)


def cartpole_vector_from_context(ctx):
    """A Tune-style vector creator: gets `num_envs` in the context (vector entry point)."""
    from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv

    return CartPoleVectorEnv(**ctx)
