"""Host side of the multi-agent metrics: RLlib's general keys plus the per-agent and
per-module ones (`agent_episode_return_mean/<agent>`, `module_episode_return_mean/<module>`,
`num_agent_steps_sampled[_lifetime]/<agent>`, `num_module_steps_sampled[_lifetime]/<module>`),
returned as nested dicts keyed by agent or module id.

The device keeps a ring of the last `W` episodes overall (general keys), one ring per
agent (the episodes the agent stepped in) and one per module (the episodes in which an
agent mapped to it stepped; its return there is the sum of those agents' returns), and
per-agent and per-module counters of completed agent steps (mod 2**32). `reduce()`
receives host copies and takes deltas of the counters since the last call.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from jaxrunner.metrics import keys
from jaxrunner.metrics.logger import RunnerMetrics


def _ring_means(registers: Any, ids: tuple[str, ...]) -> dict[str, float]:
    sizes = np.asarray(registers.window_size)
    returns = np.asarray(registers.window_return, np.float64)
    return {name: float(returns[i, : int(sizes[i])].mean())
            for i, name in enumerate(ids) if int(sizes[i]) > 0}


class MultiAgentRunnerMetrics:
    """`RunnerMetrics` (env steps, episodes, timers) plus agent and module counters."""

    def __init__(self, num_envs: int, agent_ids: tuple[str, ...], module_ids: tuple[str, ...]):
        self.general = RunnerMetrics(num_envs)
        self.agent_ids = tuple(agent_ids)
        self.module_ids = tuple(module_ids)
        self.agent_steps_lifetime = {a: 0 for a in self.agent_ids}
        self.module_steps_lifetime = {m: 0 for m in self.module_ids}
        self._agent_seen = np.zeros(len(self.agent_ids), np.int64)  # device counters (mod 2**32)
        self._module_seen = np.zeros(len(self.module_ids), np.int64)

    def record_sample(self, **kwargs: Any) -> None:
        self.general.record_sample(**kwargs)

    @property
    def env_steps_lifetime(self) -> int:
        return self.general.env_steps_lifetime

    @env_steps_lifetime.setter
    def env_steps_lifetime(self, value: int) -> None:
        self.general.env_steps_lifetime = int(value)

    def reduce(self, registers: Any, agent_registers: Any, module_registers: Any,
               agent_steps: Any, module_steps: Any) -> dict[str, Any]:
        """RLlib's metrics dict from host copies of the device registers and counters."""
        out = self.general.reduce(registers)
        for key in (keys.AGENT_EPISODE_RETURN_MEAN, keys.MODULE_EPISODE_RETURN_MEAN):
            out.pop(key, None)
        agent_means = _ring_means(agent_registers, self.agent_ids)
        module_means = _ring_means(module_registers, self.module_ids)
        if agent_means:
            out[keys.AGENT_EPISODE_RETURN_MEAN] = agent_means
        if module_means:
            out[keys.MODULE_EPISODE_RETURN_MEAN] = module_means
        agent_now = np.asarray(agent_steps, np.int64)
        module_now = np.asarray(module_steps, np.int64)
        agent_delta = (agent_now - self._agent_seen) % 2**32
        module_delta = (module_now - self._module_seen) % 2**32
        self._agent_seen, self._module_seen = agent_now, module_now
        for i, agent in enumerate(self.agent_ids):
            self.agent_steps_lifetime[agent] += int(agent_delta[i])
        for i, module_id in enumerate(self.module_ids):
            self.module_steps_lifetime[module_id] += int(module_delta[i])
        out[keys.NUM_AGENT_STEPS_SAMPLED] = {a: int(agent_delta[i])
                                             for i, a in enumerate(self.agent_ids)}
        out[keys.NUM_AGENT_STEPS_SAMPLED_LIFETIME] = dict(self.agent_steps_lifetime)
        out[keys.NUM_MODULE_STEPS_SAMPLED] = {m: int(module_delta[i])
                                              for i, m in enumerate(self.module_ids)}
        out[keys.NUM_MODULE_STEPS_SAMPLED_LIFETIME] = dict(self.module_steps_lifetime)
        return out

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict[str, Any]:
        return {"general": self.general.get_state(),
                "agent_steps_lifetime": dict(self.agent_steps_lifetime),
                "module_steps_lifetime": dict(self.module_steps_lifetime),
                "agent_seen": self._agent_seen.tolist(),
                "module_seen": self._module_seen.tolist()}

    def set_state(self, state: dict[str, Any]) -> None:
        self.general.set_state(state["general"])
        self.agent_steps_lifetime = {a: int(state["agent_steps_lifetime"][a])
                                     for a in self.agent_ids}
        self.module_steps_lifetime = {m: int(state["module_steps_lifetime"][m])
                                      for m in self.module_ids}
        self._agent_seen = np.asarray(state["agent_seen"], np.int64)
        self._module_seen = np.asarray(state["module_seen"], np.int64)


__all__ = ["MultiAgentRunnerMetrics"]
