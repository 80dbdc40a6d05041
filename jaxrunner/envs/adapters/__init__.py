"""Adapters from the JAX env suites to jaxrunner's one env protocol.

Each suite's env object becomes a gymnax 1.0 `Environment` (a `SuiteAdapter`: `reset(key,
params)`, `step(key, state, action, params) -> (obs, state, reward, terminated, truncated,
info)` with same-step auto-reset from a fresh random reset and `info["final_observation"]`,
gymnax spaces), or, for pgx games of two or more players, a turn-based
`jaxrunner.envs.multi_agent.MultiAgentEnv`. Envs with a legal-action mask have
`action_mask(state, params) -> bool[n]`.

Two ways in, both from `config.environment(...)` through `jaxrunner.envs.registry`:

* `adapt(env, params)`: an env object of a suite (given directly, or returned by a creator)
  is recognised by the package its class comes from and adapted; envs with gymnax's
  pre-1.0 step API (a 5-tuple) become `LegacyGymnaxEnv`; anything else is returned as is.
* `make_suite_env("<prefix>/<id>", env_context)`: a prefixed name, `env_config` passed to
  the suite's own constructor.

| prefix | package (`pip install`) | jaxrunner extra | adapter |
|---|---|---|---|
| `brax/` | `brax` | `jaxrunner[brax]` | `BraxEnv` |
| `playground/` | `playground` | `jaxrunner[playground]` | `PlaygroundEnv` |
| `craftax/` | `craftax` | `jaxrunner[craftax]` | `CraftaxEnv` |
| `jumanji/` | `jumanji` | `jaxrunner[jumanji]` | `JumanjiEnv` |
| `navix/` | `navix` | `jaxrunner[navix]` | `NavixEnv` |
| `xminigrid/` | `xminigrid` | `jaxrunner[xminigrid]` | `XMiniGridEnv` |
| `pgx/` | `pgx` | `jaxrunner[pgx]` | `PgxEnv` (1 player) / `PgxMultiAgentEnv` |
| `kinetix/` | `kinetix-env` | none: all releases pin `jax<=0.9.0` | none (`docs/env_suites.md`) |
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib
import importlib.util
from typing import Any, Callable

from jaxrunner.envs.adapters.base import NoParams, SuiteAdapter, SuiteState


@dataclasses.dataclass(frozen=True)
class Suite:
    """One env suite.

    Attributes:
        prefix: the name prefix without the slash ("brax").
        package: the import name of the suite's package ("mujoco_playground").
        pip_name: what to `pip install` ("playground").
        adapter_module: the adapter's module under `jaxrunner.envs.adapters`, or None when
            the suite cannot be adapted in this environment.
        note: why there is no adapter, when there is none.
    """

    prefix: str
    package: str
    pip_name: str
    adapter_module: str | None
    note: str = ""

    @property
    def installed(self) -> bool:
        return importlib.util.find_spec(self.package) is not None

    @property
    def install_hint(self) -> str:
        if self.adapter_module is None:
            return self.note
        return f"pip install 'jaxrunner[{self.prefix}]' (or pip install {self.pip_name})"

    def module(self):
        if self.adapter_module is None:
            raise ValueError(f"'{self.prefix}/...' envs are not supported: {self.note}")
        if not self.installed:
            raise ImportError(
                f"'{self.prefix}/...' envs need the {self.pip_name!r} package, which is not "
                f"installed: {self.install_hint}."
            )
        return importlib.import_module(f"jaxrunner.envs.adapters.{self.adapter_module}")

    def env_ids(self) -> list[str]:
        """Every id of the suite (imports it)."""
        return list(self.module().env_ids())


KINETIX_NOTE = ("no kinetix-env release installs beside jax 0.10: kinetix-env 2.0.4 to 3.0.2 "
                "(the newest) require jax<=0.9.0, 1.0.5 to 2.0.3 jax<0.6.0, 1.0.0 to 1.0.2 "
                "jax==0.4.37, so pip would downgrade the JAX jaxrunner is tested with "
                "(jax2d, its physics engine, pins no jax but has no envs); there is no "
                "kinetix/ adapter until a kinetix-env release allows jax 0.10")

SUITES: dict[str, Suite] = {s.prefix: s for s in (
    Suite("brax", "brax", "brax", "brax"),
    Suite("playground", "mujoco_playground", "playground", "playground"),
    Suite("craftax", "craftax", "craftax", "craftax"),
    Suite("jumanji", "jumanji", "jumanji", "jumanji"),
    Suite("navix", "navix", "navix", "navix"),
    Suite("xminigrid", "xminigrid", "xminigrid", "xminigrid"),
    Suite("pgx", "pgx", "pgx", "pgx"),
    Suite("kinetix", "kinetix", "kinetix-env", None, KINETIX_NOTE),
)}

# The top-level package an env object's class comes from -> its suite prefix.
_PACKAGE_TO_SUITE = {s.package: s.prefix for s in SUITES.values()}


def suite_prefix_of(name: Any) -> str | None:
    """The suite prefix of a name like `"brax/ant"`, or None for other names."""
    if isinstance(name, str) and "/" in name:
        prefix = name.split("/", 1)[0]
        if prefix in SUITES:
            return prefix
    return None


def suite_of_object(env: Any) -> str | None:
    """The suite prefix of an env object, read from the package of its class or of a base
    class (so a user's subclass of a Brax env is a Brax env)."""
    if isinstance(env, type):
        return None
    for cls in type(env).__mro__:
        prefix = _PACKAGE_TO_SUITE.get(cls.__module__.split(".", 1)[0])
        if prefix is not None:
            return prefix
    return None


def is_adapted(env: Any) -> bool:
    """Whether `env` is already one of this package's adapters."""
    from jaxrunner.envs.adapters.pgx import PgxMultiAgentEnv

    return isinstance(env, (SuiteAdapter, PgxMultiAgentEnv))


def make_suite_env(name: str, env_context: Any) -> tuple[Any, Any]:
    """`(env, env_params)` for `"<prefix>/<id>"`; `env_context` (a dict: `env_config`) goes to
    the suite's own constructor.

    Raises:
        ValueError: the prefix is not a suite's, the id is not one of the suite's (with the
            close matches), or the suite rejected `env_config`.
        ImportError: the suite's package is not installed (with the pip command).
    """
    prefix = suite_prefix_of(name)
    if prefix is None:
        raise ValueError(f"{name!r} has no suite prefix; the prefixes are "
                         f"{[p + '/' for p in SUITES]}.")
    env_id = name.split("/", 1)[1]
    suite = SUITES[prefix]
    module = suite.module()
    ids = list(module.env_ids())
    if env_id not in ids:
        matches = difflib.get_close_matches(env_id, ids, n=3, cutoff=0.5)
        hint = (" Did you mean " + " or ".join(repr(f"{prefix}/{m}") for m in matches)
                + "?") if matches else ""
        raise ValueError(f"Unknown {prefix} env {env_id!r}.{hint} Run `jaxrunner envs` to "
                         f"list every {prefix} id.")
    return module.make(env_id, dict(env_context or {}))


def adapt(env: Any, params: Any = None) -> tuple[Any, Any]:
    """`(env, params)` normalised to the env protocol.

    A suite's env object gets its adapter (xminigrid's `params` are kept; the other suites
    take none); an env with gymnax's pre-1.0 step API gets `LegacyGymnaxEnv`; gymnax 1.0
    envs, jaxrunner's own envs and adapted envs are returned unchanged. `params` is None
    to use the adapted env's `default_params`.
    """
    from jaxrunner.envs.multi_agent import MultiAgentEnv

    if is_adapted(env) or isinstance(env, (type, MultiAgentEnv)):
        return env, params if params is not None else getattr(env, "default_params", None)
    prefix = suite_of_object(env)
    if prefix is not None and SUITES[prefix].adapter_module is not None:
        module = SUITES[prefix].module()
        adapted = _ADAPT_OBJECT[prefix](module, env, params)
        return adapted, (params if prefix in _KEEPS_PARAMS and params is not None
                         else adapted.default_params)
    from jaxrunner.envs.adapters.gymnax_legacy import LegacyGymnaxEnv, is_legacy_gymnax_env

    if is_legacy_gymnax_env(env):
        adapted = LegacyGymnaxEnv(env, params)
        return adapted, adapted.default_params
    return env, params


_ADAPT_OBJECT: dict[str, Callable[[Any, Any, Any], Any]] = {
    "brax": lambda m, env, params: m.BraxEnv(env),
    "playground": lambda m, env, params: m.PlaygroundEnv(env),
    "craftax": lambda m, env, params: m.CraftaxEnv(env, params),
    "jumanji": lambda m, env, params: m.JumanjiEnv(env),
    "navix": lambda m, env, params: m.NavixEnv(env),
    "xminigrid": lambda m, env, params: m.XMiniGridEnv(env, params),
    "pgx": lambda m, env, params: m.adapt(env),
}
_KEEPS_PARAMS = {"craftax", "xminigrid"}


def suite_report() -> list[dict]:
    """One row per suite: prefix, pip name, installed, supported, how to add it."""
    return [dict(prefix=s.prefix, pip_name=s.pip_name, installed=s.installed,
                 supported=s.adapter_module is not None, install_hint=s.install_hint)
            for s in SUITES.values()]


@functools.lru_cache(maxsize=1)
def suite_env_rows() -> tuple[list[dict], list[dict]]:
    """`(rows, missing)` for `jaxrunner envs` (computed once per process: it imports every
    installed suite).

    rows: `{"id": "<prefix>/<id>", "source": prefix, "kind": "single_agent" |
    "multi_agent"}` for every id of every installed suite. missing: `{"prefix", "reason"}`
    for each suite that is not installed (the reason says how to add it), is not supported
    here, or failed to list its ids.
    """
    from jaxrunner.envs.kind import MULTI_AGENT, SINGLE_AGENT

    rows, missing = [], []
    for suite in SUITES.values():
        if suite.adapter_module is None or not suite.installed:
            reason = suite.install_hint if suite.adapter_module is None else (
                f"not installed: {suite.install_hint}")
            missing.append({"prefix": suite.prefix, "reason": reason})
            continue
        try:
            ids = suite.env_ids()
            module = suite.module()
            multi = set(module.multi_player_ids()) if hasattr(module, "multi_player_ids") \
                else set()
        except Exception as error:  # noqa: BLE001 - a broken install is reported, not fatal
            missing.append({"prefix": suite.prefix,
                            "reason": f"installed but failed to list its envs: "
                                      f"{type(error).__name__}: {error}"})
            continue
        rows += [{"id": f"{suite.prefix}/{i}", "source": suite.prefix,
                  "kind": MULTI_AGENT if i in multi else SINGLE_AGENT} for i in ids]
    return rows, missing


__all__ = ["KINETIX_NOTE", "NoParams", "SUITES", "Suite", "SuiteAdapter", "SuiteState",
           "adapt", "is_adapted", "make_suite_env", "suite_of_object", "suite_prefix_of",
           "suite_env_rows", "suite_report"]
