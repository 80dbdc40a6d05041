"""`EnvRunnerGroup`: a local runner plus `num_env_runners` remote runners on Ray actors.

The same code runs on a laptop and on a cluster::

    group = EnvRunnerGroup(config=config.env_runners(num_env_runners=4))
    batches = group.sample()                   # one EpisodeBatch per healthy runner
    group.sync_weights(new_params)             # one ray.put, the reference sent to all
    metrics = group.get_metrics()              # means over all runners' episodes
    group.stop()

Without a running Ray instance the group calls `ray.init()` (which joins the cluster named by
`RAY_ADDRESS` or a local `ray start`, else starts a local instance); `ray_address=` joins a
given cluster. With `num_env_runners=0` there is no Ray at all: the local runner samples.

Layout (RLlib's): remote runners have `worker_index` 1..N and `num_workers` N; the local
runner has index 0 and, when remote runners exist, no env (unless
`create_env_on_local_worker`): it gets the spaces from remote runner 1 and holds the
module, so the group can validate and hand out weights. All runners start with the local
runner's weights. Fault tolerance follows `config.fault_tolerance()`; see
`jaxrunner.distributed.actor_manager`.
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Callable, Iterable, Sequence

import jax
import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from jaxrunner.config import RunnerConfig
from jaxrunner.distributed.actor_manager import (
    EnvRunnerFailedError,
    FaultPolicy,
    FaultTolerantActorManager,
    RunnerSlot,
)
from jaxrunner.distributed.metrics import GroupCounters, aggregate
from jaxrunner.distributed.remote_runner import (
    RemoteEnvRunner,
    actor_options,
    call_runner,
    node_info,
)
from jaxrunner.distributed.sample_args import check_sample_args
from jaxrunner.envs import registry
from jaxrunner.envs.context import EnvContext
from jaxrunner.envs.gymnasium_env import ENVPOOL_PREFIX, GYMNASIUM_PREFIX, resolve_env
from jaxrunner.envs.multi_agent import JAXMARL_PREFIX
from jaxrunner.fork_warning import ignore_subprocess_fork_warning
from jaxrunner.metrics import keys
from jaxrunner.runners.env_runner import EnvRunner
from jaxrunner.runners.selection import runner_class_for

logger = logging.getLogger("jaxrunner.distributed")

_REMOTE_RUNNER = ray.remote(RemoteEnvRunner)
_CONNECTOR_COMPONENTS = ("env_to_module_connector", "module_to_env_connector")
_LIFETIME = "num_env_steps_sampled_lifetime"
_DEFAULT = object()
# Methods of the remote wrapper that a `foreach_env_runner("name")` may call.
_WRAPPER_NAMES = ("get_node_info",)


def _runner_class(config: RunnerConfig) -> type:
    """`runner_class_for(config)` (RLlib's rule), checked to be an `EnvRunner` subclass."""
    cls = runner_class_for(config)
    if not (isinstance(cls, type) and issubclass(cls, EnvRunner)):
        raise TypeError(f"config.env_runner_cls must be a jaxrunner.EnvRunner subclass, got "
                        f"{cls!r}.")
    return cls


def init_ray(**kwargs: Any) -> None:
    """`ray.init(**kwargs)` without JAX's fork warning.

    Ray starts its own processes (GCS, raylet, ...) with `subprocess.Popen(...,
    preexec_fn=...)`, and CPython runs the fork handlers for such a child, including JAX's,
    which warns of a deadlock whenever a JAX backend exists (gymnax creates arrays when it
    is imported, so one always does after `import jaxrunner`). The child only runs the
    preexec function and exec()s Ray's binary, so JAX never runs there: only warnings
    raised from inside `subprocess` are silenced, for this call only.
    """
    with warnings.catch_warnings():
        ignore_subprocess_fork_warning()
        ray.init(**kwargs)


def _registered_creator(name: str) -> Callable:
    """The creator the driver registered as `name` (runner processes register it too, so
    names given to `jaxrunner.register_env` in the driver resolve there)."""
    return registry.registered_env_creator(name)


def _check_timeout(name: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{name} must be None (no limit) or a number >= 0, got {value!r}.")
    return float(value)


def _check_env_name(config: RunnerConfig) -> None:
    """Fails fast, in the driver, on an env name no runner could resolve."""
    env = config.env
    if env is None:
        raise ValueError(
            "No env is configured: call config.environment(env=...) with a gymnax id (e.g. "
            "'CartPole-v1'), a name given to jaxrunner.register_env, or a creator.")
    if isinstance(env, str) and env.startswith((GYMNASIUM_PREFIX, ENVPOOL_PREFIX)):
        # A host (gymnasium / EnvPool) env: the id must be registered (resolving raises if
        # not; the vector env itself is only built by the runners).
        resolve_env(env, EnvContext(config.env_config), 1)
    elif isinstance(env, str) and env.startswith(JAXMARL_PREFIX):
        pass  # a JaxMARL id: only the multi-agent runners resolve these (import jaxmarl)
    elif (isinstance(env, str) and registry.named_env_creator(env) is None
            and env not in registry.gymnax_env_ids(runnable_only=False)):
        registry.make_jax_env(env, EnvContext(config.env_config))  # raises the usual error


class EnvRunnerGroup:
    """A local env runner and `config.num_env_runners` remote ones on Ray actors.

    Args:
        config: a `RunnerConfig`; `env_runners()` sets the number of remote runners and
            their resources (`num_cpus_per_env_runner`, `num_gpus_per_env_runner`),
            `fault_tolerance()` how failures are handled.
        ray_address: the cluster to join when Ray is not initialised yet (default: what
            `ray.init()` finds, else a new local instance).
        actor_options: extra Ray actor options for the remote runners, merged over the
            defaults (`num_cpus`, `num_gpus`, `max_restarts`, `scheduling_strategy="SPREAD"`,
            `runtime_env={"env_vars": {"JAX_PLATFORMS": ..., "XLA_PYTHON_CLIENT_PREALLOCATE":
            "false"}}`, plus the driver's `jaxrunner.enable_compilation_cache` directory,
            which lets new and restarted runners load their compiled rollout from disk).
    """

    def __init__(self, *, config: RunnerConfig, ray_address: str | None = None,
                 actor_options: dict[str, Any] | None = None):
        if not isinstance(config, RunnerConfig):
            raise TypeError(
                f"config must be a jaxrunner.RunnerConfig, got {type(config).__name__}. For "
                "an RLlib AlgorithmConfig use RunnerConfig.from_rllib(algo_config).")
        if actor_options is not None and not isinstance(actor_options, dict):
            raise TypeError(f"actor_options must be a dict of Ray actor options, got "
                            f"{actor_options!r}.")
        self.config = config.copy(copy_frozen=False)
        cfg = self.config
        self._runner_cls = _runner_class(cfg)
        _check_env_name(cfg)
        self._stopped = False
        self._counters = GroupCounters()
        self._weights_seq_no = 0
        self._weights_ref = None
        self._connector_states: dict[str, Any] = {}
        self._late_samples: list[tuple[int, Any, Any]] = []
        self._num_sample_timeouts = 0
        self._dropped_env_steps = 0
        self._restored_since_probe: set[int] = set()
        self._manager = FaultTolerantActorManager([], FaultPolicy.from_config(cfg))
        num_remote = cfg.num_env_runners
        if num_remote == 0:
            self._local = self._runner_cls(config=cfg, worker_index=0, num_workers=0)
            return
        if not ray.is_initialized():
            init_ray(**({} if ray_address is None else {"address": ray_address}))
        elif ray_address is not None:
            logger.warning("Ray is already initialised; ray_address=%r is ignored.", ray_address)
        self._start_remote_runners(num_remote, actor_options)
        try:
            kwargs = {}
            if not cfg.create_env_on_local_worker:
                kwargs["spaces"] = self._call_one("get_spaces")
            self._local = self._runner_cls(config=cfg, worker_index=0,
                                           num_workers=num_remote, **kwargs)
            # Every runner starts with the local runner's weights (seq 0).
            weights = self._local.get_state(components="rl_module")
            self._weights_ref = ray.put({"rl_module": weights["rl_module"],
                                         "weights_seq_no": 0})
            self._manager.call(self._manager.healthy_ids(),
                               lambda slot: slot.actor.set_state.remote(self._weights_ref),
                               timeout_s=cfg.env_runner_restore_timeout_s)
        except BaseException:
            self._manager.kill_all()
            raise

    def _start_remote_runners(self, num_remote: int, extra_options: dict | None) -> None:
        cfg = self.config
        options = actor_options(cfg, extra_options)
        registered = ({cfg.env: _registered_creator(cfg.env)}  # ship the driver's creator
                      if isinstance(cfg.env, str) and cfg.env in registry.registered_env_names()
                      else {})
        wanted_cpus = num_remote * cfg.num_cpus_per_env_runner
        available = ray.cluster_resources().get("CPU", 0.0)
        if wanted_cpus > available:
            logger.warning(
                "%d env runners x num_cpus_per_env_runner=%s need %s CPUs, but the Ray cluster "
                "has %s; runners wait until CPUs are free.", num_remote,
                cfg.num_cpus_per_env_runner, wanted_cpus, available)
        slots = [RunnerSlot(worker_index=i, actor=_REMOTE_RUNNER.options(**options).remote(
                     self._runner_cls, cfg, i, num_remote, registered))
                 for i in range(1, num_remote + 1)]
        self._manager = FaultTolerantActorManager(slots, FaultPolicy.from_config(cfg))
        refs = {slot.actor.assert_healthy.remote(): slot.worker_index for slot in slots}
        for ref, worker_index in refs.items():
            try:
                ray.get(ref)
            except RayError as error:
                self._manager.kill_all()
                raise EnvRunnerFailedError(
                    f"EnvRunner {worker_index} could not be created: {error}") from None

    def _call_one(self, method: str, *args: Any) -> Any:
        """`method` on the first healthy remote runner."""
        for worker_index in self._manager.healthy_ids():
            results, _ = self._manager.call(
                [worker_index], lambda slot: slot.actor.apply.remote(method, args),
                timeout_s=self.config.env_runner_health_probe_timeout_s)
            if results and results[0].ok:
                return results[0].value
        raise EnvRunnerFailedError(f"No healthy remote env runner answered {method}().")

    # ------------------------------------------------------------------ properties
    @property
    def local_env_runner(self) -> EnvRunner:
        """The local runner (worker_index 0)."""
        return self._local

    def num_remote_env_runners(self) -> int:
        return len(self._manager.slots)

    def healthy_env_runner_ids(self) -> list[int]:
        return self._manager.healthy_ids()

    def num_healthy_remote_env_runners(self) -> int:
        return len(self._manager.healthy_ids())

    def num_remote_worker_restarts(self) -> int:
        """Restarts completed (runner back, state restored) since the group started."""
        return self._manager.num_restarts

    def num_in_flight_async_reqs(self, tag: str | None = None) -> int:
        return self._manager.num_in_flight(tag)

    def num_env_runners_dropped_lifetime(self) -> int:
        """Remote responses dropped because they came after a timeout."""
        return self._manager.num_dropped

    @property
    def weights_seq_no(self) -> int:
        """The `weights_seq_no` of the last `sync_weights()`."""
        return self._weights_seq_no

    def _check_running(self) -> None:
        if self._stopped:
            raise RuntimeError("This EnvRunnerGroup was stopped; create a new one.")

    @property
    def _has_remote(self) -> bool:
        return bool(self._manager.slots)

    def _local_has_env(self) -> bool:
        return getattr(self._local, "env", None) is not None

    # ------------------------------------------------------------------ sampling
    def sample(self, *, num_timesteps: int | None = None, num_episodes: int | None = None,
               explore: bool | None = None, random_actions: bool = False,
               force_reset: bool = False, timeout_seconds: Any = _DEFAULT) -> list:
        """Samples on every healthy remote runner in parallel (on the local runner when
        there are none); returns their batches in `worker_index` order.

        The size arguments are per runner (each runner's `sample()` contract). Batches
        arrive as host numpy. A runner that does not answer within `timeout_seconds`
        (default `config.sample_timeout_s`; None: no limit) is left out: its batch is
        dropped when it comes, and counted in `get_metrics()["fault_tolerance"]`
        (`num_env_runner_sample_timeouts`, `num_env_steps_dropped_lifetime`). Failed
        runners are left out too; runners that restarted are restored first.
        """
        self._check_running()
        timeout = _check_timeout("timeout_seconds", self.config.sample_timeout_s
                                 if timeout_seconds is _DEFAULT else timeout_seconds)
        kwargs = dict(num_timesteps=num_timesteps, num_episodes=num_episodes, explore=explore,
                      random_actions=random_actions, force_reset=force_reset)
        # In the driver, before anything is sent: a bad argument is one clear error here,
        # not one per runner (and no Ray "Unhandled error" for results nobody fetches).
        check_sample_args(**kwargs)
        if not self._has_remote:
            return [self._local.sample(**kwargs)]
        self._collect_late_samples()
        if self.config.restart_failed_env_runners and self._manager.restorable_ids():
            self._restore_unhealthy(None)
        ids = self._manager.healthy_ids()
        if not ids:
            raise EnvRunnerFailedError(self._no_healthy_message())
        batch_refs: dict[int, Any] = {}
        info_refs: dict[int, Any] = {}

        def submit(slot):
            # Two objects: the small info is waited on, the batch fetched only if in time.
            batch_refs[slot.worker_index], info_refs[slot.worker_index] = (
                slot.actor.sample.remote(kwargs))
            return info_refs[slot.worker_index]

        results, timed_out = self._manager.call(ids, submit, timeout_s=timeout)
        for worker_index in timed_out:
            self._num_sample_timeouts += 1
            self._late_samples.append((worker_index, info_refs[worker_index],
                                       batch_refs[worker_index]))
            logger.warning("EnvRunner %d did not return its sample within %ss; its batch "
                           "will be dropped.", worker_index, timeout)
        return [ray.get(batch_refs[r.worker_index]) for r in results if r.ok]

    def _collect_late_samples(self) -> None:
        """Counts the env steps of late sample results that have arrived, and drops them."""
        if not self._late_samples:
            return
        refs = [info_ref for _, info_ref, _ in self._late_samples]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        ready = set(ready)
        still = []
        for worker_index, info_ref, batch_ref in self._late_samples:
            if info_ref not in ready:
                still.append((worker_index, info_ref, batch_ref))
                continue
            try:
                self._dropped_env_steps += int(ray.get(info_ref)["env_steps"])
            except RayError:
                pass  # the runner failed meanwhile; its next call books the failure
        self._late_samples = still

    def _no_healthy_message(self) -> str:
        lines = [f"runner {i}: {slot.last_error or 'unhealthy'}"
                 + (" (lost)" if slot.dead else " (restarting)")
                 for i, slot in self._manager.slots.items() if not slot.healthy]
        return ("No healthy remote env runner to sample from (" + "; ".join(lines) + "). "
                "Restarting runners come back after probe_unhealthy_env_runners() finds "
                "them.")

    # ------------------------------------------------------------------ calls on runners
    def _check_func(self, func: Callable | str) -> None:
        if callable(func):
            return
        if not isinstance(func, str):
            raise TypeError(f"func must be a callable taking the runner, or the name of a "
                            f"runner method; got {func!r}.")
        if func not in _WRAPPER_NAMES and not hasattr(self._local, func):
            import difflib

            names = [n for n in dir(self._local) if not n.startswith("_")]
            close = difflib.get_close_matches(func, names + list(_WRAPPER_NAMES), n=3)
            hint = (" Did you mean " + " or ".join(repr(c) for c in close) + "?") if close else ""
            raise AttributeError(
                f"{type(self._local).__name__} has no method or attribute {func!r}.{hint}")

    def _call_local(self, func: Callable | str, kwargs: dict) -> Any:
        if func == "get_node_info":
            return node_info(0)
        return call_runner(self._local, func, (), kwargs)

    def foreach_env_runner(self, func: Callable | str, *, kwargs: dict | None = None,
                           local_env_runner: bool = True, healthy_only: bool = True,
                           remote_worker_ids: Sequence[int] | None = None,
                           timeout_seconds: float | None = None,
                           return_obj_refs: bool = False) -> list:
        """Calls `func(runner, **kwargs)` (or the runner method named `func`) on the local
        runner and the remote runners; returns the local result first, then the remote
        ones in `worker_index` order.

        Remote results later than `timeout_seconds` are dropped (the runner stays healthy);
        failed runners are left out (see the module docstring of `actor_manager`).
        `return_obj_refs` returns the remote results as ObjectRefs, without waiting.
        `healthy_only=False` also calls runners marked unhealthy that may come back.
        """
        self._check_running()
        self._check_func(func)
        kwargs = dict(kwargs or {})
        timeout = _check_timeout("timeout_seconds", timeout_seconds)
        ids = self._manager.check_ids(remote_worker_ids, "foreach_env_runner")
        results = [self._call_local(func, kwargs)] if local_env_runner else []
        if ids is None:
            ids = self._manager.ids()
        ids = [i for i in ids if self._manager.slots[i].healthy
               or (not healthy_only and not self._manager.slots[i].dead)]
        remote, _ = self._manager.call(
            ids, lambda slot: slot.actor.apply.remote(func, (), kwargs), timeout_s=timeout,
            return_refs=return_obj_refs)
        return results + [r.value for r in remote if r.ok]

    def foreach_env_runner_async(self, func: Callable | str, tag: str | None = None, *,
                                 kwargs: dict | None = None,
                                 remote_worker_ids: Sequence[int] | None = None) -> int:
        """Starts `func` on the healthy remote runners without waiting; returns how many
        calls started. A runner that already has `max_requests_in_flight_per_env_runner`
        requests in flight gets none (RLlib's rule). Collect results with
        `fetch_ready_async_reqs`."""
        self._check_running()
        self._check_func(func)
        kwargs = dict(kwargs or {})
        ids = self._manager.check_ids(remote_worker_ids, "foreach_env_runner_async")
        return self._manager.submit_async(
            self._manager.ids() if ids is None else ids,
            lambda slot: slot.actor.apply.remote(func, (), kwargs), tag)

    def fetch_ready_async_reqs(self, *, tags: str | Iterable[str] | None = None,
                               timeout_seconds: float | None = 0.0,
                               return_obj_refs: bool = False) -> list[tuple[int, Any]]:
        """`[(worker_index, result)]` of the async requests (with one of `tags`, or all)
        that are ready within `timeout_seconds` (0: those ready now)."""
        self._check_running()
        timeout = _check_timeout("timeout_seconds", timeout_seconds)
        if isinstance(tags, str):
            tags = [tags]
        results = self._manager.fetch_ready(tags, timeout, return_refs=return_obj_refs)
        return [(r.worker_index, r.value) for r in results if r.ok]

    def get_node_info(self) -> dict[int, dict[str, Any]]:
        """`{worker_index: {"node_id", "hostname", "ip", "pid", "jax_platforms", ...}}` of
        the local runner (0) and the healthy remote runners."""
        self._check_running()
        infos = self.foreach_env_runner("get_node_info", local_env_runner=True)
        return {info["worker_index"]: info for info in infos}

    # ------------------------------------------------------------------ weights and states
    def sync_weights(self, params: Any = None, *, weights_seq_no: int | None = None,
                     from_worker_or_learner_group: Any = None,
                     to_worker_indices: Sequence[int] | None = None,
                     timeout_seconds: float | None = 0.0) -> int:
        """Sends module weights to the runners; returns the `weights_seq_no` sent.

        The weights are `params` (a pytree, e.g. a learner's inference params), else
        those of `from_worker_or_learner_group` (a runner, an object with
        `get_state(components="rl_module")`, or a remote worker index), else the local
        runner's. They are checked against the local runner's module, put into the object
        store once, and the one reference is sent to every target runner (default: all
        healthy remote runners). `weights_seq_no` defaults to the last one + 1; runners
        apply weights only if it is newer than theirs (RLlib's rule). The local runner
        gets them too. With `timeout_seconds=0` the call does not wait for the runners;
        since calls to a runner run in order, its next sample uses the new weights anyway.
        """
        self._check_running()
        if params is not None and from_worker_or_learner_group is not None:
            raise ValueError("Pass params or from_worker_or_learner_group, not both.")
        if weights_seq_no is not None and (isinstance(weights_seq_no, bool)
                                           or not isinstance(weights_seq_no, int)
                                           or weights_seq_no < 0):
            raise ValueError(f"weights_seq_no must be an int >= 0, got {weights_seq_no!r}.")
        timeout = _check_timeout("timeout_seconds", timeout_seconds)
        targets = self._manager.check_ids(to_worker_indices, "sync_weights")
        weights = self._weights_from(params, from_worker_or_learner_group)
        module = getattr(self._local, "module", None)
        if module is not None:
            try:  # e.g. a learner's full params: send only what the runners act with
                weights = module.params_for_inference(weights)
            except (KeyError, TypeError):
                pass  # set_state below names what does not fit
        weights = jax.device_get(weights)
        seq = self._weights_seq_no + 1 if weights_seq_no is None else weights_seq_no
        state = {"rl_module": weights, "weights_seq_no": seq}
        self._local.set_state(state)  # validates the structure before anything is sent
        self._weights_seq_no = max(self._weights_seq_no, seq)
        if not self._has_remote:
            return seq
        # What was sent may be some of the modules only: a restarted runner gets every
        # module's current weights instead (`_restore_weights_ref`, built when needed).
        self._weights_ref = None
        ref = ray.put(state)
        ids = [i for i in (self._manager.ids() if targets is None else targets)
               if self._manager.slots[i].healthy]
        if timeout == 0.0:
            for worker_index in ids:
                slot = self._manager.slots[worker_index]
                self._manager.submit_later(worker_index, slot.actor.set_state.remote(ref))
        else:
            self._manager.call(ids, lambda slot: slot.actor.set_state.remote(ref),
                               timeout_s=timeout)
        return seq

    def _restore_weights_ref(self) -> Any:
        """One object with the weights of every module as the local runner holds them now
        (it applied every `sync_weights`), with the group's `weights_seq_no`."""
        if self._weights_ref is None:
            weights = self._local.get_state(components="rl_module")["rl_module"]
            self._weights_ref = ray.put({"rl_module": weights,
                                         "weights_seq_no": self._weights_seq_no})
        return self._weights_ref

    def _weights_from(self, params: Any, source: Any) -> Any:
        if params is not None:
            return params
        if source is None:
            return self._local.get_state(components="rl_module")["rl_module"]
        if isinstance(source, int) and not isinstance(source, bool):
            self._manager.check_ids([source], "from_worker_or_learner_group")
            results, _ = self._manager.call(
                [source], lambda slot: slot.actor.get_state.remote("rl_module"),
                timeout_s=self.config.env_runner_health_probe_timeout_s)
            if not results or not results[0].ok:
                raise EnvRunnerFailedError(f"EnvRunner {source} did not return its weights.")
            return results[0].value["rl_module"]
        get_state = getattr(source, "get_state", None)
        if not callable(get_state):
            raise TypeError(
                "from_worker_or_learner_group must be an EnvRunner, an object with "
                "get_state(components='rl_module') (e.g. a learner group), or a remote worker "
                f"index; got {type(source).__name__}.")
        state = get_state(components="rl_module")
        if not isinstance(state, dict) or "rl_module" not in state:
            raise TypeError(f"{type(source).__name__}.get_state(components='rl_module') "
                            "returned no 'rl_module' entry.")
        return state["rl_module"]

    def sync_env_runner_states(self, *, env_steps_sampled: int | None = None,
                               connector_states: list[dict] | None = None,
                               env_runner_indices_to_update: Sequence[int] | None = None,
                               timeout_seconds: float | None = 10.0) -> None:
        """Merges the runners' connector states and broadcasts them with the lifetime
        step counter (RLlib's `sync_env_runner_states`).

        Connector states (e.g. mean-std statistics) are gathered from the healthy remote
        runners (or taken from `connector_states`) and combined with the runners' own
        `merge_connector_states` when `config.merge_env_runner_states` says so (True, or
        "training_only" outside evaluation). With `broadcast_env_runner_states`, the result
        and `num_env_steps_sampled_lifetime` (`env_steps_sampled`, default: the group's
        lifetime count) go to the local runner and the remote runners (one object for
        all). Restarted runners get the last merged states when they are restored.
        """
        self._check_running()
        cfg = self.config
        timeout = _check_timeout("timeout_seconds", timeout_seconds)
        targets = self._manager.check_ids(env_runner_indices_to_update,
                                          "sync_env_runner_states")
        merge = cfg.merge_env_runner_states is True or (
            cfg.merge_env_runner_states == "training_only" and not cfg.in_evaluation)
        lifetime = self._counters.env_steps if env_steps_sampled is None else env_steps_sampled
        if isinstance(lifetime, bool) or not isinstance(lifetime, int) or lifetime < 0:
            raise ValueError(f"env_steps_sampled must be an int >= 0, got {lifetime!r}.")
        state: dict[str, Any] = {_LIFETIME: int(lifetime)}
        if merge:
            if connector_states is None:
                connector_states = self._gather_connector_states(timeout)
            if not isinstance(connector_states, (list, tuple)):
                raise TypeError("connector_states must be a list of get_state() dicts, got "
                                f"{type(connector_states).__name__}.")
            if connector_states:
                self._connector_states = self._merge_connector_states(list(connector_states))
            state.update(self._connector_states)
        if not cfg.broadcast_env_runner_states:
            return
        local_state = state if self._local_has_env() else {_LIFETIME: state[_LIFETIME]}
        self._local.set_state(local_state)
        if not self._has_remote:
            return
        ids = [i for i in (self._manager.ids() if targets is None else targets)
               if self._manager.slots[i].healthy]
        ref = ray.put(state)
        results, _ = self._manager.call(ids, lambda slot: slot.actor.set_state.remote(ref),
                                        timeout_s=timeout)
        for result in results:
            if result.ok:
                self._manager.slots[result.worker_index].lifetime_env_steps = state[_LIFETIME]

    def _gather_connector_states(self, timeout: float | None) -> list[dict]:
        components = list(_CONNECTOR_COMPONENTS)
        if self._has_remote:
            results, _ = self._manager.call(
                self._manager.healthy_ids(),
                lambda slot: slot.actor.get_state.remote(components), timeout_s=timeout)
            states = [r.value for r in results if r.ok]
        elif self._local_has_env():
            states = [self._local.get_state(components=components)]
        else:
            states = []
        return [{k: v for k, v in s.items() if k in _CONNECTOR_COMPONENTS} for s in states]

    def _merge_connector_states(self, states: list[dict]) -> dict:
        """Combines connector states with the runner class's `merge_connector_states`
        (run where the pipelines exist: the local runner if it has an env, else a remote
        runner)."""
        if self._local_has_env() or not self._has_remote:
            merge = getattr(self._local, "merge_connector_states", None)
            if merge is not None:
                return merge(states)
        elif hasattr(self._runner_cls, "merge_connector_states"):
            return self._call_one("merge_connector_states", states)
        components = {name for s in states for name, value in s.items() if value}
        if not components:
            return {}
        raise TypeError(
            f"{self._runner_cls.__name__} has connector states {sorted(components)} but no "
            "merge_connector_states(states) to combine them across runners.")

    # ------------------------------------------------------------------ fault tolerance
    def probe_unhealthy_env_runners(self, timeout_seconds: float | None = None) -> list[int]:
        """Pings the unhealthy remote runners (up to `timeout_seconds`, default
        `config.env_runner_health_probe_timeout_s`); restores the state of those that are
        back (a restart: same `worker_index`) and marks them healthy. Returns the ids
        restored since the last call, including those restored by `sample()`."""
        self._check_running()
        timeout = _check_timeout("timeout_seconds", timeout_seconds)
        self._restore_unhealthy(timeout)
        restored, self._restored_since_probe = sorted(self._restored_since_probe), set()
        return restored

    def _restore_unhealthy(self, timeout: float | None) -> list[int]:
        cfg = self.config
        if timeout is None:
            timeout = cfg.env_runner_health_probe_timeout_s
        answered = self._manager.probe(timeout)
        if not answered:
            return []
        refs = {}
        for worker_index in answered:
            slot = self._manager.slots[worker_index]
            state = {**self._connector_states, _LIFETIME: slot.lifetime_env_steps}
            try:
                refs[slot.actor.restore.remote(self._restore_weights_ref(),
                                               state)] = worker_index
            except RayActorError as error:
                self._manager.book_restore_failure(worker_index, error)
        ready, not_ready = ray.wait(list(refs), num_returns=len(refs),
                                    timeout=cfg.env_runner_restore_timeout_s)
        restored = []
        for ref in ready:
            worker_index = refs[ref]
            try:
                ray.get(ref)
            except RayError as error:
                self._manager.book_restore_failure(worker_index, error)
                continue
            self._manager.mark_restored(worker_index)
            restored.append(worker_index)
            logger.info("EnvRunner %d is back and restored (weights_seq_no=%d).", worker_index,
                        self._weights_seq_no)
        for ref in not_ready:
            self._manager.book_restore_failure(
                refs[ref], GetTimeoutError(f"no answer within env_runner_restore_timeout_s="
                                           f"{cfg.env_runner_restore_timeout_s}"))
        self._restored_since_probe.update(restored)
        return restored

    # ------------------------------------------------------------------ metrics
    def get_metrics(self, timeout_seconds: Any = _DEFAULT) -> dict[str, Any]:
        """RLlib's runner metrics over the whole group, since the last call.

        Episode means, minima and maxima are over the union of all runners' smoothing
        windows (every episode counts once, whatever runner it came from); per-call
        counters are summed; lifetime counters are the group's. Also
        `"fault_tolerance"` (healthy runners, restarts, failures, sample timeouts, dropped
        responses and env steps) and `"env_runner_group"` (async requests in flight).
        """
        self._check_running()
        timeout = _check_timeout("timeout_seconds", self.config.sample_timeout_s
                                 if timeout_seconds is _DEFAULT else timeout_seconds)
        self._collect_late_samples()
        parts = []
        if self._local_has_env() or not self._has_remote:
            window = getattr(self._local, "get_metrics_window", None)
            if window is None:
                raise TypeError(self._no_window_message())
            parts.append((self._local.get_metrics(), window()))
        if self._has_remote:
            results, _ = self._manager.call(
                self._manager.healthy_ids(),
                lambda slot: slot.actor.get_metrics_and_window.remote(), timeout_s=timeout)
            for result in results:
                if not result.ok:
                    continue
                metrics, window = result.value
                if window is None:
                    raise TypeError(self._no_window_message())
                self._manager.slots[result.worker_index].lifetime_env_steps = int(
                    metrics.get(keys.NUM_ENV_STEPS_SAMPLED_LIFETIME, 0))
                parts.append((metrics, window))
        out = aggregate(parts, self._counters)
        slots = self._manager.slots.values()
        out["fault_tolerance"] = {
            "num_remote_env_runners": len(self._manager.slots),
            "num_healthy_workers": self.num_healthy_remote_env_runners(),
            "num_remote_worker_restarts": self._manager.num_restarts,
            "num_env_runner_failures": self._manager.num_failures,
            "num_env_runners_lost": sum(1 for slot in slots if slot.dead),
            "num_env_runners_dropped_lifetime": self._manager.num_dropped,
            "num_env_runner_sample_timeouts": self._num_sample_timeouts,
            "num_env_steps_dropped_lifetime": self._dropped_env_steps,
        }
        out["env_runner_group"] = {
            "actor_manager_num_outstanding_async_reqs": self._manager.num_in_flight()}
        return out

    def _no_window_message(self) -> str:
        return (f"{self._runner_cls.__name__} has no get_metrics_window(): EnvRunnerGroup "
                "needs each runner's window of finished episodes to take means over all "
                "runners' episodes. Implement get_metrics_window() -> {'episode_return', "
                "'episode_len', 'episode_duration_sec'} (see SingleAgentEnvRunner; a "
                "multi-agent runner adds 'agent_episode_return' and 'module_episode_return' "
                "as {id: returns}, see MultiAgentEnvRunner).")

    # ------------------------------------------------------------------ shutdown
    def stop(self) -> None:
        """Kills every remote runner actor (healthy or not) and stops the local runner.
        Safe to call more than once. Leaves Ray itself running."""
        if self._stopped:
            return
        self._stopped = True
        self._manager.kill_all()
        self._late_samples = []
        self._weights_ref = None
        local = getattr(self, "_local", None)
        if local is not None:
            local.stop()

    def __enter__(self) -> "EnvRunnerGroup":
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (f"EnvRunnerGroup(num_remote_env_runners={self.num_remote_env_runners()}, "
                f"healthy={self.healthy_env_runner_ids()}, stopped={self._stopped})")


__all__ = ["EnvRunnerGroup", "init_ray"]
