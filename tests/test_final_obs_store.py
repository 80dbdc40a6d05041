"""Final observations are stored only where episodes end (`jaxrunner.core.final_obs`), yet
every reader sees the same values as a dense `(T, B)` record of `info["final_observation"]`.

The reference is a plain Python loop over the same vmapped auto-resetting env step, keys
and actions as the chunk (random actions), which records every step's observation and
final observation densely, as the rollout did before the store. Equality is bit for bit.
"""

from __future__ import annotations

import gymnax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from gymnax.environments import environment, spaces

import jaxrunner
from jaxrunner.core.autoreset import gymnax_step_fns, make_env_step, step_reads_key
from jaxrunner.core.final_obs import slots_for
from jaxrunner.core.rollout import sample_action_space

from conftest import make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")

SEED = 5


def reference_loop(env, env_params, action_space, key, num_envs: int, num_steps: int,
                   mode: str = "gymnax"):
    """`(obs, final_obs)` `(T, B, ...)` of random actions, keyed as the chunk keys them
    (`core.chunk.make_chunk_fns`: init split in 3, then one split per vector step into the
    next key, the acting key and the env step's keys, step keys only for an env whose step
    reads its key)."""
    key, reset_key, _ = jax.random.split(key, 3)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(reset_key, num_envs),
                                                        env_params)
    fns = gymnax_step_fns(env)
    # The chunk gives per-sub-env step keys only to an env whose step reads its key.
    example_actions = sample_action_space(action_space, key, num_envs)
    step_keys = step_reads_key(fns, key, state, example_actions, env_params)
    vector_step = make_env_step(fns, num_envs, mode, 16, step_keys=step_keys)
    env_step = jax.jit(vector_step.step)
    observations, finals = [], []
    for _ in range(num_steps):
        keys = jax.random.split(key, 2 + vector_step.num_keys)
        key, act_key = keys[0], keys[1]
        actions = sample_action_space(action_space, act_key, num_envs)
        next_obs, state, _, _, _, info = env_step(keys[2:], state, actions, env_params)
        observations.append(np.asarray(obs))
        finals.append(np.asarray(info["final_observation"]))
        obs = next_obs
    return np.stack(observations), np.stack(finals)


def segments(done_column: np.ndarray, num_steps: int) -> list[tuple[int, int]]:
    """`(start, stop)` chunk steps of one sub-env's episode views, in order."""
    stops = list(np.flatnonzero(done_column) + 1) + [num_steps]
    starts = [0] + stops[:-1]
    return [(s, e) for s, e in zip(starts, stops) if e > s]


def episodes_by_env(batch) -> dict[int, list]:
    """Host episode views per sub-env (ids end with the sub-env in 5 hex digits, then an
    8-digit episode counter)."""
    out: dict[int, list] = {}
    for episode in batch:
        out.setdefault(int(episode.id_[-13:-8], 16), []).append(episode)
    return out


def _runner(env_name: str, num_envs: int, fragment: int, **kwargs):
    return jaxrunner.SingleAgentEnvRunner(config=make_config(
        env_name, num_envs=num_envs, fragment=fragment, seed=SEED, **kwargs))


@pytest.mark.parametrize("env_id,mode", [
    ("CartPole-v1", "partial"),
    pytest.param("Breakout-MinAtar", "gymnax", marks=pytest.mark.slow)])
def test_dense_final_obs_equals_the_reference_loop_bit_for_bit(env_id, mode):
    num_envs, num_steps = 5, 48  # "auto": 7 slots per sub-env, not 48
    runner = _runner(env_id, num_envs, num_steps, autoreset_mode=mode)
    batch = runner.sample(num_timesteps=num_envs * num_steps, random_actions=True)
    (traj,) = batch.chunks
    assert batch.num_vector_steps == num_steps
    # The store is much smaller than a dense (T, B) record.
    assert traj.final_obs_store.index.shape == (slots_for(num_envs, num_steps) + num_envs,)
    env, env_params = gymnax.make(env_id)
    # The runner's carry stream (DESIGN.md "Construction"; tests/test_reference_loop.py).
    key = jax.random.fold_in(jax.random.key(SEED), 2)
    ref_obs, ref_final = reference_loop(env, env_params, runner.action_space, key, num_envs,
                                        num_steps, mode)
    final = np.asarray(traj.final_obs)
    assert final.dtype == ref_final.dtype and final.shape == ref_final.shape
    np.testing.assert_array_equal(np.asarray(traj.obs), ref_obs)
    assert final.tobytes() == ref_final.tobytes()
    # The host (numpy) reconstruction equals the device one ...
    assert np.asarray(jax.device_get(traj).final_obs).tobytes() == ref_final.tobytes()
    # ... and every host episode view ends on the reference's final observation.
    done = np.asarray(traj.terminated | traj.truncated)
    for b, episodes in episodes_by_env(batch).items():
        spans = segments(done[:, b], num_steps)
        assert len(spans) == len(episodes)
        for (s, e), episode in zip(spans, episodes):
            np.testing.assert_array_equal(episode.observations[:-1], ref_obs[s:e, b])
            assert episode.observations[-1].tobytes() == ref_final[e - 1, b].tobytes()


class EndsEveryStep(environment.Environment):
    """Every step terminates; the final observation is `[1, u]`, the reset observation
    `[-1, v]` (`u`, `v` uniform draws), so every final observation is distinct."""

    @property
    def default_params(self):
        return environment.EnvParams(max_steps_in_episode=10)

    def step_env(self, key, state, action, params):
        count = state + 1.0
        return (jnp.stack([count, jax.random.uniform(key)]), count, jnp.float32(1.0),
                jnp.bool_(True), {})

    def reset_env(self, key, params):
        return jnp.stack([jnp.float32(-1.0), jax.random.uniform(key)]), jnp.float32(0.0)

    def is_truncated(self, state, params):
        return jnp.bool_(False)

    def action_space(self, params=None):
        return spaces.Discrete(2)

    def observation_space(self, params=None):
        return spaces.Box(-1e6, 1e6, (2,), jnp.float32)


def test_a_full_store_stops_the_chunk_early_and_drops_nothing():
    """Every sub-env ends at every step: with room for one end per sub-env each chunk
    takes one step; the runner runs more chunks and keeps every final observation
    (episodes, trajectory(), dense arrays), in timestep and episode mode."""
    env = EndsEveryStep()
    jaxrunner.register_env("ends-every-step", lambda ctx: (env, env.default_params))
    runner = _runner("ends-every-step", 3, 8, final_obs_slots_per_env=1)
    batch = runner.sample(num_timesteps=24, random_actions=True)
    assert batch.env_steps == 24 and batch.num_vector_steps == 8 and len(batch.chunks) == 8
    episodes = list(batch)
    assert len(episodes) == 24
    for episode in episodes:  # one step each: a reset obs, then the final obs
        assert len(episode) == 1 and episode.is_terminated
        assert episode.observations[0][0] == -1.0 and episode.observations[1][0] == 1.0
    joined = batch.trajectory()
    valid = np.asarray(joined.valid)
    assert valid.sum() == 8
    final = np.asarray(joined.final_obs)[valid]
    np.testing.assert_array_equal(final[..., 0], np.ones((8, 3)))
    assert len(set(final[..., 1].ravel().tolist())) == 24
    assert ({e.observations[1][1].item() for e in episodes}
            == set(final[..., 1].ravel().tolist()))
    finished = list(runner.sample(num_episodes=7, random_actions=True))
    assert len(finished) == 7 and all(e.observations[1][0] == 1.0 for e in finished)


def test_every_reader_sees_the_dense_values(compile_counter):
    """Host episodes and trajectory() over several chunks read the same final
    observations as the chunks' dense arrays, and sizes of work compile nothing new after
    warm-up."""
    runner = _runner("CartPole-v1", 4, 40, max_chunk_length=16)
    for n in (160, 100):
        runner.sample(num_timesteps=n)
    compile_counter.reset()
    batches = [runner.sample(num_timesteps=n) for n in (160, 60, 150, 8)]
    assert compile_counter.count == 0
    for batch in batches:
        joined = batch.trajectory()
        dense = np.concatenate([np.asarray(c.final_obs) for c in batch.chunks])
        assert np.asarray(joined.final_obs).tobytes() == dense.tobytes()
        valid = np.asarray(joined.valid)
        done = (np.asarray(joined.terminated) | np.asarray(joined.truncated))[valid]
        taken, obs = dense[valid], np.asarray(joined.obs)[valid]
        for b, episodes in episodes_by_env(batch).items():
            spans = segments(done[:, b], len(taken))
            assert len(spans) == len(episodes)
            for (s, e), episode in zip(spans, episodes):
                assert len(episode) == e - s
                np.testing.assert_array_equal(episode.observations[:-1], obs[s:e, b])
                np.testing.assert_array_equal(episode.observations[-1], taken[e - 1, b])


@pytest.mark.parametrize("host", [False, True])
def test_stores_joined_across_sub_envs_give_the_dense_arrays_side_by_side(host):
    """Trajectories of several runners (different sub-env counts, steps taken by only
    some of them) joined along the sub-env axis through their stores rebuild exactly the
    dense final observations side by side, zeros where not every runner took the step."""
    from jaxrunner.core.final_obs import (UNUSED, FinalObsStore, dense_final_obs,
                                          join_stores_across_envs)

    rng = np.random.default_rng(SEED)
    num_steps, envs = 6, [3, 2]
    valids = [np.arange(num_steps) < 6, np.arange(num_steps) < 4]
    obs, stores, dense = [], [], []
    for b, valid in zip(envs, valids):
        o = rng.normal(size=(num_steps, b, 2)).astype(np.float32)
        positions = np.flatnonzero(rng.random(num_steps * b) < 0.4).astype(np.int32)
        positions = positions[valid[positions // b]]
        index = np.concatenate([positions, np.full((2,), UNUSED, np.int32)])
        rows = rng.normal(size=(len(index), 2)).astype(np.float32)
        store = FinalObsStore(index=index, obs=rows)
        if not host:
            o, store, valid = jax.device_put((o, store, valid))
        obs.append(o)
        stores.append(store)
        dense.append(np.asarray(dense_final_obs(o, store, valid)))
    valid = np.logical_and(*valids)
    joined = join_stores_across_envs(stores, envs, valid if host else jnp.asarray(valid))
    assert isinstance(joined.index, np.ndarray) == host
    expected = np.concatenate(dense, axis=1) * valid[:, None, None]
    got = dense_final_obs(np.concatenate(obs, axis=1) if host else jnp.concatenate(obs, axis=1),
                          joined, valid if host else jnp.asarray(valid))
    np.testing.assert_array_equal(np.asarray(got), expected)
