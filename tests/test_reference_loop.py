"""The compiled rollout equals a plain Python loop over the same env, keys and actions.

The reference steps one sub-env at a time with gymnax's `step_env`, `is_truncated` and
`reset_env` in plain Python (no scan, no vmap, auto-reset where an episode ended), derives
the keys the way the runner documents it (DESIGN.md "Construction", core/chunk.py,
core/autoreset.py: per-sub-env step keys only for an env whose step reads its key), and
takes the actions from the runner's batch, for an env whose step reads its key (Acrobot
draws its torque noise from it) and one whose step does not (CartPole). It must
reproduce the observations, rewards, terminated/truncated flags, final observations and
episode boundaries (ids, `t_started`, lengths) of every call.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxrunner

from conftest import make_config

pytestmark = pytest.mark.usefixtures("fast_compiles")

SEED, WORKER_INDEX, NUM_ENVS = 7, 1, 3


def _rounded(obs) -> tuple:
    return tuple(np.round(np.asarray(obs, np.float64), 4).ravel().tolist())


class ReferenceLoop:
    """RLlib-style bookkeeping over eager, one-env-at-a-time gymnax steps."""

    def __init__(self, env, params, seed: int, worker_index: int | None, num_envs: int,
                 step_keys: bool):
        self.env, self.params, self.num_envs = env, params, num_envs
        self.step_keys = step_keys  # whether the env's step reads its key
        base = jax.random.key(seed + (worker_index or 0))
        key = jax.random.fold_in(base, 2)  # the runner's initial-carry stream
        self.key, reset_key = jax.random.split(key)
        reset_keys = jax.random.split(reset_key, num_envs)
        self.obs, self.states = [], []
        for i in range(num_envs):
            obs, state = env.reset(reset_keys[i], params)
            self.obs.append(np.asarray(obs))
            self.states.append(state)
        self.episode_len = [0] * num_envs  # steps of the current episode so far

    def _auto_step(self, step_key, reset_key, state, action):
        """gymnax's auto-resetting step in plain Python, its two keys given."""
        obs, state, reward, terminated, info = self.env.step_env(step_key, state, action,
                                                                 self.params)
        truncated = self.env.is_truncated(state, self.params)
        info = {"final_observation": obs}
        if bool(terminated) or bool(truncated):
            obs, state = self.env.reset_env(reset_key, self.params)
        return obs, state, reward, terminated, truncated, info

    def run(self, actions: np.ndarray) -> dict:
        """Steps with `actions` `(T, B)`; returns the per-step records and the episodes."""
        steps = actions.shape[0]
        record = {name: [] for name in ("obs", "rewards", "terminated", "truncated",
                                        "final_obs")}
        # Episode chunks of this call: (t_started, length, terminated, truncated, return,
        # first observation).
        segments = []
        start = [(self.episode_len[i], 0, 0.0) for i in range(self.num_envs)]
        first_obs = list(self.obs)
        for t in range(steps):
            # The chunk's one key split per vector step: next key, acting key, then each
            # sub-env's step key (when the env's step reads one) and reset key (what
            # gymnax's step splits its key into). A step that reads no key gets the first
            # reset key, unread.
            per_env = 2 if self.step_keys else 1
            keys = jax.random.split(self.key, 2 + per_env * self.num_envs)
            self.key = keys[0]
            resets = 2 + (self.num_envs if self.step_keys else 0)
            row = {name: [] for name in record}
            for i in range(self.num_envs):
                row["obs"].append(self.obs[i])
                obs, state, reward, terminated, truncated, info = self._auto_step(
                    keys[2 + i] if self.step_keys else keys[2], keys[resets + i],
                    self.states[i], actions[t, i])
                terminated, truncated = bool(terminated), bool(truncated)
                row["rewards"].append(float(reward))
                row["terminated"].append(terminated)
                row["truncated"].append(truncated)
                row["final_obs"].append(np.asarray(info["final_observation"]))
                self.obs[i], self.states[i] = np.asarray(obs), state
                self.episode_len[i] += 1
                t_started, length, ret = start[i]
                start[i] = (t_started, length + 1, ret + float(reward))
                if terminated or truncated:
                    segments.append((t_started, length + 1, terminated, truncated,
                                     ret + float(reward), _rounded(first_obs[i])))
                    self.episode_len[i] = 0
                    start[i] = (0, 0, 0.0)
                    first_obs[i] = self.obs[i]
            for name in record:
                record[name].append(np.stack(row[name]) if name in ("obs", "final_obs")
                                    else np.asarray(row[name]))
        for i in range(self.num_envs):
            t_started, length, ret = start[i]
            if length:
                segments.append((t_started, length, False, False, ret,
                                 _rounded(first_obs[i])))
        out = {name: np.stack(values) for name, values in record.items()}
        out["segments"] = segments
        return out


@pytest.fixture(scope="module")
def runner():
    config = make_config(num_envs=NUM_ENVS, fragment=8, seed=SEED)
    return jaxrunner.SingleAgentEnvRunner(config=config, worker_index=WORKER_INDEX,
                                          num_workers=1)


# (env, env_config, whether its step reads its key): Acrobot draws torque noise from its
# step key; its episodes are cut to 9 steps so the calls cross episode boundaries. The
# two key schedules place the reset keys differently, so a runner that used the other
# schedule would start different episodes.
REFERENCE_ENVS = [("CartPole-v1", {}, False),
                  ("Acrobot-v1", {"max_steps_in_episode": 9}, True)]


@pytest.mark.parametrize("env_id,env_config,step_keys", REFERENCE_ENVS)
def test_reference_loop__reproduces_runner_steps_and_episodes(env_id, env_config, step_keys):
    from jaxrunner.envs.registry import make_gymnax_env

    env, params = make_gymnax_env(env_id, env_config)
    config = make_config(env_id, num_envs=NUM_ENVS, fragment=8, seed=SEED)
    config.environment(env_id, env_config=env_config)
    runner = jaxrunner.SingleAgentEnvRunner(config=config, worker_index=WORKER_INDEX,
                                            num_workers=1)
    reference = ReferenceLoop(env, params, SEED, WORKER_INDEX, NUM_ENVS, step_keys)
    boundaries = 0
    # Calls of 10, 7 and 20 vector steps: several chunks of 8, episodes cut across calls.
    for vector_steps in (10, 7, 20):
        batch = runner.sample(num_timesteps=vector_steps * NUM_ENVS)
        traj = jax.device_get(batch.trajectory())
        steps = int(traj.valid.sum())
        assert steps == vector_steps
        take = lambda x: np.asarray(x)[:steps]  # noqa: E731
        expected = reference.run(take(traj.actions))

        np.testing.assert_allclose(take(traj.obs), expected["obs"], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(take(traj.final_obs), expected["final_obs"], rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_array_equal(take(traj.rewards), expected["rewards"])
        np.testing.assert_array_equal(take(traj.terminated), expected["terminated"])
        np.testing.assert_array_equal(take(traj.truncated), expected["truncated"])

        # Episode boundaries of the host view: the same chunks (start, length, how they
        # ended, return, first observation) as the reference's.
        got = sorted((e.t_started, len(e), e.is_terminated, e.is_truncated, e.get_return(),
                      _rounded(e.observations[0])) for e in batch)
        assert got == sorted(expected["segments"])
        boundaries += sum(1 for s in expected["segments"] if s[2] or s[3])
    assert boundaries >= NUM_ENVS, "the calls should have crossed episode boundaries"


def test_reference_loop__logits_are_the_module_forward_pass(runner):
    """The recorded `action_dist_inputs` are the module's forward pass on the recorded
    observations, and `action_logp` the log-probability of the recorded action."""
    state = runner.get_state(components="rl_module")
    params = jax.tree.map(np.asarray, state["rl_module"])
    batch = runner.sample(num_timesteps=NUM_ENVS * 5)
    traj = jax.device_get(batch.trajectory())
    steps = int(traj.valid.sum())
    obs = np.asarray(traj.obs[:steps]).reshape(steps * NUM_ENVS, -1)
    logits = np.asarray(runner.module.forward_exploration(params, {"obs": obs})[
        "action_dist_inputs"], np.float64).reshape(steps, NUM_ENVS, -1)
    np.testing.assert_allclose(traj.extra_model_outputs["action_dist_inputs"][:steps],
                               logits, rtol=1e-4, atol=1e-5)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    actions = np.asarray(traj.actions[:steps]).astype(int)
    np.testing.assert_allclose(traj.extra_model_outputs["action_logp"][:steps],
                               np.take_along_axis(log_probs, actions[..., None], -1)[..., 0],
                               rtol=1e-4, atol=1e-5)
