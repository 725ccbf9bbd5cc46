"""The main job. Until the end-to-end RL loop lands, it shows what exists:
the platform, and the batched segment copy resharding rows of a parameter
inside `jax.jit`, checked against numpy.
"""

from __future__ import annotations

import time

import numpy as np


def main(args) -> int:
    import jax
    import jax.numpy as jnp

    import jax_amem

    device = jax.devices()[0]
    print(f"jax-amem demo on {device.platform} ({device.device_kind}), {len(jax.devices())} devices")
    rows, cols = (4096, 1024) if not getattr(args, "quick", False) else (256, 64)
    weight = jax.device_put(jnp.arange(rows * cols, dtype=jnp.float32).reshape(rows, cols), device)
    # Gather every other row into the top half of a buffer: one segment per row, one launch.
    row_bytes = cols * 4
    segments = np.array([(2 * r * row_bytes, r * row_bytes, row_bytes) for r in range(rows // 2)])
    gather = jax.jit(lambda w, d: jax_amem.segment_copy(w, d, segments), donate_argnums=1)
    out = gather(weight, jnp.zeros_like(weight)).block_until_ready()
    start = time.perf_counter()
    out = gather(weight, out).block_until_ready()
    seconds = time.perf_counter() - start
    expected = np.asarray(weight)[::2]
    ok = np.array_equal(np.asarray(out)[: rows // 2], expected)
    moved = rows // 2 * row_bytes
    print(f"segment copy: {rows // 2} segments, {moved / 2**20:.1f} MiB in {seconds * 1e3:.2f} ms "
          f"({moved / seconds / 1e9:.1f} GB/s), matches numpy: {ok}")
    return 0 if ok else 1
