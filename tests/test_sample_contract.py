"""`sample()`: RLlib's contract (reference spec §3.4-3.6 and the §10 test invariants)."""

from __future__ import annotations

import math

import gymnax
import jax
import numpy as np
import pytest

import jaxrunner
from jaxrunner import SampleArgumentError
from jaxrunner.envs import registry as registry_module

from conftest import make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")

NUM_ENVS = 3
FRAGMENT = 8
CHUNK = 4  # max_chunk_length: any n > CHUNK * NUM_ENVS runs several compiled chunks
SHORT_MAX_STEPS = 12


@pytest.fixture(scope="module")
def runner():
    """CartPole, 3 sub-envs, fragment 8, chunks of 4 vector steps, lookback 1."""
    return jaxrunner.SingleAgentEnvRunner(
        config=make_config(num_envs=NUM_ENVS, fragment=FRAGMENT, max_chunk_length=CHUNK))


@pytest.fixture(scope="module")
def complete_runner():
    """CartPole, 2 sub-envs, batch_mode complete_episodes, lookback 3, fragment 4."""
    return jaxrunner.SingleAgentEnvRunner(
        config=make_config(num_envs=2, fragment=4, batch_mode="complete_episodes",
                           episode_lookback_horizon=3))


@pytest.fixture(scope="module")
def short_runner():
    """CartPole whose episodes are truncated after 12 steps (a registered creator)."""
    saved = dict(registry_module._REGISTRY)

    def creator(ctx):
        env, params = gymnax.make("CartPole-v1")
        return env, params.replace(max_steps_in_episode=ctx["max_steps"])

    jaxrunner.register_env("short-cartpole-sample", creator)
    config = make_config("short-cartpole-sample", num_envs=4, fragment=8).environment(
        env_config={"max_steps": SHORT_MAX_STEPS})
    yield jaxrunner.SingleAgentEnvRunner(config=config)
    registry_module._REGISTRY.clear()
    registry_module._REGISTRY.update(saved)


def total_len(batch) -> int:
    return sum(len(episode) for episode in batch)


def assert_continues(previous, batch) -> None:
    """Every episode cut at the end of `previous` goes on in `batch` (RLlib §3.6)."""
    ongoing = {e.id_: e for e in previous if not e.is_done}
    continued = {}
    for episode in batch:
        if episode.t_started > 0:
            assert episode.id_ in ongoing, f"{episode} continues nothing of the last call"
            before = ongoing[episode.id_]
            assert episode.t_started == before.t
            np.testing.assert_array_equal(episode.observations[0], before.observations[-1])
            continued[episode.id_] = episode
    assert set(continued) == set(ongoing)


def assert_sampling_works(runner, previous=None):
    batch = runner.sample(num_timesteps=NUM_ENVS)
    assert total_len(batch) == NUM_ENVS
    if previous is not None:
        assert_continues(previous, batch)
    return batch


# ----------------------------------------------------------------------------- arguments
def test_sample_contract__both_sizes_raise(runner):
    before = runner.sample(num_timesteps=NUM_ENVS)
    with pytest.raises(SampleArgumentError) as info:
        runner.sample(num_timesteps=10, num_episodes=1)
    # RLlib asserts here; a ValueError too, so either `except` catches it.
    assert isinstance(info.value, ValueError) and isinstance(info.value, AssertionError)
    message = str(info.value)
    assert "num_timesteps" in message and "num_episodes" in message and "not both" in message
    assert_sampling_works(runner, before)


@pytest.mark.parametrize("kwargs", [{"num_timesteps": -1}, {"num_episodes": -2}])
def test_sample_contract__negative_size_raises(runner, kwargs):
    before = runner.sample(num_timesteps=NUM_ENVS)
    with pytest.raises(SampleArgumentError) as info:
        runner.sample(**kwargs)
    assert isinstance(info.value, ValueError) and isinstance(info.value, AssertionError)
    (name, value), = kwargs.items()
    message = str(info.value)
    assert name in message and str(value) in message and ">= 0" in message
    assert_sampling_works(runner, before)


def test_sample_contract__argument_errors_compile_nothing(compile_counter):
    """Arguments are checked before anything is compiled: a fresh runner's bad calls
    compile nothing."""
    fresh = jaxrunner.SingleAgentEnvRunner(config=make_config(num_envs=2, fragment=4))
    compile_counter.reset()
    for kwargs in ({"num_timesteps": 4, "num_episodes": 1}, {"num_timesteps": -1},
                   {"num_episodes": "3"}):
        with pytest.raises(ValueError):
            fresh.sample(**kwargs)
    assert compile_counter.count == 0, "\n".join(compile_counter.messages)


@pytest.mark.parametrize("kwargs", [{"num_timesteps": 2.5}, {"num_episodes": "3"},
                                    {"num_timesteps": True}, {"explore": "yes"},
                                    {"force_reset": 1}, {"random_actions": None}])
def test_sample_contract__bad_argument_types_raise(runner, kwargs):
    before = runner.sample(num_timesteps=NUM_ENVS)
    with pytest.raises(ValueError) as info:
        runner.sample(**kwargs)
    assert next(iter(kwargs)) in str(info.value)
    assert_sampling_works(runner, before)


# ----------------------------------------------------------------------------- timestep mode
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 11, 12, 13, 25, 40, 61])
def test_sample_contract__timestep_mode_bounds(runner, n):
    batch = runner.sample(num_timesteps=n)
    total = total_len(batch)
    assert n <= total <= n + NUM_ENVS - 1
    assert batch.env_steps == total
    vector_steps = math.ceil(n / NUM_ENVS)
    assert batch.num_vector_steps == vector_steps
    # Device face: the valid steps of all chunks are exactly the steps taken.
    assert sum(int(np.sum(jax.device_get(c.valid))) for c in batch.chunks) == vector_steps
    for episode in batch:
        episode.validate()
        assert len(episode) > 0


def test_sample_contract__timestep_mode_spanning_many_chunks_continues(runner):
    first = runner.sample(num_timesteps=NUM_ENVS * (3 * CHUNK + 1))  # 4 chunks
    assert len(first.chunks) >= 2
    second = runner.sample(num_timesteps=NUM_ENVS * (2 * CHUNK + 3))
    assert_continues(first, second)
    assert any(e.t_started > 0 for e in second)


def test_sample_contract__default_size_truncate_episodes(runner):
    batch = runner.sample()
    assert total_len(batch) == FRAGMENT * NUM_ENVS


def test_sample_contract__cut_episodes_continue_with_same_id(runner):
    runner.sample(num_timesteps=NUM_ENVS, force_reset=True)
    batches = [runner.sample(num_timesteps=NUM_ENVS * k) for k in (5, 1, 7, 2, 9, 13, 3)]
    for previous, batch in zip(batches, batches[1:]):
        assert_continues(previous, batch)
    # Joining the chunks of one id gives one valid episode; ids are never reused.
    whole = {}
    for batch in batches:
        for chunk in batch:
            if chunk.id_ in whole:
                joined = whole[chunk.id_]
                length, ret = len(joined), joined.get_return()
                joined.concat_episode(chunk)
                assert len(joined) == length + len(chunk)
                assert joined.get_return() == pytest.approx(ret + chunk.get_return())
            else:
                assert chunk.t_started == 0 or batch is batches[0]
                whole[chunk.id_] = chunk
    for episode in whole.values():
        episode.validate()
    finished = [e for e in whole.values() if e.is_done and e.t_started == 0]
    assert finished, "CartPole with a random policy should finish an episode in 40 steps"


def test_sample_contract__zero_timesteps_returns_empty_batch(runner):
    before = runner.sample(num_timesteps=NUM_ENVS)
    empty = runner.sample(num_timesteps=0)
    assert len(empty) == 0 and list(empty) == [] and empty.env_steps == 0
    with pytest.raises(ValueError, match="holds no steps"):
        empty.trajectory()
    after = assert_sampling_works(runner, before)  # the cut episodes are still there
    assert len(empty) == 0  # still readable after the runner moved on
    empty = runner.sample(num_episodes=0)
    assert len(empty) == 0 and empty.env_steps == 0
    assert len(runner.sample(num_timesteps=NUM_ENVS)) == NUM_ENVS
    del after


def test_sample_contract__force_reset_restarts_every_sub_env(runner):
    before = runner.sample(num_timesteps=NUM_ENVS * 6)
    batch = runner.sample(num_timesteps=NUM_ENVS * 2, force_reset=True)
    assert all(e.t_started == 0 for e in batch)
    assert not {e.id_ for e in batch} & {e.id_ for e in before}


# ----------------------------------------------------------------------------- episode mode
@pytest.mark.parametrize("k", [1, 2, 5])
def test_sample_contract__episode_mode_returns_exactly_k_done_episodes(runner, k):
    runner.sample(num_timesteps=NUM_ENVS * 5)  # episodes in flight must not leak in
    batch = runner.sample(num_episodes=k)
    assert len(batch) == k
    assert len({e.id_ for e in batch}) == k
    for episode in batch:
        episode.validate()
        assert episode.is_done and episode.t_started == 0
        assert episode.len_lookback_buffer == 0
    assert batch.env_steps == total_len(batch)
    # The next timestep call starts fresh episodes (RLlib resets after episode mode).
    after = runner.sample(num_timesteps=NUM_ENVS)
    assert all(e.t_started == 0 for e in after)


def test_sample_contract__default_size_complete_episodes(complete_runner):
    batch = complete_runner.sample()
    assert len(batch) == 2
    assert all(e.is_done and e.t_started == 0 for e in batch)


# ----------------------------------------------------------------------------- lookback
def _check_lookback(batches, horizon):
    """Each chunk's lookback = the last min(L, t_started) steps of its episode before it."""
    history = {}  # id -> (observations, actions, rewards, extras) from t=0
    checked = 0
    for batch in batches:
        for chunk in batch:
            n = min(horizon, chunk.t_started)
            assert chunk.len_lookback_buffer == n
            if chunk.t_started == 0:
                assert chunk.id_ not in history
                history[chunk.id_] = ([], [], [], {k: [] for k in chunk.extra_model_outputs})
            obs, actions, rewards, extras = history[chunk.id_]
            assert len(actions) == chunk.t_started
            s = chunk.t_started
            np.testing.assert_array_equal(chunk.lookback_observations,
                                          np.asarray(obs[s - n:s]).reshape(
                                              chunk.lookback_observations.shape))
            np.testing.assert_array_equal(chunk.lookback_actions,
                                          np.asarray(actions[s - n:s]).reshape(
                                              chunk.lookback_actions.shape))
            np.testing.assert_array_equal(chunk.lookback_rewards,
                                          np.asarray(rewards[s - n:s], np.float32))
            for key, values in extras.items():
                np.testing.assert_array_equal(
                    chunk.lookback_extra_model_outputs[key],
                    np.asarray(values[s - n:s]).reshape(
                        chunk.lookback_extra_model_outputs[key].shape))
            # get_*(neg_index_as_lookback=True) reaches into the lookback.
            if n:
                np.testing.assert_array_equal(
                    chunk.get_actions(-1, neg_index_as_lookback=True), actions[s - 1])
            checked += n > 0
            obs.extend(chunk.observations[:-1])
            actions.extend(chunk.actions)
            rewards.extend(chunk.rewards)
            for key in extras:
                extras[key].extend(chunk.extra_model_outputs[key])
    return checked


@pytest.mark.parametrize("horizon", [1, 3])
def test_sample_contract__lookback_is_the_previous_steps(runner, complete_runner, horizon):
    target, num_envs = (runner, NUM_ENVS) if horizon == 1 else (complete_runner, 2)
    assert target.config.episode_lookback_horizon == horizon
    batches = [target.sample(num_timesteps=num_envs * 2, force_reset=True)]
    # Calls of 1-2 vector steps: a lookback of 3 must reach back over several calls.
    for k in (1, 2, 1, 1, 3, 1, 2):
        batches.append(target.sample(num_timesteps=num_envs * k))
    checked = _check_lookback(batches, horizon)
    assert checked >= num_envs  # the check did look at lookback data
    assert max(e.len_lookback_buffer for b in batches for e in b) == horizon


# ----------------------------------------------------------------------------- policy modes
def test_sample_contract__explore_false_takes_argmax(runner):
    batch = runner.sample(num_timesteps=NUM_ENVS * 8, explore=False)
    for episode in batch:
        logits = episode.extra_model_outputs["action_dist_inputs"]
        np.testing.assert_array_equal(episode.actions, np.argmax(logits, axis=-1))
    explored = runner.sample(num_timesteps=NUM_ENVS * 8, explore=True)
    logits = np.concatenate([e.extra_model_outputs["action_dist_inputs"] for e in explored])
    actions = np.concatenate([e.actions for e in explored])
    assert np.any(actions != np.argmax(logits, axis=-1)), "explore=True should sample"


def test_sample_contract__action_logp_matches_distribution(runner):
    batch = runner.sample(num_timesteps=NUM_ENVS * 4)
    for episode in batch:
        logits = episode.extra_model_outputs["action_dist_inputs"].astype(np.float64)
        log_probs = logits - np.log(np.sum(np.exp(logits), axis=-1, keepdims=True))
        expected = np.take_along_axis(log_probs, episode.actions[:, None].astype(int), -1)
        np.testing.assert_allclose(episode.extra_model_outputs["action_logp"],
                                   expected[:, 0], rtol=1e-5, atol=1e-6)


def test_sample_contract__random_actions(runner):
    before = runner.sample(num_timesteps=NUM_ENVS)
    batch = runner.sample(num_timesteps=NUM_ENVS * 10, random_actions=True)
    assert_continues(before, batch)
    actions = np.concatenate([e.actions for e in batch])
    assert set(np.unique(actions)) == {0, 1}
    for episode in batch:
        episode.validate()
        np.testing.assert_allclose(episode.extra_model_outputs["action_logp"], -np.log(2.0),
                                   rtol=1e-6)
    episodes = runner.sample(num_episodes=2, random_actions=True)
    assert len(episodes) == 2 and all(e.is_done for e in episodes)


def test_sample_contract__cartpole_return_equals_length(runner):
    batches = [runner.sample(num_timesteps=NUM_ENVS * 9), runner.sample(num_episodes=3)]
    for batch in batches:
        for episode in batch:
            assert episode.get_return() == len(episode)
            np.testing.assert_array_equal(episode.rewards, 1.0)


# ----------------------------------------------------------------------------- done flags
def _pole_fell(obs) -> bool:
    x, _, theta, _ = np.asarray(obs, np.float64)
    return abs(x) > 2.4 or abs(theta) > 12 * 2 * np.pi / 360


def test_sample_contract__terminated_and_truncated_kept_apart(short_runner):
    batches = [short_runner.sample(num_episodes=12)]
    batches += [short_runner.sample(num_timesteps=4 * 20) for _ in range(2)]
    done = [e for b in batches for e in b if e.is_done]
    truncated_only = terminated_only = 0
    for episode in done:
        total = episode.t_started + len(episode)  # whole-episode length at its end
        fell = _pole_fell(episode.observations[-1])  # the final observation
        assert episode.is_terminated == fell, episode
        assert episode.is_truncated == (total == SHORT_MAX_STEPS), episode
        assert total <= SHORT_MAX_STEPS
        truncated_only += episode.is_truncated and not episode.is_terminated
        terminated_only += episode.is_terminated and not episode.is_truncated
    assert truncated_only > 0 and terminated_only > 0, (truncated_only, terminated_only)
    # The device face keeps both flags too, and the final observation of a finished step
    # is the one before the auto-reset.
    seen_terminated_only = seen_truncated_only = False
    for batch in batches[1:]:
        traj = jax.device_get(batch.trajectory())
        steps = int(traj.valid.sum())
        term, trunc = traj.terminated[:steps], traj.truncated[:steps]
        seen_terminated_only |= bool(np.any(term & ~trunc))
        seen_truncated_only |= bool(np.any(trunc & ~term))
        for t, b in np.argwhere(term | trunc):
            assert _pole_fell(traj.final_obs[t, b]) == bool(term[t, b])
            if t + 1 < steps:  # the next observation is the reset one, not the final one
                assert not np.array_equal(traj.final_obs[t, b], traj.obs[t + 1, b])
    assert seen_terminated_only and seen_truncated_only


def test_sample_contract__end_flags_are_one_byte_per_step(short_runner):
    """The record keeps a step's terminated / truncated / failed flags in one uint8; the
    properties decode them, on device and host arrays alike."""
    from jaxrunner.core.carry import pack_step_flags

    traj = short_runner.sample(num_timesteps=4 * 16).trajectory()
    assert traj.flags.dtype == np.uint8 and traj.flags.shape == traj.rewards.shape
    bits = np.array(np.meshgrid([0, 1], [0, 1], [0, 1])).reshape(3, -1).astype(bool)
    for xp in (np, jax.numpy):
        flags = pack_step_flags(*(xp.asarray(b) for b in bits))
        assert isinstance(flags, np.ndarray) == (xp is np) and flags.dtype == np.uint8
        assert len(set(np.asarray(flags).tolist())) == 8  # every combination its own byte
        decoded = traj.replace(flags=flags)
        np.testing.assert_array_equal(np.asarray(decoded.terminated), bits[0])
        np.testing.assert_array_equal(np.asarray(decoded.truncated), bits[1])
        np.testing.assert_array_equal(np.asarray(decoded.failed), bits[2])
