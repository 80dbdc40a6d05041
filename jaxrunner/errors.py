"""Exceptions users raise or catch."""


class StepFailedRecreateEnvError(Exception):
    """Raise from an env's `step()` to have the runner recreate the env without logging.

    As in RLlib: with `fault_tolerance(restart_failed_sub_environments=True)`, the runner
    recreates the env, discards the episode in progress and carries on; this error type is
    counted in `num_env_step_failures` but not logged.
    """


class SampleArgumentError(ValueError, AssertionError):
    """Bad arguments to `sample()` (both sizes, a negative size, ...).

    A `ValueError`, and also an `AssertionError` so code written against RLlib's runner
    (which asserts on these arguments) catches it unchanged.
    """


class StateStructureError(ValueError):
    """`set_state()` got a state whose structure or shapes do not fit the runner."""
