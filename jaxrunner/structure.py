"""Comparing the structure of state pytrees, and checking their values are finite.

One place answers "does this state fit that one?" for every caller that receives state
from outside (`set_state`, checkpoints, RLlib weight translation):

* `structure_differences(expected, given)` lists every `Difference` between two pytrees:
  a missing or unexpected key, a node of another kind (a dict where an array was
  expected, a tuple of another length), an array of another shape or dtype; each names
  its tree path in `jax.tree_util.keystr` notation (`['rl_module']['pi']['Dense_0']
  ['kernel']`, `.env_state.obs`, `[0]`).
* `structure_diff(expected, given)` is the same list as human-readable strings;
* `check_same_structure(expected, given, what)` raises `StateStructureError` listing them.
* `check_finite_tree(tree, what)` raises `ValueError` naming the first leaf holding a NaN
  or an infinity.

Leaves are arrays (numpy, JAX, or anything with `shape` and `dtype`, such as a torch
tensor or a `jax.ShapeDtypeStruct`), Python scalars, strings and `None`. Containers are
mappings (compared by key, whatever their type: a `dict` and a Flax `FrozenDict` with the
same keys match) and every other registered pytree node (tuples, lists, NamedTuples,
`flax.struct` dataclasses: compared by node type and children).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import numpy as np

from jaxrunner.errors import StateStructureError

#: Ways `structure_differences` compares leaf dtypes.
DTYPE_RULES = ("exact", "same_kind", "ignore")

_MISSING, _UNEXPECTED, _NODE, _SHAPE, _DTYPE = ("missing", "unexpected", "node", "shape",
                                                "dtype")
_ROOT = "<root>"


class Difference(NamedTuple):
    """One way `given` differs from `expected`.

    Attributes:
        kind: "missing" (a key of `expected` absent from `given`), "unexpected" (a key
            of `given` absent from `expected`), "node" (another kind of node or leaf),
            "shape" or "dtype" (a leaf of another shape or dtype).
        path: the tree path, `jax.tree_util.keystr` notation ("<root>" for the root).
        expected, given: what was expected and what was given there (shapes as tuples,
            dtypes and node kinds as strings; `None` for missing/unexpected).
    """

    kind: str
    path: str
    expected: Any = None
    given: Any = None

    def __str__(self) -> str:
        if self.kind == _MISSING:
            return f"missing {self.path}"
        if self.kind == _UNEXPECTED:
            return f"unexpected {self.path}"
        what = {_NODE: "", _SHAPE: "shape ", _DTYPE: "dtype "}[self.kind]
        return f"{self.path}: expected {what}{self.expected}, got {self.given}"


def _is_leaf(node: Any) -> bool:
    if node is None or isinstance(node, (str, bytes, int, float, complex, np.generic)):
        return True
    if hasattr(node, "shape") and hasattr(node, "dtype"):
        return True
    if isinstance(node, Mapping):
        return False
    treedef = jax.tree_util.tree_structure(node)
    # An empty container (`()`, `[]`, a dataclass without fields) is a node with no
    # children, not a leaf: it has no shape or dtype to compare.
    return jax.tree_util.treedef_is_leaf(treedef) and treedef.num_leaves == 1


def _children(node: Any) -> list[tuple[str, Any]]:
    """`(path suffix, child)` one level down (`node` is not a leaf)."""
    if isinstance(node, Mapping):
        return [(f"[{key!r}]", node[key]) for key in node]
    with_paths, _ = jax.tree_util.tree_flatten_with_path(
        node, is_leaf=lambda x: x is not node)
    return [(jax.tree_util.keystr(path), child) for path, child in with_paths]


def _node_kind(node: Any) -> str:
    if isinstance(node, Mapping):
        return "a mapping"
    if isinstance(node, (tuple, list)) and not hasattr(node, "_fields"):
        return f"a {type(node).__name__} of {len(node)}"
    return f"a {type(node).__name__}"


def _leaf_kind(leaf: Any) -> str:
    if leaf is None:
        return "None"
    if isinstance(leaf, (str, bytes)):
        return f"a {type(leaf).__name__}"
    return f"an array {_shape(leaf)} {_dtype(leaf)}"


def _shape(leaf: Any) -> tuple:
    shape = getattr(leaf, "shape", None)
    return tuple(shape) if shape is not None else tuple(np.shape(leaf))


def _dtype(leaf: Any) -> np.dtype | str:
    dtype = getattr(leaf, "dtype", None)
    if dtype is None:
        return np.result_type(leaf)
    try:
        return np.dtype(dtype)
    except TypeError:  # a torch dtype, a PRNG key dtype: compare by name
        return str(dtype)


def _dtypes_fit(expected: Any, given: Any, rule: str) -> bool:
    if rule == "ignore" or expected == given:
        return True
    if rule == "exact" or not (isinstance(expected, np.dtype) and isinstance(given, np.dtype)):
        return False
    return bool(np.can_cast(given, expected, casting="same_kind"))


def _compare_leaves(expected: Any, given: Any, path: str, rule: str,
                    out: list[Difference]) -> None:
    e_text, g_text = isinstance(expected, (str, bytes)), isinstance(given, (str, bytes))
    if expected is None or given is None or e_text or g_text:
        same = ((expected is None and given is None)
                or (e_text and g_text and type(expected) is type(given)))
        if not same:
            out.append(Difference(_NODE, path, _leaf_kind(expected), _leaf_kind(given)))
        return
    e_shape, g_shape = _shape(expected), _shape(given)
    if e_shape != g_shape:
        out.append(Difference(_SHAPE, path, e_shape, g_shape))
        return
    if rule != "ignore":
        e_dtype, g_dtype = _dtype(expected), _dtype(given)
        if not _dtypes_fit(e_dtype, g_dtype, rule):
            out.append(Difference(_DTYPE, path, str(e_dtype), str(g_dtype)))


def _walk(expected: Any, given: Any, path: str, rule: str, out: list[Difference]) -> None:
    e_leaf, g_leaf = _is_leaf(expected), _is_leaf(given)
    where = path or _ROOT
    if e_leaf and g_leaf:
        _compare_leaves(expected, given, where, rule, out)
        return
    if e_leaf or g_leaf:
        out.append(Difference(_NODE, where,
                              _leaf_kind(expected) if e_leaf else _node_kind(expected),
                              _leaf_kind(given) if g_leaf else _node_kind(given)))
        return
    if isinstance(expected, Mapping) and isinstance(given, Mapping):
        for key in expected:
            suffix = f"[{key!r}]"
            if key in given:
                _walk(expected[key], given[key], path + suffix, rule, out)
            else:
                out.append(Difference(_MISSING, path + suffix))
        out.extend(Difference(_UNEXPECTED, f"{path}[{key!r}]") for key in given
                   if key not in expected)
        return
    same_node = (type(expected) is type(given)
                 and jax.tree_util.tree_structure(expected, is_leaf=lambda x: x is not expected)
                 == jax.tree_util.tree_structure(given, is_leaf=lambda x: x is not given))
    if not same_node:
        out.append(Difference(_NODE, where, _node_kind(expected), _node_kind(given)))
        return
    for (suffix, e_child), (_, g_child) in zip(_children(expected), _children(given)):
        _walk(e_child, g_child, path + suffix, rule, out)


def structure_differences(expected: Any, given: Any, *, dtypes: str = "same_kind"
                          ) -> list[Difference]:
    """Every way the pytree `given` differs from `expected`, in tree order.

    Args:
        expected: the reference pytree (e.g. the runner's own state).
        given: the pytree to check (e.g. what `set_state` received).
        dtypes: how leaf dtypes are compared: "exact" (equal dtypes), "same_kind"
            (default: `given` must cast to `expected`'s dtype under numpy's "same_kind"
            rule, e.g. float64 weights for float32 params fit, float weights for int
            counters do not), or "ignore".

    Returns:
        A list of `Difference`s (empty when the structures fit).
    """
    if dtypes not in DTYPE_RULES:
        raise ValueError(f"dtypes must be one of {DTYPE_RULES}, got {dtypes!r}.")
    out: list[Difference] = []
    _walk(expected, given, "", dtypes, out)
    return out


def structure_diff(expected: Any, given: Any, *, dtypes: str = "same_kind") -> list[str]:
    """`structure_differences` as human-readable lines, e.g.
    `"missing ['pi']['Dense_1']['bias']"`, `"unexpected ['vf']"`,
    `"['pi']['Dense_0']['kernel']: expected shape (4, 16), got (4, 8)"`,
    `".key: expected dtype uint32, got float32"`. Empty when `given` fits `expected`."""
    return [str(d) for d in structure_differences(expected, given, dtypes=dtypes)]


def format_differences(differences: list, *, limit: int = 8) -> str:
    """Joins the first `limit` differences with "; " and says how many more there are."""
    lines = [str(d) for d in differences]
    text = "; ".join(lines[:limit])
    if len(lines) > limit:
        text += f"; and {len(lines) - limit} more"
    return text


def check_same_structure(expected: Any, given: Any, what: str, *,
                         dtypes: str = "same_kind", hint: str | None = None) -> None:
    """Raises `StateStructureError` if `given` does not fit `expected`.

    The message names `what` was checked, how many differences there are and the first
    eight (`structure_diff` lines), then `hint` (default: pass what `get_state()` of a
    runner built from the same config returns).

    Args:
        expected: the reference pytree; given: the pytree to check.
        what: what `given` is, for the message (e.g. "set_state: rl_module weights").
        dtypes: see `structure_differences`.
        hint: how to fix it, appended to the message.
    """
    differences = structure_differences(expected, given, dtypes=dtypes)
    if differences:
        hint = hint or ("Pass a state produced by get_state() of a runner built from the "
                        "same env and module config.")
        count = len(differences)
        raise StateStructureError(
            f"{what} does not fit ({count} difference{'s' if count > 1 else ''}: "
            f"{format_differences(differences)}). {hint}")


def check_finite_tree(tree: Any, what: str) -> None:
    """Raises `ValueError` if a floating-point leaf of `tree` holds a NaN or an infinity.

    Integer, boolean, string and `None` leaves are not checked. The message names the
    first non-finite leaf (in `jax.tree_util` order), its path, shape and dtype, how many
    of its entries are not finite, and the first one's index and value.

    Args:
        tree: a pytree of host or device arrays (e.g. module weights), shapes any.
        what: what `tree` is, for the message (e.g. "set_state: rl_module weights").
    """
    for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
        if leaf is None or isinstance(leaf, (str, bytes)):
            continue
        dtype = getattr(leaf, "dtype", None)
        if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            continue  # typed PRNG keys hold no floating-point values
        array = np.asarray(leaf)
        if not (np.issubdtype(array.dtype, np.floating)
                or np.issubdtype(array.dtype, np.complexfloating)):
            continue
        bad = ~np.isfinite(array)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            location = f" at index {first}" if first else ""
            raise ValueError(
                f"{what}: {jax.tree_util.keystr(path) or _ROOT} (shape {array.shape}, "
                f"{array.dtype}) has {int(bad.sum())} non-finite value(s), the first "
                f"{array[first].item()!r}{location}. Non-finite weights make every action computed "
                "from them NaN; check the update that produced them (loss, learning rate, "
                "gradient clipping) and send finite values.")


__all__ = ["DTYPE_RULES", "Difference", "check_finite_tree", "check_same_structure",
           "format_differences", "structure_diff", "structure_differences"]
