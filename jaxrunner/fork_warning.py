"""JAX's `os.fork()` warning, silenced for `subprocess` children only.

gymnax creates JAX arrays when it is imported, so after `import jaxrunner` a JAX backend
exists and JAX's fork handler warns ("os.fork() was called ... will likely lead to a
deadlock") at every fork. `subprocess.Popen(..., preexec_fn=...)`, which `ray.init()` uses
to start Ray's own processes, runs the fork handlers too, but its child only runs that
function and then exec()s a new program: JAX never runs in it. JAX attributes the warning to
the frame that forked, so a filter on the `subprocess` module matches exactly these forks; a
real `os.fork()` of a process that keeps running (e.g. multiprocessing's "fork" start
method) still warns.
"""

from __future__ import annotations

import warnings

FORK_WARNING = r"os\.fork\(\) was called"


def ignore_subprocess_fork_warning() -> None:
    """Adds a warnings filter that ignores JAX's fork warning raised from `subprocess`."""
    warnings.filterwarnings("ignore", message=FORK_WARNING, category=RuntimeWarning,
                            module=r"subprocess\Z")


__all__ = ["FORK_WARNING", "ignore_subprocess_fork_warning"]
