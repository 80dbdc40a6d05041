"""`MultiAgentEnvRunner` on host multi-agent envs: RLlib `MultiAgentEnv` subclasses and
PettingZoo envs stepped in Python with the compiled policy.

Checked against a plain-Python replay of the recorded actions (multi-agent CartPole),
against the compiled runner on the same env written once in JAX and once in numpy (same
seeds: the same batches), with agents joining and leaving, a PettingZoo env (parallel
and AEC), sub-env faults, state and runner selection.
"""

from __future__ import annotations

import contextlib

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

pytest.importorskip("ray.rllib")
from ray.rllib.env.multi_agent_env import MultiAgentEnv  # noqa: E402

import jaxrunner  # noqa: E402
from jaxrunner import MultiAgentEnvRunner, RunnerConfig, SingleAgentEnvRunner  # noqa: E402
from jaxrunner.envs.registry import unregister_env  # noqa: E402
from multi_agent_helpers import relay_creator, whole_episodes  # noqa: E402

jaxrunner.register_env("HostTestRelayJax-v0", relay_creator)

# Steps after which a MultiCartPole copy raises, keyed by vector_index (set by tests).
FAULTS: dict = {}


@contextlib.contextmanager
def injected_faults(faults: dict):
    """`FAULTS` set to `faults` for the block, cleared after it (also when it raises)."""
    FAULTS.update(faults)
    try:
        yield
    finally:
        FAULTS.clear()


class MultiCartPole(MultiAgentEnv):
    """RLlib's multi-agent CartPole example in plain Python: `num_agents` CartPoles (agent
    ids 0..N-1, ints as RLlib's example has them), each agent done on its own, `"__all__"`
    once all are. Reset `k` of a copy starts its poles from seeds `1000 * k + agent`."""

    def __init__(self, config=None):
        super().__init__()
        config = config or {}
        self.num = int(config.get("num_agents", 2))
        self.index = getattr(config, "vector_index", 0)
        self.possible_agents = list(range(self.num))
        self.agents = list(self.possible_agents)
        self.poles = [CartPoleEnv() for _ in range(self.num)]
        self.observation_spaces = {i: self.poles[0].observation_space for i in range(self.num)}
        self.action_spaces = {i: self.poles[0].action_space for i in range(self.num)}
        self.resets = 0
        self.done: set = set()

    def reset(self, *, seed=None, options=None):
        fault = FAULTS.get(("reset", self.index))  # "once" or "always": reset raises
        if fault is not None:
            if fault == "once":
                FAULTS.pop(("reset", self.index))
            raise RuntimeError("simulated reset crash")
        self.done = set()
        self.agents = list(self.possible_agents)
        obs = {i: pole.reset(seed=1000 * self.resets + i)[0]
               for i, pole in enumerate(self.poles)}
        self.resets += 1
        return obs, {}

    def step(self, action_dict):
        if self.index in FAULTS:  # FAULTS[i] = n: sub-env i raises at its n-th next step
            FAULTS[self.index] -= 1
            if FAULTS[self.index] == 0:
                FAULTS.pop(self.index)
                raise RuntimeError("simulated crash")
        obs, rewards, terminateds, truncateds = {}, {}, {}, {}
        for i, action in action_dict.items():
            assert i not in self.done, "a done agent was given an action"
            o, r, te, tr, _ = self.poles[i].step(action)
            obs[i], rewards[i], terminateds[i], truncateds[i] = o, r, te, tr
            if te or tr:
                self.done.add(i)
        self.agents = [a for a in self.possible_agents if a not in self.done]
        terminateds["__all__"] = len(self.done) == self.num
        truncateds["__all__"] = False
        return obs, rewards, terminateds, truncateds, {}


def cartpole_config(restart=True, num_envs=2, **env_runners):
    return (RunnerConfig().environment(MultiCartPole, env_config={"num_agents": 2})
            .env_runners(**{"num_envs_per_env_runner": num_envs,
                            "rollout_fragment_length": 8, "episode_lookback_horizon": 1,
                            **env_runners})
            .rl_module(model_config={"fcnet_hiddens": [8]})
            .fault_tolerance(restart_failed_sub_environments=restart)
            .debugging(seed=0))


@pytest.fixture(scope="module")
def cartpole():
    runner = MultiAgentEnvRunner(config=cartpole_config())
    yield runner
    runner.stop()


def replay(episode, config):
    """Replays a whole episode's recorded actions on a fresh env in a plain loop; returns
    per agent (observations, rewards, terminated) and the episode length."""
    from jaxrunner.envs.context import EnvContext

    env = MultiCartPole(EnvContext(config, vector_index=episode.env_index))
    env.resets = episode.episode_index
    obs, _ = env.reset()
    seen = {a: [obs[a]] for a in obs}
    rewards = {a: [] for a in obs}
    terminated = {}
    taken = {a: 0 for a in obs}
    length = 0
    while True:
        actions = {}
        for agent in env.agents:
            key = str(agent)
            actions[agent] = int(episode.agent_episodes[key].actions[taken[agent]])
            taken[agent] += 1
        obs, rew, term, _, _ = env.step(actions)
        length += 1
        for agent, value in obs.items():
            seen[agent].append(value)
            rewards[agent].append(rew[agent])
            if term[agent]:
                terminated[agent] = True
        if term["__all__"]:
            return seen, rewards, terminated, length


def test_multi_cartpole_matches_plain_python_replay(cartpole):
    assert jaxrunner.runner_class_for(cartpole_config()) is MultiAgentEnvRunner
    batch = cartpole.sample(num_episodes=3)
    assert len(batch) == 3
    for episode in batch:
        assert episode.is_terminated and not episode.is_truncated
        seen, rewards, terminated, length = replay(episode, {"num_agents": 2})
        assert len(episode) == length
        assert set(episode.agent_episodes) == {"0", "1"}
        for agent in (0, 1):
            got = episode.agent_episodes[str(agent)]
            np.testing.assert_allclose(got.observations, np.stack(seen[agent]), rtol=1e-6)
            np.testing.assert_allclose(got.rewards, rewards[agent])
            assert got.is_terminated == terminated[agent] and not got.is_truncated
            assert got.module_id == "default_policy"
        assert episode.get_return() == sum(sum(r) for r in rewards.values())
        # An agent done early has no steps after its end; the other keeps going.
        lengths = sorted(len(episode.agent_episodes[str(a)]) for a in (0, 1))
        assert lengths[-1] == length
    metrics = cartpole.get_metrics()
    returns = sorted(e.get_return() for e in batch)
    assert metrics["num_episodes"] == 3
    assert metrics["episode_return_max"] == returns[-1]
    assert set(metrics["agent_episode_return_mean"]) == {"0", "1"}
    assert set(metrics["num_module_steps_sampled"]) == {"default_policy"}


def test_multi_cartpole_cuts_continue_across_calls(cartpole):
    batches = [cartpole.sample(num_timesteps=2, force_reset=True)]
    batches += [cartpole.sample(num_timesteps=16) for _ in range(6)]
    assert all(b.env_steps >= 16 for b in batches[1:])
    by_id, finished = whole_episodes(batches)
    assert finished, "no episode finished in 98 env steps"
    for episode_id in finished:
        episode = by_id[episode_id]
        episode.validate()
        seen, rewards, _, length = replay(episode, {"num_agents": 2})
        assert len(episode) == length
        for agent in (0, 1):
            np.testing.assert_allclose(episode.agent_episodes[str(agent)].observations,
                                       np.stack(seen[agent]), rtol=1e-6)
    # A cut chunk's successor starts where it stopped, with the agent steps before it.
    for first, second in zip(batches, batches[1:]):
        ongoing = {e.id_: e for e in first if not e.is_done}
        for chunk in second:
            if chunk.id_ in ongoing:
                assert chunk.env_t_started == ongoing[chunk.id_].env_t
                for agent, agent_chunk in chunk.agent_episodes.items():
                    before = ongoing[chunk.id_].agent_episodes.get(agent)
                    if before is not None:
                        np.testing.assert_allclose(agent_chunk.observations[0],
                                                   before.observations[-1])
                        assert agent_chunk.t_started == before.t


def test_state_round_trip_and_carry_refused(cartpole):
    state = cartpole.get_state()
    assert set(state) >= {"rl_module", "num_env_steps_sampled_lifetime"}
    assert "env_runner_carry" not in cartpole.get_state(components="all")
    with pytest.raises(ValueError, match="host multi-agent env"):
        cartpole.get_state(components="env_runner_carry")
    changed = jax_map(lambda x: x + 1.0, state["rl_module"])
    cartpole.set_state({"rl_module": changed, "num_env_steps_sampled_lifetime": 7})
    got = cartpole.get_state()
    assert got["num_env_steps_sampled_lifetime"] == 7
    for a, b in zip(jax_leaves(changed), jax_leaves(got["rl_module"])):
        np.testing.assert_allclose(a, b)
    cartpole.set_state(state)
    assert cartpole.sample(num_timesteps=4).env_steps >= 4


@pytest.mark.slow
def test_state_moves_weights_between_runners(cartpole):
    other = MultiAgentEnvRunner(config=cartpole_config().debugging(seed=5))
    try:
        state = cartpole.get_state()
        other.set_state(state)
        for module_id, weights in state["rl_module"].items():
            got = other.get_state()["rl_module"][module_id]
            for a, b in zip(jax_leaves(weights), jax_leaves(got)):
                np.testing.assert_array_equal(a, b)
    finally:
        other.stop()


def jax_leaves(tree):
    import jax

    return jax.tree.leaves(tree)


def jax_map(fn, tree):
    import jax

    return jax.tree.map(fn, tree)


# ---------------------------------------------------------------------- same as compiled
class NumpyRelay(MultiAgentEnv):
    """tests/multi_agent_helpers.Relay written for the host: the same dynamics in numpy,
    observations only for the agents that act next (and final ones for agents that
    end)."""

    def __init__(self, config=None):
        super().__init__()
        self.horizon = int((config or {}).get("horizon", 7))
        self.possible_agents = ["a", "b", "c"]
        box = gym.spaces.Box(-10.0, 1000.0, (3,), np.float32)
        self.observation_spaces = {a: box for a in self.possible_agents}
        self.action_spaces = {a: gym.spaces.Discrete(3) for a in self.possible_agents}

    def _to_act(self):
        phase = self.t % 3
        return {"a": phase in (0, 2), "b": phase == 0 or (phase == 1 and self.c_done),
                "c": phase == 1 and not self.c_done}

    def _obs(self, agents):
        t = np.float32(self.t) / np.float32(10.0)
        return {a: np.array([t, np.float32(self.last[i]), np.float32(i)], np.float32)
                for i, a in enumerate(self.possible_agents) if a in agents}

    def reset(self, *, seed=None, options=None):
        self.t, self.last, self.c_done = 0, np.zeros(3, np.int64), False
        return self._obs([a for a, on in self._to_act().items() if on]), {}

    def step(self, action_dict):
        acting = self._to_act()
        assert set(action_dict) == {a for a, on in acting.items() if on}
        bonus = np.float32(self.last.sum())
        t = np.float32(self.t)
        rewards = {a: np.float32(0.1 * (i + 1)) + np.float32(0.01) * t
                   + np.float32(0.001) * bonus for i, a in enumerate(self.possible_agents)}
        for i, a in enumerate(self.possible_agents):
            if a in action_dict:
                self.last[i] = action_dict[a]
        c_ends = "c" in action_dict and action_dict["c"] == 0 and self.t >= 4
        self.t += 1
        self.c_done = self.c_done or c_ends
        truncated = self.t >= self.horizon
        to_act = self._to_act()
        with_obs = {a for a, on in to_act.items() if on} | ({"c"} if c_ends else set())
        if truncated:
            with_obs = set(self.possible_agents)
        terminateds = {"c": c_ends, "__all__": False}
        truncateds = {a: truncated for a in self.possible_agents}
        truncateds["__all__"] = truncated
        return self._obs(with_obs), rewards, terminateds, truncateds, {}


def relay_config(env, **env_runners):
    return (RunnerConfig().environment(env, env_config={"horizon": 7})
            .env_runners(**{"num_envs_per_env_runner": 2, "rollout_fragment_length": 5,
                            "episode_lookback_horizon": 1, **env_runners})
            .rl_module(model_config={"fcnet_hiddens": [8]})
            .multi_agent(policies={"shared"}, policy_mapping_fn=lambda aid, ep: "shared")
            .debugging(seed=2))


def assert_same_chunks(host_batch, compiled_batch):
    assert len(host_batch) == len(compiled_batch)
    for h, c in zip(host_batch, compiled_batch):
        assert (h.id_, h.env_t_started, len(h), h.is_terminated, h.is_truncated) == (
            c.id_, c.env_t_started, len(c), c.is_terminated, c.is_truncated)
        assert set(h.agent_episodes) == set(c.agent_episodes)
        for agent, he in h.agent_episodes.items():
            ce = c.agent_episodes[agent]
            np.testing.assert_allclose(he.observations, ce.observations, rtol=1e-6)
            np.testing.assert_array_equal(he.actions, ce.actions)
            np.testing.assert_allclose(he.rewards, ce.rewards, rtol=1e-6)
            assert (he.t_started, he.is_terminated, he.is_truncated) == (
                ce.t_started, ce.is_terminated, ce.is_truncated)
            np.testing.assert_allclose(he.lookback_observations, ce.lookback_observations,
                                       rtol=1e-6)
        for agent in h.possible_agents:
            np.testing.assert_array_equal(h.acted[agent], c.acted[agent])
            np.testing.assert_allclose(h.env_rewards[agent], c.env_rewards[agent],
                                       rtol=1e-6)


@pytest.mark.slow
def test_host_env_gives_the_compiled_runners_batches_and_metrics():
    host = MultiAgentEnvRunner(config=relay_config(NumpyRelay))
    compiled = MultiAgentEnvRunner(config=relay_config("HostTestRelayJax-v0"))
    try:
        for kwargs in ({"num_timesteps": 12, "random_actions": True},
                       {"num_timesteps": 12, "random_actions": True},
                       {"num_timesteps": 9}, {"num_episodes": 3, "random_actions": True}):
            assert_same_chunks(host.sample(**kwargs), compiled.sample(**kwargs))
        h, c = host.get_metrics(), compiled.get_metrics()
        for key in ("episode_return_mean", "episode_len_mean", "num_episodes",
                    "num_env_steps_sampled", "num_agent_steps_sampled",
                    "num_module_steps_sampled", "num_env_steps_discarded"):
            assert h[key] == pytest.approx(c[key]), key
        for agent in ("a", "b", "c"):
            assert h["agent_episode_return_mean"][agent] == pytest.approx(
                c["agent_episode_return_mean"][agent])
        assert set(h) == set(c)
        # count_steps_by="agent_steps" is the shell's loop: same sizes on both.
    finally:
        host.stop()
        compiled.stop()


# ---------------------------------------------------------------------- join and leave
class JoinLeave(MultiAgentEnv):
    """"stay" acts every step for 5 steps; "early" acts at steps 0-1 and is terminated at
    step 2 without a last observation (its previous one is duplicated, as RLlib does);
    "late" joins at step 2 (its rewards before that are not its own) and is done with
    `"__all__"` at step 5. Rewards are 1 (stay), 10 (early), 100 (late) at every step.
    Raises in `step` when `FAULTS["join_leave"]` is set, in `reset` when
    `FAULTS["join_leave_reset"]` is."""

    def __init__(self, config=None):
        super().__init__()
        self.possible_agents = ["stay", "early", "late"]
        space = gym.spaces.Box(-1.0, 100.0, (2,), np.float32)
        self.observation_spaces = {a: space for a in self.possible_agents}
        self.action_spaces = {a: gym.spaces.Discrete(2) for a in self.possible_agents}

    def _obs(self, agents):
        return {a: np.array([self.t, i], np.float32) for i, a in
                enumerate(self.possible_agents) if a in agents}

    def reset(self, *, seed=None, options=None):
        if FAULTS.pop("join_leave_reset", False):
            raise RuntimeError("simulated reset crash")
        self.t = 0
        return self._obs(["stay", "early"]), {}

    def step(self, action_dict):
        if FAULTS.pop("join_leave", False):
            raise RuntimeError("simulated crash")
        expected = {"stay"} | ({"early"} if self.t < 2 else set()) | (
            {"late"} if self.t >= 2 else set())
        assert set(action_dict) == expected, (self.t, action_dict)
        self.t += 1
        rewards = {"stay": 1.0, "early": 10.0, "late": 100.0}
        terminateds = {"early": self.t == 2, "__all__": self.t == 5}
        agents = ["stay"] + (["early"] if self.t < 2 else []) + (
            ["late"] if self.t >= 2 else [])
        return self._obs(agents), rewards, terminateds, {"__all__": False}, {}


@pytest.fixture(scope="module")
def join_leave():
    runner = MultiAgentEnvRunner(config=(
        RunnerConfig().environment(lambda ctx: JoinLeave(ctx))
        .env_runners(num_envs_per_env_runner=1, rollout_fragment_length=4)
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .fault_tolerance(restart_failed_sub_environments=False).debugging(seed=1)))
    yield runner
    runner.stop()


def test_agents_join_and_leave_mid_episode(join_leave):
    episodes = join_leave.sample(num_episodes=2)
    for episode in episodes:
        assert len(episode) == 5 and episode.is_terminated
        stay, early, late = (episode.agent_episodes[a] for a in ("stay", "early", "late"))
        assert (len(stay), len(early), len(late)) == (5, 2, 3)
        np.testing.assert_allclose(stay.rewards, [1.0] * 5)
        np.testing.assert_allclose(early.rewards, [10.0, 10.0])
        assert early.is_terminated and late.is_terminated
        # No last observation: the previous one is its final observation.
        np.testing.assert_allclose(early.observations[-1], early.observations[-2])
        np.testing.assert_allclose(late.observations[0], [2.0, 2.0])
        np.testing.assert_allclose(late.rewards, [100.0] * 3)
        assert episode.get_return() == 5 + 20 + 300
        assert episode.acted["late"].tolist() == [False, False, True, True, True]
    metrics = join_leave.get_metrics()
    assert metrics["agent_episode_return_mean"] == {"stay": 5.0, "early": 20.0,
                                                    "late": 300.0}
    assert metrics["num_agent_steps_sampled"] == {"stay": 10, "early": 4, "late": 6}


def test_failing_step_without_restart_raises_and_the_runner_recovers(join_leave):
    join_leave.sample(num_timesteps=2)
    with injected_faults({"join_leave": True}), pytest.raises(
            RuntimeError, match="restart_failed_sub_environments") as info:
        join_leave.sample(num_timesteps=4)
    assert "simulated crash" in str(info.value.__cause__)
    assert join_leave.get_metrics()["num_env_step_failures"] == 1
    batch = join_leave.sample(num_timesteps=4)  # a fresh env, fresh episodes
    assert batch.env_steps >= 4 and all(e.env_t_started == 0 for e in batch)


def test_failing_reset_without_restart_raises_and_the_runner_recovers(join_leave):
    join_leave.sample(num_timesteps=2)
    failures = join_leave.get_metrics()["num_env_step_failures"]
    with injected_faults({"join_leave_reset": True}), pytest.raises(
            RuntimeError, match="Resetting sub-env 0") as info:
        join_leave.sample(num_timesteps=2, force_reset=True)
    assert "restart_failed_sub_environments" in str(info.value)
    assert "simulated reset crash" in str(info.value.__cause__)
    assert join_leave.get_metrics()["num_env_step_failures"] == failures + 1
    batch = join_leave.sample(num_timesteps=4)  # a rebuilt env, fresh episodes
    assert batch.env_steps >= 4 and all(e.env_t_started == 0 for e in batch)


# ---------------------------------------------------------------------- faults (restart)
def test_failing_step_restarts_the_sub_env_and_discards_its_episode(cartpole):
    cartpole.sample(num_timesteps=4)
    cartpole.get_metrics()
    # Sub-env 1 raises at its 3rd step from now; it is rebuilt from the class.
    with injected_faults({1: 3}):
        batch = cartpole.sample(num_timesteps=24)
        assert 1 not in FAULTS
    metrics = cartpole.get_metrics()
    assert metrics["num_env_step_failures"] == 1
    assert metrics["num_env_steps_discarded"] > 0
    assert batch.env_steps >= 24  # topped up to the asked size
    assert sum(len(e) for e in batch) == batch.env_steps
    assert cartpole.sample(num_timesteps=8).env_steps >= 8  # and goes on


def test_failing_reset_is_retried_on_a_rebuilt_sub_env(cartpole):
    cartpole.sample(num_timesteps=4)
    failures = cartpole.get_metrics()["num_env_step_failures"]
    with injected_faults({("reset", 1): "once"}):
        batch = cartpole.sample(num_timesteps=8, force_reset=True)
        assert ("reset", 1) not in FAULTS
    assert cartpole.get_metrics()["num_env_step_failures"] == failures + 1
    assert batch.env_steps >= 8 and all(e.env_t_started == 0 for e in batch)
    # A reset that fails on every rebuilt env stops the call after the tolerance.
    with injected_faults({("reset", 1): "always"}), pytest.raises(
            RuntimeError, match="101 times in a row") as info:
        cartpole.sample(num_timesteps=8, force_reset=True)
    assert "num_consecutive_sub_env_failures_tolerance" in str(info.value)
    assert cartpole.get_metrics()["num_env_step_failures"] == failures + 1 + 101
    assert cartpole.sample(num_timesteps=8).env_steps >= 8  # rebuilt, and goes on


# ---------------------------------------------------------------------- PettingZoo
def _pettingzoo_runner(env):
    config = (RunnerConfig().environment(env)
              .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=4)
              .rl_module(model_config={"fcnet_hiddens": [8]}).debugging(seed=0))
    assert jaxrunner.runner_class_for(config) is MultiAgentEnvRunner
    return MultiAgentEnvRunner(config=config)


def _check_rock_paper_scissors(runner):
    assert runner.agent_ids == ("player_0", "player_1")
    batch = runner.sample(num_episodes=2)
    assert len(batch) == 2
    for episode in batch:
        # max_cycles ends the game for both players at once: truncated.
        assert len(episode) == 4 and episode.is_truncated and not episode.is_terminated
        for agent_episode in episode.agent_episodes.values():
            assert len(agent_episode) == 4 and agent_episode.is_truncated
        rewards = [episode.agent_episodes[p].rewards for p in runner.agent_ids]
        np.testing.assert_allclose(rewards[0], -rewards[1])  # zero-sum
    assert runner.get_metrics()["num_episodes"] == 2


def test_pettingzoo_parallel_env():
    rps = pytest.importorskip("pettingzoo.classic.rps_v2")
    runner = _pettingzoo_runner(rps.parallel_env(max_cycles=4))  # an instance, copied
    try:
        _check_rock_paper_scissors(runner)
    finally:
        runner.stop()


@pytest.mark.slow
def test_pettingzoo_aec_env_through_aec_to_parallel():
    rps = pytest.importorskip("pettingzoo.classic.rps_v2")
    runner = _pettingzoo_runner(lambda ctx: rps.env(max_cycles=4))
    try:
        _check_rock_paper_scissors(runner)
    finally:
        runner.stop()


# ---------------------------------------------------------------------- selection
def test_single_agent_runner_names_the_multi_agent_runner():
    jaxrunner.register_env("HostTestMultiCartPole-v0", lambda ctx: MultiCartPole(ctx))
    try:
        for env in (MultiCartPole, MultiCartPole({"num_agents": 2}),
                    "HostTestMultiCartPole-v0"):
            config = RunnerConfig().environment(env)
            assert jaxrunner.runner_class_for(config) is MultiAgentEnvRunner
            with pytest.raises(TypeError, match="MultiAgentEnvRunner"):
                SingleAgentEnvRunner(config=config)
    finally:
        unregister_env("HostTestMultiCartPole-v0")


# ---------------------------------------------------------------------- runner group
def rock_paper_scissors(ctx):
    from pettingzoo.classic import rps_v2

    return rps_v2.parallel_env(max_cycles=int(ctx.get("max_cycles", 4)))


@pytest.mark.slow
@pytest.mark.ray
def test_env_runner_group_with_a_host_multi_agent_env():
    pytest.importorskip("pettingzoo")
    import sys

    import ray
    import ray.cloudpickle

    import distributed_helpers as helpers
    from jaxrunner import EnvRunnerGroup
    from jaxrunner.distributed import init_ray

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    init_ray(num_cpus=2, include_dashboard=False)
    group = None
    try:
        config = (RunnerConfig().environment(rock_paper_scissors, env_config={"max_cycles": 4})
                  .env_runners(num_env_runners=1, num_envs_per_env_runner=2,
                               rollout_fragment_length=4)
                  .rl_module(model_config={"fcnet_hiddens": [8]}).debugging(seed=0))
        group = EnvRunnerGroup(config=config, actor_options=helpers.actor_options())
        batches = group.sample(num_episodes=2)
        episodes = [e for batch in batches for e in batch]
        assert len(episodes) == 2
        assert all(len(e) == 4 and e.is_truncated for e in episodes)
        metrics = group.get_metrics()
        assert metrics["num_episodes"] == 2
        assert set(metrics["agent_episode_return_mean"]) == {"player_0", "player_1"}
    finally:
        if group is not None:
            group.stop()
        ray.shutdown()
