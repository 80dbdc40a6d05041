"""What computing the observation, reward and flags of each sub-env's step in a kernel of
their own costs or saves, same process.

    python benchmarks/separate_outputs.py [--rounds 5] [--cases ENV:NUM_ENVS ...]
        [--output PATH]

For each case three runners are built in one process: "fused" with XLA left to fuse those
outputs of the env's step into their readers (`jaxrunner.core.chunk.SEPARATE_STEP_OUTPUTS
= False`), "auto" with the default (the outputs whose work beyond the next state's has a
transcendental function, `step_outputs_to_separate`; recorded per case as
`auto_separates`) and "all" with all four separated (`True`), beside the bare
PureJaxRL-style scan
(`jaxrunner.benchmarking`, JAX's default lowering), in alternating rounds
(`jaxrunner.benchmarking.compare`, the order reversed every round). Separating applies to
"gymnax"-mode rollouts on CPU (`jaxrunner.core.autoreset.separate_reset`); all runners
sample the same values. 64x64 MLP, explore, 128 steps a call. JSON to
`benchmarks/results/separate_outputs/ab.json`.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # same_process_ab

from same_process_ab import ab_main, gymnax_step_args, runner_and_bare  # noqa: E402
from jaxrunner.benchmarking import switched  # noqa: E402
from jaxrunner.core import chunk  # noqa: E402

CASES = (("Pendulum-v1", 128), ("Pendulum-v1", 1024), ("Pendulum-v1", 4096),
         ("Pendulum-v1", 16384), ("Acrobot-v1", 128), ("Acrobot-v1", 1024),
         ("Acrobot-v1", 4096), ("CartPole-v1", 16), ("CartPole-v1", 1024),
         ("CartPole-v1", 4096), ("Breakout-MinAtar", 128), ("Breakout-MinAtar", 1024),
         ("Breakout-MinAtar", 4096))


def _sides(env_id: str, num_envs: int) -> dict:
    """`{"fused": run, "auto": run, "all": run, "bare_scan": run}`, each `run()` one call."""
    runner, bare = runner_and_bare(env_id, num_envs)
    sides = {}
    for name, flag in (("fused", False), ("auto", "auto"), ("all", True)):
        with switched(chunk, "SEPARATE_STEP_OUTPUTS", flag):  # read at the chunk's first trace
            sides[name] = runner()
    sides["bare_scan"] = bare()
    return sides


def _auto_separates(env_id: str) -> list[str]:
    """The outputs of this env's step the default ("auto") separates."""
    import jax
    import jax.numpy as jnp

    from jaxrunner.core.autoreset import gymnax_step_fns, step_outputs_to_separate

    env, params, key, state, action = gymnax_step_args(env_id)
    batched = lambda tree: jax.tree.map(lambda x: jnp.asarray(x)[None], tree)  # noqa: E731
    return list(step_outputs_to_separate(gymnax_step_fns(env), key, batched(state),
                                         batched(action), params))


def main() -> None:
    ab_main("separate_outputs", __doc__, CASES, "separate_outputs/ab.json", _sides,
            extra=lambda env_id, _: {"auto_separates": _auto_separates(env_id)})


if __name__ == "__main__":
    main()
