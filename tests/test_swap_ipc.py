"""The swap into another process's tensors (CUDA IPC, jax_amem/swapping/same_host/ipc.py + ready_done.py).

On the CPU: descriptors (JSON round trip, every malformed one refused with a clear error),
RemoteTensors as a swap destination with a host-memory mapper standing in for the CUDA IPC
mapping (bookkeeping only: offsets into shared allocations, each allocation mapped and
unmapped once, the address route, verify), every refusal of export_tensors that needs no
GPU, the stores (a real TCPStore; the real jax.distributed store in a subprocess) and the
ready/done protocol between two threads. On a GPU (`gpu`): two processes, a transformers
Llama in the rollout, logits and bytes checked (tests/gpu_workers/ipc_*.py).
"""

import ctypes
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh

import jax_amem
from jax_amem import reshard
from jax_amem.swapping import SwapError, forget
from jax_amem.swapping.same_host.ipc import CudaIpcMapper, export_tensors, open_remote, parse_descriptor
from jax_amem.swapping.same_host.ready_done import RolloutIpc, TrainerIpc
from jax_amem.swapping.store import JaxStore, StoreTimeout, TorchStore, as_store, key

import test_swap_llama as llama

torch = pytest.importorskip("torch")

WORKERS = Path(__file__).resolve().parent / "gpu_workers"

# Tests whose swaps run on JAX's CPU device with host memory standing in for the CUDA IPC
# mapping: on a machine with a GPU their sources would land on the GPU, and JAX's GPU backend
# in this process would take the memory the two-process GPU tests below need; the real CUDA
# IPC tests run there instead. Asked of the driver, so JAX starts no GPU backend here.
cpu_stand_in = pytest.mark.skipif(jax_amem.gpu_status().usable,
                                  reason="CPU stand-in for CUDA IPC; the gpu tests of this file run the real one")


class HostMapper:
    """Stands in for CudaIpcMapper on the CPU: a "handle" names a numpy allocation of this
    process, opening it gives the allocation's address on the JAX CPU device. Records every
    open and close, so the tests can check each allocation is mapped and unmapped once."""

    def __init__(self, allocations: dict):
        self.allocations = allocations
        self.opened, self.closed = [], []
        self.fail_on = None

    def device_for(self, tensor):
        return jax.devices("cpu")[0]

    def open(self, handle, device):
        if handle == self.fail_on:
            raise RuntimeError("cuIpcOpenMemHandle on device 0: CUDA error 1 (invalid argument)")
        self.opened.append(handle)
        return self.allocations[handle].ctypes.data

    def close(self, handle, device):
        self.closed.append(handle)
        if handle == getattr(self, "fail_close_on", None):
            raise RuntimeError("cuIpcCloseMemHandle: CUDA error 1 (invalid argument)")

    def mapped_bytes(self, handle, device):
        return self.allocations[handle].size

    def read(self, device, address, nbytes):
        return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address)).copy()


def pack(specs: dict, per_allocation: int = 3, fill: int = 0xFF, allocations: dict | None = None):
    """A descriptor as export_tensors makes it, for tensors packed `per_allocation` to a host
    allocation at 512-byte aligned offsets (as PyTorch's caching allocator sub-allocates).
    Returns (descriptor, allocations, {name: numpy view of the tensor's bytes})."""
    allocations = {} if allocations is None else allocations
    names = list(specs)
    tensors, views = {}, {}
    for start in range(0, len(names), per_allocation):
        chunk = names[start:start + per_allocation]
        offsets, end = [], 0
        for name in chunk:
            shape, dtype = specs[name]
            offsets.append(end)
            end += -(-max(1, int(np.prod(shape)) * np.dtype(dtype).itemsize) // 512) * 512
        handle = os.urandom(64)
        memory = np.full(end, fill, np.uint8)
        allocations[handle] = memory
        for name, offset in zip(chunk, offsets):
            shape, dtype = specs[name]
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            tensors[name] = {"handle": handle.hex(), "offset": offset, "nbytes": nbytes, "allocation_bytes": end,
                             "shape": list(shape), "dtype": np.dtype(dtype).name, "device": 0,
                             "pci_bus_id": "0000:00:00.0"}
            views[name] = memory[offset:offset + nbytes].view(dtype).reshape(shape)
    descriptor = {"format": 1, "host": socket.gethostname(), "pid": os.getppid(), "tensors": tensors}
    return descriptor, allocations, views


def llama_specs() -> dict:
    return {name: (tuple(p.shape), np.float32) for name, p in llama.nan_model().named_parameters()}


# ----------------------------------------------------------------------------- descriptors

@cpu_stand_in
def test_descriptor_survives_json():
    descriptor, _, _ = pack({"a": ((4, 3), np.float32), "b": ((7,), jnp.bfloat16), "c": ((0, 5), np.int8)})
    again = parse_descriptor(json.loads(json.dumps(descriptor)))
    first = parse_descriptor(descriptor)
    assert list(again) == ["a", "b", "c"]
    for name, t in again.items():
        u = first[name]
        assert (t.handle, t.offset, t.nbytes, t.shape, t.dtype, t.ordinal, t.pci_bus_id) == \
               (u.handle, u.offset, u.nbytes, u.shape, u.dtype, u.ordinal, u.pci_bus_id)
    assert again["b"].dtype == np.dtype(jnp.bfloat16) and again["c"].handle is None  # empty: nothing to map


def _entry(descriptor):
    return descriptor["tensors"]["w"]


@cpu_stand_in
@pytest.mark.parametrize("change, message", [
    (lambda d: _entry(d).update(dtype="complex1024"), "dtype 'complex1024', which JAX does not know"),
    (lambda d: [_entry(d).pop(k) for k in ("offset", "shape")], r"lacks \['offset', 'shape'\]"),
    (lambda d: _entry(d).update(nbytes=12), "nbytes 12 does not match shape"),
    (lambda d: _entry(d).update(handle="abc"), "is not 64 bytes in hex"),
    (lambda d: _entry(d).update(handle=None), "is not 64 bytes in hex"),
    (lambda d: _entry(d).update(offset=4096), "outside its allocation"),
    (lambda d: d.update(host="another-host"), "works within one host"),
    (lambda d: d.update(pid=os.getpid()), "exported by this very process"),
    (lambda d: d.update(format=99), "descriptor format 99"),
    (lambda d: d.update(tensors={}), "holds no tensors"),
    (lambda d: d["tensors"].update(w=[1, 2]), "is a list, not a dict"),
    (lambda d: d.pop("tensors"), "must be the dict export_tensors returned"),
    (lambda d: _entry(d).pop("allocation_bytes"), r"lacks \['allocation_bytes'\]"),  # no bound, no write
    (lambda d: _entry(d).update(shape=[-8, -8]), r"shape \(-8, -8\) has a negative dimension"),
])
def test_malformed_descriptors_are_refused_by_name(change, message):
    descriptor, allocations, _ = pack({"w": ((8, 8), np.float32)})
    change(descriptor)
    mapper = HostMapper(allocations)
    with pytest.raises(SwapError, match=message):
        open_remote(descriptor, mapper)
    assert mapper.opened == []  # refused before anything was mapped


@cpu_stand_in
def test_a_gpu_this_process_does_not_see_is_named():
    descriptor, _, _ = pack({"w": ((4,), np.float32)})
    _entry(descriptor)["pci_bus_id"] = "0000:FF:1F.0"
    with pytest.raises(SwapError, match=r"PCI bus id 0000:FF:1F.0 \(the exporter's cuda:0\).*CUDA_VISIBLE_DEVICES"):
        open_remote(descriptor, CudaIpcMapper())


# ----------------------------------------------------------------------------- export refusals

def test_export_refuses_cpu_non_contiguous_and_foreign_values(monkeypatch):
    with pytest.raises(SwapError, match="'w' is on cpu; CUDA IPC shares GPU memory only"):
        export_tensors({"w": torch.zeros(4)})
    with pytest.raises(SwapError, match=r"'t' is not contiguous \(strides \(1, 4\)\)"):
        export_tensors({"t": torch.zeros(4, 4).t()})
    with pytest.raises(SwapError, match="'n' is a ndarray, not a torch.Tensor"):
        export_tensors({"n": np.zeros(4)})
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    with pytest.raises(SwapError, match="expandable segments, whose memory CUDA IPC cannot export"):
        export_tensors({"w": torch.zeros(4)})


# ----------------------------------------------------------------------------- RemoteTensors as a destination

@cpu_stand_in
def test_llama_written_through_remote_tensors_byte_for_byte():
    forget()
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("fsdp", "tp"))
    tree = llama.flax_params(0)
    params = llama.fsdp_tp_sharded(tree, mesh)
    descriptor, allocations, views = pack(llama_specs(), per_allocation=4)
    mapper = HostMapper(allocations)
    with open_remote(json.loads(json.dumps(descriptor)), mapper) as remote:
        assert sorted(mapper.opened) == sorted(allocations)  # each allocation mapped once
        report = jax_amem.swap(params, remote, rules=reshard.rules.hf_llama(llama.L), verify=True)
        assert report.route == "addresses" and report.verified and report.buffers == len(views)
        for name, want in llama.numpy_hf(tree).items():
            assert np.array_equal(views[name].view(np.uint32), np.ascontiguousarray(want).view(np.uint32)), name
    assert sorted(mapper.closed) == sorted(allocations) and remote.closed
    remote.close()  # twice: nothing more to unmap
    assert len(mapper.closed) == len(allocations)
    for handle, memory in allocations.items():  # the padding between tensors is never written
        padding = np.ones(memory.size, bool)
        for entry in descriptor["tensors"].values():
            if bytes.fromhex(entry["handle"]) == handle:
                padding[entry["offset"]:entry["offset"] + entry["nbytes"]] = False
        assert (memory[padding] == 0xFF).all()


@cpu_stand_in
def test_many_tensors_of_several_dtypes_bit_exact():
    rng = np.random.default_rng(3)
    dtypes = [np.float32, jnp.bfloat16, np.int8, np.uint16]
    specs = {f"t{i}": ((int(rng.integers(1, 9)), int(rng.integers(1, 40))), dtypes[i % 4]) for i in range(120)}
    values = {n: rng.integers(0, 256, int(np.prod(shape)) * np.dtype(dtype).itemsize, dtype=np.uint8)
              .view(dtype).reshape(shape) for n, (shape, dtype) in specs.items()}  # any bits, NaNs included
    params = {n: jax.device_put(v, jax.devices("cpu")[i % 8]) for i, (n, v) in enumerate(values.items())}
    descriptor, allocations, views = pack(specs, per_allocation=7)
    with open_remote(descriptor, HostMapper(allocations)) as remote:
        jax_amem.swap(params, remote)
    for name, value in values.items():
        assert views[name].tobytes() == np.ascontiguousarray(value).tobytes(), name


@cpu_stand_in
def test_a_closed_remote_is_refused_even_with_its_program_cached():
    params = {"w": jnp.arange(16, dtype=jnp.float32)}
    descriptor, allocations, views = pack({"w": ((16,), np.float32)})
    remote = open_remote(descriptor, HostMapper(allocations))
    jax_amem.swap(params, remote)
    remote.close()
    before = views["w"].copy()
    with pytest.raises(SwapError, match="RemoteTensors were closed .* open_remote"):
        jax_amem.swap({"w": jnp.zeros(16, jnp.float32)}, remote)
    assert np.array_equal(views["w"], before)


@cpu_stand_in
def test_shape_dtype_and_tied_remote_destinations_are_refused_untouched():
    descriptor, allocations, views = pack({"w": ((4, 4), np.float32)})
    with open_remote(descriptor, HostMapper(allocations)) as remote:
        with pytest.raises(SwapError, match=r"destination 'w' of shape \(4, 4\): part 'w' gives shape \(16,\)"):
            jax_amem.swap({"w": jnp.ones(16, jnp.float32)}, remote)
        with pytest.raises(SwapError, match="destination 'w': dtype mismatch: it is float32, source 'w' sends int32"):
            jax_amem.swap({"w": jnp.ones((4, 4), jnp.int32)}, remote)
    assert (allocations[next(iter(allocations))] == 0xFF).all()
    descriptor, allocations, _ = pack({"a": ((4,), np.float32)})
    descriptor["tensors"]["b"] = dict(descriptor["tensors"]["a"])
    with open_remote(descriptor, HostMapper(allocations)) as remote:
        with pytest.raises(SwapError, match="'a' and 'b' share memory"):
            jax_amem.swap({"a": jnp.ones(4), "b": jnp.ones(4)}, remote)
    assert (allocations[next(iter(allocations))] == 0xFF).all()


@cpu_stand_in
def test_a_plan_for_another_device_than_the_remote_tensor_is_refused():
    src = {"w": jnp.ones(8, jnp.float32)}
    elsewhere = reshard.Owner(jax.process_index(), jax.devices()[3].id)
    plan = reshard.plan(src, {"w": reshard.Layout.single((8,), np.float32, elsewhere)})
    descriptor, allocations, _ = pack({"w": ((8,), np.float32)})
    with open_remote(descriptor, HostMapper(allocations)) as remote:
        with pytest.raises(SwapError, match=r"destination 'w' is on the exporter's cuda:0 \(owner \(0, 0\)\), but "
                                            rf"the plan puts it on owner\(s\) \[\(0, {elsewhere.device}\)\]"):
            jax_amem.swap(src, remote, plan=plan)
    assert (allocations[next(iter(allocations))] == 0xFF).all()


@cpu_stand_in
def test_an_open_that_fails_unmaps_what_was_mapped():
    descriptor, allocations, _ = pack({f"t{i}": ((4,), np.float32) for i in range(6)}, per_allocation=2)
    mapper = HostMapper(allocations)
    mapper.fail_on = list(allocations)[1]
    with pytest.raises(SwapError, match="open_remote: cuIpcOpenMemHandle on device 0"):
        open_remote(descriptor, mapper)
    assert mapper.opened == list(allocations)[:1] and mapper.closed == mapper.opened


@cpu_stand_in
def test_a_descriptor_claiming_more_than_the_mapping_holds_is_refused_and_unmapped():
    """The descriptor's allocation_bytes is only the exporter's word: a stale or forged one that
    claims more than the driver mapped would have the swap write past the mapping."""
    descriptor, allocations, _ = pack({"a": ((8,), np.float32), "w": ((128,), np.float32)}, per_allocation=1)
    _entry(descriptor).update(offset=512, allocation_bytes=512 + 512)  # 'w' said to start past its 512 bytes
    mapper = HostMapper(allocations)
    with pytest.raises(SwapError, match=r"'w': bytes \[512, 1024\) lie outside its allocation, which is 512 "
                                        r"bytes as mapped here"):
        open_remote(descriptor, mapper)
    assert sorted(mapper.opened) == sorted(allocations) and sorted(mapper.closed) == sorted(mapper.opened)
    assert all((m == 0xFF).all() for m in allocations.values())


@cpu_stand_in
def test_a_mapping_whose_size_the_driver_cannot_give_falls_back_to_the_descriptors():
    """cuMemGetAddressRange failing on a mapping (mapped_bytes 0) must not refuse a working
    mapping: the descriptor's own allocation size is still checked (parse_descriptor)."""
    descriptor, allocations, views = pack({"w": ((16,), np.float32)})

    class SizeUnknown(HostMapper):
        def mapped_bytes(self, handle, device):
            return 0

    with open_remote(descriptor, SizeUnknown(allocations)) as remote:
        jax_amem.swap({"w": jnp.arange(16, dtype=jnp.float32)}, remote)
        assert views["w"].view(np.uint8).tobytes() == np.arange(16, dtype=np.float32).tobytes()
    _entry(descriptor).update(allocation_bytes=8)  # and a descriptor that contradicts itself is still refused
    with pytest.raises(SwapError, match="outside"):
        open_remote(descriptor, SizeUnknown(allocations))


@cpu_stand_in
def test_a_close_that_fails_still_unmaps_the_others():
    descriptor, allocations, _ = pack({f"t{i}": ((4,), np.float32) for i in range(6)}, per_allocation=2)
    mapper = HostMapper(allocations)
    remote = open_remote(descriptor, mapper)
    mapper.fail_close_on = list(allocations)[0]
    with pytest.raises(SwapError, match=r"closing remote tensors: cuIpcCloseMemHandle.*the other mappings were closed"):
        remote.close()
    assert sorted(mapper.closed) == sorted(allocations) and remote.closed
    remote.close()  # once closed, closed


class DictStore:
    """A store in a dict (set/get/delete), for the protocol's bookkeeping without a server."""

    def __init__(self):
        self.values = {}

    def set(self, k, value):
        self.values[k] = bytes(value)

    def get(self, k, timeout=1.0):
        if k not in self.values:
            raise StoreTimeout(f"key {k!r} absent")
        return self.values[k]

    def delete(self, k):
        self.values.pop(k, None)


@cpu_stand_in
def test_trainer_unmaps_the_old_generation_even_when_the_new_one_is_refused():
    """A failed `done` lets the rollout free its old tensors: the trainer must not still map
    them. And close() always says closed, so the rollout's wait_closed never waits out its
    timeout for a mapping the trainer does not hold."""
    forget()
    store = DictStore()
    descriptor, allocations, views = pack({"w": ((4,), np.float32)})
    mapper = HostMapper(allocations)
    store.set(key("rollout", "handles", 0), json.dumps({**descriptor, "generation": 1}).encode())
    trainer = TrainerIpc(store, mapper=mapper)
    store.set(key("rollout", "ready", 0, 1), json.dumps({"generation": 1}).encode())
    trainer.swap({"w": jnp.arange(4, dtype=jnp.float32)}, 1)
    assert views["w"].tolist() == [0, 1, 2, 3] and mapper.opened == list(allocations) and mapper.closed == []
    store.set(key("rollout", "ready", 0, 2), json.dumps({"generation": 2}).encode())  # ready before publish
    with pytest.raises(SwapError, match="ready with handles of generation 2, but the store holds generation 1"):
        trainer.swap({"w": jnp.arange(4, dtype=jnp.float32)}, 2)
    assert not json.loads(store.values[key("rollout", "done", 0, 2)])["ok"]
    assert mapper.closed == mapper.opened and trainer.remote is None  # generation 1 unmapped
    trainer.close()
    assert store.values[key("rollout", "closed", 0)] == b"1"
    fresh = TrainerIpc(store, rank=3, mapper=mapper)  # never swapped: closing still says so
    fresh.close()
    assert key("rollout", "closed", 3) in store.values


# ----------------------------------------------------------------------------- stores

@pytest.fixture
def tcp_store():
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)


def test_store_timeout_names_the_key(tcp_store):
    store = TorchStore(tcp_store)
    with pytest.raises(StoreTimeout, match=r"key 'jax_amem/swap/g/done/0/7' did not appear .* within 0.2 s"):
        store.get(key("g", "done", 0, 7), timeout=0.2)
    store.set("k", b"\x00v")
    assert store.get("k", timeout=1) == b"\x00v"
    store.delete("k")
    store.delete("k")  # absent: no error
    with pytest.raises(SwapError, match="timeout must be a positive number"):
        store.get("k", timeout=0)


def test_store_choice_and_keys_are_checked(tcp_store):
    assert isinstance(as_store(tcp_store), TorchStore)
    with pytest.raises(SwapError, match="jax.distributed is not initialized"):
        as_store(None)
    with pytest.raises(SwapError, match="jax.distributed is not initialized"):
        JaxStore()
    with pytest.raises(SwapError, match="store must be a TorchStore, a JaxStore or a torch.distributed.Store"):
        as_store(object())
    with pytest.raises(SwapError, match="contains '/'"):
        key("a/b")
    assert key("rollout", "ready", 0, 3) == "jax_amem/swap/rollout/ready/0/3"


@cpu_stand_in
def test_jax_distributed_store_in_a_process_of_its_own():
    """The real jax.distributed key-value store (a one-process coordinator on 127.0.0.1)."""
    out = subprocess.run([sys.executable, "-P", str(WORKERS / "ipc_jax_store.py")], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert "RESULT ok" in out.stdout, out.stdout + out.stderr


@cpu_stand_in
def test_ready_done_protocol_between_two_threads(tcp_store):
    """Rollout and trainer ends over a real TCPStore: two versions, a reload (new handles,
    old ones unmapped), and a failed swap reported to the rollout instead of a hang."""
    forget()
    port = tcp_store.port
    descriptor, allocations, views = pack({"a": ((3, 5), np.float32), "b": ((64,), jnp.bfloat16)})
    reload_descriptor, _, reload_views = pack({"a": ((3, 5), np.float32), "b": ((64,), jnp.bfloat16)},
                                              allocations=allocations)
    mapper = HostMapper(allocations)
    first_handles = {bytes.fromhex(e["handle"]) for e in descriptor["tensors"].values()}
    seen, errors = {}, []

    def rollout():
        try:
            client = TorchStore.connect("127.0.0.1", port)
            tensors = {n: torch.from_numpy(v.view(np.uint8)) for n, v in views.items()}
            end = RolloutIpc(client, tensors, rank=1, descriptor=descriptor, timeout=30)
            for version in (1, 2):
                end.ready(version)
                summary = end.wait(version)
                seen[version] = ({n: v.copy() for n, v in views.items()}, summary)
            end.publish({n: torch.from_numpy(v.view(np.uint8)) for n, v in reload_views.items()}, reload_descriptor)
            end.ready(3)
            seen[3] = (end.wait(3), {n: v.copy() for n, v in reload_views.items()})
            end.ready(4)
            end.wait(4)
        except Exception as error:  # noqa: BLE001  (reported to the main thread)
            errors.append(error)

    thread = threading.Thread(target=rollout)
    thread.start()
    trainer = TrainerIpc(tcp_store, rank=1, mapper=mapper, timeout=30)
    params = [{"a": jnp.full((3, 5), v, jnp.float32), "b": jnp.arange(64, dtype=jnp.bfloat16) * v} for v in (1, 2, 3)]
    assert trainer.swap(params[0], 1).version == 1
    trainer.swap(params[1], 2)
    trainer.swap(params[2], 3)
    with pytest.raises(SwapError, match="destination\\(s\\) that nothing writes .*'b'"):
        trainer.swap({"a": params[0]["a"]}, 4)
    thread.join(60)
    trainer.close()
    assert len(errors) == 1 and "the trainer's swap 4 into rank 1 failed" in str(errors[0]), errors
    for version in (1, 2):
        got, summary = seen[version]
        assert summary["ok"] and summary["version"] == version and summary["bytes"] == 15 * 4 + 64 * 2
        for name in ("a", "b"):
            assert got[name].tobytes() == np.asarray(params[version - 1][name]).tobytes()
    summary, got = seen[3]
    assert summary["ok"] and all(got[n].tobytes() == np.asarray(params[2][n]).tobytes() for n in got)
    assert first_handles <= set(mapper.closed)  # the reload unmapped the first generation
    assert sorted(mapper.closed) == sorted(mapper.opened)


class ShmMapper(HostMapper):
    """The CPU stand-in for CUDA IPC across processes: a handle is the name of the rollout's
    POSIX shared memory block, mapped here by name (ipc_shm_rollout.py)."""

    def __init__(self):
        super().__init__({})
        self.blocks = {}

    def open(self, handle, device):
        from multiprocessing import resource_tracker, shared_memory

        block = shared_memory.SharedMemory(name=handle.rstrip(b"\0").decode())
        resource_tracker.unregister(block._name, "shared_memory")  # the rollout owns it (Python < 3.13 tracks)
        view = np.ndarray((block.size,), np.uint8, buffer=block.buf)
        self.blocks[handle] = (block, view)
        self.opened.append(handle)
        return view.ctypes.data

    def mapped_bytes(self, handle, device):
        return self.blocks[handle][1].size

    def close(self, handle, device):
        block, view = self.blocks.pop(handle)
        del view
        block.close()
        self.closed.append(handle)


@cpu_stand_in
def test_protocol_between_two_processes_over_shared_memory(tcp_store):
    """The rollout in a process of its own (tensors in shared memory instead of GPU memory),
    the trainer here: two versions written into the other process's memory through the
    address route, read back there, the padding between its tensors untouched."""
    forget()
    rollout = _run([WORKERS / "ipc_shm_rollout.py", tcp_store.port],
                   {"PYTHONPATH": os.pathsep.join(sys.path), "JAX_PLATFORMS": "cpu"})
    mapper = ShmMapper()
    trainer = TrainerIpc(tcp_store, mapper=mapper, timeout=60)
    params = [{"a": jnp.arange(15, dtype=jnp.float32).reshape(3, 5) * v, "b": jnp.arange(64, dtype=jnp.bfloat16) - v}
              for v in (1, 2)]
    try:
        for version, tree in enumerate(params, start=1):
            assert trainer.swap(tree, version, verify=True).verified
    finally:
        trainer.close()
    results, log = _results(rollout, timeout=120)
    assert rollout.returncode == 0, log[-4000:]
    assert len(mapper.opened) == 1 and mapper.closed == mapper.opened  # one block, mapped once
    for result, tree in zip(results, params):
        assert result["summary"]["ok"] and result["padding_untouched"]
        assert result["bytes"] == {n: np.asarray(v).tobytes().hex() for n, v in tree.items()}


# ----------------------------------------------------------------------------- GPU: two processes

def _run(args, env=None, timeout=300):
    environment = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.Popen([sys.executable, "-P", *map(str, args)], env=environment, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _results(proc, timeout=300) -> tuple[list, str]:
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out = proc.communicate()[0] + "\n<killed: timeout>"
    return [json.loads(line[7:]) for line in out.splitlines() if line.startswith("RESULT ")], out


@pytest.mark.gpu
@pytest.mark.parametrize("case", ["llama", "many"])
def test_two_processes_swap_through_cuda_ipc(case):
    """A PyTorch rollout process exports its tensors; the JAX trainer process swaps into them;
    the rollout's logits equal the JAX model's (llama) or its bytes the sources' (many)."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.3", "PYTORCH_CUDA_ALLOC_CONF": ""}
    rollout = _run([WORKERS / "ipc_rollout.py", case, store.port], env)
    trainer = _run([WORKERS / "ipc_trainer.py", case, store.port], env)
    (t_results, t_log), (r_results, r_log) = _results(trainer), _results(rollout)
    assert trainer.returncode == 0 and rollout.returncode == 0, t_log[-4000:] + r_log[-4000:]
    mine = {r["phase"]: r for r in t_results}
    theirs = {r["phase"]: r for r in r_results}
    assert theirs["done"]["pointers_unchanged"]
    assert mine["swap"]["route"] == "addresses" and mine["swap"]["verified"]
    # the driver maps at least the exporter's allocation sizes; a forged descriptor is refused
    assert mine["forged"]["refused"] and mine["forged"]["sizes_match"], mine["forged"]
    assert mine["forged"]["open_count_unchanged"], mine["forged"]
    if case == "llama":
        want = np.asarray(mine["oracle"]["logits"])
        for version in (1, 2):
            np.testing.assert_allclose(np.asarray(theirs[f"v{version}"]["logits"]), want if version == 1 else
                                       np.asarray(mine["oracle2"]["logits"]), rtol=1e-4, atol=1e-4)
    else:
        assert theirs["v1"]["digests"] == mine["oracle"]["digests"]
        assert theirs["v2"]["digests"] == mine["oracle2"]["digests"]


@pytest.mark.gpu
def test_gpu_refusals_with_the_real_driver():
    """Opening a handle this process exported (CUDA refuses), and memory from expandable
    segments set at run time (not IPC-capable), each a clear error."""
    out = subprocess.run([sys.executable, "-P", str(WORKERS / "ipc_refusals.py")], capture_output=True, text=True,
                         timeout=300, env={**os.environ, "PYTORCH_CUDA_ALLOC_CONF": ""})
    assert "RESULT ok" in out.stdout, out.stdout[-4000:] + out.stderr[-4000:]
