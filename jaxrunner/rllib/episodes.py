"""jaxrunner episode chunks -> `ray.rllib` `SingleAgentEpisode`s, built from numpy.

`SingleAgentEpisode.to_rllib()` (jaxrunner/episodes) is the reference conversion: it
hands RLlib per-step lists and lets `to_numpy()` stack them. Here the same episodes are
built directly on numpy arrays (an `InfiniteLookbackBuffer` over an array is already
"finalized"), which is what `to_numpy()` would produce, without a Python object per
step. The result carries RLlib's conventions:

* same `id_` for every chunk of an episode, `t_started` = the previous chunk's `t`, and
  `episode_lookback_horizon` steps of lookback, so learner connectors can order and join
  chunks;
* `extra_model_outputs`: `action_logp` `(T,)` float32, `action_dist_inputs` `(T, D)`
  float32 and `weights_seq_no` `(T,)` int64 (the weights version that acted, as RLlib's
  runner records it);
* observations in the observation space's dtype, actions in the action space's dtype
  (int64 for Discrete, as gymnasium's), rewards float32, infos empty dicts.
"""

from __future__ import annotations

from typing import Any, Iterable

import numpy as np

WEIGHTS_SEQ_NO = "weights_seq_no"


def _cast(array: np.ndarray, space: Any) -> np.ndarray:
    dtype = getattr(space, "dtype", None)
    if dtype is None:
        return np.asarray(array)
    return np.asarray(array).astype(dtype, copy=False)


def to_rllib_episode(episode: Any, *, weights_seq_no: int = 0,
                     observation_space: Any = None, action_space: Any = None):
    """One jaxrunner `SingleAgentEpisode` chunk -> a numpy-backed RLlib episode."""
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode
    from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

    observation_space = observation_space or episode.observation_space
    action_space = action_space or episode.action_space
    n_lookback = episode.len_lookback_buffer
    observations = _cast(np.concatenate([episode.lookback_observations,
                                         episode.observations]), observation_space)
    actions = _cast(np.concatenate([episode.lookback_actions, episode.actions]),
                    action_space)
    rewards = np.concatenate([episode.lookback_rewards, episode.rewards]).astype(
        np.float32, copy=False)
    extras = {name: np.concatenate([episode.lookback_extra_model_outputs[name], values])
              for name, values in episode.extra_model_outputs.items()}
    extras[WEIGHTS_SEQ_NO] = np.full(len(rewards), weights_seq_no, np.int64)
    infos = InfiniteLookbackBuffer(data=[{} for _ in range(len(observations))],
                                   lookback=n_lookback)
    return RLlibEpisode(
        id_=episode.id_,
        observations=observations,
        observation_space=observation_space,
        infos=infos,
        actions=actions,
        action_space=action_space,
        rewards=rewards,
        extra_model_outputs=extras,
        terminated=episode.is_terminated,
        truncated=episode.is_truncated,
        t_started=episode.t_started,
        len_lookback_buffer=n_lookback,
        agent_id=episode.agent_id,
        module_id=episode.module_id,
    )


def to_rllib_episodes(episodes: Iterable[Any], *, weights_seq_no: int = 0,
                      observation_space: Any = None, action_space: Any = None) -> list:
    """`to_rllib_episode` over a jaxrunner `EpisodeBatch` (or any iterable of chunks)."""
    return [to_rllib_episode(e, weights_seq_no=weights_seq_no,
                             observation_space=observation_space,
                             action_space=action_space) for e in episodes]


__all__ = ["to_rllib_episode", "to_rllib_episodes"]
