"""Auto-reset inside the vector step: a finished sub-env starts its next episode in the same
step (its final observation goes to `info["final_observation"]`), in one of two modes.

* "gymnax": the env's own auto-resetting `step()`: every sub-env computes a reset every
  step and the reset is selected where the episode ended.
* "partial": the step is taken without resets; then only `R = ceil(B / ratio)` resets are
  computed and written into the sub-envs that finished (found with a fixed-size
  `nonzero`). When more than `R` sub-envs finish in the same step, that step falls back to
  resetting all `B` and selecting, so every episode still starts from its own fresh reset
  drawn with a fresh key: no two episodes share a start state, and the start-state
  distribution is the env's `reset_env` distribution, as in "gymnax". Only the keys
  differ, so the two modes give different (equally distributed) draws.

The layout says how its env steps (`EnvStepFns`); this module is the same for a gymnax env
and a multi-agent env.

Keys: the vector step takes all its keys from the chunk's one split per step
(`VectorEnvStep.num_keys` of them), so no sub-env splits a key of its own. An env whose
auto-resetting step only splits its key into a step key and a reset key (gymnax's
`Environment.step`, jaxrunner's `MultiAgentEnv.step`) is stepped through
`EnvStepFns.auto_step_with_keys` with both keys from that split: the same transition
without `B` more key splits per step (on XLA:CPU every random-bits call is a loop of its
own, and a CartPole step at 16 sub-envs ran 12 % faster without them). An env whose step
without reset never reads its key (CartPole, Pendulum, most classic control:
`step_reads_key`, read from the step's jaxpr) gets no per-sub-env step keys at all: its
transition is given one shared key it ignores, and the split draws only the reset keys.
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
from jax.extend.core import Literal

from jaxrunner.core.dependence import (called_jaxpr, outputs_reading_first,
                                       primitives_only_for, reads_first_argument)
from jaxrunner.core.faults import select_rows

AUTORESET_MODES = ("gymnax", "partial")
# A reset is drawn in a kernel of its own ("auto") when at least this many of its output
# leaves read its key, holding at most this many bytes a sub-env together (see
# `reset_spreads_its_draw`).
SEPARATE_RESET_MIN_KEYED_LEAVES = 4
SEPARATE_RESET_MAX_KEYED_BYTES = 256
# The outputs of a step other than its next state, by the names `make_env_step`'s
# `separate_outputs` takes.
STEP_OUTPUTS = ("obs", "reward", "terminated", "truncated")
# Each of them is computed in a kernel of its own ("auto", see `step_outputs_to_separate`)
# when the work it needs beyond the next state's has one of these primitives.
TRANSCENDENTAL_PRIMITIVES = frozenset({
    "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "tanh", "asinh",
    "acosh", "atanh", "exp", "exp2", "expm1", "log", "log1p", "pow", "logistic", "erf",
    "erfc", "erf_inv", "lgamma", "digamma"})


class EnvStepFns(NamedTuple):
    """One sub-env's step functions (unbatched; `autoreset.make_env_step` vmaps them).

    `auto_step(key, state, action, params) -> (obs, state, reward, terminated, truncated,
    info)` resets in the step an episode ends. `step_no_reset` is the same transition
    without the reset (None: the env has no such split, "partial" is refused), `reset(key,
    params) -> (obs, state)`, and `episode_done(terminated, truncated) -> bool` says when
    the whole episode ended."""

    auto_step: Callable
    reset: Callable
    step_no_reset: Callable | None
    episode_done: Callable[[Any, Any], jax.Array]
    # (step_key, reset_key, state, action, params) -> auto_step's outputs: the same
    # transition with the two keys auto_step would split from its one key given from
    # outside; None when auto_step is the env's own (its key use unknown).
    auto_step_with_keys: Callable | None = None
    # auto_step_with_keys takes `reset_gate=` (see `separate_reset`): its reset goes
    # through `separate_reset(reset, reset_gate)` before it is selected.
    takes_reset_gate: bool = False
    # auto_step_with_keys takes `outputs_gate=` and `separated_outputs=` (names of
    # `STEP_OUTPUTS`): those outputs of its step without reset go through
    # `separate_reset(..., outputs_gate)` before anything reads them.
    takes_outputs_gate: bool = False


class VectorEnvStep(NamedTuple):
    """The vector step of `make_env_step`: `step(keys, states, actions, env_params) ->
    (obs, states, reward, terminated, truncated, info)` over the `B` sub-envs, with
    `keys` `(num_keys,)` typed keys (all the randomness of the step)."""

    num_keys: int
    step: Callable


def check_partial_autoreset_env(env: Any) -> None:
    """Raises ValueError unless `env` is a gymnax Environment using the base `step()`."""
    if not has_base_gymnax_step(env):
        raise ValueError(
            f"autoreset_mode='partial' needs a gymnax Environment subclass that keeps the base "
            f"class's step() (it calls step_env/reset_env/is_truncated itself); "
            f"{type(env).__name__} does not. Use autoreset_mode='gymnax' for this env."
        )


def step_reads_key(fns: EnvStepFns, key: jax.Array, states: Any, actions: Any,
                   env_params: Any) -> bool:
    """Whether the env's step without reset (`fns.step_no_reset`, the transition that
    "gymnax" mode's step key and "partial" mode's step keys go to) reads its key, from its
    jaxpr traced on one sub-env. `key` is a typed key; `states` and `actions` are batched
    over the `B` sub-envs (arrays, tracers or shape structs). True when unknown (no such
    step, or it cannot be traced alone)."""
    if fns.step_no_reset is None:
        return True

    def one_sub_env(tree):
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x)[1:], x.dtype), tree)

    return reads_first_argument(fns.step_no_reset, key, one_sub_env(states),
                                one_sub_env(actions), env_params)


def reset_spreads_its_draw(fns: EnvStepFns, key: jax.Array, env_params: Any) -> bool:
    """Whether one sub-env's reset (`fns.reset(key, env_params)`, traced) is worth
    drawing in a kernel of its own (`separate_reset`): at least
    `SEPARATE_RESET_MIN_KEYED_LEAVES` of its output leaves depend on its key (XLA:CPU
    otherwise computes the draw once in each of their fusions) and those leaves hold at
    most `SEPARATE_RESET_MAX_KEYED_BYTES` (separating writes and reads them once more every
    step). `key` is a typed key (array, tracer or shape struct). False when unknown.

    Measured with every reset separated (`benchmarks/results/separate_resets/`, two
    same-process runs): CartPole (5 leaves, 32 bytes) 1.01 / 1.08 against 0.83 / 0.89 of
    the bare scan at 4096 envs and 1.11 / 1.12 against 1.04 / 1.06 at 1024; multi-agent
    CartPole 1.27 / 1.31 against 1.23 / 1.17 at 1024; Pendulum (3 leaves) 1.01 / 1.11
    against 1.09 / 1.26 at 1024; Breakout-MinAtar (4 leaves, a 1,600-byte observation)
    0.91 / 0.88 against 0.98 / 0.99 at 1024."""
    keyed = outputs_reading_first(fns.reset, key, env_params)
    if keyed is None:
        return False
    size = sum(math.prod(aval.shape) * aval.dtype.itemsize for aval in keyed)  # keys: 8
    return len(keyed) >= SEPARATE_RESET_MIN_KEYED_LEAVES and (
        size <= SEPARATE_RESET_MAX_KEYED_BYTES)


def outputs_work(fns: EnvStepFns, key: jax.Array, states: Any, actions: Any,
                 env_params: Any) -> dict[str, set[str]] | None:
    """`{name: primitives}` for each of `STEP_OUTPUTS` of one sub-env's step without reset
    (`fns.step_no_reset`, traced on one sub-env of the batched `states` and `actions`):
    the primitives it needs that the next state does not
    (`core.dependence.primitives_only_for`); None when unknown."""
    if fns.step_no_reset is None:
        return None

    def one_sub_env(tree):
        return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jnp.shape(x)[1:], x.dtype), tree)

    args = (key, one_sub_env(states), one_sub_env(actions), env_params)
    work = {}
    for name, position in zip(STEP_OUTPUTS, (0, 2, 3, 4)):
        only = primitives_only_for(fns.step_no_reset, lambda out: out[position],
                                   lambda out: out[1], *args)
        if only is None:
            return None
        work[name] = only
    return work


def step_outputs_to_separate(fns: EnvStepFns, key: jax.Array, states: Any, actions: Any,
                             env_params: Any) -> tuple[str, ...]:
    """The outputs of each sub-env's step (names of `STEP_OUTPUTS`) that "gymnax" mode
    computes in a kernel of their own on CPU (`separate_reset`): those whose work beyond
    the next state's (`outputs_work`) has a transcendental function
    (`TRANSCENDENTAL_PRIMITIVES`): Pendulum's observation (cos/sin of the new angle);
    Acrobot's observation, reward and termination (cos/sin of the new angles); none of
    CartPole's or MountainCar's (the state's fields and compares) or Breakout-MinAtar's
    (a grid of compares and scatters). None when unknown.

    XLA:CPU fuses such an output into each of its readers (the auto-reset's select of the
    next observation, the final observation, the fault check, the record) and computes it
    again in each: Pendulum's cos/sin in five fusions a step at 4096 sub-envs, Acrobot's
    integration of the new angles inside the fault check's reduction. Computed apart, it
    is computed once and read from memory (a few bytes a sub-env). Outputs without such
    work and the next state stay with XLA: separating them too made Pendulum slower.
    Measured on the 2-core CPU with runners built several ways in one process
    (`benchmarks/separate_outputs.py`, `benchmarks/results/separate_outputs/`)."""
    work = outputs_work(fns, key, states, actions, env_params)
    if work is None:
        return ()
    return tuple(name for name in STEP_OUTPUTS if work[name] & TRANSCENDENTAL_PRIMITIVES)


def make_env_step(fns: EnvStepFns, num_envs: int, mode: str, partial_reset_ratio: int,
                  step_keys: bool = True, separate_resets: bool = False,
                  separate_outputs: tuple[str, ...] = (), separate_draws: bool = False
                  ) -> VectorEnvStep:
    """The `VectorEnvStep` over the `B` sub-envs, with auto-reset in the same step (see the
    module docstring for the two modes and the keys).

    Keys: "gymnax" takes `2 B` (each sub-env's step and reset key) with
    `fns.auto_step_with_keys`, else `B` (one per sub-env's `auto_step`); "partial" takes
    `B + R + 1` (the steps', the `R` resets' and one split into `B` reset keys when more
    than `R` sub-envs finish). `step_keys=False` (for an env whose step without reset does
    not read its key, `step_reads_key`) leaves out the `B` step keys of both modes ("gymnax"
    with `auto_step_with_keys` then takes `B`, "partial" `R + 1`): every sub-env's
    transition gets the step's first key, which it ignores.

    `separate_resets` (for "gymnax" with `fns.takes_reset_gate`): every sub-env's reset is
    computed in a kernel of its own on CPU (`separate_reset`), and with `separate_draws`
    so are its random draws (`separate_draws`); `separate_outputs` (for
    "gymnax" with `fns.takes_outputs_gate`; names of `STEP_OUTPUTS`): so are those
    outputs of every sub-env's step, before anything reads them (see
    `step_outputs_to_separate`)."""
    unknown = set(separate_outputs) - set(STEP_OUTPUTS)
    if unknown:
        raise ValueError(f"separate_outputs takes names of {STEP_OUTPUTS}, got {sorted(unknown)}.")
    if mode not in AUTORESET_MODES:
        raise ValueError(f"autoreset_mode must be one of {AUTORESET_MODES}, got {mode!r}.")
    if mode == "gymnax":
        if fns.auto_step_with_keys is None:
            return VectorEnvStep(num_envs, jax.vmap(fns.auto_step, in_axes=(0, 0, 0, None)))
        auto_step = fns.auto_step_with_keys
        outputs = tuple(separate_outputs) if fns.takes_outputs_gate else ()

        def gated(step_key, reset_key, state, action, params, gate):
            gates = {}
            if separate_resets and fns.takes_reset_gate:
                gates.update(reset_gate=gate, separate_reset_draws=separate_draws)
            if outputs:
                gates.update(outputs_gate=gate, separated_outputs=outputs)
            return auto_step(step_key, reset_key, state, action, params, **gates)
        # The gate is the same () bool for every sub-env (True, unknown to the compiler).
        if not step_keys:
            shared_key_step = jax.vmap(gated, in_axes=(None, 0, 0, 0, None, None))
            return VectorEnvStep(num_envs, lambda keys, states, actions, env_params:
                                 shared_key_step(keys[0], keys, states, actions, env_params,
                                                 always_true(keys[0])))
        step_with_keys = jax.vmap(gated, in_axes=(0, 0, 0, 0, None, None))
        return VectorEnvStep(2 * num_envs, lambda keys, states, actions, env_params:
                             step_with_keys(keys[:num_envs], keys[num_envs:], states,
                                            actions, env_params, always_true(keys[0])))
    if fns.step_no_reset is None:
        raise ValueError("autoreset_mode='partial' needs an env with a step without reset "
                         "(step_env) and reset_env; use autoreset_mode='gymnax' for this env.")
    resets_per_step = max(1, math.ceil(num_envs / partial_reset_ratio))
    step_no_reset = jax.vmap(fns.step_no_reset, in_axes=(0 if step_keys else None, 0, 0, None))
    reset = jax.vmap(fns.reset, in_axes=(0, None))
    episode_done = jax.vmap(fns.episode_done)
    first_reset_key = num_envs if step_keys else 0  # the reset keys follow the step keys

    def env_step(keys, states, actions, env_params):
        obs, states, reward, terminated, truncated, info = step_no_reset(
            keys[:num_envs] if step_keys else keys[0], states, actions, env_params)
        done = episode_done(terminated, truncated)

        def few(args):
            step_obs, step_states = args
            index = jnp.nonzero(done, size=resets_per_step, fill_value=num_envs)[0]
            new_obs, new_states = reset(keys[first_reset_key:first_reset_key + resets_per_step],
                                        env_params)
            put = lambda cur, new: cur.at[index].set(new, mode="drop")  # noqa: E731
            return (jax.tree.map(put, step_obs, new_obs),
                    jax.tree.map(put, step_states, new_states))

        def every(args):
            step_obs, step_states = args
            new_obs, new_states = reset(jax.random.split(keys[-1], num_envs), env_params)
            return select_rows(done, new_obs, step_obs), select_rows(done, new_states,
                                                                     step_states)

        next_obs, next_states = jax.lax.cond(
            jnp.sum(done.astype(jnp.int32)) <= resets_per_step, few, every, (obs, states))
        info = {**info, "final_observation": obs}
        return next_obs, next_states, reward, terminated, truncated, info

    return VectorEnvStep(first_reset_key + resets_per_step + 1, env_step)


def always_true(key: jax.Array) -> jax.Array:
    """() bool True, computed from a typed `key`'s bits, so the compiler cannot know it."""
    return (jax.random.key_data(key).reshape(-1)[0] | jnp.uint32(1)) != 0


def separate_reset(tree: Any, gate: jax.Array) -> Any:
    """`tree` (one sub-env's fresh `(obs, state)`, or the observation, reward and flags of
    its step), computed into memory in a kernel of its own on CPU; `gate` is
    `always_true`'s () bool. Elsewhere `tree` itself.

    With the unrolled hash (`jaxrunner.lowering`) XLA:CPU fuses a reset's random draw
    into every fusion that selects one of its fields, computing the draw again in each,
    and only after the env's step has run; `jax.lax.optimization_barrier` does not stop
    it (XLA:CPU expands barriers before fusion). A conditional the compiler cannot
    resolve does: the reset is drawn once, from the step's keys alone, so it can run
    beside the policy's forward pass. Same values either way (`gate` is always True).
    Where it pays is measured, not known in advance: `reset_spreads_its_draw` and
    `step_outputs_to_separate` say where the runner uses it."""
    def on_cpu(tree: Any, gate: jax.Array) -> Any:
        return jax.lax.cond(gate, lambda t: t, lambda t: jax.tree.map(jnp.zeros_like, t),
                            tree)

    return jax.lax.platform_dependent(tree, gate, cpu=on_cpu,
                                      default=lambda tree, gate: tree)


# The primitives that compute Threefry hashes of a key (`separate_draws`).
DRAW_PRIMITIVES = frozenset({"random_bits", "random_split", "random_fold_in"})

# From this many sub-envs on, a separated reset (`make_env_step`'s `separate_resets`) also
# draws its random bits in kernels of their own (`separate_draws`). Same-process A/B on the
# 2-core CPU (`benchmarks/separate_draws.py`, `benchmarks/results/separate_draws/`, two
# runs, ratios to the bare scan, together / apart): multi-agent CartPole 0.83 / 1.03 and
# 0.82 / 1.03 at 4096 sub-envs, 0.99 / 1.21 at 2048, but 1.32 / 1.22 and 1.26 / 1.20 at
# 1024 and 1.16 / 1.05 at 128 (each separated draw adds a kernel a step); CartPole
# 0.98 / 0.99 and 0.97 / 0.94 at 4096, 0.96 / 1.01 at 2048, 1.29 / 1.38 and 1.36 / 1.41
# at 1024.
SEPARATE_DRAWS_MIN_ENVS = 2048


def separate_draws(fn: Callable, gate: jax.Array) -> Callable:
    """`fn` with the random bits and keys of every hash it computes (`DRAW_PRIMITIVES`,
    also inside the jitted functions it calls) computed into memory in a kernel of their
    own on CPU (`separate_reset` with `gate`, `always_true`'s () bool); same values.

    A reset draws a few words per sub-env and builds several outputs from them (CartPole's
    four state fields and its observation). With the unrolled hash, XLA:CPU computes each
    output in a fusion of its own and hashes again in every one of them (a profile of
    multi-agent CartPole at 4096 sub-envs: six fusions a step, each hashing all sub-envs'
    draws, a quarter of the chunk's kernel time); drawn apart, each output reads the
    words from memory."""
    def wrapped(*args: Any) -> Any:
        closed, out_shape = jax.make_jaxpr(fn, return_shape=True)(*args)
        out = _eval_separating_draws(closed.jaxpr, list(closed.consts), jax.tree.leaves(args),
                                     gate)
        return jax.tree.unflatten(jax.tree.structure(out_shape), out)

    return wrapped


def _draws_in(jaxpr: Any) -> bool:
    """Whether `jaxpr` or a call it makes (`called_jaxpr`) computes a hash."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in DRAW_PRIMITIVES:
            return True
        inner = called_jaxpr(eqn)
        if inner is not None and _draws_in(inner[0]):
            return True
    return False


def _eval_separating_draws(jaxpr: Any, consts: list, args: list, gate: jax.Array) -> list:
    """Evaluates `jaxpr` on `args` (`jax.core.eval_jaxpr`'s loop), separating the outputs
    of every hash (`separate_draws`); calls that hash are inlined, other higher-order
    primitives (cond, scan, while) run as they are."""
    values: dict = {}

    def read(var: Any) -> Any:
        return var.val if isinstance(var, Literal) else values[var]

    for var, value in zip(jaxpr.constvars, consts):
        values[var] = value
    for var, value in zip(jaxpr.invars, args):
        values[var] = value
    for eqn in jaxpr.eqns:
        operands = [read(var) for var in eqn.invars]
        inner = called_jaxpr(eqn)
        if inner is not None and _draws_in(inner[0]):
            outs = _eval_separating_draws(inner[0], inner[1], operands, gate)
        else:
            with eqn.ctx.manager:
                outs = eqn.primitive.bind(*operands,
                                          **eqn.primitive.get_bind_params(eqn.params))
            outs = list(outs) if eqn.primitive.multiple_results else [outs]
            if eqn.primitive.name in DRAW_PRIMITIVES:
                outs = list(separate_reset(tuple(outs), gate))
        for var, value in zip(eqn.outvars, outs):
            values[var] = value
    return [read(var) for var in jaxpr.outvars]


def gated_reset(reset: Callable, key: jax.Array, params: Any, reset_gate: Any,
                separate_reset_draws: bool = False) -> Any:
    """One sub-env's `reset(key, params)`. With `reset_gate` (`always_true`'s () bool) it
    is computed in a kernel of its own on CPU (`separate_reset`), and with
    `separate_reset_draws` so are its random draws (`separate_draws`); same values."""
    if reset_gate is None:
        return reset(key, params)
    if separate_reset_draws:
        reset = separate_draws(reset, reset_gate)
    return separate_reset(reset(key, params), reset_gate)


def select_where(done: jax.Array, new: Any, old: Any) -> Any:
    """`new` where the () bool `done`, else `old`, leaf by leaf (one sub-env's reset)."""
    return jax.tree.map(lambda n, o: jax.lax.select(done, n, o), new, old)


def _gymnax_auto_step_with_keys(env: Any, step_without_reset: Callable) -> Callable:
    """gymnax `Environment.step`'s transition with its step and reset keys given: the
    step without reset (`step_without_reset`, with the truncation check), a reset, the
    reset selected where the episode ended, and the step's info (`terminated`,
    `truncated`, `final_observation`)."""
    def auto_step_with_keys(step_key, reset_key, state, action, params, reset_gate=None,
                            outputs_gate=None, separated_outputs=STEP_OUTPUTS,
                            separate_reset_draws=False):
        if params is None:
            params = env.default_params
        obs_step, state_step, reward, terminated, truncated, info = step_without_reset(
            step_key, state, action, params)
        if outputs_gate is not None:
            outputs = dict(zip(STEP_OUTPUTS, (obs_step, reward, terminated, truncated)))
            outputs.update(separate_reset({name: outputs[name] for name in separated_outputs},
                                          outputs_gate))
            obs_step, reward, terminated, truncated = (outputs[name] for name in STEP_OUTPUTS)
        done = jnp.logical_or(terminated, truncated)
        obs_reset, state_reset = gated_reset(env.reset_env, reset_key, params, reset_gate,
                                             separate_reset_draws)
        info = {**info, "terminated": terminated, "truncated": truncated,
                "final_observation": obs_step}
        return (select_where(done, obs_reset, obs_step),
                select_where(done, state_reset, state_step), reward, terminated, truncated,
                info)

    return auto_step_with_keys


def has_base_gymnax_step(env: Any) -> bool:
    """True for a gymnax `Environment` subclass that keeps the base class's `step()`."""
    from gymnax.environments.environment import Environment

    return isinstance(env, Environment) and type(env).step is Environment.step


def gymnax_step_fns(env: Any) -> EnvStepFns:
    """`EnvStepFns` of a gymnax-style env (`step`, `reset`; `step_env`, `reset_env` and
    `is_truncated` of a gymnax `Environment` for "partial")."""
    def step_without_reset(key, state, action, params):
        obs, state, reward, terminated, info = env.step_env(key, state, action, params)
        return obs, state, reward, terminated, env.is_truncated(state, params), info

    has_split = hasattr(env, "step_env") and hasattr(env, "is_truncated")
    return EnvStepFns(auto_step=env.step, reset=getattr(env, "reset_env", env.reset),
                      step_no_reset=step_without_reset if has_split else None,
                      episode_done=lambda terminated, truncated: jnp.logical_or(terminated,
                                                                                truncated),
                      auto_step_with_keys=(
                          _gymnax_auto_step_with_keys(env, step_without_reset)
                          if has_base_gymnax_step(env) else None),
                      takes_reset_gate=has_base_gymnax_step(env),
                      takes_outputs_gate=has_base_gymnax_step(env))


__all__ = ["AUTORESET_MODES", "DRAW_PRIMITIVES", "EnvStepFns", "SEPARATE_DRAWS_MIN_ENVS",
           "STEP_OUTPUTS", "TRANSCENDENTAL_PRIMITIVES", "VectorEnvStep", "always_true",
           "check_partial_autoreset_env", "gated_reset", "gymnax_step_fns",
           "has_base_gymnax_step", "make_env_step", "outputs_work", "reset_spreads_its_draw",
           "select_where", "separate_draws", "separate_reset", "step_outputs_to_separate",
           "step_reads_key"]
