"""Starting Ray after `import jaxrunner` prints no `os.fork()` deadlock warning.

The cause: gymnax creates JAX arrays when it is imported, so a JAX backend (and JAX's
fork handler, which warns) exists as soon as jaxrunner is imported; `ray.init()` starts
its processes with `subprocess.Popen(preexec_fn=...)`, for which CPython runs the fork
handlers although the child only exec()s Ray's binaries. jaxrunner ignores that warning
when it comes from `subprocess` (at import, and in the group's own `init_ray`), and only
then: a real `os.fork()` still warns.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.ray

WARNING = "os.fork() was called"


def _run(code: str) -> str:
    """Runs `code` in a fresh interpreter; returns its stderr (asserting it succeeded)."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)],
                            capture_output=True, text=True, timeout=600,
                            env={**os.environ, "JAX_PLATFORMS": "cpu",
                                 "RAY_DEDUP_LOGS": "0"})
    assert result.returncode == 0, result.stderr[-4000:]
    return result.stderr


def test_ray_init__warns_when_a_jax_backend_exists_without_jaxrunner():
    # The premise: without jaxrunner's filter, Ray's start after importing gymnax warns.
    # If this fails, Ray or JAX changed and the filter may no longer be needed.
    stderr = _run("""
        import gymnax, ray
        ray.init(num_cpus=1, include_dashboard=False)
        ray.shutdown()
    """)
    assert WARNING in stderr


def test_ray_init_and_group_start__no_fork_warning_but_a_real_fork_still_warns():
    stderr = _run("""
        import os, sys, warnings
        import jaxrunner, ray
        from jaxrunner.distributed import EnvRunnerGroup

        ray.init(num_cpus=1, include_dashboard=False)  # the user's own call
        ray.shutdown()
        # The group's ray.init() is silent even with every filter reset (pytest, -W ...).
        warnings.resetwarnings()
        warnings.simplefilter("always")
        config = (jaxrunner.RunnerConfig().environment("CartPole-v1")
                  .env_runners(num_env_runners=1, num_envs_per_env_runner=2,
                               num_cpus_per_env_runner=1, rollout_fragment_length=4)
                  .rl_module(model_config={"fcnet_hiddens": [8]}))
        group = EnvRunnerGroup(config=config)
        assert ray.is_initialized() and group.healthy_env_runner_ids() == [1]
        group.stop()
        ray.shutdown()
        print("PHASE-FORK", file=sys.stderr, flush=True)
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)
    """)
    before, marker, after = stderr.partition("PHASE-FORK")
    assert marker, stderr[-4000:]
    assert WARNING not in before, before[-4000:]
    assert WARNING in after  # the filter is narrow: a fork that keeps running warns
