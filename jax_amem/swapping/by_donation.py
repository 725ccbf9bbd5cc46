"""The contract of a destination written by donation: a pytree of jax.Arrays whose buffers
are donated to the copy and come back written, as new arrays in the same memory.

`ByDonation` declares everything the swap reads of such a destination; `JaxDestination` is
the one kind (the in-process swap, and the cross-host receiver into JAX, use it alike).
`assemble` and `recover` take the donated buffers' order and shard indices as plain lists,
whatever made them (an in-process program, a cross-host receive).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import jax
import numpy as np

from ..reshard import Layout, Owner
from ..reshard.plan_data import Plan
from . import checks
from .errors import PartialSwapError, SwapError
from .sources import array_facts, check_live_arrays, flat_named, layout_of, shard_data, shard_positions

Buffer = tuple[str, Owner]  # (destination name, owner): one buffer the swap writes


@runtime_checkable
class ByDonation(Protocol):
    """What the swap reads of a destination it writes by donation."""

    writes_by_address: bool   # False: this contract (by address: `by_address.ByAddress`)
    signature: tuple          # everything its checks depend on: the plan and program cache key

    def names(self) -> list[str]: ...
    def tied(self) -> list[tuple[str, ...]]: ...
    def layouts(self) -> dict: ...
    def check(self, plan: Plan, process: int) -> dict[Buffer, object]: ...  # {(name, owner): device}
    def shard_index(self, name: str, owner: Owner): ...
    def before_donating(self, sources) -> None: ...
    def inputs(self, order, indices) -> list: ...
    def assemble(self, order, indices, outputs: list): ...
    def recover(self, order, indices, outputs: list, total: int, error: BaseException) -> PartialSwapError: ...
    def after(self, new_tree) -> "ByDonation": ...
    def host_bytes(self, name: str, owner: Owner) -> np.ndarray: ...


class JaxDestination:
    """A pytree of jax.Arrays (any sharding), written by donation."""

    writes_by_address = False

    def __init__(self, tree):
        self.tree = tree
        names, leaves, treedef = flat_named(tree)
        check_live_arrays(names, leaves, "destination")
        self.arrays = dict(zip(names, leaves))
        self.signature = ("jax", treedef, tuple(map(array_facts, leaves)))
        self._shards = None  # {name: single-device arrays}, read before donating

    def names(self) -> list[str]:
        return list(self.arrays)

    def tied(self) -> list[tuple[str, ...]]:
        return []  # one array under two names is refused before donating (checks.jax_destinations)

    def before_donating(self, sources) -> None:
        """Per swap, before the first donation: no array named twice, none a source, no buffer
        shared with another destination or a source, no deleted shard (checks.jax_destinations;
        `sources` None: none in this process). Keeps every array's single-device shards: once
        one shard of an array is donated, JAX refuses to list them, and `assemble` needs them."""
        self._shards = checks.jax_destinations(list(self.arrays), list(self.arrays.values()), sources)

    def after(self, new_tree) -> "JaxDestination":
        return JaxDestination(new_tree)

    def host_bytes(self, name: str, owner: Owner) -> np.ndarray:
        array = self.arrays[name]
        shard = shard_data(array, shard_positions(array)[owner][0])
        return np.ascontiguousarray(np.asarray(shard)).reshape(-1).view(np.uint8)

    def layouts(self) -> dict[str, Layout]:
        return {name: layout_of(a.sharding, a.shape, a.dtype) for name, a in self.arrays.items()}

    def check(self, plan: Plan, process: int) -> dict[Buffer, object]:
        """{(name, owner): device} of every shard the plan writes, each array laid out as the
        plan says (the names were checked already: names.check)."""
        out = {}
        for name, array in self.arrays.items():
            layout = plan.dst_layouts[name]
            if layout_of(array.sharding, array.shape, array.dtype) != layout:
                if tuple(array.shape) != layout.shape or np.dtype(array.dtype) != layout.dtype:
                    raise SwapError(f"destination {name!r} is {np.dtype(array.dtype).name}{list(array.shape)}; the "
                                    f"plan writes {layout.dtype.name}{list(layout.shape)} (nothing was written)")
                mine = sorted((o.process, o.device) for o in shard_positions(array))
                raise SwapError(f"destination {name!r} is sharded over devices {[d for _, d in mine][:8]} "
                                f"({array.sharding}); the plan was made for another layout over owners "
                                f"{[tuple(o) for o in layout.owners][:8]} (nothing was written)")
            for owner, (_, device) in shard_positions(array).items():
                out[(name, owner)] = device
        return out

    def shard_index(self, name: str, owner: Owner):
        positions = shard_positions(self.arrays[name])
        return None if len(positions) == 1 else positions[owner][0]

    def inputs(self, order, indices) -> list:
        arrays = self.arrays
        return [arrays[name] if i is None else shard_data(arrays[name], i) for (name, _), i in zip(order, indices)]

    def assemble(self, order, indices, outputs: list):
        """The new pytree: each array rebuilt from its written shards (the donated buffers'
        successors) and, where a shard received nothing, its old shard; the old arrays are
        deleted when every shard was donated."""
        by_name: dict = {}
        for (name, _), index, output in zip(order, indices, outputs):
            by_name.setdefault(name, {})[index] = output
        new = {}
        for name, array in self.arrays.items():
            written = by_name.get(name, {})
            if not written:  # nothing donated (a zero-size array, or one the plan leaves alone): as it was
                new[name] = array
                continue
            if None in written:  # a single-device array: the result itself
                new[name] = written[None]
                continue
            count = len(shard_positions(array))
            old = self._shards[name] if self._shards else [shard_data(array, i) for i in range(count)]
            shards = [written[i] if i in written else old[i] for i in range(count)]
            new[name] = jax.make_array_from_single_device_arrays(array.shape, array.sharding, shards)
            if len(written) == count:
                array.delete()  # every buffer now belongs to the new array; mark the old one gone
        leaves = [new[name] for name in self.arrays]
        return jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(self.tree), leaves)

    def recover(self, order, indices, outputs: list, total: int, error: BaseException) -> PartialSwapError:
        """The error for a swap that failed after donating: the buffers of the groups that
        ran are in `outputs` (program order), the others were never donated, so every array
        can be rebuilt. `error.dst` is that whole pytree (written arrays hold the new values,
        the rest the old), `error.written` the names written in full."""
        order = list(order)[:len(outputs)]
        counts: dict = {}
        for name, _ in order:
            counts[name] = counts.get(name, 0) + 1
        written = [n for n, c in counts.items() if c == len(shard_positions(self.arrays[n]))]
        try:
            tree = self.assemble(order, indices, outputs)
        except Exception as rebuild:  # noqa: BLE001 - keep the shards reachable whatever went wrong
            tree = None
            note = f"; the pytree could not be rebuilt ({rebuild}): error.shards holds every written shard"
        else:
            note = ": error.dst holds every destination (the written ones new, the others as they were)"
        return PartialSwapError(
            f"the swap into jax.Arrays failed after {len(outputs)} of {total} buffers were donated and "
            f"written ({len(written)} arrays in full){note}. Cause: {type(error).__name__}: {error}",
            dst=tree, written=written, shards=dict(zip(order, outputs)))
