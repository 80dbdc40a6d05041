"""Determinism: same seed -> same bits; worker streams differ; state round trips; jit parity."""

from __future__ import annotations

import dataclasses
import inspect

import jax
import numpy as np
import pytest

import jaxrunner
from jaxrunner.core import NO_EPISODE_LIMIT, make_rollout_fns
from jaxrunner.runners import single_agent_env_runner as runner_module

from conftest import assert_trees_equal, host_tree, make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")

NUM_ENVS = 2
CALLS = ({"num_timesteps": 10}, {"num_timesteps": 21}, {"num_episodes": 2})


def _record(runner):
    out = []
    for kwargs in CALLS:
        batch = runner.sample(**kwargs)
        out.append((host_tree(batch.chunks),
                    [(e.id_, e.t_started, len(e), e.is_done) for e in batch]))
    return out


@pytest.fixture(scope="module")
def runners():
    """Two runners with the same config and seed, and one with another worker_index; each
    records its first three calls. Also records the `RolloutSpec` the runners build their
    rollout from (for the jit parity test)."""
    specs = []

    def recording(spec, mode):
        specs.append(spec)
        return make_rollout_fns(spec, mode)

    config = make_config(num_envs=NUM_ENVS, fragment=8, max_chunk_length=8,
                         episode_lookback_horizon=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(runner_module, "make_rollout_fns", recording)
        first = jaxrunner.SingleAgentEnvRunner(config=config)
        records = {"first": _record(first)}
    twin = jaxrunner.SingleAgentEnvRunner(config=config)
    other = jaxrunner.SingleAgentEnvRunner(config=config, worker_index=1, num_workers=1)
    records.update(twin=_record(twin), other=_record(other))
    return {"first": first, "twin": twin, "other": other, "records": records,
            "specs": specs}


def test_determinism__same_seed_gives_identical_bits(runners):
    records = runners["records"]
    for call, ((chunks_a, episodes_a), (chunks_b, episodes_b)) in enumerate(
            zip(records["first"], records["twin"])):
        assert_trees_equal(chunks_a, chunks_b, f"call {call}")
        assert episodes_a == episodes_b


def test_determinism__different_worker_index_gives_different_data(runners):
    records = runners["records"]
    (chunks_a, _), (chunks_c, _) = records["first"][0], records["other"][0]
    assert not np.array_equal(chunks_a[0].obs, chunks_c[0].obs)
    assert not np.array_equal(chunks_a[0].actions, chunks_c[0].actions)
    first_ids = {i for _, episodes in records["first"] for i, *_ in episodes}
    other_ids = {i for _, episodes in records["other"] for i, *_ in episodes}
    assert not first_ids & other_ids


def test_determinism__state_round_trip_reproduces_next_sample(runners):
    source, target = runners["first"], runners["other"]
    source.sample(num_timesteps=7)  # leave episodes in flight
    state = source.get_state(components=["rl_module", "env_runner_carry"])
    assert all(not isinstance(leaf, jax.Array) for leaf in jax.tree.leaves(state)), (
        "get_state must return host data only")
    target.set_state(state)
    for kwargs in ({"num_timesteps": 9}, {"num_timesteps": 16}, {"num_episodes": 1}):
        expected = source.sample(**kwargs)
        got = target.sample(**kwargs)
        assert_trees_equal(host_tree(expected.chunks), host_tree(got.chunks), str(kwargs))
        assert ([(e.t_started, len(e), e.is_done) for e in expected]
                == [(e.t_started, len(e), e.is_done) for e in got])
    assert source.get_metrics()["episode_return_mean"] == pytest.approx(
        target.get_metrics()["episode_return_mean"])


def test_determinism__jit_and_no_jit_chunk_agree(runners):
    """The pure `chunk` gives the same result jitted and op by op (`jax.disable_jit`)."""
    assert runners["specs"], "the runner should build its rollout through make_rollout_fns"
    spec = dataclasses.replace(runners["specs"][0], chunk_len=3)  # tiny: 3 vector steps
    fns = make_rollout_fns(spec, "explore")
    runner = runners["first"]
    params = jax.tree.map(np.asarray, runner.get_state(components="rl_module")["rl_module"])
    env_params = runner.env_params
    carry = jax.jit(fns.init_carry)(jax.random.key(3), params, env_params)
    lookback = jax.jit(fns.init_lookback)(carry, params, env_params)
    num_steps = 2  # two steps taken, the third skipped by the traced limit
    args = (carry, lookback, params, env_params, np.int32(num_steps), NO_EPISODE_LIMIT)
    # Counters the chunk may take after these (e.g. steps taken earlier in the same
    # sample() call) are 0 for the first chunk of a call.
    extra = {name: np.int32(0)
             for name in list(inspect.signature(fns.chunk).parameters)[len(args):]}

    fast = host_tree(jax.jit(fns.chunk)(*args, **extra))
    with jax.disable_jit():
        slow = host_tree(fns.chunk(*args, **extra))
    assert jax.tree.structure(fast) == jax.tree.structure(slow)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(fast), jax.tree.leaves(slow)):
        where = jax.tree_util.keystr(path)
        if np.issubdtype(a.dtype, np.floating):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=where)
        else:
            np.testing.assert_array_equal(a, b, err_msg=where)
    _, _, traj, info = fast
    assert int(info.num_steps) == num_steps
    assert traj.valid.tolist() == [t < num_steps for t in range(3)]
