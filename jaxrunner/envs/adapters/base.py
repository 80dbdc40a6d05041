"""`SuiteAdapter`: the base class of every suite adapter.

An adapter is a gymnax 1.0 `Environment` around another suite's env object. It writes only
`reset_env`, `step_env` (no auto-reset: `terminated` without the time limit) and the spaces;
gymnax's base `step()` adds the same-step auto-reset from a fresh `reset_env` with its own
key, `truncated` from `is_truncated`, and `info["final_observation"]`. Because the base
`step()` is kept, both of the runner's `autoreset_mode`s ("gymnax" and "partial") work.

The state is a `SuiteState`: the suite's own state (or timestep) plus the step count of the
episode and whether the last step was a truncation, so `is_truncated` reads the suite's own
verdict (Jumanji's discount, Navix's step type, pgx's flag, a time limit) instead of
re-deriving it.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct
from gymnax.environments.environment import Environment


@struct.dataclass
class SuiteState:
    """The adapted env's state.

    Attributes:
        inner: the suite's own state (Brax `State`, Jumanji state, Navix `Timestep`, ...).
        time: `()` int32, steps taken in the episode.
        truncated: `()` bool, whether the step that produced this state ended the episode
            by a truncation (time limit) rather than a termination.
    """

    inner: Any
    time: jax.Array
    truncated: jax.Array


@struct.dataclass
class NoParams:
    """The params pytree of suites whose envs take none (Brax, Jumanji, Navix, pgx)."""


def first_state(inner: Any) -> SuiteState:
    """`SuiteState` of a freshly reset episode."""
    return SuiteState(inner=inner, time=jnp.zeros((), jnp.int32),
                      truncated=jnp.zeros((), jnp.bool_))


def next_state(state: SuiteState, inner: Any, truncated: jax.Array) -> SuiteState:
    """`SuiteState` after one step; `truncated` is the suite's own verdict for that step."""
    return SuiteState(inner=inner, time=state.time + 1,
                      truncated=jnp.asarray(truncated, jnp.bool_).reshape(()))


def split_done(terminated: Any, truncated: Any) -> tuple[jax.Array, jax.Array]:
    """`()` bool `(terminated, truncated)` with truncation only where not terminated."""
    terminated = jnp.asarray(terminated).astype(jnp.bool_).reshape(())
    truncated = jnp.asarray(truncated).astype(jnp.bool_).reshape(())
    return terminated, truncated & ~terminated


class SuiteAdapter(Environment):
    """A gymnax 1.0 env over a suite's env object (see the module docstring).

    Args:
        env: the suite's env object (kept as `self.inner`).
        env_id: the id it was made from, for `name` (defaults to its class name).

    Subclasses set `suite` (the prefix, e.g. "jumanji") and write `reset_env` and
    `step_env`. Their spaces: those fixed when the env is built are set with
    `set_spaces(observation, action)` in `__init__`; those that depend on the env params
    override `observation_space` and `action_space`. Those whose env has a legal-action mask
    set `self.action_mask` to a function `(state, params) -> bool[n]` in `__init__`.
    """

    suite: str = ""

    def __init__(self, env: Any, env_id: str | None = None):
        super().__init__()
        self.inner = env
        self.env_id = env_id if env_id is not None else type(env).__name__
        self._spaces: tuple[Any, Any] | None = None

    def set_spaces(self, observation: Any, action: Any) -> None:
        """Sets the gymnax spaces `observation_space` / `action_space` return."""
        self._spaces = (observation, action)

    def _space(self, index: int) -> Any:
        if self._spaces is None:
            raise NotImplementedError(
                f"{type(self).__name__} neither called set_spaces() in __init__ nor "
                "overrides observation_space/action_space.")
        return self._spaces[index]

    def observation_space(self, params: Any = None) -> Any:
        return self._space(0)

    def action_space(self, params: Any = None) -> Any:
        return self._space(1)

    @property
    def name(self) -> str:
        return f"{self.suite}/{self.env_id}"

    @property
    def default_params(self) -> Any:
        return NoParams()

    def is_truncated(self, state: SuiteState, params: Any) -> jax.Array:
        """`()` bool: whether the step into `state` was a truncation."""
        del params
        return state.truncated

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


def replace_fields(params: Any, overrides: dict, what: str) -> Any:
    """`params.replace(**overrides)`, with a clear error for keys that are not fields.

    Args:
        params: a flax/chex/dataclass params pytree.
        overrides: `env_config` entries to set on it.
        what: how the error names the params (e.g. "Craftax-Symbolic-v1 EnvParams").
    """
    if not overrides:
        return params
    import dataclasses

    fields = [f.name for f in dataclasses.fields(params)] if dataclasses.is_dataclass(
        params) else []
    unknown = sorted(set(overrides) - set(fields))
    if unknown:
        raise ValueError(
            f"env_config keys {unknown} are not fields of {what}; its fields are "
            f"{fields}. Pass only those keys in config.environment(env_config=...)."
        )
    return params.replace(**overrides)


def construct(factory: Any, what: str, env_id: str, env_config: dict) -> Any:
    """`factory(env_id, **env_config)` (a suite's own constructor, called `what` in the
    message); a keyword it does not take is a ValueError naming the env and the config."""
    try:
        return factory(env_id, **env_config)
    except TypeError as error:
        raise ValueError(f"{what}({env_id!r}) rejected env_config {env_config!r}: {error}. "
                         "Pass only keyword arguments its constructor takes.") from error

