"""Connector pipelines of a multi-agent runner: one pipeline per agent.

A multi-agent runner takes the same settings as the single-agent one
(`config.env_runners(env_to_module_connector=factory, module_to_env_connector=factory)`,
`add_default_connectors_to_*_pipeline`) and calls each factory once, as RLlib does, with
the env's spaces: `spaces = {"__env__": (obs, act), "__env_single__": (obs, act)}`, where
the single-env spaces are `gym.spaces.Dict`s keyed by agent id and `__env__` their
batched versions. The pieces it returns are a template: every agent gets its own deep
copy, bound to that agent's observation and action spaces (so pieces are written, as in
RLlib, without spaces: `MeanStdFilter()`, `FrameStacking(num_frames=4)`,
`PrevActionsPrevRewards()`).

Per agent, as RLlib's multi-agent pieces (`MeanStdFilter(multi_agent=True)` keeps one
filter per agent id; frame stacks and previous actions/rewards come from each agent's own
`SingleAgentEpisode`):

* the agent's pipeline runs on its `(B, ...)` observations at every vector step, with a
  `ConnectorContext` whose `mask` is the agent's acting mask `(B,)`, so statistics, frame
  stacks and any stateful piece advance only at the agent's own turns;
* `is_first` marks the agent's first action of an episode, `prev_action` /
  `prev_reward` are the action and the (accumulated) reward of its last agent step;
* the module an agent maps to sees the agent's pipeline output; its observation space is
  the pipeline's recomputed one, which must be the same for every agent that can map to
  the module (else the runner raises `ValueError` when it is built).

State: the carry holds `{agent_id: pipeline state}`; `get_state()` gives the shared part
as `{piece name: {agent_id: piece state}}` (RLlib's layout for multi-agent pieces), and
`merge_states` combines several runners' states piece by piece and agent by agent.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import gymnasium as gym
import jax
import jax.numpy as jnp

from jaxrunner.connectors.base import ConnectorContext, ConnectorPipeline, ConnectorV2


def copy_pieces(pieces: Sequence[ConnectorV2], agent_id: str, kind: str) -> list[ConnectorV2]:
    """A deep copy of the factory's pieces for one agent (a clear error if a piece cannot
    be copied)."""
    try:
        return copy.deepcopy(list(pieces))
    except Exception as error:  # noqa: BLE001 - re-raised with context
        raise TypeError(
            f"The {kind} connector pieces {[p.name for p in pieces]} cannot be copied for "
            f"agent {agent_id!r} ({type(error).__name__}: {error}). A multi-agent runner "
            "gives every agent its own copy of the factory's pieces (copy.deepcopy): keep "
            "uncopyable objects (locks, open files) out of connector pieces."
        ) from error


class MultiAgentConnectorPipeline:
    """`{agent_id: ConnectorPipeline}` with the state methods a runner needs (see the
    module docstring).

    Args:
        pipelines: one pipeline per agent, in the env's agent order.
    """

    def __init__(self, pipelines: dict[str, ConnectorPipeline]):
        self.pipelines = dict(pipelines)

    @property
    def agent_ids(self) -> tuple[str, ...]:
        return tuple(self.pipelines)

    def __getitem__(self, agent_id: str) -> ConnectorPipeline:
        return self.pipelines[agent_id]

    @property
    def reads_context(self) -> bool:
        """Some agent's pipeline has a piece that reads the connector context."""
        return any(p.reads_context for p in self.pipelines.values())

    def __len__(self) -> int:
        """The most pieces any agent's pipeline has (0: nothing runs)."""
        return max((len(p) for p in self.pipelines.values()), default=0)

    def recompute_observation_spaces(self, spaces: dict[str, gym.spaces.Space]
                                     ) -> dict[str, gym.spaces.Space]:
        """`{agent_id: space after the agent's pipeline}` (binds every piece's input
        space on the way)."""
        return {a: p.recompute_observation_space(spaces[a]) for a, p in self.pipelines.items()}

    def init_state(self, num_envs: int) -> dict[str, Any]:
        return {a: p.init_state(num_envs) for a, p in self.pipelines.items()}

    def get_state(self, state: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """`{piece name: {agent_id: the piece's shared state}}` (pieces without shared
        state left out)."""
        out: dict[str, dict[str, Any]] = {}
        for agent, pipeline in self.pipelines.items():
            for name, saved in pipeline.get_state(state[agent]).items():
                out.setdefault(name, {})[agent] = saved
        return out

    def set_state(self, state: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
        """`state` with the pieces' shared parts replaced by `saved` (a `get_state`
        output; any subset of pieces and agents)."""
        from jaxrunner.errors import StateStructureError

        names = {a: p._names() for a, p in self.pipelines.items()}
        per_agent: dict[str, dict[str, Any]] = {}
        for name, agents in saved.items():
            if not isinstance(agents, dict):
                raise StateStructureError(
                    f"set_state: the multi-agent connector state of {name!r} must be "
                    f"{{agent_id: state}}, got {type(agents).__name__}.")
            for agent, piece_state in agents.items():
                if agent not in self.pipelines:
                    raise StateStructureError(
                        f"set_state: connector state of {name!r} for agent {agent!r}, but "
                        f"this runner's agents are {list(self.pipelines)}.")
                if name not in names[agent]:
                    raise StateStructureError(
                        f"set_state: connector state for {name!r} of agent {agent!r}, but "
                        f"that agent's pipeline has {names[agent]}.")
                per_agent.setdefault(agent, {})[name] = piece_state
        return {a: (p.set_state(state[a], per_agent[a]) if a in per_agent else state[a])
                for a, p in self.pipelines.items()}

    def merge_states(self, saved_states: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Combines several runners' `get_state()` outputs, per piece and per agent, with
        the piece's own `merge_states` (mean-std statistics: those of the union)."""
        out: dict[str, dict[str, Any]] = {}
        for agent, pipeline in self.pipelines.items():
            parts = [{name: agents[agent] for name, agents in saved.items()
                      if isinstance(agents, dict) and agent in agents}
                     for saved in saved_states]
            parts = [p for p in parts if p]
            if not parts:
                continue
            for name, merged in pipeline.merge_states(parts).items():
                out.setdefault(name, {})[agent] = merged
        return out

    def apply(self, state: dict[str, Any], x: dict[str, Any],
              contexts: dict[str, ConnectorContext]) -> tuple[dict, dict]:
        """Runs every agent's pipeline on its `(B, ...)` input: `(state, x)` dicts."""
        new_state, out = {}, {}
        for agent, pipeline in self.pipelines.items():
            new_state[agent], out[agent] = pipeline(state[agent], x[agent], contexts[agent])
        return new_state, out

    def check(self, kind: str, inputs: dict[str, Any], contexts: dict[str, Any],
              expected: dict[str, tuple], num_envs: int) -> None:
        """Traces every agent's pipeline (`jax.eval_shape`, nothing runs) on a batch of
        `num_envs` and raises ValueError naming the agent unless it keeps the batch axis
        and produces the `expected[agent]` shape (None: only the batch axis is checked,
        for Dict / Tuple outputs)."""
        for agent, pipeline in self.pipelines.items():
            try:
                _, out = jax.eval_shape(pipeline, pipeline.init_state(num_envs),
                                        inputs[agent], contexts[agent])
            except Exception as error:  # noqa: BLE001 - re-raised with context
                raise ValueError(
                    f"The {kind} connector pipeline {pipeline!r} of agent {agent!r} fails on "
                    f"a batch of {num_envs} ({type(error).__name__}: {error})."
                ) from error
            shapes = {tuple(leaf.shape) for leaf in jax.tree.leaves(out)}
            want = expected[agent]
            ok = (all(s[:1] == (num_envs,) for s in shapes) if want is None
                  else shapes == {tuple(want)})
            if not ok:
                raise ValueError(
                    f"The {kind} connector pipeline {pipeline!r} of agent {agent!r} turns a "
                    f"batch of {num_envs} into shape(s) {sorted(shapes)}, expected "
                    f"{tuple(want) if want is not None else (num_envs, '...')}: every piece "
                    "must keep the leading batch axis and produce the shape its "
                    "recompute_observation_space() declares."
                )

    def __repr__(self) -> str:
        return ("MultiAgentConnectorPipeline({"
                + ", ".join(f"{a!r}: {p._names()}" for a, p in self.pipelines.items()) + "})")


def agent_contexts(agent_ids: Sequence[str], acting: jax.Array, first: jax.Array,
                   prev_actions: dict[str, Any], prev_rewards: jax.Array | None
                   ) -> dict[str, ConnectorContext]:
    """One `ConnectorContext` per agent from `(B, A)` arrays: `acting` (the mask),
    `first` (is_first), `prev_rewards` float32 (zeros when None) and the per-agent
    `prev_actions` `{agent_id: (B, *act_shape)}`."""
    out = {}
    for i, agent in enumerate(agent_ids):
        reward = (jnp.zeros(acting.shape[:1], jnp.float32) if prev_rewards is None
                  else prev_rewards[:, i])
        out[agent] = ConnectorContext(is_first=first[:, i], prev_action=prev_actions[agent],
                                      prev_reward=reward, mask=acting[:, i])
    return out


__all__ = ["MultiAgentConnectorPipeline", "agent_contexts", "copy_pieces"]
