"""The note a vLLM worker writes to tell the trainer where its staging buffer is, read by the
trainer (`jax_amem.vllm`) and written by the worker (`jax_amem_vllm.engine`): its path, its
atomic write and its removal. No PyTorch, no JAX: both sides import it.

The note is `<directory>/jax_amem-<session>-rank<r>.json`: the worker's process, its model's
description (`jax_amem_vllm/layout.py`) and the buffer's place (`jax_amem_vllm/staging.py`). The
trainer reads it after `init_weight_transfer_engine` returns on every rank, then removes it. A
worker given the trainer's store publishes the same note there instead (`nccl_schedule.note_key`).
"""

from __future__ import annotations

import json
import os
import socket
import tempfile


def default_directory() -> str:
    return "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()


def note_path(directory: str, session: str, rank: int) -> str:
    return os.path.join(directory, f"jax_amem-{session}-rank{rank}.json")


def stamped(note: dict) -> dict:
    """The note with where the worker runs: its host and process."""
    return {**note, "host": socket.gethostname(), "pid": os.getpid()}


def write_note(path: str, note: dict) -> None:
    """Written whole or not at all (a reader never sees half a note)."""
    note = stamped(note)
    partial = f"{path}.{os.getpid()}.partial"
    with open(partial, "w") as f:
        json.dump(note, f)
    os.replace(partial, path)


def remove(*paths: str) -> None:
    for path in paths:
        try:
            os.unlink(path)
        except (FileNotFoundError, TypeError):
            pass
