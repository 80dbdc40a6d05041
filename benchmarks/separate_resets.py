"""What drawing each sub-env's reset in a kernel of its own costs or saves, same process.

    python benchmarks/separate_resets.py [--rounds 5] [--output PATH]

For each case two runners are built in one process, one with the reset separated
(`jaxrunner.core.chunk.SEPARATE_RESETS = True`) and one with XLA left to fuse it into the
selects of the auto-reset (`False`), beside the bare PureJaxRL-style scan
(`jaxrunner.benchmarking`, JAX's default lowering), in alternating rounds
(`jaxrunner.benchmarking.compare`, the order reversed every round). Separating applies to
rollouts compiled with the unrolled hash (at most `lowering.UNROLL_MAX_ENVS` sub-envs) on
CPU; see `jaxrunner.core.autoreset.separate_reset`. Both runners sample the same values.
The default ("auto") separates where at least 4 leaves of the reset read its key
(`reset_spreads_its_draw`); each case records which it picks (`auto_separates`).
Single-agent: 64x64 MLP, explore, 128 steps a call; multi-agent: `MultiAgentCartPole-v1`
with 2 agents, one 64x64 MLP each (`benchmarks/throughput_multi_agent.py`).
JSON to `benchmarks/results/separate_resets/ab.json`.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # same_process_ab

from same_process_ab import ab_main, runner_and_bare  # noqa: E402
from jaxrunner.benchmarking import switched  # noqa: E402
from jaxrunner.core import chunk  # noqa: E402

CASES = (("CartPole-v1", 64), ("CartPole-v1", 1024), ("CartPole-v1", 4096),
         ("Breakout-MinAtar", 1024), ("Breakout-MinAtar", 4096),
         ("Pendulum-v1", 1024), ("Pendulum-v1", 4096),
         ("MultiAgentCartPole-v1", 1024), ("MultiAgentCartPole-v1", 4096))


def _sides(env_id: str, num_envs: int) -> dict:
    """`{"separate": run, "fused": run, "bare_scan": run}`, each `run()` one call."""
    runner, bare = runner_and_bare(env_id, num_envs)
    sides = {}
    for name, flag in (("fused", False), ("separate", True)):
        with switched(chunk, "SEPARATE_RESETS", flag):  # read when the chunk is first traced
            sides[name] = runner()
    sides["bare_scan"] = bare()
    return sides


def _auto_separates(env_id: str) -> bool:
    """Whether the default ("auto") separates this env's reset."""
    import jax

    import gymnax

    from jaxrunner.core.autoreset import gymnax_step_fns, reset_spreads_its_draw

    if env_id.startswith("MultiAgent"):
        from jaxrunner.core.multi_agent_rollout import multi_agent_step_fns
        from jaxrunner.envs.context import EnvContext
        from jaxrunner.envs.multi_agent import make_multi_agent_env

        env, params, _ = make_multi_agent_env(env_id, EnvContext({"num_agents": 2}))
        fns = multi_agent_step_fns(env)
    else:
        env, params = gymnax.make(env_id)
        fns = gymnax_step_fns(env)
    return reset_spreads_its_draw(fns, jax.random.key(0), params)


def main() -> None:
    ab_main("separate_resets", __doc__, CASES, "separate_resets/ab.json", _sides,
            extra=lambda env_id, _: {"auto_separates": _auto_separates(env_id)})


if __name__ == "__main__":
    main()
