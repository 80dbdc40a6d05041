"""The benchmark suite's bookkeeping (no timing assertions): per-round ratios against the
bare scan, the target summary and the README tables made from it."""

from __future__ import annotations

import pytest

from benchmarks import report, suite
from jaxrunner import benchmarking


def test_compare_reports_rates_and_per_round_ratios(monkeypatch):
    """A fake clock that each side advances by a fixed amount: no real timing involved."""
    clock = [0.0]
    monkeypatch.setattr(benchmarking.time, "perf_counter", lambda: clock[0])
    calls = {"bare_scan": 0, "jaxrunner": 0}

    def side(name, seconds):
        def run():
            calls[name] += 1
            clock[0] += seconds
        return run

    out = benchmarking.compare({"bare_scan": side("bare_scan", 0.002),
                                "jaxrunner": side("jaxrunner", 0.004)},
                               {"bare_scan": 100, "jaxrunner": 200}, rounds=3,
                               calls_per_round=None)
    assert out["steps_per_s"] == pytest.approx({"bare_scan": 5e4, "jaxrunner": 5e4})
    assert out["ratio_to_bare_scan"]["jaxrunner"] == pytest.approx(1.0)
    # >= 50 ms of work per round: 26 and 13 calls, after one timed call each.
    assert calls == {"bare_scan": 1 + 3 * 26, "jaxrunner": 1 + 3 * 13}


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
    assert "1.20× | <= 1.1 | **no**" in table  # the speed issue's target
    assert "3.50 s" in table and "0.70 s with `enable_compilation_cache`" in table
    rows = report.throughput_table(results).splitlines()
    assert len(rows) == 2 + len(results["cases"])
    assert "| CartPole-v1, random | 4096 | 1.10M | 1.80M | 1.00M | 1.10 (1.80) |" in rows[-1]


def test_targets_runs__newest_first_with_every_earlier_run_kept():
    """`--targets` makes its run the newest and keeps the one it replaces in front of the
    earlier ones, with the run note it was given."""
    results = {"cases": [], "speed_targets": {"summary": "b"},
               "earlier_speed_targets": [{"summary": "a"}]}
    suite.keep_speed_targets(results, {"summary": "c"}, "at abc1234")
    assert results["speed_targets"] == {"summary": "c", "run_note": "at abc1234"}
    assert results["earlier_speed_targets"] == [{"summary": "b"}, {"summary": "a"}]
    assert results["cases"] == []
    fresh: dict = {}
    suite.keep_speed_targets(fresh, {"summary": "first"})
    assert fresh == {"speed_targets": {"summary": "first"}}


def test_full_sweep__keeps_the_targets_runs_of_the_file_it_replaces(tmp_path):
    import json

    path = tmp_path / "suite.json"
    sweep = {"cases": ["new"]}
    suite.carry_target_runs(sweep, str(path))  # no file yet: nothing to keep
    assert sweep == {"cases": ["new"]}
    path.write_text(json.dumps({"cases": ["old"], "speed_targets": {"summary": "b"},
                                "earlier_speed_targets": [{"summary": "a"}]}))
    suite.carry_target_runs(sweep, str(path))
    assert sweep == {"cases": ["new"], "speed_targets": {"summary": "b"},
                     "earlier_speed_targets": [{"summary": "a"}]}
