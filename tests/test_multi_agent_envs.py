"""The JAX multi-agent env protocol and the built-in multi-agent envs (eager, no runner)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrunner.envs.context import EnvContext
from jaxrunner.envs.multi_agent import ALL, make_multi_agent_env
from jaxrunner.envs.multi_agent_cartpole import MultiAgentCartPole
from jaxrunner.envs.tic_tac_toe import TicTacToe
from multi_agent_helpers import Relay, RelayParams

KEY = jax.random.key(0)


def test_tic_tac_toe__turns_win_rewards_and_auto_reset():
    env = TicTacToe()
    params = env.default_params
    obs, state = env.reset(KEY, params)
    assert {a: bool(v) for a, v in env.agents_to_act(state, params).items()} == {
        "player_x": True, "player_o": False}
    # X takes 0, 1, 2 (a row); O takes 3, 4.
    moves = [("player_x", 0), ("player_o", 3), ("player_x", 1), ("player_o", 4),
             ("player_x", 2)]
    for i, (player, cell) in enumerate(moves):
        obs, state, rewards, terminateds, truncateds, infos = env.step(
            KEY, state, {player: cell}, params)
        last = i == len(moves) - 1
        assert bool(terminateds[ALL]) == last
        assert not bool(truncateds[ALL])
    assert float(rewards["player_x"]) == 1.0 and float(rewards["player_o"]) == -1.0
    final = infos["final_observation"]
    np.testing.assert_array_equal(final["player_x"], [1, 1, 1, -1, -1, 0, 0, 0, 0])
    np.testing.assert_array_equal(final["player_o"], -final["player_x"])
    # Auto-reset: a fresh board, X to move.
    np.testing.assert_array_equal(obs["player_x"], np.zeros(9))
    assert bool(env.agents_to_act(state, params)["player_x"])


def test_tic_tac_toe__illegal_move_loses():
    env = TicTacToe()
    _, state = env.reset(KEY)
    _, state, *_ = env.step(KEY, state, {"player_x": 4})
    _, state, rewards, terminateds, _, _ = env.step(KEY, state, {"player_o": 4})
    assert bool(terminateds[ALL])
    assert float(rewards["player_o"]) == -1.0 and float(rewards["player_x"]) == 1.0


def test_step__actions_for_agents_that_must_not_act_raise():
    env = TicTacToe()
    _, state = env.reset(KEY)
    with pytest.raises(ValueError, match=r"\['player_o'\] must not act"):
        env.step(KEY, state, {"player_x": 0, "player_o": 1})
    with pytest.raises(ValueError, match=r"\['player_x'\] are missing"):
        env.step(KEY, state, {})
    with pytest.raises(ValueError, match="unknown agents"):
        env.step(KEY, state, {"player_z": 0})
    # The env still steps after the errors.
    _, state, _, terminateds, _, _ = env.step(KEY, state, {"player_x": 0})
    assert not bool(terminateds[ALL])


def test_step__jitted_and_vmapped_ignores_non_acting_agents():
    env = TicTacToe()
    _, state = env.reset(KEY)
    step = jax.jit(jax.vmap(env.step, in_axes=(None, None, 0, None)))
    # Two batch entries differ only in the action of player_o, who must not act.
    actions = {"player_x": jnp.array([4, 4]), "player_o": jnp.array([0, 8])}
    obs, _, _, _, _, _ = step(KEY, state, actions, env.default_params)
    np.testing.assert_array_equal(obs["player_x"][0], obs["player_x"][1])
    assert float(obs["player_x"][0][4]) == 1.0 and float(obs["player_x"][0].sum()) == 1.0


def test_multi_agent_cartpole__agents_terminate_alone_and_stop_acting():
    env = MultiAgentCartPole(num_agents=2)
    params = env.default_params
    obs, state = env.reset(KEY, params)
    assert set(obs) == {"agent_0", "agent_1"} and obs["agent_0"].shape == (4,)
    fell = {}
    for t in range(100):
        # agent_0 always pushes right and falls first; agent_1 balances until then.
        acting = {a: bool(v) for a, v in env.agents_to_act(state, params).items()}
        assert acting == {a: a not in fell for a in env.agents}
        actions = {a: (1 if a == "agent_0" or "agent_0" in fell else t % 2)
                   for a in env.agents if acting[a]}
        obs, state, rewards, terminateds, truncateds, infos = env.step(KEY, state, actions,
                                                                       params)
        for a in env.agents:
            assert float(rewards[a]) == (0.0 if a in fell else 1.0)
            if bool(terminateds[a]):
                assert a not in fell  # terminated once, in the step it fell
                fell[a] = t
        if bool(terminateds[ALL]):
            break
    assert fell["agent_0"] < fell["agent_1"] == t  # __all__ once both had fallen
    # Auto-reset: both poles up again, both act.
    assert all(bool(v) for v in env.agents_to_act(state, params).values())


def test_env_whose_agents_change__is_rejected():
    class Shrinking(Relay):
        def reset_env(self, key, params):
            obs, state = super().reset_env(key, params)
            del obs["c"]
            return obs, state

    with pytest.raises(ValueError, match="fixed agent ids"):
        Shrinking().reset(KEY, RelayParams())


def test_registered_names_resolve_to_multi_agent_envs():
    env, params, name = make_multi_agent_env("MultiAgentCartPole-v1",
                                             EnvContext({"num_agents": 3}))
    assert env.agents == ("agent_0", "agent_1", "agent_2") and name == "MultiAgentCartPole-v1"
    env, _, _ = make_multi_agent_env("TicTacToe-v0", EnvContext({}))
    assert env.agents == ("player_x", "player_o")
    with pytest.raises(TypeError, match="not a jaxrunner multi-agent env"):
        make_multi_agent_env("CartPole-v1", EnvContext({}))


def test_jaxmarl_adapter__mpe_simple_spread():
    pytest.importorskip("jaxmarl")
    env, params, name = make_multi_agent_env("jaxmarl/MPE_simple_spread_v3", EnvContext({}))
    assert name == "jaxmarl/MPE_simple_spread_v3"
    assert env.agents == ("agent_0", "agent_1", "agent_2")
    obs, state = env.reset(KEY, params)
    assert obs["agent_0"].shape == (18,)
    step = jax.jit(env.step)
    actions = {a: jnp.int32(1) for a in env.agents}
    for t in range(40):
        obs, state, rewards, terminateds, truncateds, infos = step(
            jax.random.fold_in(KEY, t), state, actions, params)
        if bool(truncateds[ALL] | terminateds[ALL]):
            break
    # MPE episodes end on their step limit: a truncation, with final observations.
    assert t == env.inner.max_steps
    assert bool(truncateds[ALL]) and not bool(terminateds[ALL])
    assert all(float(rewards[a]) == float(rewards["agent_0"]) for a in env.agents)
    assert set(infos["final_observation"]) == set(env.agents)
    assert all(bool(v) for v in env.agents_to_act(state, params).values())


@pytest.mark.default_codegen
@pytest.mark.parametrize("separate_draws", [False, True])
def test_step_with_keys__separate_reset_gives_the_same_steps(separate_draws):
    """A multi-agent env's vector step with `separate_resets` (its reset drawn in a kernel
    of its own on CPU), and with `separate_draws` (its random bits too), equals the fused
    one bit for bit, over steps that end episodes."""
    from jaxrunner import lowering
    from jaxrunner.core.autoreset import make_env_step
    from jaxrunner.core.multi_agent_rollout import multi_agent_step_fns

    env, params, _ = make_multi_agent_env("MultiAgentCartPole-v1",
                                          EnvContext({"num_agents": 2}))
    fns = multi_agent_step_fns(env)
    assert fns.takes_reset_gate
    num_envs = 16

    def rollout(separate, key, states):
        step = make_env_step(fns, num_envs, "gymnax", 1, separate_resets=separate,
                             separate_draws=separate and separate_draws)

        def body(states, key):
            key_act, key_step = jax.random.split(key)
            actions = {a: jax.random.randint(k, (num_envs,), 0, 2) for a, k in
                       zip(env.agents, jax.random.split(key_act, len(env.agents)))}
            out = step.step(jax.random.split(key_step, step.num_keys), states, actions,
                            params)
            return out[1], (out[0], out[2], out[3], out[4], out[5]["final_observation"])
        return jax.lax.scan(body, states, jax.random.split(key, 200))

    _, states = jax.vmap(env.reset, in_axes=(0, None))(
        jax.random.split(jax.random.key(3), num_envs), params)
    jitted = lowering.jit(rollout, static_argnums=0, unrolled=True)
    results = [jitted(flag, jax.random.key(4), states) for flag in (False, True)]
    jax.tree.map(np.testing.assert_array_equal, results[0], results[1])
    # The reset in a conditional of its own, and with separate_draws its draws in more.
    conditionals = jitted.lower(True, jax.random.key(4), states).compile().as_text().count(
        "conditional(")
    assert conditionals > 1 if separate_draws else conditionals == 1
    assert int(jnp.sum(results[0][1][2][ALL])) >= num_envs, "the test needs episode ends"
