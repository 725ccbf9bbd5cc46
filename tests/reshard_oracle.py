"""Shared by the reshard tests: sharded sources on 8 CPU devices (a 2-D mesh), destination
layouts over other owners, and the check that a plan writes exactly the expected arrays."""

import numpy as np

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from jax_amem import reshard
from jax_amem.reshard import Layout, Owner, numpy_exec

TP = 2
ROLLOUT = [Owner(1, 8 + i) for i in range(2 * TP)]  # two TP=2 replicas on another host


def mesh_2d():
    return Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("fsdp", "tp"))


def shard_tree(tree, mesh=None):
    """Every leaf split over both mesh axes where its shape allows, else replicated."""
    mesh = mesh or mesh_2d()

    def spec(x):
        axes = [None] * x.ndim
        free = [("fsdp", 2), ("tp", 4)]
        for dim in range(x.ndim - 1, -1, -1):
            if free and x.shape[dim] % free[-1][1] == 0:
                axes[dim] = free.pop()[0]
        return P(*axes)
    return jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, spec(x))), tree)


def rollout_layout(shape, dtype, owners=ROLLOUT):
    """Tensor parallel over dim 0 when it splits, else replicated."""
    if len(shape) and shape[0] % TP == 0:
        return Layout.tensor_parallel(shape, dtype, 0, TP, owners)
    return Layout.replicated(shape, dtype, owners)


def plan_and_run(arrays, want: dict, rules, dtype=None, owners=ROLLOUT):
    """Plans `arrays` -> destinations shaped like `want` (in `dtype`, default each want's own)
    with `rules`, runs the plan with numpy, and asserts every destination shard equals `want`
    byte for byte. Returns the plan."""
    dst = {k: rollout_layout(v.shape, np.dtype(dtype or v.dtype), owners) for k, v in want.items()}
    plan = reshard.plan(arrays, dst, rules, cache=False, check=True)
    sources = {}
    for name, leaf in reshard.tree_names(arrays).items():
        sources.update(numpy_exec.shards_of(name, leaf))
    out = numpy_exec.execute(plan, sources)
    for name, full in want.items():
        layout = dst[name]
        for owner in owners:
            expected = np.ascontiguousarray(np.asarray(full).astype(layout.dtype)[layout.shard_slices(owner)])
            got = out[(name, owner)]
            assert got.shape == expected.shape and np.array_equal(got.view(np.uint8), expected.view(np.uint8)), \
                (name, owner)
    return plan
