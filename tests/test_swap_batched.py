"""The opt-in batched swap path (JAX_AMEM_SWAP_BATCHED=1: a few segment_copy_many calls per
group instead of one segment_copy per transfer): the same destination bytes as the default
path in the swap's scenarios (Llama logits, tensor-parallel fused QKV, JAX to JAX against
device_put), ceil(buffers / 512) launches per group, chunks split at the limit (a buffer
spanning chunks included), the switch part of the program cache, error paths untouched."""

import math

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_amem
from jax_amem import reshard
from jax_amem.copy import MAX_BUFFERS_PER_SIDE
from jax_amem.swap import batched, forget, program

import test_swap_errors as errors
import test_swap_jax as jaxdst
import test_swap_llama as llama

torch = pytest.importorskip("torch")


@pytest.fixture
def path(monkeypatch):
    """path("1") / path("0"): the next swaps take the batched / default path."""
    return lambda value: monkeypatch.setenv(batched.ENV, value)


def tensor_bytes(tensors: dict) -> dict:
    return {name: t.detach().cpu().reshape(-1).view(torch.uint8).numpy().copy() for name, t in tensors.items()}


def test_llama_batched_writes_the_default_paths_bytes_in_one_launch(path):
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("fsdp", "tp"))
    params = llama.fsdp_tp_sharded(llama.flax_params(0), mesh)
    rules = reshard.rules.hf_llama(llama.L)
    written = {}
    for value in ("0", "1"):
        path(value)
        model = llama.nan_model()
        report = jax_amem.swap(params, dict(model.named_parameters()), rules=rules, verify=True)
        written[value] = (report, tensor_bytes(dict(model.named_parameters())), llama.torch_logits(model, llama.TOKENS))
    (default, default_bytes, _), (fast, fast_bytes, logits) = written["0"], written["1"]
    assert not default.batched and fast.batched and fast.verified
    assert fast.calls == default.calls == 1 and fast.buffers == default.buffers == 21
    assert default.launches > 21 and fast.launches == math.ceil(21 / MAX_BUFFERS_PER_SIDE) == 1
    assert fast.segments == default.segments and fast.transports == default.transports
    assert default_bytes.keys() == fast_bytes.keys()
    for name in default_bytes:
        assert np.array_equal(fast_bytes[name], default_bytes[name]), name
    want = np.asarray(jax.jit(llama.jax_llama_logits)(params, llama.TOKENS))
    np.testing.assert_allclose(logits, want, rtol=2e-5, atol=2e-5)
    assert "1 batched copy launches in 1 calls" in str(fast)


@pytest.mark.parametrize("cast", [None, "bfloat16"])
def test_tensor_parallel_fused_qkv_bytes_equal_default_and_numpy(path, cast):
    tp = 2
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("fsdp", "tp"))
    tree = llama.flax_params(3)
    params = llama.fsdp_tp_sharded(tree, mesh)
    rules = reshard.rules.hf_llama(llama.L, tp=tp, fused_qkv=True, fused_gate_up=True, cast=cast)
    dtype = np.dtype(cast or np.float32)
    here = reshard.Owner(jax.process_index(), jax.devices("cpu")[0].id)
    hf = llama.numpy_hf(tree)
    for rank in range(tp):
        want = llama.rank_slices(hf, tp, rank)
        plan = reshard.plan(params, llama.rank_layouts(hf, tp, rank, here, dtype), rules)
        got = {}
        for value in ("0", "1"):
            path(value)
            dst = {name: torch.full(w.shape, float("nan"), dtype=getattr(torch, dtype.name)) for name, w in want.items()}
            report = jax_amem.swap(params, dst, plan=plan)
            assert report.batched == (value == "1")
            got[value] = tensor_bytes(dst)
        assert report.launches == 1
        for name, w in want.items():
            expected = np.ascontiguousarray(w.astype(dtype)).reshape(-1).view(np.uint8)
            assert np.array_equal(got["1"][name], expected), (rank, name)
            assert np.array_equal(got["1"][name], got["0"][name]), (rank, name)


@pytest.mark.parametrize("dtype", [np.float32, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn])
def test_jax_to_jax_batched_equals_device_put_in_place(path, dtype):
    path("1")
    src, dst, want = {}, {}, {}
    for k, (name, (shape, s_spec, d_spec)) in enumerate(jaxdst.TREE_SPECS.items()):
        src[name] = jax.device_put(jaxdst.random_bits(shape, dtype, k), NamedSharding(jaxdst.TRAINER, s_spec))
        sharding = NamedSharding(jaxdst.ROLLOUT, d_spec)
        dst[name] = jaxdst.zeros(shape, dtype, sharding)
        want[name] = jax.device_put(src[name], sharding)
    pointers = {n: [s.data.unsafe_buffer_pointer() for s in a.addressable_shards] for n, a in dst.items()}
    report = jax_amem.swap(src, dst, verify=True)
    assert report.batched and "not-in-place" not in report.transports
    assert report.calls == 8 and report.launches == report.calls  # one group per device, one chunk each
    assert all(a.is_deleted() for a in dst.values())
    for name in jaxdst.TREE_SPECS:
        new = report.dst[name]
        for got, expected in zip(new.addressable_shards, want[name].addressable_shards):
            assert np.array_equal(jaxdst.as_bytes(got.data), jaxdst.as_bytes(expected.data)), name
        assert [s.data.unsafe_buffer_pointer() for s in new.addressable_shards] == pointers[name]


def test_more_than_512_buffers_split_per_group(path, monkeypatch):
    monkeypatch.setattr(program, "GROUP_BUFFERS", 550)  # groups of 550 and 50 buffers
    count = 600
    src = {f"t{i}": jax.device_put(jnp.full((2, 3), float(i)), jax.devices()[0]) for i in range(count)}
    path("1")
    dst = {name: errors.sentinel(2, 3) for name in src}
    report = jax_amem.swap(src, dst, progress=False)
    assert report.calls == 2 and report.buffers == count
    assert report.launches == math.ceil(550 / MAX_BUFFERS_PER_SIDE) + math.ceil(50 / MAX_BUFFERS_PER_SIDE) == 3
    assert all(torch.equal(t, torch.full((2, 3), float(i))) for i, t in enumerate(dst.values()))
    path("0")
    assert jax_amem.swap(src, dst, progress=False).launches == count


def test_a_buffer_read_from_more_views_than_fit_continues_in_the_next_chunk(path, monkeypatch):
    monkeypatch.setattr(batched, "CHUNK_LIMIT", 3)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("fsdp", "tp"))
    value = np.arange(16 * 24, dtype=np.float32).reshape(16, 24)
    src = {"a": jax.device_put(value, NamedSharding(mesh, P("fsdp", "tp"))),      # 8 shards into each buffer
           "b": jax.device_put(value[:4], NamedSharding(mesh, P(None, "tp")))}     # 4 shards, 2 replicas each
    path("1")
    dst = {"a": errors.sentinel(16, 24), "b": errors.sentinel(4, 24)}
    rules = [reshard.Rule.copy("a"), reshard.Rule.copy("b")]
    report = jax_amem.swap(src, dst, rules=rules, verify=True)
    assert report.calls == 1 and report.launches == math.ceil((8 + 4) / 3) == 4
    assert np.array_equal(dst["a"].numpy(), value) and np.array_equal(dst["b"].numpy(), value[:4])


def step(source, view, *rows):
    return program.Step(source, view, np.array(rows, np.int64).reshape(-1, 3))


def test_chunk_steps_keeps_each_side_within_the_limit_and_every_row():
    steps = [[step(0, 0, (0, 0, 4)), step(1, 0, (0, 4, 4))],      # buffer 0 reads views 0, 1
             [step(0, 0, (4, 0, 4))],                             # buffer 1 shares view 0
             [step(2, 1, (0, 0, 8), (8, 8, 8))],                  # buffer 2: one step, two rows
             [step(3, 0, (0, 0, 2)), step(4, 0, (0, 2, 2)), step(5, 0, (0, 4, 2))]]
    chunks = batched.chunk_steps(steps, limit=2)
    seen = []
    for chunk in chunks:
        assert len(chunk.views) <= 2 and len(chunk.buffers) <= 2
        for src, dst, *rest in chunk.rows.tolist():
            key, buffer = chunk.views[src], chunk.buffers[dst]
            seen.append((buffer, key, tuple(rest)))
    want = [(b, (s.source, s.view), tuple(r)) for b, ss in enumerate(steps) for s in ss for r in s.segments.tolist()]
    assert seen == want  # every row once, in the default path's order
    assert [c.buffers for c in chunks] == [(0, 1), (2, 3), (3,)]  # buffer 3 spans two chunks
    assert [c.views for c in chunks] == [((0, 0), (1, 0)), ((2, 1), (3, 0)), ((4, 0), (5, 0))]
    assert len(batched.chunk_steps(steps)) == 1


def test_the_switch_is_part_of_the_program_cache(path, monkeypatch):
    src = errors.sources()
    dst = errors.good_destination()
    path("0")
    first = jax_amem.swap(src, dst)
    path("1")
    second = jax_amem.swap(src, dst)
    monkeypatch.delenv(batched.ENV)
    monkeypatch.setattr(batched, "DEFAULT", True)
    third = jax_amem.swap(src, dst)
    monkeypatch.setattr(batched, "DEFAULT", False)
    fourth = jax_amem.swap(src, dst)
    assert [r.batched for r in (first, second, third, fourth)] == [False, True, True, False]
    assert first.launches == fourth.launches > second.launches == third.launches == 1
    assert torch.equal(dst["w"], torch.arange(48.0).reshape(8, 6)) and torch.equal(dst["b"], torch.arange(8.0))


def test_an_unknown_switch_value_is_refused_before_anything_moves(path):
    path("yes")
    errors.swap_fails(errors.good_destination(), r"JAX_AMEM_SWAP_BATCHED='yes' is not understood: set it to 1")


@pytest.mark.parametrize("scenario", [
    errors.test_wrong_shape_names_the_tensor,
    errors.test_wrong_dtype_names_the_tensor,
    errors.test_missing_and_extra_names_are_all_listed,
    errors.test_a_destination_on_another_device_than_the_plan_says,
    errors.test_a_deleted_jax_destination_or_source,
    errors.test_freed_non_contiguous_and_shared_torch_destinations,
    errors.test_a_destination_freed_after_its_program_was_cached,
    errors.test_plans_that_do_not_fit_the_inputs,
], ids=lambda f: f.__name__.removeprefix("test_"))
def test_error_paths_leave_the_destination_untouched_when_batched(path, scenario):
    path("1")
    scenario()  # each asserts its SwapError and that the destination did not change


@pytest.mark.gpu
def test_gpu_batched_llama_in_place_equals_default(path):
    gpu = jax.devices("gpu")[0]
    params = jax.device_put(llama.flax_params(5), gpu)
    rules = reshard.rules.hf_llama(llama.L)
    written = {}
    for value in ("0", "1"):
        path(value)
        model = llama.nan_model("cuda")
        tensors = dict(model.named_parameters())
        pointers = {name: t.data_ptr() for name, t in tensors.items()}
        first = jax_amem.swap(params, tensors, rules=rules, verify=True)
        second = jax_amem.swap(params, tensors, rules=rules)  # donates the kept buffers
        assert {name: t.data_ptr() for name, t in model.named_parameters()} == pointers
        for report in (first, second):
            assert report.batched == (value == "1")
            assert "host-copy-back" not in report.transports and report.transports["device-local"] == report.bytes
        written[value] = (second, tensor_bytes(tensors), llama.torch_logits(model, llama.TOKENS))
        forget()
    assert written["1"][0].launches == 1
    for name, expected in written["0"][1].items():
        assert np.array_equal(written["1"][1][name], expected), name
    with jax.default_matmul_precision("highest"):
        want = np.asarray(jax.jit(llama.jax_llama_logits)(params, llama.TOKENS))
    np.testing.assert_allclose(written["1"][2], want, rtol=1e-4, atol=1e-4)


@pytest.mark.gpu
def test_gpu_batched_many_small_tensors_in_place(path):
    gpu = jax.devices("gpu")[0]
    count = 2000
    src = {f"t{i}": jax.device_put(jnp.full((33, 31), float(i), jnp.float32), gpu) for i in range(count)}
    dst = {name: torch.full((33, 31), float("nan"), device=f"cuda:{gpu.local_hardware_id}") for name in src}
    pointers = [t.data_ptr() for t in dst.values()]
    path("1")
    for _ in range(2):  # the second donates the kept buffers
        report = jax_amem.swap(src, dst, progress=False)
        groups = (program.GROUP_BUFFERS, count - program.GROUP_BUFFERS)  # 1024 and 976 buffers
        assert report.calls == 2 and report.launches == sum(math.ceil(n / MAX_BUFFERS_PER_SIDE) for n in groups)
        assert report.transports == {"device-local": report.bytes}
        assert [t.data_ptr() for t in dst.values()] == pointers
        assert all(torch.equal(t.cpu(), torch.full((33, 31), float(i))) for i, t in enumerate(dst.values()))
    forget()
