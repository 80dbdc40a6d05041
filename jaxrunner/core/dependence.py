"""Which outputs of a traced function depend on which of its inputs, read from its jaxpr.

The rollout core uses it to leave out work an env never reads (the per-sub-env step keys
of an env whose step is deterministic); the Navix adapter to see whether a rendering cache
depends on the reset key. The analysis is conservative: an equation that reads a
dependent value makes all its outputs dependent, nested jaxprs (cond, scan, pjit) included,
so "independent" is always true and "dependent" may be a false alarm.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
from jax.extend.core import Literal


def outputs_depend_on(jaxpr: Any, inputs: Sequence[Any]) -> bool:
    """Whether any output of `jaxpr` (a `jax.extend.core.Jaxpr`) depends on the input
    variables `inputs` (some of `jaxpr.invars`)."""
    depends = set(inputs)

    def reads(atoms) -> bool:
        return any(not isinstance(a, Literal) and a in depends for a in atoms)

    for eqn in jaxpr.eqns:
        if reads(eqn.invars):
            depends.update(eqn.outvars)
    return reads(jaxpr.outvars)


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jax.numpy.shape(x), x.dtype)
                        if hasattr(x, "dtype") else x, tree)


def outputs_reading_first(fn: Callable, first: Any, *rest: Any) -> list[Any] | None:
    """The abstract values (`shape`, `dtype`) of the output leaves of `fn(first, *rest)`
    that depend on `first`, traced with the shapes and dtypes of the arguments (arrays,
    tracers or `jax.ShapeDtypeStruct`s); None when `fn` cannot be traced on its own."""
    try:
        closed = jax.make_jaxpr(fn)(_abstract(first), *(_abstract(r) for r in rest))
    except Exception:  # noqa: BLE001 - unknown: the caller keeps its default
        return None
    jaxpr = closed.jaxpr
    first_vars = jaxpr.invars[:len(jax.tree.leaves(first))]
    return [v.aval for v in jaxpr.outvars
            if not isinstance(v, Literal)
            and outputs_depend_on(jaxpr.replace(outvars=[v]), first_vars)]


def reads_first_argument(fn: Callable, first: Any, *rest: Any) -> bool:
    """Whether any output of `fn(first, *rest)` depends on `first` (see
    `outputs_reading_first`). True when `fn` cannot be traced on its own (nothing is
    left out then)."""
    keyed = outputs_reading_first(fn, first, *rest)
    return True if keyed is None else bool(keyed)


__all__ = ["outputs_depend_on", "outputs_reading_first", "reads_first_argument"]
