"""Host (gymnasium) envs behind `SingleAgentEnvRunner`: resolution, episodes with the
compiled path's contract, metrics, state, compile-once, and RLlib's fault handling
(`StepFailedRecreateEnvError`, other exceptions, reset and creation failures)."""

from __future__ import annotations

import logging

import gymnasium as gym
import gymnax
import jax
import numpy as np
import pytest

import jaxrunner as jr
from conftest import make_config, whole_episodes

HOST_LOGGER = "jaxrunner"


# ---------------------------------------------------------------------- a flaky CartPole
class FailureLog:
    """What the flaky envs did: instances created, failures raised (uid, kind, error)."""

    def __init__(self):
        self.created = 0
        self.failures: list[tuple[int, str, str]] = []


def _hash_fails(obs: np.ndarray, period: int) -> bool:
    """Deterministic ~1/period predicate on the observation a step starts from."""
    bits = np.asarray(obs, np.float32)[..., 0].view(np.uint32).astype(np.uint64)
    return bool((bits * np.uint64(2654435761) % np.uint64(2**32)) % np.uint64(period) == 0)


class FlakyCartPole(gym.Wrapper):
    """gymnasium's numpy CartPole-v1 whose `step()` raises when the observation it starts
    from hashes to 0 mod `period` (or when `fail_step(uid, n)` for its n-th step), and
    whose `reset()` raises when `reset_fails(uid, n)` for its n-th reset asked by the
    runner (auto-resets inside a vector step never fail). With `nan_period`, the env with
    `uid % 4 == 0` returns a NaN observation entry instead. Observations get a 5th entry:
    the instance's uid, so tests can tell which env instance every returned step came
    from (instances are built B at a time, so `uid // B` is the vector env's generation).
    """

    def __init__(self, log: FailureLog, *, period: int | None = None, error=ValueError,
                 fail_step=None, reset_fails=None, nan_period: int | None = None):
        super().__init__(gym.make("CartPole-v1"))
        self.log, self.period, self.error = log, period, error
        self.fail_step, self.reset_fails, self.nan_period = fail_step, reset_fails, nan_period
        self.uid = log.created
        log.created += 1
        self.resets = self.steps = 0
        self._last = None
        inner = self.env.observation_space
        self.observation_space = gym.spaces.Box(
            np.append(inner.low, 0.0).astype(np.float32),
            np.append(inner.high, 2.0**24).astype(np.float32), dtype=np.float32)

    def _error(self):
        return self.error(self.uid) if callable(self.error) and not isinstance(
            self.error, type) else self.error

    def _obs(self, obs):
        return np.append(obs, np.float32(self.uid)).astype(np.float32)

    def reset(self, **kwargs):
        explicit = "seed" in kwargs  # the runner's resets pass a seed; auto-resets do not
        self.resets += explicit
        if explicit and self.reset_fails is not None and self.reset_fails(self.uid,
                                                                           self.resets):
            error = self._error()
            self.log.failures.append((self.uid, "reset", error.__name__))
            raise error(f"injected reset failure of env {self.uid}")
        obs, info = self.env.reset(**kwargs)
        self._last = obs
        return self._obs(obs), info

    def step(self, action):
        self.steps += 1
        if (self.period is not None and _hash_fails(self._last, self.period)) or (
                self.fail_step is not None and self.fail_step(self.uid, self.steps)):
            error = self._error()
            self.log.failures.append((self.uid, "step", error.__name__))
            raise error(f"injected step failure of env {self.uid}")
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._last = obs
        obs = self._obs(obs)
        if (self.nan_period is not None and self.uid % 4 == 0
                and _hash_fails(obs, self.nan_period)):
            self.log.failures.append((self.uid, "nan", "nan"))
            obs[1] = np.nan
        return obs, reward, terminated, truncated, info


def _flaky_config(log, *, num_envs=8, restart=True, fragment=16, hiddens=(16,), seed=0,
                  **env_kwargs):
    return (make_config(lambda ctx: FlakyCartPole(log, **env_kwargs), num_envs=num_envs,
                        fragment=fragment, hiddens=hiddens, seed=seed)
            .fault_tolerance(restart_failed_sub_environments=restart))


def _error_records(caplog):
    return [r for r in caplog.records
            if r.name.startswith(HOST_LOGGER) and r.levelno >= logging.WARNING]


# ---------------------------------------------------------------------- resolution
def test_gymnasium_prefix_passes_env_config_as_kwargs_and_keeps_truncated_apart():
    config = make_config("gymnasium:CartPole-v1", num_envs=4).environment(
        env_config={"max_episode_steps": 5})
    runner = jr.SingleAgentEnvRunner(config=config)
    assert runner.env_name == "gymnasium:CartPole-v1"
    assert isinstance(runner.env, gym.vector.SyncVectorEnv)
    batch = runner.sample(num_episodes=12, random_actions=True)
    assert len(batch) == 12
    for episode in batch:
        episode.validate()
        assert len(episode) <= 5 and episode.is_done
        assert episode.is_truncated == (len(episode) == 5 and not episode.is_terminated)
        assert not (episode.is_terminated and episode.is_truncated)
    assert any(e.is_truncated for e in batch)


def test_env_instance_vector_env_and_creators_all_run_on_the_host():
    vector = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(3)],
                                      autoreset_mode=gym.vector.AutoresetMode.SAME_STEP)
    jr.register_env("host-cartpole-test", lambda ctx: gym.make("CartPole-v1"))
    for spec in (gym.make("CartPole-v1"), vector, "host-cartpole-test",
                 lambda ctx: gym.make("CartPole-v1")):
        runner = jr.SingleAgentEnvRunner(config=make_config(spec, num_envs=3))
        # Stepped on the host: the runner's env is a gymnasium vector env (as RLlib's).
        assert isinstance(runner.env, gym.vector.VectorEnv) and runner.env.num_envs == 3
        batch = runner.sample(num_timesteps=30)
        assert 30 <= batch.env_steps == sum(len(e) for e in batch) < 33
        runner.stop()


def test_a_vector_env_of_the_wrong_size_and_an_unprefixed_gymnasium_id_are_explained():
    vector = gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1") for _ in range(3)])
    with pytest.raises(ValueError, match="num_envs_per_env_runner=2"):
        jr.SingleAgentEnvRunner(config=make_config(vector, num_envs=2))
    with pytest.raises(ValueError, match=r"config.environment\('gymnasium:Taxi-v3'\)"):
        jr.SingleAgentEnvRunner(config=make_config("Taxi-v3"))


@pytest.mark.parametrize("mode", ["NEXT_STEP", "DISABLED"])
def test_user_vector_env_in_other_autoreset_modes_gives_the_same_episodes(mode):
    """NEXT_STEP/DISABLED envs get their finished sub-envs reset right after the step:
    the episodes equal those of a SAME_STEP env (no reset step recorded or wasted)."""
    def creator(autoreset_mode):
        return lambda ctx: gym.vector.SyncVectorEnv(
            [lambda: gym.make("CartPole-v1") for _ in range(4)], autoreset_mode=autoreset_mode)

    trajectories = []
    for autoreset_mode in (gym.vector.AutoresetMode.SAME_STEP,
                           gym.vector.AutoresetMode[mode]):
        runner = jr.SingleAgentEnvRunner(config=make_config(creator(autoreset_mode),
                                                            num_envs=4))
        batch = runner.sample(num_timesteps=240)
        assert sum(e.is_done for e in batch) >= 4
        trajectories.append(jax.device_get(batch.trajectory()))
    same, other = trajectories
    for field in ("obs", "final_obs", "actions", "rewards", "terminated", "truncated",
                  "episode_len"):
        np.testing.assert_array_equal(getattr(same, field), getattr(other, field))


class _DictObsGymEnv(gym.Env):
    """Dict observations {"position": Box(2,), "phase": Discrete(3)}; action 0/1 moves
    left/right; terminates when |x| > 3."""

    observation_space = gym.spaces.Dict({
        "position": gym.spaces.Box(-10.0, 10.0, (2,), np.float32),
        "phase": gym.spaces.Discrete(3)})
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.position = self.np_random.uniform(-1, 1, 2).astype(np.float32)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return {"position": self.position.copy(), "phase": self.t % 3}

    def step(self, action):
        move = 1.0 if action == 1 else -1.0
        self.position = self.position + np.float32([move, 0.5 * move])
        self.t += 1
        return self._obs(), 1.0, bool(abs(self.position[0]) > 3.0), False, {}


def test_dict_observations_keep_the_final_observation_of_each_episode():
    config = make_config(lambda ctx: gym.wrappers.TimeLimit(_DictObsGymEnv(), 12), num_envs=3)
    runner = jr.SingleAgentEnvRunner(config=config)
    assert runner.get_spaces()["default_policy"][0].shape == (5,)  # flattened for the module
    batch = runner.sample(num_episodes=9)
    assert len(batch) == 9
    for episode in batch:
        episode.validate()
        position = episode.observations["position"]
        assert position.dtype == np.float32 and episode.observations["phase"].dtype == np.int32
        if episode.is_terminated:
            # The last observation is the terminal one, not the next episode's reset.
            assert abs(position[-1, 0]) > 3.0 and (np.abs(position[:-1, 0]) <= 3.0).all()
        else:
            assert episode.is_truncated and len(episode) == 12
    assert any(e.is_terminated for e in batch)


# ---------------------------------------------------------------------- the contract
@pytest.fixture(scope="module")
def host_and_compiled():
    runners = {}
    for name, env in (("host", "gymnasium:CartPole-v1"), ("compiled", "CartPole-v1")):
        config = make_config(env, num_envs=4, fragment=8).env_runners(
            episode_lookback_horizon=3)
        runners[name] = jr.SingleAgentEnvRunner(config=config)
    return runners


@pytest.mark.parametrize("kind", ["host", "compiled"])
def test_timestep_calls_cut_and_continue_episodes_with_the_same_contract(host_and_compiled,
                                                                         kind):
    runner = host_and_compiled[kind]
    runner.sample(num_timesteps=4, force_reset=True)  # a known start: every t_started 0
    batches = []
    for n in (10, 37, 64, 5, 100):
        batch = runner.sample(num_timesteps=n)
        steps = sum(len(e) for e in batch)
        assert n <= steps < n + 4 and steps == batch.env_steps
        for episode in batch:
            episode.validate()
            assert episode.len_lookback_buffer == min(3, episode.t_started)
            if episode.t_started > 0 and episode.len_lookback_buffer:
                # The lookback holds the episode's own last steps from the previous call.
                assert episode.get_observations(-1, neg_index_as_lookback=True).shape == (4,)
        assert any(e.t_started > 0 for e in batch) or n < 8
        batches.append(batch)
    by_id, finished = whole_episodes(batches)  # concat_episode checks t and boundary obs
    assert finished
    for id_ in finished:
        episode = by_id[id_]
        assert episode.t_started == 0 and episode.is_done
        assert episode.get_return() == len(episode)  # CartPole: reward 1 per step
        assert episode.is_terminated != episode.is_truncated


def test_host_and_compiled_batches_have_the_same_fields_dtypes_and_views(host_and_compiled):
    host = host_and_compiled["host"].sample(num_timesteps=40, force_reset=True)
    compiled = host_and_compiled["compiled"].sample(num_timesteps=40, force_reset=True)
    a, b = jax.device_get(host.trajectory()), jax.device_get(compiled.trajectory())
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape[1:] == y.shape[1:], jax.tree_util.keystr(path)
    assert jax.tree.structure(a) == jax.tree.structure(b)
    assert host.num_vector_steps == compiled.num_vector_steps == 10
    assert sorted(host[0].extra_model_outputs) == sorted(compiled[0].extra_model_outputs)
    assert len({e.id_ for e in host}) == len(host)


def test_episode_mode_and_force_reset(host_and_compiled):
    runner = host_and_compiled["host"]
    batch = runner.sample(num_episodes=6)
    assert len(batch) == 6
    assert all(e.is_done and e.t_started == 0 for e in batch)
    assert batch.env_steps == sum(len(e) for e in batch)
    runner.sample(num_timesteps=20)
    assert all(e.t_started == 0 for e in runner.sample(num_timesteps=20, force_reset=True))


def test_metrics_count_exactly_the_returned_finished_episodes():
    config = make_config("gymnasium:CartPole-v1", num_envs=4).reporting(
        metrics_num_episodes_for_smoothing=1000)
    runner = jr.SingleAgentEnvRunner(config=config)
    batches = [runner.sample(num_timesteps=n) for n in (50, 130, 77)]
    metrics = runner.get_metrics()
    by_id, finished = whole_episodes(batches)
    lengths = [len(by_id[i]) for i in finished]
    assert metrics["num_episodes"] == len(finished) > 5
    assert metrics["episode_len_mean"] == pytest.approx(np.mean(lengths))
    assert metrics["episode_return_mean"] == pytest.approx(np.mean(lengths))
    assert metrics["episode_len_max"] == max(lengths)
    assert metrics["num_env_steps_sampled"] == sum(b.env_steps for b in batches)
    assert metrics["num_env_step_failures"] == 0


def test_host_path_compiles_once_over_several_sizes(compile_counter):
    runner = jr.SingleAgentEnvRunner(config=make_config("gymnasium:CartPole-v1", num_envs=4))
    runner.sample(num_timesteps=50)
    runner.get_metrics()
    compile_counter.reset()
    for n in (1, 7, 64, 200, 33):
        runner.sample(num_timesteps=n)
    runner.sample(num_episodes=3)
    runner.get_metrics()
    assert compile_counter.count == 0, compile_counter.messages


def test_state_weights_round_trip_and_carry_is_refused_with_a_reason():
    runner = jr.SingleAgentEnvRunner(config=make_config("gymnasium:CartPole-v1", num_envs=2))
    runner.sample(num_timesteps=20)
    state = runner.get_state()
    assert {"rl_module", "weights_seq_no", "num_env_steps_sampled_lifetime"} <= set(state)
    other = jr.SingleAgentEnvRunner(config=make_config("gymnasium:CartPole-v1", num_envs=2,
                                                       seed=1))
    other.set_state({**state, "weights_seq_no": 3})
    assert other.weights_seq_no == 3
    jax.tree.map(np.testing.assert_array_equal, other.get_state()["rl_module"],
                 state["rl_module"])
    assert other.sample(num_timesteps=10).weights_seq_no == 3
    with pytest.raises(ValueError, match="host .*cannot capture"):
        runner.get_state(components="env_runner_carry")


# ---------------------------------------------------------------------- faults
def _uid(obs) -> int:
    return int(np.asarray(obs)[..., 4].reshape(-1)[0])


@pytest.mark.slow  # 59-82 s on the shared 2-core machine (about 1,800 vector steps)
def test_flaky_env_200k_steps_failed_episodes_discarded_counted_and_logged_once(caplog):
    """~1% of vector steps raise (128 sub-envs, each step fails with p = 1/12800):
    StepFailedRecreateEnvError from odd env instances, ValueError from even ones."""
    num_envs = 128
    log = FailureLog()

    def error(uid):
        return jr.StepFailedRecreateEnvError if uid % 2 else ValueError

    runner = jr.SingleAgentEnvRunner(config=_flaky_config(
        log, num_envs=num_envs, period=100 * num_envs, error=error, fragment=64))
    returned, asked = 0, 10_000
    with caplog.at_level(logging.WARNING, logger=HOST_LOGGER):
        while returned < 200_000:
            seen = len(log.failures)
            batch = runner.sample(num_timesteps=asked)
            killed = {uid // num_envs for uid, _, _ in log.failures[seen:]}
            alive = (log.created - 1) // num_envs
            steps = sum(len(e) for e in batch)
            assert steps >= asked and steps == batch.env_steps
            returned += steps
            for episode in batch:
                episode.validate()
                uids = np.asarray(episode.observations)[:, 4]
                assert (uids == uids[0]).all()  # never spans a recreation
                generation = int(uids[0]) // num_envs
                # An episode of an env recreated during this call ended before the failure.
                if generation in killed:
                    assert episode.is_done
                else:
                    assert episode.is_done or generation == alive
                # No returned step starts from an observation that made the env fail.
                assert not any(_hash_fails(o, 100 * num_envs)
                               for o in np.asarray(episode.observations[:-1])[:, :4])
    metrics = runner.get_metrics()
    injected = len(log.failures)
    value_errors = sum(1 for _, _, name in log.failures if name == "ValueError")
    assert injected >= 5 and 0 < value_errors < injected
    assert metrics["num_env_step_failures"] == injected
    assert metrics["num_env_steps_discarded"] > 0
    assert metrics["num_env_steps_sampled"] == returned + metrics["num_env_steps_discarded"]
    assert metrics["episode_return_min"] >= 1.0 and metrics["episode_len_max"] <= 500
    # StepFailedRecreateEnvError is silent; every other error is logged exactly once.
    records = _error_records(caplog)
    assert len(records) == value_errors
    assert all(r.exc_info and r.exc_info[0] is ValueError for r in records)


@pytest.mark.parametrize("error,logged", [(jr.StepFailedRecreateEnvError, 0), (ValueError, 1)])
def test_one_failure_is_silent_or_logged_once(error, logged, caplog):
    log = FailureLog()
    # The 3rd step of instance 1 fails: once, then the recreated instances are fine.
    runner = jr.SingleAgentEnvRunner(config=_flaky_config(
        log, num_envs=4, error=error, fail_step=lambda uid, n: uid == 1 and n == 3))
    with caplog.at_level(logging.DEBUG, logger=HOST_LOGGER):
        batch = runner.sample(num_timesteps=40)
    assert batch.env_steps >= 40
    assert len(_error_records(caplog)) == logged
    metrics = runner.get_metrics()
    assert metrics["num_env_step_failures"] == 1
    # The two steps every sub-env took before the failure were discarded.
    assert metrics["num_env_steps_discarded"] == 4 * 2
    assert {_uid(e.observations) for e in batch} == {4, 5, 6, 7}


def test_restart_off_raises_with_the_hint_and_the_runner_stays_usable():
    log = FailureLog()
    config = _flaky_config(log, num_envs=4, restart=False,
                           reset_fails=lambda uid, n: uid == 2 and n == 3)
    runner = jr.SingleAgentEnvRunner(config=config)
    runner.sample(num_timesteps=8)  # instance 2's 1st reset
    runner.sample(num_episodes=1)  # its 2nd
    with pytest.raises(RuntimeError, match=r"restart_failed_sub_environments=True"):
        runner.sample(num_episodes=1)  # its 3rd reset raises
    assert runner.get_metrics()["num_env_step_failures"] == 1
    # The next call rebuilds the env and starts clean.
    batch = runner.sample(num_timesteps=40)
    assert batch.env_steps >= 40 and all(e.t_started == 0 for e in batch)
    assert {_uid(e.observations) for e in batch} == {4, 5, 6, 7}


def test_step_failure_with_restart_off_raises_and_next_sample_starts_fresh():
    log = FailureLog()
    runner = jr.SingleAgentEnvRunner(config=_flaky_config(
        log, num_envs=4, restart=False, fail_step=lambda uid, n: uid == 3 and n == 30))
    runner.sample(num_timesteps=80)  # 20 vector steps
    with pytest.raises(RuntimeError, match=r"failed at vector step 9 of this sample\(\) "
                                           r"call .*ValueError.*"
                                           r"restart_failed_sub_environments=True"):
        runner.sample(num_timesteps=80)
    assert runner.get_metrics()["num_env_step_failures"] == len(log.failures) == 1
    batch = runner.sample(num_timesteps=80)
    assert batch.env_steps >= 80
    assert all(e.t_started == 0 and _uid(e.observations) in (4, 5, 6, 7) for e in batch)


def test_reset_failures_are_recovered_and_counted(caplog):
    log = FailureLog()
    # The first reset of instance 1 (first vector env) and of instance 5 (its successor).
    config = _flaky_config(log, num_envs=4, reset_fails=lambda uid, n: uid in (1, 5))
    with caplog.at_level(logging.WARNING, logger=HOST_LOGGER):
        runner = jr.SingleAgentEnvRunner(config=config)
        batch = runner.sample(num_timesteps=100)
    assert batch.env_steps >= 100
    for episode in batch:
        episode.validate()
    injected = len(log.failures)
    assert injected >= 1 and all(kind == "reset" for _, kind, _ in log.failures)
    assert runner.get_metrics()["num_env_step_failures"] == injected
    assert len(_error_records(caplog)) == injected


def test_non_finite_observations_are_failures_on_the_host_too():
    log = FailureLog()
    runner = jr.SingleAgentEnvRunner(config=_flaky_config(log, num_envs=8, nan_period=300)
                                     .reporting(metrics_num_episodes_for_smoothing=1000))
    batch = runner.sample(num_timesteps=3000)
    traj = jax.device_get(batch.trajectory())
    assert np.isfinite(traj.obs[traj.valid]).all()
    for episode in batch:
        assert np.isfinite(np.asarray(episode.observations)).all()
    metrics = runner.get_metrics()
    assert metrics["num_env_step_failures"] == len(log.failures) > 0
    # The metrics hold exactly the returned finished episodes: a discarded episode's
    # steps are in none of them.
    lengths = [len(e) for e in batch if e.is_done]
    assert metrics["num_episodes"] == len(lengths) > 0
    assert metrics["episode_len_mean"] == pytest.approx(np.mean(lengths))
    assert metrics["episode_return_mean"] == pytest.approx(np.mean(lengths))
    assert metrics["episode_len_max"] == max(lengths)


def test_an_env_that_fails_forever_stops_with_a_clear_error():
    log = FailureLog()
    config = _flaky_config(log, num_envs=2, period=1).fault_tolerance(
        num_consecutive_sub_env_failures_tolerance=5)
    runner = jr.SingleAgentEnvRunner(config=config)
    with pytest.raises(RuntimeError, match="fails forever"):
        runner.sample(num_timesteps=10)
    assert len(log.failures) == 6


# ---------------------------------------------------------------------- env creation
class _FailingCreator:
    """Raises on its first `failures` calls, then builds `make()`."""

    def __init__(self, failures: int, make):
        self.failures, self.make, self.calls = failures, make, 0

    def __call__(self, ctx):
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError(f"simulator not reachable (call {self.calls})")
        return self.make()


@pytest.mark.parametrize("kind", ["host", "compiled"])
def test_env_creation_failures_retry_with_restarts_else_raise_the_hint(kind, caplog):
    make = (lambda: gym.make("CartPole-v1")) if kind == "host" else (
        lambda: gymnax.make("CartPole-v1"))
    creator = _FailingCreator(2, make)
    config = make_config(creator, num_envs=2).fault_tolerance(
        restart_failed_sub_environments=True)
    with caplog.at_level(logging.WARNING, logger=HOST_LOGGER):
        runner = jr.SingleAgentEnvRunner(config=config)
    assert isinstance(runner.env, gym.vector.VectorEnv) == (kind == "host")
    assert runner.sample(num_timesteps=10).env_steps >= 10
    retries = [r for r in _error_records(caplog) if "Creating" in r.getMessage()]
    assert len(retries) == 2 and all(r.exc_info[0] is ConnectionError for r in retries)

    with pytest.raises(RuntimeError, match=r"ConnectionError.*"
                                           r"restart_failed_sub_environments=True"):
        jr.SingleAgentEnvRunner(config=make_config(_FailingCreator(1, make), num_envs=2))
    config = make_config(_FailingCreator(3, make), num_envs=2).fault_tolerance(
        restart_failed_sub_environments=True, num_consecutive_sub_env_failures_tolerance=2)
    with pytest.raises(RuntimeError, match="failed 3 times in a row"):
        jr.SingleAgentEnvRunner(config=config)


def test_recreation_after_a_failure_retries_a_failing_creator():
    log = FailureLog()
    calls = {"n": 0}

    def creator(ctx):
        calls["n"] += 1
        if calls["n"] in (5, 6):  # the first two calls of the first recreation
            raise ConnectionError("simulator restarting")
        return FlakyCartPole(log, reset_fails=lambda uid, n: uid == 1 and n == 2)

    config = make_config(creator, num_envs=4).fault_tolerance(
        restart_failed_sub_environments=True)
    runner = jr.SingleAgentEnvRunner(config=config)
    runner.sample(num_timesteps=8)
    batch = runner.sample(num_episodes=2)  # instance 1's 2nd reset fails -> recreation
    assert len(batch) == 2
    assert runner.get_metrics()["num_env_step_failures"] == 1
