"""`CompiledEnvRunner`: the one runner shell over the compiled chunk (`jaxrunner.core.chunk`).

Everything a runner does around the chunk is written here once, for every agent layout:
seeding, the jit cache (one program per policy mode), size planning, the sampling loop
(timesteps, episodes, agent steps) with sub-env fault bookkeeping and top-ups, XLA
runtime-error recreation, sharding over the local devices, `get_state()`/`set_state()`
(weights, connector states, the carry), health and stop. `SingleAgentEnvRunner` and
`MultiAgentEnvRunner` fill small hooks: how the env and module are built, the rollout spec
and layout, how weights are loaded, how the returned batch is assembled and the metrics
reduced.

No Ray here: object refs in a state are resolved by `jaxrunner.distributed` before they
reach a runner.
"""

from __future__ import annotations

import abc
import hashlib
import logging
import math
import os
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.callbacks import RunnerCallbacks, device_callbacks
from jaxrunner.config import RunnerConfig
from jaxrunner.core.callbacks import CallbackError
from jaxrunner.core.ring import NO_EPISODE_LIMIT
from jaxrunner.core.faults import FAILURE_INFO_KEY
from jaxrunner.envs.context import EnvContext
from jaxrunner.errors import SampleArgumentError, StateStructureError
from jaxrunner.metrics.custom import DeviceMetrics
from jaxrunner.modules.rl_module import Deferred, init_params
from jaxrunner.runners.env_runner import EnvRunner
from jaxrunner.runners.sharding import make_env_mesh, replicate, shard_carry
from jaxrunner.structure import check_finite_tree, check_same_structure

if TYPE_CHECKING:
    from jaxrunner.sampler import Sampler

STATE_HINT = ("Pass a state produced by get_state() of a runner built from the same env "
               "and module config.")

logger = logging.getLogger(__name__)

COMPONENT_RL_MODULE = "rl_module"
COMPONENT_ENV_TO_MODULE_CONNECTOR = "env_to_module_connector"
COMPONENT_MODULE_TO_ENV_CONNECTOR = "module_to_env_connector"
COMPONENT_CARRY = "env_runner_carry"  # jaxrunner: RNG keys + device carry, only when asked
DEFAULT_COMPONENTS = (COMPONENT_RL_MODULE, COMPONENT_ENV_TO_MODULE_CONNECTOR,
                      COMPONENT_MODULE_TO_ENV_CONNECTOR)
ALL_COMPONENTS = DEFAULT_COMPONENTS + (COMPONENT_CARRY,)
STATE_KEYS = set(ALL_COMPONENTS) | {"weights_seq_no", "num_env_steps_sampled_lifetime"}
CONNECTOR_COMPONENTS = (COMPONENT_ENV_TO_MODULE_CONNECTOR, COMPONENT_MODULE_TO_ENV_CONNECTOR)
# An agent_steps-mode sample() gives up after this many vector steps without any agent
# step completing (an env whose agents never get an observation nor finish).
MAX_IDLE_VECTOR_STEPS = 100_000
# A timestep-mode sample() gives up when it has discarded more than this many env steps of
# failed episodes for each env step it was asked for (an env whose episodes nearly all fail
# would otherwise top up forever).
MAX_DISCARDED_PER_ASKED_STEP = 100
# `steps_per_loop_check="auto"` off CPU: a chunk tests its stop condition every this many
# vector steps (see `jaxrunner.core.chunk.scan_while`).
ACCELERATOR_STEPS_PER_LOOP_CHECK = 16

# Vector steps of the call before the next chunk, summed on the device (no host sync).
_add_steps = jax.jit(lambda offset, steps: (offset + steps).astype(jnp.int32))


def _as_set(components: Any) -> set[str] | None:
    if components is None:
        return None
    if isinstance(components, str):
        return {components}
    return set(components)


def _is_key(x: Any) -> bool:
    return hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jax.dtypes.prng_key)


def keys_to_data(tree: Any) -> Any:
    """`tree` with every typed PRNG key replaced by its raw key data (host-storable)."""
    return jax.tree.map(lambda x: jax.random.key_data(x) if _is_key(x) else x, tree)


def check_sample_args(num_timesteps: Any = None, num_episodes: Any = None, explore: Any = None,
                      random_actions: Any = False, force_reset: Any = False) -> None:
    """Raises `SampleArgumentError` (a `ValueError` and an `AssertionError`) for arguments
    `sample()` cannot take; shared by the runners and `EnvRunnerGroup.sample()`, which
    checks in the driver before sending.

    Args:
        num_timesteps: None or an int >= 0 (numpy integers too; not a bool).
        num_episodes: None or an int >= 0; not together with `num_timesteps`.
        explore: None (the config's `explore`), True or False.
        random_actions, force_reset: True or False.
    """
    if num_timesteps is not None and num_episodes is not None:
        raise SampleArgumentError(
            "Pass either num_timesteps or num_episodes to sample(), not both "
            f"(got num_timesteps={num_timesteps}, num_episodes={num_episodes})."
        )
    for name, value in (("num_timesteps", num_timesteps), ("num_episodes", num_episodes)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise SampleArgumentError(f"{name} must be an int >= 0, got {value!r}.")
        if value < 0:
            raise SampleArgumentError(f"{name} must be >= 0, got {value}.")
    for name, value in (("random_actions", random_actions), ("force_reset", force_reset)):
        if not isinstance(value, bool):
            raise SampleArgumentError(f"{name} must be True or False, got {value!r}.")
    if explore is not None and not isinstance(explore, bool):
        raise SampleArgumentError(f"explore must be True, False or None, got {explore!r}.")


def check_module_fits(module: Any, params: Any, obs_space: Any, act_space: Any,
                      batch_size: int, label: str) -> None:
    """Raises ValueError unless `module` (called `label` in the message) maps a batch of
    `batch_size` observations of `obs_space` (and its initial recurrent state) to
    `action_dist_inputs` of shape `(batch_size, D)` with the `D` its distribution needs for
    `act_space`. Traced with `eval_shape`: nothing runs or compiles."""
    needed = module.action_dist_cls.required_input_dim(act_space)
    obs = jax.tree.map(
        lambda s: jax.ShapeDtypeStruct((batch_size,) + tuple(s.shape), np.dtype(s.dtype)),
        obs_space, is_leaf=lambda s: isinstance(s, gym.spaces.Space)
        and not isinstance(s, (gym.spaces.Dict, gym.spaces.Tuple)))
    batch = {"obs": obs}
    if module.is_stateful():
        batch["state_in"] = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct((batch_size,) + jnp.shape(x), jnp.asarray(x).dtype),
            module.get_initial_state())
    shape = getattr(obs, "shape", None) or [o.shape for o in jax.tree.leaves(obs)]
    try:
        out = jax.eval_shape(module.forward_exploration, params, batch)
    except Exception as error:  # noqa: BLE001 - re-raised with context
        raise ValueError(
            f"{label} ({type(module).__name__}) fails on a batch of observations of shape "
            f"{shape} ({type(error).__name__}: {error})."
        ) from error
    got = getattr(out.get("action_dist_inputs"), "shape", None)
    if got != (batch_size, needed):
        raise ValueError(
            f"{label} ({type(module).__name__}) outputs action_dist_inputs of shape {got}, "
            f"but the action space {act_space} needs ({batch_size}, {needed}) for a batch of "
            f"{batch_size} observations ({module.action_dist_cls.__name__} takes {needed} "
            f"inputs per action). Make the module's last layer output {needed} values."
        )


class CompiledEnvRunner(EnvRunner):
    """The shared shell of the compiled runners (see the module docstring).

    Subclass hooks: `_init_fields()`, `make_env()`, `make_module()`, `_rollout_fns(mode)`,
    `_general_metrics()`, `_reduce_metrics()`, `_load_weights(weights)`,
    `_pipelines()`, `_make_batch(...)`; optionally `_counts_agent_steps()`,
    `_check_layout_sample_args()`, `_sample_on_host(...)`, `_carry_capturable()`.
    """

    _id_salt = ""  # keeps single- and multi-agent episode ids of one seed apart

    def __init__(self, *, config: RunnerConfig, worker_index: int | None = None,
                 num_workers: int | None = None, spaces: dict | None = None,
                 params_on_first_read: bool = False, **kwargs: Any):
        super().__init__(config=config, worker_index=worker_index, num_workers=num_workers,
                         **kwargs)
        # False: the module's params are built (their init compiled) here, at construction;
        # True (what `jaxrunner.make_sampler` passes): on their first read, so a sampler
        # that only runs inside a fused train, with params of its own, never builds them.
        self._lazy_params = bool(params_on_first_read)
        cfg = self.config
        if cfg.seed is None:
            self._seed = None
            seed_for_key = int.from_bytes(os.urandom(4), "little")
        else:
            self._seed = int(cfg.seed + (worker_index or 0) + 1_000_000 * cfg.in_evaluation)
            seed_for_key = self._seed
        self._base_key = jax.random.key(seed_for_key)
        # Episode ids: a per-runner prefix + sub-env index + per-sub-env episode counter.
        self._id_prefix = hashlib.sha1(
            f"{self._id_salt}{seed_for_key}-{worker_index}-"
            f"{os.urandom(8).hex() if cfg.seed is None else ''}".encode()).hexdigest()[:12]
        self.num_envs = cfg.num_envs_per_env_runner
        self.spaces = spaces
        self.env = None
        self.env_params = None
        self.env_name: str | None = None
        self.module = None
        self._params = None
        self._weights_seq_no = 0
        self._carry = None
        self._lookback = None
        self._needs_reset = True
        self._compiled: dict[str, Any] = {}
        self._stopped = False
        self._failures_this_call = 0
        self._mesh = make_env_mesh(self.num_envs, cfg.shard_envs_across_devices)
        self._device_callbacks = device_callbacks(cfg)
        self._device_metrics: DeviceMetrics | None = None
        self._callbacks = RunnerCallbacks(cfg)
        self._ray_counters = None
        self._init_fields()
        if (worker_index is None or worker_index > 0 or cfg.create_env_on_local_worker
                or cfg.num_env_runners == 0):
            self.make_env()
            self._env_created()
        self.make_module()
        self._bind_callbacks()

    # ------------------------------------------------------------------ params
    @property
    def _params(self) -> Any:
        """The inference module's params (with `params_on_first_read`, a new module's
        are built here, on their first read: `_set_initial_params`)."""
        return self._params_holder.value

    @_params.setter
    def _params(self, value: Any) -> None:
        self._params_holder = Deferred.built(value)

    def _set_initial_params(self, module: Any) -> Any:
        """Makes `module`'s params from this runner's key (`fold_in(base key, 1)`) the
        params, built now or, with `params_on_first_read`, on their first read (a
        `Deferred`: a sampler that only runs inside a fused train never compiles their
        init); returns what stands for them meanwhile (`_params_like()`)."""
        def build(base_key: jax.Array) -> Any:
            return jax.device_put(init_params(module, base_key, fold_in=1))

        self._params_holder = (Deferred(build, self._base_key) if self._lazy_params
                               else Deferred.built(build(self._base_key)))
        return self._params_like()

    def _params_like(self) -> Any:
        """The params, or their `jax.ShapeDtypeStruct`s while not built: for `eval_shape`
        and other traces that only need their shapes (reading them does not build them)."""
        return self._params_holder.like

    # ------------------------------------------------------------------ callbacks
    def _env_created(self) -> None:
        """Calls the host `on_environment_created` callback for the env just built."""
        self._callbacks.environment_created(self, self.env, self._env_context())

    def _bind_callbacks(self) -> None:
        """Traces the device callbacks on this runner's step view (raises
        `CallbackError` naming the callback) and sets up their host metrics."""
        if self._device_callbacks is None or self.env is None or self.module is None:
            return
        if not self._carry_is_capturable():
            raise CallbackError(
                f"Device callbacks (config.callbacks(on_episode_end=...)) run inside the "
                f"compiled rollout, but the env {self.env_name!r} is stepped on the host. "
                "Use a host callback instead: on_episode_end=jaxrunner.on_host(fn) or "
                "on_sample_end.")
        fns = self.sampler.chunk_fns("explore")  # the sampler's: callbacks traced once
        carry = jax.eval_shape(fns.init_carry, jax.random.key(0), self._params_like(),
                               self.env_params)
        names = fns.bound_callbacks(carry, self._params_like(), self.env_params).names
        cfg = self.config
        if self._device_metrics is None or self._device_metrics.names != names:
            self._device_metrics = DeviceMetrics(names, self._device_callbacks.custom_metrics,
                                                 cfg.metrics_window, cfg.num_env_runners)
            self._callbacks = RunnerCallbacks(cfg, reserved=names)

    # ------------------------------------------------------------------ hooks
    def _init_fields(self) -> None:
        """Sets the subclass's own attributes before the env and module are built."""

    @abc.abstractmethod
    def _rollout_fns(self, mode: str) -> Any:
        """The pure `ChunkFns` of this runner's layout for policy `mode`."""

    @abc.abstractmethod
    def _general_metrics(self) -> Any:
        """The `RunnerMetrics` that counts env steps, failures and sample timers."""

    @abc.abstractmethod
    def _reduce_metrics(self) -> dict[str, Any]:
        """RLlib's metrics dict from the device registers (one transfer)."""

    @abc.abstractmethod
    def _load_weights(self, weights: Any) -> Any:
        """New params from `state["rl_module"]` (validated; raises StateStructureError)."""

    @abc.abstractmethod
    def _make_batch(self, chunks: list, infos: list, lookback_at_start: Any,
                    vector_steps: int, mode: str, num_episodes: int | None,
                    discarded: int) -> Any:
        """The batch `sample()` returns."""

    def _pipelines(self) -> list[tuple[str, Any]]:
        """`(state component name, ConnectorPipeline)` of the carry's `connector_state`."""
        return []

    def _counts_agent_steps(self) -> bool:
        """Timestep sizes count completed agent steps instead of env steps."""
        return False

    def _check_layout_sample_args(self) -> None:
        """Extra checks before sampling (e.g. a multi-agent env keeps its agents)."""

    def _sample_on_host(self, mode, num_timesteps, num_episodes, force_reset):
        """A host-stepped env's `(batch, vector_steps, env_steps, discarded)`, or None."""
        return None

    def _carry_capturable(self) -> None:
        """Raises if the carry cannot be captured by get_state (host envs)."""

    def _carry_is_capturable(self) -> bool:
        try:
            self._carry_capturable()
        except ValueError:
            return False
        return self.env is not None

    def _env_context(self) -> EnvContext:
        """The `EnvContext` the env creator gets (`config.env_config` with this runner's
        `worker_index` / `num_workers` and `remote=config.remote_worker_envs`, or the
        config's own `EnvContext`)."""
        env_config = self.config.env_config
        if isinstance(env_config, EnvContext):
            return env_config
        return EnvContext(env_config, worker_index=self.worker_index,
                          num_workers=self.num_workers,
                          remote=self.config.remote_worker_envs)

    # ------------------------------------------------------------------ compiled functions
    def _chunk_len(self) -> int:
        fragment = self.config.get_rollout_fragment_length(self.worker_index or 0)
        return max(1, min(fragment, self.config.max_chunk_length))

    def _steps_per_loop_check(self) -> int:
        """`config.steps_per_loop_check`, "auto" resolved for JAX's default backend (as
        the fault check's `faults.small_leaves_check()` is): 1 on CPU (a loop test costs
        nothing there, a second traced step costs compile time),
        `ACCELERATOR_STEPS_PER_LOOP_CHECK` elsewhere."""
        value = self.config.steps_per_loop_check
        if value == "auto":
            value = 1 if jax.default_backend() == "cpu" else ACCELERATOR_STEPS_PER_LOOP_CHECK
        return max(1, min(int(value), self._chunk_len()))

    @property
    def sampler(self) -> "Sampler":
        """The pure `jaxrunner.Sampler` of this runner's env, module and connectors (built
        once per env / module build). `sample()` runs its jitted chunk; use it directly
        to sample inside your own `jax.jit` (see `Sampler.from_runner_state` /
        `Sampler.to_runner_state` to move a state between the two)."""
        if "sampler" not in self._compiled:
            from jaxrunner.sampler import Sampler

            if self.env is None:
                raise ValueError(
                    f"Sampler: the runner {self!r} has no env (a local runner of a group); "
                    "build the sampler from a config with an env.")
            if not self._carry_is_capturable():
                raise ValueError(
                    f"Sampler: the env {self.env_name!r} is stepped on the host; a pure "
                    "sampler needs a JAX env (gymnax-style reset/step).")
            self._compiled["sampler"] = Sampler(
                self, rollout_fns=self._rollout_fns, num_steps=self._chunk_len(),
                default_key=self._carry_start_key, current_params=lambda: self._params,
                params_like=self._params_like, agent_ids=tuple(getattr(self, "agent_ids", ())))
        return self._compiled["sampler"]

    def _carry_start_key(self) -> jax.Array:
        """The key a fresh carry starts from (`Sampler.default_key` too)."""
        return jax.random.fold_in(self._base_key, 2)

    def _fns(self, mode: str) -> dict:
        """The sampler's rollout functions for `mode`, jitted once per runner build."""
        return self.sampler.jitted(mode)

    def _ensure_carry(self) -> None:
        if self._carry is None:
            fns = self._fns("explore")
            self._carry = fns["init_carry"](self._carry_start_key(), self._params,
                                            self.env_params)
            self._lookback = fns["init_lookback"](self._carry, self._params, self.env_params)
            self._needs_reset = False
            self._place_on_devices()

    def _init_beside_chunk_compile(self, fns: dict) -> None:
        """A fresh runner's first carry, computed in a thread while this thread traces and
        compiles `fns`'s chunk from the carry's shapes: the init program's XLA compile
        (which runs without the GIL) overlaps the chunk's tracing, lowering and
        single-threaded HLO passes: CartPole's first `sample()` in a fresh process took
        0.56 s less on a 2-core CPU (`benchmarks/results/first_sample/`). The chunk's
        first call then finds its compiled program. Same carry, same programs as
        computing the carry first. Only where nothing else could differ: a JAX env (not
        host-stepped), one device (no sharding), no device callbacks, jit enabled."""
        if (self._carry is not None or not self._carry_is_capturable()
                or self._mesh is not None or self._device_callbacks is not None
                or "chunk_compiled" in fns or jax.config.jax_disable_jit):
            return
        init_fns = self._fns("explore")
        key, env_params = self._carry_start_key(), self.env_params
        params = self._params_like()  # shapes, while the module's params are not built
        result: dict[str, Any] = {}

        def init() -> None:
            try:
                # The params, built here (their init compiled) if not yet: beside the
                # chunk's trace and compile too.
                result["carry"] = init_fns["init_carry"](key, self._params, env_params)
                _add_steps(np.int32(0), np.int32(0))  # the chunks' offset step, compiled
            except BaseException as error:  # re-raised in the calling thread
                result["error"] = error

        thread = threading.Thread(target=init, name="jaxrunner-init-carry", daemon=True)
        thread.start()
        try:
            carry_shape = jax.eval_shape(self.sampler.chunk_fns("explore").init_carry, key,
                                         params, env_params)
            lookback = init_fns["init_lookback"](carry_shape, params, env_params)
            limit = np.int32(0)
            fns["chunk"].lower(carry_shape, lookback, params, env_params, limit, limit,
                               limit, limit).compile()
            fns["chunk_compiled"] = True
        finally:
            thread.join()
        if "error" in result:
            raise result["error"]
        self._carry, self._lookback = result["carry"], lookback
        self._needs_reset = False

    def _place_on_devices(self) -> None:
        """Shards the sub-envs over the local devices (see `jaxrunner.runners.sharding`)."""
        if self._mesh is not None and self._carry is not None:
            self._carry, self._lookback = shard_carry(self._carry, self._lookback, self._mesh)
            self._params = replicate(self._params, self._mesh)

    # ------------------------------------------------------------------ sampling
    def sample(self, *, num_timesteps: int | None = None, num_episodes: int | None = None,
               explore: bool | None = None, random_actions: bool = False,
               force_reset: bool = False) -> Any:
        """Samples `num_timesteps` steps or `num_episodes` whole episodes.

        Timestep mode returns between `n` and `n + num_envs - 1` env steps (multi-agent
        with `count_steps_by="agent_steps"`: completed agent steps, up to
        `n + num_envs * num_agents - 1`); episodes still running are cut and continue (same
        id, `t_started` = previous `t`) in the next call. Episode mode resets every sub-env
        first and returns exactly `k` episodes that started and finished in the call. With
        neither, `batch_mode` decides: "truncate_episodes" samples
        `rollout_fragment_length * num_envs` steps, "complete_episodes" `num_envs`
        episodes. A failed sub-env's episode is discarded and the call tops up to the
        asked size (with `restart_failed_sub_environments`).

        Args:
            explore: sample from the action distribution (True) or take its
                deterministic action (False); None uses `config.explore`.
            random_actions: sample the action space uniformly, ignoring the module.
            force_reset: restart every sub-env before sampling.
        """
        self._check_sample_args(num_timesteps, num_episodes, explore, random_actions,
                                force_reset)
        start_time = time.perf_counter()
        explore = self.config.explore if explore is None else explore
        mode = "random" if random_actions else ("explore" if explore else "inference")
        if num_timesteps is None and num_episodes is None:
            if self.config.batch_mode == "truncate_episodes":
                num_timesteps = (self.config.get_rollout_fragment_length(self.worker_index or 0)
                                 * self.num_envs)
            else:
                num_episodes = self.num_envs
        metrics = self._general_metrics()
        result = self._sample_on_host(mode, num_timesteps, num_episodes, force_reset)
        if result is None:
            fns = self._fns(mode)
            recreations = 0
            while True:
                try:
                    result = self._sample_chunks(fns, mode, num_timesteps, num_episodes,
                                                 force_reset)
                    break
                except jax.errors.JaxRuntimeError as error:
                    # The device program itself failed (e.g. an XLA runtime error inside
                    # the env): the whole vector env is recreated, as RLlib recreates it.
                    recreations += 1
                    metrics.env_step_failures_lifetime += 1
                    self._carry, self._needs_reset = None, True
                    tolerance = self.config.num_consecutive_sub_env_failures_tolerance
                    restart = self.config.restart_failed_sub_environments
                    if not restart or recreations > tolerance:
                        raise RuntimeError(
                            f"sample() on runner {self.worker_index} failed with an XLA "
                            f"runtime error ({error}). "
                            + ("Set config.fault_tolerance(restart_failed_sub_environments="
                               "True) to recreate the env and continue." if not restart else
                               f"It failed {recreations} times in a row "
                               "(num_consecutive_sub_env_failures_tolerance).")
                        ) from error
                    logger.exception("XLA runtime error while sampling; recreating the env.")
                    self.make_env()
                    self._env_created()
                    fns = self._fns(mode)
                    force_reset = True
        batch, vector_steps, env_steps, discarded = result
        metrics.record_sample(vector_steps=vector_steps, env_steps=env_steps,
                              discarded_env_steps=discarded, start_time=start_time,
                              end_time=time.perf_counter())
        self._record_ray_counters(vector_steps, env_steps)
        self._callbacks.sample_end(self, batch)
        return batch

    def _record_ray_counters(self, vector_steps: int, env_steps: int) -> None:
        """RLlib's Ray counters, when this process has Ray initialised."""
        if self._ray_counters is None and "ray" in sys.modules:
            from jaxrunner.distributed.metrics import ray_step_counters

            self._ray_counters = ray_step_counters(type(self).__name__)
        if self._ray_counters is not None:
            self._ray_counters.record(vector_steps=vector_steps, env_steps=env_steps)

    def _sample_chunks(self, fns, mode, num_timesteps, num_episodes, force_reset):
        """Runs compiled chunks until the call's size is reached; returns the batch and
        `(vector_steps, env_steps, discarded_env_steps)`."""
        self._init_beside_chunk_compile(fns)
        self._ensure_carry()
        if num_episodes is not None or force_reset or self._needs_reset:
            self._carry = fns["reset_carry"](self._carry, self.env_params)
            self._needs_reset = False
        self._failures_this_call = 0
        lookback_at_start = self._lookback
        chunks, infos = [], []
        vector_steps, discarded = 0, 0
        restart = self.config.restart_failed_sub_environments
        chunk_len = self._chunk_len()
        if num_episodes is not None:
            counted, returned_steps = 0, 0
            while counted < num_episodes:
                info = self._run_chunk(fns, chunk_len, num_episodes - counted, NO_EPISODE_LIMIT,
                                       vector_steps, chunks, infos)
                host = jax.device_get(info)
                self._book_failures([host], vector_steps)
                vector_steps += int(host.num_steps)
                counted += int(host.num_episodes)
                returned_steps += int(host.episode_env_steps)
            # Episodes in flight are dropped, as in RLlib; the next call starts fresh.
            self._needs_reset = True
            discarded = vector_steps * self.num_envs - returned_steps
            batch_mode = "episodes"
        elif self._counts_agent_steps():
            returned, idle = 0, 0
            while returned < num_timesteps:
                limit = min(num_timesteps - returned, int(NO_EPISODE_LIMIT))
                info = self._run_chunk(fns, chunk_len, NO_EPISODE_LIMIT, limit, vector_steps,
                                       chunks, infos)
                steps, completed, failures = (int(x) for x in jax.device_get(
                    (info.num_steps, info.agent_steps, info.num_failures)))
                if failures:
                    host = jax.device_get(info)
                    discarded += self._book_failures([host], vector_steps)
                    if restart:
                        completed -= int(host.discarded_agent_steps)
                vector_steps += steps
                returned += completed
                idle = idle + steps if completed <= 0 else 0
                if idle >= MAX_IDLE_VECTOR_STEPS:
                    raise RuntimeError(
                        f"sample(num_timesteps={num_timesteps}) with count_steps_by="
                        f"'agent_steps': the env {self.env_name!r} completed no agent step in "
                        f"{idle} vector steps (no agent got an observation or finished). "
                        "Check its agents_to_act() and termination, or count env_steps."
                    )
            batch_mode = "timesteps"
        else:
            returned = 0
            planned = math.ceil(num_timesteps / self.num_envs)
            while planned > 0:
                first_new = len(infos)
                call_offset = vector_steps
                offset = np.int32(vector_steps)  # on the device after the first chunk
                while planned > 0:
                    steps = min(planned, chunk_len)
                    info = self._run_chunk(fns, steps, NO_EPISODE_LIMIT, NO_EPISODE_LIMIT,
                                           offset, chunks, infos)
                    offset = _add_steps(offset, info.num_steps)
                    planned -= steps
                # One transfer per round of the chunks' step and failure counts (a chunk
                # stops early when its final-observation store is full); the rest of the
                # chunk infos only when a sub-env failed.
                taken, failures = jax.device_get(
                    ([info.num_steps for info in infos[first_new:]],
                     [info.num_failures for info in infos[first_new:]]))
                vector_steps += sum(int(n) for n in taken)
                if any(int(n) for n in failures):
                    discarded += self._book_failures(jax.device_get(infos[first_new:]),
                                                     call_offset)
                returned = vector_steps * self.num_envs - discarded
                if returned < num_timesteps and (
                        discarded > MAX_DISCARDED_PER_ASKED_STEP * num_timesteps):
                    self._needs_reset = True
                    raise RuntimeError(
                        f"sample(num_timesteps={num_timesteps}) on runner {self.worker_index} "
                        f"(env {self.env_name!r}) discarded {discarded} env steps of failed "
                        f"episodes and has returned {max(returned, 0)}: nearly every episode "
                        "fails (a failure flag or, with check_finite, a non-finite "
                        "observation or reward). Fix the env, or set config.fault_tolerance("
                        "check_finite=False) if its non-finite values are expected."
                    )
                if returned < num_timesteps:
                    # Failed episodes were discarded (with restart) or a chunk stopped
                    # early: top up to the promised size.
                    planned = math.ceil((num_timesteps - returned) / self.num_envs)
            batch_mode = "timesteps"
        if self._failures_this_call:
            logger.warning("%d sub-environment step failure(s) on runner %s in this sample() "
                           "call; the failed sub-environments were recreated and %d env steps "
                           "of their episodes discarded.", self._failures_this_call,
                           self.worker_index, discarded)
        # Wait for the device so timers and episode durations measure the work itself.
        jax.block_until_ready(self._carry.vector_step)
        batch = self._make_batch(chunks, infos, lookback_at_start, vector_steps, batch_mode,
                                 num_episodes, discarded if batch_mode == "timesteps" else 0)
        return batch, vector_steps, vector_steps * self.num_envs, discarded

    def _run_chunk(self, fns, num_steps: int, episodes_limit, agent_steps_limit,
                   call_offset: int, chunks: list, infos: list):
        carry, lookback, traj, info = fns["chunk"](
            self._carry, self._lookback, self._params, self.env_params, np.int32(num_steps),
            np.int32(episodes_limit), np.int32(agent_steps_limit),
            call_offset if isinstance(call_offset, jax.Array) else np.int32(call_offset))
        self._carry, self._lookback = carry, lookback
        if info.custom_metric_sums is not None:
            self._device_metrics.add_chunk_sums(info.custom_metric_sums)
        chunks.append(traj)
        infos.append(info)
        return info

    def _book_failures(self, host_infos, call_offset: int) -> int:
        """Counts sub-env failures of finished chunks; raises when recovery is off or a
        sub-env keeps failing. Returns the env steps discarded with failed episodes."""
        failures = sum(int(i.num_failures) for i in host_infos)
        discarded = sum(int(i.discarded_env_steps) for i in host_infos)
        if failures == 0:
            return 0
        self._general_metrics().env_step_failures_lifetime += failures
        offset = call_offset
        first_step, first_env = None, None
        for info in host_infos:
            if first_step is None and int(info.first_failure_step) >= 0:
                first_step = offset + int(info.first_failure_step)
                first_env = int(info.first_failure_env)
            offset += int(info.num_steps)
        if not self.config.restart_failed_sub_environments:
            self._needs_reset = True
            raise RuntimeError(
                f"Sub-environment {first_env} of runner {self.worker_index} (env "
                f"{self.env_name!r}) failed at vector step {first_step} of this sample() call "
                f"({failures} failed steps in all: the env set info[{FAILURE_INFO_KEY!r}] or, "
                "with check_finite, returned a non-finite observation or reward). Set "
                "config.fault_tolerance(restart_failed_sub_environments=True) to recreate "
                "failed sub-environments and continue; the next sample() starts fresh."
            )
        tolerance = self.config.num_consecutive_sub_env_failures_tolerance
        if max(int(i.max_consecutive_failures) for i in host_infos) > tolerance:
            self._needs_reset = True
            raise RuntimeError(
                f"A sub-environment of runner {self.worker_index} (env {self.env_name!r}) "
                f"failed more than {tolerance} steps in a row even after being recreated: it "
                "fails forever. Fix the env, or raise "
                "config.fault_tolerance(num_consecutive_sub_env_failures_tolerance=...)."
            )
        self._failures_this_call += failures
        return discarded

    def _check_sample_args(self, num_timesteps, num_episodes, explore, random_actions,
                           force_reset) -> None:
        if self._stopped:
            raise RuntimeError("This runner was stopped; create a new one to sample.")
        check_sample_args(num_timesteps, num_episodes, explore, random_actions, force_reset)
        if self.env is None:
            raise ValueError(
                "This runner has no env: it is the local runner (worker_index=0) of a group "
                "with remote runners. Sample on the remote runners, or set "
                "config.env_runners(create_env_on_local_worker=True)."
            )
        self._check_layout_sample_args()

    # ------------------------------------------------------------------ metrics
    def get_metrics(self) -> dict[str, Any]:
        """RLlib's metric keys for the steps and episodes since the last call.

        Smoothed episode keys (`episode_return_mean`, ...) cover the last
        `ceil(metrics_num_episodes_for_smoothing / num_env_runners)` finished episodes and
        are absent until an episode has finished. An episode cut across calls counts once,
        with its whole length and return; a failed sub-env's episode never counts.
        """
        general = self._general_metrics()
        general.weights_seq_no = self._weights_seq_no
        metrics = self._reduce_metrics()
        self.num_env_steps_sampled_lifetime = general.env_steps_lifetime
        if self._device_metrics is not None:
            metrics.update(self._device_metrics.reduce(self._custom_registers()))
        metrics.update(self._callbacks.logger.reduce())
        return metrics

    def _custom_registers(self) -> Any:
        """Host copies of the device custom-metric ring, with the chunks' pending sums
        absorbed (one transfer)."""
        dm = self._device_metrics
        if self._carry is None or getattr(self._carry, "callbacks", None) is None:
            dm.absorb([])
            return _empty_custom_registers(len(dm.names))
        registers, sums = jax.device_get((self._carry.callbacks.registers, dm.pending()))
        dm.absorb(sums)
        return registers

    def _custom_metrics_window(self) -> dict[str, Any]:
        """`get_metrics_window()["custom_metrics"]`: every custom metric's window values
        and the sum reported as new by the latest `get_metrics()` (see
        `jaxrunner.metrics.custom`)."""
        out = {}
        if self._device_metrics is not None:
            out.update(self._device_metrics.exports(jax.device_get(
                self._carry.callbacks.registers) if self._carry is not None
                and getattr(self._carry, "callbacks", None) is not None
                else _empty_custom_registers(len(self._device_metrics.names))))
        out.update(self._callbacks.logger.exports())
        return out

    # ------------------------------------------------------------------ state
    def get_state(self, components: Any = None, *, not_components: Any = None,
                  inference_only: bool = True, **kwargs: Any) -> dict[str, Any]:
        """The runner's state as host numpy.

        Components: "rl_module" (weights, with "weights_seq_no"),
        "env_to_module_connector", "module_to_env_connector" (connector states), and
        "env_runner_carry" (RNG keys, env states, episode counters, metric registers) only
        when asked for by name. `num_env_steps_sampled_lifetime` is always included.
        `components="all"` takes every component the runner has (all four; a host-env
        runner has no carry): `set_state()` of it on a runner built from the same config
        reproduces the next sample bit for bit. The carry alone holds neither the weights
        nor the connector states.
        """
        if components == "all":  # everything, for an exact copy of the runner
            components = [c for c in ALL_COMPONENTS
                          if c != COMPONENT_CARRY or self._carry_is_capturable()]
        wanted = _as_set(components)
        unwanted = _as_set(not_components) or set()
        for given in (wanted or set()) | unwanted:
            if given not in ALL_COMPONENTS:
                raise ValueError(
                    f"Unknown state component {given!r}; valid components are "
                    f"{list(ALL_COMPONENTS)}."
                )

        def selected(name: str) -> bool:
            if name in unwanted:
                return False
            return name in DEFAULT_COMPONENTS if wanted is None else name in wanted

        general = self._general_metrics()
        state: dict[str, Any] = {
            "num_env_steps_sampled_lifetime": general.env_steps_lifetime if general else 0}
        if selected(COMPONENT_RL_MODULE) and self._params is not None:
            state[COMPONENT_RL_MODULE] = jax.device_get(self._params)
            state["weights_seq_no"] = self._weights_seq_no
        pipelines = dict(self._pipelines())
        for index, name in enumerate(CONNECTOR_COMPONENTS):
            if not selected(name):
                continue
            if name in pipelines and self.env is not None:
                self._ensure_carry()
                state[name] = jax.device_get(
                    pipelines[name].get_state(self._carry.connector_state[index]))
            else:
                state[name] = {}
        if selected(COMPONENT_CARRY) and self.env is not None:
            self._carry_capturable()
            self._ensure_carry()
            if self._device_metrics is not None:
                self._device_metrics.absorb(jax.device_get(self._device_metrics.pending()))
            carry, lookback = jax.device_get((keys_to_data(self._carry), self._lookback))
            state[COMPONENT_CARRY] = {
                "carry": carry, "lookback": lookback, "needs_reset": self._needs_reset,
                "key_impl": str(jax.random.key_impl(self._carry.key)),
                "metrics": self._metrics.get_state(),
                "custom_metrics": {
                    "device": (self._device_metrics.get_state()
                               if self._device_metrics is not None else None),
                    "host": self._callbacks.logger.get_state()},
            }
        return state

    def set_state(self, state: dict[str, Any]) -> None:
        """Restores `get_state()` output. Weights apply only if `weights_seq_no` is 0 or
        newer than the runner's; a wrong structure raises `StateStructureError` and leaves
        the runner as it was."""
        if not isinstance(state, dict):
            raise StateStructureError(
                f"set_state expects the dict get_state() returns, got {type(state).__name__}."
            )
        unknown = set(state) - STATE_KEYS
        if unknown:
            raise StateStructureError(
                f"set_state: unknown keys {sorted(unknown)}; expected some of "
                f"{sorted(STATE_KEYS)}."
            )
        pipelines = dict(self._pipelines())
        for name in CONNECTOR_COMPONENTS:
            if name in state and state[name] not in ({}, None) and name not in pipelines:
                raise StateStructureError(
                    f"set_state: {name} carries state {state[name]!r}, but this runner's "
                    "pipeline has no stateful connectors.")
        # Validate everything before changing anything.
        new_params, seq = None, int(state.get("weights_seq_no", 0) or 0)
        if COMPONENT_RL_MODULE in state and (seq == 0 or seq > self._weights_seq_no):
            if self.module is None:
                raise ValueError("set_state: this runner has no module to load weights into.")
            check_finite_tree(state[COMPONENT_RL_MODULE], "set_state: rl_module weights")
            new_params = self._load_weights(state[COMPONENT_RL_MODULE])
        carry_state = state.get(COMPONENT_CARRY)
        new_carry = None
        if carry_state is not None:
            self._carry_capturable()
            self._ensure_carry()
            current = jax.device_get((keys_to_data(self._carry), self._lookback))
            check_same_structure(current, (carry_state["carry"], carry_state["lookback"]),
                                 "set_state: the env_runner_carry", hint=STATE_HINT)
            impl = carry_state.get("key_impl") or jax.random.key_impl(self._carry.key)
            restored = jax.tree.map(
                lambda old, new: (jax.random.wrap_key_data(jnp.asarray(new), impl=impl)
                                  if _is_key(old) else jnp.asarray(new, old.dtype)),
                self._carry, carry_state["carry"])
            new_carry = (restored, jax.device_put(carry_state["lookback"]))
        connector_updates = {}
        for index, name in enumerate(CONNECTOR_COMPONENTS):
            saved = state.get(name)
            if not saved or name not in pipelines:
                continue
            if self.env is None:
                raise StateStructureError(
                    f"set_state: this runner has no env, so no {name} to restore.")
            if not isinstance(saved, dict):
                raise StateStructureError(
                    f"set_state: {name} must be the dict get_state() returns, got "
                    f"{type(saved).__name__}.")
            self._ensure_carry()
            base = (new_carry[0] if new_carry is not None else self._carry).connector_state
            connector_updates[index] = pipelines[name].set_state(base[index], saved)
        # Apply.
        if new_params is not None:
            self._params = new_params
            if seq > 0:
                self._weights_seq_no = seq
        general = self._general_metrics()
        if "num_env_steps_sampled_lifetime" in state and general is not None:
            general.env_steps_lifetime = int(state["num_env_steps_sampled_lifetime"])
            self.num_env_steps_sampled_lifetime = general.env_steps_lifetime
        if new_carry is not None:
            self._carry, self._lookback = new_carry
            self._needs_reset = bool(carry_state["needs_reset"])
            self._metrics.set_state(carry_state["metrics"])
            custom = carry_state.get("custom_metrics") or {}
            if custom.get("device") is not None and self._device_metrics is not None:
                self._device_metrics.set_state(custom["device"])
            if custom.get("host") is not None:
                self._callbacks.logger.set_state(custom["host"])
        if connector_updates:
            states = list(self._carry.connector_state)
            for index, value in connector_updates.items():
                states[index] = jax.tree.map(jnp.asarray, value)
            self._carry = self._carry.replace(connector_state=tuple(states))
        if new_params is not None or new_carry is not None or connector_updates:
            self._place_on_devices()

    def merge_connector_states(self, states: list[dict]) -> dict:
        """Combines several runners' connector components (from `get_state`) into one,
        e.g. mean-std statistics of the union of their samples."""
        out = {}
        for name, pipeline in self._pipelines():
            parts = [s[name] for s in states if s.get(name)]
            if parts:
                out[name] = pipeline.merge_states(parts)
        return out

    # ------------------------------------------------------------------ the rest
    def assert_healthy(self) -> None:
        if self._stopped:
            raise AssertionError("The runner was stopped.")
        if self.env is None or self.module is None:
            raise AssertionError(
                f"Runner (worker_index={self.worker_index}) is not healthy: env="
                f"{self.env_name!r}, module={type(self.module).__name__ if self.module else None}."
            )

    def stop(self) -> None:
        """Releases the carry and compiled functions; safe to call again."""
        self._stopped = True
        self._carry = None
        self._lookback = None
        self._compiled = {}

    @property
    def weights_seq_no(self) -> int:
        return self._weights_seq_no


__all__ = ["ALL_COMPONENTS", "COMPONENT_CARRY", "COMPONENT_ENV_TO_MODULE_CONNECTOR",
           "COMPONENT_MODULE_TO_ENV_CONNECTOR", "COMPONENT_RL_MODULE", "CompiledEnvRunner",
           "DEFAULT_COMPONENTS", "STATE_KEYS", "check_module_fits", "check_sample_args",
           "keys_to_data"]


def _empty_custom_registers(num_metrics: int) -> Any:
    from jaxrunner.core.callbacks import CustomRegisters

    return jax.device_get(CustomRegisters.create(1, num_metrics))
