"""`enable_compilation_cache`: a second process loads the compiled rollout from disk and
samples the same batch; bad directories are clear errors."""

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
sys.exit(main(["sample", "--num-envs", "4", "--fragment", "8", "--timesteps", "320",
               "--hiddens", "8", "--json", "--compile-cache", sys.argv[1]]) or
         print("HITS", len(hits)))
"""


def _run(cache_dir) -> tuple[int, dict]:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    proc = subprocess.run([sys.executable, "-c", _SCRIPT, str(cache_dir)], env=env,
                          capture_output=True, text=True, timeout=300)
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
