"""The on-disk checkpoint format of a runner's state.

A checkpoint file is::

    MAGIC (8 bytes) | header length (4 bytes, little-endian uint32) | header (UTF-8 JSON)
    | payload (msgpack, `flax.serialization.msgpack_serialize` of the state dict)

The header names the format and its version, the payload's size and SHA-256, and what wrote
it (runner class, env, number of sub-envs, jaxrunner and jax versions). Reading checks all of
these before touching the payload, so a file that is foreign, truncated, corrupted or from a
newer format fails with a message that says which.

`dump_state` / `load_state` turn a `get_state()` dict into bytes and back; the runners'
`save_to_path` / `restore_from_path` (on `EnvRunner`) put those bytes in a file.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from typing import Any

import jax
from flax import serialization

from jaxrunner.errors import StateStructureError
from jaxrunner.structure import format_differences, structure_differences

MAGIC = b"JXRCKPT\x00"
FORMAT = "jaxrunner.env_runner_state"
VERSION = 1
FILE_NAME = "env_runner_state.ckpt"  # inside the directory given to save_to_path
_MAX_HEADER_BYTES = 1 << 20
# Facts about the writer that a "does not fit" message repeats from the header.
_WRITER_KEYS = ("runner_class", "env", "num_envs_per_env_runner", "worker_index")


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read: foreign, truncated, corrupted or too new."""


def dump_state(state: dict[str, Any], metadata: dict[str, Any] | None = None) -> bytes:
    """Serialises a `get_state()` dict (host numpy, flax dataclasses allowed) with a header.

    Args:
        state: the runner state.
        metadata: JSON-able facts about the writer, stored in the header.
    """
    payload = serialization.msgpack_serialize(serialization.to_state_dict(state))
    header = {
        "format": FORMAT,
        "version": VERSION,
        "serializer": "flax.serialization.msgpack",
        "payload_bytes": len(payload),
        "payload_sha256": hashlib.sha256(payload).hexdigest(),
        **(metadata or {}),
    }
    header_bytes = json.dumps(header, sort_keys=True).encode()
    return MAGIC + struct.pack("<I", len(header_bytes)) + header_bytes + payload


def read_header(data: bytes, *, source: str = "checkpoint") -> tuple[dict[str, Any], bytes]:
    """Checks magic, header, size and checksum; returns `(header, payload)`."""
    if len(data) < len(MAGIC) or not data.startswith(MAGIC):
        if MAGIC.startswith(data):
            raise CheckpointError(f"{source} is truncated: it has only {len(data)} bytes.")
        raise CheckpointError(
            f"{source} is not a jaxrunner checkpoint (it starts with {data[:8]!r}, expected "
            f"{MAGIC!r}). Pass a directory or file written by runner.save_to_path().")
    offset = len(MAGIC) + 4
    if len(data) < offset:
        raise CheckpointError(f"{source} is truncated inside its header.")
    (header_len,) = struct.unpack("<I", data[len(MAGIC):offset])
    if header_len > _MAX_HEADER_BYTES:
        raise CheckpointError(f"{source} has a corrupted header (length {header_len}).")
    if len(data) < offset + header_len:
        raise CheckpointError(
            f"{source} is truncated: the header needs {header_len} bytes, the file has "
            f"{len(data) - offset} after the magic.")
    try:
        header = json.loads(data[offset:offset + header_len].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{source} has a corrupted header ({error}).") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise CheckpointError(
            f"{source} is a jaxrunner file of format {header.get('format')!r}, not "
            f"{FORMAT!r}." if isinstance(header, dict) else f"{source} has a corrupted header.")
    version = header.get("version")
    if not isinstance(version, int) or version > VERSION or version < 1:
        raise CheckpointError(
            f"{source} has format version {version!r}; this jaxrunner reads versions 1 to "
            f"{VERSION}. Upgrade jaxrunner to read it.")
    payload = data[offset + header_len:]
    expected = header.get("payload_bytes")
    if len(payload) != expected:
        raise CheckpointError(
            f"{source} is truncated or has trailing data: the header announces {expected} "
            f"payload bytes, the file holds {len(payload)}.")
    if hashlib.sha256(payload).hexdigest() != header.get("payload_sha256"):
        raise CheckpointError(f"{source} is corrupted: its payload checksum does not match.")
    return header, payload


def load_state(data: bytes, template: dict[str, Any], *, source: str = "checkpoint"
               ) -> tuple[dict[str, Any], dict[str, Any]]:
    """Reads bytes from `dump_state` into the structure of `template` (a `get_state()` of
    the runner to restore into: it supplies the dataclass types). Returns
    `(state, header)`. The payload must have the template's structure exactly (same
    entries, shapes and dtypes, compared by `jaxrunner.structure`): otherwise
    `StateStructureError` names the differences and the writer (from the header)."""
    header, payload = read_header(data, source=source)
    try:
        raw = serialization.msgpack_restore(payload)
    except Exception as error:  # noqa: BLE001 - any decoder failure means a bad file
        raise CheckpointError(f"{source}: the payload cannot be decoded ({error}).") from None
    differences = structure_differences(serialization.to_state_dict(template), raw,
                                        dtypes="exact")
    if differences:
        writer = ", ".join(f"{key}={header.get(key)!r}" for key in _WRITER_KEYS
                           if key in header)
        raise StateStructureError(
            f"{source} does not fit this runner ({len(differences)} difference(s): "
            f"{format_differences(differences, limit=5)}); it was written by {writer}. "
            "Restore into a runner built from the same config.")
    return serialization.from_state_dict(template, raw), header


def write_file(path: str, data: bytes) -> None:
    """Writes atomically (a temporary file in the same directory, then a rename)."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".ckpt")
    umask = os.umask(0)
    os.umask(umask)
    try:
        os.chmod(tmp, 0o666 & ~umask)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def resolve_file(path: str) -> str:
    """The checkpoint file for `path`: `path/env_runner_state.ckpt` for a directory, or
    `path` itself for a file."""
    path = os.fspath(path)
    if os.path.isdir(path):
        return os.path.join(path, FILE_NAME)
    return path


def writer_metadata(runner: Any) -> dict[str, Any]:
    """What the header records about the runner that wrote a checkpoint."""
    import jaxrunner

    env = runner.config.env
    return {
        "runner_class": type(runner).__name__,
        "env": env if isinstance(env, str) else (getattr(runner, "env_name", None)
                                                 or type(env).__name__),
        "num_envs_per_env_runner": runner.config.num_envs_per_env_runner,
        "worker_index": runner.worker_index,
        "jaxrunner_version": jaxrunner.__version__,
        "jax_version": jax.__version__,
    }
