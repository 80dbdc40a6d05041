"""What drawing a separated reset's random bits in kernels of their own costs or saves,
same process.

    python benchmarks/separate_draws.py [--rounds 5] [--cases ENV:NUM_ENVS ...] [--output PATH]

For each case two runners are built in one process, one whose separated reset
(`jaxrunner.core.chunk.SEPARATE_RESETS`) also draws its random bits apart
(`jaxrunner.core.chunk.SEPARATE_RESET_DRAWS = True`, `core.autoreset.separate_draws`)
and one without (`False`), beside the bare PureJaxRL-style scan (`jaxrunner.benchmarking`,
JAX's default lowering), in alternating rounds (`jaxrunner.benchmarking.compare`, the
order reversed every round). Only envs whose reset is separated are affected (CartPole,
multi-agent CartPole; not Pendulum or Breakout-MinAtar), and only rollouts compiled with
the unrolled hash (at most `lowering.UNROLL_MAX_ENVS` sub-envs) on CPU. Both runners
sample the same values. The default ("auto") draws apart from
`core.autoreset.SEPARATE_DRAWS_MIN_ENVS` sub-envs on; each case records what it picks
(`auto_separates_draws`). Single-agent: 64x64 MLP, explore, 128 steps a call;
multi-agent: `MultiAgentCartPole-v1` with 2 agents, one 64x64 MLP each
(`benchmarks/throughput_multi_agent.py`). JSON to
`benchmarks/results/separate_draws/ab.json`.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # same_process_ab

from same_process_ab import ab_main, runner_and_bare  # noqa: E402

from jaxrunner.benchmarking import switched  # noqa: E402
from jaxrunner.core import chunk  # noqa: E402
from jaxrunner.core.autoreset import SEPARATE_DRAWS_MIN_ENVS  # noqa: E402

CASES = (("CartPole-v1", 64), ("CartPole-v1", 1024), ("CartPole-v1", 2048),
         ("CartPole-v1", 4096), ("MultiAgentCartPole-v1", 128),
         ("MultiAgentCartPole-v1", 1024), ("MultiAgentCartPole-v1", 2048),
         ("MultiAgentCartPole-v1", 4096))


def _sides(env_id: str, num_envs: int) -> dict:
    """`{"together": run, "apart": run, "bare_scan": run}`, each `run()` one call."""
    runner, bare = runner_and_bare(env_id, num_envs)
    sides = {}
    for name, flag in (("together", False), ("apart", True)):
        with switched(chunk, "SEPARATE_RESET_DRAWS", flag):  # read at the first trace
            sides[name] = runner()
    sides["bare_scan"] = bare()
    return sides


def main() -> None:
    ab_main("separate_draws", __doc__, CASES, "separate_draws/ab.json", _sides,
            extra=lambda _, num_envs: {
                "auto_separates_draws": num_envs >= SEPARATE_DRAWS_MIN_ENVS})


if __name__ == "__main__":
    main()
