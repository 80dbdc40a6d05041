"""The single-agent chunk's lean step: what it leaves to after the scan gives the same
results as doing it at every step.

* final observations: written densely and compacted after the scan, or scattered into
  the store at every step (`jaxrunner.core.final_obs.dense_write`), the two give the same
  store, bit for bit;
* episode and failure counters derived from the chunk's flags (`counters_after_scan`)
  equal the per-step updates;
* `action_logp` derived from the recorded `action_dist_inputs` is the log-probability of
  the recorded action.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct

import jaxrunner
from jaxrunner.core import final_obs as final_obs_module
from jaxrunner.core.chunk import counters_after_scan
from jaxrunner.core.final_obs import FinalObsWriter

from conftest import host_tree, make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")


def _written_every_step(writer, ended, final_obs, steps_taken, next_obs):
    state = writer.init(jax.ShapeDtypeStruct(final_obs.shape[1:], final_obs.dtype))
    for t in range(steps_taken):
        state = writer.write(state, ended[t], final_obs[t])
    last = max(steps_taken - 1, 0)
    return writer.finish(state, ended[last], next_obs)


@pytest.mark.parametrize("num_envs,num_steps,slots,steps_taken,end_rate", [
    (3, 8, 9, 8, 0.3),  # room for 3 ends per sub-env, all steps taken
    (3, 8, 24, 5, 1.0),  # never full, every sub-env ends every step, chunk stopped early
    (4, 6, 4, 1, 1.0),  # one step's ends fill the store
    (2, 5, 4, 0, 0.5),  # no step taken
])
def test_dense_write_and_compaction_give_the_scattered_store(num_envs, num_steps, slots,
                                                             steps_taken, end_rate):
    rng = np.random.default_rng(num_envs * 100 + slots)
    ended = rng.random((num_steps, num_envs)) < end_rate
    # The chunk stops before a step whose ends might not fit: keep the taken steps' ends
    # within the store, as the scan's `room` check does.
    for t in range(num_steps):
        if ended[:t].sum() + num_envs > slots:
            ended[t:] = False
    ended[steps_taken:] = False
    final_obs = rng.normal(size=(num_steps, num_envs, 2)).astype(np.float32)
    final_obs[steps_taken:] = 0.0  # buffers of steps not taken hold zeros
    next_obs = rng.normal(size=(num_envs, 2)).astype(np.float32)
    writer = FinalObsWriter(num_envs, slots, num_steps)
    expected = host_tree(jax.jit(_written_every_step, static_argnums=(0, 3))(
        writer, ended, final_obs, steps_taken, next_obs))
    got = host_tree(jax.jit(writer.compact)(ended, final_obs, np.int32(steps_taken), next_obs))
    np.testing.assert_array_equal(got.index, expected.index)
    used = expected.index >= 0
    assert got.obs[used].tobytes() == expected.obs[used].tobytes()
    assert not got.obs[:slots][~used[:slots]].any()  # empty episode-end rows stay zeros


@struct.dataclass
class _Counters:
    episode_count: jax.Array
    episode_len: jax.Array
    consecutive_failures: jax.Array
    vector_step: jax.Array


def test_counters_after_the_scan_equal_the_per_step_updates():
    rng = np.random.default_rng(3)
    num_steps, num_envs, steps_taken = 12, 5, 9
    failed = rng.random((num_steps, num_envs)) < 0.3
    ended = failed | (rng.random((num_steps, num_envs)) < 0.2)
    failed[:, 0] = True  # a sub-env failing at every step
    ended[:, 0] = True
    ended[:, 1] = failed[:, 1] = False  # a sub-env with no end at all
    start = _Counters(episode_count=np.arange(num_envs, dtype=np.int32),
                      episode_len=np.array([0, 7, 3, 1, 2], np.int32),
                      consecutive_failures=np.array([4, 0, 0, 2, 1], np.int32),
                      vector_step=np.uint32(2**32 - 3))  # wraps around
    count, length = start.episode_count.copy(), start.episode_len.copy()
    streak, step = start.consecutive_failures.copy(), int(start.vector_step)
    for t in range(steps_taken):
        count = count + ended[t]
        length = np.where(ended[t], 0, length + 1)
        streak = np.where(failed[t], streak + 1, 0)
        step = (step + 1) % 2**32
    valid = np.arange(num_steps) < steps_taken
    fields, last_end = jax.jit(counters_after_scan)(start, ended, failed, valid,
                                                     np.int32(steps_taken))
    np.testing.assert_array_equal(fields["episode_count"], count)
    np.testing.assert_array_equal(fields["episode_len"], length)
    np.testing.assert_array_equal(fields["consecutive_failures"], streak)
    assert int(fields["vector_step"]) == step
    taken = ended[:steps_taken]
    np.testing.assert_array_equal(last_end, [
        int(np.flatnonzero(taken[:, b])[-1]) if taken[:, b].any() else -1
        for b in range(num_envs)])


def test_scattered_and_dense_final_observations_give_the_same_batch(monkeypatch):
    """A runner whose final observations go through the scatter path (threshold 0)
    returns the same chunks, stores and episodes as one on the dense path, with chunks
    stopped early by a full store."""
    def record(runner):
        out = []
        for kwargs in ({"num_timesteps": 3 * 40}, {"num_episodes": 4}):
            batch = runner.sample(**kwargs)
            out.append((host_tree(batch.chunks), [(e.id_, e.t_started, len(e))
                                                  for e in batch]))
        return out

    config = make_config(num_envs=3, fragment=40, max_chunk_length=40,
                         final_obs_slots_per_env=1)
    dense = record(jaxrunner.SingleAgentEnvRunner(config=config))
    monkeypatch.setattr(final_obs_module, "DENSE_WRITE_MAX_BYTES", 0)
    scattered = record(jaxrunner.SingleAgentEnvRunner(config=config))
    assert any(len(chunks) > 1 for chunks, _ in dense), "a store should have filled up"
    for (chunks_a, episodes_a), (chunks_b, episodes_b) in zip(dense, scattered):
        assert episodes_a == episodes_b
        assert len(chunks_a) == len(chunks_b)
        for a, b in zip(chunks_a, chunks_b):
            for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
                assert np.asarray(x).tobytes() == np.asarray(y).tobytes()
            assert np.asarray(a.final_obs).tobytes() == np.asarray(b.final_obs).tobytes()


def test_action_logp_is_the_recorded_actions_log_probability():
    """Continuous actions (Pendulum): `action_logp` equals the module's distribution of the
    recorded `action_dist_inputs` evaluated at the recorded actions, at every taken step,
    and zeros where the step was not taken."""
    runner = jaxrunner.SingleAgentEnvRunner(config=make_config(
        "Pendulum-v1", num_envs=2, fragment=6, max_chunk_length=8))
    (traj,) = runner.sample().chunks
    traj = jax.device_get(traj)
    valid = np.asarray(traj.valid)
    inputs = np.asarray(traj.extra_model_outputs["action_dist_inputs"])
    dist = runner.module.action_dist(jnp.asarray(inputs.reshape(-1, inputs.shape[-1])))
    expected = np.asarray(dist.logp(jnp.asarray(
        np.asarray(traj.actions).reshape(-1, *traj.actions.shape[2:])))).reshape(valid.shape[0],
                                                                               -1)
    logp = np.asarray(traj.extra_model_outputs["action_logp"])
    np.testing.assert_allclose(logp[valid], expected[valid], rtol=1e-6, atol=1e-6)
    assert not logp[~valid].any() and valid.sum() == 6
