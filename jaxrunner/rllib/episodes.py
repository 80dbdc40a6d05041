"""jaxrunner episode chunks -> `ray.rllib` episodes, for RLlib's learners and buffers.

The conversion itself is `jaxrunner.episodes.rllib_conversion` (numpy-backed episodes,
no Python object per step; multi-agent episodes with their agent-to-module mapping and
env-step map); this module is its RLlib-facing entry point:

* `to_rllib_episode(chunk)` -> `ray.rllib.env.single_agent_episode.SingleAgentEpisode`
  for a jaxrunner `SingleAgentEpisode`, or
  `ray.rllib.env.multi_agent_episode.MultiAgentEpisode` for a `MultiAgentEpisode`;
* `to_rllib_episodes(batch)` over a batch (either kind) or any iterable of chunks.

Every chunk of an episode keeps its `id_`, `t_started` continues from the previous
chunk and `episode_lookback_horizon` earlier steps are the lookback buffer, so RLlib's
`concat_episode` joins them; `extra_model_outputs` carry `action_logp`,
`action_dist_inputs` and `weights_seq_no`.
"""

from __future__ import annotations

from typing import Any, Iterable

from jaxrunner.episodes.multi_agent_episode import MultiAgentEpisode
from jaxrunner.episodes.rllib_conversion import (WEIGHTS_SEQ_NO, multi_agent_to_rllib,
                                                 single_agent_to_rllib)


def to_rllib_episode(episode: Any, *, weights_seq_no: int = 0,
                     observation_space: Any = None, action_space: Any = None):
    """One jaxrunner episode chunk -> a numpy-backed RLlib episode of the same kind.

    Args:
        episode: a jaxrunner `SingleAgentEpisode` or `MultiAgentEpisode` chunk.
        weights_seq_no: the weights version the chunk was sampled with.
        observation_space, action_space: single-agent only: override the chunk's spaces
            (observations and actions are cast to their dtypes). A multi-agent chunk
            uses its per-agent spaces.
    """
    if isinstance(episode, MultiAgentEpisode):
        if observation_space is not None or action_space is not None:
            raise ValueError(
                "to_rllib_episode: a MultiAgentEpisode uses its own per-agent spaces "
                "(episode.observation_spaces / action_spaces); do not pass "
                "observation_space or action_space for it.")
        return multi_agent_to_rllib(episode, weights_seq_no=weights_seq_no)
    return single_agent_to_rllib(episode, weights_seq_no=weights_seq_no,
                                 observation_space=observation_space,
                                 action_space=action_space)


def to_rllib_episodes(episodes: Iterable[Any], *, weights_seq_no: int = 0,
                      observation_space: Any = None, action_space: Any = None) -> list:
    """`to_rllib_episode` over a jaxrunner `EpisodeBatch` / `MultiAgentEpisodeBatch` (or
    any iterable of chunks), in order."""
    return [to_rllib_episode(e, weights_seq_no=weights_seq_no,
                             observation_space=observation_space,
                             action_space=action_space) for e in episodes]


__all__ = ["WEIGHTS_SEQ_NO", "to_rllib_episode", "to_rllib_episodes"]
