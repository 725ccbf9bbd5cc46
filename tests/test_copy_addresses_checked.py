"""segment_copy_to_addresses refuses what cannot be memory of this process before a byte moves
(address 0x1000 or -8 once killed the process with SIGSEGV), with a CopyError (a JaxAmemError)
from one check (copy::CheckDestinations, run once per call where the call is made), and on CUDA
bounds each destination's rows by the device memory that holds its address, asked of the driver
once when the call is traced. Hostile calls run in a subprocess of their own, so a crash fails the test
instead of ending the test run."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from jax_amem import copy as amem_copy
from jax_amem._native import core
from jax_amem.copy import segment_copy_to_addresses

_HOSTILE = r"""
import json, sys
import numpy as np, jax, jax.numpy as jnp
import jax_amem
from jax_amem.copy import segment_copy_to_addresses
buffer = np.zeros(64, np.uint8)
good = buffer.ctypes.data
src = jnp.arange(16, dtype=jnp.float32)
cases = {
    "low address": dict(addresses=[0x1000], sizes=[8]),
    "negative address": dict(addresses=[-8], sizes=[8]),
    "address past 2^56": dict(addresses=[1 << 56], sizes=[8]),
    "address past int64": dict(addresses=[1 << 64], sizes=[8]),
    "float address": dict(addresses=[float(good)], sizes=[8]),
    "float size": dict(addresses=[good], sizes=[8.0]),
    "negative size": dict(addresses=[good], sizes=[-8]),
    "misaligned for float32": dict(addresses=[good + 2], sizes=[8]),
    "misaligned for alignment=16": dict(addresses=[good + 4], sizes=[8], alignment=16),
}
out = {}
for name, case in cases.items():
    try:
        token = segment_copy_to_addresses([src], case["addresses"], case["sizes"], [(0, 0, 0, 0, 8)],
                                          alignment=case.get("alignment"))
        jax.block_until_ready(token)
        out[name] = "ran"
    except ValueError as error:
        family = isinstance(error, jax_amem.JaxAmemError)
        out[name] = f"refused {type(error).__name__}{' (family)' if family else ''}: {error}"
print("RESULT " + json.dumps(out), flush=True)
"""


def _run(script: str, **env) -> dict:
    done = subprocess.run([sys.executable, "-P", "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **env})
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the process died (exit {done.returncode}): {done.stdout[-2000:]} {done.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


def test_hostile_addresses_and_sizes_are_refused_not_run():
    results = _run(_HOSTILE, JAX_PLATFORMS="cpu")
    expected = {
        "low address": "address 0x1000 cannot be memory of this process",
        "negative address": "address -0x8 cannot be memory of this process",
        "address past 2^56": "cannot be memory of this process",
        "address past int64": "cannot be memory of this process",
        "float address": "addresses[0] is ",
        "float size": "destination_bytes[0] is 8.0: give integers",
        "negative size": "destination 0 has a negative size (-8 bytes)",
        "misaligned for float32": "is not a multiple of 4",
        "misaligned for alignment=16": "is not a multiple of 16",
    }
    for name, words in expected.items():
        assert results[name].startswith("refused CopyError (family): ") and words in results[name], (name, results[name])


def test_the_destinations_are_checked_once_per_call_by_the_one_check(monkeypatch):
    """The C++ check runs once per call, where the call is made (eager: once; in jit: once per
    trace, not per run); nothing in Python repeats its range test."""
    checked = []
    one_check = core.copy.check_destinations
    monkeypatch.setattr(core.copy, "check_destinations", lambda a, s: checked.append((a.tolist(), s.tolist())) or one_check(a, s))
    target = np.zeros(8, np.uint8)
    src = jnp.arange(8, dtype=jnp.uint8)
    jax.block_until_ready(segment_copy_to_addresses([src], [target.ctypes.data], [8], [(0, 0, 0, 0, 8)]))
    assert checked == [([target.ctypes.data], [8])] and target.tolist() == list(range(8))
    run = jax.jit(lambda s: segment_copy_to_addresses([s], [target.ctypes.data], [8], [(0, 0, 0, 0, 8)]))
    for _ in range(3):
        jax.block_until_ready(run(src))
    assert len(checked) == 2
    # The check is the C++ one alone: with it taken away, nothing in Python refuses an address
    # no process can have.
    monkeypatch.setattr(core.copy, "check_destinations", lambda a, s: None)
    assert amem_copy.address_rows([src], [0x1000], [8], [(0, 0, 0, 0, 8)])[0] == [0x1000]


def test_the_one_check_names_the_destination_its_address_and_the_fix():
    with pytest.raises(ValueError, match=r"^destination 1: address 0xfff cannot be memory of this process \(user "
                                         r"memory lies in \[0x10000, 0x100000000000000\)\); give a tensor's "
                                         r"data_ptr\(\) or an address an IPC handle was opened at$"):
        core.copy.check_destinations(np.array([1 << 20, 0xFFF], np.int64), np.array([8, 1], np.int64))
    with pytest.raises(ValueError, match=r"^destination 0 has a negative size \(-1 bytes\)$"):
        core.copy.check_destinations(np.array([1 << 20], np.int64), np.array([-1], np.int64))
    with pytest.raises(ValueError, match=r"address -0x8000000000000000 cannot be memory"):
        core.copy.check_destinations(np.array([-(1 << 63)], np.int64), np.array([1], np.int64))
    core.copy.check_destinations(np.array([0, 1 << 20, (1 << 56) - 1], np.int64), np.array([0, 8, 1], np.int64))


def test_an_empty_destination_may_have_no_address():
    src = jnp.arange(4, dtype=jnp.uint8)
    target = np.zeros(4, np.uint8)
    token = segment_copy_to_addresses([src], [0, target.ctypes.data], [0, 4], [(0, 1, 0, 0, 4)])
    jax.block_until_ready(token)
    assert target.tolist() == [0, 1, 2, 3]


def test_alignment_defaults_to_the_item_size_of_the_sources_written_into_each_destination():
    """A uint8 source may write an odd address; a float32 one written elsewhere does not widen it."""
    narrow, wide = jnp.arange(4, dtype=jnp.uint8), jnp.ones(2, jnp.float32)
    buffer = np.zeros(32, np.uint8)
    odd, aligned = buffer.ctypes.data + 1, buffer.ctypes.data + 16
    assert aligned % 4 == 0
    rows = [(0, 0, 0, 0, 4), (1, 1, 0, 0, 8)]
    jax.block_until_ready(segment_copy_to_addresses([narrow, wide], [odd, aligned], [4, 8], rows))
    assert buffer[1:5].tolist() == [0, 1, 2, 3]
    assert buffer[16:24].view(np.float32).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="alignment must be a positive integer"):
        segment_copy_to_addresses([narrow], [odd], [4], [(0, 0, 0, 0, 4)], alignment=0)


def test_on_the_cpu_the_driver_is_never_asked(monkeypatch):
    """Extents are a CUDA question: a CPU call must not load the driver or touch a context."""
    def no_driver(*args):
        raise AssertionError("extent_at called for a CPU copy")
    monkeypatch.setattr(core.cuda, "extent_at", no_driver)
    target = np.zeros(8, np.uint8)
    run = jax.jit(lambda s: segment_copy_to_addresses([s], [target.ctypes.data], [8], [(0, 0, 0, 0, 8)]))
    jax.block_until_ready(run(jnp.arange(8, dtype=jnp.uint8)))
    assert target.tolist() == list(range(8))


def test_on_cuda_rows_are_bounded_by_the_extent_the_driver_gives_once_per_trace(monkeypatch):
    """The bound's logic, with the driver's answer given (the GPU tests below ask a real one)."""
    asked = []

    def extent_at(address, limit):
        asked.append((address, limit))
        return 24  # the allocation ends 24 bytes after the address
    monkeypatch.setattr(core.cuda, "extent_at", extent_at)
    monkeypatch.setattr(amem_copy, "_platform", lambda srcs: "gpu")
    src = jnp.arange(64, dtype=jnp.uint8)
    base = 1 << 20
    # Rows end at 24 bytes: fits; the declared size (64) is larger but no row writes past 24.
    jax.jit(lambda s: segment_copy_to_addresses([s], [base], [64], [(0, 0, 0, 0, 16), (0, 0, 16, 16, 8)])).lower(src)
    assert asked == [(base, 24)]
    with pytest.raises(ValueError, match=r"destination 0: rows write 32 bytes from address 0x100000, but its "
                                         r"allocation ends 24 bytes after that address"):
        jax.jit(lambda s: segment_copy_to_addresses([s], [base], [64], [(0, 0, 0, 0, 32)])).lower(src)

    def unknown(address, limit):
        raise RuntimeError("address 0x100000 is not device memory the CUDA driver knows")
    monkeypatch.setattr(core.cuda, "extent_at", unknown)
    with pytest.raises(ValueError, match="destination 0 .*not device memory the CUDA driver knows"):
        segment_copy_to_addresses([src], [base], [8], [(0, 0, 0, 0, 8)])


# -- on the GPU: the driver's own answers -------------------------------------------------------

_CUDA_BOUNDS = r"""
import json, os
import numpy as np, jax, jax.numpy as jnp, torch
from jax_amem._native import core
from jax_amem.copy import segment_copy_to_addresses
gpu = jax.devices("gpu")[0]
torch.cuda.set_device(gpu.local_hardware_id)
out = {"conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")}

def copy(address, size, rows, srcs):
    try:
        jax.block_until_ready(segment_copy_to_addresses(srcs, [address], [size], rows))
        torch.cuda.synchronize()
        return "ran"
    except ValueError as error:
        return "refused: " + str(error)

# A tensor of 48 MiB: with expandable segments its memory is several mapped pieces of one
# reservation; without, one cudaMalloc block.
n = 48 << 20
tensor = torch.zeros(n, dtype=torch.uint8, device="cuda")
extent = core.cuda.extent_at(tensor.data_ptr())
out["extent_from_start"] = extent
out["extent_covers_tensor"] = extent >= n
src = jax.device_put(jnp.arange(n, dtype=jnp.uint8), gpu)
out["whole_tensor"] = copy(tensor.data_ptr(), n, [(0, 0, 0, 0, n)], [src])
out["whole_tensor_bytes_ok"] = bool(torch.equal(tensor[:4096].cpu(), torch.arange(4096, dtype=torch.int64).to(torch.uint8)) and int(tensor[n - 1]) == (n - 1) % 256)
# A row one byte past the end of the memory the driver maps there.
out["past_the_end"] = copy(tensor.data_ptr(), extent + 1, [(0, 0, 0, 0, 16), (0, 0, 16, extent - 15, 16)],
                           [jax.device_put(jnp.arange(extent + 1, dtype=jnp.uint8), gpu)]) if extent < (1 << 31) else "extent too large to test"
# Host memory with CUDA sources: not device memory the driver knows.
host = np.zeros(64, np.uint8)
out["host_address"] = copy(host.ctypes.data, 64, [(0, 0, 0, 0, 64)], [jax.device_put(jnp.zeros(64, jnp.uint8), gpu)])
try:
    import cupy
    raw = cupy.cuda.runtime.malloc(1 << 20)  # one cudaMalloc of exactly 1 MiB
    out["cudamalloc_extent"] = core.cuda.extent_at(raw)
    out["cudamalloc_extent_mid"] = core.cuda.extent_at(raw + 4096)
    small = jax.device_put(jnp.arange(4096, dtype=jnp.uint8), gpu)
    out["cudamalloc_inside"] = copy(raw + (1 << 20) - 4096, 4096, [(0, 0, 0, 0, 4096)], [small])
    out["cudamalloc_past_end"] = copy(raw + (1 << 20) - 2048, 4096, [(0, 0, 0, 0, 4096)], [small]) \
        if out["cudamalloc_extent"] == (1 << 20) else "extent not exact: %d" % out["cudamalloc_extent"]
    cupy.cuda.runtime.free(raw)
except ImportError:
    out["cupy"] = "missing"
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.gpu
@pytest.mark.parametrize("conf", ["", "expandable_segments:True"])
def test_gpu_rows_past_the_allocation_are_refused_and_rows_inside_run(conf):
    pytest.importorskip("torch")
    env = {"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
    if conf:
        env["PYTORCH_CUDA_ALLOC_CONF"] = conf
    out = _run(_CUDA_BOUNDS, **env)
    print(json.dumps(out, indent=1))
    assert out["extent_covers_tensor"], out
    assert out["whole_tensor"] == "ran" and out["whole_tensor_bytes_ok"], out
    assert out["past_the_end"].startswith("refused: ") and "allocation ends" in out["past_the_end"], out
    assert out["host_address"].startswith("refused: ") and "not device memory" in out["host_address"], out
    if "cupy" not in out:
        assert out["cudamalloc_extent"] == 1 << 20 and out["cudamalloc_extent_mid"] == (1 << 20) - 4096, out
        assert out["cudamalloc_inside"] == "ran", out
        assert out["cudamalloc_past_end"].startswith("refused: "), out


_NO_CONTEXT = r"""
import json, os, shutil, subprocess
from jax_amem._native import core
import jax
jax.numpy.zeros(4).block_until_ready()  # JAX on its CPU platform: no CUDA context anywhere
out = {}
try:
    core.cuda.extent_at(1 << 40)
    out["answer"] = "answered"
except RuntimeError as error:
    out["answer"] = str(error)
if shutil.which("nvidia-smi"):
    apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.split()
    out["has_context"] = str(os.getpid()) in apps
print("RESULT " + json.dumps(out), flush=True)
"""


@pytest.mark.gpu
def test_gpu_host_with_jax_on_cpu_asking_an_extent_creates_no_context():
    """With JAX on its CPU platform on a GPU host, extent_at refuses (no memory of this process
    can be device memory) without creating a context on device 0 to ask in."""
    out = _run(_NO_CONTEXT, JAX_PLATFORMS="cpu")
    print(out)
    assert out["answer"] != "answered" and "0x10000000000" in out["answer"], out
    assert not out.get("has_context", False), out
