"""The trainer's layout: a one-axis mesh over every device, parameters split FSDP-style.

Each parameter is split along its largest dimension that the device count
divides (replicated when none does); batches are split along their first axis.
This is what makes the swap a real reshard: the rollout holds whole tensors.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

AXIS = "fsdp"


def trainer_mesh(devices=None) -> Mesh:
    devices = list(devices if devices is not None else jax.devices())
    return Mesh(np.array(devices), (AXIS,))


def fsdp_spec(shape, parts: int) -> PartitionSpec:
    dims = sorted(range(len(shape)), key=lambda d: (-shape[d], d))
    for d in dims:
        if shape[d] % parts == 0 and shape[d] >= parts:
            spec = [None] * len(shape)
            spec[d] = AXIS
            return PartitionSpec(*spec)
    return PartitionSpec()


def fsdp_shardings(tree, mesh: Mesh):
    parts = mesh.shape[AXIS]
    return jax.tree_util.tree_map(lambda x: NamedSharding(mesh, fsdp_spec(x.shape, parts)), tree)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec(AXIS))


def shard_params(params, mesh: Mesh):
    return jax.device_put(params, fsdp_shardings(params, mesh))
