"""What the NCCL swap workers share: process 0 is the JAX trainer (GPU backend), process 1
the PyTorch rollout (JAX on CPU only, for the plan). The rollout hosts the TCPStore; both
connect the link and build the same global plan from layouts."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

TRAINER_OWNER = (0, 0)
ROLLOUT_OWNER = (1, 0)


def start(rank: int, jax_rollout: bool = False):
    """Imports jax_amem first (the NCCL interposer in front) with the right JAX platform.
    `jax_rollout`: the rollout receives into jax.Arrays, so it keeps JAX's GPU backend."""
    if os.environ.get("WORKER_HANG_DUMP_S"):  # a hang prints every thread's stack, then exits
        import faulthandler

        faulthandler.dump_traceback_later(float(os.environ["WORKER_HANG_DUMP_S"]), exit=True)
    if rank == 1 and not jax_rollout:
        os.environ["JAX_PLATFORMS"] = "cpu"  # the rollout: PyTorch on the GPU, no JAX GPU backend
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/: the Llama helpers
    import jax_amem  # noqa: F401

    return "trainer" if rank == 0 else "rollout"


def emit(**fields):
    print("RESULT " + json.dumps(fields), flush=True)


_store = None


def store(role: str, port: str):
    """This process's TorchStore (the rollout's is the server), made once."""
    global _store
    if _store is None:
        from jax_amem.swapping.store import TorchStore

        _store = TorchStore.connect("127.0.0.1", int(port), is_master=(role == "rollout"), timeout=120)
    return _store


def link(role: str, port: str, **options):
    from jax_amem.swapping import cross_host as nt

    device = int(os.environ.get("WORKER_LOCAL_DEVICE", "0"))
    owner = TRAINER_OWNER if role == "trainer" else ROLLOUT_OWNER
    return nt.connect(store(role, port), role, 0, trainers=1, rollouts=1, owner=owner, device=device,
                      timeout=120, **options)


def barrier(link, name: str):
    """Both processes reach `name` (over the link's store)."""
    link.store.set(link.key("barrier", name, link.role), b"1")
    other = "rollout" if link.role == "trainer" else "trainer"
    link.store.get(link.key("barrier", name, other), timeout=120)


def layouts_to_json(layouts: dict) -> bytes:
    """{name: Layout} in full (owners and boxes), for the rollout to publish to the trainer."""
    return json.dumps({n: {"shape": list(l.shape), "dtype": l.dtype.name, "owners": [list(o) for o in l.owners],
                           "starts": l.starts.tolist(), "sizes": l.sizes.tolist(),
                           "box_of_owner": l.box_of_owner.tolist()} for n, l in layouts.items()}).encode()


def layouts_from_json(text: bytes) -> dict:
    import jax.numpy as jnp

    from jax_amem.reshard import Layout

    return {n: Layout(tuple(d["shape"]), jnp.dtype(d["dtype"]), [tuple(o) for o in d["owners"]], d["starts"],
                      d["sizes"], d["box_of_owner"]) for n, d in json.loads(text).items()}
