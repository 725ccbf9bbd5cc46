"""The copy kernel with constant steps (jax_amem.affine_copy, src/copy/affine.h): its
conversions and operations against numpy, and the swap through it on every route (JAX arrays
by donation (batched); PyTorch tensors by address), inside jit, bit-exact
against the exporter's eager output; no temporary for a scaled plain view."""

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_amem
from jax_amem import affine_copy as A
from jax_amem.reshard import rules
from jax_amem.reshard.affine import Affine, Step
from jax_amem.swapping import forget
from jax_amem.swapping.in_process import schedule

torch = pytest.importorskip("torch")

BF16 = ml_dtypes.bfloat16
DEVICES = jax.devices("cpu")[:8]
TRAINER = Mesh(np.array(DEVICES[:4]), ("x",))
ROLLOUT = Mesh(np.array(DEVICES[4:6]), ("y",))


def random_floats(n, seed):
    """float32 bit patterns of every kind: normal values over the whole range, subnormals, zeros,
    infinities, values next to the bfloat16 / float16 rounding ties and overflow thresholds."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2 ** 32, n, dtype=np.uint64).astype(np.uint32)
    ties = (rng.integers(0, 2 ** 16, n // 4, dtype=np.uint64).astype(np.uint32) << 16) | 0x8000
    near = np.array([0x477fe000, 0x477fefff, 0x477ff000, 0x477ff001, 0x33000000, 0x33000001, 0x38800000,
                     0x387fffff, 0x7f7fffff, 0x00000001, 0x80000000, 0x7f800000], np.uint32)
    half_ties = (rng.integers(0x33000000, 0x38800000, n // 4, dtype=np.uint64).astype(np.uint32) & ~np.uint32(0xff))
    values = np.concatenate([bits, ties, near, half_ties]).view(np.float32)
    return values[~np.isnan(values) & ~_subnormal(values)]


def _subnormal(values):
    """float32 subnormals (bfloat16's too): XLA:CPU runs custom calls, as its own arithmetic,
    with subnormals flushed to zero, so on the CPU they compare against JAX, not numpy."""
    magnitude = np.abs(values.astype(np.float32))
    return (magnitude > 0) & (magnitude < np.finfo(np.float32).tiny)


def one_step_table(src, dst, step):
    return A.encode([A.Program(Affine((step,)), np.dtype(src).name, np.dtype(dst).name, (0,), (0,), (0,))])


@pytest.mark.parametrize("dst", [np.float32, BF16, np.float16, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("src", [np.float32, BF16, np.float16], ids=lambda d: np.dtype(d).name)
def test_the_cpu_kernel_converts_and_rounds_as_numpy_bit_for_bit(src, dst):
    with jax.enable_x64(np.dtype(dst) == np.float64):   # a float64 destination needs JAX's x64
        _converts_and_rounds(src, dst)


def _converts_and_rounds(src, dst):
    with np.errstate(over="ignore"):
        x = random_floats(1 << 16, 0).astype(src)
    for step in (Step("mul", np.dtype(src).name, (float(np.asarray(1.5, src)),)),
                 Step("add", "float32", (0.1,)), Step("rsub", np.dtype(src).name, (1.0,))):
        table = one_step_table(src, dst, step)
        rows = np.array([[0, 0, 0, 0, x.size, 0]])
        out = jax.jit(lambda s, d: A.affine_copy_many([s], [d], rows, table)[0])(
            jnp.asarray(x), jnp.zeros(x.size, dst))
        want = Affine((step,)).apply_numpy(x, dst)
        got = np.asarray(out)
        same = (got.view(np.uint8).reshape(x.size, -1) == want.view(np.uint8).reshape(x.size, -1)).all(axis=1)
        both_nan = np.isnan(got.astype(np.float64)) & np.isnan(want.astype(np.float64))
        assert (same | both_nan).all(), (step, x[~(same | both_nan)][:4], got[~(same | both_nan)][:4])


def test_on_the_cpu_subnormals_flush_as_xla_flushes_them():
    x = np.array([1e-39, -3e-40, 1e-45, 2e-38], np.float32)
    table = one_step_table(np.float32, np.float32, Step("mul", "float32", (1.5,)))
    out = A.affine_copy_many([jnp.asarray(x)], [jnp.zeros(4, np.float32)], [[0, 0, 0, 0, 4, 0]], table)[0]
    assert np.array_equal(np.asarray(out), np.asarray(jnp.asarray(x) * 1.5))


def test_vectors_rows_programs_and_unwritten_bytes():
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    step = Step("mul", "float32", tuple(float(v) for v in range(1, 7)), axis=1, start=0)
    program = A.Program(Affine((step,)), "float32", "bfloat16", (4, 6), (0, 1), (0, 0))
    table = A.encode([program])
    rows = np.array([[0, 0, 6, 2, 12, 0], [0, 0, 20, 20, 2, 0]])           # rows 1-2 of x, then x[3, 2:4]
    out = A.affine_copy_many([jnp.asarray(x)], [jnp.full(24, 7.0, BF16)], rows, table)[0]
    want = np.full(24, 7.0, np.float32)
    want[2:14] = (x * np.arange(1, 7))[1:3].reshape(-1)
    want[20:22] = (x * np.arange(1, 7))[3, 2:4]
    assert np.array_equal(np.asarray(out).astype(np.float32), want)
    with pytest.raises(ValueError, match=r"affine row 0 .*outside its buffers"):
        A.affine_copy_many([jnp.asarray(x)], [jnp.zeros(24, BF16)], [[0, 0, 20, 0, 8, 0]], table)
    with pytest.raises(ValueError, match=r"affine rows 0 and 1 write the same elements"):
        A.affine_copy_many([jnp.asarray(x)], [jnp.zeros(24, BF16)], [[0, 0, 0, 0, 4, 0], [0, 0, 8, 2, 4, 0]], table)
    with pytest.raises(ValueError, match=r"program 0 reads float32 and writes bfloat16, but source 0 is float16"):
        A.affine_copy_many([jnp.asarray(x, np.float16)], [jnp.zeros(24, BF16)], [[0, 0, 0, 0, 4, 0]], table)


def query_scaling_tree(dtype, seed=1):
    rng = np.random.default_rng(seed)
    return {"q": rng.standard_normal((16, 4, 8)).astype(np.float32).astype(dtype),
            "n": rng.standard_normal((32,)).astype(np.float32).astype(dtype),
            "e": rng.standard_normal((64, 32)).astype(np.float32).astype(dtype)}


def exporter(dst_dtype):
    head_scale = np.linspace(0.5, 2.0, 4, dtype=np.float32)
    def convert(p):
        return {"q_proj": (p["q"].reshape(16, 32) * (8 ** -0.5)).T.astype(dst_dtype),   # transposed view
                "norm": (1 + p["n"]).astype(dst_dtype),                                   # plain view
                "embed": (p["e"] * np.float32(np.sqrt(32.0))).astype(dst_dtype),          # plain, cast
                "heads": (p["q"].astype(np.float32) * head_scale[:, None]).reshape(16, 32).astype(dst_dtype)}
    return convert


def trainer_arrays(tree):
    return {k: jax.device_put(v, NamedSharding(TRAINER, P("x"))) for k, v in tree.items()}


def eager(convert, tree):
    return {k: np.asarray(v) for k, v in convert({k: jnp.asarray(v) for k, v in tree.items()}).items()}


PAIRS = [(np.float32, np.float32), (np.float32, BF16), (BF16, BF16), (np.float32, np.float16)]


@pytest.mark.parametrize("src_dtype, dst_dtype", PAIRS, ids=lambda d: np.dtype(d).name)
def test_jax_destinations_bit_exact_with_the_eager_exporter(src_dtype, dst_dtype):
    route = "batched"  # the route of every JAX destination
    tree = query_scaling_tree(src_dtype)
    convert = exporter(dst_dtype)
    want = eager(convert, tree)
    dst = {k: jax.jit(lambda s=v.shape, d=v.dtype: jnp.zeros(s, d),
                      out_shardings=NamedSharding(ROLLOUT, P("y")))() for k, v in want.items()}
    report = jax_amem.swap(trainer_arrays(tree), dst, rules=rules.from_function(convert, tree), verify=True)
    assert report.verified and report.route == route
    for name, value in want.items():
        got = np.asarray(report.dst[name])
        assert np.array_equal(got.view(np.uint8), value.view(np.uint8)), name
    forget()


@pytest.mark.parametrize("src_dtype, dst_dtype", PAIRS, ids=lambda d: np.dtype(d).name)
def test_pytorch_destinations_by_address_bit_exact(src_dtype, dst_dtype):
    tree = query_scaling_tree(src_dtype, seed=2)
    convert = exporter(dst_dtype)
    want = eager(convert, tree)
    dst = {k: torch.full(v.shape, float("nan"), dtype=getattr(torch, np.dtype(v.dtype).name)) for k, v in want.items()}
    pointers = {k: t.data_ptr() for k, t in dst.items()}
    report = jax_amem.swap(trainer_arrays(tree), dst, rules=rules.from_function(convert, tree), verify=True)
    assert report.verified and report.route == "addresses"
    assert {k: t.data_ptr() for k, t in dst.items()} == pointers
    for name, value in want.items():
        got = dst[name].reshape(-1).view(torch.uint8).numpy()
        assert np.array_equal(got, value.reshape(-1).view(np.uint8)), name
    forget()


def test_a_scaled_plain_view_makes_no_temporary_and_a_transposed_one_the_same_as_before():
    tree = query_scaling_tree(np.float32)
    arrays = trainer_arrays(tree)
    layouts = {k: a for k, a in arrays.items()}
    scaled = rules.from_function(lambda p: {"e": (p["e"] * 0.5).astype(BF16), "t": (p["e"].T * 0.5)}, tree)
    plain = rules.from_function(lambda p: {"e": p["e"].astype(BF16), "t": p["e"].T}, tree)
    dst = {"e": jax.ShapeDtypeStruct((64, 32), BF16), "t": jax.ShapeDtypeStruct((32, 64), np.float32)}
    from jax_amem import reshard
    dst_layouts = {k: reshard.Layout.replicated(v.shape, v.dtype, [reshard.Owner(0, DEVICES[0].id)])
                   for k, v in dst.items()}
    for pieces, cast_views in ((scaled, 0), (plain, 1)):
        plan = reshard.plan(layouts, dst_layouts, pieces)
        made = [schedule._transforms(plan, v) for v in range(len(plan.views))]
        names = [(plan.views[v][0], tuple(plan.views[v][1])) for v in range(len(plan.views))]
        transposed = sum(1 for (_, perm), m in zip(names, made) if m and perm != (0, 1))
        assert transposed == 1                                     # the transpose XLA made before, still
        assert sum(made) - transposed == cast_views                # the cast: the kernel's when scaled


def test_constants_run_inside_a_users_jit():
    x = jnp.asarray(np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32))
    table = one_step_table(np.float32, BF16, Step("mul", "float32", (0.125,)))
    rows = np.array([[0, 0, 0, 0, 128, 0]])

    @jax.jit
    def step(w, buffer):
        w = w * 2.0                                                 # the trainer's own work first
        return A.affine_copy_many([w], [buffer], rows, table)[0]

    out = step(x, jnp.zeros(128, BF16))
    assert np.array_equal(np.asarray(out), np.asarray((x * 2.0 * 0.125).astype(BF16)).reshape(-1))


@pytest.mark.gpu
@pytest.mark.parametrize("dst", [np.float32, BF16, np.float16], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("src", [np.float32, BF16, np.float16], ids=lambda d: np.dtype(d).name)
def test_gpu_kernel_equals_the_cpu_reference(src, dst):
    gpu = jax.devices("gpu")[0]
    x = random_floats(1 << 20, 4).astype(src)
    vector = tuple(float(v) for v in np.asarray(np.linspace(0.3, 3.0, 5), np.float32).astype(src).astype(np.float32))
    scale = (Step("mul", np.dtype(src).name, (float(np.asarray(0.3, src)),)),)
    scalars = (Step("rsub", np.dtype(src).name, (float(np.asarray(0.7, src)),)), Step("sub", "float32", (0.25,)),
               Step("mul", "bfloat16", (3.0,)))                     # several scalar steps, each rounded
    vectors = (Step("mul", "float32", vector, axis=1, start=0), Step("div", "float32", (0.7,)),
               Step("add", np.dtype(dst).name, (1.0,)))
    n = (x.size // 5) * 5                                           # not a multiple of 4 or 8: a tail
    # (rows, destination elements, the part written, the source part it holds): misaligned ends (the
    # element-wise path), and aligned ends (16-byte loads, then the tail).
    placements = ((np.array([[0, 0, 3, 1, n - 3, 0]]), n + 1, slice(1, n - 2), slice(3, n)),
                  (np.array([[0, 0, 0, 0, n, 0]]), n, slice(0, n), slice(0, n)))
    for steps in (scale, scalars, vectors):
        program = A.Program(Affine(steps), np.dtype(src).name, np.dtype(dst).name, (x.size // 5, 5), (0, 1), (0, 0))
        table = A.encode([program])
        for rows, size, written, read in placements:
            out = jax.jit(lambda s, d: A.affine_copy_many([s], [d], rows, table)[0])(
                jax.device_put(x[:n], gpu), jax.device_put(np.zeros(size, dst), gpu))
            want = Affine(steps).apply_numpy(x[:n].reshape(-1, 5), dst).reshape(-1)[read]
            got = np.asarray(out)[written]
            same = got.view(np.uint8).reshape(len(got), -1) == want.view(np.uint8).reshape(len(want), -1)
            nan = np.isnan(got.astype(np.float64)) & np.isnan(want.astype(np.float64))
            assert (same.all(axis=1) | nan).all(), (src, dst, steps, rows)


@pytest.mark.gpu
def test_gpu_swap_into_pytorch_with_query_scaling_is_bit_exact():
    gpu = jax.devices("gpu")[0]
    device = f"cuda:{gpu.local_hardware_id}"
    rng = np.random.default_rng(5)
    host = {"q": rng.standard_normal((2048, 32, 128)).astype(np.float32),    # 32 MiB: a bulk-sized row
            "n": rng.standard_normal((4096,)).astype(BF16)}
    convert = lambda p: {"q_proj": (p["q"].reshape(2048, 4096) * (128 ** -0.5)).astype(BF16),
                         "q_t": (p["q"][:64].reshape(64, 4096) * np.float32(np.sqrt(128.0))).T,
                         "norm": 1 + p["n"]}
    want = eager(convert, host)
    src = {k: jax.device_put(v, gpu) for k, v in host.items()}
    dst = {k: torch.empty(v.shape, dtype=getattr(torch, np.dtype(v.dtype).name), device=device)
           for k, v in want.items()}
    report = jax_amem.swap(src, dst, rules=rules.from_function(convert, host), verify=True)
    assert report.verified
    for name, value in want.items():
        assert np.array_equal(dst[name].cpu().reshape(-1).view(torch.uint8).numpy(), value.reshape(-1).view(np.uint8))
    forget()


@pytest.mark.gpu
def test_gpu_llama_over_nccl_with_a_query_scale_packed_by_the_sender():
    """Two processes on the GPU (tests/gpu_workers/nccl_swap_worker.py): every q_proj scaled
    by 0.125 on the way; the rollout checks every byte against the numpy reference."""
    import sys
    from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu_workers"))
    from run_pair import run_pair

    results, logs = run_pair("nccl_swap_worker.py", ["llama"], timeout=180,
                             extra_env={"JAX_AMEM_TEST_QUERY_SCALE": "0.125"})
    text = "\n\n".join(log[-4000:] for log in logs)
    rollout = [r for r in results if r.get("role") == "rollout" and r.get("phase") == "checked"]
    assert len(rollout) == 3, text
    assert all(r["mismatched"] == [] for r in rollout), rollout
