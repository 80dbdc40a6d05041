"""`scan_while`: a scan that stops early, leaving zeros, equal to `lax.scan` when it runs
to the end; one compiled program for every stopping point."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrunner.core.rollout import scan_while


def _step(state):
    total, key = state
    key, sub = jax.random.split(key)
    x = jax.random.normal(sub, (3,))
    return (total + jnp.sum(x), key), {"x": x, "total": total + jnp.sum(x)}


def test_scan_while_equals_scan_and_stops_early_with_zeros():
    shape = jax.eval_shape(lambda s: _step(s)[1], (jnp.zeros(()), jax.random.key(0)))

    @jax.jit
    def run(limit):
        return scan_while(_step, (jnp.zeros(()), jax.random.key(0)), shape, 10,
                          lambda t, state: t < limit)

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
    assert run._cache_size() == 1
