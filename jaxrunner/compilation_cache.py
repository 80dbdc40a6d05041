"""Opt-in persistent XLA compilation cache: a new process reuses compiled rollouts.

A runner compiles its rollout once per process (about 3 s for CartPole on a 2-core CPU,
see `benchmarks/results/suite.json`). Research scripts and notebook kernels restart often;
with the cache on, a restarted process loads the compiled programs from disk instead.
This is JAX's own persistent cache (`jax_compilation_cache_dir`): a process-wide setting,
so jaxrunner never turns it on by itself.
"""

from __future__ import annotations

import os

import jax

DEFAULT_DIRECTORY = os.path.join(os.path.expanduser("~"), ".cache", "jaxrunner", "xla")


def enable_compilation_cache(directory: str | os.PathLike | None = None, *,
                             min_compile_time_s: float = 0.1) -> str:
    """Turns on JAX's persistent compilation cache for this process; returns its directory.

    Args:
        directory: where compiled programs are kept (created if missing); default
            `~/.cache/jaxrunner/xla`. Several processes may share it.
        min_compile_time_s: programs that compiled faster than this are not stored.

    Call it before the first `sample()`: programs compiled earlier are not written back.
    The setting is also exported as `JAX_COMPILATION_CACHE_DIR` (and the threshold as
    `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS`), so processes started afterwards from
    this one (a local Ray cluster's runner actors) use the same cache.
    """
    if min_compile_time_s < 0:
        raise ValueError(f"min_compile_time_s must be >= 0, got {min_compile_time_s}.")
    path = os.path.abspath(os.fspath(directory if directory is not None else DEFAULT_DIRECTORY))
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"The compilation cache directory {path!r} is a file; pass a "
                         "directory (it is created if missing).")
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_time_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    os.environ["JAX_COMPILATION_CACHE_DIR"] = path
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = str(float(min_compile_time_s))
    return path
