"""Where the real-size preset's swap goes (fp32 flax-layout trainer -> bf16 HF Qwen3 rollout,
transposed casts): the swap's report and time, against one jitted program that makes the same
transposed bf16 views (XLA's own bound for the transform) and a torch copy of the written bytes.
A development aid, written when the demo's swap measured 26x its device-copy bound (0.0.4).

    python -P scripts/profile_real_swap.py [--layers 8] [--repeats 10] [--trace DIR]

`--layers 0` takes the preset's own depth (qwen3-1.7b: 28 layers, the demo's swap: 6.88 GB of
fp32 read into 3.44 GB of bf16). Prints the swap's bound measured in the same run (a device copy's
rate over the bytes the swap reads and writes) and the ratio, and the same swap through XLA's
route (the fused transpose-and-cast copy of the direct launch turned off) beside it.
"""
import argparse
import dataclasses
import time

import jax_amem
import jax
import jax.numpy as jnp
import numpy as np
import torch

from jax_amem import reshard
from jax_amem.demo import policy, rollout
from jax_amem.demo.real_size.presets import QWEN3_1_7B, QWEN3_TINY


def timed(fn, repeats, sync):
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--tiny", action="store_true", help="CPU check of the script itself")
    parser.add_argument("--trace", default="")
    args = parser.parse_args()
    base = QWEN3_TINY if args.tiny else QWEN3_1_7B
    config = dataclasses.replace(base.policy, num_layers=args.layers or base.policy.num_layers)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    params = policy.init_params(config, 0)
    model = rollout.build_rollout_model(config, dtype=torch.bfloat16)
    tensors = rollout.rollout_tensors(model)
    rules = reshard.rules.qwen3(params, source="flax", layout="hf", cast="bfloat16",
                                tie_embeddings=config.tie_embeddings)
    sync = (lambda: torch.cuda.synchronize()) if dev == "cuda" else (lambda: None)
    src_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(params))
    dst_bytes = sum(t.numel() * t.element_size() for t in tensors.values())
    t0 = time.perf_counter()
    first = jax_amem.swap(params, tensors, rules=rules, progress=False)
    sync()
    print(f"first swap {time.perf_counter() - t0:.2f} s: {first}")
    swap_s = timed(lambda: jax_amem.swap(params, tensors, rules=rules, progress=False), args.repeats, sync)
    report = jax_amem.swap(params, tensors, rules=rules, progress=False)
    print(f"warm swap: {report}")
    from jax_amem.swapping import forget
    from jax_amem.swapping.in_process import direct, run

    (program,) = run._programs.values()
    fused = bool(program.direct) and sum(c.transpose_rows for c in program.direct.copies)
    print(f"direct launch: {bool(program.direct)}; fused transpose rows: {fused}")
    direct.ENABLED = False  # the same swap through XLA's route, for comparison
    forget()
    jax_amem.swap(params, tensors, rules=rules, progress=False)
    xla_swap_s = timed(lambda: jax_amem.swap(params, tensors, rules=rules, progress=False), args.repeats, sync)
    direct.ENABLED = True
    forget()
    jax_amem.swap(params, tensors, rules=rules, progress=False)

    # XLA's bound for the transform: every 2-D leaf transposed and cast in one program.
    def views(tree):
        out = []
        for x in jax.tree_util.tree_leaves(tree):
            y = jnp.swapaxes(x, -1, -2) if x.ndim >= 2 else x
            out.append(y.astype(jnp.bfloat16))
        return out
    transform = jax.jit(views)
    jax.block_until_ready(transform(params))
    transform_s = timed(lambda: jax.block_until_ready(transform(params)), args.repeats, lambda: None)
    flat = torch.empty(dst_bytes // 2, dtype=torch.bfloat16, device=dev)
    other = torch.empty_like(flat)
    copy_s = timed(lambda: flat.copy_(other), args.repeats, sync)
    print(f"layers {args.layers}: {src_bytes / 1e9:.2f} GB fp32 read, {dst_bytes / 1e9:.2f} GB bf16 "
          f"written, {len(tensors)} tensors")
    print(f"{'figure':<44}{'ms':>10}")
    # The bound: the bytes the swap reads and writes at the device copy's rate (copy_ reads and
    # writes dst_bytes each).
    bound_s = copy_s * (src_bytes + dst_bytes) / (2 * dst_bytes)
    for name, s in (("jax_amem.swap (warm, median)", swap_s),
                    ("jax_amem.swap through XLA's route", xla_swap_s),
                    ("jit: every leaf transposed + cast (XLA)", transform_s),
                    ("torch copy_ of the written bytes", copy_s),
                    ("bound: read + write at the copy's rate", bound_s)):
        print(f"{name:<44}{s * 1e3:>10.2f}")
    print(f"swap / bound = {swap_s / bound_s:.2f}; XLA route / bound = {xla_swap_s / bound_s:.2f}; "
          f"swap / XLA transform = {swap_s / transform_s:.2f}")
    if args.trace:
        jax.profiler.start_trace(args.trace)
        for _ in range(3):
            jax_amem.swap(params, tensors, rules=rules, progress=False)
            sync()
        jax.profiler.stop_trace()
        print(f"trace in {args.trace}")


if __name__ == "__main__":
    main()
