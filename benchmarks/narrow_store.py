"""What keeping the final-observation store in a narrow integer dtype saves, same process.

    python benchmarks/narrow_store.py [--rounds 5] [--cases ENV:NUM_ENVS ...]
        [--output PATH]

A chunk keeps the final observations of the steps that ended an episode (and of its last
step) in a store it allocates, fills and hands over every call (`jaxrunner.core.final_obs`).
An observation leaf the env only ever fills with small integers (read from its step's
jaxpr, `jaxrunner.core.value_range.storage_dtypes`: the MinAtar grids are booleans
converted to float32) is kept in the narrowest integer dtype that holds it exactly, uint8
for MinAtar: a quarter of the bytes, widened back to the same float32 values when read.
For each case the runners are built in one process: "narrow" (the default) and "float"
(the observation's own dtype, `jaxrunner.core.chunk.NARROW_ROW_STORE = False`), beside
the bare PureJaxRL-style scan (`jaxrunner.benchmarking`, JAX's default lowering), in
alternating rounds (`jaxrunner.benchmarking.compare`). Both sample the same values. 64x64
MLP, explore, 128 steps a call. The dtypes the store keeps are recorded per case
(`store_dtypes`). JSON to `benchmarks/results/narrow_store.json`.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # same_process_ab

from same_process_ab import ab_main, gymnax_step_args, runner_and_bare  # noqa: E402

from jaxrunner.benchmarking import switched  # noqa: E402
from jaxrunner.core import chunk  # noqa: E402

CASES = (("Breakout-MinAtar", 1024), ("Breakout-MinAtar", 4096), ("Asterix-MinAtar", 4096),
         ("SpaceInvaders-MinAtar", 4096))


def _sides(env_id: str, num_envs: int) -> dict:
    """`{"narrow": run, "float": run, "bare_scan": run}`."""
    runner, bare = runner_and_bare(env_id, num_envs)
    sides = {"narrow": runner()}
    with switched(chunk, "NARROW_ROW_STORE", False):  # read at the chunk's first trace
        sides["float"] = runner()
    sides["bare_scan"] = bare()
    return sides


def _store_dtypes(env_id: str) -> list[str]:
    """The dtype the store keeps each observation leaf of the env in."""
    import jax

    from jaxrunner.core.value_range import storage_dtypes

    env, params, key, state, action = gymnax_step_args(env_id)
    return [str(d) for d in jax.tree.leaves(storage_dtypes(
        lambda k, s, a: env.step(k, s, a, params)[0], key, state, action))]


def main() -> None:
    ab_main("narrow_store", __doc__, CASES, "narrow_store.json", _sides,
            extra=lambda env_id, _: {"store_dtypes": _store_dtypes(env_id)})


if __name__ == "__main__":
    main()
