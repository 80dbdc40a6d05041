"""The chunk reads its `(T, B)` step flags after the scan without bool OR / AND reductions.

XLA:CPU compiles a bool OR reduction over a `(64, 16)` array into about seven times the
LLVM code of an int32 sum of the same flags, and compile time follows the code size
(`benchmarks/compile_parts.py --llvm-ir`): the failure checks after the scan test for
any failure with a count (`jaxrunner.core.ring.count_true`). Pinned on the traced
programs (no compile): `Sampler.sample` single- and multi-agent, one seed and vmapped
over seeds, has no `reduce_or` / `reduce_and` across its steps or sub-envs (one that
folds `B` or more entries into each result; the multi-agent layout's OR over the 2
agents of a step is not one).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

import jaxrunner
from jaxrunner.core.ring import count_true

from conftest import all_eqns, make_config

NUM_ENVS, T = 16, 64


def _bool_reductions(jaxpr) -> list:
    """`(primitive, operand shape, entries folded into each result)` of every bool
    reduction in `jaxpr`, sub-jaxprs too."""
    found = []
    for eqn in all_eqns(jaxpr):
        if eqn.primitive.name in ("reduce_or", "reduce_and"):
            shape = tuple(eqn.invars[0].aval.shape)
            folded = int(np.prod([shape[axis] for axis in eqn.params["axes"]]))
            found.append((eqn.primitive.name, shape, folded))
    return found


def _large(found: list) -> list:
    return [(name, shape) for name, shape, folded in found if folded >= NUM_ENVS]


@pytest.mark.parametrize("env", ["CartPole-v1", "MultiAgentCartPole-v1"])
@pytest.mark.parametrize("seeds", [0, 3])
def test_sample__no_bool_reduction_over_the_step_flags(env, seeds):
    config = make_config(env, num_envs=NUM_ENVS, fragment=T)
    if env.startswith("MultiAgent"):
        config = config.environment(env, env_config={"num_agents": 2})
    sampler = jaxrunner.make_sampler(config)
    assert sampler.num_steps == T
    init, sample = sampler.init, lambda s, p: sampler.sample(s, p)
    keys = sampler.default_key
    if seeds:
        init, sample = jax.vmap(init), jax.vmap(sample, in_axes=(0, None))
        keys = jax.random.split(keys, seeds)
    state = jax.eval_shape(init, keys)
    jaxpr = jax.make_jaxpr(sample)(state, sampler.params).jaxpr
    assert _large(_bool_reductions(jaxpr)) == []


def test_the_check_sees_a_bool_reduction_over_the_flags():
    """The walk finds what it must exclude: `jnp.any` over `(T, B)` flags in a nested
    program, and not the count `count_true` makes of them."""
    flags = jax.ShapeDtypeStruct((T, NUM_ENVS), np.bool_)

    def program(flags):
        return jax.lax.cond(True, lambda f: jax.numpy.any(f), lambda f: count_true(f) > 0,
                            flags)

    found = _bool_reductions(jax.make_jaxpr(program)(flags).jaxpr)
    assert _large(found) == [("reduce_or", (T, NUM_ENVS))]
