"""`EnvContext`: the dict an env creator receives (RLlib's fields)."""

from __future__ import annotations


class EnvContext(dict):
    """The `env_config` dict plus where the env runs.

    Attributes:
        worker_index: 0 for the local runner, 1..N for remote runners, None standalone.
        num_workers: number of remote runners in the group.
        vector_index: index of the sub-env (always 0: one creator call builds the env that
            is vmapped over all sub-envs).
        remote: whether sub-envs are remote processes (never, for compiled envs).
        recreated_worker: whether the runner was restarted after a failure.
    """

    def __init__(self, env_config: dict | None = None, *, worker_index: int | None = 0,
                 num_workers: int = 0, vector_index: int = 0, remote: bool = False,
                 recreated_worker: bool = False):
        super().__init__(env_config or {})
        self.worker_index = worker_index
        self.num_workers = num_workers
        self.vector_index = vector_index
        self.remote = remote
        self.recreated_worker = recreated_worker

    def copy_with_overrides(self, env_config: dict | None = None, **fields) -> "EnvContext":
        values = dict(worker_index=self.worker_index, num_workers=self.num_workers,
                      vector_index=self.vector_index, remote=self.remote,
                      recreated_worker=self.recreated_worker)
        values.update(fields)
        return EnvContext(dict(self) if env_config is None else env_config, **values)

    def __repr__(self) -> str:
        return (f"EnvContext({dict(self)!r}, worker_index={self.worker_index}, "
                f"num_workers={self.num_workers}, vector_index={self.vector_index})")
