"""Which floating outputs of a traced function can never be NaN or infinite, read from its
jaxpr.

The fault check (`core.faults.step_failed` with `check_finite`) tests every floating
value of each sub-env's observation and reward at every step. Some envs build their
observation from integers or booleans (the MinAtar games' `(10, 10, C)` grids are a
boolean grid converted to float32): such an observation is finite by construction, and
testing its 400 values a sub-env a step is memory traffic for a verdict known in advance.
`provably_finite` finds those outputs so the check leaves them out.

The analysis is conservative, like `core.dependence`'s: an output is "finite" only when
every value it is computed from is, through operations that cannot produce a NaN or an
infinity from finite operands (moves, selects, comparisons, min/max, rounding, bounded
functions like tanh; conversions to a float type wide enough for the source). Arithmetic
that can overflow (add, multiply, exp, ...) and unknown primitives make an output "maybe
not finite"; floating inputs are "maybe not finite". Nested jaxprs (jit, cond, custom
derivatives, scan and while loops, to a fixed point) are followed. Pure: jaxprs in,
booleans out.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal

from jaxrunner.core.dependence import called_jaxpr, open_jaxpr, trace_abstract

# Outputs finite whenever every floating operand is finite.
PRESERVING_PRIMITIVES = frozenset({
    "abs", "argmax", "argmin", "atan2", "broadcast_in_dim", "ceil", "clamp", "concatenate",
    "copy", "copy_p", "cos", "device_put", "dynamic_slice", "dynamic_update_slice",
    "expand_dims", "floor", "gather", "iota", "logistic", "max", "min", "neg", "pad",
    "reduce_max", "reduce_min", "reshape", "rev", "round", "scatter", "select_n",
    "sharding_constraint", "sign", "sin", "slice", "sort", "squeeze", "stop_gradient",
    "tanh", "transpose", "optimization_barrier",
})


def _is_float(aval: Any) -> bool:
    dtype = getattr(aval, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jnp.inexact)


def _value_finite(value: Any) -> bool:
    try:
        array = np.asarray(value)
    except Exception:  # noqa: BLE001 - not concrete (a tracer): unknown
        return False
    return not jnp.issubdtype(array.dtype, jnp.inexact) or bool(np.all(np.isfinite(array)))


def _conversion_finite(source: Any, target: Any) -> bool:
    """Whether converting any finite value of dtype `source` to `target` stays finite."""
    if not jnp.issubdtype(target, jnp.inexact):
        return True
    if source == jnp.bool_:
        return True
    high = (jnp.iinfo(source).max if jnp.issubdtype(source, jnp.integer)
            else jnp.finfo(source).max)
    return float(jnp.finfo(target).max) >= float(high)


def _open(closed_or_open: Any) -> tuple[Any, list[bool]]:
    """`(jaxpr, consts_finite)` of a closed or open jaxpr."""
    jaxpr, consts = open_jaxpr(closed_or_open)
    return jaxpr, [_value_finite(c) for c in consts]


def outputs_finite(jaxpr: Any, inputs_finite: Sequence[bool],
                   consts_finite: Sequence[bool] = ()) -> list[bool]:
    """For each output of `jaxpr` (a `jax.extend.core.Jaxpr`), whether it is finite for
    every input that is finite where `inputs_finite` says so (`consts_finite` for its
    constvars). Non-floating values are always finite."""
    finite: dict[Any, bool] = {}
    for var, known in zip(jaxpr.constvars, consts_finite):
        finite[var] = known or not _is_float(var.aval)
    for var, known in zip(jaxpr.invars, inputs_finite):
        finite[var] = known or not _is_float(var.aval)

    def of(atom: Any) -> bool:
        if isinstance(atom, Literal):
            return _value_finite(atom.val)
        return finite.get(atom, not _is_float(atom.aval))

    for eqn in jaxpr.eqns:
        operands = [of(a) for a in eqn.invars]
        results = _equation(eqn, operands)
        for var, known in zip(eqn.outvars, results):
            finite[var] = known or not _is_float(var.aval)
    return [of(v) for v in jaxpr.outvars]


def _equation(eqn: Any, operands: list[bool]) -> list[bool]:
    name, params = eqn.primitive.name, eqn.params
    count = len(eqn.outvars)
    if name == "convert_element_type":
        source = eqn.invars[0].aval.dtype
        return [operands[0] and _conversion_finite(source, params["new_dtype"])]
    if name in PRESERVING_PRIMITIVES:
        return [all(operands)] * count
    if name == "cond":  # operands: the branch index, then the branches' arguments
        per_branch = []
        for branch in params["branches"]:
            inner, consts = _open(branch)
            per_branch.append(outputs_finite(inner, operands[1:], consts))
        return [all(b[i] for b in per_branch) for i in range(count)]
    if name == "scan":
        body, consts = _open(params["jaxpr"])
        fixed, carries = params["num_consts"], params["num_carry"]
        return _loop(lambda carry: outputs_finite(
            body, operands[:fixed] + carry + operands[fixed + carries:], consts),
            operands[fixed:fixed + carries], count)
    if name == "while":
        body, consts = _open(params["body_jaxpr"])
        skip = params["cond_nconsts"]
        fixed = params["body_nconsts"]
        body_consts = operands[skip:skip + fixed]
        return _loop(lambda carry: outputs_finite(body, body_consts + carry, consts),
                     operands[skip + fixed:], count)
    called = called_jaxpr(eqn)  # jit, closed_call, custom_jvp/vjp, checkpoint
    if called is not None:
        inner, consts = called
        return outputs_finite(inner, operands, [_value_finite(c) for c in consts])
    return [False] * count


def _loop(body: Callable[[list[bool]], list[bool]], carry: list[bool], count: int
          ) -> list[bool]:
    """A loop's outputs (carry first, then per-step outputs for a scan): the carry's
    finiteness is the fixed point of `body` from the initial carry (it can only drop, so
    at most `len(carry)` rounds)."""
    carry = list(carry)
    for _ in range(len(carry) + 1):
        out = body(carry)
        new = [c and o for c, o in zip(carry, out[:len(carry)])]
        if new == carry:
            return carry + out[len(carry):count]
        carry = new
    return [False] * count


def finite_outputs(closed: Any) -> list[bool]:
    """For each output of the closed jaxpr `closed`, whether it is finite whatever its
    inputs (non-floating outputs always are)."""
    jaxpr, consts = _open(closed)
    return outputs_finite(jaxpr, [False] * len(jaxpr.invars), consts)


def provably_finite(fn: Callable, *args: Any) -> Any:
    """A pytree like `fn(*args)`'s output of bools: True for the leaves that are finite
    whatever the arguments' values (non-floating leaves are always True). Traced with the
    arguments' shapes and dtypes (arrays, tracers or `jax.ShapeDtypeStruct`s); None when
    `fn` cannot be traced on its own."""
    traced = trace_abstract(fn, *args)
    if traced is None:
        return None
    closed, shape = traced
    return jax.tree.unflatten(jax.tree.structure(shape), finite_outputs(closed))


__all__ = ["PRESERVING_PRIMITIVES", "finite_outputs", "outputs_finite", "provably_finite"]
