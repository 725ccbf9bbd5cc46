"""What the trainer publishes for a vLLM worker it writes over NCCL, and how the worker reads it:
the store keys, each rank's record, each group's schedule and its encoding as bytes. The trainer
(`jax_amem.vllm.nccl`) encodes, the worker (`jax_amem_vllm.nccl`) decodes: both import it here.

What the trainer publishes in the store, per rank (`record_key`), after it planned:

    {"link": name, "generation": g, "rank": j (rollout rank), "rollouts": n, "owner": [p, d],
     "bucket_bytes": B, "timeout": s, "groups": G}

and per group (`schedule_key`, bytes from `encode_schedule`): the plan key and packing digest
the handshake compares, and per bucket its size, the staged tensors it lands in (by name, in
the bucket's slot order) and its unpack rows, (n, 6) int64 BufferSegment rows
`(0, dst slot, bucket offset, dst offset, bytes, 0)` as `jax_amem.swapping.cross_host.pairs.
bucket_table` makes them. The worker validates every table against its own staged tensors
(in bounds, no byte written twice) before the first byte arrives, so a wrong plan cannot
write outside the staging buffer.

The trainer is communicator rank 0 (one trainer rank); rollout rank j is rank 1 + j.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from . import wire

TRAINER = 0           # the trainer's communicator rank


def record_key(session: str, rank: int) -> str:
    return wire.key("vllm", session, "nccl", rank)


def schedule_key(session: str, rank: int, group: int) -> str:
    return wire.key("vllm", session, "nccl", rank, group)


def note_key(session: str, rank: int) -> str:
    """Where a worker given a store publishes its note (staging_note.py) for a trainer elsewhere."""
    return wire.key("vllm", session, "note", rank)


# ----------------------------------------------------------------------------- a group's schedule

@dataclass(frozen=True)
class Bucket:
    nbytes: int
    tensors: tuple[str, ...]   # the staged tensors, by the rows' dst slot
    rows: np.ndarray           # (n, 6) int64 unpack rows


@dataclass(frozen=True)
class Schedule:
    plan_key: str
    digest: str
    bucket_bytes: int
    nbytes: int                # payload
    buckets: tuple[Bucket, ...]

    def expected(self) -> dict:
        """The header this side expects (wire.header's fields); the version is the trainer's."""
        return {"version": None, "plan_key": self.plan_key, "digest": self.digest,
                "bucket_bytes": self.bucket_bytes, "buckets": len(self.buckets), "bytes": self.nbytes}


def encode_schedule(schedule: Schedule) -> bytes:
    """One JSON line (everything but the rows), then every bucket's rows as int64 bytes."""
    meta = {"plan_key": schedule.plan_key, "digest": schedule.digest, "bucket_bytes": schedule.bucket_bytes,
            "nbytes": schedule.nbytes,
            "buckets": [{"nbytes": b.nbytes, "tensors": list(b.tensors), "rows": len(b.rows)}
                        for b in schedule.buckets]}
    rows = [np.ascontiguousarray(b.rows, dtype="<i8").tobytes() for b in schedule.buckets]
    return json.dumps(meta).encode() + b"\n" + b"".join(rows)


def decode_schedule(data: bytes) -> Schedule:
    line, _, body = bytes(data).partition(b"\n")
    meta = json.loads(line)
    table = np.frombuffer(body, dtype="<i8").reshape(-1, 6)
    buckets, at = [], 0
    for b in meta["buckets"]:
        buckets.append(Bucket(int(b["nbytes"]), tuple(b["tensors"]), table[at:at + b["rows"]].astype(np.int64)))
        at += b["rows"]
    if at != len(table):
        raise wire.LinkError(f"jax_amem: a schedule of {len(table)} rows announces {at}: the trainer's message is "
                             "damaged or of another jax-amem version")
    return Schedule(meta["plan_key"], meta["digest"], int(meta["bucket_bytes"]), int(meta["nbytes"]), tuple(buckets))
