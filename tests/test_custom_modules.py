"""User modules: Flax linen and NNX modules, recurrent state carried through the scan and
across cuts, inference-only builds, and errors."""

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jaxrunner as jr
from jaxrunner.modules.distributions import SquashedGaussian
from jaxrunner.modules.rl_module import LinenRLModule, NNXRLModule, RLModule
from jaxrunner.testing import TargetEnv


def _config(env="CartPole-v1", num_envs=3, fragment=6, spec=None, **runner_kwargs):
    config = (jr.RunnerConfig().environment(env)
              .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=fragment,
                           **runner_kwargs)
              .debugging(seed=0))
    if spec is not None:
        config.rl_module(rl_module_spec=spec)
    return config


class TwoLayerLinen(LinenRLModule):
    def make_network(self):
        out = self.action_dist_input_dim

        class Net(nn.Module):
            @nn.compact
            def __call__(self, obs):
                x = jnp.tanh(nn.Dense(16)(obs))
                return {"action_dist_inputs": nn.Dense(out)(x), "vf_preds": nn.Dense(1)(x)[:, 0]}

        return Net()


class TwoLayerNNX(NNXRLModule):
    def make_model(self, rngs):
        in_dim = int(np.prod(self.observation_space.shape))
        out = self.action_dist_input_dim

        class Model(nnx.Module):
            def __init__(self, rngs):
                self.hidden = nnx.Linear(in_dim, 16, rngs=rngs)
                self.head = nnx.Linear(16, out, rngs=rngs)

            def __call__(self, obs):
                return self.head(jnp.tanh(self.hidden(obs)))

        return Model(rngs)


def test_linen_module__samples_and_drops_value_head_when_inference_only():
    runner = jr.SingleAgentEnvRunner(config=_config(spec=jr.RLModuleSpec(TwoLayerLinen)))
    assert runner.module.inference_only
    batch = runner.sample(num_timesteps=30)
    for episode in batch:
        episode.validate()
    params = runner.get_state()["rl_module"]
    obs = np.asarray(batch[0].observations[:-1], np.float32)
    out = runner.module.forward_exploration(params, {"obs": jnp.asarray(obs)})
    assert set(out) == {"action_dist_inputs"}
    np.testing.assert_allclose(out["action_dist_inputs"],
                               batch[0].extra_model_outputs["action_dist_inputs"], rtol=1e-5,
                               atol=1e-6)


def test_nnx_module__samples_and_round_trips_weights():
    runner = jr.SingleAgentEnvRunner(config=_config(spec=jr.RLModuleSpec(TwoLayerNNX)))
    batch = runner.sample(num_timesteps=30, explore=False)
    state = runner.get_state()
    assert set(state["rl_module"]) == {"hidden", "head"}
    greedy = np.concatenate([e.actions for e in batch])
    logits = np.concatenate([e.extra_model_outputs["action_dist_inputs"] for e in batch])
    np.testing.assert_array_equal(greedy, logits.argmax(-1))
    # New weights (flipped head) change the greedy actions as the module says.
    flipped = jax.tree.map(np.array, state["rl_module"])
    flipped["head"]["kernel"] = -flipped["head"]["kernel"]
    flipped["head"]["bias"] = -flipped["head"]["bias"]
    runner.set_state({"rl_module": flipped, "weights_seq_no": 1})
    obs = jnp.asarray(np.asarray(batch[0].observations[:-1]))
    out = runner.module.forward_inference(flipped, {"obs": obs})["action_dist_inputs"]
    np.testing.assert_allclose(out, -batch[0].extra_model_outputs["action_dist_inputs"],
                               rtol=1e-5, atol=1e-6)
    assert runner.sample(num_timesteps=6).env_steps == 6


class GRUModule(RLModule):
    """A recurrent policy: GRU over observations, linear head. State: {"h": (8,)}."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.cell = nn.GRUCell(features=8)
        self.head = nn.Dense(self.action_dist_input_dim)

    def get_initial_state(self):
        return {"h": jnp.zeros((8,), jnp.float32)}

    def init(self, key):
        cell_key, head_key = jax.random.split(key)
        h = jnp.zeros((1, 8))
        cell = self.cell.init(cell_key, h, jnp.zeros((1, 4)))["params"]
        return {"cell": cell, "head": self.head.init(head_key, h)["params"]}

    def step(self, params, h, obs):
        h, _ = self.cell.apply({"params": params["cell"]}, h, obs)
        return h, self.head.apply({"params": params["head"]}, h)

    def _forward(self, params, batch):
        h, logits = self.step(params, batch["state_in"]["h"], batch["obs"])
        return {"action_dist_inputs": logits, "state_out": {"h": h}}


def test_recurrent_module__state_carried_across_cuts_and_reset_at_episode_start():
    runner = jr.SingleAgentEnvRunner(config=_config(num_envs=3, fragment=4,
                                                    spec=jr.RLModuleSpec(GRUModule)))
    assert runner.module.is_stateful()
    params = runner.get_state()["rl_module"]
    episodes: dict[str, jr.SingleAgentEpisode] = {}
    finished = []
    for _ in range(20):
        for chunk in runner.sample(num_timesteps=6):
            if chunk.id_ in episodes:
                episodes[chunk.id_].concat_episode(chunk)
            elif chunk.t_started == 0:
                episodes[chunk.id_] = chunk
            if chunk.is_done and chunk.id_ in episodes:
                finished.append(episodes.pop(chunk.id_))
    assert len(finished) >= 3
    checked_cut = False
    for episode in finished:
        h = jnp.zeros((1, 8))
        logits = []
        for obs in episode.observations[:-1]:
            h, out = runner.module.step(params, h, jnp.asarray(obs)[None])
            logits.append(np.asarray(out[0]))
        np.testing.assert_allclose(episode.extra_model_outputs["action_dist_inputs"],
                                   np.stack(logits), rtol=1e-4, atol=1e-5)
        assert episode.extra_model_outputs["state_out"]["h"].shape == (len(episode), 8)
        checked_cut |= len(episode) > 6
    assert checked_cut, "at least one checked episode spanned several sample() calls"


def test_squashed_gaussian_module__actions_in_unit_box_and_env_in_bounds():
    class Squashed(LinenRLModule):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.action_dist_cls = SquashedGaussian

        def make_network(self):
            return nn.Dense(2)

    runner = jr.SingleAgentEnvRunner(config=_config(TargetEnv(), num_envs=8,
                                                    spec=jr.RLModuleSpec(Squashed)))
    batch = runner.sample(num_timesteps=80)
    actions = np.concatenate([e.actions for e in batch])
    received = np.concatenate([e.observations[1:, 1] for e in batch])
    assert np.all(np.abs(actions) < 1.0)
    np.testing.assert_allclose(received, 2.0 * actions[:, 0], rtol=1e-5, atol=1e-6)


def test_inference_only_module_loads_full_module_weights():
    full = jr.RLModuleSpec(observation_space=gym.spaces.Box(-1, 1, (4,)),
                           action_space=gym.spaces.Discrete(2),
                           model_config={"fcnet_hiddens": [8]}).build()
    full_params = jax.device_get(full.init(jax.random.key(3)))
    assert set(full_params) == {"pi", "vf"}
    runner = jr.SingleAgentEnvRunner(config=_config().rl_module(
        model_config={"fcnet_hiddens": [8]}))
    runner.set_state({"rl_module": full_params, "weights_seq_no": 2})
    loaded = runner.get_state()["rl_module"]
    assert set(loaded) == {"pi"}
    jax.tree.map(np.testing.assert_array_equal, loaded["pi"], full_params["pi"])
    assert runner.weights_seq_no == 2


def test_module_with_unsupported_action_space_is_a_clear_error():
    class DictActionEnv(TargetEnv):
        def action_space(self, params=None):
            return gym.spaces.Dict({"a": gym.spaces.Discrete(2)})

    with pytest.raises((ValueError, TypeError), match="Discrete, MultiDiscrete"):
        jr.SingleAgentEnvRunner(config=_config(DictActionEnv()))


def test_module_class_that_is_not_an_rlmodule_is_a_clear_error():
    with pytest.raises(TypeError, match="subclass of jaxrunner.RLModule"):
        jr.SingleAgentEnvRunner(config=_config(spec=jr.RLModuleSpec(module_class=nn.Dense)))


# ---------------------------------------------------------------------- recurrent linen / nnx
def _check_recurrent_rollout(runner, step):
    """Samples across cuts and checks every finished episode's logits against a host loop
    that starts from the initial state and feeds `state_out` back: `step(params, state,
    obs (1, F)) -> (state, logits (1, D))`."""
    params = runner.get_state()["rl_module"]
    episodes, finished = {}, []
    for _ in range(40):
        for chunk in runner.sample(num_timesteps=6):
            if chunk.id_ in episodes:
                episodes[chunk.id_].concat_episode(chunk)
            elif chunk.t_started == 0:
                episodes[chunk.id_] = chunk
            if chunk.is_done and chunk.id_ in episodes:
                finished.append(episodes.pop(chunk.id_))
    assert len(finished) >= 3
    assert any(len(e) > 6 for e in finished), "an episode spanned several sample() calls"
    initial = jax.tree.map(lambda x: jnp.asarray(x)[None], runner.module.get_initial_state())
    for episode in finished:
        state, logits = initial, []
        for obs in episode.observations[:-1]:
            state, out = step(params, state, jnp.asarray(obs, jnp.float32)[None])
            logits.append(np.asarray(out[0]))
        np.testing.assert_allclose(episode.extra_model_outputs["action_dist_inputs"],
                                   np.stack(logits), rtol=1e-4, atol=1e-5)


def test_recurrent_linen_module__gru_example_carries_and_resets_state():
    from jaxrunner.modules import GRUModule

    spec = jr.RLModuleSpec(GRUModule, model_config={"gru_size": 8, "fcnet_hiddens": [8]})
    runner = jr.SingleAgentEnvRunner(config=_config(num_envs=3, fragment=4, spec=spec))
    module = runner.module
    assert module.is_stateful() and module.inference_only
    assert jax.tree.map(jnp.shape, module.get_initial_state()) == {"h": (8,)}

    def step(params, state, obs):
        out = module.forward_inference(params, {"obs": obs, "state_in": state})
        return out["state_out"], out["action_dist_inputs"]

    _check_recurrent_rollout(runner, step)
    # The full module (for a learner) adds the value head on the same GRU state.
    full = jr.RLModuleSpec(GRUModule, observation_space=module.observation_space,
                           action_space=module.action_space,
                           model_config={"gru_size": 8, "fcnet_hiddens": [8]}).build()
    params = full.init(jax.random.key(0))
    out = full.forward_train(params, {"obs": jnp.zeros((5, 4)),
                                      "state_in": {"h": jnp.zeros((5, 8))}})
    assert out["vf_preds"].shape == (5,) and out["state_out"]["h"].shape == (5, 8)


class CounterLinen(LinenRLModule):
    """A hand-written recurrent linen module: the state counts steps since the episode
    started, and the logits are (count, -count)."""

    def get_initial_state(self):
        return {"count": jnp.zeros((), jnp.float32)}

    def make_network(self):
        class Net(nn.Module):
            @nn.compact
            def __call__(self, obs, state_in):
                count = state_in["count"] + 1.0
                scale = self.param("scale", nn.initializers.ones, ())
                logits = scale * jnp.stack([count, -count], axis=-1)
                return logits, {"count": count}

        return Net()


class CounterNNX(NNXRLModule):
    """The same counter as an NNX model."""

    def get_initial_state(self):
        return {"count": jnp.zeros((), jnp.float32)}

    def make_model(self, rngs):
        class Model(nnx.Module):
            def __init__(self):
                self.scale = nnx.Param(jnp.ones(()))

            def __call__(self, obs, state_in):
                count = state_in["count"] + 1.0
                return self.scale * jnp.stack([count, -count], axis=-1), {"count": count}

        return Model()


@pytest.mark.parametrize("module_class", [CounterLinen, CounterNNX])
def test_recurrent_linen_and_nnx_modules__state_counts_steps_of_each_episode(module_class):
    runner = jr.SingleAgentEnvRunner(config=_config(num_envs=3, fragment=4,
                                                    spec=jr.RLModuleSpec(module_class)))
    assert runner.module.is_stateful()
    for _ in range(6):
        batch = runner.sample(num_timesteps=6)
        for episode in batch:
            counts = episode.extra_model_outputs["state_out"]["count"]
            # Steps t_started+1 .. t of the episode: reset at the start, carried over cuts.
            np.testing.assert_array_equal(
                counts, np.arange(episode.t_started + 1, episode.t + 1, dtype=np.float32))


def test_recurrent_linen_network_must_return_state():
    class Forgetful(CounterLinen):
        def make_network(self):
            class Net(nn.Module):
                @nn.compact
                def __call__(self, obs, state_in):
                    return nn.Dense(2)(obs)

            return Net()

    # The runner reports the module's TypeError in its module check (a ValueError).
    with pytest.raises((TypeError, ValueError), match=r"\(outputs, state_out\).*got an array"):
        jr.SingleAgentEnvRunner(config=_config(spec=jr.RLModuleSpec(Forgetful)))
