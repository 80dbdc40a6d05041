"""What keeping MinAtar's observations in a narrow integer dtype saves, same process.

    python benchmarks/narrow_store.py [--rounds 5] [--cases ENV:NUM_ENVS ...]
        [--output PATH]

An observation leaf the env only ever fills with small integers (read from its step's and
reset's jaxpr, `jaxrunner.core.value_range.storage_dtypes`: the MinAtar grids are booleans
converted to float32) is kept in the narrowest integer dtype that holds it exactly, uint8
for MinAtar: a quarter of the bytes, widened back to the same float32 values when read.
A chunk keeps it so in two places: the trajectory's per-step observations
(`Trajectory.stored_obs`, read widened as `Trajectory.obs`) and the store of the final
observations of the steps that ended an episode (`jaxrunner.core.final_obs`).
For each case the runners are built in one process: "narrow" (the default: both narrow),
"float_trajectory" (the trajectory in float32, the store narrow:
`jaxrunner.core.chunk.NARROW_TRAJECTORY_OBS = False`) and "float" (both in the
observation's own dtype, `NARROW_ROW_STORE = False` too), beside the bare PureJaxRL-style
scan (`jaxrunner.benchmarking`, JAX's default lowering, float32 observations), in
alternating rounds (`jaxrunner.benchmarking.compare`). All sample the same values. 64x64
MLP, explore, 128 steps a call. The dtypes kept are recorded per case (`store_dtypes`).
JSON to `benchmarks/results/narrow_store.json`.
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
    """`{"narrow": run, "float_trajectory": run, "float": run, "bare_scan": run}`."""
    runner, bare = runner_and_bare(env_id, num_envs)
    sides = {"narrow": runner()}
    with switched(chunk, "NARROW_TRAJECTORY_OBS", False):  # read at the chunk's first trace
        sides["float_trajectory"] = runner()
        with switched(chunk, "NARROW_ROW_STORE", False):
            sides["float"] = runner()
    sides["bare_scan"] = bare()
    return sides


def _store_dtypes(env_id: str) -> list[str]:
    """The dtype the trajectory and the store keep each observation leaf of the env in."""
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
