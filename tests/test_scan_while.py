"""`scan_while`: a scan that stops early, leaving zeros, equal to `lax.scan` when it runs
to the end; one compiled program for every stopping point."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrunner.core.rollout import scan_while


def _step(state):
    total, key = state
    key, sub = jax.random.split(key)
    x = jax.random.normal(sub, (3,))
    return (total + jnp.sum(x), key), {"x": x, "total": total + jnp.sum(x)}


@pytest.mark.parametrize("steps_per_check", [1, 4])
def test_scan_while_equals_scan_and_stops_early_with_zeros(steps_per_check):
    shape = jax.eval_shape(lambda s: _step(s)[1], (jnp.zeros(()), jax.random.key(0)))

    @jax.jit
    def run(limit):
        return scan_while(_step, (jnp.zeros(()), jax.random.key(0)), shape, 10,
                          lambda t, state, n: t + n <= limit, steps_per_check)

    taken, (total, _), out = run(10)
    (want_total, _), want = jax.lax.scan(lambda s, _: _step(s), (jnp.zeros(()),
                                                                jax.random.key(0)), None, 10)
    assert int(taken) == 10
    np.testing.assert_allclose(np.asarray(out["x"]), np.asarray(want["x"]), rtol=1e-6)
    np.testing.assert_allclose(float(total), float(want_total), rtol=1e-6)
    taken, (total, _), out = run(4)
    assert int(taken) == 4
    np.testing.assert_allclose(np.asarray(out["x"][:4]), np.asarray(want["x"][:4]), rtol=1e-6)
    assert not np.any(np.asarray(out["x"][4:])) and not np.any(np.asarray(out["total"][4:]))
    for limit in (7, 9, 3, 0):  # blocks of 4 then single steps stop at the same step
        taken, (total, _), out = run(limit)
        assert int(taken) == limit
        np.testing.assert_array_equal(np.asarray(out["x"][:limit]),
                                      np.asarray(run(10)[2]["x"][:limit]))
        assert not np.any(np.asarray(out["x"][limit:]))
    assert run._cache_size() == 1


def test_scan_while__a_block_is_taken_only_when_all_its_steps_would_be():
    """The loop asks `keep_going(t, state, K)` before a block of K steps and
    `keep_going(t, state, 1)` before a single one: a condition on the state (the running
    total must stay below a bound) stops at exactly the step a per-step loop stops at."""
    shape = jax.eval_shape(lambda s: _step(s)[1], (jnp.zeros(()), jax.random.key(0)))

    def count(state):
        n, key = state
        return (n + 1.0, key), {"x": jnp.ones(3), "total": n + 1.0}

    def run(steps_per_check):
        # `n` counts the steps taken; continue while the steps to take keep n <= 6.
        return scan_while(count, (jnp.zeros(()), jax.random.key(0)), shape, 10,
                          lambda t, state, n: state[0] + n <= 6, steps_per_check)

    for steps_per_check in (1, 4, 10):
        taken, (n, _), out = jax.jit(lambda: run(steps_per_check))()
        assert int(taken) == 6 and float(n) == 6.0
        assert np.asarray(out["total"]).tolist() == [1, 2, 3, 4, 5, 6, 0, 0, 0, 0]
