"""The benchmark suite's bookkeeping (no timing assertions): per-round ratios against the
bare scan, the target summary and the README tables made from it."""

from __future__ import annotations

import time

import pytest

from benchmarks import report, suite
from jaxrunner.benchmarking import compare


def _sleeper(seconds):
    return lambda: time.sleep(seconds)


def test_compare_mixed_reports_rates_and_per_round_ratios():
    out = compare({"bare_scan": _sleeper(0.002), "jaxrunner": _sleeper(0.004)},
                  {"bare_scan": 100, "jaxrunner": 100}, rounds=3, calls_per_round=None)
    assert set(out["steps_per_s"]) == {"bare_scan", "jaxrunner"}
    assert 0.2 < out["ratio_to_bare_scan"]["jaxrunner"] < 0.8  # half as fast, give or take


def _case(env, policy, num_envs, ratio, partial=None, rllib=None):
    rates = {"jaxrunner": 1e6 * ratio, "bare_scan": 1e6}
    ratios = {"jaxrunner": ratio}
    if partial is not None:
        rates["jaxrunner_partial_reset"] = 1e6 * partial
        ratios["jaxrunner_partial_reset"] = partial
    if rllib is not None:
        rates["rllib_env_runner"] = rllib
    return {"env": env, "policy": policy, "num_envs": num_envs, "steps_per_s": rates,
            "ratio_to_bare_scan": ratios}


def test_summary_and_report_name_every_target():
    results = {
        "cases": [_case("CartPole-v1", "mlp64x64 explore", 1024, 0.96, rllib=5e3),
                  _case("CartPole-v1", "mlp64x64 explore", 4096, 0.94),
                  _case("CartPole-v1", "random", 4096, 1.1, partial=1.8, rllib=1e4)],
        "memory": {"ratio": 1.2}, "host_rss": {"growth_mb": 0.0, "calls": 1000},
        "startup": {"cold": {"first_sample_s": 3.5, "construct_and_first_sample_s": 5.0},
                    "warm_compilation_cache": {"first_sample_s": 0.7}},
    }
    summary = suite.summarize(results)
    assert summary["cartpole_mlp_ratio_to_bare_at_1024_plus_envs"]["min"] == 0.94
    assert summary["cartpole_random_partial_reset_ratio_to_bare_at_1024_plus_envs"][
        "values"] == [1.8]
    assert summary["cartpole_mlp64x64_best_jaxrunner_over_best_rllib"]["value"] == \
        pytest.approx(0.96e6 / 5e3)
    results["summary"] = summary
    table = report.targets_table(results)
    assert "0.96, 0.94 | >= 0.95 | **no**" in table
    assert "1.20× | <= 1.3 | yes" in table
    assert "3.50 s" in table and "0.70 s with `enable_compilation_cache`" in table
    rows = report.throughput_table(results).splitlines()
    assert len(rows) == 2 + len(results["cases"])
    assert "| CartPole-v1, random | 4096 | 1.10M | 1.80M | 1.00M | 1.10 (1.80) |" in rows[-1]
