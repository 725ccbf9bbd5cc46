"""The handshake before every swap over the NCCL link, per sender->receiver pair:

1. the sender publishes a header: version, plan key, the packing's digest, bucket size,
   bucket count, payload bytes;
2. the receiver compares it with what it computed itself and publishes an ack: ok, or the
   reason it refuses; a refusal raises SwapError on both sides before any NCCL call, so a
   mismatch never leaves a send waiting on the GPU for a receive that will not come;
3. after the last bucket is unpacked (and synchronised) the receiver publishes `done`.

`offer` / `await_ack` are the sender's steps; `answer_offers` / `finish` the receiver's, for
every peer of one swap.

Keys carry the pair's swap count `n` (both sides count their swaps with each peer), so a
stale message of an earlier swap is never read as the current one.
"""

from __future__ import annotations

import json

from ..._native import core
from .. import store as S
from ..errors import SwapError
from .packing import PairPacking


def header(version: int, plan_key: str, packing: PairPacking) -> dict:
    return {"version": int(version), "plan_key": plan_key, "digest": packing.digest,
            "bucket_bytes": packing.bucket_bytes, "buckets": len(packing.buckets),
            "bytes": packing.nbytes}


def mismatch(sent: dict, expected: dict) -> str | None:
    """Why the receiver refuses the sender's header, or None."""
    if sent["version"] != expected["version"]:
        return (f"version mismatch: the trainer sends version {sent['version']}, the rollout expects "
                f"version {expected['version']}; call send and receive with the same version")
    if sent["plan_key"] != expected["plan_key"]:
        return (f"plan mismatch: the trainer planned {sent['plan_key'][:12]}, the rollout "
                f"{expected['plan_key'][:12]}; build both plans from the same layouts and rules")
    if sent["bucket_bytes"] != expected["bucket_bytes"]:
        return (f"bucket size mismatch: trainer {sent['bucket_bytes']} bytes, rollout "
                f"{expected['bucket_bytes']}; connect both with the same bucket_bytes")
    if sent["digest"] != expected["digest"]:
        return ("packing mismatch: both sides hold the same plan key but packed different buckets "
                "(different jax_amem versions?)")
    return None


def _pair(link, sender: int, receiver: int, n: int, part: str) -> str:
    return link.key(f"{sender}-{receiver}", n, part)


def offer(link, receiver: int, n: int, message: dict) -> None:
    """Sender, step 1."""
    link.store.set(_pair(link, link.comm_rank, receiver, n, "header"), json.dumps(message).encode())


def await_ack(link, receiver: int, n: int) -> None:
    """Sender: waits for the receiver's answer; SwapError carrying its refusal."""
    key = _pair(link, link.comm_rank, receiver, n, "ack")
    answer = json.loads(_get(link, key, f"rollout rank {receiver}'s answer to swap {n}"))
    if "error" in answer:
        raise SwapError(f"the rollout (communicator rank {receiver}) refused the swap, nothing was sent: "
                        f"{answer['error']}")


def answer(link, sender: int, n: int, expected: dict, refuse: str | None = None) -> None:
    """Receiver, step 2: reads the header, acks or refuses (and raises). `refuse`: a reason
    of the receiver's own (its communicator is paused) to refuse whatever the header says."""
    key = _pair(link, sender, link.comm_rank, n, "header")
    sent = json.loads(_get(link, key, f"trainer rank {sender}'s header of swap {n}"))
    reason = refuse or mismatch(sent, expected)
    ack = _pair(link, sender, link.comm_rank, n, "ack")
    if reason is not None:
        link.store.set(ack, json.dumps({"error": reason}).encode())
        raise SwapError(f"refused the swap from trainer (communicator rank {sender}), nothing was "
                        f"received: {reason}")
    link.store.set(ack, b'{"ok": true}')


def mark_done(link, sender: int, n: int, version: int) -> None:
    link.store.set(_pair(link, sender, link.comm_rank, n, "done"), str(int(version)).encode())


def answer_offers(link, packings: dict, version: int, plan_key: str) -> None:
    """Acks (or refuses, raising SwapError) every peer's offer of this swap; both receivers."""
    refuse = link.not_ready()  # refused through the ack, so the trainer never sends into it
    for peer, pair in packings.items():
        n = link.sequence.get(peer, 0)
        try:
            answer(link, peer, n, header(version, plan_key, pair), refuse)
        except S.StoreTimeout:
            raise  # the trainer never offered swap n: the next call waits for it again
        except SwapError:
            link.sequence[peer] = n + 1  # refused: both sides move past swap n
            raise
        link.sequence[peer] = n + 1


def finish(link, packings: dict, version: int) -> None:
    """After the last bucket landed: the communicator checked, `done` said to every trainer."""
    core.transport.check_communicator(link.comm)
    for peer in packings:
        mark_done(link, peer, link.sequence[peer] - 1, version)


def _get(link, key: str, what: str) -> bytes:
    try:
        return link.store.get(key, timeout=link.timeout)
    except S.StoreTimeout as error:
        raise S.StoreTimeout(f"waiting for {what} on link {link.name!r}: {error}") from None
