"""Host cost of a repeated swap launched directly (swapping/in_process/direct.py), piece by
piece (a development aid): where the microseconds go besides the copy.

    python -P scripts/profile_direct.py [--cases 2000x0.015625 64x4] [--repeats 50]

Per case (COUNT tensors of MiB each, float32, on the first device; PyTorch tensors on the
same GPU), medians in microseconds: the whole repeated swap until the device is idle (the same
arrays, and new arrays from a jitted step: only the swap timed), the device copy of the same
bytes (one torch copy_), and the pieces of the swap's host work: describing the destination,
the repeat check (one native pass: the tree walked, every leaf's and tensor's facts compared;
the same arrays, and new arrays it awaits and reads), before_launch (PyTorch's current stream
read), while_launched (the version bump, done while the copies run), the launch, and the wait
for the stream.
"""
import argparse
import sys
from pathlib import Path

import jax_amem
import jax
import jax.numpy as jnp
import torch
from jax_amem.swapping.destinations import describe
from jax_amem.swapping.in_process import direct, repeat, run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from swap_host import median_us, new_arrays_us  # noqa: E402  (benchmarks/swap_host.py: the same timing)


def profile(count: int, mib: float, repeats: int) -> None:
    device = jax.devices()[0]
    gpu = device.platform == "gpu"
    cuda = torch.device("cuda", device.local_hardware_id) if gpu else torch.device("cpu")
    sync = (lambda: torch.cuda.synchronize(cuda)) if gpu else (lambda: None)
    n = max(1, int(mib * 2**18))
    src = {f"t{i:04d}": jax.device_put(jnp.full(n, i, jnp.float32), device) for i in range(count)}
    dst = {k: torch.empty(n, device=cuda) for k in src}
    jax.block_until_ready(src)
    jax_amem.swap(src, dst, progress=False)
    jax_amem.swap(src, dst, progress=False)
    how = run._how(None, None)
    d = describe(dst)
    entry, _, _ = repeat.find(src, d, how)
    launch = entry.program.direct
    streams = launch._streams(d) if launch else {}
    flat_src = torch.empty(count * n, device=cuda)
    flat_dst = torch.empty_like(flat_src)
    swap = lambda tree: jax_amem.swap(tree, dst, progress=False)  # noqa: E731
    rows = [
        ("whole repeated swap", median_us(lambda: swap(src), repeats, sync)),
        ("  with new arrays", new_arrays_us(src, repeats, sync, swap)),
        ("device copy (torch copy_)", median_us(lambda: flat_dst.copy_(flat_src), repeats, sync)),
        ("describe(dst)", median_us(lambda: describe(dst), repeats)),
        ("repeat check (native pass)", median_us(lambda: repeat.find(src, d, how), repeats)),
        ("  with new arrays", new_arrays_us(src, repeats, sync, lambda tree: repeat.find(tree, d, how))),
        ("written (versions)", median_us(entry.table.written, repeats)),
        ("before_launch (streams)", median_us(lambda: launch._streams(d), repeats)),
        ("while_launched (versions)", median_us(d.while_launched, repeats)),
    ]
    repeat.find(src, d, how)  # the addresses of `src` in the pointer arrays again
    if launch:
        def launch_only():
            for copy, addresses, ordinal in zip(launch.copies, entry.pointers, launch.ordinals):
                copy.run(addresses, streams.get(ordinal, 0))
        rows.append(("launch (host)", median_us(launch_only, repeats)))
        sync()
        rows.append(("launch + wait", median_us(lambda: (launch_only(), direct._synchronize(
            [(o, streams.get(o, 0)) for o in launch.ordinals])), repeats)))
    print(f"{count} x {mib:g} MiB on {device.platform} ({device.device_kind}); direct: {bool(launch)}; "
          f"microseconds, medians of {repeats}")
    for name, us in rows:
        print(f"  {name:<28} {us:10.1f}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--cases", nargs="+", default=["2000x0.015625", "64x4"])
    p.add_argument("--repeats", type=int, default=50)
    a = p.parse_args()
    for case in a.cases:
        count, mib = case.lower().split("x")
        profile(int(count), float(mib), a.repeats)
        jax_amem.swapping.forget()


if __name__ == "__main__":
    main()
