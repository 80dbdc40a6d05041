"""The `jaxrunner` command: bad arguments exit 2 with one line; `sample` (also over Ray
runners) and `bench` (JSON + PNG) at tiny sizes."""

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
