"""The staging pool's NUMA placement: a pause's and a resume's copy (one pinned driver copy
each way, jax_amem.memory.bandwidth) through a pool placed on the GPU's own NUMA node against
one placed on each other node, in one run.

    python -P benchmarks/staging_numa.py [--gib 4] [--repeats 3]

Prints per node: GB/s device -> host and host -> device, and the ratio to the GPU's own node.
On a host with one NUMA node there is nothing to compare: it says so and measures that node.
"""

from __future__ import annotations

import argparse

import jax

import jax_amem  # noqa: F401  (the interposer and allocator first)
from jax_amem._native import core
from jax_amem.memory.bandwidth import pinned_copy_bandwidth


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    device = jax.devices()[0]
    if device.platform != "gpu":
        raise SystemExit("staging_numa: needs a GPU (pinned copies between it and host memory)")
    bus_id = core.memory.pci_bus_id(device.local_hardware_id)
    own = core.memory.numa_node_of_pci_device(bus_id)
    nodes = core.memory.numa_node_count()
    print(f"GPU {device.local_hardware_id} ({bus_id}) on NUMA node {own}; {nodes} node(s) online")
    if nodes < 2 or own < 0:
        print("one NUMA node (or the kernel does not name the GPU's): nothing to compare; the host's own node below")
    candidates = [max(own, 0)] + [n for n in range(nodes) if n != max(own, 0)]
    nbytes = int(args.gib * 2**30)
    rows = []
    for node in candidates:
        pool = core.memory.StagingPool(True, "", node)
        try:
            down, up = pinned_copy_bandwidth(pool, nbytes, args.repeats, device)
            failures = pool.stats()["placement_failures"]
        finally:
            pool.free()
        rows.append((node, down, up, failures))
    base_down, base_up = rows[0][1], rows[0][2]
    print(f"{'node':>6} {'D2H GB/s':>10} {'H2D GB/s':>10} {'D2H / own':>10} {'H2D / own':>10} {'refused':>8}")
    for node, down, up, failures in rows:
        label = f"{node}{' (own)' if node == rows[0][0] else ''}"
        print(f"{label:>6} {down:10.1f} {up:10.1f} {down / base_down:10.2f} {up / base_up:10.2f} {failures:8d}")


if __name__ == "__main__":
    main()
