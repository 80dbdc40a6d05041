"""Host multi-agent envs (RLlib `MultiAgentEnv`, PettingZoo) behind `MultiAgentEnvRunner`.

A `HostMultiAgentEngine` steps `num_envs_per_env_runner` Python copies of the env while the
policy stays compiled. It gives the runner shell the same four functions a compiled
layout gives it (`init_carry`, `reset_carry`, `init_lookback`, `chunk`; see
`jaxrunner.core.chunk`), so the shell's sampling loop (timesteps, episodes, agent steps,
failure booking and top-ups), its batches, metrics and state work unchanged, and the
results are the compiled multi-agent runner's: `MultiAgentEpisodeBatch` chunks of
`MultiAgentTrajectory`, the same cuts, lookback, final observations, per-agent and
per-module metric rings.

The engine reads and writes nothing of the runner (the single-agent host engine's
interface, `jaxrunner.runners.host_env`): `HostMultiAgentEngine(source, settings)` with a
`HostEngineSettings`; `programs(spec, mode)` compiles the layout's pieces for the runner's
`MultiAgentRolloutSpec` (the runner caches them with its other compiled functions, so a
new module rebuilds them); `fns(programs)` are the shell's four functions;
`take_failures()` hands over the env failures the runner books in
`num_env_step_failures` (resets that raised, and a failed step without
`restart_failed_sub_environments`; with it, failed steps reach the shell in the chunk
info as in the compiled runner). After an exception from `chunk` or `reset_carry` the
runner's next `sample()` must reset.

No numpy twin of the device code: every vector step runs the multi-agent layout's own
`act` (one jitted call; actions and the acting mask come back in one transfer) and its
own `after_step` (pending agent steps, reward accumulation, completion, module state) on
the host step's outcome, writing the step's record into the chunk's `(T, ...)` buffers in
place (donated); a chunk ends with the compiled chunk's own `core.chunk.finish_chunk`
(the layout's `decode`, `write_ring`, `after_ring`, `roll_lookback`, `info_extras`),
jitted once per chunk shape. The layout's env state of a host sub-env is the mask of
agents that got an observation.

RLlib's multi-agent rules on the host side of each step:

* actions go to the agents that have an observation (and are not done); an agent is
  present when its id is in the observation dict;
* an agent done without an observation in that step keeps its last observation as the
  final one (RLlib duplicates it); rewards for agents without an observation accumulate
  to their last action; `"__all__"` ends the episode for every agent and the sub-env is
  reset right away (no reset step is recorded).

Faults follow RLlib's `_try_env_step` / `_try_env_reset`: an exception from a sub-env's
`step` (or, with `check_finite`, a non-finite observation or reward) without
`restart_failed_sub_environments` raises `RuntimeError` from it (counted in
`num_env_step_failures`), and the next `sample()` starts fresh episodes on rebuilt envs.
With it, only the failed sub-env is rebuilt (from the creator, the class, or a deep copy
of the given instance) and reset: its episode ends as failed (never returned, never in
metrics, its steps of this call in `num_env_steps_discarded`) and the shell tops the call
up; `num_consecutive_sub_env_failures_tolerance` failed steps in a row of one sub-env stop
the call. Resets that raise are retried on a rebuilt env the same way.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner import lowering
from jaxrunner.core.carry import MetricRegisters
from jaxrunner.core.chunk import StepOutcome, finish_chunk
from jaxrunner.core.multi_agent_rollout import MultiAgentCarry, MultiAgentLayout
from jaxrunner.envs.host_multi_agent import ALL, HostMultiAgentEnv, HostMultiAgentSource
from jaxrunner.envs.spaces import action_dtype, to_gymnax
from jaxrunner.errors import StepFailedRecreateEnvError
from jaxrunner.runners.host_env import HostEngineSettings

logger = logging.getLogger(__name__)

RESTART_HINT = "config.fault_tolerance(restart_failed_sub_environments=True)"


class _PresenceEnv:
    """The env as the multi-agent layout sees a host sub-env: its state is the dict
    `{agent: (B,) bool}` of agents that have an observation. Nothing else is called."""

    def __init__(self, agents: tuple[str, ...]):
        self.agents = agents

    def agents_to_act(self, state: dict, params: Any) -> dict:
        return dict(state)

    def _host_only(self, *args: Any, **kwargs: Any):
        raise RuntimeError("A host multi-agent env is stepped in Python, not traced.")

    reset = step = step_env = reset_env = _host_only


def _canonical_dtype(dtype: Any) -> np.dtype:
    return np.dtype(jax.dtypes.canonicalize_dtype(np.dtype(dtype)))


def _zeros(space: gym.spaces.Space, num_envs: int) -> Any:
    """`(B, ...)` host zeros for observations of `space`, in JAX's dtypes."""
    from gymnasium.vector.utils import create_empty_array

    empty = create_empty_array(space, n=num_envs, fn=np.zeros)
    return jax.tree.map(lambda x: np.zeros(x.shape, _canonical_dtype(x.dtype)), empty)


def _put(buffer: Any, index: int, value: Any) -> None:
    """Writes one sub-env's observation into a `(B, ...)` buffer pytree."""
    if isinstance(buffer, np.ndarray):
        buffer[index] = np.asarray(value)
        return
    for buf, leaf in zip(jax.tree.leaves(buffer), jax.tree.leaves(value)):
        buf[index] = np.asarray(leaf)


def _finite(value: Any) -> bool:
    for leaf in jax.tree.leaves(value):
        leaf = np.asarray(leaf)
        if np.issubdtype(leaf.dtype, np.floating) and not np.isfinite(leaf).all():
            return False
    return True


# The bookkeeping programs run once per step or chunk on a few host-sized arrays: XLA's
# backend optimisations cost seconds of compile time there and save microseconds.
_FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _jit(fn, num_envs: int, **kwargs):
    return lowering.jit(fn, unrolled=lowering.unroll_for(num_envs),
                        compiler_options=_FAST_COMPILE, **kwargs)


def _act_fn(layout: MultiAgentLayout):
    """The layout's `act` for one host vector step: `(params, carry) -> (carry, (env
    actions, acting mask), acted)` (the compiled step's key split)."""
    def act(params, carry):
        key, act_key, _ = jax.random.split(carry.key, 3)
        env_actions, acted = layout.act(params, carry, act_key, None)
        return carry.replace(key=key), (env_actions, carry.acting), acted
    return act


class _SubEnvFailure(Exception):
    """A sub-env's step failed; `__cause__` is the user's exception."""


class HostMultiAgentEngine:
    """Steps Python multi-agent envs for a `MultiAgentEnvRunner` (module docstring).

    Attributes seen by the runner: `agents` (str agent ids, the env's `possible_agents`
    as str), `envs` (the `HostMultiAgentEnv` copies), `name`, `num_envs`,
    `observation_spaces`, `action_spaces` and `gymnax_action_spaces` (by str agent id).
    """

    def __init__(self, source: HostMultiAgentSource, settings: HostEngineSettings):
        self.settings = settings
        self.source = source
        self.name = source.name
        self.num_envs = settings.num_envs
        self.recreations = 0
        self._failures = 0  # env failures not yet handed to the runner (take_failures)
        self.envs: list[HostMultiAgentEnv | None] = [None] * self.num_envs
        for index in range(self.num_envs):
            self.envs[index] = self._build(index)
        first = self.envs[0]
        self.env_ids = first.possible_agents  # as the env names them
        self.agents = tuple(str(a) for a in self.env_ids)
        if len(set(self.agents)) != len(self.agents):
            raise ValueError(f"The agent ids of {self.name!r} {list(self.env_ids)!r} are not "
                             "distinct as strings; jaxrunner keys agents by str id.")
        self._to_index = {a: i for i, a in enumerate(self.env_ids)}
        for index, env in enumerate(self.envs[1:], start=1):
            if env.possible_agents != self.env_ids:
                raise ValueError(
                    f"Sub-env {index} of {self.name!r} has the agents "
                    f"{list(env.possible_agents)}, sub-env 0 has {list(self.env_ids)}: every "
                    "copy must have the same possible_agents.")
        self.observation_spaces = {a: first.observation_space(e)
                                   for a, e in zip(self.agents, self.env_ids)}
        self.action_spaces = {a: first.action_space(e)
                              for a, e in zip(self.agents, self.env_ids)}
        self.gymnax_action_spaces = {}
        for agent, space in self.action_spaces.items():
            action_dtype(space)  # Discrete, MultiDiscrete or Box, else a clear TypeError
            self.gymnax_action_spaces[agent] = to_gymnax(
                space, what=f"action space of agent {agent!r} of {self.name!r}")
        self._discrete = {a: isinstance(s, gym.spaces.Discrete)
                          for a, s in self.action_spaces.items()}
        self._seed_next_reset = True
        self._broken: set[int] = set()
        self._fresh = True
        self._last_obs = self._obs_zeros()
        self._agent_done = np.zeros((self.num_envs, len(self.agents)), np.bool_)

    # ------------------------------------------------------------------ envs
    def _build(self, index: int) -> HostMultiAgentEnv:
        return self.source.build(index)

    def _close(self, index: int) -> None:
        env, self.envs[index] = self.envs[index], None
        if env is not None:
            try:
                env.close()
            except Exception as error:  # noqa: BLE001 - closing a broken env may fail
                logger.warning("Closing sub-env %d of %r raised %s: %s", index, self.name,
                               type(error).__name__, error)

    def _rebuild(self, index: int) -> None:
        self._close(index)
        self.recreations += 1
        self.envs[index] = self._build(index)

    def close(self) -> None:
        for index in range(self.num_envs):
            self._close(index)

    def take_failures(self) -> int:
        """The env failures since the last call, for the runner's `num_env_step_failures`
        (a reset that raised, a failed step without `restart_failed_sub_environments`)."""
        failures, self._failures = self._failures, 0
        return failures

    def _obs_zeros(self) -> dict:
        return {a: _zeros(self.observation_spaces[a], self.num_envs) for a in self.agents}

    # ------------------------------------------------------------------ compiled pieces
    def programs(self, spec: Any, mode: str, explore: dict | None = None) -> dict:
        """The jitted pieces of the multi-agent layout for `mode`, built from the runner's
        `MultiAgentRolloutSpec` (its env is replaced by the presence masks). Only `act`
        depends on the policy mode: pass the "explore" programs as `explore` to share the
        rest. The runner caches the result with its compiled functions."""
        layout = MultiAgentLayout(dataclasses.replace(spec, env=_PresenceEnv(self.agents)),
                                  mode)
        act = _act_fn(layout)
        if explore is not None:
            return {**explore, "act": _jit(act, layout.spec.num_envs), "raw_act": act,
                    "record_shape": None}
        spec = layout.spec
        num_envs = spec.num_envs
        restart = spec.restart_failed_sub_environments

        def init(key, params, obs, present):
            key, _, layout_key = jax.random.split(key, 3)
            return MultiAgentCarry(
                env_state=present, obs=obs, key=key,
                episode_count=jnp.zeros((num_envs,), jnp.int32),
                episode_len=jnp.zeros((num_envs,), jnp.int32),
                consecutive_failures=jnp.zeros((num_envs,), jnp.int32),
                vector_step=jnp.zeros((), jnp.uint32),
                metrics=MetricRegisters.create(spec.metrics_window),
                **layout.init_fields(layout_key, obs, present, params, None))

        def reset(carry, obs, present, fresh):
            # The compiled reset_carry's key split (none before the first episodes).
            split = jax.random.key_data(jax.random.split(carry.key)[0])
            key = jax.random.wrap_key_data(
                jnp.where(fresh, jax.random.key_data(carry.key), split),
                impl=jax.random.key_impl(carry.key))
            carry = carry.replace(
                env_state=present, obs=obs, key=key,
                episode_count=carry.episode_count + jnp.where(fresh, 0, 1).astype(jnp.int32),
                episode_len=jnp.zeros_like(carry.episode_len))
            return carry.replace(**layout.reset_fields(carry, None))

        def after(carry, acted, next_obs, present, rewards, terminateds, truncateds,
                  final_obs, failed, buffers, t):
            reward, terminated, truncated, all_terminated, all_truncated = layout.outcome(
                rewards, terminateds, truncateds)
            if restart:
                all_terminated = all_terminated & ~failed
                all_truncated = all_truncated & ~failed
            ended = all_terminated | all_truncated | failed
            outcome = StepOutcome(next_obs=next_obs, env_state=present, reward=reward,
                                  terminated=terminated, truncated=truncated,
                                  final_obs=final_obs, all_terminated=all_terminated,
                                  all_truncated=all_truncated, failed=failed, ended=ended)
            fields, record = layout.after_step(carry, acted, outcome, None)
            carry = carry.replace(
                env_state=present, obs=next_obs,
                episode_count=carry.episode_count + ended.astype(jnp.int32),
                episode_len=jnp.where(ended, 0, carry.episode_len + 1),
                consecutive_failures=jnp.where(failed, carry.consecutive_failures + 1, 0),
                vector_step=carry.vector_step + jnp.uint32(1), **fields)
            record = record.replace(valid=None)
            if buffers is None:
                return carry, record, jnp.zeros((), jnp.int32)
            buffers = jax.tree.map(
                lambda buf, x: jax.lax.dynamic_update_index_in_dim(buf, x, t, 0),
                buffers, record)
            return carry, buffers, layout.record_counts(record)[1]

        def finish(carry, start, lookback, records, steps_taken, episodes_limit,
                   call_step_offset, agent_steps_done):
            # The compiled chunk's own tail, on the host-stepped rows.
            return finish_chunk(layout, carry, start, lookback, records, steps_taken,
                                episodes_limit, call_step_offset, agent_steps_done)

        return {
            "layout": layout, "init": _jit(init, num_envs), "reset": _jit(reset, num_envs),
            "act": _jit(act, num_envs),
            # The chunk's (T, ...) record buffers are updated in place.
            "after": _jit(after, num_envs, donate_argnames="buffers"),
            "finish": _jit(finish, num_envs),
            "begin": _jit(lambda carry, offset: layout.begin_chunk(carry, offset), num_envs),
            "raw_act": act, "raw_after": after, "record_shape": None,
        }

    def _record_shape(self, programs: dict, carry: MultiAgentCarry, params: Any) -> Any:
        """The per-step record's shapes (from the layout's own `act` and `after_step`)."""
        if programs["record_shape"] is None:
            host = self._host_outcome_shapes()

            def probe(carry):
                carry, _, acted = programs["raw_act"](params, carry)
                return programs["raw_after"](carry, acted, *host, None, 0)[1]

            programs["record_shape"] = jax.eval_shape(probe, carry)
        return programs["record_shape"]

    def _host_outcome_shapes(self) -> tuple:
        num_envs = self.num_envs
        obs = self._obs_zeros()
        flags = {a: np.zeros((num_envs,), np.bool_) for a in self.agents}
        flags_all = {**flags, ALL: np.zeros((num_envs,), np.bool_)}
        rewards = {a: np.zeros((num_envs,), np.float32) for a in self.agents}
        return (obs, flags, rewards, flags_all, flags_all, obs,
                np.zeros((num_envs,), np.bool_))

    # ------------------------------------------------------------------ shell functions
    def fns(self, programs: dict) -> dict:
        """The shell's `{"init_carry", "reset_carry", "init_lookback", "chunk"}` on
        `programs` (from `programs(spec, mode)`)."""
        return {"init_carry": lambda key, params, env_params: self.init_carry(
                    key, params, programs),
                "reset_carry": lambda carry, env_params: self.reset_carry(carry, programs),
                "init_lookback": lambda carry, params, env_params: self.init_lookback(
                    carry, params, programs),
                "chunk": lambda *args: self.chunk(programs, *args)}

    def init_carry(self, key: jax.Array, params: Any, programs: dict) -> MultiAgentCarry:
        """A carry of zero observations; the next `sample()` resets every sub-env."""
        present = {a: np.zeros((self.num_envs,), np.bool_) for a in self.agents}
        self._fresh = True
        return programs["init"](key, params, self._obs_zeros(), present)

    def init_lookback(self, carry: MultiAgentCarry, params: Any, programs: dict) -> Any:
        shape = self._record_shape(programs, carry, params)
        return programs["layout"].init_lookback(shape)

    def reset_carry(self, carry: MultiAgentCarry, programs: dict) -> MultiAgentCarry:
        """Resets every sub-env (rebuilding those that failed); episodes in progress are
        abandoned (new episode ids)."""
        for index in sorted(self._broken):
            self._rebuild(index)
        self._broken.clear()
        seeded = self._seed_next_reset
        self._seed_next_reset = False
        obs = self._obs_zeros()
        present = np.zeros((self.num_envs, len(self.agents)), np.bool_)
        for index in range(self.num_envs):
            self._reset_one(index, obs, present, self._seed(index) if seeded else None)
        self._last_obs = jax.tree.map(np.copy, obs)
        self._agent_done[:] = False
        fresh = self._fresh
        self._fresh = False
        return programs["reset"](carry, obs, self._presence(present), np.bool_(fresh))

    def _presence(self, present: np.ndarray) -> dict:
        return {a: present[:, i] for i, a in enumerate(self.agents)}

    def _seed(self, index: int, recreated: bool = False) -> int | None:
        seed = self.settings.seed
        if seed is None:
            return None
        if recreated:
            return int(np.random.SeedSequence([seed, index, self.recreations])
                       .generate_state(1)[0])
        return seed + index

    # ------------------------------------------------------------------ one sub-env
    def _read_obs(self, index: int, raw: dict, obs: dict, present: np.ndarray) -> None:
        """Writes the observations in `raw` into row `index` of `obs` / `present`."""
        for key, value in raw.items():
            i = self._to_index.get(key)
            if i is None:
                raise ValueError(
                    f"{self.name!r} returned an observation for {key!r}, which is not in its "
                    f"possible_agents {list(self.env_ids)}.")
            _put(obs[self.agents[i]], index, value)
            present[index, i] = True

    def _reset_one(self, index: int, obs: dict, present: np.ndarray,
                   seed: int | None) -> None:
        """`_try_env_reset`: resets sub-env `index` into row `index` (zeros for agents
        without an observation); a failing reset is retried on a rebuilt env."""
        cfg = self.settings
        failures = 0
        while True:
            for agent in self.agents:
                _put(obs[agent], index, jax.tree.map(lambda x: np.zeros_like(x[index]),
                                                     obs[agent]))
            present[index] = False
            try:
                self._read_obs(index, self.envs[index].reset(seed=seed), obs, present)
                return
            except Exception as error:  # noqa: BLE001 - RLlib's _try_env_reset
                failures += 1
                self._failures += 1
                restart = cfg.restart_failed_sub_environments
                if not restart or failures > cfg.num_consecutive_sub_env_failures_tolerance:
                    self._broken.add(index)
                    fix = (f"Set {RESTART_HINT} to recreate it and continue" if not restart
                           else f"It failed {failures} times in a row even after recreating "
                           "it: fix the env, or raise config.fault_tolerance("
                           "num_consecutive_sub_env_failures_tolerance=...)")
                    raise RuntimeError(
                        f"Resetting sub-env {index} of {self.name!r} on runner "
                        f"{cfg.worker_index} failed ({type(error).__name__}: {error}). "
                        f"{fix}; the next sample() starts on fresh envs.") from error
                logger.error("Resetting sub-env %d of %r failed (%s: %s); recreating it.",
                             index, self.name, type(error).__name__, error)
                self._rebuild(index)
                seed = self._seed(index, recreated=True)

    def _step_one(self, index: int, actions: dict, outcome: dict) -> bool:
        """Steps sub-env `index`; fills its rows of `outcome`; returns whether the episode
        ended (`"__all__"`). Raises `_SubEnvFailure` from the env's exception."""
        obs, present = outcome["next_obs"], outcome["present"]
        try:
            raw_obs, rewards, terminateds, truncateds = self.envs[index].step(actions)
            if self.settings.check_finite and not (
                    _finite(list(raw_obs.values())) and _finite(list(rewards.values()))):
                raise FloatingPointError(
                    "a non-finite observation or reward (check_finite)")
            row_rewards = np.zeros(len(self.agents), np.float32)
            for key, value in rewards.items():
                if key not in self._to_index:
                    raise ValueError(f"a reward for {key!r}, which is not in possible_agents "
                                     f"{list(self.env_ids)}")
                row_rewards[self._to_index[key]] += np.float32(value)
            flags = {}
            for what, given in (("terminated", terminateds), ("truncated", truncateds)):
                row = np.zeros(len(self.agents), np.bool_)
                for key, value in given.items():
                    if key == ALL:
                        continue
                    if key not in self._to_index:
                        raise ValueError(f"a {what} flag for {key!r}, which is not in "
                                         f"possible_agents {list(self.env_ids)}")
                    row[self._to_index[key]] = bool(value)
                flags[what] = (row, bool(given.get(ALL, False)))
            self._read_obs(index, raw_obs, obs, present)
        except Exception as error:  # noqa: BLE001 - RLlib's _try_env_step
            raise _SubEnvFailure() from error
        outcome["rewards"][index] = row_rewards
        (term, all_term), (trunc, all_trunc) = flags["terminated"], flags["truncated"]
        done = self._agent_done[index] | term | trunc
        if not (all_term or all_trunc) and done.all():
            # Every agent is done but the env did not say "__all__": the episode is over
            # (truncated if an agent's last step was cut, else terminated).
            all_trunc = bool(trunc.any())
            all_term = not all_trunc
        self._agent_done[index] = False if (all_term or all_trunc) else done
        outcome["terminated"][index] = term
        outcome["truncated"][index] = trunc
        outcome["all_terminated"][index] = all_term
        outcome["all_truncated"][index] = all_trunc and not all_term
        for i, agent in enumerate(self.agents):  # final observations: RLlib's duplicate
            if present[index, i]:
                _put(outcome["final_obs"][agent], index,
                     jax.tree.map(lambda x: x[index], obs[agent]))
        return all_term or all_trunc

    def _on_step_failure(self, index: int, error: BaseException, step: int) -> None:
        """Books a failed step of sub-env `index` (raises without restart)."""
        cfg = self.settings
        cause = error.__cause__ or error
        if not cfg.restart_failed_sub_environments:
            self._failures += 1
            self._broken.add(index)
            raise RuntimeError(
                f"Sub-env {index} of the multi-agent env {self.name!r} on runner "
                f"{cfg.worker_index} failed at vector step {step} of this chunk "
                f"({type(cause).__name__}: {cause}). Set {RESTART_HINT} to recreate failed "
                "sub-envs and continue (their episodes in progress are discarded); the next "
                "sample() starts on fresh envs.") from cause
        if not isinstance(cause, StepFailedRecreateEnvError):
            logger.error("Sub-env %d of %r failed (%s: %s); recreating it and discarding its "
                         "episode in progress.", index, self.name, type(cause).__name__,
                         cause, exc_info=not isinstance(cause, FloatingPointError))

    # ------------------------------------------------------------------ the chunk
    def chunk(self, programs, carry, lookback, params, env_params, num_steps,
              episodes_limit, agent_steps_limit, call_step_offset):
        """The compiled chunk's contract (`jaxrunner.core.chunk.make_chunk_fns`), stepped
        on the host: up to `chunk_len` vector steps, stopping after `num_steps`, once
        `episodes_limit` episodes ended or `agent_steps_limit` agent steps completed."""
        chunk_len = programs["layout"].spec.chunk_len
        carry = programs["begin"](carry, call_step_offset)
        start = carry
        buffers = jax.tree.map(lambda s: jnp.zeros((chunk_len,) + tuple(s.shape), s.dtype),
                               self._record_shape(programs, carry, params))
        limit = min(int(num_steps), chunk_len)
        count_agents = int(agent_steps_limit) < np.iinfo(np.int32).max
        episodes, agent_steps = 0, 0
        steps = 0
        while steps < limit and episodes < int(episodes_limit) and (
                not count_agents or agent_steps < int(agent_steps_limit)):
            carry, out, acted = programs["act"](params, carry)
            env_actions, acting = jax.device_get(out)
            outcome = self._host_step(env_actions, np.asarray(acting), steps)
            carry, buffers, completed = programs["after"](
                carry, acted, outcome["next_obs"], self._presence(outcome["present"]),
                outcome["reward_dict"], outcome["terminated_dict"],
                outcome["truncated_dict"], outcome["final_obs"], outcome["failed"],
                buffers, np.int32(steps))
            steps += 1
            episodes += int(outcome["episodes"])
            if count_agents:
                agent_steps += int(completed)
        return programs["finish"](carry, start, lookback, buffers, np.int32(steps),
                                  np.int32(episodes_limit), np.int32(call_step_offset),
                                  np.int32(agent_steps))

    def _host_step(self, env_actions: dict, acting: np.ndarray, step: int) -> dict:
        """Steps every sub-env with the actions of its acting agents."""
        num_envs, num_agents = self.num_envs, len(self.agents)
        outcome = {
            "next_obs": self._obs_zeros(),
            "final_obs": jax.tree.map(np.copy, self._last_obs),
            "present": np.zeros((num_envs, num_agents), np.bool_),
            "rewards": np.zeros((num_envs, num_agents), np.float32),
            "terminated": np.zeros((num_envs, num_agents), np.bool_),
            "truncated": np.zeros((num_envs, num_agents), np.bool_),
            "all_terminated": np.zeros((num_envs,), np.bool_),
            "all_truncated": np.zeros((num_envs,), np.bool_),
            "failed": np.zeros((num_envs,), np.bool_),
        }
        episodes = 0
        for index in range(num_envs):
            actions = {}
            for i, agent in enumerate(self.agents):
                if acting[index, i]:
                    value = np.asarray(env_actions[agent][index])
                    actions[self.env_ids[i]] = int(value) if self._discrete[agent] else value
            try:
                ended = self._step_one(index, actions, outcome)
            except _SubEnvFailure as failure:
                self._on_step_failure(index, failure, step)
                outcome["failed"][index] = True
                outcome["rewards"][index] = 0.0
                outcome["terminated"][index] = False
                outcome["truncated"][index] = False
                self._agent_done[index] = False
                self._rebuild(index)
                self._reset_one(index, outcome["next_obs"], outcome["present"],
                                self._seed(index, recreated=True))
                continue
            if ended:
                episodes += 1
                self._reset_one(index, outcome["next_obs"], outcome["present"], None)
        # Agents without an observation keep their last one (what a later final
        # observation duplicates); a new episode starts from the reset's.
        new_episode = outcome["all_terminated"] | outcome["all_truncated"] | outcome["failed"]
        for i, agent in enumerate(self.agents):
            keep = ~outcome["present"][:, i] & ~new_episode
            for last, new in zip(jax.tree.leaves(self._last_obs[agent]),
                                 jax.tree.leaves(outcome["next_obs"][agent])):
                new[keep] = last[keep]
        self._last_obs = jax.tree.map(np.copy, outcome["next_obs"])
        outcome["episodes"] = episodes
        outcome["reward_dict"] = {a: outcome["rewards"][:, i]
                                  for i, a in enumerate(self.agents)}
        outcome["terminated_dict"] = {**{a: outcome["terminated"][:, i]
                                         for i, a in enumerate(self.agents)},
                                      ALL: outcome["all_terminated"]}
        outcome["truncated_dict"] = {**{a: outcome["truncated"][:, i]
                                        for i, a in enumerate(self.agents)},
                                     ALL: outcome["all_truncated"]}
        return outcome


__all__ = ["HostMultiAgentEngine"]
