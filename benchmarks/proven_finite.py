"""What leaving observations that are finite by construction out of the fault check saves,
same process.

    python benchmarks/proven_finite.py [--rounds 5] [--cases ENV:NUM_ENVS ...]
        [--output PATH]

With `check_finite` (on by default) every vector step tests each sub-env's final
observation and reward for non-finite values (`jaxrunner.core.faults.step_failed`). An
observation leaf larger than `CONCATENATED_CHECK_MAX_BYTES` a sub-env that the env's
step builds finite by construction (read from its jaxpr,
`jaxrunner.core.finiteness.provably_finite`: the MinAtar grids are booleans converted to
float32) is not tested. For each case the runners are built in one process: "proven"
(the default), "tested" (every leaf tested, `jaxrunner.core.chunk.PROVE_OBS_FINITE =
False`) and "check_off" (`check_finite=False`), beside the bare PureJaxRL-style scan
(`jaxrunner.benchmarking`, JAX's default lowering), in alternating rounds
(`jaxrunner.benchmarking.compare`). All sample the same values. 64x64 MLP, explore, 128
steps a call. The leaves proven finite are recorded per case (`proven`). JSON to
`benchmarks/results/proven_finite.json`.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # same_process_ab

from same_process_ab import ab_main, gymnax_step_args, runner_and_bare  # noqa: E402

from jaxrunner.benchmarking import switched  # noqa: E402
from jaxrunner.core import chunk  # noqa: E402

CASES = (("Breakout-MinAtar", 1024), ("Breakout-MinAtar", 4096), ("Asterix-MinAtar", 1024),
         ("Asterix-MinAtar", 4096), ("SpaceInvaders-MinAtar", 4096))


def _sides(env_id: str, num_envs: int) -> dict:
    """`{"proven": run, "tested": run, "check_off": run, "bare_scan": run}`."""
    runner, bare = runner_and_bare(env_id, num_envs)
    sides = {"proven": runner()}
    with switched(chunk, "PROVE_OBS_FINITE", False):  # read at the chunk's first trace
        sides["tested"] = runner()
    sides["check_off"] = runner(check_finite=False)
    sides["bare_scan"] = bare()
    return sides


def _proven(env_id: str) -> list[bool]:
    """Per leaf of the env's observation: finite by construction."""
    import jax

    from jaxrunner.core.finiteness import provably_finite

    env, params, key, state, action = gymnax_step_args(env_id)
    return jax.tree.leaves(provably_finite(lambda k, s, a: env.step_env(k, s, a, params)[0],
                                           key, state, action))


def main() -> None:
    ab_main("proven_finite", __doc__, CASES, "proven_finite.json", _sides,
            extra=lambda env_id, _: {"proven": _proven(env_id)})


if __name__ == "__main__":
    main()
