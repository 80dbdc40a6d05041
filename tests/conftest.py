"""Shared fixtures: small, fast-compiling configs and an XLA compilation counter.

Every runner built from these configs compiles its rollout once (a few seconds on a
2-core CPU), so tests share runners through module-scoped fixtures where the contract
they check does not depend on a fresh runner.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import subprocess
import sys
import tempfile

# The whole test run (this process, pytest-xdist's workers, and what they start: Ray
# actors and CLI subprocesses inherit the environment) compiles without LLVM's expensive
# passes: compile time dominates most tests on a 2-core CPU, and the programs then run
# slower, which no test notices (none times anything). Notebook kernels inherit it too:
# at the small sizes the tests run them (tests/notebook_helpers.py), their compiles
# dominate as well. Set before JAX is imported; a value the caller set wins.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

# And with XLA:CPU's older code generation instead of its fusion emitters: compiles take
# about a third less time (the whole run: 16.3 against 22.8 minutes on a 2-core CPU), and
# the programs compute the same functions. Not always the same float bits, though: where
# two different programs of the same computation must agree bit for bit (the separated
# resets and step outputs, blocks of steps, fused sampler calls against runner calls),
# they do under XLA's default code generation, which the library gets, so those tests are
# marked `default_codegen` and run in a child process without this flag
# (`pytest_pyfunc_call` below). A caller's own setting of the flag wins.
# `JAXRUNNER_TESTS_CODEGEN` ("fast" / "default") tells pytest-xdist's workers and the
# marked tests' children which one this process runs with.
_FAST_CODEGEN_FLAG = "--xla_cpu_use_fusion_emitters=false"
if ("JAXRUNNER_TESTS_CODEGEN" not in os.environ
        and "xla_cpu_use_fusion_emitters" not in os.environ.get("XLA_FLAGS", "")):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FAST_CODEGEN_FLAG}".strip()
    os.environ["JAXRUNNER_TESTS_CODEGEN"] = "fast"
FAST_CODEGEN = os.environ.get("JAXRUNNER_TESTS_CODEGEN") == "fast"

# Every `ray.init()` without an address in this run (the tests' own, the group's, the CLI's
# and the notebooks' in their subprocesses) starts its own local instance. Without this,
# Ray joins the cluster named in /tmp/ray/ray_current_cluster, which
# `ray.cluster_utils.Cluster` writes while test_distributed_cluster.py runs in the other
# pytest-xdist worker (and which a crashed earlier run can leave behind); joining fails
# there at once because the tests pass `num_cpus`. An explicit address
# (`ray.init(address=cluster.address)`) still wins. A value the caller set wins.
os.environ.setdefault("RAY_ADDRESS", "local")

# One persistent XLA compilation cache for the whole run: many tests (in both pytest-xdist
# workers, their CLI subprocesses, Ray actors and notebook kernels, which all inherit the
# environment) build runners of the same small configs, and a program compiled once is
# then loaded instead of compiled again (a quarter of the run time on a 2-core CPU). The
# directory is new for each run, so every run (CI's too) starts cold and its time is
# reproducible; the process that made it removes it at the end. A directory the caller set
# wins (set one to keep compiled programs between runs).
_RUN_CACHE_DIR = None
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _RUN_CACHE_DIR = tempfile.mkdtemp(prefix="jaxrunner-tests-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _RUN_CACHE_DIR
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import jaxrunner  # noqa: E402


def pytest_pyfunc_call(pyfuncitem):
    """Runs a `default_codegen` test in a child pytest under XLA's default CPU code
    generation (see `_FAST_CODEGEN_FLAG`); it passes or fails with the child."""
    if not FAST_CODEGEN or pyfuncitem.get_closest_marker("default_codegen") is None:
        return None
    flags = os.environ["XLA_FLAGS"].replace(_FAST_CODEGEN_FLAG, "").strip()
    env = {**os.environ, "XLA_FLAGS": flags, "JAXRUNNER_TESTS_CODEGEN": "default"}
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         "--durations=0", pyfuncitem.nodeid],
        cwd=str(pyfuncitem.config.rootpath), env=env, capture_output=True, text=True,
        timeout=600)
    if child.returncode != 0 or " passed" not in child.stdout:
        pytest.fail(f"{pyfuncitem.nodeid} under XLA's default CPU code generation (child "
                    f"pytest, exit {child.returncode}):\n{child.stdout[-8000:]}\n"
                    f"{child.stderr[-2000:]}", pytrace=False)
    return True


def pytest_unconfigure(config):
    if _RUN_CACHE_DIR is not None:  # only in the process that made it
        shutil.rmtree(_RUN_CACHE_DIR, ignore_errors=True)


def make_config(env="CartPole-v1", *, num_envs: int = 2, fragment: int = 8,
                hiddens=(16,), seed: int = 0, **env_runners_kwargs) -> jaxrunner.RunnerConfig:
    """A small config: seed 0, few sub-envs, a short fragment and a tiny MLP."""
    return (jaxrunner.RunnerConfig()
            .environment(env)
            .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=fragment,
                         **env_runners_kwargs)
            .rl_module(model_config={"fcnet_hiddens": list(hiddens)})
            .debugging(seed=seed))


@pytest.fixture(scope="module")
def fast_compiles():
    """Compiles with `jax_disable_most_optimizations` while the module runs.

    The contract tests build many small runners, and XLA:CPU compile time dominates their
    run time on a 2-core machine; without LLVM's expensive passes compiles take about
    half as long (the programs then run slower, which these tests do not notice). The
    whole run has it on already (top of this file); the fixture keeps it on for these
    modules when a caller runs the suite with `JAX_DISABLE_MOST_OPTIMIZATIONS=0`. Use it
    with `pytestmark = pytest.mark.usefixtures("fast_compiles")`.
    """
    previous = bool(jax.config.values.get("jax_disable_most_optimizations", False))
    jax.config.update("jax_disable_most_optimizations", True)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", previous)


@pytest.fixture(scope="session")
def cartpole_config():
    """Factory `cartpole_config(num_envs=2, fragment=8, **env_runners_kwargs)`."""
    return make_config


class CompileCounter(logging.Handler):
    """Counts the "Compiling ..." records JAX logs when `jax_log_compiles` is on."""

    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Compiling"):
            self.messages.append(message)

    @property
    def count(self) -> int:
        return len(self.messages)

    def reset(self) -> None:
        self.messages.clear()


@pytest.fixture
def compile_counter():
    """Counts XLA compilations while the test runs (restores the config afterwards)."""
    previous = jax.config.jax_log_compiles
    logger = logging.getLogger("jax")
    previous_level = logger.level
    handler = CompileCounter()
    jax.config.update("jax_log_compiles", True)
    if logger.getEffectiveLevel() > logging.WARNING:
        logger.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous_level)
        jax.config.update("jax_log_compiles", previous)


def all_eqns(jaxpr):
    """Every equation of a jaxpr (`jax.make_jaxpr(...).jaxpr`), those of its sub-jaxprs
    (loop bodies and conditions, `cond` branches, inner `jit`s) included."""
    import jax.extend

    for eqn in jaxpr.eqns:
        yield eqn
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            yield from all_eqns(sub)


def host_tree(tree):
    """A pytree of device arrays on the host, typed PRNG keys as their raw key data."""
    def leaf(x):
        if isinstance(x, jax.Array) and jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            x = jax.random.key_data(x)
        return np.asarray(jax.device_get(x))
    return jax.tree.map(leaf, tree)


def assert_trees_equal(a, b, what: str = "tree") -> None:
    """Same structure and bit-identical leaves."""
    a, b = host_tree(a), host_tree(b)
    assert jax.tree.structure(a) == jax.tree.structure(b), what
    for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(x, y, err_msg=f"{what}{jax.tree_util.keystr(path)}")


def whole_episodes(batches) -> tuple[dict, list]:
    """Joins the chunks of successive timestep-mode batches with `concat_episode`.

    Returns `(by_id, finished)`: every episode (whole so far, a copy: the batches are not
    changed) keyed by id, and the ids of the finished ones. Episodes whose first chunk
    was not in `batches` (t_started > 0 on first sight) are kept under the key
    `("partial", id_)` so callers can skip them.
    """
    by_id: dict = {}
    finished: list = []
    for batch in batches:
        for chunk in batch:
            key = chunk.id_
            if key in by_id and not by_id[key].is_done:
                by_id[key].concat_episode(chunk)
            elif chunk.t_started == 0:
                by_id[key] = copy.deepcopy(chunk)
            else:
                key = ("partial", chunk.id_)
                if key in by_id:
                    by_id[key].concat_episode(chunk)
                else:
                    by_id[key] = copy.deepcopy(chunk)
            if by_id[key].is_done and not isinstance(key, tuple):
                finished.append(key)
    return by_id, finished
