"""The rollout's side of a swap: what every kind of destination is to `jax_amem.swap`.

`Destination` is the one protocol the front door knows: `swap_from` / `verify_from`. Every
kind implements it: PyTorch tensors by name (TorchDestination) and a pytree of jax.Arrays
(JaxDestination), both here; another process's tensors mapped through CUDA IPC
(same_host/ipc.RemoteTensors); a trainer's NCCL link (cross_host/link.Link). `describe`
turns what the user gave into one.

The kinds this process writes itself share the in-process swap (`WrittenHere`), which asks
of them what `InProcessDestination` declares. Each checks itself against a plan (names,
shapes, dtypes, devices) before any byte moves. PyTorch tensors give their addresses
(written by address); JAX arrays are donated and the results reassembled into a new pytree.
"""

from __future__ import annotations

import functools
import operator
from typing import Mapping, Protocol, runtime_checkable

import jax
import numpy as np

from ..reshard import Layout, Owner
from ..reshard.from_jax import nested_names_hint
from ..reshard.plan import Plan
from . import checks, torch_bridge
from .errors import PartialSwapError, SwapError
from .in_process import run as in_process
from .report import NcclSwapReport, SwapReport
from .sources import array_facts, check_live_arrays, flat_named, layout_of, shard_data, shard_positions

Buffer = tuple[str, Owner]  # (destination name, owner): one buffer the executor writes


@runtime_checkable
class Destination(Protocol):
    """Where a swap writes, as `jax_amem.swap(src_params, dst, ...)` sees it: it takes the
    swap's arguments and returns its report, checking everything before a byte moves."""

    def swap_from(self, src_params, *, rules=None, plan=None, verify=False, version=None,
                  progress=None) -> SwapReport | NcclSwapReport:
        """Writes `src_params` into this destination (jax_amem.swap's arguments)."""

    def verify_from(self, src_params, *, rules=None, plan=None) -> int:
        """The bytes checked equal to what a swap of `src_params` writes; SwapError naming the
        first mismatch (jax_amem.swapping.verify)."""


class InProcessDestination(Protocol):
    """What the in-process swap (in_process/) asks of a destination this process writes: its
    cache key, its checks against a plan, where its buffers are, and how they are written:
    by address (`writes_by_address`: addresses, targets, before_writing) or by donation
    (inputs, assemble)."""

    signature: tuple          # everything its checks depend on: the plan and program cache key
    writes_by_address: bool   # the address route; else its buffers are donated
    # This process's PyTorch tensors (`tensors`, by name): a whole plain copy of at least
    # torch_copies.MIN_BYTES on the same GPU may be PyTorch's own copy_ (in_process/torch_copies.py) ...
    copies_with_torch: bool
    # ... and a swap that repeats the last one is recognised by `fingerprint()` (in_process/repeat.py).
    repeats_by_fingerprint: bool

    def check_written_names(self, wanted, what: str) -> None: ...
    def tied(self) -> list[tuple[str, ...]]: ...  # names that are one buffer (tied weights)
    def planned(self, rules, src_layouts) -> tuple: ...  # (rules, layouts) to plan: each buffer once
    def validate(self) -> None: ...
    def layouts(self) -> dict[str, Layout]: ...
    def buffers(self, plan: Plan, process: int) -> dict[Buffer, object]: ...
    def shard_index(self, name: str, owner: Owner): ...
    def addresses(self) -> tuple: ...
    def targets(self, buffers) -> dict: ...
    def before_writing(self, devices) -> None: ...
    def fingerprint(self) -> tuple: ...  # where repeats_by_fingerprint: (addresses(), versions())
    def versions(self) -> tuple: ...
    def inputs(self, order, indices) -> list: ...
    def assemble(self, program, outputs: list): ...
    def after(self, new_tree) -> "InProcessDestination": ...
    def host_bytes(self, name: str, owner: Owner) -> np.ndarray: ...


class WrittenHere:
    """The Destination protocol of the kinds this process writes itself: the in-process swap."""

    copies_with_torch = False       # only this process's PyTorch tensors (TorchDestination)
    repeats_by_fingerprint = False

    def swap_from(self, src_params, *, rules=None, plan=None, verify=False, version=None,
                  progress=None) -> SwapReport:
        return in_process.swap(src_params, self, rules, plan, verify, version, progress)

    def verify_from(self, src_params, *, rules=None, plan=None) -> int:
        return in_process.verify(src_params, self, rules, plan)

    def check_written_names(self, wanted, what: str) -> None:
        """Missing or extra names against the names a swap writes (`wanted`), in one message."""
        check_names(wanted, self.signature_names(), what, tied=self.tied())

    def tied(self) -> list[tuple[str, ...]]:
        """Groups of names that are one buffer (tied weights), written once: none here."""
        return []

    def planned(self, rules, src_layouts) -> tuple:
        """(rules, destination layouts) the plan is made of: the swap's own, where no
        destination is given twice (TorchDestination folds tied weights)."""
        return rules, self.layouts()


def describe(dst) -> Destination:
    """A Destination for what the user gave: itself when it is one (another process's
    tensors, an NCCL link), TorchDestination for a mapping of tensors, JaxDestination for a
    pytree of jax.Arrays."""
    if isinstance(dst, Destination):
        return dst
    checks.not_a_sequence_of_tensors(dst)
    if torch_bridge.is_tensor_mapping(dst):
        return TorchDestination(dst)
    if isinstance(dst, Mapping) and any(torch_bridge.is_tensor(v) for v in dst.values()):
        bad = next(k for k, v in dst.items() if not torch_bridge.is_tensor(v))
        raise SwapError(f"destination {bad!r} is a {type(dst[bad]).__name__}; the others are torch tensors: "
                        "give one kind of destination")
    return JaxDestination(dst)


def check_names(plan_names, given, what: str = "the plan writes", tied=()) -> None:
    """Missing or extra destination names, all of them in one message. `tied`: groups of given
    names that are one buffer (a state dict's tied weights): one of a group written is all of
    it written, so its twins are not extra."""
    plan_names, given = list(plan_names), list(given)
    planned, present = set(plan_names), set(given)
    covered = {n for group in tied if planned.intersection(group) for n in group}
    missing = [n for n in plan_names if n not in present]
    extra = [n for n in given if n not in planned and n not in covered]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {len(missing)} destination(s) that {what}: {_few(missing)}")
        if extra:
            parts.append(f"{len(extra)} destination(s) that nothing writes (no rule, not in the plan): {_few(extra)}")
        raise SwapError("; ".join(parts) + ". Give exactly the tensors the rules name (nothing was written)."
                        + nested_names_hint(missing, given))


def tied_groups(tensors: Mapping) -> list[tuple[str, ...]]:
    """Names of PyTorch tensors that are one tensor twice: a state dict's tied weights
    (`lm_head.weight` and the embedding hold one storage). Twins share device, address, shape,
    dtype and strides, so writing one writes both; a view that overlaps another any other way
    is left to `check_disjoint` to refuse."""
    groups: dict = {}
    for name, t in tensors.items():
        if t.numel():
            groups.setdefault((str(t.device), t.data_ptr(), tuple(t.shape), t.dtype, t.stride()), []).append(name)
    return [tuple(names) for names in groups.values() if len(names) > 1]


def fold_tied(rules, groups, src_layouts, dst_layouts) -> list:
    """`rules` writing each tied group once: where the rules write two names of a group, they
    must write the same values (the same pieces) and the later name's rules are dropped;
    different values for one buffer are refused."""
    from ..reshard.lowering import lower

    by_dst: dict = {}
    for rule in rules:
        by_dst.setdefault(rule.dst, []).append(rule)

    def pieces(name):
        return sorted((p.dst_start, p.size, p.src, p.src_start, p.perm or (), p.dtype or "")
                      for p in lower(by_dst[name], src_layouts, {name: dst_layouts[name]}))
    dropped = set()
    for group in groups:
        written = [n for n in group if n in by_dst]
        for other in written[1:]:
            if pieces(other) != pieces(written[0]):
                raise SwapError(f"destinations {written[0]!r} and {other!r} share memory: they are one tensor (tied "
                                "weights: the same storage), but the rules write different values into them. Write "
                                "one of them (drop the other's rule), or untie the model's weights (nothing was "
                                "written)")
            dropped.add(other)
    return [r for r in rules if r.dst not in dropped]


def check_disjoint(ranges) -> None:
    """SwapError naming two destinations whose bytes overlap: ranges are (device, address,
    nbytes, name). Identical buffers (tied weights) and partly overlapping views alike: two
    writers of one byte would race on the GPU and leave one of them wrong."""
    last = {}
    for device, start, nbytes, name in sorted(r for r in ranges if r[2] > 0):
        before = last.get(device)
        if before is not None and start < before[0]:
            raise SwapError(f"destinations {before[1]!r} and {name!r} share memory (tied weights, or views of one "
                            "storage?): give each buffer once, e.g. dict(model.named_parameters()), and drop the "
                            "other's rule (nothing was written)")
        if before is None or start + nbytes > before[0]:
            last[device] = (start + nbytes, name)


def _few(names, n: int = 5) -> str:
    return ", ".join(repr(x) for x in names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _check_shard(name: str, layout: Layout, owner: Owner, shape, dtype, where: str) -> None:
    if owner not in layout.owner_index:
        raise SwapError(f"destination {name!r} is on {where} (owner {tuple(owner)}), but the plan puts it on "
                        f"owner(s) {[tuple(o) for o in layout.owners][:8]}: make the plan for where the "
                        "tensor lives (nothing was written)")
    _, want = layout.shard_box(owner)
    if tuple(shape) != tuple(want):
        raise SwapError(f"destination {name!r} has shape {tuple(shape)}; the plan's shard for it has shape "
                        f"{tuple(want)} (nothing was written)")
    if np.dtype(dtype) != layout.dtype:
        raise SwapError(f"destination {name!r} has dtype {np.dtype(dtype).name}; the plan writes "
                        f"{layout.dtype.name} (cast on the sender with the rule's cast=; nothing was written)")


_tensor_facts = operator.attrgetter("device", "shape", "dtype")
_version = operator.attrgetter("_version")


class TorchDestination(WrittenHere):
    writes_by_address = True
    copies_with_torch = True
    repeats_by_fingerprint = True

    def __init__(self, tensors: Mapping):
        self.tensors = dict(tensors)
        checks.torch_tensor_kinds(self.tensors)  # per swap, repeats too: a lazy conj/neg view has the same key
        self._owners = None
        self._tied = None

    @functools.cached_property
    def signature(self) -> tuple:
        """Everything later checks depend on, so a cached plan and program are reused only for
        tensors that would pass the same checks; read in C for thousands of tensors. Read only
        when a swap is not a repeat (in_process/repeat.py checks `fingerprint()` instead)."""
        import torch

        values = self.tensors.values()
        return ("torch", tuple(self.tensors), tuple(map(_tensor_facts, values)),
                tuple(map(torch.Tensor.stride, values)), tuple(self.tied()))

    def tied(self) -> list[tuple[str, ...]]:
        """The twin groups (tied weights) among the tensors: each is written once."""
        if self._tied is None:
            self._tied = tied_groups(self.tensors)
        return self._tied

    def planned(self, rules, src_layouts) -> tuple:
        """Tied twins folded: one name per group in the plan, the one the rules write (both
        written alike: the first), so no byte has two writers."""
        layouts = self.layouts()
        groups = self.tied()
        if not groups:
            return rules, layouts
        from ..reshard.lowering import identity_rules
        if rules is None:  # same names: the twins a source names
            rules = identity_rules([n for n in layouts if n in src_layouts])
        rules = fold_tied(rules, groups, src_layouts, layouts)
        written = {r.dst for r in rules}
        return rules, {n: layout for n, layout in layouts.items() if n in written}

    def signature_names(self):
        return list(self.tensors)

    @property
    def owners(self) -> dict:
        if self._owners is None:
            self._owners = {name: torch_bridge.owner_of(t) for name, t in self.tensors.items()}
        return self._owners

    def validate(self) -> None:
        for name, tensor in self.tensors.items():
            torch_bridge.check_writable(name, tensor)
        twins = {n for group in self.tied() for n in group[1:]}  # one buffer, checked once
        once = [(name, t) for name, t in self.tensors.items() if name not in twins]
        check_disjoint((str(t.device), t.data_ptr(), t.numel() * t.element_size(), name) for name, t in once)
        checks.torch_not_jax_memory((name, t.data_ptr(), t.numel() * t.element_size()) for name, t in once)

    def layouts(self) -> dict[str, Layout]:
        return {name: Layout.single(tuple(t.shape), torch_bridge.numpy_dtype(t), self.owners[name])
                for name, t in self.tensors.items()}

    def buffers(self, plan: Plan, process: int) -> dict[Buffer, object]:
        """{(name, owner): JAX device} for every buffer this process writes; SwapError first."""
        check_names(plan.dst_layouts, self.tensors, tied=self.tied())
        for group in self.tied():
            both = [n for n in group if n in plan.dst_layouts]
            if len(both) > 1:
                raise SwapError(f"the plan writes {both[0]!r} and {both[1]!r}, which are one tensor (tied weights): "
                                "make the plan for one of them (nothing was written)")
        out = {}
        for name, tensor in self.tensors.items():
            if name not in plan.dst_layouts:
                continue  # a tied twin of a name the plan writes (check_names)
            layout, owner = plan.dst_layouts[name], self.owners[name]
            _check_shard(name, layout, owner, tensor.shape, torch_bridge.numpy_dtype(tensor), str(tensor.device))
            local = [o for o in layout.owners if o.process == process and o != owner]
            if local:
                raise SwapError(f"the plan also puts shards of {name!r} on owner(s) {[tuple(o) for o in local]} of "
                                "this process; a PyTorch destination is one tensor on one device")
            out[(name, owner)] = torch_bridge.jax_device(tensor)
        return out

    def addresses(self) -> tuple:
        """Every tensor's address, storage offset and storage size, in order: read on every swap
        (a cache key), so it is cheap. The storage facts make a program's bytes provably the
        tensor's: a storage resized in place (`untyped_storage().resize_`, FSDP-style freeing and
        re-allocating smaller) can come back at the same address with fewer bytes, and only a
        new program's checks (validate) refuse it. About 0.15 us per tensor."""
        import torch

        values = self.tensors.values()
        return (tuple(map(torch.Tensor.data_ptr, values)), tuple(map(torch.Tensor.storage_offset, values)),
                tuple(map(torch.UntypedStorage.nbytes, map(torch.Tensor.untyped_storage, values))))

    def fingerprint(self) -> tuple:
        """What a repeat swap compares with the last swap's (in_process/repeat.py), besides the
        tensors' identity: (`addresses()`: a moved, freed or shrunk storage; `versions()`)."""
        return self.addresses(), self.versions()

    def versions(self) -> tuple:
        """Each tensor's version counter: in-place metadata changes (`resize_`, `set_`,
        `as_strided_`, `t_`) bump it, and so does every swap (`before_writing`). Inference
        tensors have no version counter: their shape, stride and dtype instead. One read in
        C per tensor, no hashing."""
        import torch

        values = self.tensors.values()
        try:
            return tuple(map(_version, values))
        except RuntimeError:  # an inference tensor ("Inference tensors do not track version counter")
            return (tuple(map(_tensor_facts, values)), tuple(map(torch.Tensor.stride, values)))

    def targets(self, buffers) -> dict:
        """{(name, owner): (address, bytes)} of the buffers a program writes by address."""
        out = {}
        for name, owner in buffers:
            tensor = self.tensors[name]
            out[(name, owner)] = (tensor.data_ptr(), tensor.numel() * tensor.element_size())
        return out

    def before_writing(self, devices) -> None:
        """Work PyTorch queued on the destination GPUs (a rollout still reading the old
        weights) finishes first; and, as copy_ would, the tensors' autograd versions move on
        (checks.mark_written), so a graph that saved the old values refuses to run backward."""
        torch_bridge.wait_for_torch({d.local_hardware_id for d in devices if d.platform == "gpu"})
        checks.mark_written(self.tensors.values())

    def assemble(self, program, outputs: list):
        return None  # written in place by address: nothing new to hand back

    def after(self, new_tree):
        return self

    def shard_index(self, name: str, owner: Owner):
        return None

    def host_bytes(self, name: str, owner: Owner) -> np.ndarray:
        tensor = self.tensors[name].detach()
        if tensor.numel() == 0:
            return np.zeros(0, np.uint8)
        import torch
        return tensor.reshape(-1).view(torch.uint8).cpu().numpy()


class JaxDestination(WrittenHere):
    writes_by_address = False

    def __init__(self, tree):
        self.tree = tree
        names, leaves, treedef = flat_named(tree)
        check_live_arrays(names, leaves, "destination")
        self.arrays = dict(zip(names, leaves))
        self.signature = ("jax", treedef, tuple(map(array_facts, leaves)))
        self._shards = None  # {name: single-device arrays}, read before donating

    def signature_names(self):
        return list(self.arrays)

    def validate(self) -> None:
        pass  # __init__ checked every leaf is a live jax.Array (check_live_arrays)

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

    def buffers(self, plan: Plan, process: int) -> dict[Buffer, object]:
        check_names(plan.dst_layouts, self.arrays)
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

    def assemble(self, program, outputs: list):
        """The new pytree: each array rebuilt from its written shards (the donated buffers'
        successors) and, where a shard received nothing, its old shard; the old arrays are
        deleted when every shard was donated."""
        by_name: dict = {}
        for (name, _), index, output in zip(program.order, program.dst_indices, outputs):
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

    def recover(self, program, outputs: list, error: BaseException) -> PartialSwapError:
        """The error for a swap that failed after donating: the buffers of the groups that
        ran are in `outputs` (program order), the others were never donated, so every array
        can be rebuilt. `error.dst` is that whole pytree (written arrays hold the new values,
        the rest the old), `error.written` the names written in full."""
        order = program.order[:len(outputs)]
        counts: dict = {}
        for name, _ in order:
            counts[name] = counts.get(name, 0) + 1
        written = [n for n, c in counts.items() if c == len(shard_positions(self.arrays[n]))]
        try:
            tree = self.assemble(program, outputs)
        except Exception as rebuild:  # noqa: BLE001 - keep the shards reachable whatever went wrong
            tree = None
            note = f"; the pytree could not be rebuilt ({rebuild}): error.shards holds every written shard"
        else:
            note = ": error.dst holds every destination (the written ones new, the others as they were)"
        return PartialSwapError(
            f"the swap into jax.Arrays failed after {len(outputs)} of {program.buffers} buffers were donated and "
            f"written ({len(written)} arrays in full){note}. Cause: {type(error).__name__}: {error}",
            dst=tree, written=written, shards=dict(zip(order, outputs)))
