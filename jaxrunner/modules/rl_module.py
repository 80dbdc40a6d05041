"""RLModules: pure Flax policies over an explicit params pytree.

An `RLModule` is stateless Python: `init(key)` returns its params, and the three forward
passes are pure functions of `(params, batch)`, so the rollout calls them inside
`lax.scan`. A batch is a dict with `"obs"` of shape `(B, *obs_shape)` (the observation
after the env-to-module connectors) and, for a recurrent module, `"state_in"` (a pytree
with leaves `(B, ...)`). The passes return a dict with `"action_dist_inputs"` `(B, D)`,
`"state_out"` for a recurrent module, and `"vf_preds"` `(B,)` from `forward_train` of a
full (not `inference_only`) module.

Three ways to write one:

* subclass `RLModule` and implement `init` and `_forward` (any JAX code);
* subclass `LinenRLModule` and return a `flax.linen` network from `make_network()`;
* subclass `NNXRLModule` and return a `flax.nnx` model from `make_model(rngs)`; it is
  split once into graph and state, and merged inside the compiled rollout.
"""

from __future__ import annotations

import abc
import dataclasses
import functools
import math
from typing import Any, Callable, Sequence

import flax.linen as nn
import gymnasium as gym
import jax
import jax.numpy as jnp

from jaxrunner import lowering
from jaxrunner.modules.distributions import distribution_for

DEFAULT_MODULE_ID = "default_policy"

_ACTIVATIONS = {
    "tanh": jnp.tanh, "relu": jax.nn.relu, "elu": jax.nn.elu, "swish": jax.nn.swish,
    "silu": jax.nn.silu, "gelu": jax.nn.gelu, "linear": None, None: None,
}


class RLModule(abc.ABC):
    """A policy (and optionally value) network with pure forward passes.

    Subclasses implement `init` and `_forward`. `action_dist_cls` defaults to the
    distribution for the action space (`Categorical`, `MultiCategorical`,
    `DiagGaussian`); set it in `__init__` to use another (e.g. `SquashedGaussian`).
    A recurrent module overrides `get_initial_state()` (one sub-env's state, no batch
    axis); the runner feeds `batch["state_in"]`, resets it at episode starts and carries
    `out["state_out"]` to the next step and across `sample()` calls.
    """

    def __init__(self, observation_space: gym.spaces.Space, action_space: gym.spaces.Space,
                 model_config: dict | None = None, inference_only: bool = False):
        self.observation_space = observation_space
        self.action_space = action_space
        self.model_config = dict(model_config or {})
        self.inference_only = inference_only
        self.action_dist_cls = distribution_for(action_space)

    @abc.abstractmethod
    def init(self, key: jax.Array) -> Any:
        """Returns freshly initialised params (a pytree of arrays)."""

    @abc.abstractmethod
    def _forward(self, params: Any, batch: dict[str, Any]) -> dict[str, Any]:
        """Returns at least `{"action_dist_inputs": (B, D)}`."""

    def forward_inference(self, params: Any, batch: dict[str, Any]) -> dict:
        """Acting without exploration (the runner takes the deterministic action)."""
        return self._forward(params, batch)

    def forward_exploration(self, params: Any, batch: dict[str, Any]) -> dict:
        """Acting with exploration (the runner samples from the distribution)."""
        return self._forward(params, batch)

    def forward_train(self, params: Any, batch: dict[str, Any]) -> dict:
        """Outputs a learner needs (subclasses add `vf_preds`)."""
        return self._forward(params, batch)

    def params_for_inference(self, params: Any) -> Any:
        """Keeps from `params` (possibly of a full module) what this module acts with."""
        return params

    def get_initial_state(self) -> Any:
        """Recurrent state of one sub-env at an episode start; `{}` if not recurrent."""
        return {}

    def is_stateful(self) -> bool:
        return bool(jax.tree.leaves(self.get_initial_state()))

    # Distribution helpers the rollout uses.
    def action_dist(self, inputs: jax.Array):
        """The action distribution for `action_dist_inputs` `(B, D)`."""
        cls = self.action_dist_cls
        if hasattr(cls, "for_space"):
            return cls.for_space(self.action_space)(inputs)
        return cls.from_inputs(inputs)

    @property
    def action_dist_input_dim(self) -> int:
        return int(self.action_dist_cls.required_input_dim(self.action_space))


def init_params(module: Any, key: jax.Array, *, fold_in: int | None = None) -> Any:
    """`module.init(key)` compiled as one program; with `fold_in`,
    `module.init(jax.random.fold_in(key, fold_in))` with the fold inside that program (an
    eager `fold_in` would compile a program of its own: 0.05-0.1 s on CPU).

    Run eagerly, every op of an initialiser (an orthogonal init's QR, each layer's
    matmul) compiles on its own: seconds for a small MLP on CPU, paid at every runner
    build. Modules whose `init` needs concrete values (Python control flow on arrays)
    are initialised eagerly instead.

    Under `jax.vmap` over keys (a population, `PPOLearner.fused_train(seeds=8)`) the
    members are initialised one after another (`sequential_vmap`), with the same values
    as one at a time: a batched orthogonal init is a batched LAPACK QR, and on CPU
    jaxlib's batched QR waits on XLA's intra-op thread pool from inside that pool, which
    deadlocks when every pool thread is in such a QR (a 2-core machine, several layers).
    The cost is a few milliseconds once per training run."""
    def init(k: jax.Array) -> Any:
        return module.init(k if fold_in is None else jax.random.fold_in(k, fold_in))

    try:
        return lowering.jit(jax.custom_batching.sequential_vmap(init))(key)
    except jax.errors.JAXTypeError:
        return init(key)


class Deferred:
    """A value built on its first read (`value`) from `build(*args)`, whose shapes are
    traced at once (`like`): nothing compiles until it is read, and a `build` that cannot
    run fails here, at construction. A `build` that needs concrete values (Python control
    flow on arrays, which no trace can follow: `init_params`' eager fallback) runs at once.

    Module params and a learner's state are built this way where a fused train may never
    read them (`jaxrunner.make_sampler`'s runner, `PPOLearner`)."""

    def __init__(self, build: Callable[..., Any], *args: Any):
        self._build: Callable[[], Any] | None = functools.partial(build, *args)
        self._value = None
        try:
            self._shapes = jax.eval_shape(build, *args)
        except jax.errors.JAXTypeError:
            self._shapes = None
            self._force()

    @classmethod
    def built(cls, value: Any) -> "Deferred":
        """A `Deferred` holding `value`, already built."""
        out = cls.__new__(cls)
        out._build, out._value, out._shapes = None, value, None
        return out

    def _force(self) -> None:
        build, self._build = self._build, None
        self._value = build()

    @property
    def value(self) -> Any:
        """The value, built now if it was not yet."""
        if self._build is not None:
            self._force()
        return self._value

    @property
    def like(self) -> Any:
        """The value if built, else its `jax.ShapeDtypeStruct` tree: for `eval_shape` and
        other traces that need only its shapes (reading this builds nothing)."""
        return self._value if self._build is None else self._shapes


def preprocess_observations(obs: jax.Array, space: gym.spaces.Space) -> jax.Array:
    """(B, *obs_shape) -> (B, F) float32: one-hot for Discrete, flatten for Box."""
    if isinstance(space, gym.spaces.Discrete):
        return jax.nn.one_hot(obs.astype(jnp.int32), int(space.n), dtype=jnp.float32)
    if isinstance(space, (gym.spaces.Dict, gym.spaces.Tuple)):
        raise ValueError(
            f"The default module takes array observations, not {type(space).__name__} "
            "spaces; keep the default env-to-module connectors (they flatten Dict and Tuple "
            "observations) or add jaxrunner.connectors.FlattenObservations."
        )
    batch = obs.shape[0]
    return obs.reshape(batch, -1).astype(jnp.float32)


def flat_dim(space: gym.spaces.Space) -> int:
    if isinstance(space, gym.spaces.Discrete):
        return int(space.n)
    return int(math.prod(space.shape))


class _MLP(nn.Module):
    hiddens: Sequence[int]
    activation: str | None
    out_dim: int
    out_scale: float = 0.01

    @nn.compact
    def __call__(self, x):
        act = _ACTIVATIONS[self.activation]
        for width in self.hiddens:
            x = nn.Dense(width, kernel_init=nn.initializers.orthogonal(math.sqrt(2)))(x)
            if act is not None:
                x = act(x)
        return nn.Dense(self.out_dim,
                        kernel_init=nn.initializers.orthogonal(self.out_scale))(x)


# Every `model_config` key `DefaultMLPModule` reads. With the default module, `RunnerConfig`
# rejects any other key: it would be ignored silently (a misspelt `fcnet_hidden` would build
# the default 256x256 net). A custom module receives whatever keys it is given.
DEFAULT_MLP_MODEL_CONFIG_KEYS = ("fcnet_hiddens", "fcnet_activation")


class DefaultMLPModule(RLModule):
    """RLlib's default PPO module layout: an MLP policy net and, unless `inference_only`,
    a separate MLP value net.

    `model_config`: `fcnet_hiddens` (default [256, 256]), `fcnet_activation` ("tanh").
    Params: `{"pi": ...}` (inference only) or `{"pi": ..., "vf": ...}`.
    """

    def __init__(self, observation_space, action_space, model_config=None,
                 inference_only=False):
        super().__init__(observation_space, action_space, model_config, inference_only)
        hiddens = tuple(self.model_config.get("fcnet_hiddens", (256, 256)))
        activation = self.model_config.get("fcnet_activation", "tanh")
        if isinstance(observation_space, (gym.spaces.Dict, gym.spaces.Tuple)):
            preprocess_observations(None, observation_space)  # raises the explanation
        self._obs_dim = flat_dim(observation_space)
        self._pi = _MLP(hiddens, activation, self.action_dist_input_dim, 0.01)
        self._vf = None if inference_only else _MLP(hiddens, activation, 1, 1.0)

    def init(self, key: jax.Array) -> Any:
        pi_key, vf_key = jax.random.split(key)
        dummy = jnp.zeros((1, self._obs_dim), jnp.float32)
        params = {"pi": self._pi.init(pi_key, dummy)["params"]}
        if self._vf is not None:
            params["vf"] = self._vf.init(vf_key, dummy)["params"]
        return params

    def _forward(self, params, batch):
        x = preprocess_observations(batch["obs"], self.observation_space)
        return {"action_dist_inputs": self._pi.apply({"params": params["pi"]}, x)}

    def forward_train(self, params, batch):
        out = self._forward(params, batch)
        if self._vf is not None and "vf" in params:
            x = preprocess_observations(batch["obs"], self.observation_space)
            out["vf_preds"] = self._vf.apply({"params": params["vf"]}, x)[..., 0]
        return out

    def params_for_inference(self, params):
        if self.inference_only:
            return {"pi": params["pi"]}
        return params


def _as_outputs(result: Any) -> dict[str, Any]:
    if isinstance(result, dict):
        return dict(result)
    return {"action_dist_inputs": result}


def _batched_initial_state(module: RLModule) -> Any:
    """`get_initial_state()` with a batch axis of 1 (for `init`)."""
    return jax.tree.map(lambda x: jnp.asarray(x)[None], module.get_initial_state())


def _recurrent_outputs(module: RLModule, result: Any) -> dict[str, Any]:
    """`(outputs, state_out)` from a recurrent network, as the module's output dict."""
    if not (isinstance(result, tuple) and len(result) == 2):
        raise TypeError(
            f"{type(module).__name__} is recurrent (get_initial_state() is not empty), so its "
            "network must return (outputs, state_out) from __call__(obs, state_in); got "
            f"{'an array' if hasattr(result, 'shape') else type(result).__name__}."
        )
    out = _as_outputs(result[0])
    out["state_out"] = result[1]
    return out


class LinenRLModule(RLModule):
    """A module around a `flax.linen` network.

    Subclasses implement `make_network()`, returning a linen module whose
    `__call__(obs)` (obs `(B, *obs_shape)`) returns the `action_dist_inputs` `(B, D)` or a
    dict with them (and optionally `"vf_preds"`). Params are the network's `"params"`.

    Recurrent: override `get_initial_state()` (one sub-env's state, no batch axis, e.g.
    `{"h": jnp.zeros((64,))}`); the network is then called as `__call__(obs, state_in)`
    (`state_in` leaves `(B, ...)`) and returns `(outputs, state_out)`. The runner resets
    the state at episode starts and carries it through the rollout and across `sample()`
    calls (`jaxrunner.modules.recurrent.GRUModule` is a complete example).
    """

    def __init__(self, observation_space, action_space, model_config=None,
                 inference_only=False):
        super().__init__(observation_space, action_space, model_config, inference_only)
        self.network = self.make_network()

    @abc.abstractmethod
    def make_network(self) -> nn.Module:
        """The linen network (built once)."""

    def _dummy_obs(self) -> jax.Array:
        return jnp.zeros((1,) + tuple(self.observation_space.shape),
                         self.observation_space.dtype)

    def init(self, key: jax.Array) -> Any:
        if self.is_stateful():
            return self.network.init(key, self._dummy_obs(),
                                     _batched_initial_state(self))["params"]
        return self.network.init(key, self._dummy_obs())["params"]

    def _forward(self, params, batch):
        if self.is_stateful():
            out = _recurrent_outputs(self, self.network.apply(
                {"params": params}, batch["obs"], batch["state_in"]))
        else:
            out = _as_outputs(self.network.apply({"params": params}, batch["obs"]))
        if self.inference_only:
            out.pop("vf_preds", None)
        return out


class NNXRLModule(RLModule):
    """A module around a `flax.nnx` model, split once into graph and params.

    Subclasses implement `make_model(rngs)`, returning an `nnx.Module` whose
    `__call__(obs)` returns the `action_dist_inputs` `(B, D)` or a dict with them. The
    model is split once with `nnx.split`; params are `nnx.to_pure_dict(state)` (a plain
    nested dict of arrays); each forward pass merges graph and params inside the compiled
    rollout, so no Python graph traversal happens per step.

    Recurrent: as for `LinenRLModule`, override `get_initial_state()`; the model is then
    called as `__call__(obs, state_in)` and returns `(outputs, state_out)`.
    """

    def __init__(self, observation_space, action_space, model_config=None,
                 inference_only=False):
        super().__init__(observation_space, action_space, model_config, inference_only)
        from flax import nnx

        self._nnx = nnx
        model = self.make_model(nnx.Rngs(0))
        self._graphdef, state = nnx.split(model)
        self._abstract_state = jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)

    @abc.abstractmethod
    def make_model(self, rngs) -> Any:
        """The nnx model (built once per `init`)."""

    def init(self, key: jax.Array) -> Any:
        seed = jax.random.randint(key, (), 0, 2**31 - 1)
        model = self.make_model(self._nnx.Rngs(int(seed)))
        _, state = self._nnx.split(model)
        return self._nnx.to_pure_dict(state)

    def _merge(self, params: Any):
        state = jax.tree.map(lambda x: x, self._abstract_state)
        self._nnx.replace_by_pure_dict(state, params)
        return self._nnx.merge(self._graphdef, state)

    def _forward(self, params, batch):
        model = self._merge(params)
        if self.is_stateful():
            out = _recurrent_outputs(self, model(batch["obs"], batch["state_in"]))
        else:
            out = _as_outputs(model(batch["obs"]))
        if self.inference_only:
            out.pop("vf_preds", None)
        return out


@dataclasses.dataclass
class RLModuleSpec:
    """How to build an RLModule (RLlib's `RLModuleSpec`).

    Args:
        module_class: an `RLModule` subclass taking `(observation_space, action_space,
            model_config, inference_only)`. Defaults to `DefaultMLPModule`.
        observation_space, action_space: gymnasium spaces; filled from the env (after the
            env-to-module connectors) if None.
        model_config: passed to the module.
        inference_only: build only what acting needs (no value head).
    """

    module_class: type | None = None
    observation_space: gym.spaces.Space | None = None
    action_space: gym.spaces.Space | None = None
    model_config: dict | None = None
    inference_only: bool = False

    def build(self) -> RLModule:
        if self.observation_space is None or self.action_space is None:
            raise ValueError(
                "RLModuleSpec.build() needs observation_space and action_space; the runner "
                "fills them from the env, or set them yourself."
            )
        module_class = self.module_class or DefaultMLPModule
        if not (isinstance(module_class, type) and issubclass(module_class, RLModule)):
            raise TypeError(
                f"RLModuleSpec.module_class must be a subclass of jaxrunner.RLModule "
                f"(e.g. LinenRLModule or NNXRLModule), got {module_class!r}."
            )
        return module_class(self.observation_space, self.action_space,
                            dict(self.model_config or {}), self.inference_only)
