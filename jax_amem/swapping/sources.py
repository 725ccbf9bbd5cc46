"""The trainer's side of a swap: a pytree of jax.Arrays, by '/'-joined name, and their shards."""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp

from .. import _jax_compat
from ..reshard import Layout, LayoutError, Owner, tree_names
from ..reshard.from_jax import unflattenable
from .cache import Table, memoized
from .errors import SwapError

# Per array facts, read for every array of a model: room for the distinct (sharding, shape,
# dtype) of thousands of tensors.
FACTS_ENTRIES = 8192


@memoized("layouts of arrays", FACTS_ENTRIES)
def layout_of(sharding, shape, dtype) -> Layout:
    """Layouts are pure functions of (sharding, shape, dtype): computed once per triple."""
    return Layout.from_sharding(sharding, shape, dtype)


_positions = Table("shard positions", FACTS_ENTRIES)


def shard_positions(array) -> dict[Owner, tuple[int, object]]:
    """owner -> (i, device) with `array.addressable_data(i)` that owner's shard; cached per
    (sharding, shape), as the first `addressable_shards` of an array is slow."""
    key = (array.sharding, array.shape)
    found = _positions.get(key)
    if found is None:
        found = _positions.add(key, {Owner(s.device.process_index, s.device.id): (i, s.device)
                                     for i, s in enumerate(array.addressable_shards)})
    return found


def shard_data(array, i: int):
    """The single-device array of shard i (the order of `addressable_shards`). Not
    `addressable_data(i)`: for a replicated array that returns the first replica whatever i."""
    arrays = _jax_compat.shard_arrays(array)  # fast (no Shard objects); public fallback below
    return arrays[i] if arrays is not None else array.addressable_shards[i].data


def flatten(tree, side: str = "tree") -> tuple[list, object]:
    """`jax.tree_util.tree_flatten(tree)`; a SwapError naming `side` where JAX cannot flatten it
    (dict keys that do not sort: 0 and '0' side by side)."""
    try:
        return jax.tree_util.tree_flatten(tree)
    except (TypeError, ValueError) as error:
        raise SwapError(unflattenable(tree, side, error)) from None


def flat_named(tree, side: str = "tree") -> tuple[list, list, object]:
    """(names, leaves, treedef): `tree_names(tree)` split, the names cached per tree structure
    (a swap runs every step; the structure, and so the names, rarely change)."""
    leaves, treedef = flatten(tree, side)
    return names_of(tree, treedef), leaves, treedef


_names_of_treedef = Table("tree names")


def names_of(tree, treedef) -> list[str]:
    """The leaves' names of `tree` (whose structure is `treedef`), cached per structure."""
    names = _names_of_treedef.get(treedef)
    if names is None:
        try:
            names = _names_of_treedef.add(treedef, list(tree_names(tree)))
        except LayoutError as error:
            raise SwapError(str(error)) from None
    return names


def check_live_arrays(names, leaves, side: str) -> None:
    """SwapError naming the first leaf that is not a live jax.Array."""
    for name, leaf in zip(names, leaves):
        if not isinstance(leaf, jax.Array):
            fix = ("the swap writes jax.Arrays (donated) or PyTorch tensors (in place); for a NumPy array give "
                   "torch.from_numpy(array) (writable), or a jax.Array" if side == "destination" else
                   "give jax.Arrays (jax.device_put(x) makes one)")
            raise SwapError(f"{side} {name!r} is a {type(leaf).__name__}, not a jax.Array: {fix}")
        if leaf.is_deleted():
            raise SwapError(f"{side} {name!r} was deleted (donated to a jitted function or freed): "
                            "pass the live array")


def named_arrays(tree, side: str) -> dict[str, jax.Array]:
    """`{name: array}`, every leaf a live jax.Array; SwapError names the first that is not."""
    names, leaves, _ = flat_named(tree, f"{side} tree")
    check_live_arrays(names, leaves, side)
    return dict(zip(names, leaves))


# What a cached program depends on, per array; read in C for thousands of arrays per swap.
array_facts = operator.attrgetter("sharding", "shape", "dtype")


class Sources:
    """The source arrays by name, their layouts, and single-device shards by owner. Made from
    the tree flattened once by the swap (`leaves`, `treedef`)."""

    def __init__(self, tree, leaves=None, treedef=None):
        if treedef is None:
            leaves, treedef = flatten(tree, "source tree")
        names = names_of(tree, treedef)
        check_live_arrays(names, leaves, "source")
        self.tree, self.leaves, self.treedef, self.names = tree, leaves, treedef, names
        self.arrays = dict(zip(names, leaves))
        # The tree structure fixes the names; the facts fix every layout.
        self.signature = (treedef, tuple(map(array_facts, leaves)))
        self._layouts = None

    def same_array(self) -> dict[str, str]:
        """{name: the first name of the same jax.Array} for sources given under two names."""
        first: dict = {}
        return {name: first.setdefault(id(array), name) for name, array in self.arrays.items()}

    def layouts(self) -> dict[str, Layout]:
        if self._layouts is None:
            self._layouts = {name: layout_of(a.sharding, a.shape, a.dtype) for name, a in self.arrays.items()}
        return self._layouts

    def shard(self, name: str, owner: Owner):
        array = self.arrays[name]
        return shard_data(array, shard_positions(array)[owner][0])

    def locate_all(self, wanted) -> dict:
        """{(name, owner): locate(name, owner)} for every pair in `wanted`."""
        return {key: self.locate(*key) for key in wanted}

    def locate(self, name: str, owner: Owner) -> tuple:
        """(shard index, or None for a single-device array; its JAX device) of source `name`'s
        shard of `owner`; SwapError when this process holds no such shard."""
        positions = shard_positions(self.arrays[name])
        if owner not in positions:
            raise SwapError(f"the plan reads source {name!r} from owner {tuple(owner)}, which holds no "
                            "addressable shard of it here (nothing was written)")
        index, device = positions[owner]
        return (None if len(positions) == 1 else index), device


def prepare_view(shard, perm, dtype):
    """The sender's view of a shard: transposed by `perm`, cast to `dtype` (row-major bytes).
    Traced inside the in-process routes and the cross-host sender alike."""
    if tuple(perm) != tuple(range(shard.ndim)):
        shard = jnp.transpose(shard, perm)
    if shard.dtype != jnp.dtype(dtype):
        shard = shard.astype(dtype)
    return shard
