"""What each fact a repeat swap reads costs, per array and per tensor (a development aid): the
calls the native check (src/bindings/repeat_check.cc) makes for every leaf and every tensor,
each timed alone from Python over COUNT objects on the first device, in nanoseconds per object.

    python -P scripts/profile_array_facts.py [--count 2000] [--repeats 50]

Arrays: the outputs of a jitted step (as a training loop makes them), awaited first; whether
two calls' outputs share their aval and sharding objects (the check compares those by identity
first); `aval`, `sharding`, `is_deleted()`, `unsafe_buffer_pointer()`, the batched wait, and a
weak reference made; each on the same arrays again and again ("warm"), and on arrays the step
has just made ("fresh": the first touch of each object, as a repeat swap with new arrays makes
it), and "all": every one of them per fresh array, as the check does. Tensors (PyTorch, on the same device): the layout through the DLPack C
exchange table (`core.copy.DLPackLayout`, one C call; called here from Python, so it includes
the tuple it returns), `untyped_storage().nbytes()`, `data_ptr()`, `_version`, and
`torch._C._increment_version` over the list (before_writing). "loop" is the empty loop's cost,
included in each figure.
"""
import argparse
import statistics
import time
import weakref

import jax_amem  # noqa: F401  (before JAX starts)
import jax
import jax.numpy as jnp
import torch

from jax_amem import _jax_compat
from jax_amem.swapping import destinations


def per_object_ns(fn, count: int, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best / count * 1e9


def fresh_ns(step, tree, fn, count: int, repeats: int) -> tuple[float, list]:
    """Median of fn(arrays) over arrays the jitted step has just made (awaited before the clock)."""
    times = []
    for _ in range(repeats):
        tree = jax.block_until_ready(step(tree))
        start = time.perf_counter()
        fn(tree)
        times.append(time.perf_counter() - start)
    return statistics.median(times) / count * 1e9, tree


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    n, r = args.count, args.repeats
    device = jax.devices()[0]
    tree = [jax.device_put(jnp.full(4, i, jnp.float32), device) for i in range(n)]
    step = jax.jit(lambda t: [x + 1 for x in t])
    a = jax.block_until_ready(step(tree))
    b = jax.block_until_ready(step(a))
    wait = _jax_compat.batched_wait()
    sharding = _jax_compat.sharding_attribute(a)
    def every_fact(arrays):  # what the check reads of each new array, in its order
        for x in arrays:
            x.aval, getattr(x, sharding), x.is_deleted()
        wait(arrays)
        return [(x.unsafe_buffer_pointer(), weakref.ref(x)) for x in arrays]

    rows = [
        ("loop", lambda arrays: [None for _ in arrays]),
        ("aval", lambda arrays: [x.aval for x in arrays]),
        (sharding, lambda arrays: [getattr(x, sharding) for x in arrays]),
        ("is_deleted()", lambda arrays: [x.is_deleted() for x in arrays]),
        ("unsafe_buffer_pointer()", lambda arrays: [x.unsafe_buffer_pointer() for x in arrays]),
        ("batched wait (ready arrays)", wait),
        ("weakref.ref", lambda arrays: [weakref.ref(x) for x in arrays]),
        ("all (as the check)", every_fact),
    ]
    print(f"per-object cost of a repeat swap's facts on {device.platform} ({device.device_kind}), "
          f"{n} objects, best of {r} (warm) and median of {r} (fresh), ns per object")
    print(f"jitted step outputs sharing aval with the last call's: {sum(x.aval is y.aval for x, y in zip(a, b))}/{n}, "
          f"{sharding}: {sum(getattr(x, sharding) is getattr(y, sharding) for x, y in zip(a, b))}/{n}")
    print(f"  {'':<41}{'warm':>10}{'fresh':>10}")
    for label, fn in rows:
        fresh, a = fresh_ns(step, a, fn, n, r)
        print(f"  array  {label:<34}{per_object_ns(lambda: fn(a), n, r):>10.1f}{fresh:>10.1f}")
    gpu = device.platform == "gpu"
    torch_device = torch.device("cuda", device.local_hardware_id) if gpu else torch.device("cpu")
    tensors = [torch.empty(4, device=torch_device) for _ in range(n)]
    layout = destinations.torch_layout_reader()
    rows = [
        ("loop", lambda: [None for _ in tensors]),
        ("untyped_storage().nbytes()", lambda: [t.untyped_storage().nbytes() for t in tensors]),
        ("data_ptr()", lambda: [t.data_ptr() for t in tensors]),
        ("_version", lambda: [t._version for t in tensors]),
        ("_increment_version(list)", lambda: torch._C._increment_version(tensors)),
    ]
    if layout is not None:
        rows.insert(1, ("DLPack layout (with its tuple)", lambda: [layout(t) for t in tensors]))
    for label, fn in rows:
        print(f"  tensor {label:<34}{per_object_ns(fn, n, r):>10.1f}")


if __name__ == "__main__":
    main()
