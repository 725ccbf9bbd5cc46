"""The swap into another process's GPU tensors on the same host, through CUDA IPC.

Rollout (a PyTorch process; JAX never starts a backend there):

    descriptor = export_tensors(dict(model.named_parameters()))   # JSON-serialisable

Trainer:

    remote = open_remote(descriptor)            # maps each allocation once (cuIpcOpenMemHandle)
    jax_amem.swap(params, remote, rules=...)    # the address route writes through the mapping
    remote.close()                              # unmaps

A descriptor holds, per tensor, the IPC handle of its allocation (PyTorch's caching
allocator sub-allocates, so: handle + offset), its bytes, shape, dtype and device (ordinal
and PCI bus id: the trainer finds its own ordinal for that GPU whatever its
CUDA_VISIBLE_DEVICES). `RemoteTensors` is a swap destination like a mapping of tensors:
written by address (in_process/routes.py), so the program is the in-process one.

The exporter must keep its tensors (and stay alive) while the trainer has them open: the
memory is the rollout's. The control messages that order the two sides are in ready_done.py.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
import os
import socket

import numpy as np

from ..._native import core
from ...reshard import Layout, Owner
from ..checks import shape_field, whole_number
from ..by_address import Target
from ..destinations import WrittenHere
from ..errors import SwapError

FORMAT = 1
_TENSOR_KEYS = ("handle", "offset", "nbytes", "shape", "dtype", "device", "pci_bus_id")


# ----------------------------------------------------------------------------- rollout side

def export_tensors(named_tensors) -> dict:
    """A JSON-serialisable descriptor of CUDA tensors another process on this host can write.

    Refuses (SwapError naming the tensor) CPU tensors, non-contiguous tensors and memory CUDA
    cannot export (PyTorch's expandable segments or its cudaMallocAsync backend)."""
    _refuse_unexportable_allocator()
    tensors = {}
    bus_ids: dict[int, str] = {}
    if not isinstance(named_tensors, Mapping):
        raise SwapError(f"export_tensors: named_tensors is {type(named_tensors).__name__}: give a dict of names "
                        "to CUDA tensors (model.state_dict())")
    for name, tensor in dict(named_tensors).items():
        if not hasattr(tensor, "data_ptr") or not hasattr(tensor, "is_contiguous"):
            raise SwapError(f"export_tensors: {name!r} is a {type(tensor).__name__}, not a torch.Tensor")
        if not tensor.is_contiguous():
            raise SwapError(f"export_tensors: {name!r} is not contiguous (strides {tuple(tensor.stride())}): the "
                            "swap writes row-major bytes; make the model's tensor contiguous")
        if tensor.device.type != "cuda":
            raise SwapError(f"export_tensors: {name!r} is on {tensor.device}; CUDA IPC shares GPU memory only: "
                            "move the model to a GPU (model.cuda())")
        ordinal = tensor.device.index if tensor.device.index is not None else 0
        nbytes = tensor.numel() * tensor.element_size()
        entry = {"shape": list(tensor.shape), "dtype": str(tensor.dtype).removeprefix("torch."),
                 "nbytes": nbytes, "device": ordinal}
        try:
            if ordinal not in bus_ids:
                bus_ids[ordinal] = core.memory.pci_bus_id(ordinal)
            entry["pci_bus_id"] = bus_ids[ordinal]
            if nbytes == 0:
                entry.update(handle=None, offset=0)  # nothing to write, nothing to map
            else:
                handle, offset, allocation = core.ipc.export_pointer(tensor.data_ptr(), ordinal)
                entry.update(handle=handle.hex(), offset=int(offset), allocation_bytes=int(allocation))
        except RuntimeError as error:
            raise SwapError(f"export_tensors: {name!r}: {error}") from None
        tensors[name] = entry
    return {"format": FORMAT, "host": socket.gethostname(), "pid": os.getpid(), "tensors": tensors}


def _refuse_unexportable_allocator() -> None:
    """PyTorch's expandable segments are VMM memory: cuIpcGetMemHandle refuses it. Say so
    up front (the driver check in export_pointer catches settings made at run time too)."""
    for variable in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        setting = os.environ.get(variable, "").replace(" ", "").lower()
        if "expandable_segments:true" in setting:
            raise SwapError(f"export_tensors: {variable}={os.environ[variable]!r} turns on expandable segments, "
                            "whose memory CUDA IPC cannot export: start the rollout without expandable_segments "
                            "(e.g. unset it or set expandable_segments:False)")


# ----------------------------------------------------------------------------- trainer side

class RemoteTensor:
    """One parsed descriptor entry."""

    __slots__ = ("name", "handle", "offset", "nbytes", "shape", "dtype", "ordinal", "pci_bus_id")

    def __init__(self, name: str, entry):
        if not isinstance(entry, dict):
            raise SwapError(f"descriptor entry {name!r} is a {type(entry).__name__}, not a dict")
        missing = [k for k in _TENSOR_KEYS if k not in entry]
        if missing:
            raise SwapError(f"descriptor entry {name!r} lacks {missing}: give the descriptor exactly as "
                            "export_tensors made it")
        self.name = name
        try:
            from jax.numpy import dtype as jnp_dtype

            if not isinstance(entry["dtype"], str):  # jnp.dtype(None) would be float64
                raise TypeError
            self.dtype = np.dtype(jnp_dtype(entry["dtype"]))
        except TypeError:
            raise SwapError(f"descriptor entry {name!r} has dtype {entry['dtype']!r}, which JAX does not know") from None
        self.shape = shape_field(name, entry["shape"])
        if any(n < 0 for n in self.shape):
            raise SwapError(f"descriptor entry {name!r}: shape {self.shape} has a negative dimension")
        self.nbytes = whole_number(name, "nbytes", entry["nbytes"])
        self.offset = whole_number(name, "offset", entry["offset"])
        self.ordinal, self.pci_bus_id = whole_number(name, "device", entry["device"]), str(entry["pci_bus_id"])
        want = math.prod(self.shape) * self.dtype.itemsize
        if self.nbytes != want:
            raise SwapError(f"descriptor entry {name!r}: nbytes {self.nbytes} does not match shape {self.shape} "
                            f"of {self.dtype.name} ({want} bytes)")
        handle = entry["handle"]
        if self.nbytes == 0:
            self.handle = None
            return
        try:
            self.handle = bytes.fromhex(handle)
        except (TypeError, ValueError):
            self.handle = b""
        if len(self.handle) != core.ipc.HANDLE_BYTES:
            raise SwapError(f"descriptor entry {name!r}: handle {str(handle)[:20]!r}... is not "
                            f"{core.ipc.HANDLE_BYTES} bytes in hex")
        if "allocation_bytes" not in entry:
            raise SwapError(f"descriptor entry {name!r} lacks ['allocation_bytes']: give the descriptor exactly as "
                            "export_tensors made it")
        end = self.offset + self.nbytes
        if self.offset < 0 or end > whole_number(name, "allocation_bytes", entry["allocation_bytes"]):
            raise SwapError(f"descriptor entry {name!r}: bytes [{self.offset}, {end}) lie outside its allocation "
                            f"of {entry['allocation_bytes']} bytes")


def parse_descriptor(descriptor) -> dict[str, RemoteTensor]:
    """{name: RemoteTensor}; SwapError for a malformed descriptor or one from another host or
    from this very process."""
    if not isinstance(descriptor, dict) or "tensors" not in descriptor:
        raise SwapError("the descriptor must be the dict export_tensors returned (with 'tensors', 'host', 'pid'); "
                        f"got {type(descriptor).__name__}")
    if descriptor.get("format") != FORMAT:
        raise SwapError(f"descriptor format {descriptor.get('format')!r}: this jax_amem reads format {FORMAT} "
                        "(the same jax_amem version on both sides)")
    host = descriptor.get("host")
    if host != socket.gethostname():
        raise SwapError(f"the tensors were exported on host {host!r}, this is {socket.gethostname()!r}: CUDA IPC "
                        "works within one host (across hosts use the NCCL transport)")
    if descriptor.get("pid") == os.getpid():
        raise SwapError("these tensors were exported by this very process, and CUDA does not let a process open "
                        "its own IPC handles: swap into the tensors directly (jax_amem.swap(params, tensors))")
    if not isinstance(descriptor["tensors"], dict) or not descriptor["tensors"]:
        raise SwapError("the descriptor holds no tensors: export at least one")
    return {name: RemoteTensor(name, entry) for name, entry in descriptor["tensors"].items()}


class CudaIpcMapper:
    """Maps descriptor entries into this process with the CUDA driver (_core.ipc)."""

    def __init__(self):
        self._devices: dict[str, object] = {}

    def device_for(self, tensor: RemoteTensor):
        """The JAX GPU of this process that is the exporter's GPU (same PCI bus id)."""
        if not self._devices:
            import jax

            try:
                gpus = jax.local_devices(backend="gpu")
            except RuntimeError:
                gpus = []
            self._devices = {core.memory.pci_bus_id(d.local_hardware_id).lower(): d for d in gpus}
        device = self._devices.get(tensor.pci_bus_id.lower())
        if device is None:
            raise SwapError(f"remote tensor {tensor.name!r} is on the GPU with PCI bus id {tensor.pci_bus_id} (the "
                            f"exporter's cuda:{tensor.ordinal}), which JAX in this process does not see (it sees "
                            f"{sorted(self._devices) or 'no GPU'}): make that GPU visible (CUDA_VISIBLE_DEVICES)")
        return device

    def open(self, handle: bytes, device) -> int:
        return core.ipc.open_handle(handle, device.local_hardware_id)

    def close(self, handle: bytes, device) -> None:
        core.ipc.close_handle(handle, device.local_hardware_id)

    def mapped_bytes(self, handle: bytes, device) -> int:
        """The size of the allocation as this process mapped it (the driver's, not the descriptor's)."""
        return core.ipc.mapped_bytes(handle, device.local_hardware_id)

    def read(self, device, address: int, nbytes: int) -> np.ndarray:
        return np.frombuffer(core.ipc.read_device(device.local_hardware_id, address, nbytes), np.uint8)


class RemoteTensors(WrittenHere):
    """Another process's tensors, mapped here: a swap destination written by address like a
    mapping of tensors (by_address.ByAddress). Close it (or use `with`) to unmap."""

    writes_by_address = True
    torch_tensors = None  # the exporter's memory: no PyTorch copies, no repeat by fingerprint

    def __init__(self, descriptor, mapper=None):
        self.tensors = parse_descriptor(descriptor)
        self.mapper = mapper if mapper is not None else CudaIpcMapper()
        self.devices = {name: self.mapper.device_for(t) for name, t in self.tensors.items()}
        self.owners = {name: Owner(d.process_index, d.id) for name, d in self.devices.items()}
        self._open: dict = {}  # (handle, device) -> base address, each opened once
        self.closed = False
        try:
            for name, t in self.tensors.items():
                key = (t.handle, self.devices[name])
                if t.handle is not None and key not in self._open:
                    self._open[key] = self.mapper.open(*key)
            self._check_mapped_sizes()
        except (RuntimeError, SwapError) as error:
            try:
                self.close()  # what was mapped, unmapped again
            except SwapError:
                pass  # the open's error is the one to report
            if isinstance(error, SwapError):
                raise
            raise SwapError(f"open_remote: {error}") from None
        self._addresses = tuple(0 if t.handle is None else self._open[(t.handle, self.devices[n])] + t.offset
                                for n, t in self.tensors.items())
        self.signature = ("remote", tuple((n, self.owners[n], t.shape, t.dtype.str) for n, t in self.tensors.items()))

    def _check_mapped_sizes(self) -> None:
        """Every tensor's bytes inside its allocation as the driver mapped it: the descriptor's
        allocation_bytes is only the exporter's word (a stale or forged descriptor could claim
        more, and the swap would then write past the mapping)."""
        sizes = {key: int(self.mapper.mapped_bytes(*key)) for key in self._open}
        for name, t in self.tensors.items():
            if t.handle is None:
                continue
            size = sizes[(t.handle, self.devices[name])]
            if size and t.offset + t.nbytes > size:  # 0: the driver could not say; the descriptor's size was checked
                raise SwapError(f"descriptor entry {name!r}: bytes [{t.offset}, {t.offset + t.nbytes}) lie outside "
                                f"its allocation, which is {size} bytes as mapped here (a stale descriptor? export "
                                "the tensors again; nothing was written)")

    def close(self) -> None:
        """Unmaps every allocation (once); the tensors themselves are the exporter's. Every
        mapping is closed even when one close fails; the first failure is raised after."""
        if self.closed:
            return
        self.closed = True
        failure = None
        for handle, device in self._open:
            try:
                self.mapper.close(handle, device)
            except Exception as error:  # noqa: BLE001 - the others must still be unmapped
                failure = failure or error
        self._open.clear()
        if failure is not None:
            raise SwapError(f"closing remote tensors: {failure} (the other mappings were closed)") from failure

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"RemoteTensors({len(self.tensors)} tensors, {'closed' if self.closed else 'open'})"

    def _require_open(self) -> None:
        if self.closed:
            raise SwapError("these RemoteTensors were closed (unmapped): open the descriptor again with "
                            "open_remote(descriptor)")

    # The contract of a destination written by address (by_address.ByAddress).
    def names(self) -> list[str]:
        return list(self.tensors)

    def tied(self) -> list[tuple[str, ...]]:
        return []  # two names of one exported buffer are refused as overlapping (by_address.check)

    def layouts(self) -> dict:
        return {name: Layout.single(t.shape, t.dtype, self.owners[name]) for name, t in self.tensors.items()}

    def targets(self) -> dict[str, Target]:
        self._require_open()
        return {name: Target(name, self.owners[name], self.devices[name], t.shape, t.dtype, address, t.nbytes,
                             f"the exporter's cuda:{t.ordinal}")
                for (name, t), address in zip(self.tensors.items(), self._addresses)}

    def addresses(self) -> tuple:
        """The mapped address of every tensor (a cache key: read on every swap)."""
        self._require_open()
        return self._addresses

    def before_writing(self, devices) -> None:
        pass  # the rollout said it is idle (same_host/ready_done.py) before the trainer writes

    def before_launch(self, ordinals) -> dict[int, int]:
        """A stream of this process per device (the rollout is idle: nothing to follow)."""
        return {o: core.copy.direct_stream(o) for o in ordinals}

    def while_launched(self) -> None:
        """No bookkeeping: the tensors are another process's."""

    def host_bytes(self, name: str, owner=None) -> np.ndarray:
        """The remote tensor's bytes, read with a driver copy (verify=True)."""
        self._require_open()
        t = self.tensors[name]
        if t.nbytes == 0:
            return np.zeros(0, np.uint8)
        return self.mapper.read(self.devices[name], dict(zip(self.tensors, self._addresses))[name], t.nbytes)


def open_remote(descriptor, mapper=None) -> RemoteTensors:
    """Maps the tensors of `descriptor` (export_tensors in another process on this host)."""
    return RemoteTensors(descriptor, mapper)
