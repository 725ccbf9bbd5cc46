"""Fixed cost of one swap call on a GPU, piece by piece (a development aid): host time to
dispatch a jitted trivial function, a jitted segment_copy_to_addresses of one bulk row and
of one kernel row, the swap's group call, and the whole swap, each for a few large tensors.

    python -P scripts/profile_dispatch.py [--mib 512] [--count 4] [--repeats 50] [--trace DIR]

--trace DIR also records 20 swaps with jax.profiler (a Perfetto trace under DIR, host and
device timelines) to see where a swap call's host time goes.
"""
import argparse
import statistics
import time

import numpy as np

import jax_amem
import jax
import jax.numpy as jnp
import torch
from jax_amem.copy import segment_copy, segment_copy_to_addresses
from jax_amem.swapping.in_process import run as api


def host_us(fn, repeats, sync):
    fn()
    sync()
    dispatch, total = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        dispatch.append(time.perf_counter() - start)
        jax.block_until_ready(out)
        sync()
        total.append(time.perf_counter() - start)
    return statistics.median(dispatch) * 1e6, statistics.median(total) * 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mib", type=float, default=512)
    p.add_argument("--count", type=int, default=4)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--trace", default=None, help="folder for a jax.profiler trace of 20 swaps")
    a = p.parse_args()
    gpu = jax.devices()[0]
    n = int(a.mib * 2**18)
    src = {f"t{i}": jax.device_put(jnp.full(n, i, jnp.float32), gpu) for i in range(a.count)}
    dst = {k: torch.empty(n, device="cuda") for k in src}
    sync = torch.cuda.synchronize
    rows = [(i, i, 0, 0, n * 4) for i in range(a.count)]
    ptrs, sizes = [t.data_ptr() for t in dst.values()], [t.nbytes for t in dst.values()]
    srcs = list(src.values())
    trivial = jax.jit(lambda xs: xs[0][:1])
    bulk = jax.jit(lambda xs: segment_copy_to_addresses(xs, ptrs, sizes, rows))
    kernel = jax.jit(lambda xs: segment_copy_to_addresses(xs, ptrs, sizes, rows, bulk_bytes=1 << 62))
    tiny_src = [jax.device_put(jnp.arange(16, dtype=jnp.float32), gpu)]
    tiny_dst = torch.zeros(16, device="cuda")
    no_rows = jax.jit(lambda xs: segment_copy_to_addresses(xs, [tiny_dst.data_ptr()], [64], []))
    one_row = jax.jit(lambda xs: segment_copy_to_addresses(xs, [tiny_dst.data_ptr()], [64], [(0, 0, 0, 0, 64)]))
    one_bulk = jax.jit(lambda xs: segment_copy_to_addresses(xs, [tiny_dst.data_ptr()], [64], [(0, 0, 0, 0, 64)],
                                                            bulk_bytes=1))
    donated = jax.jit(lambda x, y: segment_copy(x, y, [(0, 0, 64)]), donate_argnums=1)
    tiny_out = [jax.device_put(jnp.zeros(16, jnp.float32), gpu)]

    def donated_step():
        tiny_out[0] = donated(tiny_src[0], tiny_out[0])
        return tiny_out[0]
    add = jax.jit(lambda xs: xs[0] + 1)
    print("tiny (64 bytes); microseconds: host dispatch / until idle")
    for name, fn in [("jit x + 1", lambda: add(tiny_src)), ("to_addresses, no rows", lambda: no_rows(tiny_src)),
                     ("to_addresses, 1 row", lambda: one_row(tiny_src)),
                     ("to_addresses, 1 bulk", lambda: one_bulk(tiny_src)),
                     ("segment_copy donated", donated_step)]:
        d, t = host_us(fn, a.repeats, sync)
        print(f"{name:>22}: {d:9.1f} / {t:9.1f}")
    flat_s = torch.empty(n * a.count, device="cuda")
    flat_d = torch.empty_like(flat_s)
    print(f"{a.count} x {a.mib} MiB; medians of {a.repeats}; microseconds: host dispatch / until idle")
    for name, fn in [("jit trivial", lambda: trivial(srcs)), ("bulk copies", lambda: bulk(srcs)),
                     ("kernel copy", lambda: kernel(srcs)), ("torch copy_ ceiling", lambda: flat_d.copy_(flat_s)),
                     ("swap", lambda: jax_amem.swap(src, dst, progress=False))]:
        d, t = host_us(fn, a.repeats, sync)
        print(f"{name:>22}: {d:9.1f} / {t:9.1f}")
    if a.trace:
        with jax.profiler.trace(a.trace, create_perfetto_trace=True):
            for _ in range(20):
                jax_amem.swap(src, dst, progress=False)
                sync()
        print(f"trace of 20 swaps written under {a.trace}")
    program = next(iter(api._ready.values()))
    print(f"swap program: {len(program.groups)} groups, {program.launches} launches")
    for g, fn in zip(program.groups, program.fns):
        shards = tuple(src[name] for name, _, _ in g.source_refs)
        d, t = host_us(lambda: fn(shards), a.repeats, sync)
        print(f"{'group call':>22}: {d:9.1f} / {t:9.1f}  ({len(g.buffers)} buffers)")


main()
