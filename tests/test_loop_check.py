"""`steps_per_loop_check`: a chunk that tests its stop condition once per block of K vector
steps (the GPU setting) samples bit for bit what the per-step test samples, wherever the
chunk stops (the call's size, a full final-observation store, an episode count), for
single- and multi-agent runners; "auto" keeps the per-step test on CPU."""

from __future__ import annotations

import pytest

import jaxrunner as jr

from conftest import assert_trees_equal, make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")


def _single(steps_per_loop_check, **kwargs):
    return jr.SingleAgentEnvRunner(config=make_config(
        "CartPole-v1", num_envs=3, fragment=16, seed=3,
        steps_per_loop_check=steps_per_loop_check, **kwargs))


def _multi(steps_per_loop_check):
    config = (jr.RunnerConfig().environment("MultiAgentCartPole-v1")
              .env_runners(num_envs_per_env_runner=3, rollout_fragment_length=16,
                           steps_per_loop_check=steps_per_loop_check)
              .multi_agent(policies={"p0", "p1"},
                           policy_mapping_fn=lambda a, e: "p0" if a == "agent_0" else "p1")
              .rl_module(model_config={"fcnet_hiddens": [8]})
              .debugging(seed=3))
    return jr.MultiAgentEnvRunner(config=config)


def _same_samples(per_step, blocked, calls):
    for kwargs in calls:
        a, b = per_step.sample(**kwargs), blocked.sample(**kwargs)
        assert (a.num_vector_steps, len(a.chunks)) == (b.num_vector_steps, len(b.chunks)), kwargs
        assert_trees_equal(a.chunks, b.chunks, f"chunks of sample({kwargs})")
        assert [(e.id_, len(e)) for e in a] == [(e.id_, len(e)) for e in b]
    assert_trees_equal(per_step._carry, blocked._carry, "carry (counters, metric ring)")
    assert per_step.get_metrics()["num_episodes"] == blocked.get_metrics()["num_episodes"]


# Sizes that end a chunk on a block boundary, inside a block, in the first block, plus
# episode mode and a forced reset.
CALLS = [{}, {"num_timesteps": 30}, {"num_timesteps": 3}, {"num_timesteps": 100},
         {"num_episodes": 4}, {"num_timesteps": 50, "force_reset": True},
         {"num_timesteps": 21, "random_actions": True}]


@pytest.mark.parametrize("extra", [
    {},
    {"autoreset_mode": "partial"},
    # Room for 5 episode ends a sub-env in a 16-step chunk: CartPole chunks stop on a full
    # store, and blocks stop being taken before the store is nearly full.
    {"final_obs_slots_per_env": 5},
], ids=["gymnax", "partial", "small-store"])
@pytest.mark.default_codegen
def test_single_agent__blocks_of_steps_sample_what_single_steps_sample(extra):
    per_step, blocked = _single(1, **extra), _single(4, **extra)
    assert per_step._steps_per_loop_check() == 1 and blocked._steps_per_loop_check() == 4
    _same_samples(per_step, blocked, CALLS)


def test_multi_agent__blocks_of_steps_sample_what_single_steps_sample():
    _same_samples(_multi(1), _multi(4), CALLS[:5])


def test_blocks__no_new_program_for_new_sizes(compile_counter):
    runner = _single(4)
    runner.sample(num_timesteps=30)
    compile_counter.reset()
    for n in (3, 48, 100, 7):
        runner.sample(num_timesteps=n)
    assert compile_counter.count == 0


def test_auto__one_step_per_check_on_cpu_and_never_more_than_a_chunk(monkeypatch):
    runner = _single("auto")
    assert runner._steps_per_loop_check() == 1
    assert _single(64)._steps_per_loop_check() == 16  # the chunk is 16 steps long
    # Off CPU "auto" is ACCELERATOR_STEPS_PER_LOOP_CHECK (16), capped at the chunk length,
    # and the fault check's small leaves are tested by columns.
    from jaxrunner.core import faults
    from jaxrunner.runners import compiled_runner

    monkeypatch.setattr(compiled_runner.jax, "default_backend", lambda: "gpu")
    assert compiled_runner.ACCELERATOR_STEPS_PER_LOOP_CHECK == 16
    assert runner._steps_per_loop_check() == 16
    assert jr.SingleAgentEnvRunner(config=make_config(
        num_envs=3, fragment=8))._steps_per_loop_check() == 8
    assert faults.small_leaves_check() == "columns"
    with pytest.raises(ValueError, match="steps_per_loop_check"):
        make_config(steps_per_loop_check=0)
