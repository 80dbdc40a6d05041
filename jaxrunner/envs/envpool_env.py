"""EnvPool backend: `config.environment("envpool:<id>")` steps EnvPool's C++ thread pool.

`EnvPoolVectorEnv` wraps one synchronous EnvPool pool (`batch_size == num_envs`, every
sub-env stepped in EnvPool's own C++ threads each call) as a `gymnasium.vector.VectorEnv`
with RLlib's episode semantics, so the host engine (`jaxrunner.runners.host_env`) steps it
like any other host env, with the same `EpisodeBatch`, metrics, state and fault contract:

* EnvPool's own auto-reset is "next step": the step after an episode ends is a reset
  step that ignores its action and returns reward 0. Here a finished sub-env is reset
  inside the same `step()` instead (`pool.reset(env_id=[...])` of just those sub-envs),
  its final observation in `infos["final_obs"]` / `infos["_final_obs"]` (gymnasium's
  `SAME_STEP` layout), so no step is spent on a reset and every returned step has a real
  action, as in RLlib.
* `terminated` and `truncated` are EnvPool's (a time limit, `max_episode_steps`, is
  `truncated` only).
* Seeds: EnvPool seeds a pool when it is built (sub-env `i` gets `seed + i`). A `reset`
  with a seed other than the pool's builds a new pool with that seed, so the runner's
  first reset is seeded with the runner's seed and a recreated env gets a fresh one.

`env_config` goes to `envpool.make_gymnasium(id, **env_config)` (e.g.
`{"max_episode_steps": 100}`, `{"num_threads": 4}`, Atari's `{"episodic_life": False}`).
`gym_env_vectorize_mode="async"` and `remote_worker_envs=True` are refused: EnvPool
parallelizes in its own threads.
"""

from __future__ import annotations

import difflib
from typing import Any

import gymnasium as gym
import numpy as np

from jaxrunner.envs.context import EnvContext

INSTALL_HINT = 'pip install "jaxrunner[envpool]"'


def _envpool():
    try:
        import envpool
    except ImportError as error:
        raise ImportError(
            f"config.environment('envpool:<id>') needs the envpool package: "
            f"{INSTALL_HINT} (EnvPool ships binary wheels for Linux x86-64).") from error
    return envpool


def envpool_env_ids() -> list[str]:
    """Every id EnvPool registers (`envpool.list_all_envs()`)."""
    return list(_envpool().list_all_envs())


class EnvPoolVectorEnv(gym.vector.VectorEnv):
    """One synchronous EnvPool pool as a gymnasium `VectorEnv` with `SAME_STEP`
    auto-reset (see the module docstring).

    Args:
        task_id: an EnvPool id ("CartPole-v1", "HalfCheetah-v5", "Pong-v5", ...).
        num_envs: sub-envs of the pool (its batch size too).
        seed: the pool's seed (sub-env `i` uses `seed + i`); None draws one.
        kwargs: passed to `envpool.make_gymnasium`.
    """

    metadata = {"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP}

    def __init__(self, task_id: str, num_envs: int, seed: int | None = None, **kwargs: Any):
        self.task_id, self.num_envs, self._kwargs = task_id, int(num_envs), dict(kwargs)
        self._seed = None
        self.pool = None
        self._build(seed)
        self.single_observation_space = self.pool.observation_space
        self.single_action_space = self.pool.action_space
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space,
                                                              self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space,
                                                         self.num_envs)
        self._action_dtype = getattr(self.single_action_space, "dtype", None)

    def _build(self, seed: int | None) -> None:
        if seed is None:
            seed = int(np.random.SeedSequence().generate_state(1)[0] % 2**31)
        seed = int(seed) % 2**31
        if self.pool is not None:
            self.pool.close()
        self.pool = _envpool().make_gymnasium(self.task_id, num_envs=self.num_envs,
                                              batch_size=self.num_envs, seed=seed,
                                              **self._kwargs)
        self._seed = seed

    @staticmethod
    def _ordered(env_id: np.ndarray, *arrays: np.ndarray) -> tuple:
        """`arrays` reordered so row `i` is sub-env `i` (EnvPool returns them in the
        order its threads finished)."""
        order = np.argsort(env_id, kind="stable")
        if np.array_equal(order, np.arange(order.shape[0])):
            return arrays
        return tuple(a[order] for a in arrays)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None and int(seed) % 2**31 != self._seed:
            self._build(seed)
        mask = None if options is None else options.get("reset_mask")
        if mask is not None and not np.all(mask):
            ids = np.flatnonzero(mask).astype(np.int32)
            obs, info = self.pool.reset(ids)
            (obs,) = self._ordered(info["env_id"], obs)
            self._obs[ids] = obs
            return self._obs.copy(), {}
        obs, info = self.pool.reset()
        (self._obs,) = self._ordered(info["env_id"], obs)
        return self._obs.copy(), {}

    def step(self, actions):
        actions = np.asarray(actions)
        if self._action_dtype is not None and actions.dtype != self._action_dtype:
            actions = actions.astype(self._action_dtype)
        obs, rewards, terminated, truncated, info = self.pool.step(actions)
        obs, rewards, terminated, truncated = self._ordered(
            info["env_id"], obs, rewards, terminated, truncated)
        terminated = np.asarray(terminated, np.bool_)
        truncated = np.asarray(truncated, np.bool_)
        done = terminated | truncated
        infos: dict[str, Any] = {}
        if done.any():
            ids = np.flatnonzero(done).astype(np.int32)
            final = np.empty((self.num_envs,), dtype=object)
            for i in ids:
                final[i] = obs[i].copy()
            reset_obs, reset_info = self.pool.reset(ids)
            (reset_obs,) = self._ordered(reset_info["env_id"], reset_obs)
            obs = obs.copy()
            obs[ids] = reset_obs
            infos = {"final_obs": final, "_final_obs": done.copy()}
        self._obs = obs
        return obs.copy(), rewards, terminated, truncated, infos

    def close(self, **kwargs: Any) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def envpool_source(task_id: str, context: EnvContext, num_envs: int, mode: str):
    """The `HostEnvSource` of `"envpool:<task_id>"` (resolved by
    `jaxrunner.envs.gymnasium_env.resolve_env`)."""
    from jaxrunner.envs.gymnasium_env import ASYNC, HostEnvSource, _call_user

    ids = envpool_env_ids()
    if task_id not in ids:
        matches = difflib.get_close_matches(task_id, ids, n=3, cutoff=0.5)
        hint = (" Did you mean " + " or ".join(repr(m) for m in matches) + "?") if matches else ""
        raise ValueError(f"Unknown EnvPool id {task_id!r} in 'envpool:{task_id}'.{hint} "
                         "envpool.list_all_envs() lists them.")
    if mode == ASYNC or getattr(context, "remote", False):
        raise ValueError(
            f"'envpool:{task_id}' is stepped in EnvPool's own C++ thread pool, so "
            "gym_env_vectorize_mode='async' and remote_worker_envs=True cannot apply; drop "
            "them (pass env_config={'num_threads': n} to size EnvPool's pool).")
    kwargs = dict(context)

    def build() -> gym.vector.VectorEnv:
        # Built unseeded here; the engine's first reset passes the runner's seed.
        return _call_user(lambda: EnvPoolVectorEnv(task_id, num_envs, **kwargs),
                          what=f"envpool.make_gymnasium({task_id!r}, **{kwargs!r})")

    return HostEnvSource(name=f"envpool:{task_id}", build=build)


__all__ = ["EnvPoolVectorEnv", "envpool_env_ids", "envpool_source"]
