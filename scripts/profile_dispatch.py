"""Fixed cost of one swap call on a GPU, piece by piece (a development aid): host time to
dispatch a jitted trivial function, a jitted segment_copy_to_addresses of one bulk row and
of one kernel row, the swap's group call, and the whole swap, each for a few large tensors.

    python -P scripts/profile_dispatch.py [--mib 512] [--count 4] [--repeats 50] [--trace DIR] [--small 2000]

--trace DIR also records 20 swaps with jax.profiler (a Perfetto trace under DIR, host and
device timelines) to see where a swap call's host time goes. --small N: the same for N
tensors of 16 KiB, piece by piece: the repeat check (tree flatten, fingerprint), and the
group's call made four ways (jit with a tuple, jit with *args, the compiled executable,
the loaded executable's execute_sharded), and a no-op executable of N operands (the runtime's
cost per operand).
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
    p.add_argument("--small", type=int, default=0, help="also profile N x 16 KiB tensors")
    a = p.parse_args()
    if a.small:
        small(a.small, a.repeats, a.trace)
    if a.count == 0:
        return
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
    program = next(iter(api._programs.values()))
    print(f"swap program: {len(program.groups)} groups, {program.launches} launches")
    for g, fn in zip(program.groups, program.fns):
        if fn is None:
            print(f"{'group call':>22}: none ({len(g.torch_copies)} copies PyTorch makes)")
            continue
        shards = tuple(src[name] for name, _, _ in g.source_refs)
        d, t = host_us(lambda: fn(shards), a.repeats, sync)
        print(f"{'group call':>22}: {d:9.1f} / {t:9.1f}  ({len(g.buffers)} buffers)")


def small(count, repeats, trace):
    """Where a repeat swap of `count` x 16 KiB goes (module docstring)."""
    from jax_amem.swapping.destinations import describe
    from jax_amem.swapping.in_process import repeat

    gpu = jax.devices()[0]
    src = {f"s{i}": jax.device_put(jnp.full(4096, i, jnp.float32), gpu) for i in range(count)}
    cuda = torch.cuda.is_available()
    dst = {k: torch.empty(4096, device="cuda" if cuda else "cpu") for k in src}
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    jax_amem.swap(src, dst, progress=False)
    destination = describe(dst)
    how = api._how(None, None)
    leaves = jax.tree_util.tree_leaves(src)
    entry = repeat.find(src, destination, how)[0]
    group_fn = entry.program.fns[0]
    shards = entry.operands[0](leaves)
    inner = group_fn.__wrapped__
    star = jax.jit(lambda *xs: inner(xs))
    compiled = group_fn.lower(shards).compile()
    executable = compiled._executable.xla_executable
    noop = jax.jit(lambda *xs: xs[0][:1], keep_unused=True)
    print(f"{count} x 16 KiB ({len(entry.program.groups)} groups, {entry.program.launches} launches); "
          f"medians of {repeats}; microseconds: host dispatch / until idle")
    for name, fn in [("swap (repeat)", lambda: jax_amem.swap(src, dst, progress=False)),
                     ("describe(dst)", lambda: describe(dst)),
                     ("repeat.find", lambda: repeat.find(src, destination, how)),
                     ("tree_flatten", lambda: jax.tree_util.tree_flatten(src)),
                     ("wait_for_torch", (lambda: torch.cuda.current_stream().synchronize()) if cuda else sync),
                     ("group: jit(tuple)", lambda: group_fn(shards)),
                     ("group: jit(*args)", lambda: star(*shards)),
                     ("group: compiled", lambda: compiled(shards)),
                     ("group: execute_sharded", lambda: executable.execute_sharded(list(shards))
                      .disassemble_into_single_device_arrays()),
                     ("no-op, all operands kept", lambda: noop(*shards)),
                     ("per-tensor copy_ loop", lambda: [t.copy_(torch.from_dlpack(src[k])) for k, t in dst.items()])]:
        try:
            d, t = host_us(fn, repeats, sync)
            print(f"{name:>26}: {d:9.1f} / {t:9.1f}")
        except Exception as error:  # noqa: BLE001 - a development aid: show what failed, go on
            print(f"{name:>26}: failed: {type(error).__name__}: {str(error)[:200]}")
    if trace:
        with jax.profiler.trace(trace + "/small", create_perfetto_trace=True):
            for _ in range(20):
                jax_amem.swap(src, dst, progress=False)
                sync()
        print(f"trace of 20 small swaps written under {trace}/small")
    jax_amem.swapping.forget()
    del src, dst


main()
