"""The compiled metric-ring update: `rank_positions` and `write_ring` against plain
Python over random chunks (fast path, episode limits that cut a row, failed sub-envs,
chunks that stopped early)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from jaxrunner.core.carry import MetricRegisters
from jaxrunner.core.ring import NO_EPISODE_LIMIT, RingInput, rank_positions, write_ring


@pytest.mark.parametrize("shape,density", [((1,), 1.0), ((7,), 0.5), ((128, 64), 0.03),
                                           ((33, 1000), 0.2), ((16, 4096), 0.001)])
def test_rank_positions_equal_a_python_scan(shape, density):
    rng = np.random.default_rng(sum(shape))
    flags = rng.random(shape) < density
    flat = flags.reshape(-1)
    true_at = np.flatnonzero(flat)
    if true_at.size == 0:
        flat[len(flat) // 2] = True
        true_at = np.flatnonzero(flat)
    ranks = np.arange(1, true_at.size + 1, dtype=np.int32)
    found = jax.jit(rank_positions)(flat.reshape(shape), ranks)
    np.testing.assert_array_equal(np.asarray(found), true_at)
    last = jax.jit(rank_positions)(flat.reshape(shape), np.int32([true_at.size]))
    assert int(last[0]) == true_at[-1]


def _python_ring(terminated, truncated, failed, valid, rewards, start_len, start_ret,
                 start_step, limit, window, steps_in_call):
    """The ring update, one step and one sub-env at a time."""
    chunk_len, num_envs = rewards.shape
    length, ret = start_len.astype(np.int64).copy(), start_ret.astype(np.float64).copy()
    episodes, counted_len, discarded = [], 0, 0
    for t in range(chunk_len):
        if not valid[t]:
            continue
        for b in range(num_envs):
            length[b] += 1
            ret[b] += rewards[t, b]
            if failed[t, b]:
                discarded += min(length[b], steps_in_call[t])
                length[b], ret[b] = 0, 0.0
            elif terminated[t, b] or truncated[t, b]:
                if len(episodes) < limit:
                    episodes.append((ret[b], length[b], start_step + t + 1, t * num_envs + b))
                    counted_len += length[b]
                length[b], ret[b] = 0, 0.0
    last_counted = episodes[-1][3] if episodes else -1
    return episodes[-window:], len(episodes), counted_len, discarded, length, last_counted


@pytest.mark.parametrize("case", range(12))
def test_update_registers_equals_a_python_loop(case):
    rng = np.random.default_rng(case)
    chunk_len, num_envs, window = int(rng.integers(1, 20)), int(rng.integers(1, 40)), 10
    done = rng.random((chunk_len, num_envs)) < rng.choice([0.02, 0.2, 0.6])
    terminated = done & (rng.random(done.shape) < 0.5)
    truncated = done & ~terminated
    failed = (rng.random(done.shape) < 0.05) if case % 3 == 0 else np.zeros_like(done)
    terminated, truncated = terminated & ~failed, truncated & ~failed
    valid = np.arange(chunk_len) < rng.integers(1, chunk_len + 1)
    # As a chunk's records: no flags at the steps not taken (`RingInput`).
    terminated, truncated = terminated & valid[:, None], truncated & valid[:, None]
    failed = failed & valid[:, None]
    rewards = rng.normal(size=done.shape).astype(np.float32)
    start_len = rng.integers(0, 30, num_envs).astype(np.int32)
    start_ret = rng.normal(size=num_envs).astype(np.float32)
    limit = [NO_EPISODE_LIMIT, 0, 1, 3, int(done.sum() // 2) + 1][case % 5]
    steps_in_call = (rng.integers(0, 10) + 1 + np.arange(chunk_len)).astype(np.int32)
    expected, num, counted_len, discarded, end_len, last_counted = _python_ring(
        terminated, truncated, failed, valid, rewards, start_len, start_ret, 7, limit,
        window, steps_in_call)
    ring = RingInput(done=terminated | truncated, failed=failed, valid=valid, rewards=rewards)
    registers = MetricRegisters.create(window)

    def update(registers, ring, limit, start_len, start_ret, end_len, steps_in_call):
        return write_ring(registers, ring, np.uint32(7), limit,
                                 start_episode_len=start_len, start_episode_return=start_ret,
                                 end_episode_len=end_len, steps_in_call=steps_in_call)

    got = jax.jit(update)(
        registers, ring, np.int32(limit), start_len, start_ret, end_len.astype(np.int32),
        steps_in_call)
    new, got_num, got_len, got_discarded, got_last = (
        got.registers, got.num_counted, got.counted_len, got.discarded, got.last_counted)
    # The writes' ranks and flat positions (reused by the device callbacks' ring).
    written = np.asarray(got.writes.rank) >= 1
    assert written.sum() == min(int(got_num), window)
    ends = (np.asarray(ring.done) & np.asarray(ring.valid)[:, None]).reshape(-1)
    assert ends[np.asarray(got.writes.position)[written]].all()
    assert (np.diff(np.asarray(got.writes.position)[written]) > 0).all()
    assert (int(got_num), int(got_len), int(got_discarded)) == (num, counted_len, discarded)
    assert int(got_last) == last_counted
    size = int(new.window_size)
    assert size == len(expected)
    order = (int(new.window_next) - size + np.arange(size)) % window
    np.testing.assert_allclose(np.asarray(new.window_return)[order],
                               [e[0] for e in expected], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(new.window_len)[order], [e[1] for e in expected])
    np.testing.assert_array_equal(np.asarray(new.window_end_step)[order],
                                  [e[2] for e in expected])
