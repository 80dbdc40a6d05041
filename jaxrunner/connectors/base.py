"""Connector pieces and pipelines: pure functions with state in the rollout carry.

A connector piece transforms a batch of `B` sub-envs at each vector step, inside the
compiled rollout:

* env-to-module pieces map observations `(B, *obs_shape)` to what the module sees;
* module-to-env pieces map actions `(B, *act_shape)` to what the env receives.

Each piece is a `ConnectorV2` with pure methods: `init_state(num_envs)` (its state in the
carry: per-sub-env buffers and/or statistics), `__call__(state, x, ctx) -> (state, x)`,
`recompute_observation_space(space)`, and the host-facing `get_state(state)` /
`set_state(state, saved)` / `merge_states(saved_list)` for the part of its state that is
shared across runners (RLlib's connector state: e.g. mean-std statistics). Per-episode
buffers (stacked frames, previous actions) travel with the runner's carry instead.

`ctx` is a `ConnectorContext` with `is_first` `(B,)` bool (this observation starts an
episode), `prev_action` `(B, *act_shape)`, `prev_reward` `(B,)` (zeros at episode start)
and `mask`: None (every row acts: the single-agent runner) or `(B,)` bool, the rows that
act at this step (the multi-agent runner, which runs one pipeline per agent on that
agent's `(B, ...)` observations, see `jaxrunner.connectors.multi_agent`). A stateful
piece advances its state only on the rows of `mask` (statistics, frame stacks); what it
outputs for the other rows is not used. With `mask=None` the pieces trace exactly the
program they traced before masks existed.

Spaces come from the pipeline, as in RLlib (`MeanStdFilter()` takes no space): before a
pipeline runs, `ConnectorPipeline.recompute_observation_space(env_obs_space)` hands each
piece the observation space it receives (the env's, as changed by the pieces before it)
through `bind_input_observation_space(space)`, and the runner's connector factory call
(`call_factory`) hands every piece the env's action space through
`bind_action_space(space)`. A piece built with an explicit space keeps it.

A connector factory is `factory(env, spaces, device)` (RLlib's signature; `factory(env,
spaces)`, `factory(env)` and `factory()` work too). `spaces` is the runner's
`get_spaces(env_only=True)`: `{"__env_single__": (obs_space, act_space)}` for one
sub-env and `{"__env__": (...)}` for the vector env, gymnasium spaces before any
connector. `device` is always None (the rollout runs on the runner's devices).
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import gymnasium as gym
import jax
from flax import struct


@struct.dataclass
class ConnectorContext:
    """Per-step facts connectors may use (all `(B, ...)`)."""

    is_first: jax.Array  # (B,) bool: the observation is the first of its episode
    prev_action: jax.Array  # (B, *act_shape): action before this observation (0 at start)
    prev_reward: jax.Array  # (B,) float32: reward that came with this observation (0 at start)
    # None: every row acts (single-agent). (B,) bool: only these rows act at this step;
    # stateful pieces update only them (multi-agent: the agent's turns).
    mask: Any = None


class ConnectorV2:
    """Base class of connector pieces (pure; see the module docstring).

    `input_observation_space` / `action_space`: the spaces the pipeline bound (None until
    bound, unless given to the constructor)."""

    input_observation_space: gym.spaces.Space | None = None
    action_space: gym.spaces.Space | None = None
    # False for pieces that never read the context (its `is_first`, previous action and
    # reward, `mask`): a multi-agent rollout whose pieces all say so tracks none of it.
    reads_context: bool = True

    def bind_input_observation_space(self, space: gym.spaces.Space) -> None:
        """Called by the pipeline with the observation space this piece receives, before
        `recompute_observation_space`, `init_state` and `__call__`. Pieces that need a
        space and were built without one set themselves up here (and raise `ValueError`
        for a space they cannot take)."""
        self.input_observation_space = space

    def bind_action_space(self, space: gym.spaces.Space) -> None:
        """Called by the runner's connector factory call with the env's action space."""
        if self.action_space is None:
            self.action_space = space

    def recompute_observation_space(self, space: gym.spaces.Space) -> gym.spaces.Space:
        """The observation space after this piece (env-to-module pieces)."""
        return space

    def init_state(self, num_envs: int) -> Any:
        """Initial state in the carry (pytree of arrays; `()` when stateless)."""
        return ()

    def __call__(self, state: Any, x: Any, ctx: ConnectorContext) -> tuple[Any, Any]:
        raise NotImplementedError

    def get_state(self, state: Any) -> dict[str, Any]:
        """The runner-shared part of `state` (RLlib's connector state); `{}` if none."""
        return {}

    def set_state(self, state: Any, saved: dict[str, Any]) -> Any:
        """`state` with the shared part replaced by `saved` (from `get_state`)."""
        return state

    def merge_states(self, saved_states: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """Combines several runners' `get_state()` outputs into one."""
        return dict(saved_states[0]) if saved_states else {}

    @property
    def name(self) -> str:
        return type(self).__name__


class ConnectorPipeline(ConnectorV2):
    """Pieces applied in order; its state is the tuple of the pieces' states."""

    def __init__(self, pieces: Sequence[ConnectorV2] = ()):
        for piece in pieces:
            if not isinstance(piece, ConnectorV2):
                raise TypeError(
                    f"Connector pipelines take jaxrunner.connectors.ConnectorV2 pieces, got "
                    f"{piece!r}. Subclass ConnectorV2 and implement __call__(state, x, ctx)."
                )
        self.pieces = list(pieces)

    def _names(self) -> list[str]:
        names, seen = [], {}
        for piece in self.pieces:
            count = seen.get(piece.name, 0)
            seen[piece.name] = count + 1
            names.append(piece.name if count == 0 else f"{piece.name}_{count}")
        return names

    def recompute_observation_space(self, space):
        """The space after every piece; binds each piece's input space on the way."""
        self.input_observation_space = space
        for piece in self.pieces:
            piece.bind_input_observation_space(space)
            space = piece.recompute_observation_space(space)
        return space

    def bind_input_observation_space(self, space):
        # A nested pipeline binds its pieces in recompute_observation_space.
        self.input_observation_space = space

    def bind_action_space(self, space):
        super().bind_action_space(space)
        for piece in self.pieces:
            piece.bind_action_space(space)

    def init_state(self, num_envs: int):
        return tuple(piece.init_state(num_envs) for piece in self.pieces)

    def __call__(self, state, x, ctx):
        new_state = []
        for piece, piece_state in zip(self.pieces, state):
            piece_state, x = piece(piece_state, x, ctx)
            new_state.append(piece_state)
        return tuple(new_state), x

    def get_state(self, state):
        out = {}
        for name, piece, piece_state in zip(self._names(), self.pieces, state):
            saved = piece.get_state(piece_state)
            if saved:
                out[name] = saved
        return out

    def set_state(self, state, saved):
        unknown = set(saved) - set(self._names())
        if unknown:
            from jaxrunner.errors import StateStructureError

            raise StateStructureError(
                f"set_state: connector state for {sorted(unknown)}, but this pipeline has "
                f"{self._names()}."
            )
        return tuple(piece.set_state(piece_state, saved[name]) if name in saved
                     else piece_state
                     for name, piece, piece_state in zip(self._names(), self.pieces, state))

    def merge_states(self, saved_states):
        out = {}
        for name, piece in zip(self._names(), self.pieces):
            parts = [s[name] for s in saved_states if name in s]
            if parts:
                out[name] = piece.merge_states(parts)
        return out

    @property
    def reads_context(self) -> bool:  # type: ignore[override]
        return any(piece.reads_context for piece in self.pieces)

    def __len__(self) -> int:
        return len(self.pieces)

    def __repr__(self) -> str:
        return f"ConnectorPipeline({self._names()})"


def call_factory(factory: Any, env: Any, spaces: dict, *,
                 bind_action_space: bool = True) -> list[ConnectorV2]:
    """Calls a user connector factory as RLlib does (`factory(env, spaces, device)`,
    also accepting `factory(env, spaces)`, `factory(env)` or `factory()`), and returns the
    pieces as a list, each bound to the env's action space (`spaces["__env_single__"]`;
    see the module docstring for what `spaces` holds) unless `bind_action_space` is
    False (the multi-agent runner binds each agent's copy to that agent's space)."""
    try:
        params = [p for p in inspect.signature(factory).parameters.values()
                  if p.default is inspect.Parameter.empty
                  and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        count = len(params)
    except (TypeError, ValueError):
        count = 3
    args = (env, spaces, None)[:min(count, 3)]
    result = factory(*args)
    if result is None:
        return []
    pieces = list(result) if isinstance(result, (list, tuple)) else [result]
    for piece in pieces:
        if not isinstance(piece, ConnectorV2):
            raise TypeError(
                f"The connector factory {getattr(factory, '__name__', factory)!r} returned "
                f"{piece!r}; expected jaxrunner.connectors.ConnectorV2 pieces (or a list of "
                "them)."
            )
    single = spaces.get("__env_single__") if isinstance(spaces, dict) else None
    if single is not None and bind_action_space:
        for piece in pieces:
            piece.bind_action_space(single[1])
    return pieces
