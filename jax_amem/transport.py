"""The NCCL transport's XLA FFI targets from Python, as copy.py is for the copy targets: one
function per target, called inside the swap's jitted programs (swapping/cross_host/).

- `send_bucket`: gathers one staging bucket from source views with a row table and
  `ncclSend`s it to a peer (src/ffi/nccl_send_bucket.cc);
- `recv_bucket`: `ncclRecv`s one bucket from a peer and unpacks it into destination buffers,
  each aliased to its result, so written in place when donated (src/ffi/nccl_recv_bucket.cc).

A u8 scalar token runs from each call to the next: it orders buckets that share no buffer,
which must still go in the order the peers match them (NCCL matches a peer's sends and
receives in issue order). Both are CUDA only: NCCL has no CPU path.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from . import _ffi

TOKEN = jax.ShapeDtypeStruct((), np.uint8)


def first_token():
    """The token the first bucket call of a program takes."""
    return jnp.zeros((), jnp.uint8)


def send_bucket(token, table: np.ndarray, affine_rows: np.ndarray, affine_table: np.ndarray, sources, *, pipe: int,
                comm: int, peer: int, slot: int, nbytes: int, drain: bool, programs: int):
    """One bucket sent: `table` the validated, split (n, 6) int64 rows gathering it from
    `sources` (dst_index 0 = the bucket), `affine_rows` / `affine_table` / `programs` the rows
    of views with constant steps and their step programs (jax_amem.affine_copy; empty where
    none); returns the next token. `drain`: the peer's last bucket (XLA's stream then waits
    until the pipe's sends are done)."""
    send = jax.ffi.ffi_call(_ffi.NCCL_SEND_BUCKET, TOKEN, has_side_effect=True)
    return send(token, jnp.asarray(table.view(np.uint32)), jnp.asarray(affine_rows.view(np.uint32)),
                jnp.asarray(affine_table), *sources, programs=np.int64(programs),
                **_attributes(pipe, comm, peer, slot, nbytes, drain))


def recv_bucket(token, table: np.ndarray, destinations, *, pipe: int, comm: int, peer: int, slot: int,
                nbytes: int, drain: bool):
    """One bucket received and unpacked into `destinations` by `table` (src_index 0 = the
    bucket); returns (the next token, the written destinations)."""
    destinations = list(destinations)
    receive = jax.ffi.ffi_call(
        _ffi.NCCL_RECV_BUCKET, [TOKEN, *(jax.ShapeDtypeStruct(d.shape, d.dtype) for d in destinations)],
        input_output_aliases=recv_aliases(len(destinations)), has_side_effect=True)
    token, *written = receive(token, jnp.asarray(table.view(np.uint32)), *destinations,
                              **_attributes(pipe, comm, peer, slot, nbytes, drain))
    return token, written


def recv_aliases(count: int) -> dict[int, int]:
    """input_output_aliases of a receive with `count` destinations: operands (token, table,
    destinations...) -> results (token, destinations...)."""
    return {2 + i: 1 + i for i in range(count)}


def _attributes(pipe, comm, peer, slot, nbytes, drain) -> dict:
    return dict(pipe=np.int64(pipe), comm=np.int64(comm), peer=np.int64(peer), slot=np.int64(slot),
                bytes=np.int64(nbytes), drain=np.int64(drain))
