"""Which floating outputs of a traced function only ever hold small integers, read from its
jaxpr, and the narrow integer dtype that holds each of them exactly.

A chunk keeps the final observations of the steps that ended an episode in a store
(`core.final_obs`) that every call allocates, fills and hands over. Some envs build their
observation from booleans or small integers (the MinAtar games' `(10, 10, C)` grids are
a boolean grid converted to float32): every value is 0.0 or 1.0, and a `uint8` store
holds it in a quarter of the bytes, widened back to the same float32 values bit for bit
when read. `storage_dtypes` finds those outputs.

The analysis is a conservative forward pass over the jaxpr. Each value is either
"unknown" or an interval `(lo, hi)`: every element is an integer in `[lo, hi]` (for
floating values: exactly, never NaN, infinite, fractional or negative zero). Integer
and boolean values always hold integers of their dtype's range. A float is known only
through a conversion from an integer or boolean value whose whole interval the float type
represents exactly, and then through operations that move, select or compare known values
(reshape, slice, concatenate, gather, select, min/max, ...) or keep integers integers
(floor, round, abs). Float arithmetic, literals holding a fraction or `-0.0`, floating
inputs and unknown primitives make a float unknown. Integer arithmetic is followed by
interval arithmetic (a result that may overflow its dtype gets the dtype's range). Nested
jaxprs (jit, cond, custom derivatives, scan and while loops, widened to a fixed point)
are followed. Pure: jaxprs in, dtypes out.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import Literal

from jaxrunner.core.dependence import called_jaxpr, open_jaxpr, trace_abstract

Interval = Optional[tuple]  # (lo, hi) python ints, or None: unknown

# Outputs that hold only values of their data operands (positions), element for element.
_MOVES = {name: (0,) for name in (
    "broadcast_in_dim", "copy", "copy_p", "device_put", "dynamic_slice", "expand_dims",
    "reshape", "rev", "sharding_constraint", "slice", "squeeze", "stop_gradient",
    "transpose", "reduce_max", "reduce_min")}
_MOVES.update({"dynamic_update_slice": (0, 1), "pad": (0, 1), "scatter": (0, 2), "split": (0,)})
_JOINS = ("concatenate", "stack")  # every operand is data
# Integer-preserving on a known operand (an integer stays the same integer).
_INTEGER_IDENTITIES = ("floor", "ceil", "round")
# Narrow dtypes a float leaf may be stored in, narrowest first.
NARROW_CANDIDATES = (jnp.uint8, jnp.int8, jnp.uint16, jnp.int16)


def _dtype(aval: Any) -> Any:
    return getattr(aval, "dtype", None)


def _is_float(dtype: Any) -> bool:
    return dtype is not None and jnp.issubdtype(dtype, jnp.inexact)


def _dtype_range(dtype: Any) -> Interval:
    """The interval every value of an integer or boolean dtype is in; None for others."""
    if dtype is None:
        return None
    if dtype == jnp.bool_:
        return (0, 1)
    if jnp.issubdtype(dtype, jnp.integer):
        info = jnp.iinfo(dtype)
        return (int(info.min), int(info.max))
    return None


def _exact_limit(dtype: Any) -> int:
    """The largest integer magnitude up to which every integer is exact in float `dtype`."""
    return 2 ** (jnp.finfo(dtype).nmant + 1)


def _fit(interval: Interval, dtype: Any) -> Interval:
    """`interval` as a value of `dtype` holds it: itself if `dtype` represents every
    integer in it exactly, else the dtype's own range (integers) or unknown (floats)."""
    if dtype is None:
        return None
    if interval is not None:
        lo, hi = interval
        if _is_float(dtype):
            if max(abs(lo), abs(hi)) <= _exact_limit(dtype):
                return interval
        else:
            full = _dtype_range(dtype)
            if full is not None and full[0] <= lo and hi <= full[1]:
                return interval
    return None if _is_float(dtype) else _dtype_range(dtype)


def _join(*intervals: Interval) -> Interval:
    if not intervals or any(i is None for i in intervals):
        return None
    return (min(i[0] for i in intervals), max(i[1] for i in intervals))


def _value_interval(value: Any) -> Interval:
    """The interval of a concrete value (a literal or constant), None if not one."""
    try:
        array = np.asarray(value)
    except Exception:  # noqa: BLE001 - not concrete (a tracer): unknown
        return None
    if array.size == 0:
        return _dtype_range(array.dtype) if not _is_float(array.dtype) else None
    if _is_float(array.dtype):
        if not np.all(np.isfinite(array)) or np.any(array != np.round(array)):
            return None
        if np.any((array == 0) & np.signbit(array)):  # -0.0 would widen back to +0.0
            return None
    if not (array.dtype == np.bool_ or np.issubdtype(array.dtype, np.number)):
        return None
    if np.iscomplexobj(array):
        return None
    return (int(array.min()), int(array.max()))


def _open(closed_or_open: Any) -> tuple[Any, list[Interval]]:
    """`(jaxpr, const_intervals)` of a closed or open jaxpr."""
    jaxpr, consts = open_jaxpr(closed_or_open)
    return jaxpr, [_value_interval(c) for c in consts]


def _arithmetic(name: str, a: Interval, b: Interval) -> Interval:
    """Interval arithmetic on integer operands (None: not an arithmetic rule)."""
    if a is None or b is None:
        return None
    if name == "add":
        return (a[0] + b[0], a[1] + b[1])
    if name == "sub":
        return (a[0] - b[1], a[1] - b[0])
    if name == "mul":
        corners = [x * y for x in a for y in b]
        return (min(corners), max(corners))
    return None


def output_intervals(jaxpr: Any, consts: Sequence[Interval] = (),
                     inputs: Sequence[Interval] | None = None) -> list[Interval]:
    """For each output of `jaxpr` (a `jax.extend.core.Jaxpr`), its interval when its
    constvars are in `consts` and its inputs in `inputs` (None for all, or for one: the
    dtype's range for integers and booleans, unknown for floats)."""
    inputs = [None] * len(jaxpr.invars) if inputs is None else inputs
    known: dict[Any, Interval] = {}
    for var, interval in list(zip(jaxpr.constvars, consts)) + list(zip(jaxpr.invars, inputs)):
        known[var] = _fit(interval, _dtype(var.aval))

    def of(atom: Any) -> Interval:
        if isinstance(atom, Literal):
            return _fit(_value_interval(atom.val), _dtype(atom.aval))
        return known.get(atom, _fit(None, _dtype(atom.aval)))

    for eqn in jaxpr.eqns:
        results = _equation(eqn, [of(a) for a in eqn.invars])
        for var, interval in zip(eqn.outvars, results):
            known[var] = _fit(interval, _dtype(var.aval))
    return [of(v) for v in jaxpr.outvars]


def _equation(eqn: Any, operands: list[Interval]) -> list[Interval]:
    name, params = eqn.primitive.name, eqn.params
    count = len(eqn.outvars)
    out_dtype = _dtype(eqn.outvars[0].aval)
    if name == "convert_element_type":
        return [operands[0]]  # `_fit` to the target dtype
    if name in ("reduce_max", "reduce_min", "argmax", "argmin") and any(
            eqn.invars[0].aval.shape[axis] == 0 for axis in params.get("axes", ())):
        return [None] * count  # an empty reduction gives its identity (+-inf)
    if name in _MOVES:
        return [_join(*(operands[i] for i in _MOVES[name]))] * count
    if name in _JOINS:
        return [_join(*operands)] * count
    if name in ("max", "min", "clamp") and all(o is not None for o in operands):
        if name == "clamp":  # clamp(low, x, high) = min(max(x, low), high)
            low, x, high = operands
            x = (max(x[0], low[0]), max(x[1], low[1]))
            return [(min(x[0], high[0]), min(x[1], high[1]))]
        pick = max if name == "max" else min
        return [(pick(o[0] for o in operands), pick(o[1] for o in operands))]
    if name == "select_n":  # operand 0 picks among the others
        return [_join(*operands[1:])]
    if name == "gather":  # out-of-bounds rows in "fill" mode read the fill value
        if "FILL" not in str(params.get("mode", "")):
            return [operands[0]]
        fill = params.get("fill_value")
        # The default fill: NaN for floats, an extreme of the dtype for integers.
        return [_join(operands[0], _fit(None, out_dtype) if fill is None
                      else _value_interval(fill))]
    if name == "sort":  # a permutation of each operand
        return list(operands[:count])
    if name in ("optimization_barrier",):
        return list(operands[:count])
    if name == "iota":
        return [(0, max(0, int(params["shape"][params["dimension"]]) - 1))]
    if name in _INTEGER_IDENTITIES:
        return [operands[0]]
    if name == "abs" and operands[0] is not None:
        lo, hi = operands[0]
        return [(0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi)))]
    if not _is_float(out_dtype):  # integer arithmetic: intervals (then fit to the dtype)
        if name == "neg" and operands[0] is not None:
            return [(-operands[0][1], -operands[0][0])]
        if name in ("add", "sub", "mul") and len(operands) == 2:
            return [_arithmetic(name, *operands)]
    if name == "cond":  # operands: the branch index, then the branches' arguments
        per_branch = [output_intervals(*_open(branch), inputs=operands[1:])
                      for branch in params["branches"]]
        return [_join(*(b[i] for b in per_branch)) for i in range(count)]
    if name == "scan":
        body, consts = _open(params["jaxpr"])
        fixed, carries = params["num_consts"], params["num_carry"]
        return _loop(lambda carry: output_intervals(
            body, consts, inputs=operands[:fixed] + carry + operands[fixed + carries:]),
            operands[fixed:fixed + carries], [_dtype(v.aval) for v in body.invars[
                fixed:fixed + carries]], count)
    if name == "while":
        body, consts = _open(params["body_jaxpr"])
        skip, fixed = params["cond_nconsts"], params["body_nconsts"]
        body_consts = operands[skip:skip + fixed]
        return _loop(lambda carry: output_intervals(body, consts,
                                                    inputs=body_consts + carry),
                     operands[skip + fixed:], [_dtype(v.aval) for v in body.invars[fixed:]],
                     count)
    called = called_jaxpr(eqn)  # jit, closed_call, custom_jvp/vjp, checkpoint
    if called is not None:
        inner, consts = called
        return output_intervals(inner, [_value_interval(c) for c in consts],
                                inputs=operands)
    return [None] * count  # unknown primitive: the output dtype's range, or unknown


def _loop(body: Callable[[list[Interval]], list[Interval]], carry: list[Interval],
          dtypes: list[Any], count: int, rounds: int = 3) -> list[Interval]:
    """A loop's outputs (carry first, then per-step outputs for a scan). The carry's
    intervals grow (join with the body's) for `rounds` rounds; a carry still growing then
    is widened to its dtype's range (unknown for floats), after which nothing grows."""
    carry = [_fit(c, d) for c, d in zip(carry, dtypes)]
    for attempt in range(rounds + 2):
        out = body(carry)
        grown = [_fit(_join(c, o), d) for c, o, d in zip(carry, out[:len(carry)], dtypes)]
        if grown == carry:
            return carry + list(out[len(carry):count])
        if attempt >= rounds:
            grown = [g if g == c else _fit(None, d) for g, c, d in zip(grown, carry, dtypes)]
        carry = grown
    return [None] * count


def narrow_dtype(dtype: Any, interval: Interval) -> Any:
    """The narrowest of `NARROW_CANDIDATES` narrower than float `dtype` that holds every
    integer of `interval`, or None."""
    if interval is None or not _is_float(dtype):
        return None
    for candidate in NARROW_CANDIDATES:
        info = jnp.iinfo(candidate)
        if (jnp.dtype(candidate).itemsize < jnp.dtype(dtype).itemsize
                and info.min <= interval[0] and interval[1] <= info.max):
            return jnp.dtype(candidate)
    return None


def output_storage_dtypes(closed: Any) -> list[Any]:
    """For each output of the closed jaxpr `closed`, whatever its inputs: the narrow
    integer dtype that holds every value of a floating output exactly (`narrow_dtype`),
    or the output's own dtype."""
    jaxpr, consts = _open(closed)
    return [narrow_dtype(_dtype(v.aval), interval) or jnp.dtype(_dtype(v.aval))
            for v, interval in zip(jaxpr.outvars, output_intervals(jaxpr, consts))]


def storage_dtypes(fn: Callable, *args: Any) -> Any:
    """A pytree like `fn(*args)`'s output of dtypes (`output_storage_dtypes`): for each
    floating leaf that only ever holds integers a narrower integer dtype holds exactly
    (whatever the arguments' values), that dtype; for every other leaf its own dtype.
    Traced with the arguments' shapes and dtypes (arrays, tracers or
    `jax.ShapeDtypeStruct`s); None when `fn` cannot be traced on its own."""
    traced = trace_abstract(fn, *args)
    if traced is None:
        return None
    closed, shape = traced
    return jax.tree.unflatten(jax.tree.structure(shape), output_storage_dtypes(closed))


__all__ = ["NARROW_CANDIDATES", "narrow_dtype", "output_intervals", "output_storage_dtypes",
           "storage_dtypes"]
