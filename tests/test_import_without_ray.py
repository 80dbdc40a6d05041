"""`import jaxrunner` and a local runner work without Ray; Ray is imported only by
`jaxrunner.distributed` (and the RLlib drop-in `jaxrunner.rllib`), and
`jaxrunner.EnvRunnerGroup` is resolved on first use."""

from __future__ import annotations

import ast
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

import jaxrunner

PACKAGE = pathlib.Path(jaxrunner.__file__).parent
# Where Ray may be imported: the distributed package and the RLlib drop-in.
RAY_PACKAGES = ("distributed", "rllib")

# Makes every `import ray` / `import ray.x` in the child fail, as on a machine without Ray
# (a meta-path finder first, so an installed Ray is never found).
_NO_RAY = textwrap.dedent("""
    import importlib.abc, sys

    class NoRay(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "ray" or name.startswith("ray."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoRay())
""")


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _NO_RAY + textwrap.dedent(code)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "JAX_PLATFORMS": "cpu"})


def test_import_and_local_runner__work_without_ray():
    result = _run("""
        import sys
        import jaxrunner
        assert not any(m == "ray" or m.startswith("ray.") for m in sys.modules), sorted(
            m for m in sys.modules if m.startswith("ray"))
        assert "EnvRunnerGroup" in jaxrunner.__all__ and "EnvRunnerGroup" in dir(jaxrunner)
        config = (jaxrunner.RunnerConfig().environment("CartPole-v1")
                  .env_runners(num_envs_per_env_runner=4, rollout_fragment_length=8)
                  .rl_module(model_config={"fcnet_hiddens": [8]}).debugging(seed=0))
        runner = jaxrunner.SingleAgentEnvRunner(config=config)
        batch = runner.sample()
        assert batch.env_steps == 32, batch.env_steps
        for episode in batch:
            episode.validate()
        assert runner.get_metrics()["num_env_steps_sampled"] == 32
        assert not any(m == "ray" or m.startswith("ray.") for m in sys.modules)
        try:
            jaxrunner.EnvRunnerGroup
        except ImportError as error:
            print("IMPORT-ERROR:", error)
        else:
            raise SystemExit("jaxrunner.EnvRunnerGroup resolved without Ray")
        print("OK")
    """)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "OK" in result.stdout
    message = next(line for line in result.stdout.splitlines()
                   if line.startswith("IMPORT-ERROR:"))
    # What is wrong, how to fix it, and what works without Ray.
    assert "needs Ray" in message and 'pip install "ray' in message
    assert "SingleAgentEnvRunner" in message


def test_lazy_group__is_the_distributed_class_and_unknown_names_are_attribute_errors():
    from jaxrunner.distributed import EnvRunnerGroup

    assert jaxrunner.EnvRunnerGroup is EnvRunnerGroup
    assert "EnvRunnerGroup" in dir(jaxrunner)
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        jaxrunner.NoSuchThing  # noqa: B018


def _ray_imports(path: pathlib.Path) -> list[tuple[int, bool]]:
    """`(line, at module level)` of every import of ray in `path`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module or ""]
        else:
            continue
        if any(name == "ray" or name.startswith("ray.") for name in names):
            found.append((node.lineno, id(node) in top_level))
    return found


def test_ray__imported_at_module_level_only_in_distributed_and_rllib():
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in RAY_PACKAGES:
            continue
        offenders += [f"{relative}:{line}" for line, top in _ray_imports(path) if top]
    assert offenders == [], ("Ray must be imported only in jaxrunner/distributed/ (or "
                             f"jaxrunner/rllib/): {offenders}")
    # The check sees what it looks for.
    assert any(top for _, top in _ray_imports(PACKAGE / "distributed" / "remote_runner.py"))
