"""`enable_compilation_cache` and the CLI's `--compile-cache`: a second process loads the
compiled rollout (`jaxrunner sample`) or the fused training program (`jaxrunner train`) from
disk and computes the same values; bad directories are clear errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import jaxrunner

_SCRIPT = """
import json, sys
import jax, numpy as np
hits = []
jax.monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name.endswith("cache_hits") else None)
from jaxrunner.cli import main
sys.exit(main(json.loads(sys.argv[1])) or print("HITS", len(hits)))
"""

_SAMPLE = ["sample", "--num-envs", "4", "--fragment", "8", "--timesteps", "320",
           "--hiddens", "8", "--json"]
_TRAIN = ["train", "--seeds", "2", "--iterations", "3", "--num-envs", "2", "--fragment", "16",
          "--hiddens", "8", "--epochs", "1", "--minibatches", "2", "--lr", "1e-3", "--json"]


def _cli(argv: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    return subprocess.run([sys.executable, "-c", _SCRIPT, json.dumps(argv)], env=env,
                          capture_output=True, text=True, timeout=300)


def _run(cache_dir, argv: list[str] = _SAMPLE) -> tuple[int, dict]:
    proc = _cli([*argv, "--compile-cache", str(cache_dir)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    hits = int(proc.stdout.rsplit("HITS", 1)[1])
    report = json.loads(proc.stdout.rsplit("HITS", 1)[0])
    return hits, report


def test_second_process_loads_the_compiled_rollout(tmp_path):
    first_hits, first = _run(tmp_path / "xla")
    assert first_hits == 0
    assert os.listdir(tmp_path / "xla"), "nothing was written to the cache"
    second_hits, second = _run(tmp_path / "xla")
    assert second_hits >= 1
    # Same seed, same program: the same episodes (timers aside).
    def steps_and_episodes(report):
        return {k: v for k, v in report["metrics"].items()
                if k.startswith(("num_", "episode_")) and "throughput" not in k
                and "duration" not in k}

    assert steps_and_episodes(second) == steps_and_episodes(first)
    assert "episode_return_mean" in steps_and_episodes(first)


def test_a_file_is_not_a_cache_directory(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        jaxrunner.enable_compilation_cache(path)
    with pytest.raises(ValueError, match="min_compile_time_s"):
        jaxrunner.enable_compilation_cache(tmp_path / "ok", min_compile_time_s=-1)


def test_second_train_process_loads_the_fused_program(tmp_path):
    """`jaxrunner train --compile-cache`: the second run of the same sizes loads the fused
    training program from disk and trains the same seeds to the same curves; other seeds
    of the same count are values of that program, loaded too."""
    first_hits, first = _run(tmp_path / "xla", _TRAIN)
    assert first_hits == 0
    assert os.listdir(tmp_path / "xla"), "nothing was written to the cache"
    second_hits, second = _run(tmp_path / "xla", _TRAIN)
    assert second_hits >= 1
    assert second["curves"] == first["curves"] and second["per_seed"] == first["per_seed"]
    assert first["curves"]["env_steps"] == [[32, 64, 96], [32, 64, 96]]
    other_hits, other = _run(tmp_path / "xla", [*_TRAIN, "--seed", "5"])
    assert other_hits == second_hits and other["curves"]["seeds"] == [5, 6]
    assert other["curves"]["episode_return_mean"] != first["curves"]["episode_return_mean"]


@pytest.mark.parametrize("argv", [_SAMPLE, _TRAIN], ids=["sample", "train"])
def test_cli__a_file_as_compile_cache_is_a_usage_error(tmp_path, argv):
    path = tmp_path / "file"
    path.write_text("x")
    proc = _cli([*argv, "--compile-cache", str(path)])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"jaxrunner {argv[0]}: error: --compile-cache:" in proc.stderr
    assert "is a file" in proc.stderr and "Traceback" not in proc.stderr
