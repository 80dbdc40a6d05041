"""How the fault check's small leaves are tested, and what that costs, same process.

    python benchmarks/finite_check.py [--rounds 5] [--cases ENV:NUM_ENVS ...] [--output PATH]

`check_finite` (on by default) makes every vector step test each sub-env's reward and
final observation for non-finite values (`jaxrunner.core.faults.all_finite`). Where those
floating leaves hold at most `CONCATENATED_CHECK_MAX_BYTES` a sub-env together, they are
checked column by column, elementwise (`faults.SMALL_LEAVES_CHECK = "columns"`, the
default off CPU), or as one `(B, N)` array per dtype with one reduction ("joined", the
default on CPU); the
"per_leaf" side checks them leaf by leaf, one reduction each (the check before either),
"check_off" not at all. All flag the same sub-envs. For each case the runners and the
bare PureJaxRL-style scan (`jaxrunner.benchmarking`, JAX's default
lowering) run in alternating rounds in one process (`jaxrunner.benchmarking.compare`).
Single-agent: 64x64 MLP, explore, 128 steps a call; multi-agent: `MultiAgentCartPole-v1`
with 2 agents, one 64x64 MLP each. JSON to `benchmarks/results/finite_check.json`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # same_process_ab

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from same_process_ab import ab_main, runner_and_bare  # noqa: E402

from jaxrunner.benchmarking import switched  # noqa: E402
from jaxrunner.core import faults  # noqa: E402

CASES = (("CartPole-v1", 128), ("CartPole-v1", 1024), ("CartPole-v1", 4096),
         ("CartPole-v1", 16384), ("Pendulum-v1", 1024), ("Pendulum-v1", 4096),
         ("MultiAgentCartPole-v1", 1024), ("MultiAgentCartPole-v1", 4096))


def all_finite_per_leaf(tree: Any) -> jax.Array | None:
    """The check leaf by leaf: one reduction per floating leaf."""
    ok = None
    for leaf in map(jnp.asarray, jax.tree.leaves(tree)):
        if jnp.issubdtype(leaf.dtype, jnp.floating):
            leaf_ok = jnp.all(jnp.isfinite(leaf).reshape(leaf.shape[0], -1), axis=-1)
            ok = leaf_ok if ok is None else ok & leaf_ok
    return ok


def _sides(env_id: str, num_envs: int) -> dict:
    runner, bare = runner_and_bare(env_id, num_envs)
    sides = {}
    for layout in ("columns", "joined"):  # both read when a chunk is first traced
        with switched(faults, "SMALL_LEAVES_CHECK", layout):
            sides[layout] = runner()
    with switched(faults, "all_finite", all_finite_per_leaf):
        sides["per_leaf"] = runner()
    if not env_id.startswith("MultiAgent"):  # what the check costs at all
        sides["check_off"] = runner(check_finite=False)
    sides["bare_scan"] = bare()
    return sides


def main() -> None:
    ab_main("finite_check", __doc__, CASES, "finite_check.json", _sides,
            max_joined_bytes=faults.CONCATENATED_CHECK_MAX_BYTES)


if __name__ == "__main__":
    main()
