"""RLlib's own `SingleAgentEnvRunner` tests (`test_sample`, `test_distributed_env_runner`,
the public parts of `test_env_context`), reproduced against jaxrunner: Ray Tune env
names (local and in remote runners), gymnasium classes, `remote_worker_envs` both ways,
`gym_env_vectorize_mode` (sync, async, vector entry point) and the gymnax-over-gymnasium
precedence with its error."""

from __future__ import annotations

import gymnasium as gym
import jax
import numpy as np
import pytest
import ray
from gymnasium.envs.classic_control.cartpole import CartPoleEnv, CartPoleVectorEnv
from ray import tune

import jaxrunner as jr
from conftest import make_config
from host_env_helpers import Corridor, cartpole_from_context, cartpole_vector_from_context

TUNE_NAME, TUNE_VEC_NAME = "rllib-parity-tune-registered", "rllib-parity-tune-registered-vec"


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    tune.register_env(TUNE_NAME, cartpole_from_context)
    tune.register_env(TUNE_VEC_NAME, cartpole_vector_from_context)
    yield
    ray.shutdown()


@pytest.fixture(scope="module", autouse=True)
def gym_ids():
    gym.register("JaxrunnerParityEnv-v0", entry_point=CartPoleEnv)
    gym.register("JaxrunnerParityVecEnv-v0", vector_entry_point=CartPoleVectorEnv)
    gym.register("JaxrunnerParityEnv-v1", entry_point=CartPoleEnv,
                 vector_entry_point=CartPoleVectorEnv, kwargs={"sutton_barto_reward": True})
    yield
    for name in ("JaxrunnerParityEnv-v0", "JaxrunnerParityVecEnv-v0", "JaxrunnerParityEnv-v1"):
        gym.registry.pop(name, None)


def _rllib_config(env, *, num_envs=5, fragment=64, **env_runners):
    return make_config(env, num_envs=num_envs, fragment=fragment, hiddens=(8,),
                       **env_runners)


# ---------------------------------------------------------------------- test_sample
@pytest.mark.parametrize("env", [
    # The compiled contract is pinned by the faster tests/test_sample_contract.py.
    pytest.param("CartPole-v1", marks=pytest.mark.slow), "gymnasium:CartPole-v1"])
def test_sample(env):
    """RLlib's test_sample, with 3 repetitions instead of 100 of each size."""
    n, fragment = 5, 64
    runner = jr.SingleAgentEnvRunner(config=_rllib_config(env, num_envs=n, fragment=fragment))
    with pytest.raises(AssertionError):
        runner.sample(num_timesteps=10, num_episodes=10, random_actions=True)
    for _ in range(3):
        episodes = runner.sample(num_episodes=10, random_actions=True)
        assert len(episodes) == 10
        assert all(e.is_done and e.t_started == 0 for e in episodes)
    runner.sample(random_actions=True)  # episodes in flight, for t_started > 0
    for size in (20, 20 + n // 2):
        for _ in range(3):
            episodes = runner.sample(num_timesteps=size, random_actions=True)
            assert size <= sum(len(e) for e in episodes) <= size + n
            assert any(e.t_started > 0 for e in episodes)
    for _ in range(2):
        episodes = runner.sample(random_actions=True)
        assert n * fragment <= sum(len(e) for e in episodes) <= (n + 1) * fragment
        assert any(e.t_started > 0 for e in episodes)
    episodes = runner.sample(num_timesteps=20, random_actions=True, force_reset=True)
    assert any(e.t_started == 0 for e in episodes)
    episodes = runner.sample(num_timesteps=20, random_actions=True, force_reset=False)
    assert any(e.t_started > 0 for e in episodes)
    runner.stop()


# ---------------------------------------------------------------------- test_env_context
def test_env_context_reaches_gymnasium_envs_classes_and_tune_names(ray_session):
    """env_config reaches the env for a Tune name, a gymnasium class, a registered
    gymnasium id; a vector entry point gets num_envs; preset kwargs of a registration
    stay."""
    for env in (CartPoleEnv, TUNE_NAME, "gymnasium:JaxrunnerParityEnv-v0"):
        runner = jr.SingleAgentEnvRunner(config=_rllib_config(env, num_envs=2).environment(
            env_config={"sutton_barto_reward": True}))
        assert runner.env.get_attr("_sutton_barto_reward") == (True, True), env
        runner.stop()
    for env in (CartPoleVectorEnv, TUNE_VEC_NAME, "gymnasium:JaxrunnerParityVecEnv-v0"):
        runner = jr.SingleAgentEnvRunner(config=_rllib_config(
            env, num_envs=2, gym_env_vectorize_mode=gym.VectorizeMode.VECTOR_ENTRY_POINT
        ).environment(env_config={"sutton_barto_reward": True}))
        assert isinstance(runner.env, CartPoleVectorEnv) and runner.env.num_envs == 2
        assert runner.env._sutton_barto_reward is True
        runner.stop()
    runner = jr.SingleAgentEnvRunner(config=_rllib_config("gymnasium:JaxrunnerParityEnv-v1",
                                                          num_envs=2))
    assert runner.env.get_attr("_sutton_barto_reward") == (True, True)
    runner = jr.SingleAgentEnvRunner(config=_rllib_config(
        "gymnasium:JaxrunnerParityEnv-v1", num_envs=2,
        gym_env_vectorize_mode="vector_entry_point"))
    assert runner.env._sutton_barto_reward is True
    # A vector env that resets every sub-env on reset(reset_mask) cannot give RLlib's
    # episodes: a clear error when it would, not silently cut episodes.
    with pytest.raises(ValueError, match="reset_mask"):
        runner.sample(num_episodes=4, random_actions=True)


def test_env_context_fields_as_rllib_passes_them():
    seen = []

    def creator(ctx):
        seen.append((type(ctx), dict(ctx), ctx.worker_index, ctx.num_workers,
                     ctx.vector_index, ctx.remote))
        return Corridor(ctx)

    runner = jr.SingleAgentEnvRunner(config=_rllib_config(creator, num_envs=3).environment(
        env_config={"corridor_length": 3}), worker_index=2, num_workers=4)
    assert [s[4] for s in seen] == [0, 1, 2]  # one call per sub-env, vector_index = index
    assert all(issubclass(s[0], dict) and s[1] == {"corridor_length": 3} and s[2:4] == (2, 4)
               and s[5] is False for s in seen)
    assert runner.env.get_attr("end") == (3, 3, 3)
    runner.stop()


def test_gymnax_ids_take_precedence_with_an_error_that_says_so():
    with pytest.raises(ValueError, match=r"takes precedence.*'gymnasium:CartPole-v1'"):
        jr.SingleAgentEnvRunner(config=_rllib_config("CartPole-v1").environment(
            env_config={"sutton_barto_reward": True}))
    with pytest.raises(ValueError, match=r"take precedence.*'gymnasium:CartPole-v1'"):
        jr.SingleAgentEnvRunner(config=_rllib_config("CartPole-v1",
                                                     gym_env_vectorize_mode="async"))
    with pytest.raises(ValueError, match="gymnasium.VectorizeMode"):
        jr.RunnerConfig().env_runners(gym_env_vectorize_mode="parallel")
    vector = gym.vector.SyncVectorEnv([lambda: CartPoleEnv() for _ in range(2)])
    with pytest.raises(ValueError, match="cannot apply"):
        jr.SingleAgentEnvRunner(config=_rllib_config(vector, num_envs=2,
                                                     remote_worker_envs=True))


def test_async_vector_env_gives_the_sync_episodes():
    """gym_env_vectorize_mode='async' steps spawned sub-processes; for one seed its
    episodes are exactly those of the sync vector env."""
    batches = {}
    for mode in ("sync", "async"):
        runner = jr.SingleAgentEnvRunner(config=_rllib_config(
            Corridor, num_envs=2, fragment=12, gym_env_vectorize_mode=mode))
        assert isinstance(runner.env, gym.vector.AsyncVectorEnv) == (mode == "async")
        batches[mode] = jax.device_get(runner.sample(num_timesteps=24).trajectory())
        runner.stop()
    for sync, other in zip(jax.tree.leaves(batches["sync"]), jax.tree.leaves(batches["async"])):
        np.testing.assert_array_equal(sync, other)


# ---------------------------------------------------------------------- distributed
def test_a_tune_name_resolves_in_a_remote_runner(ray_session):
    """Tune's registry reaches remote runners through Ray's KV store (the fast check of
    what test_distributed_env_runner covers with five runners)."""
    actor = ray.remote(num_cpus=0)(jr.SingleAgentEnvRunner).remote(
        config=_rllib_config(TUNE_NAME, num_envs=2, fragment=10).environment(
            env_config={"sutton_barto_reward": True}), worker_index=1)
    episodes = ray.get(actor.sample.remote(random_actions=True), timeout=600)
    assert sum(len(e) for e in episodes) in (20, 21)
    assert all(r <= 0 for e in episodes for r in e.get_rewards())  # Sutton-Barto rewards
    ray.kill(actor)


@pytest.mark.slow  # five actors and nine spawned sub-envs: minutes on two shared cores
def test_distributed_env_runner(ray_session):
    """Five remote runners (plain Ray actors, as in RLlib's test) in parallel, each on
    one of: a Tune-registered name, the gymnax id, a gymnasium class, with
    remote_worker_envs off and on; each returns a fragment of the asked length."""
    remote_class = ray.remote(num_cpus=0)(jr.SingleAgentEnvRunner)
    cases = [(TUNE_NAME, False), (TUNE_NAME, True), ("CartPole-v1", True), (Corridor, False),
             (Corridor, True)]
    n, fragment = 3, 10
    actors, configs = [], []
    for index, (env, remote) in enumerate(cases, start=1):
        config = _rllib_config(env, num_envs=n, fragment=fragment, remote_worker_envs=remote,
                               num_env_runners=len(cases))
        configs.append(config)
        actors.append(remote_class.remote(config=config, worker_index=index))
    results = ray.get([a.sample.remote(random_actions=True) for a in actors], timeout=600)
    names = ray.get([a.__ray_call__.remote(lambda self: type(self.env).__name__)
                     for a in actors])
    for (env, remote), episodes, name in zip(cases, results, names):
        assert sum(len(e) for e in episodes) in [n * fragment + i for i in range(n)], env
        if env != "CartPole-v1":  # host envs: sub-processes exactly with remote_worker_envs
            assert (name == "AsyncVectorEnv") == remote, (env, name)
    for actor in actors:
        ray.kill(actor)


def test_a_group_resolves_a_tune_name(ray_session):
    """The group's up-front name check knows Tune names (its local runner samples one)."""
    from jaxrunner.distributed import EnvRunnerGroup

    group = EnvRunnerGroup(config=_rllib_config(TUNE_NAME, num_envs=2, fragment=8))
    try:
        assert group.sample(num_timesteps=16)[0].env_steps >= 16
    finally:
        group.stop()


# ---------------------------------------------------------------------- the RLlib drop-in
def test_from_rllib_copies_remote_worker_envs_not_the_host_vectorize_mode():
    """`RunnerConfig.from_rllib` (JaxEnvRunner's translation) shares `remote_worker_envs`
    (a compiled env's creator sees it as `env_context.remote`), but not
    `gym_env_vectorize_mode`: it only acts on host envs, which the drop-in does not run,
    and RLlib's "async" for "CartPole-v1" would be the gymnax-precedence error."""
    from ray.rllib.algorithms.ppo import PPOConfig

    config = PPOConfig().environment("CartPole-v1").env_runners(
        remote_worker_envs=True, gym_env_vectorize_mode="async")
    translated = jr.RunnerConfig.from_rllib(config)
    assert translated.remote_worker_envs is True
    assert translated.gym_env_vectorize_mode == "sync"
    assert jr.RunnerConfig.from_rllib(PPOConfig().environment("CartPole-v1")
                                      ).remote_worker_envs is False
