"""A MinAtar env for the tests of what the rollout reads from an env step's jaxpr
(`tests/test_finiteness.py`, `tests/test_value_range.py`)."""

import gymnax
import jax.numpy as jnp
from gymnax.environments import environment


class NanOnceBreakout(environment.Environment):
    """Breakout-MinAtar whose observation holds a NaN at the step where time is 5 and the
    ball's column is even: large (1,600 bytes a sub-env) and not finite by construction,
    so the check still tests it."""

    def __init__(self):
        self.inner, _ = gymnax.make("Breakout-MinAtar")

    @property
    def default_params(self):
        return self.inner.default_params

    def step_env(self, key, state, action, params):
        obs, state, reward, done, info = self.inner.step_env(key, state, action, params)
        poisoned = (state.time == 5) & (state.ball_x % 2 == 0)
        obs = obs.at[0, 0, 0].set(jnp.where(poisoned, jnp.nan, obs[0, 0, 0]))
        return obs, state, reward, done, info

    def reset_env(self, key, params):
        return self.inner.reset_env(key, params)

    def action_space(self, params=None):
        return self.inner.action_space(params)

    def observation_space(self, params):
        return self.inner.observation_space(params)
