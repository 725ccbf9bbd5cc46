"""Segment-copy bandwidth against a plain device-to-device copy measured in the same run.

    python -P benchmarks/segment_copy.py [--gib 2] [--pieces 1,64,4096]

Prints a table: for each way of cutting the same bytes into segments, the
achieved bandwidth of jax_amem.copy.segment_copy, the ceiling (XLA's own copy of
the same bytes, `x ^ 1` fused into one pass, on the same device) and the ratio.
Payload bandwidth counts bytes copied once (not read + write).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import jax_amem  # noqa: F401  (before JAX starts)
import jax
import jax.numpy as jnp


def timed(step, state, repeats: int) -> float:
    """Best wall time of `state = step(state)` over `repeats` runs, after one warm-up.

    Threading the state through lets a step donate its buffer, as a real swap does.
    """
    state = jax.block_until_ready(step(state))
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        state = jax.block_until_ready(step(state))
        best = min(best, time.perf_counter() - start)
    return best


def run(total_bytes: int, piece_counts: list[int], repeats: int) -> list[dict]:
    device = jax.devices()[0]
    words = total_bytes // 4
    src = jax.device_put(jnp.arange(words, dtype=jnp.uint32), device)
    dst = jax.device_put(jnp.zeros(words, jnp.uint32), device)
    # One read and one write of every byte, fused by XLA: the device's copy ceiling.
    ceiling_fn = jax.jit(lambda x: x ^ jnp.uint32(1), donate_argnums=0)
    ceiling = total_bytes / timed(ceiling_fn, jnp.copy(src), repeats=repeats)
    rows = []
    for pieces in piece_counts:
        size = (total_bytes // pieces) // 16 * 16
        table = np.array([(i * size, i * size, size) for i in range(pieces)], dtype=np.int64)
        copy_fn = jax.jit(lambda s, d, table=table: jax_amem.copy.segment_copy(s, d, table),
                          donate_argnums=1)
        seconds = timed(lambda state: (state[0], copy_fn(*state)), (src, dst), repeats=repeats)
        dst = jnp.zeros(words, jnp.uint32)
        moved = size * pieces
        rows.append({"segments": pieces, "bytes": moved, "seconds": seconds,
                     "GB/s": moved / seconds / 1e9, "ceiling GB/s": ceiling / 1e9,
                     "ratio": moved / seconds / ceiling})
    return rows


def print_table(rows: list[dict], platform: str) -> None:
    print(f"segment copy on {platform} (ceiling: XLA device copy of the same bytes, same run)")
    print(f"{'segments':>9} {'MiB':>9} {'GB/s':>9} {'ceiling':>9} {'ratio':>7}")
    for r in rows:
        print(f"{r['segments']:>9} {r['bytes'] / 2**20:>9.1f} {r['GB/s']:>9.1f} "
              f"{r['ceiling GB/s']:>9.1f} {r['ratio']:>7.2f}")


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=None,
                        help="bytes to copy, GiB (default: 2 on GPU, 0.0625 on CPU)")
    parser.add_argument("--pieces", default="1,64,4096,65536")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    platform = jax.devices()[0].platform
    gib = args.gib if args.gib is not None else (2.0 if platform == "gpu" else 1 / 16)
    rows = run(int(gib * 2**30), [int(p) for p in args.pieces.split(",")], args.repeats)
    print_table(rows, f"{platform} ({jax.devices()[0].device_kind})")
    return rows


if __name__ == "__main__":
    main()
