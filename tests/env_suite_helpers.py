"""Helpers for the env-suite tests: an adapter stepped beside the suite's own loop, and a
small `SingleAgentEnvRunner` smoke run."""

from __future__ import annotations

from typing import Any, Callable

import jax
import numpy as np

import jaxrunner


def host(tree: Any) -> Any:
    """The tree with NamedTuples as dicts and leaves as numpy arrays."""
    if hasattr(tree, "_asdict"):
        tree = tree._asdict()
    if isinstance(tree, dict):
        return {k: host(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [host(v) for v in tree]
    return np.asarray(tree)


def assert_tree_equal(a: Any, b: Any, what: str) -> None:
    a, b = host(a), host(b)
    if isinstance(a, dict) or isinstance(b, dict):
        assert isinstance(a, dict) and isinstance(b, dict) and set(a) == set(b), (
            f"{what}: keys {sorted(a) if isinstance(a, dict) else a} != "
            f"{sorted(b) if isinstance(b, dict) else b}")
        for k in a:
            assert_tree_equal(a[k], b[k], f"{what}[{k!r}]")
        return
    np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), rtol=1e-5,
                               atol=1e-5, err_msg=what)


class Reference:
    """The suite's own step loop for one env, written with the suite's API only.

    `reset(key) -> (suite_state, obs)`; `step(suite_state, action, key) -> (suite_state,
    obs, reward, terminated, truncated)` where the flags are read the way the suite
    documents them; `mask(suite_state)` the legal actions, or None.
    """

    def reset(self, key):
        raise NotImplementedError

    def step(self, state, action, key):
        raise NotImplementedError

    def mask(self, state):
        return None


def run_beside_reference(env, params, reference: Reference, choose: Callable, steps: int,
                         seed: int = 0) -> list[tuple[int, bool, bool]]:
    """Steps `env` (gymnax's auto-resetting `step`) and `reference` with the same keys and
    actions and asserts they agree at every step.

    gymnax's `Environment.step(key, ...)` splits `key` into the key of the transition and
    the key of the reset; the reference uses the same two keys, and resets itself (with its
    own `reset`) after every episode end. Checked at every step: reward, terminated,
    truncated, `info["final_observation"]` (the observation the suite returned), the next
    observation (a fresh reset's after an episode end), and the action mask when both
    have one.

    Args:
        choose: `choose(t, mask) -> action` (mask: the reference's legal actions or None).

    Returns:
        `(t, terminated, truncated)` of every episode end.
    """
    reset, step = jax.jit(env.reset), jax.jit(env.step)
    ref_reset, ref_step = jax.jit(reference.reset), jax.jit(reference.step)
    key = jax.random.key(seed)
    key, first = jax.random.split(key)
    obs, state = reset(first, params)
    ref_state, ref_obs = ref_reset(first)
    assert_tree_equal(obs, ref_obs, "reset observation")
    ends = []
    for t in range(steps):
        mask = reference.mask(ref_state)
        if mask is not None and hasattr(env, "action_mask"):
            np.testing.assert_array_equal(np.asarray(env.action_mask(state, params)),
                                          np.asarray(mask), err_msg=f"action mask, step {t}")
        action = choose(t, None if mask is None else np.asarray(mask))
        k = jax.random.fold_in(key, t)
        obs, state, reward, terminated, truncated, info = step(k, state, action, params)
        key_step, key_reset = jax.random.split(k)
        ref_state, ref_obs, ref_reward, ref_term, ref_trunc = ref_step(ref_state, action,
                                                                       key_step)
        ref_term, ref_trunc = bool(ref_term), bool(ref_trunc) and not bool(ref_term)
        where = f"step {t}"
        np.testing.assert_allclose(float(reward), float(ref_reward), rtol=1e-5, atol=1e-5,
                                   err_msg=f"reward, {where}")
        assert (bool(terminated), bool(truncated)) == (ref_term, ref_trunc), (
            f"{where}: adapter terminated/truncated {bool(terminated)}/{bool(truncated)}, "
            f"suite {ref_term}/{ref_trunc}")
        assert_tree_equal(info["final_observation"], ref_obs, f"final observation, {where}")
        if ref_term or ref_trunc:
            ends.append((t, ref_term, ref_trunc))
            ref_state, ref_obs = ref_reset(key_reset)
        assert_tree_equal(obs, ref_obs, f"observation, {where}")
    return ends


def uniform_choice(num_actions: int, seed: int = 0) -> Callable:
    """`choose(t, mask)`: a uniformly random action (a legal one when a mask is given)."""
    rng = np.random.default_rng(seed)

    def choose(t, mask):
        del t
        if mask is None:
            return np.int32(rng.integers(num_actions))
        return np.int32(rng.choice(np.flatnonzero(mask)))

    return choose


def smoke_sample(env, env_config: dict | None = None, *, num_envs: int = 2,
                 num_timesteps: int = 48, fragment: int = 16, **env_runners) -> tuple:
    """A small `SingleAgentEnvRunner` on `env`; returns `(runner, episodes, metrics)` after
    one `sample(num_timesteps=...)` with random-init module actions, checking the batch's
    size, finiteness and episode validity."""
    config = (jaxrunner.RunnerConfig()
              .environment(env, env_config=env_config or {})
              .env_runners(num_envs_per_env_runner=num_envs,
                           rollout_fragment_length=fragment, **env_runners)
              .rl_module(model_config={"fcnet_hiddens": [16]})
              .debugging(seed=0))
    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    batch = runner.sample(num_timesteps=num_timesteps)
    episodes = list(batch)
    steps = sum(len(e) for e in episodes)
    assert num_timesteps <= steps < num_timesteps + num_envs
    for episode in episodes:
        episode.validate()
        for leaf in jax.tree.leaves(host(episode.observations)):
            assert np.all(np.isfinite(np.asarray(leaf, np.float64)))
        assert np.all(np.isfinite(np.asarray(episode.rewards, np.float64)))
    return runner, episodes, runner.get_metrics()
