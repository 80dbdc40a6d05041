"""jaxrunner host episode views -> real `ray.rllib` episodes (Ray is imported lazily).

`single_agent_to_rllib` turns one `SingleAgentEpisode` chunk into a numpy-backed
`ray.rllib.env.single_agent_episode.SingleAgentEpisode` (an `InfiniteLookbackBuffer`
over an array is what RLlib's `to_numpy()` produces, so no Python object per step);
`multi_agent_to_rllib` turns one `MultiAgentEpisode` chunk into a
`ray.rllib.env.multi_agent_episode.MultiAgentEpisode` whose agents are such episodes.

RLlib's conventions, kept here:

* every chunk of an episode has the same `id_` (agents: `"<episode id>/<agent id>"`);
  `t_started` (agents) and `env_t_started` continue from the previous chunk, and the
  `episode_lookback_horizon` steps before the chunk are the agents' lookback buffers,
  so RLlib's `concat_episode` joins the chunks of a cut episode;
* `extra_model_outputs`: `action_logp` `(n,)` float32, `action_dist_inputs` `(n, D)`
  float32 and `weights_seq_no` `(n,)` int64 (the weights version that acted, as RLlib's
  runners record it);
* observations in the observation space's dtype, actions in the action space's dtype
  (int64 for Discrete, as gymnasium's), rewards float32, infos empty dicts;
* multi-agent: `agent_to_module` mapping (`module_for()`), per-agent terminated /
  truncated in the agents' episodes and `"__all__"` in `is_terminated` /
  `is_truncated`, and the env-step to agent-step map (`env_t_to_agent_t`) that RLlib's
  env-step getters (`get_observations(env_index)`, ...) read: for every env time
  `env_t_started .. env_t` of the chunk, the agent step of the observation the agent
  received then, or RLlib's skip tag `"S"`.

What a chunk does not hold: an action whose agent step completes only in the next
chunk is not one of RLlib's "hanging" values here (that step and its whole reward are in
the next chunk's agent episode, as in jaxrunner's views), so
`get_return(include_hanging_rewards=True)` equals `get_return()`. An agent's very first
observation at a cut chunk's last env time (a turn-based agent about to move for the
first time) is on the env timeline through `MultiAgentEpisode.acts_at_end` (the runner
gives the batch its `end_acting` mask); a batch built without it puts the agent on the
map from the next chunk on, and RLlib's `concat_episode` then takes its map from there.
RLlib's own `concat_episode` does not extend the map of an agent that is done, or that
has no agent steps in the appended chunk; maps of whole episodes joined from chunks
inherit that.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

WEIGHTS_SEQ_NO = "weights_seq_no"
SKIP_ENV_TS_TAG = "S"  # RLlib's MultiAgentEpisode.SKIP_ENV_TS_TAG


def _cast(tree: Any, space: Any) -> Any:
    dtype = getattr(space, "dtype", None)
    if dtype is None:  # no space, or a composite one: keep the view's dtypes
        return jax.tree.map(np.asarray, tree)
    return jax.tree.map(lambda x: np.asarray(x).astype(dtype, copy=False), tree)


def _join(lookback: Any, data: Any) -> Any:
    return jax.tree.map(lambda a, b: np.concatenate([a, b], axis=0), lookback, data)


def single_agent_to_rllib(episode: Any, *, weights_seq_no: int = 0,
                          observation_space: Any = None, action_space: Any = None,
                          multi_agent_episode_id: str | None = None):
    """One jaxrunner `SingleAgentEpisode` chunk -> a numpy-backed RLlib episode.

    Args:
        episode: the chunk (`len() = n` steps, `n + 1` observations, lookback `m`).
        weights_seq_no: the weights version the chunk was sampled with; every step's
            `extra_model_outputs["weights_seq_no"]` `(m + n,)` int64 holds it.
        observation_space, action_space: override the chunk's own spaces (used to cast
            observations and actions to the spaces' dtypes).
        multi_agent_episode_id: the id of the multi-agent episode the chunk belongs to.

    Returns:
        `ray.rllib.env.single_agent_episode.SingleAgentEpisode` with the same id,
        `t_started`, flags, agent and module ids, and `m` lookback steps.
    """
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode as RLlibEpisode
    from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

    observation_space = observation_space or episode.observation_space
    action_space = action_space or episode.action_space
    n_lookback = episode.len_lookback_buffer
    observations = _cast(_join(episode.lookback_observations, episode.observations),
                         observation_space)
    actions = _cast(_join(episode.lookback_actions, episode.actions), action_space)
    rewards = np.concatenate([episode.lookback_rewards, episode.rewards]).astype(
        np.float32, copy=False)
    extras = {name: _join(episode.lookback_extra_model_outputs[name], values)
              for name, values in episode.extra_model_outputs.items()}
    extras[WEIGHTS_SEQ_NO] = np.full(len(rewards), weights_seq_no, np.int64)
    n_observations = len(jax.tree.leaves(observations)[0])
    infos = InfiniteLookbackBuffer(data=[{} for _ in range(n_observations)],
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
        multi_agent_episode_id=multi_agent_episode_id,
    )


class RecordedAgentToModule:
    """`agent_to_module_mapping_fn` of a converted episode: the mapping the runner's
    `policy_mapping_fn` chose for it (picklable, unlike a closure)."""

    def __init__(self, mapping: dict[str, str]):
        self.mapping = dict(mapping)

    def __call__(self, agent_id: str, episode: Any = None) -> str:
        try:
            return self.mapping[agent_id]
        except KeyError:
            raise KeyError(f"Agent {agent_id!r} is not an agent of this episode; its "
                           f"agents are {sorted(self.mapping)}.") from None

    def __repr__(self) -> str:
        return f"RecordedAgentToModule({self.mapping!r})"


def env_to_agent_steps(*, acted: np.ndarray, completed: np.ndarray, agent_t_started: int,
                       num_agent_steps: int, acts_at_end: bool = False) -> list | None:
    """An agent's env-step to agent-step map over one chunk (RLlib's
    `env_t_to_agent_t`, without lookback).

    The agent has an observation at the chunk's env time `k` (0..len) if it acted at
    env step `k`, or an agent step of it completed at env step `k - 1` (its next
    observation, or the final one), or (`k = len`) it acts right after the chunk.
    Those observations are its agent steps `agent_t_started, agent_t_started + 1, ...`,
    except when the chunk's first agent step began before the chunk (its action was
    pending at the cut): then they start at `agent_t_started + 1`.

    Args:
        acted, completed: `(len,)` bool per env step of the chunk.
        agent_t_started: agent steps the agent completed before the chunk.
        num_agent_steps: agent steps it completes in the chunk.
        acts_at_end: whether the agent acts at the env step right after the chunk (an
            observation at env time `len` that no step of the chunk shows when it is the
            agent's first one).

    Returns:
        `len + 1` entries (ints or `"S"`), or None if the agent was not seen by the end
        of the chunk (no observation in it, none before it).
    """
    present = np.zeros(len(acted) + 1, bool)
    present[:-1] |= acted
    present[1:] |= completed
    present[-1] |= bool(acts_at_end)
    count = int(present.sum())
    if count == 0 and agent_t_started == 0 and num_agent_steps == 0:
        return None
    # The chunk has num_agent_steps + 1 observations of the agent (if it has steps):
    # one fewer on the env timeline means the first was seen before the chunk.
    first = agent_t_started + (1 if num_agent_steps and count == num_agent_steps else 0)
    if count > num_agent_steps + 1:
        raise ValueError(
            f"Inconsistent agent chunk: {count} observations on the env timeline but "
            f"{num_agent_steps} agent steps (at most {num_agent_steps + 1} expected).")
    out: list = []
    for seen in present:
        if seen:
            out.append(first)
            first += 1
        else:
            out.append(SKIP_ENV_TS_TAG)
    return out


def multi_agent_to_rllib(episode: Any, *, weights_seq_no: int = 0):
    """One jaxrunner `MultiAgentEpisode` chunk -> a numpy-backed RLlib episode.

    Args:
        episode: the chunk: `len()` env steps from `env_t_started`, agent chunks in
            `agent_episodes`, per env step `acted` / `completed` masks.
        weights_seq_no: the weights version the chunk was sampled with.

    Returns:
        `ray.rllib.env.multi_agent_episode.MultiAgentEpisode` with the chunk's id,
        `env_t_started` / `env_t`, `agent_t_started`, one RLlib `SingleAgentEpisode` per
        agent with steps (see `single_agent_to_rllib`), the agent-to-module mapping,
        `"__all__"` flags and `env_t_to_agent_t`. It passes RLlib's `validate()`.
    """
    from ray.rllib.env.multi_agent_episode import MultiAgentEpisode as RLlibMultiAgentEpisode
    from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer

    agent_to_module = dict(episode.agent_to_module)
    result = RLlibMultiAgentEpisode(
        id_=episode.id_,
        observation_space=dict(episode.observation_spaces),
        action_space=dict(episode.action_spaces),
        terminateds=episode.is_terminated,
        truncateds=episode.is_truncated,
        env_t_started=episode.env_t_started,
        agent_module_ids=dict(agent_to_module),
        agent_to_module_mapping_fn=RecordedAgentToModule(agent_to_module),
        len_lookback_buffer=0,
    )
    result.env_t = episode.env_t
    for agent_id in episode.possible_agents:
        chunk = episode.agent_episodes.get(agent_id)
        t_started = chunk.t_started if chunk is not None else episode.agent_t_started[agent_id]
        mapping = env_to_agent_steps(
            acted=episode.acted[agent_id], completed=episode.completed[agent_id],
            agent_t_started=t_started, num_agent_steps=len(chunk) if chunk else 0,
            acts_at_end=episode.acts_at_end.get(agent_id, False))
        if mapping is not None:
            result.env_t_to_agent_t[agent_id] = InfiniteLookbackBuffer(data=mapping,
                                                                       lookback=0)
        if chunk is None:
            continue
        result.agent_t_started[agent_id] = t_started
        result.agent_episodes[agent_id] = single_agent_to_rllib(
            chunk, weights_seq_no=weights_seq_no,
            observation_space=episode.observation_spaces.get(agent_id),
            action_space=episode.action_spaces.get(agent_id),
            multi_agent_episode_id=episode.id_)
    result.validate()
    return result


__all__ = ["RecordedAgentToModule", "SKIP_ENV_TS_TAG", "WEIGHTS_SEQ_NO",
           "env_to_agent_steps", "multi_agent_to_rllib", "single_agent_to_rllib"]
