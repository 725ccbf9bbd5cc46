"""The handshake before every swap over the NCCL link, per sender->receiver pair: the sender
offers a header (version, plan key, packing digest, bucket size and count, payload bytes), the
receiver acks it or refuses before any NCCL call, and says `done` after the last bucket landed.

The protocol itself is `jax_amem_core.wire`, free of JAX, so a vLLM worker runs the very same
code; this module binds it to the swap's packings (`offer` / `await_ack` are the sender's steps,
`answer_offers` / `finish` the receiver's, for every peer of one swap). A link raises its
`Error` (SwapError here) on a refusal, and the store's StoreTimeout names what was awaited.
"""

from __future__ import annotations

from jax_amem_core import wire
from jax_amem_core.wire import answer, await_ack, header, mark_done, mismatch, offer, pair_key  # noqa: F401


def answer_offers(link, packings: dict, version: int, plan_key: str) -> None:
    """Acks (or refuses, raising SwapError) every peer's offer of this swap; both receivers."""
    wire.answer_offers(link, {peer: header(version, plan_key, pair) for peer, pair in packings.items()})


def finish(link, packings: dict, version: int) -> None:
    """After the last bucket landed: the communicator checked, `done` said to every trainer."""
    wire.finish(link, list(packings), version)
