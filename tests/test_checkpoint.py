"""Runner checkpoints: `save_to_path` / `restore_from_path` round trips (also into a new
process, bit for bit) and clear errors for foreign, truncated, corrupted or unfitting files."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import textwrap

import jax
import numpy as np
import pytest

import jaxrunner
from jaxrunner.runners import checkpoint
from jaxrunner.runners.checkpoint import CheckpointError


def _config(num_envs=3, seed=0):
    return (jaxrunner.RunnerConfig().environment("CartPole-v1")
            .env_runners(num_envs_per_env_runner=num_envs, rollout_fragment_length=16)
            .rl_module(model_config={"fcnet_hiddens": [8]})
            .debugging(seed=seed))


def _leaves(batch) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(batch.trajectory()))]


def _episode_keys(batch) -> list[tuple]:
    return [(e.id_, e.t_started, len(e), e.get_return()) for e in batch]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A runner that sampled a while, its checkpoint, and the sample it takes next."""
    runner = jaxrunner.SingleAgentEnvRunner(config=_config())
    for _ in range(3):
        runner.sample()
    runner.set_state({"rl_module": runner.get_state()["rl_module"], "weights_seq_no": 7})
    path = runner.save_to_path(str(tmp_path_factory.mktemp("ckpt")))
    lifetime = runner.get_state()["num_env_steps_sampled_lifetime"]
    following = runner.sample()
    yield {"runner": runner, "path": path, "next": following, "lifetime": lifetime}
    runner.stop()


@pytest.fixture()
def fresh_runner():
    runner = jaxrunner.SingleAgentEnvRunner(config=_config())
    yield runner
    runner.stop()


def test_checkpoint__file_has_a_versioned_header(saved):
    with open(os.path.join(saved["path"], checkpoint.FILE_NAME), "rb") as f:
        header, payload = checkpoint.read_header(f.read())
    assert header["format"] == "jaxrunner.env_runner_state" and header["version"] == 1
    assert header["serializer"] == "flax.serialization.msgpack"
    assert header["env"] == "CartPole-v1" and header["num_envs_per_env_runner"] == 3
    assert header["payload_bytes"] == len(payload)


def test_restore__same_process_next_sample_and_counters(saved, fresh_runner):
    fresh_runner.restore_from_path(saved["path"])
    assert fresh_runner.weights_seq_no == 7
    assert fresh_runner.get_state()["num_env_steps_sampled_lifetime"] == saved["lifetime"]
    batch = fresh_runner.sample()
    for got, want in zip(_leaves(batch), _leaves(saved["next"])):
        np.testing.assert_array_equal(got, want)
    assert _episode_keys(batch) == _episode_keys(saved["next"])


_CHILD = textwrap.dedent("""
    import sys
    import jax, numpy as np, jaxrunner
    config = (jaxrunner.RunnerConfig().environment("CartPole-v1")
              .env_runners(num_envs_per_env_runner=3, rollout_fragment_length=16)
              .rl_module(model_config={"fcnet_hiddens": [8]})
              .debugging(seed=0))
    runner = jaxrunner.SingleAgentEnvRunner(config=config)
    runner.restore_from_path(sys.argv[1])
    batch = runner.sample()
    leaves = [np.asarray(x) for x in jax.tree.leaves(jax.device_get(batch.trajectory()))]
    np.savez(sys.argv[2], *leaves)
    print("EPISODES", repr([(e.id_, e.t_started, len(e), e.get_return()) for e in batch]))
""")


def test_restore__new_process_reproduces_next_sample_bit_for_bit(saved, tmp_path):
    out = tmp_path / "next.npz"
    proc = subprocess.run([sys.executable, "-c", _CHILD, saved["path"], str(out)],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = np.load(out)
    want = _leaves(saved["next"])
    assert len(got.files) == len(want)
    for i, leaf in enumerate(want):
        np.testing.assert_array_equal(got[f"arr_{i}"], leaf)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("EPISODES "))
    assert line == "EPISODES " + repr(_episode_keys(saved["next"]))


def _data(saved) -> bytes:
    with open(os.path.join(saved["path"], checkpoint.FILE_NAME), "rb") as f:
        return f.read()


def _write(tmp_path, data: bytes) -> str:
    path = tmp_path / "state.ckpt"
    path.write_bytes(data)
    return str(path)


def _assert_unchanged(runner, before):
    after = runner.get_state(components=list(runner.CHECKPOINT_COMPONENTS))
    same = jax.tree.map(lambda a, b: np.array_equal(a, b), before, after)
    assert all(jax.tree.leaves(same))
    runner.sample()  # still usable


@pytest.mark.parametrize("cut", [0, 5, 14, 100, -1])
def test_restore__truncated_file_is_a_clear_error(saved, fresh_runner, tmp_path, cut):
    data = _data(saved)
    before = fresh_runner.get_state(components=list(fresh_runner.CHECKPOINT_COMPONENTS))
    with pytest.raises(CheckpointError, match="truncated"):
        fresh_runner.restore_from_path(_write(tmp_path, data[:cut % len(data)]))
    _assert_unchanged(fresh_runner, before)


@pytest.mark.parametrize("data", [b"PK\x03\x04 not ours at all", json.dumps({"a": 1}).encode(),
                                  b"\x00" * 64])
def test_restore__foreign_file_is_a_clear_error(fresh_runner, tmp_path, data):
    with pytest.raises(CheckpointError, match="not a jaxrunner checkpoint"):
        fresh_runner.restore_from_path(_write(tmp_path, data))


def test_restore__corrupted_payload_is_a_clear_error(saved, fresh_runner, tmp_path):
    data = bytearray(_data(saved))
    data[-10] ^= 0xFF
    with pytest.raises(CheckpointError, match="checksum"):
        fresh_runner.restore_from_path(_write(tmp_path, bytes(data)))


def test_restore__newer_format_version_is_a_clear_error(saved, fresh_runner, tmp_path):
    data = _data(saved)
    header, payload = checkpoint.read_header(data)
    header_bytes = json.dumps({**header, "version": 99}).encode()
    newer = checkpoint.MAGIC + struct.pack("<I", len(header_bytes)) + header_bytes + payload
    with pytest.raises(CheckpointError, match="format version 99"):
        fresh_runner.restore_from_path(_write(tmp_path, newer))


def test_restore__checkpoint_of_another_config_is_refused(saved):
    runner = jaxrunner.SingleAgentEnvRunner(config=_config(num_envs=5))
    before = runner.get_state(components=list(runner.CHECKPOINT_COMPONENTS))
    with pytest.raises(jaxrunner.StateStructureError, match="num_envs"):
        runner.restore_from_path(saved["path"])
    _assert_unchanged(runner, before)
    runner.stop()


def test_save_and_restore__paths(saved, fresh_runner, tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        fresh_runner.restore_from_path(str(tmp_path / "missing"))
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ValueError, match="is a file"):
        fresh_runner.save_to_path(str(a_file))
    default = fresh_runner.save_to_path()  # a new temporary directory
    assert os.path.isfile(os.path.join(default, checkpoint.FILE_NAME))
    # The file itself is accepted too.
    fresh_runner.restore_from_path(os.path.join(saved["path"], checkpoint.FILE_NAME))
    assert fresh_runner.weights_seq_no == 7


def test_load_state__entries_shapes_and_dtypes_must_fit_exactly():
    template = {"weights": {"kernel": np.zeros((3, 2), np.float32)},
                "carry": {"count": np.zeros((4,), np.int32), "done": np.zeros(4, bool)},
                "lifetime": 7, "connector": {}}
    state, header = checkpoint.load_state(
        checkpoint.dump_state(template, {"env": "E"}), template)
    assert header["env"] == "E"
    assert all(jax.tree.leaves(jax.tree.map(np.array_equal, state, template)))
    other = {"weights": {"kernel": np.zeros((3, 2), np.float64)},
             "carry": {"count": np.zeros((5,), np.int32)},
             "lifetime": 7, "connector": {}, "extra": 1}
    data = checkpoint.dump_state(other, {"runner_class": "MultiAgentEnvRunner", "env": "E",
                                         "num_envs_per_env_runner": 5})
    with pytest.raises(jaxrunner.StateStructureError) as info:
        checkpoint.load_state(data, template, source="ckpt")
    message = str(info.value)
    for part in ("ckpt does not fit this runner (4 difference(s): ",
                 "['weights']['kernel']: expected dtype float32, got float64",
                 "['carry']['count']: expected shape (4,), got (5,)",
                 "missing ['carry']['done']", "unexpected ['extra']",
                 "written by runner_class='MultiAgentEnvRunner', env='E', "
                 "num_envs_per_env_runner=5"):
        assert part in message, (part, message)
