"""A GPU host with JAX on its CPU platform (JAX_PLATFORMS=cpu, as in a notebook or a test): pause,
paused(), resume() and memory_report() while paused work, and pinned memory outlives the driver
call that made it (these were once killed by SIGSEGV on the H200).

Each case runs in a child process, so a crash is a failing test, not a dead test run. On a machine
without a GPU the first case checks the same calls (they always worked there); the pinned-pool
case needs a GPU.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from jax_amem._native import core

PAUSE_ON_CPU = textwrap.dedent("""
    import json
    import numpy as np
    import jax_amem, jax, jax.numpy as jnp
    from jax_amem.memory import staging

    x = jnp.arange(1 << 20, dtype=jnp.float32)
    info = jax_amem.pause(keep={"x": x}, drop={"y": jnp.ones(1000)})
    report = str(jax_amem.memory_report())
    restored = jax_amem.resume()
    with jax_amem.paused(keep=restored.keep) as p:
        during = jax_amem.memory_report().to_dict()["host_kept_bytes"]
    back = np.asarray(p.keep["x"])
    print(json.dumps({
        "platform": jax.devices()[0].platform,
        "same": bool(np.array_equal(back, np.arange(1 << 20, dtype=np.float32))),
        "zeros": int(np.asarray(restored.drop["y"]).sum()),
        "kept_host_while_paused": during,
        "pinned": staging.pool_stats().pinned,
        "collections": info.collections,
        "report_says_paused": "paused=True" in report,
    }))
""")

PINNED_POOL_WITHOUT_JAX_ON_GPU = textwrap.dedent("""
    import json, sys
    import numpy as np
    import jax_amem, jax
    from jax_amem._native import core

    jax.devices()  # JAX runs on CPU: nothing in JAX retains a CUDA context
    pool = core.memory.StagingPool(True, sys.argv[1])
    src = np.random.default_rng(0).integers(0, 256, 3 << 20, dtype=np.uint8)
    dst = np.zeros_like(src)
    (address,) = pool.place([src.nbytes])  # the driver call's own context retain ends here
    row = lambda a: np.array([[-1, a.ctypes.data, address, a.nbytes]], np.int64)
    core.memory.copy_to_host(row(src))   # a write into the pinned block
    core.memory.copy_to_device(row(dst))
    stats = pool.stats()
    pool.release_all()
    pool.free()
    print(json.dumps({"same": bool(np.array_equal(src, dst)), "method": stats["method"],
                      "pinned": stats["pinned"]}))
""")


def run_child(script, *args):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    env.pop("XLA_FLAGS", None)
    done = subprocess.run([sys.executable, "-P", "-c", script, *args], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, (f"child exited with {done.returncode} (-11 is SIGSEGV):\n"
                                  f"{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_pause_resume_and_the_report_work_with_jax_on_its_cpu_platform():
    result = run_child(PAUSE_ON_CPU)
    assert result == {"platform": "cpu", "same": True, "zeros": 0,
                      "kept_host_while_paused": 4 << 20, "pinned": False, "collections": 0,
                      "report_says_paused": True}


@pytest.mark.parametrize("method", ["registered", "hostalloc"])
def test_a_pinned_pool_stays_valid_when_nothing_else_retains_the_context(method):
    if not (core.cuda.driver_status()[0] and core.cuda.device_count() > 0):
        pytest.skip("needs a CUDA driver and a GPU")
    result = run_child(PINNED_POOL_WITHOUT_JAX_ON_GPU, method)
    assert result == {"same": True, "method": method, "pinned": True}
