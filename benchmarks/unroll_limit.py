"""Up to how many sub-envs a rollout should compile with the unrolled hash, same process.

    python benchmarks/unroll_limit.py [--rounds 5] [--cases ENV:NUM_ENVS ...] [--output PATH]

For each case two runners are built in one process, one compiled with jaxrunner's
unrolled Threefry hash (`jaxrunner.lowering`, "unrolled") and one with JAX's own
lowering ("jax"), by moving `lowering.UNROLL_MAX_ENVS` above or below the case's size
while the runner's chunk is first traced, beside the bare PureJaxRL-style scan
(`jaxrunner.benchmarking`, JAX's default lowering), in alternating rounds
(`jaxrunner.benchmarking.compare`, the order reversed every round). Both runners sample
the same values. Single-agent: 64x64 MLP, explore; `ENV+partial`: random actions with
`autoreset_mode="partial"` against the bare scan with random actions; multi-agent:
`MultiAgentCartPole-v1` with 2 agents (`benchmarks/throughput_multi_agent.py`). 128 steps a
call. Each case records what the default picks (`auto_unrolls`) and the seconds each
runner took to build and take its first `sample()` (compile included, `first_sample_s`).
JSON to `benchmarks/results/unrolled_rng/unroll_limit.json`.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # same_process_ab

from same_process_ab import ab_main, runner_and_bare  # noqa: E402

from jaxrunner import lowering  # noqa: E402
from jaxrunner.benchmarking import switched  # noqa: E402

PARTIAL = "+partial"
CASES = (("CartPole-v1", 16384), ("CartPole-v1", 65536), ("CartPole-v1" + PARTIAL, 16384),
         ("CartPole-v1" + PARTIAL, 65536), ("Pendulum-v1", 16384),
         ("Breakout-MinAtar", 16384), ("MultiAgentCartPole-v1", 16384))


# Per case, the seconds each runner took to build and sample once (read by `main`'s extra).
_FIRST_SAMPLE_S: dict[tuple[str, int], dict[str, float]] = {}


def _sides(env_id: str, num_envs: int) -> dict:
    """`{"unrolled": run, "jax": run, "bare_scan": run}`, each `run()` one call."""
    partial = env_id.endswith(PARTIAL)
    runner, bare = runner_and_bare(env_id.removesuffix(PARTIAL), num_envs,
                                   random_actions=partial)
    kwargs = {"autoreset_mode": "partial"} if partial else {}
    sides, first = {}, _FIRST_SAMPLE_S.setdefault((env_id, num_envs), {})
    for name, limit in (("unrolled", num_envs), ("jax", num_envs - 1)):
        with switched(lowering, "UNROLL_MAX_ENVS", limit):  # read when the runner is built
            start = time.perf_counter()
            sides[name] = runner(**kwargs)
            first[name] = time.perf_counter() - start
    sides["bare_scan"] = bare()
    return sides


def main() -> None:
    ab_main("unroll_limit", __doc__, CASES, "unrolled_rng/unroll_limit.json", _sides,
            extra=lambda env_id, num_envs: {
                "auto_unrolls": lowering.unroll_for(num_envs),
                "unroll_max_envs": lowering.UNROLL_MAX_ENVS,
                "first_sample_s": _FIRST_SAMPLE_S[(env_id, num_envs)]})


if __name__ == "__main__":
    main()
