"""Env-to-module connector pieces: flattening, mean-std filtering, frame stacking,
previous action/reward.

Every piece takes its spaces from the pipeline when built without them, as RLlib's do:
`MeanStdFilter()`, `FrameStacking(num_frames=4)`, `PrevActionsPrevRewards()`,
`FlattenObservations()` (see `jaxrunner.connectors.base`). A space given explicitly is
kept.

In a multi-agent runner every agent gets its own copy of each piece, bound to that
agent's spaces, with its own state, advanced only at the agent's turns (the context's
`mask`); see `jaxrunner.connectors.multi_agent`. The pieces take RLlib's
`multi_agent=True` too; it changes nothing here (a multi-agent runner always keeps one
state per agent, a single-agent runner has one agent).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.connectors.base import ConnectorContext, ConnectorV2


def _flatten_one(x: Any, space: gym.spaces.Space) -> jax.Array:
    """(B, ...) of `space` -> (B, F) float32, leaves in gymnasium's key order."""
    if isinstance(space, gym.spaces.Dict):
        return jnp.concatenate([_flatten_one(x[k], s) for k, s in space.spaces.items()],
                               axis=-1)
    if isinstance(space, gym.spaces.Tuple):
        return jnp.concatenate([_flatten_one(x[i], s) for i, s in enumerate(space.spaces)],
                               axis=-1)
    if isinstance(space, gym.spaces.Discrete):
        return jax.nn.one_hot(jnp.asarray(x).astype(jnp.int32), int(space.n),
                              dtype=jnp.float32)
    if isinstance(space, gym.spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec).reshape(-1)
        flat = jnp.asarray(x).reshape(x.shape[0], -1).astype(jnp.int32)
        return jnp.concatenate([jax.nn.one_hot(flat[:, i], int(n), dtype=jnp.float32)
                                for i, n in enumerate(nvec)], axis=-1)
    x = jnp.asarray(x)
    return x.reshape(x.shape[0], -1).astype(jnp.float32)


def _flat_size(space: gym.spaces.Space) -> int:
    if isinstance(space, gym.spaces.Dict):
        return sum(_flat_size(s) for s in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        return sum(_flat_size(s) for s in space.spaces)
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    if isinstance(space, gym.spaces.MultiDiscrete):
        return int(np.sum(space.nvec))
    return int(math.prod(space.shape))


def _rows(mask: jax.Array, x: jax.Array) -> jax.Array:
    """`mask` `(B,)` shaped to broadcast against `x` `(B, ...)`."""
    return mask.reshape((-1,) + (1,) * (x.ndim - 1))


def _unbound(piece: str, what: str = "observation space") -> ValueError:
    return ValueError(
        f"{piece} has no {what}: it gets it from the runner's connector pipeline (put it in "
        "env_runners(env_to_module_connector=lambda env, spaces, device: [...])), or pass "
        f"it to the constructor when you use the piece on its own."
    )


class FlattenObservations(ConnectorV2):
    """Dict / Tuple / Discrete / multi-dim Box observations -> one float32 vector `(B, F)`
    (Discrete parts one-hot).

    Args:
        observation_space: the space it receives (default: from the pipeline).
        multi_agent: RLlib's flag, accepted for ported configs (see the module docstring).
    """

    reads_context = False

    def __init__(self, observation_space: gym.spaces.Space | None = None, *,
                 multi_agent: bool = False):
        self.input_space = observation_space
        self.multi_agent = bool(multi_agent)

    def bind_input_observation_space(self, space):
        super().bind_input_observation_space(space)
        if self.input_space is None:
            self.input_space = space

    def recompute_observation_space(self, space):
        size = _flat_size(space)
        return gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)

    def __call__(self, state, obs, ctx):
        if self.input_space is None:
            raise _unbound("FlattenObservations()")
        return state, _flatten_one(obs, self.input_space)


def _combine(a, b):
    """Parallel Welford: stats of the union of two sample sets (count, mean, M2)."""
    n_a, mean_a, m2_a = a
    n_b, mean_b, m2_b = b
    n = n_a + n_b
    safe = jnp.maximum(n, 1.0)
    delta = mean_b - mean_a
    mean = mean_a + delta * (n_b / safe)
    m2 = m2_a + m2_b + delta * delta * (n_a * n_b / safe)
    return n, mean, m2


def _combine_np(a, b):
    n_a, mean_a, m2_a = (np.asarray(v, np.float64) for v in a)
    n_b, mean_b, m2_b = (np.asarray(v, np.float64) for v in b)
    n = n_a + n_b
    safe = max(float(n), 1.0)
    delta = mean_b - mean_a
    return n, mean_a + delta * (n_b / safe), m2_a + m2_b + delta * delta * (n_a * n_b / safe)


class MeanStdFilter(ConnectorV2):
    """Normalises observations with running mean and std: `clip((x - mean) / (std + eps))`.

    Statistics update with every observation the runner acts on (all `B` sub-envs, or the
    rows of the context's `mask`: in a multi-agent runner the statistics of an agent
    count only the observations of its own turns), then normalise it (RLlib's
    `MeanStdFilter` order). The state keeps a `base` (statistics
    everybody agreed on at the last merge) and a `delta` (this runner's samples since), so
    `merge_states` of several runners gives exactly the statistics of the union of their
    samples: `base + delta_1 + ... + delta_k`.

    Args:
        observation_space: a Box space (flatten first for other spaces); default: the
            space the pipeline hands it (`MeanStdFilter()`, as in RLlib).
        clip: the normalised value is clipped to `[-clip, clip]` (RLlib: 10).
        update: keep updating the statistics while sampling (False: freeze them).
        multi_agent: RLlib's flag, accepted for ported configs: one filter per agent is
            what a multi-agent runner always keeps (see the module docstring).
    """

    def __init__(self, observation_space: gym.spaces.Space | None = None, clip: float = 10.0,
                 epsilon: float = 1e-8, update: bool = True, *, multi_agent: bool = False):
        self.multi_agent = bool(multi_agent)
        self.shape: tuple[int, ...] | None = None
        if observation_space is not None:
            self._set_space(observation_space)
        self.clip = float(clip)
        self.epsilon = float(epsilon)
        self.update = update

    def _set_space(self, space: gym.spaces.Space) -> None:
        if not isinstance(space, gym.spaces.Box):
            raise ValueError(
                f"MeanStdFilter needs a Box observation space, got {space}; put "
                "FlattenObservations before it."
            )
        self.shape = tuple(space.shape)

    def bind_input_observation_space(self, space):
        super().bind_input_observation_space(space)
        if self.shape is None:
            self._set_space(space)

    def recompute_observation_space(self, space):
        if self.shape is None:
            raise _unbound("MeanStdFilter()")
        return gym.spaces.Box(-self.clip, self.clip, self.shape, np.float32)

    def _zeros(self):
        if self.shape is None:
            raise _unbound("MeanStdFilter()")
        return (jnp.zeros((), jnp.float32), jnp.zeros(self.shape, jnp.float32),
                jnp.zeros(self.shape, jnp.float32))

    def init_state(self, num_envs):
        return {"base": self._zeros(), "delta": self._zeros()}

    def __call__(self, state, obs, ctx):
        obs = jnp.asarray(obs, jnp.float32)
        if self.update and ctx.mask is None:
            batch = obs.shape[0]
            mean_b = jnp.mean(obs, axis=0)
            m2_b = jnp.sum((obs - mean_b) ** 2, axis=0)
            state = {"base": state["base"],
                     "delta": _combine(state["delta"],
                                       (jnp.asarray(batch, jnp.float32), mean_b, m2_b))}
        elif self.update:  # only the rows that act count (an empty mask changes nothing)
            rows = _rows(ctx.mask, obs)
            count = jnp.sum(ctx.mask.astype(jnp.float32))
            mean_b = jnp.sum(jnp.where(rows, obs, 0.0), axis=0) / jnp.maximum(count, 1.0)
            m2_b = jnp.sum(jnp.where(rows, (obs - mean_b) ** 2, 0.0), axis=0)
            state = {"base": state["base"],
                     "delta": _combine(state["delta"], (count, mean_b, m2_b))}
        n, mean, m2 = _combine(state["base"], state["delta"])
        std = jnp.sqrt(m2 / jnp.maximum(n, 1.0))
        normed = (obs - mean) / (std + self.epsilon)
        return state, jnp.clip(normed, -self.clip, self.clip)

    def get_state(self, state):
        return {"base": state["base"], "delta": state["delta"]}

    def set_state(self, state, saved):
        from jaxrunner.errors import StateStructureError

        try:
            new = {part: tuple(jnp.asarray(v, jnp.float32) for v in saved[part])
                   for part in ("base", "delta")}
        except (KeyError, TypeError) as error:
            raise StateStructureError(
                f"MeanStdFilter state must be {{'base': (count, mean, m2), 'delta': ...}}; "
                f"got {type(saved).__name__} ({error})."
            ) from error
        for part, (n, mean, m2) in new.items():
            if n.shape != () or mean.shape != self.shape or m2.shape != self.shape:
                raise StateStructureError(
                    f"MeanStdFilter state {part!r} has shapes count {n.shape}, mean "
                    f"{mean.shape}, m2 {m2.shape}; expected (), {self.shape}, {self.shape} "
                    "(the observation shape of this runner)."
                )
        return new

    def merge_states(self, saved_states):
        base = saved_states[0]["base"]
        total = tuple(np.asarray(v, np.float64) for v in base)
        for saved in saved_states:
            total = _combine_np(total, saved["delta"])
        merged = tuple(np.asarray(v, np.float32) for v in total)
        zeros = (np.zeros((), np.float32), np.zeros(self.shape, np.float32),
                 np.zeros(self.shape, np.float32))
        return {"base": merged, "delta": zeros}

    @staticmethod
    def statistics(saved: dict[str, Any]) -> tuple[float, np.ndarray, np.ndarray]:
        """`(count, mean, variance)` of a `get_state()` output (base + delta)."""
        n, mean, m2 = _combine_np(saved["base"], saved["delta"])
        return float(n), mean, m2 / max(float(n), 1.0)


class FrameStacking(ConnectorV2):
    """Stacks the last `num_frames` observations of each episode along the last axis.

    At an episode start the older frames are zeros. Rows outside the context's `mask`
    keep their stack (a multi-agent agent stacks only the observations of its own
    turns). The frames live in the carry, so a
    stack is the same whether or not the episode was cut between `sample()` calls;
    `stack_episode()` recomputes the module inputs of a host episode chunk from its
    observations and lookback (needs `episode_lookback_horizon >= num_frames - 1`).

    Args:
        observation_space: a Box space with at least one axis; default: the space the
            pipeline hands it (`FrameStacking(num_frames=4)`).
        num_frames: frames per stack.
        multi_agent: RLlib's flag, accepted for ported configs (see the module docstring).
    """

    def __init__(self, observation_space: gym.spaces.Space | None = None, num_frames: int = 4,
                 *, multi_agent: bool = False):
        self.multi_agent = bool(multi_agent)
        if isinstance(observation_space, (int, np.integer)) and not isinstance(
                observation_space, bool):
            raise TypeError(
                f"FrameStacking({observation_space}): the first argument is the observation "
                f"space; write FrameStacking(num_frames={observation_space}) to take the "
                "space from the pipeline."
            )
        if isinstance(num_frames, bool) or not isinstance(num_frames, (int, np.integer)) or (
                num_frames < 1):
            raise ValueError(f"num_frames must be an int >= 1, got {num_frames!r}.")
        self.num_frames = int(num_frames)
        self.frame_shape: tuple[int, ...] | None = None
        self.dtype = None
        if observation_space is not None:
            self._set_space(observation_space)

    def _set_space(self, space: gym.spaces.Space) -> None:
        if not isinstance(space, gym.spaces.Box) or not space.shape:
            raise ValueError(
                f"FrameStacking needs a Box observation space with at least one axis, got "
                f"{space}."
            )
        self.frame_shape = tuple(space.shape)
        self.dtype = space.dtype

    def bind_input_observation_space(self, space):
        super().bind_input_observation_space(space)
        if self.frame_shape is None:
            self._set_space(space)

    def recompute_observation_space(self, space):
        low = np.concatenate([np.minimum(space.low, 0)] * self.num_frames, axis=-1)
        high = np.concatenate([np.maximum(space.high, 0)] * self.num_frames, axis=-1)
        return gym.spaces.Box(low, high, dtype=space.dtype)

    def init_state(self, num_envs):
        if self.frame_shape is None:
            raise _unbound("FrameStacking()")
        # The state is the last stack itself, `(B, ..., num_frames * last)`: one slice and
        # one concatenation per step, and the output needs no extra copy.
        stacked_shape = self.frame_shape[:-1] + (self.num_frames * self.frame_shape[-1],)
        return jnp.zeros((num_envs,) + stacked_shape, self.dtype)

    def __call__(self, stacked, obs, ctx):
        obs = jnp.asarray(obs, self.dtype)
        keep = (~ctx.is_first).reshape((-1,) + (1,) * (stacked.ndim - 1))
        older = stacked[..., self.frame_shape[-1]:] * keep.astype(stacked.dtype)
        new = jnp.concatenate([older, obs], axis=-1)
        if ctx.mask is None:
            return new, new
        return jnp.where(_rows(ctx.mask, new), new, stacked), new

    def stack_episode(self, episode) -> np.ndarray:
        """Module inputs `(len(episode) + 1, ...)` for each observation of a host chunk."""
        lookback = np.asarray(episode.lookback_observations)
        obs = np.asarray(episode.observations)
        needed = self.num_frames - 1
        history = np.concatenate([lookback, obs], axis=0)
        start = len(lookback)
        if start < min(needed, episode.t_started):
            raise ValueError(
                f"stack_episode needs {min(needed, episode.t_started)} lookback steps, the "
                f"chunk has {start}; set episode_lookback_horizon >= {needed}."
            )
        out = []
        for i in range(len(obs)):
            t = episode.t_started + i  # step within the episode of observation i
            frames = []
            for k in range(self.num_frames - 1, -1, -1):
                j = start + i - k
                frames.append(history[j] if t - k >= 0 and j >= 0
                              else np.zeros(self.frame_shape, self.dtype))
            out.append(np.concatenate(frames, axis=-1))
        return np.stack(out)


class PrevActionsPrevRewards(ConnectorV2):
    """Appends the previous action (one-hot if Discrete) and reward to the flat observation
    (zeros at an episode start): `(B, F)` -> `(B, F + A + 1)`.

    Args:
        observation_space: a 1-D Box space; default: from the pipeline.
        action_space: the env's action space; default: from the runner's connector factory
            call (`PrevActionsPrevRewards()`, as in RLlib).
        multi_agent: RLlib's flag, accepted for ported configs (see the module docstring).

    In a multi-agent runner, the previous action and reward are the agent's own: the
    action of its last agent step and that step's reward (the rewards it received from
    that action up to its next observation).
    """

    def __init__(self, observation_space: gym.spaces.Space | None = None,
                 action_space: gym.spaces.Space | None = None, *, multi_agent: bool = False):
        self.multi_agent = bool(multi_agent)
        self._obs_space_given = observation_space is not None
        if observation_space is not None:
            self._check_obs_space(observation_space)
        self.action_space = action_space

    @staticmethod
    def _check_obs_space(space: gym.spaces.Space) -> None:
        if not isinstance(space, gym.spaces.Box) or len(space.shape) != 1:
            raise ValueError(
                f"PrevActionsPrevRewards needs a 1-D Box observation space, got "
                f"{space}; put FlattenObservations before it."
            )

    def bind_input_observation_space(self, space):
        super().bind_input_observation_space(space)
        if not self._obs_space_given:
            self._check_obs_space(space)

    @property
    def action_size(self) -> int:
        if self.action_space is None:
            raise _unbound("PrevActionsPrevRewards()", "action space")
        return _flat_size(self.action_space)

    def recompute_observation_space(self, space):
        size = int(space.shape[0]) + self.action_size + 1
        return gym.spaces.Box(-np.inf, np.inf, (size,), np.float32)

    def __call__(self, state, obs, ctx: ConnectorContext):
        if self.action_space is None:
            raise _unbound("PrevActionsPrevRewards()", "action space")
        start = ctx.is_first[:, None]
        action = jnp.where(start, 0.0, _flatten_one(ctx.prev_action, self.action_space))
        reward = jnp.where(start, 0.0, ctx.prev_reward[:, None])
        return state, jnp.concatenate([jnp.asarray(obs, jnp.float32), action, reward], axis=-1)


def default_env_to_module_pieces(observation_space: gym.spaces.Space) -> Sequence[ConnectorV2]:
    """The default pipeline: flatten Dict/Tuple observations (nothing else)."""
    if isinstance(observation_space, (gym.spaces.Dict, gym.spaces.Tuple)):
        return [FlattenObservations(observation_space)]
    return []
