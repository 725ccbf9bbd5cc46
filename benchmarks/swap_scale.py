"""The cost of a constant scale fused into the swap's copy (JAX arrays -> PyTorch tensors, in
place), against the same swap without it and the device copy of the same bytes, all measured
in the same run.

    python -P benchmarks/swap_scale.py [--count 4] [--mib 512] [--repeats 20]

Pairs (each: the swap without the constant, then with it; same sources, same destinations; both
launched directly, outside XLA: swapping/in_process/direct.py):
  f32 -> f32          plain copy (bulk rows: one driver copy each) vs `x * 0.125` (the affine kernel's rows)
  bf16 -> bf16        the same in bfloat16 (the kernel computes in float32, rounds once)
  f32 -> bf16         a cast (the fused transpose-and-cast copy) vs `(x * 0.125).astype(bf16)`
                      (the affine kernel reads float32 and writes bfloat16: no temporary)
  f32 -> bf16 T,      the same read transposed (sources (n, 4096) into (4096, n) tensors): the
  bf16 -> bf16 T      fused transpose copy, plain vs running the scale (MaxText's scaled query
                      kernel); its "kernel" columns are left empty (the affine kernel alone does
                      not transpose)
Goal (H200, 4 x 512 MiB): the scaled swap within 5% of the plain one (ratio <= 1.05).
Each scaled swap's first and last 2^20 elements are checked bit for bit against the numpy reference,
and both swaps of a pair are checked to have been launched directly ("route").

"scaled via XLA": the same scaled swap with its affine rows in XLA's custom call
(`affine_copy_to_addresses` in a jitted call: the route such swaps took before the direct launch
ran them, `direct_affine.ENABLED = False`), same run.

"kernel": the affine kernel alone, as near as a timer outside the GPU gets: the same rows
(`affine_copy_to_addresses`, one jitted call) issued 10 times back to back and waited for once,
per call, so the host's share of a swap (checks, dispatch, waiting) hides behind the GPU's.
"kernel of copy": its memory traffic (source bytes read + destination bytes written) per second
against the device copy's (bytes read + written), so 100% is the affine kernel at copy rate.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import ml_dtypes
import numpy as np

import jax_amem  # noqa: F401  (before JAX starts)
import jax

from jax_amem.affine_copy import Program, affine_copy_to_addresses, encode
from jax_amem.reshard import Rule
from jax_amem.reshard.affine import Affine, Step
from jax_amem.swapping.in_process import direct, direct_affine, run

sys.path.insert(0, str(Path(__file__).resolve().parent))
from swap import median_seconds  # noqa: E402  (benchmarks/swap.py: the same timing)

GOAL = 1.05
SCALE = 0.125
BACK_TO_BACK = 10


def kernel_seconds(src, dst, step, src_dtype, dst_dtype, repeats, sync):
    """Seconds per call of the affine rows alone (see the module's docstring)."""
    arrays, tensors = list(src.values()), list(dst.values())
    elements = int(tensors[0].numel())
    table = encode([Program(Affine((step,)), np.dtype(src_dtype).name, np.dtype(dst_dtype).name, (elements,), (0,),
                            (0,))])
    rows = np.array([[i, i, 0, 0, elements, 0] for i in range(len(arrays))], np.int64)
    addresses = [t.data_ptr() for t in tensors]
    sizes = [t.numel() * t.element_size() for t in tensors]
    call = jax.jit(lambda *s: affine_copy_to_addresses(list(s), addresses, sizes, rows, table,
                                                       [dst_dtype] * len(arrays)))

    def back_to_back():
        jax.block_until_ready([call(*arrays) for _ in range(BACK_TO_BACK)])

    return median_seconds(back_to_back, max(3, repeats // 4), sync) / BACK_TO_BACK


def launched_directly(scaled: bool) -> bool:
    """Whether the swap's program (the one with constant steps, or the one without) was launched
    outside XLA."""
    programs = [p for p in run._programs.values() if any(a is not None for a in p.plan.affines) == scaled]
    return bool(programs) and all(isinstance(p.direct, direct.DirectProgram) for p in programs)


def scaled_via_xla_seconds(src, dst, scaled, repeats, sync):
    """The scaled swap with its affine rows in XLA's custom call (the module's docstring)."""
    jax_amem.swapping.forget()
    direct_affine.ENABLED = False
    try:
        jax_amem.swap(src, dst, rules=scaled, progress=False)
        assert not launched_directly(True)
        return median_seconds(lambda: jax_amem.swap(src, dst, rules=scaled, progress=False), repeats, sync)
    finally:
        direct_affine.ENABLED = True
        jax_amem.swapping.forget()


WIDTH = 4096  # columns of a transposed pair's sources


def run_pair(name, src_dtype, dst_dtype, count, elements, device, torch_device, repeats, sync, transposed=False):
    import torch

    keys = jax.random.split(jax.random.key(0), count)
    shape = (elements // WIDTH, WIDTH) if transposed else (elements,)
    src = {f"t{i}": jax.device_put(jax.random.normal(k, shape, np.float32).astype(src_dtype), device)
           for i, k in enumerate(keys)}
    jax.block_until_ready(src)
    torch_dtype = getattr(torch, np.dtype(dst_dtype).name)
    dst = {k: torch.empty(shape[::-1], dtype=torch_dtype, device=torch_device) for k in src}
    cast = None if np.dtype(src_dtype) == np.dtype(dst_dtype) else np.dtype(dst_dtype).name
    perm = (1, 0) if transposed else None
    plain = [Rule.copy(k, cast=cast, transpose=perm) for k in src]
    scaled = [Rule.copy(k, cast=cast, transpose=perm, scale=SCALE) for k in src]
    jax_amem.swap(src, dst, rules=scaled, progress=False)
    sync()
    step = Step("mul", np.dtype(src_dtype).name, (SCALE,))
    head = 1 << 20  # checked against the numpy reference: the first MiB-worth of elements, and the last
    source, written = np.asarray(src["t0"]).T.reshape(-1), dst["t0"].reshape(-1)  # in the destination's order
    for part in (slice(0, head), slice(elements - head, elements)):
        want = Affine((step,)).apply_numpy(source[part], dst_dtype)
        got = written[part].cpu().view(torch.uint8).numpy()
        assert np.array_equal(got, want.view(np.uint8)), f"{name}: the scaled swap is not bit-exact"
    plain_s = median_seconds(lambda: jax_amem.swap(src, dst, rules=plain, progress=False), repeats, sync)
    scaled_s = median_seconds(lambda: jax_amem.swap(src, dst, rules=scaled, progress=False), repeats, sync)
    route = "direct" if launched_directly(True) and launched_directly(False) else "XLA"
    via_xla_s = scaled_via_xla_seconds(src, dst, scaled, repeats, sync)
    nbytes = count * elements * np.dtype(dst_dtype).itemsize
    flat = torch.empty(nbytes // 4, dtype=torch.float32, device=torch_device)
    flat_dst = torch.empty_like(flat)
    copy_s = median_seconds(lambda: flat_dst.copy_(flat), repeats, sync)
    del flat, flat_dst
    kernel_s = None if transposed else kernel_seconds(src, dst, step, src_dtype, dst_dtype, repeats, sync)
    src_bytes = count * elements * np.dtype(src_dtype).itemsize
    del src, dst
    jax_amem.swapping.forget()
    return dict(name=name, bytes=nbytes, plain_s=plain_s, scaled_s=scaled_s, copy_s=copy_s, kernel_s=kernel_s,
                route=route, via_xla_s=via_xla_s,
                kernel_of_copy=None if transposed else ((src_bytes + nbytes) / kernel_s) / (2 * nbytes / copy_s))


def main(argv=None):
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--mib", type=float, default=None, help="MiB per source tensor (GPU 512, CPU 8)")
    parser.add_argument("--repeats", type=int, default=None, help="timed runs per figure (GPU 20, CPU 3)")
    args = parser.parse_args(argv)
    device = jax.devices()[0]
    gpu = device.platform == "gpu"
    torch_device = torch.device("cuda", device.local_hardware_id) if gpu else torch.device("cpu")
    sync = (lambda: torch.cuda.synchronize(torch_device)) if gpu else (lambda: None)
    mib = args.mib if args.mib is not None else (512 if gpu else 8)
    repeats = args.repeats if args.repeats is not None else (20 if gpu else 3)
    elements = int(mib * 2**20) // 4
    rows = [run_pair(name, s, d, args.count, elements, device, torch_device, repeats, sync, transposed)
            for name, s, d, transposed in (("f32 -> f32", np.float32, np.float32, False),
                                           ("bf16 -> bf16", ml_dtypes.bfloat16, ml_dtypes.bfloat16, False),
                                           ("f32 -> bf16", np.float32, ml_dtypes.bfloat16, False),
                                           ("f32 -> bf16 T", np.float32, ml_dtypes.bfloat16, True),
                                           ("bf16 -> bf16 T", ml_dtypes.bfloat16, ml_dtypes.bfloat16, True))]
    print(f"swap with a fused constant scale on {device.platform} ({device.device_kind}), "
          f"{args.count} x {mib:g} MiB sources, medians of {repeats} (ms)")
    print(f"{'pair':>14} {'dst MiB':>8} {'route':>7} {'plain':>9} {'scaled':>9} {'scaled/plain':>13} "
          f"{'scaled via XLA':>15} {'dev copy':>9} {'scaled of copy':>15} {'kernel':>8} {'kernel of copy':>15}  "
          f"goal <= {GOAL} -> met?")
    for r in rows:
        ratio = r["scaled_s"] / r["plain_s"]
        met = ("yes" if ratio <= GOAL else "NO") if gpu else "n/a (CPU)"
        print(f"{r['name']:>14} {r['bytes'] / 2**20:>8.0f} {r['route']:>7} {r['plain_s'] * 1e3:>9.3f} "
              f"{r['scaled_s'] * 1e3:>9.3f} {ratio:>13.3f} {r['via_xla_s'] * 1e3:>15.3f} {r['copy_s'] * 1e3:>9.3f} "
              f"{r['copy_s'] / r['scaled_s']:>15.0%} {_or_dash(r['kernel_s'], 1e3, '8.3f')} "
              f"{_or_dash(r['kernel_of_copy'], 1, '15.0%')}  {met}")
    return rows


def _or_dash(value, scale, spec):
    width = int(spec.split(".")[0])
    return "-".rjust(width) if value is None else format(value * scale, spec)


if __name__ == "__main__":
    main()
