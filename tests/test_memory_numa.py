"""The staging pool's NUMA placement (src/memory/numa.h, jax_amem/memory/staging.py): the node
of a GPU read from sysfs, the nodes online, blocks placed on a node before their first touch,
and the JAX_AMEM_STAGING_NUMA setting. Against a sysfs tree written here, and this host's own
kernel for the placement."""

import numpy as np
import pytest

from jax_amem._native import core
from jax_amem.memory import staging


def sysfs(tmp_path, online="0-1", devices=None):
    node = tmp_path / "devices" / "system" / "node"
    node.mkdir(parents=True)
    (node / "online").write_text(online + "\n")
    for bus_id, numa in (devices or {}).items():
        folder = tmp_path / "bus" / "pci" / "devices" / bus_id
        folder.mkdir(parents=True)
        (folder / "numa_node").write_text(f"{numa}\n")
    return str(tmp_path)


@pytest.mark.parametrize("online, count", [("0", 1), ("0-1", 2), ("0,2-3", 3), ("0-7", 8), ("garbage", 1)])
def test_nodes_online(tmp_path, online, count):
    assert core.memory.numa_node_count(sysfs(tmp_path, online)) == count


def test_nodes_online_where_the_kernel_says_nothing(tmp_path):
    assert core.memory.numa_node_count(str(tmp_path)) == 1


def test_the_node_of_a_gpu_from_its_bus_id_as_the_driver_writes_it(tmp_path):
    root = sysfs(tmp_path, devices={"0000:3b:00.0": 0, "0000:d8:00.0": 1, "0000:01:00.0": -1})
    assert core.memory.numa_node_of_pci_device("00000000:D8:00.0", root) == 1  # the driver's 8-digit domain
    assert core.memory.numa_node_of_pci_device("0000:3B:00.0", root) == 0
    assert core.memory.numa_node_of_pci_device("0000:01:00.0", root) == -1  # single-node machines say -1
    assert core.memory.numa_node_of_pci_device("0000:99:00.0", root) == -1  # no such device


def test_blocks_land_on_the_node_asked_for():
    """This host's node 0 (every Linux host has one): a plain pool's block placed there before
    its first touch reports that node per page, and the pool reports where it places."""
    pool = core.memory.StagingPool(False, "", 0)
    (address,) = pool.place([8 << 20])
    buffer = np.frombuffer((np.ctypeslib.as_array((np.ctypeslib.ctypes.c_uint8 * (8 << 20)).from_address(address))),
                           np.uint8)
    buffer[::4096] = 1  # touch every page
    node = core.memory.node_of_address(address)
    if node == -1:
        pytest.skip("the kernel does not say where pages are (get_mempolicy refused here)")
    assert node == 0
    stats = pool.stats()
    assert stats["numa_node"] == 0 and stats["placement_failures"] == 0
    pool.release_all()
    pool.free()


def test_a_node_that_does_not_exist_is_counted_not_fatal():
    """mbind refuses a node the host lacks: the block is still made (placed by the kernel),
    and the refusal is counted, so a pause never fails over where its copy lands."""
    nodes = core.memory.numa_node_count()
    pool = core.memory.StagingPool(False, "", 1000 + nodes)
    pool.place([4 << 20])
    assert pool.stats()["placement_failures"] == 1
    pool.release_all()
    pool.free()


def test_the_setting(monkeypatch):
    nodes = core.memory.numa_node_count()
    assert staging.staging_numa_node("none", [0]) == -1
    assert staging.staging_numa_node("0", [0]) == 0
    with pytest.raises(ValueError, match=r"JAX_AMEM_STAGING_NUMA='lots' is not understood: give auto, none or a NUMA node number"):
        staging.staging_numa_node("lots", [0])
    with pytest.raises(ValueError, match=r"JAX_AMEM_STAGING_NUMA='\u00b2' is not understood: give auto, none or a NUMA node number"):
        staging.staging_numa_node("\u00b2", [0])   # a digit to str.isdigit, not to int()
    with pytest.raises(ValueError, match=rf"JAX_AMEM_STAGING_NUMA='{nodes}'.* below {nodes}"):
        staging.staging_numa_node(str(nodes), [0])


def test_auto_is_the_gpus_node_when_they_share_one(monkeypatch):
    monkeypatch.setattr(core.memory, "numa_node_count", lambda sysfs="/sys": 2)
    monkeypatch.setattr(core.memory, "pci_bus_id", lambda ordinal: f"0000:0{ordinal}:00.0")
    nodes = {"0000:00:00.0": 1, "0000:01:00.0": 1, "0000:02:00.0": 0}
    monkeypatch.setattr(core.memory, "numa_node_of_pci_device", lambda bus_id, sysfs="/sys": nodes[bus_id])
    assert staging.staging_numa_node("auto", [0, 1]) == 1
    assert staging.staging_numa_node("", [1]) == 1
    assert staging.staging_numa_node("auto", [0, 2]) == -1  # GPUs on both sockets: no one right node
    assert staging.staging_numa_node("auto", []) == -1
    monkeypatch.setattr(core.memory, "numa_node_count", lambda sysfs="/sys": 1)
    assert staging.staging_numa_node("auto", [0, 1]) == -1  # one node: nothing to choose
