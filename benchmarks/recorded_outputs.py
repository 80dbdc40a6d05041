"""What recording RLlib's `action_dist_inputs` every step costs, same process.

    python benchmarks/recorded_outputs.py [--rounds 5] [--cases ENV:NUM_ENVS ...] [--output PATH]

For each case two runners are built in one process, one as configured by default
(`env_runners(record_action_dist_inputs=True)`: the module's distribution inputs, `B x D`
float32 a step, kept as an extra model output because RLlib's learners read them) and one
with `record_action_dist_inputs=False` (jaxrunner's PPO does not read them), beside the
bare PureJaxRL-style scan (`jaxrunner.benchmarking`, JAX's default lowering; it records
the observation, action, reward, done and log-probability), in alternating rounds
(`jaxrunner.benchmarking.compare`, the order reversed every round). 64x64 MLP, explore,
128 steps a call. Each case records the default (`default_records`). JSON to
`benchmarks/results/recorded_outputs.json`.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # same_process_ab

from same_process_ab import ab_main, runner_and_bare  # noqa: E402

from jaxrunner import RunnerConfig  # noqa: E402

CASES = (("CartPole-v1", 1024), ("CartPole-v1", 4096), ("CartPole-v1", 16384),
         ("Breakout-MinAtar", 4096))


def _sides(env_id: str, num_envs: int) -> dict:
    """`{"recorded": run, "not_recorded": run, "bare_scan": run}`, each `run()` one call."""
    runner, bare = runner_and_bare(env_id, num_envs)
    return {"recorded": runner(record_action_dist_inputs=True),
            "not_recorded": runner(record_action_dist_inputs=False), "bare_scan": bare()}


def main() -> None:
    ab_main("recorded_outputs", __doc__, CASES, "recorded_outputs.json", _sides,
            extra=lambda env_id, num_envs: {
                "default_records": RunnerConfig().record_action_dist_inputs})


if __name__ == "__main__":
    main()
