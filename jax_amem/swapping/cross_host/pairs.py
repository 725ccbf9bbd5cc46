"""What this rank moves in one swap over the link, derived from the global plan alone, so
both sides compute the same without talking: its plan owner, the peers it sends to or
receives from (by communicator rank) with each pair's packing (cached), the destination
tensors it receives and each bucket's validated unpack rows, and the report of a swap.
"""

from __future__ import annotations

import time

import numpy as np

from ...copy import prepare_buffer_segments
from ...reshard.plan_data import DST_OWNER, DST_TENSOR
from .. import cache
from ..errors import SwapError
from ..report import NcclSwapReport
from .packing import PairPacking, pack_pair, peers_of

_packings = cache.Lru("cross-host packings")


def check_version(version) -> int:
    if isinstance(version, bool) or not isinstance(version, (int, np.integer)):
        raise SwapError(f"version must be an int (both sides pass the same), got {version!r}")
    return int(version)


def check_plan_and_link(plan, link, verb: str) -> None:
    """send's and receive's `plan` and `link` of the right kinds (SwapError naming the one at fault)."""
    from ...reshard import Plan
    from .link import Link  # link.py imports send.py, which imports this module

    if not isinstance(plan, Plan):
        raise SwapError(f"{verb}: plan is {type(plan).__name__}, not a Plan (jax_amem.plan over both sides' layouts)")
    if not isinstance(link, Link):
        raise SwapError(f"{verb}: link is {type(link).__name__}, not a Link (jax_amem.swapping.cross_host.connect)")


def owner_id(plan, link) -> int:
    """The plan's id of the owner this link rank stands for."""
    try:
        return plan.owner_id(link.owner)
    except KeyError as error:
        raise SwapError(f"link rank {link.comm_rank} stands for owner {tuple(link.owner)}, which the plan does not "
                        f"know ({error.args[0]})") from None


def packing(plan, src: int, dst: int, bucket_bytes: int) -> PairPacking:
    """The buckets of owner `src` -> `dst` (plan owner ids), packed once per plan and size."""
    key = (plan.key, plan.owner, src, dst, bucket_bytes)
    found = _packings.get(key)
    return found if found is not None else _packings.put(key, pack_pair(plan, src, dst, bucket_bytes))


def peer_packings(plan, link, me: int, role: str) -> dict[int, PairPacking]:
    """{peer communicator rank: packing} of every pair owner `me` takes part in as `role`
    ("sender" / "receiver"); SwapError when the plan and the link disagree on a peer's role."""
    out = {}
    for other in peers_of(plan, me, role):
        rank = link.comm_rank_of(plan.owner_of(other), f"{role} {tuple(link.owner)}")
        peer_role = "rollout" if role == "sender" else "trainer"
        if (rank >= link.trainers) != (peer_role == "rollout"):
            raise SwapError(f"the plan has owner {tuple(plan.owner_of(other))} {'receive' if role == 'sender' else 'send'}, "
                            f"but on link {link.name!r} it is a {'trainer' if rank < link.trainers else 'rollout'} rank")
        pair = (me, other) if role == "sender" else (other, me)
        out[rank] = packing(plan, *pair, link.bucket_bytes)
    return out


def received_tensors(plan, owner_id: int) -> list[int]:
    """Plan destination tensor ids that owner `owner_id` receives bytes of, sorted."""
    t = plan.transfers
    return sorted(set(t[t[:, DST_OWNER] == owner_id, DST_TENSOR].tolist()))


def bucket_table(packing: PairPacking, bucket, plan, owner) -> np.ndarray:
    """One bucket's unpack rows, validated against the bucket and the destination shards of
    `owner` (sizes from the plan) and split into pieces: (n, 6) int64 BufferSegment rows.
    Both receivers (into PyTorch, into JAX) take their tables from here."""
    sizes = [_shard_bytes(plan, t, owner) for t in bucket.dst_tensors]
    return prepare_buffer_segments(bucket.recv_rows, [packing.bucket_bytes], sizes)


def _shard_bytes(plan, tensor: int, owner) -> int:
    layout = plan.dst_layouts[plan.dst_names[tensor]]
    _, size = layout.shard_box(owner)
    return int(np.prod(size, dtype=np.int64)) * layout.dtype.itemsize


def report(role, version, packings, link, start, dst=None) -> NcclSwapReport:
    return NcclSwapReport(role, version, sum(p.nbytes for p in packings.values()),
                          sum(p.wire_bytes for p in packings.values()),
                          sum(len(p.buckets) for p in packings.values()), sorted(packings),
                          link.staging_bytes, time.perf_counter() - start, dst)
