"""Communicators a worker makes itself through the interposer (ctypes on libnccl.so.2).

Used by the XLA mesh worker to force a split with splitShare (the case NCCL refuses
to suspend) and to measure the naive baseline (destroy, then initialise each again
one after another) on communicators shaped like XLA's.
"""

from __future__ import annotations

import ctypes
import os
import time

NCCL_CONFIG_MAGIC = 0xCAFEBEEF
UNDEF_INT = -(2**31)  # NCCL_CONFIG_UNDEF_INT


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


class Config(ctypes.Structure):
    """The head of ncclConfig_t: NCCL copies `size` bytes over its defaults."""
    _fields_ = [("size", ctypes.c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("blocking", ctypes.c_int), ("cgaClusterSize", ctypes.c_int),
                ("minCTAs", ctypes.c_int), ("maxCTAs", ctypes.c_int),
                ("netName", ctypes.c_char_p), ("splitShare", ctypes.c_int)]


class OwnComms:
    def __init__(self, store, rank: int):
        self.store, self.rank = store, rank
        lib = ctypes.CDLL("libnccl.so.2", mode=os.RTLD_NOLOAD)
        lib.ncclCommInitRankConfig.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                               UniqueId, ctypes.c_int, ctypes.c_void_p]
        lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId,
                                         ctypes.c_int]
        lib.ncclCommSplit.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                                      ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        lib.ncclCommDestroy.argtypes = [ctypes.c_void_p]
        self.lib = lib
        self.sequence = 0

    def unique_id(self, name: str, root: bool) -> UniqueId:
        """Rank 0 of the group makes the id, the key-value store carries it to the others."""
        uid = UniqueId()
        key = f"own_comms/{name}"
        if root:
            assert self.lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
            self.store.key_value_set_bytes(key, bytes(uid))  # bytes(): ids contain zero bytes
        else:
            ctypes.memmove(ctypes.byref(uid), self.store.blocking_key_value_get_bytes(key, 60_000), 128)
        return uid

    def init(self, name: str, nranks: int, rank: int, split_share: int | None = None) -> ctypes.c_void_p:
        comm = ctypes.c_void_p()
        uid = self.unique_id(name, rank == 0)
        if split_share is None:
            assert self.lib.ncclCommInitRank(ctypes.byref(comm), nranks, uid, rank) == 0
        else:  # as XLA does: a config with splitShare
            version = ctypes.c_int()
            self.lib.ncclGetVersion(ctypes.byref(version))
            config = Config(size=ctypes.sizeof(Config), magic=NCCL_CONFIG_MAGIC,
                            version=version.value, blocking=1, cgaClusterSize=UNDEF_INT,
                            minCTAs=UNDEF_INT, maxCTAs=UNDEF_INT, netName=None,
                            splitShare=split_share)
            assert self.lib.ncclCommInitRankConfig(ctypes.byref(comm), nranks, uid, rank,
                                                   ctypes.byref(config)) == 0
        return comm

    def split(self, parent: ctypes.c_void_p, color: int, key: int) -> tuple[ctypes.c_void_p, float]:
        child = ctypes.c_void_p()
        start = time.perf_counter()
        assert self.lib.ncclCommSplit(parent, color, key, ctypes.byref(child), None) == 0
        return child, time.perf_counter() - start

    def destroy(self, comm: ctypes.c_void_p) -> None:
        assert self.lib.ncclCommDestroy(comm) == 0
