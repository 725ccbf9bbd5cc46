"""The rollout's receiver into PyTorch tensors (no JAX GPU backend needed).
Per peer and bucket, one native call (`core.transport.recv_bucket`): ncclRecv into a staging
slot on the pipe's stream, then one LaunchBufferSegmentCopy on PyTorch's current stream that
unpacks the bucket's rows into the tensors' memory by address. The unpack tables live on the
device (uploaded once per (plan, peer, bucket size, device), in PyTorch memory).

The receiver for a pytree of jax.Arrays (donated, unpacked on XLA's stream) is
receive_jax.py; both take their tables from `pairs.bucket_table`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from jax_amem_core import wire

from .. import cache, torch_bridge
from ..errors import SwapError
from ..report import NcclSwapReport
from . import handshake
from .packing import PairPacking
from .pairs import bucket_table, owner_id, peer_packings, received_tensors, report

_tables = cache.Lru("cross-host unpack tables (PyTorch receiver, on the device)")


def receive(tensors: dict, plan, link, version: int, start: float) -> NcclSwapReport:
    """receive.receive for {name: torch.Tensor}: checked, offers answered, every peer's
    buckets unpacked on PyTorch's current stream, synchronised, `done` said."""
    import torch

    me = owner_id(plan, link)
    by_id = check_tensors(tensors, plan, me, link.device)
    packings = peer_packings(plan, link, me, "receiver")
    handshake.answer_offers(link, packings, version, plan.key)
    for peer, pair in packings.items():
        key = (plan.key, pair.src_owner, pair.dst_owner, pair.bucket_bytes, link.device)
        tables = _tables.get(key)
        if tables is None:
            tables = _tables.put(key, upload_tables(pair, plan, link.owner, link.device))
        receive_pair(link, peer, pair, tables, by_id)
    torch.cuda.current_stream(link.device).synchronize()
    handshake.finish(link, packings, version)
    return report("rollout", version, packings, link, start, dst=tensors)


@dataclass
class BucketTables:
    rows: list      # per bucket: a CUDA int64 tensor (n, 6) of validated, split rows
    counts: list[int]


def check_tensors(tensors: dict, plan, owner_id: int, device: int) -> dict:
    """{destination tensor id: tensor} for every destination this owner receives; SwapError
    naming the first tensor that is missing, extra, or of the wrong shape/dtype/device."""
    import torch

    wanted = received_tensors(plan, owner_id)
    names = plan.dst_names
    owner = plan.owner_of(owner_id)
    missing = [names[i] for i in wanted if names[i] not in tensors]
    extra = sorted(set(tensors) - {names[i] for i in wanted})
    if missing or extra:
        raise SwapError(f"receive(): destination names do not match the plan for owner {tuple(owner)}: "
                        f"missing {missing}, extra {extra}. Nothing was received.")
    out = {}
    for i in wanted:
        name, tensor = names[i], tensors[names[i]]
        layout = plan.dst_layouts[name]
        _, size = layout.shard_box(owner)
        if not isinstance(tensor, torch.Tensor):
            raise SwapError(f"destination {name!r} is a {type(tensor).__name__}, not a torch.Tensor")
        if tuple(tensor.shape) != tuple(size):
            raise SwapError(f"destination {name!r} has shape {tuple(tensor.shape)}, the plan's shard for owner "
                            f"{tuple(owner)} is {tuple(size)}")
        if torch_bridge.numpy_dtype(tensor) != layout.dtype:
            raise SwapError(f"destination {name!r} is {tensor.dtype}, the plan writes {layout.dtype.name}")
        if not tensor.is_contiguous() or tensor.untyped_storage().nbytes() == 0:
            raise SwapError(f"destination {name!r} is not contiguous (or its storage was freed): "
                            "give the tensor itself, contiguous")
        out[i] = tensor
    for i, tensor in out.items():  # devices last: every other check also runs on CPU tensors
        if tensor.device.type != "cuda" or tensor.device.index != device:
            raise SwapError(f"destination {names[i]!r} is on {tensor.device}, the link receives on cuda:{device}")
    return out


def upload_tables(packing: PairPacking, plan, owner, device: int) -> BucketTables:
    """Validates every bucket's unpack rows against the bucket and the destination shards
    (sizes from the plan), splits long rows, and puts them on the device."""
    import torch

    rows, counts = [], []
    for bucket in packing.buckets:
        table = bucket_table(packing, bucket, plan, owner)
        rows.append(torch.from_numpy(np.ascontiguousarray(table)).to(f"cuda:{device}"))
        counts.append(len(table))
    return BucketTables(rows, counts)


def receive_pair(link, peer: int, packing: PairPacking, tables: BucketTables, by_id: dict) -> None:
    """Enqueues every bucket from communicator rank `peer` on PyTorch's current stream (the
    loop is jax_amem_core.wire's, which the vLLM worker runs too)."""
    import torch

    stream = torch.cuda.current_stream(link.device).cuda_stream
    wire.receive_buckets(link, peer, stream, [
        (bucket.nbytes, [by_id[t].data_ptr() for t in bucket.dst_tensors], tables.rows[k].data_ptr(),
         tables.counts[k]) for k, bucket in enumerate(packing.buckets)])
