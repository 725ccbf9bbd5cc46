"""The address route (PyTorch destinations written by address, swapping/in_process/): in place
on CPU and GPU (pointers unchanged, no copy back), chunks of at most 512 buffers per call, a
buffer whose reads span chunks, bulk rows and kernel rows writing the same bytes, tensors that
moved getting a program of their own, and the many-small and few-large GPU cases."""

import math

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_amem
from jax_amem import copy as amem_copy
from jax_amem import reshard
from jax_amem.copy import MAX_BUFFERS_PER_SIDE
from jax_amem.swapping import forget
from jax_amem.swapping.in_process import schedule

import test_swap_errors as errors
import test_swap_llama as llama

torch = pytest.importorskip("torch")


def tensor_bytes(tensors: dict) -> dict:
    return {name: t.detach().cpu().reshape(-1).view(torch.uint8).numpy().copy() for name, t in tensors.items()}


def test_llama_written_in_place_in_one_call_on_the_cpu():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("fsdp", "tp"))
    params = llama.fsdp_tp_sharded(llama.flax_params(0), mesh)
    model = llama.nan_model()
    tensors = dict(model.named_parameters())
    pointers = [t.data_ptr() for t in tensors.values()]
    report = jax_amem.swap(params, tensors, rules=reshard.rules.hf_llama(llama.L))
    assert report.route == "addresses" and report.calls == 1 and report.launches == 1  # 21 buffers, one chunk
    assert set(report.transports) <= {"device-local", "cross-device"}
    assert [t.data_ptr() for t in model.parameters()] == pointers
    want = np.asarray(jax.jit(llama.jax_llama_logits)(params, llama.TOKENS))
    np.testing.assert_allclose(llama.torch_logits(model, llama.TOKENS), want, rtol=2e-5, atol=2e-5)
    assert "copy launches (addresses) in 1 calls" in str(report)


@pytest.mark.parametrize("cast", [None, "bfloat16"])
def test_bulk_rows_and_kernel_rows_write_the_same_bytes(monkeypatch, cast):
    tp = 2
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("fsdp", "tp"))
    tree = llama.flax_params(3)
    params = llama.fsdp_tp_sharded(tree, mesh)
    rules = reshard.rules.hf_llama(llama.L, tp=tp, fused_qkv=True, fused_gate_up=True, cast=cast)
    dtype = np.dtype(cast or np.float32)
    here = reshard.Owner(jax.process_index(), jax.devices("cpu")[0].id)
    hf = llama.numpy_hf(tree)
    want = llama.rank_slices(hf, tp, 1)
    plan = reshard.plan(params, llama.rank_layouts(hf, tp, 1, here, dtype), rules)
    got = {}
    for bulk in (1, 1 << 40):  # every row a bulk copy; no row a bulk copy
        monkeypatch.setattr(amem_copy, "BULK_BYTES", bulk)
        forget()  # the threshold is read when a program is built
        dst = {name: torch.full(w.shape, float("nan"), dtype=getattr(torch, dtype.name)) for name, w in want.items()}
        jax_amem.swap(params, dst, plan=plan)
        got[bulk] = tensor_bytes(dst)
    for name, w in want.items():
        expected = np.ascontiguousarray(w.astype(dtype)).reshape(-1).view(np.uint8)
        assert np.array_equal(got[1][name], expected) and np.array_equal(got[1 << 40][name], expected), name


def test_more_than_512_buffers_split_per_group(monkeypatch):
    monkeypatch.setattr(schedule, "ADDRESS_GROUP_BUFFERS", 550)  # groups of 550 and 50 buffers
    count = 600
    src = {f"t{i}": jax.device_put(jnp.full((2, 3), float(i)), jax.devices()[0]) for i in range(count)}
    dst = {name: errors.sentinel(2, 3) for name in src}
    report = jax_amem.swap(src, dst, progress=False)
    assert report.calls == 2 and report.buffers == count
    assert report.launches == math.ceil(550 / MAX_BUFFERS_PER_SIDE) + math.ceil(50 / MAX_BUFFERS_PER_SIDE) == 3
    assert all(torch.equal(t, torch.full((2, 3), float(i))) for i, t in enumerate(dst.values()))


def test_a_buffer_read_from_more_views_than_fit_continues_in_the_next_chunk(monkeypatch):
    monkeypatch.setattr(schedule, "CHUNK_LIMIT", 3)
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("fsdp", "tp"))
    value = np.arange(16 * 24, dtype=np.float32).reshape(16, 24)
    src = {"a": jax.device_put(value, NamedSharding(mesh, P("fsdp", "tp"))),      # 8 shards into each buffer
           "b": jax.device_put(value[:4], NamedSharding(mesh, P(None, "tp")))}     # 4 shards, 2 replicas each
    dst = {"a": errors.sentinel(16, 24), "b": errors.sentinel(4, 24)}
    rules = [reshard.Rule.copy("a"), reshard.Rule.copy("b")]
    report = jax_amem.swap(src, dst, rules=rules, verify=True)
    assert report.calls == 1 and report.launches == math.ceil((8 + 4) / 3) == 4
    assert np.array_equal(dst["a"].numpy(), value) and np.array_equal(dst["b"].numpy(), value[:4])


def test_calls_are_bounded_by_transformed_bytes_not_by_plain_copies(monkeypatch):
    monkeypatch.setattr(schedule, "GROUP_TEMPORARY_BYTES", 400)  # two cast views of 192 bytes per call
    src = {f"t{i}": jax.device_put(jnp.full((8, 6), float(i)), jax.devices()[0]) for i in range(3)}
    plain = jax_amem.swap(src, {name: errors.sentinel(8, 6) for name in src})
    dst = {name: errors.sentinel(8, 6, dtype=torch.bfloat16) for name in src}
    cast = jax_amem.swap(src, dst, rules=[reshard.Rule.copy(name, cast="bfloat16") for name in src])
    assert plain.calls == 1 and cast.calls == 2
    assert all(torch.equal(t, torch.full((8, 6), float(i), dtype=torch.bfloat16)) for i, t in enumerate(dst.values()))


def test_a_stacked_sources_view_is_made_once_not_once_per_layer(monkeypatch):
    # Two stacked (layers, in, out) sources, each layer transposed and cast into its own tensor,
    # the destinations in a model's layer-by-layer order. A call makes each whole view it reads;
    # the layer order made every view once per layer (the Qwen3-1.7B preset: 26x its bound on
    # the H200), and so did a view larger than a call's room for views (the room is smaller
    # than one fp32 view here). Ordered by view, the big view's readers together: one call each.
    layers, rows, cols = 6, 8, 4
    view_bytes = layers * rows * cols * 2
    monkeypatch.setattr(schedule, "GROUP_TEMPORARY_BYTES", view_bytes + view_bytes // 2)
    values = {name: np.arange(layers * rows * cols, dtype=np.float32).reshape(layers, rows, cols) * k
              for k, name in ((1, "a"), (-1, "b"))}
    src = {name: jax.device_put(v, jax.devices()[0]) for name, v in values.items()}
    dst = {f"l{i}.{name}": errors.sentinel(cols, rows, dtype=torch.bfloat16)
           for i in range(layers) for name in "ab"}
    rules = [reshard.Rule.copy(f"l{i}.{name}", name, index=(i,), transpose=(1, 0), cast="bfloat16")
             for i in range(layers) for name in "ab"]
    report = jax_amem.swap(src, dst, rules=rules)
    assert report.calls == 2, report
    for i in range(layers):
        for name in "ab":
            expected = torch.from_numpy(values[name][i].T.copy()).to(torch.bfloat16)
            assert torch.equal(dst[f"l{i}.{name}"], expected), (i, name)


def test_tensors_that_moved_get_their_own_program_and_the_old_one_stays_cached():
    src = errors.sources()
    first_dst = errors.good_destination()
    first = jax_amem.swap(src, first_dst)
    moved = errors.good_destination()  # same names, shapes, dtypes; other memory
    second = jax_amem.swap(src, moved)
    again = jax_amem.swap(src, first_dst)
    assert first.plan_key == second.plan_key == again.plan_key  # one plan, two programs
    for dst in (first_dst, moved):
        assert torch.equal(dst["w"], torch.arange(48.0).reshape(8, 6)) and torch.equal(dst["b"], torch.arange(8.0))
    from jax_amem.swapping.in_process import run as api
    cached = [p for p in api._programs.values() if p.plan.key == first.plan_key]
    assert len(cached) == 2


@pytest.mark.gpu
def test_gpu_many_small_tensors_in_place():
    gpu = jax.devices("gpu")[0]
    count = 2000
    src = {f"t{i}": jax.device_put(jnp.full((33, 31), float(i), jnp.float32), gpu) for i in range(count)}
    dst = {name: torch.full((33, 31), float("nan"), device=f"cuda:{gpu.local_hardware_id}") for name in src}
    pointers = [t.data_ptr() for t in dst.values()]
    for _ in range(2):
        report = jax_amem.swap(src, dst, progress=False)
        assert report.calls == 1 and report.launches == math.ceil(count / MAX_BUFFERS_PER_SIDE) == 4
        assert report.transports == {"device-local": report.bytes} and report.route == "addresses"
        assert [t.data_ptr() for t in dst.values()] == pointers
        assert all(torch.equal(t.cpu(), torch.full((33, 31), float(i))) for i, t in enumerate(dst.values()))
        for t in dst.values():
            t.fill_(float("nan"))
    forget()


@pytest.mark.gpu
def test_gpu_large_tensors_bulk_copies_and_a_transposed_cast():
    gpu = jax.devices("gpu")[0]
    rng = np.random.default_rng(11)
    host = {"a": rng.standard_normal((4096, 2048), dtype=np.float32),   # 32 MiB: one bulk copy
            "b": rng.standard_normal((1024, 3000), dtype=np.float32)}
    src = {k: jax.device_put(v, gpu) for k, v in host.items()}
    device = f"cuda:{gpu.local_hardware_id}"
    dst = {"a": torch.empty((4096, 2048), device=device),
           "b": torch.empty((3000, 1024), dtype=torch.bfloat16, device=device)}
    rules = [reshard.Rule.copy("a"), reshard.Rule.copy("b", transpose=(1, 0), cast="bfloat16")]
    report = jax_amem.swap(src, dst, rules=rules, verify=True)
    assert report.verified and report.route == "addresses"
    assert np.array_equal(dst["a"].cpu().numpy(), host["a"])
    want_b = torch.from_numpy(np.ascontiguousarray(host["b"].T)).to(torch.bfloat16)
    assert torch.equal(dst["b"].cpu(), want_b)
    forget()


@pytest.mark.gpu
def test_gpu_a_storage_shrunk_in_place_is_refused_and_its_neighbour_untouched():
    """PyTorch's caching allocator hands the freed block back at the same address for a smaller
    request (best fit, split): the cached program's key (address, shape, dtype) matched, and it
    wrote 16 MiB into an 8 MiB storage, over the tensor that got the block's other half."""
    from jax_amem.swapping import SwapError

    gpu = jax.devices("gpu")[0]
    device = f"cuda:{gpu.local_hardware_id}"
    src = {"w": jax.device_put(jnp.arange(1 << 22, dtype=jnp.float32), gpu)}   # 16 MiB
    dst = {"w": torch.zeros(1 << 22, device=device)}
    jax_amem.swap(src, dst)
    address = dst["w"].data_ptr()
    storage = dst["w"].untyped_storage()
    storage.resize_(0)
    storage.resize_(8 << 20)
    neighbour = torch.full((2 << 20,), 7.0, device=device)
    torch.cuda.synchronize()
    print("same address:", dst["w"].data_ptr() == address, "neighbour right after:",
          neighbour.data_ptr() == address + (8 << 20))
    with pytest.raises(SwapError, match=r"destination 'w': its storage holds 8388608 bytes"):
        jax_amem.swap(src, dst)
    torch.cuda.synchronize()
    assert torch.equal(neighbour, torch.full((2 << 20,), 7.0, device=device))
    forget()
