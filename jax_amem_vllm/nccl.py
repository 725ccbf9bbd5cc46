"""The worker's end of the NCCL transport (a vLLM worker on another host than the trainer):
it joins the trainer's link and receives each layer group's rows into its staging buffer.

No JAX here: the link's protocol is `jax_amem_core.wire` (the same functions jax_amem's
cross-host swap runs), the NCCL calls and the row checks are jax-amem's compiled core
(`jax_amem_core.native`).

What the trainer publishes in the store (each rank's record, each group's schedule) and its
encoding are `jax_amem_core.nccl_schedule`, shared with the trainer. The worker validates every
table against its own staged tensors (in bounds, no byte written twice) before the first byte
arrives, so a wrong plan cannot write outside the staging buffer.
"""

from __future__ import annotations

import json

import numpy as np
from jax_amem_core import wire
from jax_amem_core.nccl_schedule import (TRAINER, Bucket, Schedule, decode_schedule, encode_schedule,  # noqa: F401
                                         note_key, record_key, schedule_key)

NO_SPLIT = 1 << 62    # the trainer already split the rows: validate, do not split again


# ----------------------------------------------------------------------------- a group's rows

def checked_rows(schedule: Schedule, staged: dict, group: int) -> list[np.ndarray]:
    """Every bucket's rows validated against the bucket and the staged tensors it names (their
    byte sizes): LinkError naming the group, bucket and cause, before anything is received."""
    from jax_amem_core.native import core

    out = []
    for k, bucket in enumerate(schedule.buckets):
        missing = [name for name in bucket.tensors if name not in staged]
        if missing:
            raise wire.LinkError(f"jax_amem: the trainer's plan for group {group} writes {missing}, which this "
                                 f"worker does not stage ({sorted(staged)[:6]}): connect again")
        if bucket.nbytes > schedule.bucket_bytes:
            raise wire.LinkError(f"jax_amem: group {group} bucket {k} holds {bucket.nbytes} bytes, more than the "
                                 f"link's {schedule.bucket_bytes}-byte buckets")
        sizes = [staged[name].numel() * staged[name].element_size() for name in bucket.tensors]
        try:
            out.append(core().copy.prepare_buffer_segments(np.ascontiguousarray(bucket.rows), [bucket.nbytes],
                                                           sizes, NO_SPLIT))
        except (ValueError, TypeError) as error:
            raise wire.LinkError(f"jax_amem: group {group} bucket {k}: the trainer's rows do not fit this worker's "
                                 f"staged tensors ({error}): connect again") from None
    return out


# ----------------------------------------------------------------------------- the link

class WorkerLink(wire.Pipes):
    """Rollout rank `record["rank"]` of the trainer's link: what wire.py's functions need, the
    communicator joined by `join()`, one staging pipe (two buckets) from the trainer (`pipe`
    and `close`: wire.Pipes, the same as jax_amem's Link)."""

    Error = wire.LinkError

    def __init__(self, store, record: dict, device: int):
        self.store, self.record, self.device = store, record, int(device)
        self.name, self.generation = record["link"], int(record["generation"])
        self.rank, self.rollouts = int(record["rank"]), int(record["rollouts"])
        self.comm_rank, self.nranks = 1 + self.rank, 1 + self.rollouts
        self.bucket_bytes, self.timeout = int(record["bucket_bytes"]), float(record["timeout"])
        self.sequence: dict[int, int] = {}
        self.pipes: dict[int, int] = {}
        self.comm: int | None = None

    def key(self, *parts) -> str:
        return wire.key("nccl", self.name, self.generation, *parts, error=wire.LinkError)

    def not_ready(self) -> str | None:
        return None if self.comm is not None else f"link {self.name!r} rank {self.comm_rank} has not joined"

    def join(self) -> None:
        """Collective with the trainer (it joins during the same update)."""
        from jax_amem_core.native import core

        member = wire.member("rollout", self.rank, self.record["owner"], self.bucket_bytes)
        unique_id, members = wire.meet(self.store, ("nccl", self.name, self.generation), self.comm_rank,
                                       self.nranks, member, self.timeout)
        wire.check_bucket_bytes(self.name, members, wire.LinkError)
        self.comm = core().transport.init_communicator(unique_id, self.nranks, self.comm_rank, self.device)


class Receiver:
    """A worker's NCCL receiving: the link (joined at the first update), each group's schedule
    and its validated rows on the device (read and checked at the group's first update)."""

    def __init__(self, store, session: str, rank: int, device):
        self.store, self.session, self.rank, self.device = store, session, rank, device
        self.link: WorkerLink | None = None
        self.record: dict | None = None
        self.groups: dict[int, tuple[Schedule, list]] = {}

    def transport(self, timeout: float) -> dict | None:
        """The trainer's record for this rank, None when it writes this rank another way. Read
        once; the trainer publishes it at connect, before any update."""
        if self.record is None:
            self.record = json.loads(wire.wait(self.store, record_key(self.session, self.rank), timeout,
                                               "the trainer's transport for this rank"))
        return self.record if self.record.get("kind") == "nccl" else None

    @property
    def active(self) -> bool:
        """The trainer writes this rank over NCCL (known once `transport` was read)."""
        return self.record is not None and self.record.get("kind") == "nccl"

    def join(self) -> None:
        if self.link is None:
            link = WorkerLink(self.store, self.record, self.device.index or 0)
            link.join()
            self.link = link

    def receive(self, group: int, staged: dict) -> int:
        """Group `group`'s rows from the trainer into `staged` ({name: tensor} of the staging
        buffer, on this worker's GPU); returns the version the trainer sent. The handshake
        refuses (LinkError on both sides) before any NCCL call when the plans differ."""
        self.join()
        schedule, tables = self._group(group, staged)
        accepted = wire.answer_offers(self.link, {TRAINER: schedule.expected()})
        version = accepted[TRAINER]["version"]
        wire.receive_buckets(self.link, TRAINER, self._stream(), [
            (b.nbytes, [staged[name].data_ptr() for name in b.tensors], table.data_ptr(), len(table))
            for b, table in zip(schedule.buckets, tables)])
        self._synchronize()
        wire.finish(self.link, [TRAINER], version)
        return version

    def _stream(self) -> int:
        """PyTorch's current stream on the worker's GPU: the unpack runs where vLLM's work runs."""
        import torch

        return torch.cuda.current_stream(self.device).cuda_stream

    def _synchronize(self) -> None:
        import torch

        torch.cuda.current_stream(self.device).synchronize()

    def _group(self, group: int, staged: dict):
        import torch

        if group not in self.groups:
            data = wire.wait(self.store, schedule_key(self.session, self.rank, group), self.link.timeout,
                             f"the trainer's schedule of group {group}")
            schedule = decode_schedule(data)
            rows = checked_rows(schedule, staged, group)
            self.groups[group] = (schedule, [torch.from_numpy(r).to(self.device) for r in rows])
        return self.groups[group]

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
            self.link = None
