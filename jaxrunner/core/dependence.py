"""Which outputs of a traced function depend on which of its inputs, read from its jaxpr.

It also holds what every jaxpr reader here shares (`trace_abstract`, `open_jaxpr`,
`called_jaxpr`; `core.finiteness` and `core.value_range` use them). The rollout core uses
it to leave out work an env never reads (the per-sub-env step keys
of an env whose step is deterministic) and to see which primitives only an env's
observation needs (`primitives_only_for`); the Navix adapter to see whether a rendering
cache depends on the reset key. The analysis is conservative: an equation that reads a
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


# The params under which call-like equations (jit, closed_call, custom_jvp/vjp,
# checkpoint) hold the jaxpr they call.
CALL_PARAMS = ("jaxpr", "call_jaxpr", "fun_jaxpr")


def _abstract(tree: Any) -> Any:
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(jax.numpy.shape(x), x.dtype)
                        if hasattr(x, "dtype") else x, tree)


def trace_abstract(fn: Callable, *args: Any) -> tuple[Any, Any] | None:
    """`(closed_jaxpr, output_shape)` of `fn(*args)` traced with the arguments' shapes and
    dtypes (arrays, tracers or `jax.ShapeDtypeStruct`s), or None when `fn` cannot be
    traced on its own (the caller keeps its default)."""
    try:
        return jax.make_jaxpr(fn, return_shape=True)(*(_abstract(a) for a in args))
    except Exception:  # noqa: BLE001 - unknown: the caller keeps its default
        return None


def open_jaxpr(closed_or_open: Any) -> tuple[Any, list[Any]]:
    """`(jaxpr, consts)` of a closed jaxpr (its constants' values) or an open one (none)."""
    if hasattr(closed_or_open, "consts"):
        return closed_or_open.jaxpr, list(closed_or_open.consts)
    return closed_or_open, []


def called_jaxpr(eqn: Any) -> tuple[Any, list[Any]] | None:
    """`(jaxpr, consts)` a call-like equation runs on its operands (`CALL_PARAMS`), or
    None for any other equation."""
    for key in CALL_PARAMS:
        if key in eqn.params:
            inner, consts = open_jaxpr(eqn.params[key])
            if hasattr(inner, "eqns") and len(inner.invars) == len(eqn.invars):
                return inner, consts
    return None


def outputs_reading_first(fn: Callable, first: Any, *rest: Any) -> list[Any] | None:
    """The abstract values (`shape`, `dtype`) of the output leaves of `fn(first, *rest)`
    that depend on `first`, traced with the shapes and dtypes of the arguments (arrays,
    tracers or `jax.ShapeDtypeStruct`s); None when `fn` cannot be traced on its own."""
    traced = trace_abstract(fn, first, *rest)
    if traced is None:
        return None
    jaxpr = traced[0].jaxpr
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


def _needed_equations(jaxpr: Any, outvars: Sequence[Any]) -> set[int]:
    """Indices of the equations of `jaxpr` that `outvars` are computed from."""
    needed = {v for v in outvars if not isinstance(v, Literal)}
    equations = set()
    for index in range(len(jaxpr.eqns) - 1, -1, -1):
        eqn = jaxpr.eqns[index]
        if any(v in needed for v in eqn.outvars):
            equations.add(index)
            needed.update(v for v in eqn.invars if not isinstance(v, Literal))
    return equations


def _primitive_names(eqn: Any) -> set[str]:
    """The primitive of `eqn` and every primitive of the jaxprs nested in it."""
    names = {eqn.primitive.name}
    for param in eqn.params.values():
        for sub in param if isinstance(param, (tuple, list)) else (param,):
            inner = getattr(sub, "jaxpr", sub)
            if hasattr(inner, "eqns"):
                for nested in inner.eqns:
                    names |= _primitive_names(nested)
    return names


def primitives_only_for(fn: Callable, wanted: Callable[[Any], Any],
                        others: Callable[[Any], Any], *args: Any) -> set[str] | None:
    """The primitive names (nested jaxprs' included) of the equations of `fn(*args)` that
    the outputs `wanted(outputs)` are computed from and the outputs `others(outputs)` are
    not: the work only `wanted` needs. `wanted` and `others` pick pytrees out of `fn`'s
    output pytree. Traced with the arguments' shapes and dtypes; None when `fn` cannot be
    traced on its own."""
    traced = trace_abstract(fn, *args)
    if traced is None:
        return None
    closed, shape = traced
    jaxpr = closed.jaxpr
    positions = jax.tree.unflatten(jax.tree.structure(shape), range(len(jaxpr.outvars)))

    def pick(select: Callable[[Any], Any]) -> list[Any]:
        return [jaxpr.outvars[i] for i in jax.tree.leaves(select(positions))]

    only = _needed_equations(jaxpr, pick(wanted)) - _needed_equations(jaxpr, pick(others))
    return set().union(*(_primitive_names(jaxpr.eqns[i]) for i in only))


__all__ = ["CALL_PARAMS", "called_jaxpr", "open_jaxpr", "outputs_depend_on",
           "outputs_reading_first", "primitives_only_for", "reads_first_argument",
           "trace_abstract"]
