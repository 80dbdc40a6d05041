"""pgx (`pip install pgx`): `"pgx/<id>"`, or a pgx env object.

pgx envs have `init(key) -> State` and `step(state, action, key) -> State` with
`State(current_player, observation, legal_action_mask, rewards[num_players], terminated,
truncated)`. Taking an illegal action ends the game with a penalty for the mover.

* One-player games (`2048`, the MinAtar ports) become the single-agent `PgxEnv`: reward
  `rewards[0]`, pgx's own `terminated` / `truncated`, `Discrete(num_actions)` actions and
  a `Box` of `observation_shape` (bool observations stay bool).
* Games of two or more players become the turn-based multi-agent `PgxMultiAgentEnv`
  (`jaxrunner.envs.multi_agent` protocol, for `MultiAgentEnvRunner`): agents
  `"player_0"`, `"player_1"`, ...; `agents_to_act` is True for `current_player` only; each
  agent observes the board from its own side (pgx's `observe(state, player_id)`); each
  agent's reward is its entry of pgx's `rewards`, so a zero-sum game pays the loser its
  penalty in the step the winner moves (the runner credits it to the loser's last move).
  pgx picks who moves first at random in some games; the adapter keeps that.

Both expose pgx's `legal_action_mask` as `action_mask(state, params)`: `bool[num_actions]`
for `PgxEnv`; `{agent: bool[num_actions]}` for `PgxMultiAgentEnv` (the legal moves for the
player to move, all True for the others, whose actions are ignored). `env_config` goes to
`pgx.make(id, **env_config)`.
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from gymnax.environments import spaces as gx

from jaxrunner.envs.adapters.base import (NoParams, SuiteAdapter, SuiteState, construct,
                                          first_state, next_state, split_done)
from jaxrunner.envs.multi_agent import ALL, MultiAgentEnv


def _observation_box(env: Any) -> gx.Box:
    state = jax.eval_shape(env.init, jax.random.key(0))
    shape = tuple(int(d) for d in state.observation.shape)
    dtype = np.dtype(state.observation.dtype)
    if dtype == np.bool_:
        return gx.Box(np.zeros(shape, np.bool_), np.ones(shape, np.bool_), shape, jnp.bool_)
    return gx.Box(np.full(shape, -np.inf, dtype), np.full(shape, np.inf, dtype), shape, dtype)


def _env_id(env: Any) -> str:
    return str(getattr(env, "id", type(env).__name__))


class PgxEnv(SuiteAdapter):
    """A one-player pgx env object (`pgx.make("2048")`).

    Args:
        env: the pgx `Env` (`num_players == 1`).
        env_id: the id to report (default: pgx's `env.id`).

    The state's `inner` is the pgx `State`.
    """

    suite = "pgx"

    def __init__(self, env: Any, env_id: str | None = None):
        if int(env.num_players) != 1:
            raise ValueError(
                f"pgx {_env_id(env)!r} has {env.num_players} players: use PgxMultiAgentEnv "
                "with MultiAgentEnvRunner (config.environment('pgx/<id>') picks it), or a "
                "one-player game (2048, minatar-*) with SingleAgentEnvRunner."
            )
        super().__init__(env, env_id or _env_id(env))
        self.set_spaces(_observation_box(env), gx.Discrete(int(env.num_actions)))
        self.action_mask = self._action_mask

    def _action_mask(self, state: SuiteState, params: Any = None) -> jax.Array:
        """`(num_actions,)` bool: pgx's `legal_action_mask` of `state`."""
        del params
        return state.inner.legal_action_mask

    def reset_env(self, key: jax.Array, params: Any):
        del params
        inner = self.inner.init(key)
        return inner.observation, first_state(inner)

    def step_env(self, key: jax.Array, state: SuiteState, action: Any, params: Any):
        del params
        inner = self.inner.step(state.inner, jnp.asarray(action, jnp.int32), key)
        terminated, truncated = split_done(inner.terminated, inner.truncated)
        return (inner.observation, next_state(state, inner, truncated),
                inner.rewards[0].astype(jnp.float32), terminated, {})


class PgxMultiAgentEnv(MultiAgentEnv):
    """A pgx game of two or more players as a turn-based multi-agent env.

    Args:
        env: the pgx `Env`.
        env_id: the id to report (default: pgx's `env.id`).

    State: the pgx `State`. Agents: `player_<i>` for pgx player `i`.
    """

    suite = "pgx"

    def __init__(self, env: Any, env_id: str | None = None):
        self.inner = env
        self.env_id = env_id or _env_id(env)
        self.num_players = int(env.num_players)
        self.agents = tuple(f"player_{i}" for i in range(self.num_players))
        self._obs_space = _observation_box(env)
        self._act_space = gx.Discrete(int(env.num_actions))

    @property
    def name(self) -> str:
        return f"pgx/{self.env_id}"

    @property
    def default_params(self) -> Any:
        return NoParams()

    def observation_space(self, agent_id: str, params: Any = None):
        return self._obs_space

    def action_space(self, agent_id: str, params: Any = None):
        return self._act_space

    def _observations(self, state: Any) -> dict:
        with warnings.catch_warnings():  # pgx marks observe(state, player_id) deprecated
            warnings.simplefilter("ignore", DeprecationWarning)
            return {agent: self.inner.observe(state, jnp.int32(i))
                    for i, agent in enumerate(self.agents)}

    def reset_env(self, key: jax.Array, params: Any):
        del params
        state = self.inner.init(key)
        return self._observations(state), state

    def step_env(self, key: jax.Array, state: Any, actions: dict, params: Any):
        del params
        stacked = jnp.stack([jnp.asarray(actions[a], jnp.int32) for a in self.agents])
        action = stacked[state.current_player]
        new = self.inner.step(state, action, key)
        terminated, truncated = split_done(new.terminated, new.truncated)
        rewards = {a: new.rewards[i].astype(jnp.float32) for i, a in enumerate(self.agents)}
        terminateds = {a: terminated for a in (*self.agents, ALL)}
        truncateds = {a: truncated for a in (*self.agents, ALL)}
        return self._observations(new), new, rewards, terminateds, truncateds, {}

    def agents_to_act(self, state: Any, params: Any = None) -> dict:
        live = ~(state.terminated | state.truncated)
        return {a: live & (state.current_player == i) for i, a in enumerate(self.agents)}

    def action_mask(self, state: Any, params: Any = None) -> dict:
        """`{agent: (num_actions,) bool}`: legal moves for the player to move; all True for
        the others (their actions are ignored)."""
        del params
        everything = jnp.ones_like(state.legal_action_mask)
        return {a: jnp.where(state.current_player == i, state.legal_action_mask, everything)
                for i, a in enumerate(self.agents)}

    def __repr__(self) -> str:
        return f"PgxMultiAgentEnv({self.name!r})"


def adapt(env: Any, env_id: str | None = None) -> Any:
    """`PgxEnv` for a one-player game, `PgxMultiAgentEnv` otherwise."""
    if int(env.num_players) == 1:
        return PgxEnv(env, env_id)
    return PgxMultiAgentEnv(env, env_id)


def make(env_id: str, env_config: dict) -> tuple[Any, Any]:
    """`"pgx/<env_id>"`: the adapted `pgx.make(env_id, **env_config)`."""
    import pgx

    inner = construct(pgx.make, "pgx.make", env_id, env_config)
    env = adapt(inner, env_id)
    return env, env.default_params


def env_ids() -> list[str]:
    """Every id pgx can make here (ids of games whose extra packages are missing, e.g. the
    MinAtar ports without `pgx-minatar`, are left out)."""
    import pgx

    return [i for i in pgx.available_envs() if not i.startswith("minatar-")
            or _has_minatar()]


# Players of each pgx 2.x game (its `Env.num_players`), so that listing the ids imports no
# game: pgx builds some games' tables when their module is imported (shogi about 30 s on a
# 2-core CPU, chess and animal shogi about 15 s). An id missing here is made and asked.
KNOWN_NUM_PLAYERS = {
    "2048": 1, "animal_shogi": 2, "backgammon": 2, "bridge_bidding": 4, "chess": 2,
    "connect_four": 2, "gardner_chess": 2, "go_9x9": 2, "go_19x19": 2, "hex": 2,
    "kuhn_poker": 2, "leduc_holdem": 2, "othello": 2, "shogi": 2, "sparrow_mahjong": 3,
    "tic_tac_toe": 2,
}


def num_players(env_id: str) -> int:
    """Players of pgx game `env_id` (the MinAtar ports: 1), without making the game when
    it is one of `KNOWN_NUM_PLAYERS`."""
    if env_id.startswith("minatar-"):
        return 1
    if env_id in KNOWN_NUM_PLAYERS:
        return KNOWN_NUM_PLAYERS[env_id]
    import pgx

    return int(pgx.make(env_id).num_players)


def multi_player_ids() -> list[str]:
    """The ids of games with two or more players (`PgxMultiAgentEnv`, MultiAgentEnvRunner)."""
    return [i for i in env_ids() if num_players(i) > 1]


def _has_minatar() -> bool:
    import importlib.util

    return importlib.util.find_spec("pgx_minatar") is not None
