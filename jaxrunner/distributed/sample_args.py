"""The argument check of `sample()`, run in the driver before anything is sent.

`EnvRunnerGroup.sample()` calls it before submitting remote calls, so a bad argument is
one clear `SampleArgumentError` in the driver, with no remote call made (and no "Unhandled
error" tracebacks from Ray for results nobody fetches). It is the runners' own check
(`jaxrunner.runners.compiled_runner.check_sample_args`), not a copy.
"""

from jaxrunner.runners.compiled_runner import check_sample_args as check_sample_args

__all__ = ["check_sample_args"]
