"""The swap to another host: a JAX trainer sends its parameters, resharded as a plan says,
over NCCL send/recv into a rollout process's PyTorch tensors or jax.Arrays, in place.

    from jax_amem.swapping import cross_host
    from jax_amem.swapping.store import TorchStore

    # both sides: the same global plan (plans are deterministic: identical rows and order)
    plan = reshard.plan(trainer_layouts, rollout_layouts, rules=...)
    # trainer process (rollout rank 0 hosts the TCPStore)
    link = cross_host.connect(TorchStore.connect(host, port), "trainer", 0, trainers=1, rollouts=1,
                              owner=(0, 0), device=0)
    jax_amem.swap(params, link, plan=plan, version=3)      # or cross_host.send(params, plan, link, 3)
    # rollout process
    link = cross_host.connect(TorchStore.connect(host, port, is_master=True), "rollout", 0,
                              trainers=1, rollouts=1, owner=(1, 0), device=0)
    cross_host.receive(dict(model.named_parameters()), plan, link, version=3)
    # or a JAX rollout (plan with rollout_layouts = cross_host.destination_layouts(params, 1)):
    params = cross_host.receive(params, plan, link, version=3).dst   # its shards donated, written in place

Between swaps both sides may call `jax_amem.nccl.pause(ids=[link.interposer_id])` (a collective) to
free the link's communicator and `jax_amem.nccl.resume()` before the next swap.

Modules, in the order a swap meets them: link.py (the communicator over every trainer and
rollout rank), pairs.py (from the global plan and this rank's owner: the pairs it takes part
in, each packed into bounded buckets by packing.py), handshake.py (before any NCCL call,
version, plan key and packing digest compared per pair), send.py (the trainer's program),
receive.py -> receive_torch.py / receive_jax.py (the rollout's). Buckets move through two
staging slots per peer (src/transport/bucket_pipe.h). See docs/swap.md.
"""

from ...reshard import Owner
from ..report import NcclSwapReport
from .link import Link, connect
from .receive import receive
from .receive_jax import destination_layouts
from .send import send

__all__ = ["Link", "NcclSwapReport", "Owner", "connect", "destination_layouts", "receive", "send"]
