"""The small pure-JAX env suites (Navix, Jumanji, XLand-MiniGrid, pgx), envs with gymnax's
pre-1.0 step API, and duck-typed spaces, adapted to the env protocol.

Each suite's adapter is stepped beside that suite's own loop (its own reset/step, episode
ends read as the suite documents them, same keys and actions) for a few hundred steps that
include both kinds of episode end; then a small `SingleAgentEnvRunner` samples it, by name
or by object. Craftax and Brax/Playground are in their own files (they compile for minutes).
"""

from __future__ import annotations

from types import SimpleNamespace

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from gymnax.environments import spaces as gx

import jaxrunner
from jaxrunner.envs import adapters
from jaxrunner.envs.multi_agent import MultiAgentEnv
from jaxrunner.envs.registry import make_jax_env
from jaxrunner.envs.spaces import MultiDiscrete, action_dtype, to_gymnasium, to_gymnax

from env_suite_helpers import (Reference, assert_tree_equal, run_beside_reference, smoke_sample,
                               uniform_choice)

pytestmark = pytest.mark.usefixtures("fast_compiles")


# ---------------------------------------------------------------------- duck-typed spaces
def test_to_gymnax__reads_spaces_by_their_attributes():
    discrete = SimpleNamespace(n=5, shape=())
    box = SimpleNamespace(low=-2.0, high=3.0, shape=(2, 3), dtype=np.float32)
    grid = SimpleNamespace(n=9, shape=(4, 4), dtype=np.uint8)  # Navix's categorical grid
    bounded = SimpleNamespace(minimum=0, maximum=7, shape=(3,), dtype=np.int32)
    dm_discrete = SimpleNamespace(num_values=4, shape=(), dtype=np.int32)
    dm_multi = SimpleNamespace(num_values=np.array([3, 2]), shape=(2,), dtype=np.int32)
    structured = SimpleNamespace(spaces={"a": discrete, "b": box})

    assert isinstance(to_gymnax(discrete), gx.Discrete) and to_gymnax(discrete).n == 5
    b = to_gymnax(box)
    assert isinstance(b, gx.Box) and b.shape == (2, 3) and np.all(np.asarray(b.high) == 3.0)
    g = to_gymnax(grid)
    assert isinstance(g, gx.Box) and np.all(np.asarray(g.high) == 8) and g.dtype == np.uint8
    assert np.all(np.asarray(to_gymnax(bounded).high) == 7)
    assert to_gymnax(dm_discrete).n == 4
    assert to_gymnax(dm_multi).nvec.tolist() == [3, 2]
    d = to_gymnasium(structured)
    assert set(d.spaces) == {"a", "b"} and d["a"].n == 5 and d["b"].shape == (2, 3)
    assert action_dtype(discrete) == jnp.int32 and action_dtype(box) == jnp.float32


def test_to_gymnax__unknown_object__says_which_attributes_it_needs():
    with pytest.raises(TypeError, match=r"`n` \(discrete\), `low`/`high`/`shape`/`dtype`"):
        to_gymnax(object(), what="observation space")


def test_multi_discrete__samples_in_range_and_converts():
    space = MultiDiscrete([3, 5])
    samples = jax.vmap(space.sample)(jax.random.split(jax.random.key(0), 200))
    assert samples.shape == (200, 2) and samples.dtype == jnp.int32
    assert samples[:, 0].max() == 2 and samples[:, 1].max() == 4 and samples.min() == 0
    assert bool(space.contains(jnp.array([2, 4]))) and not bool(space.contains(jnp.array([3,
                                                                                           0])))
    assert to_gymnasium(space).nvec.tolist() == [3, 5]
    with pytest.raises(ValueError, match="every count >= 1"):
        MultiDiscrete([2, 0])


# ---------------------------------------------------------------------- pre-1.0 gymnax API
@struct.dataclass
class WalkState:
    pos: jax.Array
    time: jax.Array


@struct.dataclass
class WalkParams:
    max_steps_in_episode: int = 6
    goal: int = 3


class LegacyWalk:
    """A third-party gymnax-style env on its own base class, with gymnax's pre-1.0 API:
    `step` auto-resets and returns `(obs, state, reward, done, info)`, `done` includes the
    time limit, and its spaces are plain objects with gymnax's attributes.

    The walker starts at a random position in [-2, 2]; action 1 steps right, 0 left;
    reaching `goal` ends the episode (reward 1)."""

    @property
    def default_params(self):
        return WalkParams()

    def reset_env(self, key, params):
        pos = jax.random.randint(key, (), -2, 3)
        state = WalkState(pos=pos, time=jnp.zeros((), jnp.int32))
        return self._obs(state), state

    def step_env(self, key, state, action, params):
        del key
        pos = state.pos + jnp.where(action == 1, 1, -1)
        state = WalkState(pos=pos, time=state.time + 1)
        at_goal = pos >= params.goal
        done = at_goal | (state.time >= params.max_steps_in_episode)
        return self._obs(state), state, at_goal.astype(jnp.float32), done, {"pos": pos}

    def reset(self, key, params=None):
        return self.reset_env(key, params or self.default_params)

    def step(self, key, state, action, params=None):
        params = params or self.default_params
        key_step, key_reset = jax.random.split(key)
        obs, state_st, reward, done, info = self.step_env(key_step, state, action, params)
        obs_re, state_re = self.reset_env(key_reset, params)
        state = jax.tree.map(lambda a, b: jnp.where(done, a, b), state_re, state_st)
        return jnp.where(done, obs_re, obs), state, reward, done, info

    def _obs(self, state):
        return jnp.stack([state.pos, state.time]).astype(jnp.float32)

    def observation_space(self, params):
        return SimpleNamespace(low=-100.0, high=100.0, shape=(2,), dtype=jnp.float32)

    def action_space(self, params):
        return SimpleNamespace(n=2, shape=(), dtype=jnp.int32)


def test_legacy_step_api__adapted_with_time_limit_as_truncation():
    env, params, name = make_jax_env(LegacyWalk(), jaxrunner.EnvContext())
    assert isinstance(env, adapters.SuiteAdapter) and name == "gymnax-legacy/LegacyWalk"
    assert isinstance(env.action_space(params), gx.Discrete)
    step = jax.jit(env.step)
    # Always right from the reset position: the goal (terminated) unless time runs out.
    obs, state = env.reset(jax.random.key(1), params)
    ends, starts = [], {float(obs[0])}
    for t in range(40):
        action = jnp.int32(1 if t % 12 < 8 else 0)
        before = state
        obs, state, reward, terminated, truncated, info = step(jax.random.key(t), state,
                                                               action, params)
        final = np.asarray(info["final_observation"])
        assert final[1] == before.inner.time + 1  # the pre-reset observation
        if terminated or truncated:
            ends.append((bool(terminated), bool(truncated), float(reward)))
            assert final[0] >= 3 if terminated else final[1] == 6
            assert float(obs[1]) == 0.0  # a fresh episode
            starts.add(float(obs[0]))
    assert (True, False, 1.0) in ends and (False, True, 0.0) in ends
    assert not any(te and tr for te, tr, _ in ends)
    assert len(starts) > 1  # resets are random, drawn per episode


def test_legacy_step_api__without_step_env__is_a_clear_error():
    class AutoResetOnly:
        def reset(self, key, params=None):
            return jnp.zeros(1), jnp.zeros(())

        def step(self, key, state, action, params=None):
            return jnp.zeros(1), state, 0.0, False, {}

    from jaxrunner.envs.adapters.gymnax_legacy import LegacyGymnaxEnv

    with pytest.raises(TypeError, match="step_env.*reset_env"):
        LegacyGymnaxEnv(AutoResetOnly())


def test_legacy_step_api__runner_samples_it():
    runner, episodes, metrics = smoke_sample(lambda ctx: LegacyWalk(), num_timesteps=40)
    done = [e for e in episodes if e.is_done]
    assert done and all(len(e) <= 6 for e in done)
    assert metrics["num_episodes"] >= 1
    assert runner.action_space == gym.spaces.Discrete(2)


# ---------------------------------------------------------------------- suite registry
def test_prefixed_name__unknown_id__names_close_matches():
    pytest.importorskip("navix")
    with pytest.raises(ValueError, match="navix/Navix-Empty-5x5-v0"):
        make_jax_env("navix/Navix-Empty-5x5", jaxrunner.EnvContext())


def test_suite_report__lists_every_suite_and_kinetix_reason():
    rows = {r["prefix"]: r for r in adapters.suite_report()}
    assert set(rows) == {"brax", "playground", "craftax", "jumanji", "navix", "xminigrid",
                         "pgx", "kinetix"}
    assert not rows["kinetix"]["supported"] and "jax<=0.9.0" in rows["kinetix"]["install_hint"]
    assert "jaxrunner[navix]" in rows["navix"]["install_hint"]


def test_kinetix_name__clear_error_naming_the_jax_pin():
    """`"kinetix/..."` fails early, by name and through a runner, saying why (every
    kinetix-env release pins an older jax) rather than "unknown env"."""
    with pytest.raises(ValueError, match=r"kinetix-env .*jax<=0\.9\.0.*jax 0\.10"):
        make_jax_env("kinetix/l/h0_unicycle", jaxrunner.EnvContext())
    config = jaxrunner.RunnerConfig().environment("kinetix/l/h0_unicycle")
    with pytest.raises(ValueError, match=r"'kinetix/\.\.\.' envs are not supported"):
        jaxrunner.SingleAgentEnvRunner(config=config)


# ---------------------------------------------------------------------- Navix
class NavixReference(Reference):
    def __init__(self, env):
        self.env = env

    def reset(self, key):
        timestep = self.env.reset(key)
        return timestep, timestep.observation

    def step(self, timestep, action, key):
        timestep = self.env.step(timestep, action)
        return (timestep, timestep.observation, timestep.reward, timestep.is_termination(),
                timestep.is_truncation())


def test_navix__matches_its_own_loop():
    navix = pytest.importorskip("navix")
    env, params = adapters.make_suite_env("navix/Navix-Empty-5x5-v0", {"max_steps": 12})
    assert env.action_space(params).n == 7 and env.observation_space(params).shape == (5, 5, 3)
    reference = NavixReference(navix.make("Navix-Empty-5x5-v0", max_steps=12))
    choose = uniform_choice(3, seed=1)  # turn left, turn right, forward
    ends = run_beside_reference(env, params, reference, choose, steps=240)
    assert any(te for _, te, _ in ends) and any(tr for _, _, tr in ends)


def test_navix__step_traces_no_navix_reset():
    """The adapter steps with Navix's transition: Navix's own `step` wraps it in a
    `lax.cond` with a reset, which `vmap` would compute at every vector step besides
    gymnax's own reset."""
    pytest.importorskip("navix")
    env, params = adapters.make_suite_env("navix/Navix-Empty-5x5-v0", {})
    obs, state = env.reset(jax.random.key(0), params)
    traced = []
    original_reset = env.inner.reset

    def counting_reset(*args, **kwargs):
        traced.append(True)
        return original_reset(*args, **kwargs)

    object.__setattr__(env.inner, "reset", counting_reset)
    try:
        jax.make_jaxpr(env.step_env)(jax.random.key(1), state, jnp.int32(2), params)
        assert not traced, "step_env traced Navix's reset (its auto-reset branch)"
        jax.make_jaxpr(env.reset_env)(jax.random.key(1), params)
        assert traced, "the counter is not on the env's reset"
    finally:
        object.__delattr__(env.inner, "reset")


def test_navix__fixed_map_resets_reuse_one_rendering_cache(monkeypatch):
    """A fixed base map's rendering cache is built once: the adapter's auto-resetting step
    traces no `RenderingCache.init` (it would rebuild it at every vector step), the cache
    is the one Navix's own reset builds, it is not carried in the state, and the resets are
    bit for bit Navix's own. A random map (DoorKey's wall) keeps rebuilding."""
    navix = pytest.importorskip("navix")
    from navix.rendering.cache import RenderingCache

    from jaxrunner.envs.adapters.navix import fixed_rendering_cache

    assert fixed_rendering_cache(navix.make("Navix-DoorKey-5x5-v0")) is None
    env, params = adapters.make_suite_env("navix/Navix-Empty-5x5-v0", {})
    own = navix.make("Navix-Empty-5x5-v0")
    for seed in range(3):
        obs, state = env.reset(jax.random.key(seed), params)
        expected = own.reset(jax.random.key(seed))
        assert_tree_equal(jax.random.key_data(state.inner.state.key),
                          jax.random.key_data(expected.state.key), "state key")
        for name, got, want in (("observation", obs, expected.observation),
                                ("grid", state.inner.state.grid, expected.state.grid),
                                ("cache", env.rendering_cache.patches,
                                 expected.state.cache.patches)):
            assert_tree_equal(np.asarray(got), np.asarray(want), f"reset {seed}: {name}")
        assert state.inner.state.cache is None, "the fixed cache is carried in the state"
    built = []
    original = RenderingCache.init.__func__
    monkeypatch.setattr(RenderingCache, "init",
                        classmethod(lambda cls, grid: built.append(1) or original(cls, grid)))
    jax.make_jaxpr(env.step)(jax.random.key(1), state, jnp.int32(2), params)
    assert not built, "the auto-resetting step rebuilds Navix's rendering cache"
    own.reset(jax.random.key(0))
    assert built, "the counter is not on RenderingCache.init"


def test_navix__runner_by_name_partial_autoreset():
    pytest.importorskip("navix")
    runner, episodes, metrics = smoke_sample("navix/Navix-Empty-5x5-v0", {"max_steps": 10},
                                             num_timesteps=40, autoreset_mode="partial")
    assert runner.observation_space.shape == (5, 5, 3)
    finished = [e for e in episodes if e.is_done]
    assert finished and all(len(e) <= 10 for e in finished)
    assert any(e.is_truncated for e in finished)
    assert metrics["num_episodes"] >= 1 and np.isfinite(metrics["episode_return_mean"])


# ---------------------------------------------------------------------- Jumanji
class JumanjiReference(Reference):
    """State: `(jumanji state, the last observation's action_mask)`."""

    def __init__(self, env):
        self.env = env

    def reset(self, key):
        state, timestep = self.env.reset(key)
        return (state, timestep.observation.action_mask), timestep.observation

    def step(self, state, action, key):
        del key
        state, timestep = self.env.step(state[0], action)
        last = timestep.last()
        return ((state, timestep.observation.action_mask), timestep.observation,
                timestep.reward, last & (timestep.discount == 0),
                last & (timestep.discount > 0))

    def mask(self, state):
        return state[1]


def test_jumanji_snake__matches_its_own_loop():
    jumanji = pytest.importorskip("jumanji")
    env, params = adapters.make_suite_env("jumanji/Snake-v1",
                                          {"num_rows": 6, "num_cols": 6, "time_limit": 8})
    space = env.observation_space(params)
    assert set(space.spaces) == {"grid", "step_count", "action_mask"}
    assert env.action_space(params).n == 4 and hasattr(env, "action_mask")
    reference = JumanjiReference(jumanji.make("Snake-v1", num_rows=6, num_cols=6,
                                              time_limit=8))
    ends = run_beside_reference(env, params, reference, uniform_choice(4, seed=2), steps=200)
    # Snake itself reports its time limit with discount 0 (a termination), and so does
    # the adapter; Corridor below checks Jumanji's truncation.
    assert len(ends) >= 5 and all(te for _, te, _ in ends)


def _corridor_env():
    """A Jumanji env of the test's own: walk right to cell 4 (termination) within 6 steps
    (else truncation, Jumanji's `truncation()`); left is illegal at cell 0."""
    import jumanji
    from jumanji import specs
    from jumanji.types import restart, termination, transition, truncation
    from typing import NamedTuple

    class Obs(NamedTuple):
        position: jax.Array  # () int32
        action_mask: jax.Array  # (3,) bool: left, stay, right

    @struct.dataclass
    class State:
        position: jax.Array
        step_count: jax.Array
        key: jax.Array

    class Corridor(jumanji.env.Environment):
        def _obs(self, state):
            mask = jnp.array([True, True, True]).at[0].set(state.position > 0)
            return Obs(position=state.position, action_mask=mask)

        def reset(self, key):
            key, start = jax.random.split(key)
            state = State(position=jax.random.randint(start, (), 0, 3),
                          step_count=jnp.zeros((), jnp.int32), key=key)
            return state, restart(self._obs(state))

        def step(self, state, action):
            position = jnp.clip(state.position + action - 1, 0, 4)
            state = State(position=position, step_count=state.step_count + 1, key=state.key)
            reward = (position == 4).astype(jnp.float32)
            obs = self._obs(state)
            timestep = jax.lax.cond(
                position == 4, lambda: termination(reward, obs),
                lambda: jax.lax.cond(state.step_count >= 6, lambda: truncation(reward, obs),
                                     lambda: transition(reward, obs)))
            return state, timestep

        @property
        def observation_spec(self):
            return specs.Spec(Obs, "ObservationSpec",
                              position=specs.BoundedArray((), jnp.int32, 0, 4, "position"),
                              action_mask=specs.BoundedArray((3,), bool, False, True,
                                                             "action_mask"))

        @property
        def action_spec(self):
            return specs.DiscreteArray(3, name="action")

    return Corridor()


def test_jumanji__termination_and_truncation_from_step_type_and_discount():
    pytest.importorskip("jumanji")
    corridor = _corridor_env()
    env, params, _ = make_jax_env(corridor, jaxrunner.EnvContext())
    assert isinstance(env, adapters.SuiteAdapter) and hasattr(env, "action_mask")
    ends = run_beside_reference(env, params, JumanjiReference(corridor),
                                uniform_choice(3, seed=5), steps=150)
    assert any(te for _, te, _ in ends) and any(tr for _, _, tr in ends)


def test_jumanji__auto_reset_wrapper_is_refused():
    jumanji = pytest.importorskip("jumanji")
    from jumanji.wrappers import AutoResetWrapper

    with pytest.raises(ValueError, match="give the bare env"):
        adapters.adapt(AutoResetWrapper(jumanji.make("Snake-v1")))


def test_pgx_two_player_game__single_agent_runner_names_the_multi_agent_runner():
    pytest.importorskip("pgx")
    config = jaxrunner.RunnerConfig().environment("pgx/tic_tac_toe")
    with pytest.raises(TypeError, match="MultiAgentEnvRunner"):
        jaxrunner.SingleAgentEnvRunner(config=config)


def test_jumanji__runner_by_object_with_dict_observations():
    jumanji = pytest.importorskip("jumanji")
    snake = jumanji.make("Snake-v1", num_rows=6, num_cols=6, time_limit=20)
    runner, episodes, metrics = smoke_sample(snake, num_timesteps=48)
    assert runner.env_name == "jumanji/Snake"
    assert set(runner.observation_space.spaces) == {"grid", "step_count", "action_mask"}
    assert any(e.is_done for e in episodes) and metrics["num_episodes"] >= 1


# ---------------------------------------------------------------------- XLand-MiniGrid
class XMiniGridReference(Reference):
    def __init__(self, env, params):
        self.env, self.params = env, params

    def reset(self, key):
        timestep = self.env.reset(self.params, key)
        return timestep, timestep.observation

    def step(self, timestep, action, key):
        del key
        timestep = self.env.step(self.params, timestep, action)
        last = timestep.last()
        return (timestep, timestep.observation, timestep.reward,
                last & (timestep.discount == 0), last & (timestep.discount > 0))


def test_xminigrid__matches_its_own_loop():
    xminigrid = pytest.importorskip("xminigrid")
    env, params = adapters.make_suite_env("xminigrid/MiniGrid-Empty-5x5", {"max_steps": 8})
    assert env.action_space(params).n == 6
    assert env.observation_space(params).shape == (7, 7, 2)
    inner, inner_params = xminigrid.make("MiniGrid-Empty-5x5", max_steps=8)
    reference = XMiniGridReference(inner, inner_params)
    # Mostly forward (action 0), sometimes a turn: reaches the goal in some episodes.
    rng = np.random.default_rng(3)
    choose = lambda t, mask: np.int32(rng.choice([0, 0, 1, 2]))  # noqa: E731
    ends = run_beside_reference(env, params, reference, choose, steps=200)
    assert any(te for _, te, _ in ends) and any(tr for _, _, tr in ends)


def test_xminigrid__runner_by_creator_returning_env_and_params():
    xminigrid = pytest.importorskip("xminigrid")

    def creator(context):
        return xminigrid.make("MiniGrid-Empty-5x5", max_steps=int(context["max_steps"]))

    runner, episodes, metrics = smoke_sample(creator, {"max_steps": 9}, num_timesteps=40)
    assert runner.env_params.max_steps == 9
    assert all(len(e) <= 9 for e in episodes if e.is_done)
    assert metrics["num_episodes"] >= 1


# ---------------------------------------------------------------------- pgx (one player)
class PgxReference(Reference):
    def __init__(self, env):
        self.env = env

    def reset(self, key):
        state = self.env.init(key)
        return state, state.observation

    def step(self, state, action, key):
        state = self.env.step(state, action, key)
        return state, state.observation, state.rewards[0], state.terminated, state.truncated

    def mask(self, state):
        return state.legal_action_mask


def test_pgx_2048__matches_its_own_loop_and_exposes_the_mask():
    pgx = pytest.importorskip("pgx")
    env, params = adapters.make_suite_env("pgx/2048", {})
    assert env.action_space(params).n == 4
    assert env.observation_space(params).dtype == jnp.bool_
    # Any action, legal or not (the mask is checked, not used): an illegal one ends the
    # game with pgx's penalty.
    rng = np.random.default_rng(4)
    choose = lambda t, mask: np.int32(rng.integers(4))  # noqa: E731
    ends = run_beside_reference(env, params, PgxReference(pgx.make("2048")), choose,
                                steps=150)
    assert len(ends) >= 2 and all(te and not tr for _, te, tr in ends)


def test_pgx_two_player_game__is_multi_agent():
    pytest.importorskip("pgx")
    env, params = adapters.make_suite_env("pgx/tic_tac_toe", {})
    from jaxrunner.envs.multi_agent import MultiAgentEnv

    assert isinstance(env, MultiAgentEnv) and env.agents == ("player_0", "player_1")


def test_pgx_2048__runner_by_name():
    pytest.importorskip("pgx")
    runner, episodes, metrics = smoke_sample("pgx/2048", num_timesteps=40)
    assert runner.observation_space.shape == (4, 4, 31)
    assert runner.env.action_mask is not None  # the mask the core's acting step reads
    assert metrics["num_env_steps_sampled"] >= 40


def test_jaxrunner_envs__lists_installed_suites_ids_and_says_what_is_missing(capsys):
    import json

    from jaxrunner.cli import main

    assert main(["envs", "--json"]) == 0
    out, err = capsys.readouterr()
    rows = {row["id"]: row for row in json.loads(out)}
    for row in adapters.suite_report():
        listed = [i for i in rows if i.startswith(row["prefix"] + "/")]
        if row["installed"] and row["supported"]:
            assert listed, row["prefix"]
        else:
            assert not listed and f"suite {row['prefix']}/ not listed" in err
    assert "jax<=0.9.0" in err  # Kinetix: why it is not there
    if "pgx/tic_tac_toe" in rows:
        assert rows["pgx/tic_tac_toe"]["kind"] == "multi_agent"
        assert rows["pgx/2048"]["kind"] == "single_agent"


def test_jumanji__multi_discrete_actions_through_the_runner():
    pytest.importorskip("jumanji")
    env, params = adapters.make_suite_env("jumanji/Minesweeper-v0", {})
    assert isinstance(env.action_space(params), MultiDiscrete)
    assert not hasattr(env, "action_mask")  # its (rows, cols) mask is not a flat one
    runner, episodes, metrics = smoke_sample(env, num_timesteps=32)
    assert runner.action_space == gym.spaces.MultiDiscrete([10, 10])
    actions = np.concatenate([np.asarray(e.actions) for e in episodes])
    assert actions.shape[1:] == (2,) and actions.min() >= 0 and actions.max() <= 9
    assert metrics["num_episodes"] >= 1


# ---------------------------------------------------------------------- by object = by name
def _suite_objects():
    """`(prefix, name, make_object)` for one env of every suite: the object as the suite's
    own constructor returns it (xminigrid: `(env, params)`)."""
    return [
        ("brax", "brax/inverted_pendulum",
         lambda: __import__("brax.envs").envs.get_environment("inverted_pendulum")),
        ("playground", "playground/CartpoleBalance",
         lambda: __import__("mujoco_playground").registry.load("CartpoleBalance")),
        ("craftax", "craftax/Craftax-Symbolic-v1",
         lambda: __import__("craftax.craftax_env").craftax_env.make_craftax_env_from_name(
             "Craftax-Symbolic-v1", auto_reset=True)),
        ("jumanji", "jumanji/Snake-v1", lambda: __import__("jumanji").make("Snake-v1")),
        ("navix", "navix/Navix-Empty-5x5-v0",
         lambda: __import__("navix").make("Navix-Empty-5x5-v0")),
        ("xminigrid", "xminigrid/MiniGrid-Empty-5x5",
         lambda: __import__("xminigrid").make("MiniGrid-Empty-5x5")),
        ("pgx", "pgx/2048", lambda: __import__("pgx").make("2048")),
        ("pgx", "pgx/tic_tac_toe", lambda: __import__("pgx").make("tic_tac_toe")),
    ]


def _space_summary(space):
    return (type(space).__name__, getattr(space, "n", None),
            tuple(getattr(space, "shape", None) or ()), str(getattr(space, "dtype", None)))


def _spaces_of(env, params):
    if isinstance(env, MultiAgentEnv):
        return {agent: (_space_summary(env.observation_space(agent)),
                        _space_summary(env.action_space(agent))) for agent in env.agents}
    obs = env.observation_space(params)
    if isinstance(obs, gx.Dict):
        return {k: _space_summary(v) for k, v in obs.spaces.items()}, _space_summary(
            env.action_space(params))
    return _space_summary(obs), _space_summary(env.action_space(params))


@pytest.mark.parametrize("prefix,name,make_object", _suite_objects(),
                         ids=[case[1] for case in _suite_objects()])
def test_every_suite__by_object_by_creator_and_by_name_give_the_same_adapted_env(
        prefix, name, make_object):
    pytest.importorskip(adapters.SUITES[prefix].package)
    by_name, name_params, _ = make_jax_env(name, jaxrunner.EnvContext())
    made = make_object()
    env_object = made[0] if isinstance(made, tuple) else made  # xminigrid: (env, params)
    by_object, object_params, _ = make_jax_env(env_object, jaxrunner.EnvContext())
    by_creator, creator_params, _ = make_jax_env(lambda ctx: made, jaxrunner.EnvContext())
    assert adapters.is_adapted(by_name) and by_name.suite == prefix
    for env, params in ((by_object, object_params), (by_creator, creator_params)):
        assert type(env) is type(by_name)
        assert _spaces_of(env, params) == _spaces_of(by_name, name_params)
