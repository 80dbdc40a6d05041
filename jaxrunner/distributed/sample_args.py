"""The argument check of `sample()`, run in the driver before anything is sent.

`EnvRunnerGroup.sample()` calls it before submitting remote calls, so a bad argument is
one clear `SampleArgumentError` in the driver, with no remote call made (and no "Unhandled
error" tracebacks from Ray for results nobody fetches). The rules and messages are those
of the runners' own `sample()` check: both sizes given, a size that is not an int >= 0,
`random_actions`/`force_reset` not a bool, `explore` not a bool or None.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxrunner.errors import SampleArgumentError


def check_sample_args(num_timesteps: Any = None, num_episodes: Any = None,
                      explore: Any = None, random_actions: Any = False,
                      force_reset: Any = False) -> None:
    """Raises `SampleArgumentError` (a `ValueError` and an `AssertionError`) if the
    arguments of a `sample()` call break the runner contract; returns None otherwise.

    Args:
        num_timesteps: None or an int >= 0 (numpy integers too; not a bool).
        num_episodes: None or an int >= 0; not together with `num_timesteps`.
        explore: None (the config's `explore`), True or False.
        random_actions: True or False.
        force_reset: True or False.
    """
    if num_timesteps is not None and num_episodes is not None:
        raise SampleArgumentError(
            "Pass either num_timesteps or num_episodes to sample(), not both "
            f"(got num_timesteps={num_timesteps}, num_episodes={num_episodes})."
        )
    for name, value in (("num_timesteps", num_timesteps), ("num_episodes", num_episodes)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise SampleArgumentError(f"{name} must be an int >= 0, got {value!r}.")
        if value < 0:
            raise SampleArgumentError(f"{name} must be >= 0, got {value}.")
    for name, value in (("random_actions", random_actions), ("force_reset", force_reset)):
        if not isinstance(value, bool):
            raise SampleArgumentError(f"{name} must be True or False, got {value!r}.")
    if explore is not None and not isinstance(explore, bool):
        raise SampleArgumentError(f"explore must be True, False or None, got {explore!r}.")


__all__ = ["check_sample_args"]
