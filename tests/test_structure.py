"""`jaxrunner.structure`: one structure diff for every state check, and the finite check."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import struct
from flax.core import FrozenDict

from jaxrunner.errors import StateStructureError
from jaxrunner.structure import (Difference, check_finite_tree, check_same_structure,
                                 structure_diff, structure_differences)


@struct.dataclass
class Carry:
    obs: dict  # aid -> (B, 3) float32
    count: jax.Array  # (B,) int32


def _weights():
    return {"pi": {"Dense_0": {"kernel": np.zeros((4, 16), np.float32),
                               "bias": np.zeros((16,), np.float32)},
                   "Dense_1": {"kernel": np.zeros((16, 2), np.float32),
                               "bias": np.zeros((2,), np.float32)}}}


def test_structure_diff__same_structure_is_empty():
    weights = _weights()
    assert structure_diff(weights, jax.tree.map(np.copy, weights)) == []
    # A Flax FrozenDict and device arrays fit the same host dict.
    assert structure_diff(weights, FrozenDict(jax.tree.map(jnp.asarray, weights))) == []
    # So do float64 values for float32 leaves (cast on load) under the default rule.
    assert structure_diff(weights, jax.tree.map(lambda x: x.astype(np.float64), weights)) == []
    carry = Carry(obs={"a": np.zeros((2, 3), np.float32)}, count=np.zeros(2, np.int32))
    assert structure_diff((carry, None, "threefry2x32"),
                          (carry, None, "rbg")) == []


def test_structure_diff__missing_extra_shape_and_dtype_with_paths():
    expected = _weights()
    given = jax.tree.map(np.copy, expected)
    del given["pi"]["Dense_1"]["bias"]
    given["pi"]["Dense_2"] = {"kernel": np.zeros((2, 2), np.float32)}
    given["pi"]["Dense_0"]["kernel"] = np.zeros((4, 8), np.float32)
    given["pi"]["Dense_0"]["bias"] = np.zeros((16,), np.int32)  # int for float: castable
    assert structure_diff(expected, given) == [
        "['pi']['Dense_0']['kernel']: expected shape (4, 16), got (4, 8)",
        "missing ['pi']['Dense_1']['bias']",
        "unexpected ['pi']['Dense_2']",
    ]
    assert "['pi']['Dense_0']['bias']: expected dtype float32, got int32" in structure_diff(
        expected, given, dtypes="exact")
    assert [d.kind for d in structure_differences(expected, given)] == [
        "shape", "missing", "unexpected"]
    assert structure_differences(expected, given)[0] == Difference(
        "shape", "['pi']['Dense_0']['kernel']", (4, 16), (4, 8))


def test_structure_diff__dtype_rules():
    expected = {"count": np.zeros(3, np.int32), "obs": np.zeros(3, np.float32)}
    given = {"count": np.zeros(3, np.float32), "obs": np.zeros(3, np.float64)}
    # Floats for integer counters never fit; float64 for float32 fits only "same_kind".
    assert structure_diff(expected, given) == [
        "['count']: expected dtype int32, got float32"]
    assert structure_diff(expected, given, dtypes="exact") == [
        "['count']: expected dtype int32, got float32",
        "['obs']: expected dtype float32, got float64"]
    assert structure_diff(expected, given, dtypes="ignore") == []
    with pytest.raises(ValueError, match="dtypes must be one of"):
        structure_diff(expected, given, dtypes="loose")


def test_structure_diff__node_kinds_dataclasses_and_sequences():
    carry = Carry(obs={"a": np.zeros((2, 3), np.float32)}, count=np.zeros(2, np.int32))
    other = Carry(obs={"a": np.zeros((2, 3), np.float32), "b": np.zeros((2, 3), np.float32)},
                  count=np.zeros(2, np.float32))
    assert structure_diff(carry, other) == [
        "unexpected .obs['b']", ".count: expected dtype int32, got float32"]
    # A dict where a dataclass was expected, a tuple of another length, an array where a
    # dict was expected, None where an array was expected.
    assert structure_diff({"carry": carry}, {"carry": {"obs": {}, "count": 0}}) == [
        "['carry']: expected a Carry, got a mapping"]
    assert structure_diff((1, 2), (1, 2, 3)) == [
        "<root>: expected a tuple of 2, got a tuple of 3"]
    assert structure_diff({"x": {"y": np.zeros(2)}}, {"x": np.zeros(2)}) == [
        "['x']: expected a mapping, got an array (2,) float64"]
    assert structure_diff({"x": np.zeros(2, np.float32)}, {"x": None}) == [
        "['x']: expected an array (2,) float32, got None"]
    # Empty containers are nodes without children, not leaves.
    assert structure_diff({"a": (), "b": []}, {"a": (), "b": []}) == []
    assert structure_diff({"a": ()}, {"a": (np.zeros(2),)}) == [
        "['a']: expected a tuple of 0, got a tuple of 1"]
    # Lists compare element by element.
    assert structure_diff([np.zeros(2), np.zeros(3)], [np.zeros(2), np.zeros(4)]) == [
        "[1]: expected shape (3,), got (4,)"]


def test_structure_diff__shape_dtype_structs_and_other_array_types():
    expected = {"w": jax.ShapeDtypeStruct((3, 2), np.float32)}
    assert structure_diff(expected, {"w": np.ones((3, 2), np.float32)}) == []
    assert structure_diff(expected, {"w": jnp.ones((2, 3))}) == [
        "['w']: expected shape (3, 2), got (2, 3)"]


def test_check_same_structure__raises_state_structure_error_with_the_differences():
    expected = _weights()
    given = jax.tree.map(lambda x: np.zeros(x.shape + (1,), x.dtype), expected)
    with pytest.raises(StateStructureError) as info:
        check_same_structure(expected, given, "set_state: rl_module weights")
    message = str(info.value)
    assert isinstance(info.value, ValueError)
    assert message.startswith("set_state: rl_module weights does not fit (4 differences: ")
    assert "['pi']['Dense_0']['kernel']: expected shape (4, 16), got (4, 16, 1)" in message
    assert "get_state()" in message  # the default hint: how to fix it
    with pytest.raises(StateStructureError, match="use the same config"):
        check_same_structure({"a": 1}, {}, "checkpoint", hint="Please use the same config.")
    check_same_structure(expected, expected, "same")  # no error


def test_check_same_structure__long_lists_are_shortened():
    expected = {f"k{i}": np.zeros(1) for i in range(20)}
    with pytest.raises(StateStructureError, match=r"20 differences: .*; and 12 more\)"):
        check_same_structure(expected, {}, "state")


def test_check_finite_tree__names_the_first_non_finite_leaf():
    weights = _weights()
    check_finite_tree(weights, "set_state: rl_module weights")  # finite: no error
    weights["pi"]["Dense_1"]["kernel"][3, 1] = np.nan
    weights["pi"]["Dense_1"]["kernel"][5, 0] = np.inf
    with pytest.raises(ValueError) as info:
        check_finite_tree(weights, "set_state: rl_module weights")
    message = str(info.value)
    assert message.startswith("set_state: rl_module weights: ['pi']['Dense_1']['kernel'] "
                              "(shape (16, 2), float32) has 2 non-finite value(s), the "
                              "first nan at index (3, 1).")
    weights["pi"]["Dense_0"]["bias"] = jnp.full((16,), -jnp.inf)  # device array, earlier
    with pytest.raises(ValueError, match=r"\['Dense_0'\]\['bias'\] .* has 16 non-finite "
                                         r"value\(s\), the first -inf at index \(0,\)"):
        check_finite_tree(weights, "weights")
    with pytest.raises(ValueError, match=r"<root> \(shape \(\), float64\) .* the first nan\."):
        check_finite_tree(np.float64("nan"), "a scalar")


def test_check_finite_tree__ignores_integer_bool_string_and_key_leaves():
    check_finite_tree({"count": np.array([2**31 - 1], np.int32), "done": np.array([True]),
                       "impl": "threefry2x32", "none": None, "key": jax.random.key(0),
                       "key_data": jax.random.key_data(jax.random.key(1))}, "carry")
