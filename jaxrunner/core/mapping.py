"""Agent-to-module mapping evaluated on device.

`policy_mapping_fn(agent_id, episode)` runs inside the compiled rollout, once per
(sub-env, agent) when an episode starts. Its `episode` argument is a `MappingEpisode`:

* `episode.key`: a typed PRNG key, one per episode: `fold_in(fold_in(mapping_key,
  env_index), index)` with the runner's mapping key (derived from its seed). It is the
  same for every agent of the episode, so agents can draw consistent random decisions
  (e.g. which side the main policy plays in self-play).
* `episode.index`: `() int32`, the episode's index on its sub-env (0 for the first
  episode after the runner started, +1 per episode, also for episodes abandoned by a
  reset).
* `episode.env_index`: `() int32`, the sub-env index.
* `episode.module_ids`: the configured module ids (sorted tuple, static).
* `episode.coin(p=0.5)`: a `() bool` array, True with probability `p`, drawn from
  `episode.key` (so the same for every agent of the episode): the usual condition for
  `episode.choose`.

`policy_mapping_fn` is traced, not run on concrete values: a Python `if`, `bool()` or
`int()` on anything derived from `episode` raises a `TypeError` (`MappingTraceError`)
before anything is compiled, pointing at `episode.choose`.

The function returns either a module id `str` (a static mapping, decided while tracing:
it may depend on `agent_id` only) or a `ModuleChoice` made with `episode.choose(...)`,
`episode.random_module(...)` or `episode.pick(...)`: a traced index into a static tuple
of candidate module ids. Because every possible result is known while tracing, a
mapping to an unknown module id is an `UnknownModuleError` before anything is compiled,
and the rollout runs each module only on the agents that can map to it.

Self-play example (sides drawn at random per episode)::

    def mapping(agent_id, episode):
        main_is_x = episode.coin()
        plays_x = agent_id == "player_x"
        return episode.choose(main_is_x == plays_x, "main", "opponent")
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct


class UnknownModuleError(ValueError):
    """`policy_mapping_fn` maps an agent to a module id that is not configured."""


class MappingTraceError(TypeError):
    """`policy_mapping_fn` branches in Python on a traced episode value (a plain
    `TypeError` whose message points at `episode.choose`)."""


# The errors JAX raises when Python code needs a concrete value from a tracer.
_TRACER_ERRORS = (jax.errors.ConcretizationTypeError, jax.errors.TracerBoolConversionError,
                  jax.errors.TracerIntegerConversionError,
                  jax.errors.TracerArrayConversionError)


def _check_ids(ids: Sequence[str], module_ids: tuple[str, ...], what: str) -> None:
    for module_id in ids:
        if module_id not in module_ids:
            raise UnknownModuleError(
                f"{what} names module id {module_id!r}, which is not one of the configured "
                f"modules {list(module_ids)}. Add it to config.multi_agent(policies=...) or "
                "return one of those ids."
            )


@struct.dataclass
class ModuleChoice:
    """A module id chosen on device: `candidates[index]`."""

    index: jax.Array  # () int32: index into `candidates`
    candidates: tuple[str, ...] = struct.field(pytree_node=False)

    @property
    def module_id(self) -> str:
        """The chosen id (only for a concrete, not traced, index)."""
        return self.candidates[int(np.asarray(self.index))]


@struct.dataclass
class MappingEpisode:
    """The `episode` argument of `policy_mapping_fn` (see the module docstring)."""

    key: jax.Array  # () typed PRNG key, one per episode (same for all its agents)
    index: jax.Array  # () int32: episode index on the sub-env
    env_index: jax.Array  # () int32: sub-env index
    module_ids: tuple[str, ...] = struct.field(pytree_node=False, default=())

    def coin(self, p: float = 0.5) -> jax.Array:
        """`() bool`, True with probability `p`; the same for every agent of the episode."""
        return jax.random.bernoulli(self.key, p)

    def choose(self, condition: Any, if_true: str, if_false: str) -> ModuleChoice | str:
        """`if_true` where `condition` (a bool or `() bool` array) holds, else `if_false`."""
        _check_ids((if_true, if_false), self.module_ids, "episode.choose()")
        if isinstance(condition, (bool, np.bool_)):
            return if_true if condition else if_false
        if if_true == if_false:
            return if_true
        index = jnp.where(jnp.asarray(condition, jnp.bool_), 0, 1).astype(jnp.int32)
        return ModuleChoice(index=index, candidates=(if_true, if_false))

    def random_module(self, module_ids: Sequence[str], p: Sequence[float] | None = None
                      ) -> ModuleChoice:
        """One of `module_ids`, drawn with probabilities `p` (uniform if None) from
        `fold_in(key, 1)`, so it is independent of `coin()`."""
        module_ids = tuple(module_ids)
        _check_ids(module_ids, self.module_ids, "episode.random_module()")
        if not module_ids:
            raise ValueError("episode.random_module() needs at least one module id.")
        probs = None if p is None else jnp.asarray(p, jnp.float32)
        index = jax.random.choice(jax.random.fold_in(self.key, 1), len(module_ids), p=probs)
        return ModuleChoice(index=index.astype(jnp.int32), candidates=module_ids)

    def pick(self, index: Any, module_ids: Sequence[str]) -> ModuleChoice:
        """`module_ids[index]` for a traced integer `index` (clipped into range)."""
        module_ids = tuple(module_ids)
        _check_ids(module_ids, self.module_ids, "episode.pick()")
        index = jnp.clip(jnp.asarray(index, jnp.int32), 0, len(module_ids) - 1)
        return ModuleChoice(index=index, candidates=module_ids)


def mapping_episode(mapping_key: jax.Array, env_index: Any, episode_index: Any,
                    module_ids: tuple[str, ...]) -> MappingEpisode:
    """The `MappingEpisode` of episode `episode_index` on sub-env `env_index`."""
    env_index = jnp.asarray(env_index, jnp.int32)
    episode_index = jnp.asarray(episode_index, jnp.int32)
    key = jax.random.fold_in(jax.random.fold_in(mapping_key, env_index), episode_index)
    return MappingEpisode(key=key, index=episode_index, env_index=env_index,
                          module_ids=module_ids)


def default_policy_mapping_fn(module_ids: tuple[str, ...]) -> Callable:
    """RLlib's default (every agent to "default_policy"), or the only module if there is
    just one."""
    if len(module_ids) == 1:
        only = module_ids[0]
        return lambda agent_id, episode: only
    if "default_policy" in module_ids:
        return lambda agent_id, episode: "default_policy"
    raise ValueError(
        f"config.multi_agent(policies={sorted(module_ids)}) has several modules and no "
        "policy_mapping_fn: set policy_mapping_fn=(agent_id, episode) -> module id."
    )


@dataclasses.dataclass(frozen=True)
class AgentMapping:
    """What tracing `policy_mapping_fn` found out, for every agent (static)."""

    fn: Callable
    agent_ids: tuple[str, ...]
    module_ids: tuple[str, ...]
    candidates: dict  # agent id -> tuple of module ids it may map to

    @property
    def is_static(self) -> bool:
        return all(len(c) == 1 for c in self.candidates.values())

    def static_indices(self) -> np.ndarray:
        """`(A,) int32` module index of every agent (static mappings only)."""
        return np.asarray([self.module_ids.index(self.candidates[a][0])
                           for a in self.agent_ids], np.int32)

    def indices(self, mapping_key: jax.Array, env_index: Any, episode_index: Any
                ) -> jax.Array:
        """`(A,) int32` module index (into `module_ids`) of every agent for one episode."""
        if self.is_static:
            return jnp.asarray(self.static_indices())
        episode = mapping_episode(mapping_key, env_index, episode_index, self.module_ids)
        out = []
        for agent in self.agent_ids:
            result = self.fn(agent, episode)
            if isinstance(result, str):
                out.append(jnp.asarray(self.module_ids.index(result), jnp.int32))
            else:
                table = jnp.asarray([self.module_ids.index(c) for c in result.candidates],
                                    jnp.int32)
                out.append(table[result.index])
        return jnp.stack(out)


def trace_mapping(fn: Callable, agent_ids: tuple[str, ...], module_ids: tuple[str, ...],
                  key_impl: Any = None) -> AgentMapping:
    """Evaluates `fn` for every agent on an abstract episode and checks the results.

    Raises `UnknownModuleError` for an id that is not in `module_ids` and `TypeError`
    for a result that is neither a str nor a `ModuleChoice`, or a function that cannot
    be traced.
    """
    found: dict[str, tuple[str, ...]] = {}

    def probe(key, index, env_index):
        episode = MappingEpisode(key=key, index=index, env_index=env_index,
                                 module_ids=module_ids)
        for agent in agent_ids:
            result = fn(agent, episode)
            if isinstance(result, str):
                _check_ids((result,), module_ids,
                           f"policy_mapping_fn({agent!r}, episode)")
                found[agent] = (result,)
            elif isinstance(result, ModuleChoice):
                _check_ids(result.candidates, module_ids,
                           f"policy_mapping_fn({agent!r}, episode)")
                index_value = jnp.asarray(result.index)
                if index_value.shape != () or not jnp.issubdtype(index_value.dtype,
                                                                  jnp.integer):
                    raise TypeError(
                        f"policy_mapping_fn({agent!r}, episode) returned a ModuleChoice "
                        f"whose index has shape {index_value.shape} and dtype "
                        f"{index_value.dtype}; it must be a () integer."
                    )
                found[agent] = tuple(dict.fromkeys(result.candidates))
            else:
                raise TypeError(
                    f"policy_mapping_fn({agent!r}, episode) returned {result!r} "
                    f"({type(result).__name__}); it must return a module id (str) or a "
                    "choice made with episode.choose(), episode.random_module() or "
                    "episode.pick()."
                )
        return jnp.zeros(())

    key = jax.random.key(0) if key_impl is None else jax.random.key(0, impl=key_impl)
    try:
        jax.eval_shape(probe, key, jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32))
    # JAX's tracer errors subclass TypeError: they must be caught before the re-raise
    # of our own TypeErrors below, or the raw tracer error escapes.
    except _TRACER_ERRORS as error:
        raise MappingTraceError(
            "policy_mapping_fn(agent_id, episode) is evaluated on device, inside the "
            "compiled rollout, so it cannot branch in Python (if/else, bool(), int()) on "
            f"episode values ({type(error).__name__}). Use episode.choose(condition, id_a, "
            "id_b), episode.random_module(ids) or episode.pick(index, ids) instead of "
            "if/else; episode.coin(p) gives a () bool draw to choose on, e.g. "
            "episode.choose(episode.coin(), 'main', 'opponent')."
        ) from error
    except (UnknownModuleError, TypeError):
        raise
    return AgentMapping(fn=fn, agent_ids=agent_ids, module_ids=module_ids,
                        candidates=found)


__all__ = ["AgentMapping", "MappingEpisode", "MappingTraceError", "ModuleChoice",
           "UnknownModuleError",
           "default_policy_mapping_fn", "mapping_episode", "trace_mapping"]
