"""`SingleAgentEpisode`: a host (numpy) view of one episode chunk, with RLlib's surface.

A chunk holds `len()` steps: `observations` has `len() + 1` entries (the last one is the
observation after the last step: the final observation if the episode ended, else the
observation the next chunk starts from), `actions`, `rewards` and every
`extra_model_outputs[name]` have `len()` entries. Lookback data (steps of the same episode
taken before `t_started`, at most `episode_lookback_horizon`) is kept apart and reachable
through `get_*(..., neg_index_as_lookback=True)`, as in RLlib.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def _concat(a: Any, b: Any) -> Any:
    return jax.tree.map(lambda x, y: np.concatenate([x, y], axis=0), a, b)


def _take(tree: Any, index: Any) -> Any:
    return jax.tree.map(lambda x: x[index], tree)


def _length(tree: Any) -> int:
    return len(jax.tree.leaves(tree)[0])


class SingleAgentEpisode:
    """One episode chunk on the host.

    Attributes:
        id_: episode id (str), equal across the chunks of one episode.
        t_started: global step of the episode at which this chunk starts.
        observations: `(len + 1, *obs_shape)` numpy array (or pytree of them).
        actions: `(len, *act_shape)` the module's actions (before clipping to bounds).
        rewards: `(len,)` float32.
        extra_model_outputs: dict name -> `(len, ...)`: "action_logp" `(len,)` float32,
            "action_dist_inputs" `(len, D)` float32.
        is_terminated, is_truncated: how the episode ended (both False for a cut chunk).
    """

    def __init__(self, id_: str, *, observations: Any, actions: np.ndarray,
                 rewards: np.ndarray, extra_model_outputs: dict | None = None,
                 terminated: bool = False, truncated: bool = False, t_started: int = 0,
                 lookback_observations: Any = None, lookback_actions: np.ndarray | None = None,
                 lookback_rewards: np.ndarray | None = None,
                 lookback_extra_model_outputs: dict | None = None,
                 observation_space=None, action_space=None,
                 agent_id: Any = None, module_id: Any = None):
        self.id_ = id_
        self.observations = observations
        self.actions = actions
        self.rewards = rewards
        self.extra_model_outputs = dict(extra_model_outputs or {})
        self.is_terminated = bool(terminated)
        self.is_truncated = bool(truncated)
        self.t_started = int(t_started)
        empty = lambda x: x[:0]  # noqa: E731
        self.lookback_observations = (lookback_observations if lookback_observations is not None
                                      else jax.tree.map(empty, observations))
        self.lookback_actions = (lookback_actions if lookback_actions is not None
                                 else actions[:0])
        self.lookback_rewards = (lookback_rewards if lookback_rewards is not None
                                 else rewards[:0])
        self.lookback_extra_model_outputs = (
            lookback_extra_model_outputs if lookback_extra_model_outputs is not None
            else {k: _take(v, slice(0, 0)) for k, v in self.extra_model_outputs.items()})
        self.observation_space = observation_space
        self.action_space = action_space
        self.agent_id = agent_id
        self.module_id = module_id

    # ------------------------------------------------------------------ RLlib surface
    def __len__(self) -> int:
        return len(self.rewards)

    @property
    def t(self) -> int:
        return self.t_started + len(self)

    @property
    def is_done(self) -> bool:
        return self.is_terminated or self.is_truncated

    @property
    def len_lookback_buffer(self) -> int:
        return len(self.lookback_rewards)

    @property
    def infos(self) -> list[dict]:
        return [{} for _ in range(len(self) + 1)]

    def env_steps(self) -> int:
        return len(self)

    def agent_steps(self) -> int:
        return len(self)

    def get_return(self) -> float:
        """Undiscounted sum of this chunk's rewards (lookback excluded)."""
        return float(np.sum(self.rewards, dtype=np.float64))

    @staticmethod
    def _get(lookback: Any, data: Any, indices: Any, neg_index_as_lookback: bool) -> Any:
        if indices is None:
            return data
        if neg_index_as_lookback:
            full = _concat(lookback, data)
            offset = _length(lookback)
            shift = lambda i: i + offset  # noqa: E731
            if isinstance(indices, slice):
                indices = slice(None if indices.start is None else shift(indices.start),
                                None if indices.stop is None else shift(indices.stop),
                                indices.step)
            elif isinstance(indices, (list, tuple)):
                indices = [shift(i) for i in indices]
            else:
                indices = shift(indices)
            return _take(full, indices)
        if isinstance(indices, (list, tuple)):
            indices = list(indices)
        return _take(data, indices)

    def get_observations(self, indices: Any = None, *, neg_index_as_lookback: bool = False):
        return self._get(self.lookback_observations, self.observations, indices,
                         neg_index_as_lookback)

    def get_actions(self, indices: Any = None, *, neg_index_as_lookback: bool = False):
        return self._get(self.lookback_actions, self.actions, indices, neg_index_as_lookback)

    def get_rewards(self, indices: Any = None, *, neg_index_as_lookback: bool = False):
        return self._get(self.lookback_rewards, self.rewards, indices, neg_index_as_lookback)

    def get_extra_model_outputs(self, key: str, indices: Any = None, *,
                                neg_index_as_lookback: bool = False):
        return self._get(self.lookback_extra_model_outputs[key],
                         self.extra_model_outputs[key], indices, neg_index_as_lookback)

    def validate(self) -> None:
        """Checks the buffer lengths and flags (RLlib's `validate()` rules)."""
        n_obs = _length(self.observations)
        if not (n_obs == len(self.actions) + 1 == len(self.rewards) + 1):
            raise AssertionError(
                f"Episode {self.id_}: {n_obs} observations, {len(self.actions)} actions and "
                f"{len(self.rewards)} rewards; expected len(obs) == len(actions) + 1 == "
                "len(rewards) + 1."
            )
        for name, values in self.extra_model_outputs.items():
            if _length(values) != len(self.actions):
                raise AssertionError(
                    f"Episode {self.id_}: extra_model_outputs[{name!r}] has {_length(values)} "
                    f"entries, expected {len(self.actions)}."
                )
        n_lookback = len(self.lookback_rewards)
        if not (_length(self.lookback_observations) == len(self.lookback_actions) == n_lookback):
            raise AssertionError(f"Episode {self.id_}: inconsistent lookback lengths.")
        if n_lookback > self.t_started:
            raise AssertionError(
                f"Episode {self.id_}: {n_lookback} lookback steps but t_started="
                f"{self.t_started}."
            )

    def concat_episode(self, other: "SingleAgentEpisode") -> None:
        """Appends the next chunk `other` of the same episode (RLlib's rules)."""
        if other.id_ != self.id_:
            raise AssertionError(f"Cannot concat episode {other.id_} to episode {self.id_}.")
        if self.is_done:
            raise AssertionError(f"Episode {self.id_} is done; nothing can follow it.")
        if self.t != other.t_started:
            raise AssertionError(
                f"Episode {self.id_}: chunk starts at t={other.t_started}, expected {self.t}."
            )
        last = _take(self.observations, -1)
        first = _take(other.observations, 0)
        if not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(last),
                                                         jax.tree.leaves(first))):
            raise AssertionError(
                f"Episode {self.id_}: the next chunk's first observation differs from this "
                "chunk's last observation."
            )
        self.observations = _concat(_take(self.observations, slice(None, -1)),
                                    other.observations)
        self.actions = np.concatenate([self.actions, other.actions])
        self.rewards = np.concatenate([self.rewards, other.rewards])
        self.extra_model_outputs = {k: _concat(v, other.extra_model_outputs[k])
                                    for k, v in self.extra_model_outputs.items()}
        self.is_terminated = other.is_terminated
        self.is_truncated = other.is_truncated

    def cut(self, len_lookback_buffer: int = 0) -> "SingleAgentEpisode":
        """Returns the empty successor chunk (same id, `t_started = self.t`)."""
        if self.is_done:
            raise AssertionError(f"Cannot cut episode {self.id_}: it is done.")
        if len_lookback_buffer < 0:
            raise ValueError("len_lookback_buffer must be >= 0.")
        all_obs = _concat(self.lookback_observations, self.observations)
        all_actions = np.concatenate([self.lookback_actions, self.actions])
        all_rewards = np.concatenate([self.lookback_rewards, self.rewards])
        n = min(len_lookback_buffer, len(all_actions))
        tail = slice(len(all_actions) - n, len(all_actions))
        extras = {k: _concat(self.lookback_extra_model_outputs[k], v)
                  for k, v in self.extra_model_outputs.items()}
        return SingleAgentEpisode(
            self.id_,
            observations=_take(all_obs, slice(-1, None)),
            actions=self.actions[:0], rewards=self.rewards[:0],
            extra_model_outputs={k: _take(v, slice(0, 0))
                                 for k, v in self.extra_model_outputs.items()},
            t_started=self.t,
            lookback_observations=_take(all_obs, slice(_length(all_obs) - 1 - n,
                                                       _length(all_obs) - 1)),
            lookback_actions=all_actions[tail], lookback_rewards=all_rewards[tail],
            lookback_extra_model_outputs={k: _take(v, tail) for k, v in extras.items()},
            observation_space=self.observation_space, action_space=self.action_space,
            agent_id=self.agent_id, module_id=self.module_id)

    def to_rllib(self, *, weights_seq_no: int = 0):
        """This chunk as a `ray.rllib` `SingleAgentEpisode` (numpy data, lookback kept,
        every step's `extra_model_outputs["weights_seq_no"]` = `weights_seq_no`; see
        `jaxrunner.episodes.rllib_conversion`). Imports Ray."""
        from jaxrunner.episodes.rllib_conversion import single_agent_to_rllib

        return single_agent_to_rllib(self, weights_seq_no=weights_seq_no)

    def __repr__(self) -> str:
        state = ("terminated" if self.is_terminated else "truncated" if self.is_truncated
                 else "ongoing")
        return (f"SingleAgentEpisode(id_={self.id_!r}, t_started={self.t_started}, "
                f"len={len(self)}, return={self.get_return():.3f}, {state})")
