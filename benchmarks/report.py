"""Markdown tables from a suite run (`benchmarks/results/suite.json`), for the README.

    python -m benchmarks.report [path/to/suite.json]
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _rate(value: float | None) -> str:
    if value is None:
        return "—"
    if value >= 1e6:
        return f"{value / 1e6:.2f}M"
    if value >= 1e3:
        return f"{value / 1e3:.1f}k"
    return f"{value:.0f}"


def throughput_table(results: dict[str, Any]) -> str:
    """One row per (env, policy, num_envs): steps/s of every sampler, ratio to the bare scan."""
    lines = ["| env, policy | envs | jaxrunner | partial reset | bare `lax.scan` | ratio "
             "(partial) | gymnasium.vector | RLlib runner |",
             "|---|---|---|---|---|---|---|---|"]
    for case in results["cases"]:
        rates = case["steps_per_s"]
        ratios = case.get("ratio_to_bare_scan", {})
        ratio = f"{ratios.get('jaxrunner', float('nan')):.2f}"
        if "jaxrunner_partial_reset" in ratios:
            ratio += f" ({ratios['jaxrunner_partial_reset']:.2f})"
        lines.append(
            f"| {case['env']}, {case['policy'].split()[0]} | {case['num_envs']} | "
            f"{_rate(rates.get('jaxrunner'))} | {_rate(rates.get('jaxrunner_partial_reset'))} | "
            f"{_rate(rates.get('bare_scan'))} | {ratio} | "
            f"{_rate(rates.get('gymnasium_vector'))} | {_rate(rates.get('rllib_env_runner'))} |")
    return "\n".join(lines)


def targets_table(results: dict[str, Any]) -> str:
    summary = results["summary"]
    rows = []
    mlp = summary["cartpole_mlp_ratio_to_bare_at_1024_plus_envs"]
    rows.append(("CartPole MLP, `sample()` / bare scan, 1024–16384 envs",
                 ", ".join(f"{v:.2f}" for v in mlp["values"]), mlp["target"],
                 mlp["min"] >= 0.95))
    partial = summary["cartpole_random_partial_reset_ratio_to_bare_at_1024_plus_envs"]
    rows.append(("CartPole random actions, partial auto-reset / bare gymnax scan, 1024–16384",
                 ", ".join(f"{v:.2f}" for v in partial["values"]), partial["target"],
                 partial["min"] >= 1.5))
    for policy in ("mlp64x64", "random"):
        entry = summary.get(f"cartpole_{policy}_best_jaxrunner_over_best_rllib")
        if entry:
            rows.append((f"CartPole {policy}, best jaxrunner / best RLlib runner",
                         f"{entry['value']:.0f}× ({_rate(entry['jaxrunner_best_steps_per_s'])}"
                         f" vs {_rate(entry['rllib_best_steps_per_s'])} steps/s)",
                         entry["target"], entry["value"] >= 250))
    memory = summary["memory_ratio_to_raw_trajectory"]
    rows.append(("device memory per sampled step / raw trajectory bytes (CartPole, 4096 envs)",
                 f"{memory['value']:.2f}×", memory["target"],
                 memory["value"] <= float(memory["target"].split()[-1])))
    rss = summary["host_rss_growth_mb_over_calls"]
    rows.append((f"host RSS growth over {rss['calls']} `sample()` calls", f"{rss['value']:.1f} MB",
                 "flat", rss["value"] < 5))
    first = summary["cartpole_first_sample_s"]
    rows.append(("CartPole first `sample()` in a fresh process (compile included)",
                 f"{first['cold']:.2f} s (with runner construction "
                 f"{first['cold_construct_and_first_sample']:.2f} s); "
                 f"{first['warm_compilation_cache']:.2f} s with `enable_compilation_cache`",
                 first["target"], first["cold"] <= 3.0))
    lines = ["| target | measured | wanted | met |", "|---|---|---|---|"]
    lines += [f"| {name} | {value} | {want} | {'yes' if ok else '**no**'} |"
              for name, value, want, ok in rows]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("suite_json", nargs="?", default=os.path.join(RESULTS, "suite.json"),
                        help="a suite run's JSON (default: benchmarks/results/suite.json)")
    path = parser.parse_args(argv).suite_json
    with open(path) as f:
        results = json.load(f)
    print(targets_table(results))
    print()
    print(throughput_table(results))


if __name__ == "__main__":
    main()
