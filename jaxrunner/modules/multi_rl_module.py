"""`MultiRLModule`: RLModules keyed by module id (RLlib's `MultiRLModule`).

Like `RLModule` it is stateless: `init(key)` returns `{module_id: params}` and the forward
passes take `{module_id: params}` and `{module_id: batch}` and return `{module_id: out}`
for the module ids in the batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable, Collection, Iterator

import jax

from jaxrunner.modules.rl_module import RLModule


class MultiRLModule(Mapping):
    """A read-only mapping `module_id -> RLModule`.

    Args:
        modules: `{module_id: RLModule}`.
        policies_to_train: module ids a learner should update (None: all), or a callable
            `(module_id, batch=None) -> bool` as in RLlib's `policies_to_train`.
    """

    def __init__(self, modules: dict[str, RLModule],
                 policies_to_train: Collection[str] | Callable | None = None):
        if not modules:
            raise ValueError("MultiRLModule needs at least one module.")
        for module_id, module in modules.items():
            if not isinstance(module_id, str):
                raise TypeError(f"Module ids must be str, got {module_id!r}.")
            if not isinstance(module, RLModule):
                raise TypeError(f"Module {module_id!r} must be a jaxrunner.RLModule, got "
                                f"{type(module).__name__}.")
        self._modules = dict(sorted(modules.items()))
        if policies_to_train is not None and not callable(policies_to_train):
            unknown = set(policies_to_train) - set(self._modules)
            if unknown:
                raise ValueError(
                    f"policies_to_train names unknown module ids {sorted(unknown)}; the "
                    f"modules are {list(self._modules)}."
                )
            policies_to_train = frozenset(policies_to_train)
        self.policies_to_train = policies_to_train

    # ------------------------------------------------------------------ mapping
    def __getitem__(self, module_id: str) -> RLModule:
        return self._modules[module_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._modules)

    def __len__(self) -> int:
        return len(self._modules)

    @property
    def module_ids(self) -> tuple[str, ...]:
        """The module ids, sorted."""
        return tuple(self._modules)

    def is_trainable(self, module_id: str, batch: Any = None) -> bool:
        """Whether a learner should update `module_id` (RLlib's `should_module_be_updated`)."""
        if module_id not in self._modules:
            raise KeyError(f"Unknown module id {module_id!r}; modules: {self.module_ids}.")
        if self.policies_to_train is None:
            return True
        if callable(self.policies_to_train):
            return bool(self.policies_to_train(module_id, batch))
        return module_id in self.policies_to_train

    # ------------------------------------------------------------------ pure functions
    def init(self, key: jax.Array) -> dict[str, Any]:
        """`{module_id: params}`; module `i` (sorted order) uses `fold_in(key, i)`."""
        return {mid: module.init(jax.random.fold_in(key, i))
                for i, (mid, module) in enumerate(self._modules.items())}

    def _forward(self, name: str, params: dict, batch: dict) -> dict:
        return {mid: getattr(self._modules[mid], name)(params[mid], module_batch)
                for mid, module_batch in batch.items()}

    def forward_inference(self, params: dict, batch: dict) -> dict:
        return self._forward("forward_inference", params, batch)

    def forward_exploration(self, params: dict, batch: dict) -> dict:
        return self._forward("forward_exploration", params, batch)

    def forward_train(self, params: dict, batch: dict) -> dict:
        return self._forward("forward_train", params, batch)

    def params_for_inference(self, params: dict) -> dict:
        return {mid: self._modules[mid].params_for_inference(p) for mid, p in params.items()}

    def __repr__(self) -> str:
        inner = ", ".join(f"{mid!r}: {type(m).__name__}" for mid, m in self._modules.items())
        return f"MultiRLModule({{{inner}}})"


__all__ = ["MultiRLModule"]
