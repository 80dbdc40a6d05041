"""Weight translation between RLlib's torch state dicts and `RLlibPPOModule` params.

A torch `nn.Linear` stores `weight` as `(out, in)` and computes `x @ weight.T + bias`; a
Flax `nn.Dense` stores `kernel` as `(in, out)` and computes `x @ kernel + bias`, so
`kernel = weight.T`. `nn.LayerNorm`'s `weight`/`bias` are Flax's `scale`/`bias`.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import numpy as np

from jaxrunner.rllib.errors import UnsupportedRLlibSetupError
from jaxrunner.rllib.module import NON_INFERENCE_PREFIXES, Dense, LayerNorm, PPOLayout
from jaxrunner.structure import format_differences, structure_differences

_PI_PREFIX = "pi.net.mlp"
_CLIP_BUFFER = "pi.log_std_clip_param_const"
_FREE_LOG_STD = "pi.log_std"


def _expected(layout: PPOLayout) -> dict[str, tuple[tuple[str, ...], str, tuple[int, ...]]]:
    """torch key -> (params path, flax leaf kind, torch shape) for every weight."""
    table: dict[str, tuple[tuple[str, ...], str, tuple[int, ...]]] = {}
    for group, prefix, ops in (("encoder", layout.encoder_prefix, layout.encoder_ops),
                               ("pi", _PI_PREFIX, layout.pi_ops)):
        for op in ops:
            name = f"layers_{op.index}"
            if isinstance(op, Dense):
                table[f"{prefix}.{op.index}.weight"] = (
                    (group, name, "kernel"), "transpose", (op.features, op.in_features))
                table[f"{prefix}.{op.index}.bias"] = (
                    (group, name, "bias"), "copy", (op.features,))
            elif isinstance(op, LayerNorm):
                table[f"{prefix}.{op.index}.weight"] = (
                    (group, name, "scale"), "copy", (op.features,))
                table[f"{prefix}.{op.index}.bias"] = (
                    (group, name, "bias"), "copy", (op.features,))
    if layout.free_log_std:
        table[_FREE_LOG_STD] = (("log_std",), "copy", (layout.dist_dim // 2,))
    return table


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def torch_state_to_flax_params(state_dict: Mapping[str, Any], layout: PPOLayout) -> dict:
    """RLlib torch state dict (numpy or torch values) -> `RLlibPPOModule` params (numpy).

    Accepts an inference-only state (what RLlib's learners send to env runners) or a full
    learner state (the value function, critic encoder and APPO target networks are
    ignored). Raises `UnsupportedRLlibSetupError` if a key is missing, unexpected, or has
    another shape (compared by `jaxrunner.structure.structure_differences`): the weights
    then come from a module of another layout than the config describes (a custom
    RLModule, LSTM/CNN encoder, other fcnet sizes).
    """
    if not isinstance(state_dict, Mapping):
        raise UnsupportedRLlibSetupError(
            f"Expected the RLModule state as a dict of torch weights, got "
            f"{type(state_dict).__name__}."
        )
    table = _expected(layout)
    relevant = {k: v for k, v in state_dict.items()
                if not k.startswith(NON_INFERENCE_PREFIXES) and k != _CLIP_BUFFER}
    expected = {key: jax.ShapeDtypeStruct(shape, np.float32)
                for key, (_, _, shape) in table.items()}
    # Values are cast to float32 below, so only keys and shapes must fit.
    differences = structure_differences(expected, relevant, dtypes="ignore")
    if differences:
        problems = []
        for kind, label in (("missing", "missing"), ("unexpected", "unexpected"),
                            ("shape", "wrong shapes"), ("node", "not arrays")):
            found = [d for d in differences if d.kind == kind]
            if found:
                problems.append(f"{label}: {format_differences(found, limit=6)}")
        raise UnsupportedRLlibSetupError(
            "The RLModule weights do not have the layout of RLlib's default PPO module for "
            f"this model_config ({'; '.join(problems)}). Custom RLModules and encoders "
            "other than the default MLP cannot be translated to the compiled runner."
        )
    params: dict = {}
    for key, (path, kind, _) in table.items():
        value = _to_numpy(state_dict[key]).astype(np.float32)
        if kind == "transpose":
            value = np.ascontiguousarray(value.T)
        node = params
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return params


def flax_params_to_torch_state(params: Mapping[str, Any], layout: PPOLayout) -> dict:
    """`RLlibPPOModule` params -> the inference-only torch state dict (numpy values) that
    RLlib's default PPO module returns from `get_state(inference_only=True)`."""
    state: dict[str, np.ndarray] = {}
    for key, (path, kind, _) in _expected(layout).items():
        node: Any = params
        for part in path:
            node = node[part]
        value = np.asarray(node, np.float32)
        state[key] = np.ascontiguousarray(value.T) if kind == "transpose" else value.copy()
    state[_CLIP_BUFFER] = np.asarray([layout.log_std_clip_param], np.float32)
    return state


__all__ = ["flax_params_to_torch_state", "torch_state_to_flax_params"]
