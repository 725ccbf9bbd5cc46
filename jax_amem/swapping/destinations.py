"""The rollout's side of a swap: what every kind of destination is to `jax_amem.swap`.

`Destination` is the one protocol the front door knows: `swap_from` / `verify_from`. Every
kind implements it: PyTorch tensors by name (TorchDestination, here) and a pytree of
jax.Arrays (by_donation.JaxDestination); another process's tensors mapped through CUDA IPC
(same_host/ipc.RemoteTensors); a trainer's NCCL link (cross_host/link.Link). `describe`
turns what the user gave into one.

The kinds this process writes itself share the in-process swap (`WrittenHere`) and meet one
of its two contracts: written by address (by_address.ByAddress: PyTorch tensors, IPC-mapped
tensors) or by donation (by_donation.ByDonation: jax.Arrays).
"""

from __future__ import annotations

import functools
import operator
from typing import Mapping, Protocol, runtime_checkable

import numpy as np

from .._native import core
from ..reshard import Layout
from . import checks, tied as tied_weights, torch_bridge
from .by_address import Target
from .by_donation import JaxDestination
from .errors import SwapError
from .in_process import run as in_process_run
from .report import NcclSwapReport, SwapReport


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


class WrittenHere:
    """The Destination protocol of the kinds this process writes itself: the in-process swap."""

    def swap_from(self, src_params, *, rules=None, plan=None, verify=False, version=None,
                  progress=None) -> SwapReport:
        return in_process_run.swap(src_params, self, rules, plan, verify, version, progress)

    def verify_from(self, src_params, *, rules=None, plan=None) -> int:
        return in_process_run.verify(src_params, self, rules, plan)


class JaxTree(WrittenHere, JaxDestination):
    """A pytree of jax.Arrays as a swap destination (by donation)."""


def is_destination(dst) -> bool:
    """What `isinstance(dst, Destination)` says (its methods are there), without typing's walk
    of the protocol's members on every call: 17 us a swap on Python 3.11, the largest fixed
    cost of a repeat swap of a few tensors."""
    return callable(getattr(dst, "swap_from", None)) and callable(getattr(dst, "verify_from", None))


def describe(dst) -> Destination:
    """A Destination for what the user gave: itself when it is one (another process's
    tensors, an NCCL link), TorchDestination for a mapping of tensors, a JaxTree for a
    pytree of jax.Arrays."""
    if is_destination(dst):
        return dst
    checks.not_a_sequence_of_tensors(dst)
    if isinstance(dst, Mapping) and dst and torch_bridge.is_tensor(next(iter(dst.values()))):
        # Every other value is checked by the first full-path read (TorchDestination._check_kinds):
        # a repeat swap matches each value by identity with tensors a checked swap wrote, and
        # scanning thousands of values here cost more than the rest of its Python.
        return TorchDestination(dst)
    one_kind_of_destination(dst)
    return JaxTree(dst)


def one_kind_of_destination(dst) -> None:
    """SwapError where a mapping mixes torch tensors with anything else (nothing written)."""
    if isinstance(dst, Mapping) and any(map(torch_bridge.is_tensor, dst.values())):
        bad = next(k for k, v in dst.items() if not torch_bridge.is_tensor(v))
        raise SwapError(f"destination {bad!r} is a {type(dst[bad]).__name__}; the others are torch tensors: "
                        "give one kind of destination (nothing was written)")


def tied_groups(tensors: Mapping) -> list[tuple[str, ...]]:
    """Names of PyTorch tensors that are one tensor twice: a state dict's tied weights
    (`lm_head.weight` and the embedding hold one storage). Twins share device, address, shape,
    dtype and strides, so writing one writes both; a view that overlaps another any other way
    is left to `by_address.check_disjoint` to refuse."""
    groups: dict = {}
    for name, t in tensors.items():
        if t.numel():
            groups.setdefault((str(t.device), t.data_ptr(), tuple(t.shape), t.dtype, t.stride()), []).append(name)
    return [tuple(names) for names in groups.values() if len(names) > 1]


_tensor_facts = operator.attrgetter("device", "shape", "dtype")
_version = operator.attrgetter("_version")


def torch_layout_reader():
    """A `core.copy.DLPackLayout` over torch.Tensor's DLPack C exchange table, or None where this
    PyTorch has none (before 2.10). A new one each call: it lives as long as the repeat check
    that reads with it, not as a module global past the native module's teardown."""
    import torch

    if not _has_layout_table(torch.Tensor):
        return None
    return core.copy.DLPackLayout(torch.Tensor)


@functools.cache
def _has_layout_table(tensor_type) -> bool:
    try:
        core.copy.DLPackLayout(tensor_type)
    except TypeError:
        return False
    return True


class TorchDestination(WrittenHere):
    """This process's PyTorch tensors by name, written by address (by_address.ByAddress)."""

    writes_by_address = True

    def __init__(self, tensors: Mapping):
        self.tensors = dict(tensors)
        self.torch_tensors = self.tensors
        self._kinds_checked = False
        self._tied = None
        self._facts = None  # torch_bridge.facts, read once by targets()

    @functools.cached_property
    def signature(self) -> tuple:
        """Everything later checks depend on, so a cached plan and program are reused only for
        tensors that would pass the same checks; read in C for thousands of tensors. Read only
        when a swap is not a repeat (in_process/repeat.py reads `repeat_readers()` instead)."""
        import torch

        self._check_kinds()
        values = self.tensors.values()
        return ("torch", tuple(self.tensors), tuple(map(_tensor_facts, values)),
                tuple(map(torch.Tensor.stride, values)), tuple(self.tied()))

    def _check_kinds(self) -> None:
        """Every value a torch tensor (`describe` looked at the first only) and the tensors'
        kinds (checks.torch_tensor_kinds), before anything else reads them, on every swap that
        is not a repeat (a lazy conj/neg view has the same cache key as its tensor); a repeat
        writes the very tensor objects a checked swap wrote (repeat.py)."""
        if not self._kinds_checked:
            if not torch_bridge.is_tensor_mapping(self.tensors):
                one_kind_of_destination(self.tensors)
            checks.torch_tensor_kinds(self.tensors)
            self._kinds_checked = True

    def names(self) -> list[str]:
        self._check_kinds()
        return list(self.tensors)

    def tied(self) -> list[tuple[str, ...]]:
        """The twin groups (tied weights) among the tensors: each is written once."""
        self._check_kinds()
        if self._tied is None:
            self._tied = tied_groups(self.tensors)
        return self._tied

    def layouts(self) -> dict[str, Layout]:
        self._check_kinds()
        facts = self._facts if self._facts is not None else torch_bridge.facts(self.tensors, check=False)
        return {name: Layout.single(tuple(t.shape), facts[name].dtype, facts[name].owner)
                for name, t in self.tensors.items()}

    def targets(self) -> dict[str, Target]:
        """Every tensor as a Target, after the checks only PyTorch tensors need: writable
        (contiguous, on a device JAX has, its storage big enough), and not memory of a live
        jax.Array. Twins (tied weights) are listed under each name; the plan writes one."""
        self._check_kinds()
        self._facts = facts = torch_bridge.facts(self.tensors)
        out = {name: Target(name, f.owner, f.device, tuple(self.tensors[name].shape), f.dtype, f.address, f.nbytes,
                            str(self.tensors[name].device))
               for name, f in facts.items()}
        checks.torch_not_jax_memory([(t.name, t.address, t.nbytes) for t in out.values()])
        return out

    def addresses(self) -> tuple:
        """Every tensor's address, storage offset and storage size, in order: read on every swap
        (a cache key), so it is cheap. The storage facts make a program's bytes provably the
        tensor's: a storage resized in place (`untyped_storage().resize_`, FSDP-style freeing and
        re-allocating smaller) can come back at the same address with fewer bytes, and only a
        new program's checks (targets) refuse it. About 0.15 us per tensor."""
        import torch

        self._check_kinds()
        values = self.tensors.values()
        return (tuple(map(torch.Tensor.data_ptr, values)), tuple(map(torch.Tensor.storage_offset, values)),
                tuple(map(torch.UntypedStorage.nbytes, map(torch.Tensor.untyped_storage, values))))

    def repeat_readers(self) -> tuple[list, list]:
        """What a repeat swap reads of every tensor to know it unchanged since the last swap
        (in_process/repeat.py, besides each tensor's identity), as chains of C callables read in
        one native pass, and which of them to read again after writing (the second list).

        Where PyTorch has the DLPack C exchange table (`__dlpack_c_exchange_api__`, PyTorch 2.10
        on), a tensor's whole layout (address, device, dtype, shape, strides) is one C call
        (`core.copy.DLPackLayout`), and with the storage size it is all the check needs: a moved
        tensor, a freed, shrunk or regrown storage, any change of shape, strides or dtype
        (`resize_`, `set_`, `as_strided_`, `t_`, and `.data =` with another layout) misses. The
        storage offset needs no read of its own: PyTorch moves it only through `set_` and
        `as_strided_`, which check the view against the storage, and a resized storage that
        keeps it moves the address. A write of new values changes nothing the swap relies on, so
        the rollout writing in place still repeats (the swap overwrites it all the same).

        Without that table, the facts through PyTorch's Python methods: the address, storage
        offset and storage size (`addresses()`) and the version counter (in-place metadata
        changes bump it; so does every swap, `before_writing`, so it is read again after
        writing), through its getter (the descriptor itself, which the check calls in C).
        Inference tensors have no version counter: their device, shape, dtype and strides
        instead."""
        import inspect

        import torch

        storage_size = (torch.Tensor.untyped_storage, torch.UntypedStorage.nbytes)
        layout = torch_layout_reader()
        if layout is not None:
            return [(layout,), storage_size], []
        readers = [(torch.Tensor.data_ptr,), (torch.Tensor.storage_offset,), storage_size]
        try:
            sum(map(_version, self.tensors.values()))
        except RuntimeError:  # an inference tensor ("Inference tensors do not track version counter")
            return readers + [(_tensor_facts,), (torch.Tensor.stride,)], []
        return readers + [(inspect.getattr_static(torch.Tensor, "_version"),)], [len(readers)]

    def before_writing(self, devices) -> None:
        """Work PyTorch queued on the destination GPUs (a rollout still reading the old
        weights) finishes first; and, as copy_ would, the tensors' autograd versions move on
        (checks.mark_written), so a graph that saved the old values refuses to run backward."""
        torch_bridge.wait_for_torch({d.local_hardware_id for d in devices if d.platform == "gpu"})
        checks.mark_written(self.tensors.values())

    def before_launch(self, ordinals) -> dict[int, int]:
        """The direct launch's copies go on PyTorch's current stream of each device, as copy_'s
        would: work queued there first (no host wait for it), the rollout's next kernels after."""
        return torch_bridge.current_raw_streams(ordinals)

    def while_launched(self) -> None:
        """The versions move on as in before_writing, while the launched copies run: no one reads
        them between the launch and the swap's return, and a launch that failed midway still
        moves them (some tensors may be written)."""
        checks.mark_written(self.tensors.values())

    def host_bytes(self, name: str, owner=None) -> np.ndarray:
        tensor = self.tensors[name].detach()
        if tensor.numel() == 0:
            return np.zeros(0, np.uint8)
        import torch
        return tensor.reshape(-1).view(torch.uint8).cpu().numpy()
