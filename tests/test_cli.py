"""The `jaxrunner` command: bad arguments exit 2 with one line; `sample` (also over Ray
runners), `train` (JSON + PNG, the values `fused_train` computes) and `bench` (JSON +
PNG) at tiny sizes."""

from __future__ import annotations

import json

import pytest

from jaxrunner.cli import main


def _run(argv, capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse reports its own errors this way
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("argv", [
    [],
    ["frobnicate"],
    ["sample", "--num-envs", "0"],
    ["sample", "--num-envs", "many"],
    ["sample", "--timesteps", "5", "--episodes", "3"],
    ["sample", "--fragment", "-3"],
    ["sample", "--runners", "-1"],
    ["sample", "--hiddens", "a,b"],
    ["sample", "--seed", "-1", "--timesteps", "4", "--num-envs", "2"],
    ["sample", "--env", "NoSuchEnv-v0", "--timesteps", "4", "--num-envs", "2"],
    ["train", "--seeds", "0"],
    ["train", "--lr", "-1"],
    ["train", "--gamma", "1.5"],
    ["train", "--ent-coef", "nan"],
    ["train", "--activation", "gelu"],
    ["train", "--plot", "/"],
    ["train", "--env", "NoSuchEnv-v0", "--iterations", "1"],
    ["train", "--env", "TicTacToe-v0", "--iterations", "1"],
    ["train", "--env", "gymnasium:CartPole-v1", "--iterations", "1"],
    ["train", "--minibatches", "64", "--num-envs", "2", "--fragment", "4"],
    ["bench", "--num-envs", "x"],
    ["bench", "--output", "/no/such/directory/out.json"],
    ["bench", "--plot", "/"],
    ["bench", "--env", "NoSuchEnv-v0", "--num-envs", "2", "--num-steps", "2",
     "--rounds", "1", "--output", "/tmp/jaxrunner_cli_test_never_written.json"],
])
def test_cli__bad_arguments_exit_2_with_one_line(argv, capsys):
    code, out, err = _run(argv, capsys)
    assert code == 2
    if argv:  # no command at all prints the help, which is longer than a line
        lines = [line for line in err.splitlines() if line.strip()]
        assert len(lines) == 1, err
        assert "error" in lines[0] and "Traceback" not in err


def test_cli__sample_json(capsys):
    code, out, _ = _run(["sample", "--num-envs", "4", "--fragment", "8", "--timesteps", "64",
                         "--hiddens", "8", "--json"], capsys)
    assert code == 0
    report = json.loads(out)
    assert report["summary"]["env_steps"] == 64 and report["summary"]["runners"] == 0
    assert report["metrics"]["num_env_steps_sampled_lifetime"] == 64


@pytest.mark.ray
def test_cli__sample_with_ray_runners(capsys):
    code, out, _ = _run(["sample", "--num-envs", "2", "--fragment", "8", "--timesteps", "64",
                         "--hiddens", "8", "--runners", "2", "--json"], capsys)
    assert code == 0
    report = json.loads(out)
    assert report["summary"]["runners"] == 2
    assert report["summary"]["env_steps"] == 64  # 2 calls x 2 runners x 16 steps
    assert report["metrics"]["num_env_steps_sampled_lifetime"] == 64


def test_cli__bench_writes_json_and_png(tmp_path, capsys):
    output = tmp_path / "throughput.json"
    code, out, _ = _run(["bench", "--num-envs", "2", "--num-steps", "4", "--rounds", "1",
                         "--output", str(output)], capsys)
    assert code == 0
    results = json.loads(output.read_text())
    assert [case["num_envs"] for case in results["cases"]] == [2]
    png = tmp_path / "throughput.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert str(png) in out
    # The printed rates are the median rounds, labelled, next to the median ratio.
    case = results["cases"][0]
    assert f"jaxrunner {case['median_steps_per_s']['jaxrunner']:,.0f}" in out
    assert f"{case['ratio_to_bare_scan']['jaxrunner']:.3f}" in out and "best round" in out


def test_cli__train_refuses_a_multi_agent_env_as_one(capsys):
    code, _, err = _run(["train", "--env", "TicTacToe-v0", "--iterations", "1"], capsys)
    assert code == 2
    assert "trains one single-agent module" in err and "multi-agent env" in err, err


def test_cli__train_reports_what_fused_train_computes_and_plots_it(tmp_path, capsys):
    """`jaxrunner train --json` reports, per seed and iteration, the metrics
    `PPOLearner.fused_train` returns for the same config (the same program: the same
    values), and `--plot` writes a PNG."""
    import numpy as np

    import jaxrunner
    from jaxrunner.learners import PPOConfig, PPOLearner

    png = tmp_path / "returns.png"
    code, out, err = _run(["train", "--seeds", "2", "--seed", "3", "--iterations", "3",
                           "--num-envs", "2", "--fragment", "16", "--hiddens", "8",
                           "--epochs", "1", "--minibatches", "2", "--lr", "1e-3",
                           "--json", "--plot", str(png)], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["summary"]["seeds"] == 2 and report["summary"]["env_steps_per_seed"] == 96
    curves = report["curves"]
    assert curves["seeds"] == [3, 4]
    assert curves["env_steps"] == [[32, 64, 96], [32, 64, 96]]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    config = (jaxrunner.RunnerConfig().environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=2, rollout_fragment_length=16)
              .rl_module(model_config={"fcnet_hiddens": [8], "fcnet_activation": "tanh"})
              .debugging(seed=3))
    sampler = jaxrunner.make_sampler(config)
    learner = PPOLearner.from_sampler(sampler, PPOConfig(
        learning_rate=1e-3, num_epochs=1, num_minibatches=2, seed=3))
    direct = learner.fused_train(sampler, 3, seeds=2)["metrics"]
    expected = [[None if np.isnan(v) else float(v) for v in row]
                for row in np.asarray(direct["episode_return_mean"], dtype=float)]
    assert curves["episode_return_mean"] == expected
    assert any(v is not None for row in expected for v in row)  # episodes ended
    assert [row["episodes"] for row in report["per_seed"]] == [
        int(v) for v in np.asarray(direct["num_episodes_lifetime"])[:, -1]]


def test_cli__train_to_a_target_return_stops_each_seed_there(capsys):
    """`--target-return R`: each seed stops after the first iteration whose
    episode_return_mean reaches R; its curve ends there and the table says how many
    iterations it ran."""
    code, out, err = _run(["train", "--seeds", "2", "--iterations", "12", "--num-envs", "4",
                           "--fragment", "16", "--hiddens", "8", "--epochs", "1",
                           "--minibatches", "2", "--target-return", "12", "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["summary"]["target_return"] == 12.0
    assert report["summary"]["seeds_reaching_it"] == 2
    for row, steps, returns in zip(report["per_seed"], report["curves"]["env_steps"],
                                   report["curves"]["episode_return_mean"]):
        ran = row["iterations"]
        assert 1 <= ran < 12  # CartPole's random-policy episodes last about 20 steps
        assert steps == [64 * (i + 1) for i in range(ran)] and row["env_steps"] == 64 * ran
        assert len(returns) == ran and returns[-1] >= 12.0
        assert all(r is None or r < 12.0 for r in returns[:-1])
    assert report["summary"]["env_steps (all seeds)"] == sum(
        row["env_steps"] for row in report["per_seed"])
    code, _, err = _run(["train", "--target-return", "nan"], capsys)
    assert code == 2 and "--target-return: expected a finite number" in err


# ---------------------------------------------------------------------- envs, help, bench
def test_cli__envs_piped_prints_every_full_id(capsys):
    from jaxrunner.envs import gymnax_env_ids

    code, out, _ = _run(["envs"], capsys)  # capsys' stdout is not a terminal
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split("\t") == ["id", "source", "kind", "observation_space",
                                    "action_space"]
    ids = [line.split("\t")[0] for line in lines[1:]]
    assert set(gymnax_env_ids()) | {"MultiAgentCartPole-v1", "TicTacToe-v0"} <= set(ids)
    assert "MountainCarContinuous-v0" in ids and "…" not in out


def test_cli__envs_json(capsys):
    code, out, _ = _run(["envs", "--json"], capsys)
    assert code == 0
    rows = {row["id"]: row for row in json.loads(out)}
    assert rows["TicTacToe-v0"]["kind"] == "multi_agent"
    assert "player_x: Box" in rows["TicTacToe-v0"]["observation_space"]
    assert rows["CartPole-v1"] == {
        "id": "CartPole-v1", "source": "gymnax", "kind": "single_agent",
        "observation_space": rows["CartPole-v1"]["observation_space"],
        "action_space": "Discrete(2)"}
    assert rows["CartPole-v1"]["observation_space"].startswith("Box(")


@pytest.mark.parametrize("command, expected", [
    ("sample", ["(default: CartPole-v1)", "(default: 1024)", "(default: 200)",
                "(default: 0)", "(default: 64,64)"]),
    ("train", ["(default: CartPole-v1)", "(default: 4)", "(default: 150)", "(default: 16)",
               "(default: 64)", "(default: 0.00025)", "(default: tanh)"]),
    ("bench", ["(default: CartPole-v1)", "(default: 1024 4096)", "(default: 128)",
               "(default: 10)", "(default: throughput.json)"]),
])
def test_cli__help_shows_defaults(command, expected, capsys):
    code, out, _ = _run([command, "--help"], capsys)
    assert code == 0
    flat = " ".join(out.split())
    for text in expected:
        assert text in flat, (text, out)
    assert "(default: None)" not in flat and "(default: False)" not in flat


@pytest.mark.parametrize("env_id", ["TicTacToe-v0", "MultiAgentCartPole-v1"])
def test_cli__sample_multi_agent_env_uses_the_multi_agent_runner(env_id, capsys):
    code, out, err = _run(["sample", "--env", env_id, "--num-envs", "2", "--fragment", "8",
                           "--timesteps", "32", "--hiddens", "8", "--json"], capsys)
    assert code == 0, err
    report = json.loads(out)
    assert report["summary"]["env_steps"] == 32
    metrics = report["metrics"]
    assert metrics["num_env_steps_sampled_lifetime"] == 32
    # Multi-agent metrics: per agent and per (shared) module.
    assert set(metrics["num_module_steps_sampled"]) == {"shared_policy"}
    assert len(metrics["num_agent_steps_sampled"]) == 2


def test_cli__bench_summary_reports_median_rounds_beside_the_median_ratio():
    from jaxrunner.cli import bench_summary_lines

    # Best rounds favour jaxrunner, the median rounds (and ratio) the bare scan.
    results = {"env": "CartPole-v1", "cases": [{
        "num_envs": 8,
        "steps_per_s": {"jaxrunner": 3_000_000.0, "bare_scan": 2_800_000.0},
        "median_steps_per_s": {"jaxrunner": 2_000_000.0, "bare_scan": 2_500_000.0},
        "ratio_to_bare_scan": {"jaxrunner": 0.81}}]}
    (line,) = bench_summary_lines(results)
    median_part, best_part = line.split("; best round: ")
    assert "median round" in median_part and "0.810" in median_part
    assert "jaxrunner 2,000,000" in median_part and "bare_scan 2,500,000" in median_part
    assert "3,000,000" not in median_part
    assert "jaxrunner 3,000,000" in best_part and "bare_scan 2,800,000" in best_part


def test_cli__envs_lists_a_registered_gymnasium_env(capsys):
    """A name registered for a gymnasium (host) env is listed with its spaces, not a crash
    on its attribute spaces."""
    import gymnasium as gym

    import jaxrunner
    from jaxrunner.envs.registry import unregister_env

    jaxrunner.register_env("cli-host-cartpole", lambda ctx: gym.make("CartPole-v1"))
    try:
        code, out, _ = _run(["envs", "--json"], capsys)
    finally:
        unregister_env("cli-host-cartpole")
    assert code == 0
    rows = {row["id"]: row for row in json.loads(out)}
    assert rows["cli-host-cartpole"]["source"] == "register_env"
    assert rows["cli-host-cartpole"]["action_space"] == "Discrete(2)"
