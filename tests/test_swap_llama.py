"""The swap into a real transformers LlamaForCausalLM: JAX parameters sharded over 8 devices,
written into the model's own tensors; the model's logits then equal a jax.numpy Llama's on
the same input. Tensor-parallel ranks with vLLM's fused qkv_proj / gate_up_proj, checked
byte for byte against numpy. On a GPU: the same into a CUDA model, written in place."""

import ml_dtypes
import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_amem
from jax_amem import reshard
from jax_amem.reshard import Layout, Owner

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

L, D, H, KV, F, V = 2, 64, 4, 2, 128, 128
HD = D // H
EPS, THETA = 1e-6, 10000.0
SHAPES = {"attn/q/kernel": (D, H * HD), "attn/k/kernel": (D, KV * HD), "attn/v/kernel": (D, KV * HD),
          "attn/o/kernel": (H * HD, D), "mlp/gate/kernel": (D, F), "mlp/up/kernel": (D, F),
          "mlp/down/kernel": (F, D), "input_norm/scale": (D,), "post_attn_norm/scale": (D,)}


def flax_params(seed: int) -> dict:
    """A stacked (scanned) Flax-style Llama tree, the names rules.hf_llama expects."""
    rng = np.random.default_rng(seed)
    w = lambda *shape: (0.1 * rng.standard_normal(shape)).astype(np.float32)
    layers = {}
    for path, shape in SHAPES.items():
        node = layers
        *heads, leaf = path.split("/")
        for key in heads:
            node = node.setdefault(key, {})
        node[leaf] = (1 + w(L, *shape)) if "norm" in path else w(L, *shape)
    return {"embed": {"embedding": w(V, D)}, "layers": layers, "final_norm": {"scale": 1 + w(D)},
            "lm_head": {"kernel": w(D, V)}}


def fsdp_tp_sharded(tree, mesh: Mesh):
    """FSDP over the first mesh axis, tensor parallel over the second, on the last two axes."""
    def spec(x):
        if x.ndim == 1 or (x.ndim == 2 and x.shape[0] == L):
            return P(*([None] * (x.ndim - 1)), "tp")
        return P(*([None] * (x.ndim - 2)), "fsdp", "tp")
    return jax.tree.map(lambda x: jax.device_put(x, NamedSharding(mesh, spec(x))), tree)


def jax_llama_logits(params, tokens):
    """Llama in jax.numpy, arithmetic as transformers does it (rotate-half RoPE, key/value heads
    repeated consecutively, RMSNorm in float32)."""
    def rms(x, scale):
        return scale * (x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + EPS))

    def rotate(x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin

    B, T = tokens.shape
    inv_freq = 1.0 / THETA ** (jnp.arange(0, HD, 2, dtype=jnp.float32) / HD)
    angles = jnp.arange(T, dtype=jnp.float32)[:, None] * inv_freq[None]
    angles = jnp.concatenate([angles, angles], axis=-1)[None, :, None, :]
    cos, sin = jnp.cos(angles), jnp.sin(angles)
    mask = jnp.tril(jnp.ones((T, T), bool))
    x = params["embed"]["embedding"][tokens]
    stack = params["layers"]
    for i in range(L):
        h = rms(x, stack["input_norm"]["scale"][i])
        q = rotate((h @ stack["attn"]["q"]["kernel"][i]).reshape(B, T, H, HD), cos, sin)
        k = rotate((h @ stack["attn"]["k"]["kernel"][i]).reshape(B, T, KV, HD), cos, sin)
        v = (h @ stack["attn"]["v"]["kernel"][i]).reshape(B, T, KV, HD)
        k, v = jnp.repeat(k, H // KV, axis=2), jnp.repeat(v, H // KV, axis=2)
        scores = jnp.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(HD)
        weights = jax.nn.softmax(jnp.where(mask, scores, -jnp.inf), axis=-1)
        attn = jnp.einsum("bhqk,bkhd->bqhd", weights, v).reshape(B, T, H * HD)
        x = x + attn @ stack["attn"]["o"]["kernel"][i]
        h = rms(x, stack["post_attn_norm"]["scale"][i])
        gate, up = h @ stack["mlp"]["gate"]["kernel"][i], h @ stack["mlp"]["up"]["kernel"][i]
        x = x + (jax.nn.silu(gate) * up) @ stack["mlp"]["down"]["kernel"][i]
    return rms(x, params["final_norm"]["scale"]) @ params["lm_head"]["kernel"]


def nan_model(device="cpu"):
    config = transformers.LlamaConfig(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=L,
                                      num_attention_heads=H, num_key_value_heads=KV, rms_norm_eps=EPS,
                                      rope_theta=THETA, tie_word_embeddings=False, attn_implementation="eager")
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for tensor in model.parameters():
            tensor.fill_(float("nan"))  # a tensor the swap missed shows as NaN logits
    return model


def torch_logits(model, tokens) -> np.ndarray:
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(tokens), device=model.device)).logits.float().cpu().numpy()


TOKENS = np.random.default_rng(7).integers(0, V, (2, 12)).astype(np.int32)


def test_swap_into_a_transformers_llama_gives_the_jax_models_logits():
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("fsdp", "tp"))
    params = fsdp_tp_sharded(flax_params(0), mesh)
    model = nan_model()
    rules = reshard.rules.hf_llama(L)
    report = jax_amem.swap(params, dict(model.named_parameters()), rules=rules, verify=True)
    assert report.verified and report.buffers == len(dict(model.named_parameters()))
    assert report.bytes == sum(p.numel() * 4 for p in model.parameters())
    want = np.asarray(jax.jit(jax_llama_logits)(params, TOKENS))
    np.testing.assert_allclose(torch_logits(model, TOKENS), want, rtol=2e-5, atol=2e-5)
    # The next version: new weights, same tensors, the version counts up.
    params2 = fsdp_tp_sharded(flax_params(1), mesh)
    second = jax_amem.swap(params2, model.state_dict(), rules=rules)
    assert second.version == report.version + 1
    np.testing.assert_allclose(torch_logits(model, TOKENS), np.asarray(jax.jit(jax_llama_logits)(params2, TOKENS)),
                               rtol=2e-5, atol=2e-5)


def numpy_hf(tree) -> dict:
    """Every Hugging Face tensor from the Flax tree, in numpy (the table's kernels transposed)."""
    out = {"model.embed_tokens.weight": tree["embed"]["embedding"], "model.norm.weight": tree["final_norm"]["scale"],
           "lm_head.weight": tree["lm_head"]["kernel"].T}
    for i in range(L):
        for name, (source, transposed) in reshard.rules.LLAMA_LAYER_WEIGHTS.items():
            node = tree["layers"]
            for key in source.split("/"):
                node = node[key]
            out[f"model.layers.{i}.{name}"] = node[i].T if transposed else node[i]
    return out


def rank_slices(hf: dict, tp: int, rank: int) -> dict:
    """vLLM's tensors on one tensor-parallel rank: column-parallel weights split on dim 0, row-
    parallel (o_proj, down_proj) on dim 1, norms whole, q/k/v and gate/up fused per rank."""
    out = {}
    for name, full in hf.items():
        if "norm" in name:
            out[name] = full
        else:
            dim = 1 if ("o_proj" in name or "down_proj" in name) else 0
            out[name] = np.array_split(full, tp, axis=dim)[rank]
    for i in range(L):
        p = f"model.layers.{i}."
        for fused, members in reshard.rules.FUSED.items():
            if all(p + m in out for m in members):
                out[p + fused] = np.concatenate([out.pop(p + m) for m in members])
    return out


def rank_layouts(hf: dict, tp: int, rank: int, owner: Owner, dtype) -> dict:
    """The logical (whole, fused) tensors, of which `owner` holds rank `rank`'s box."""
    whole = {}
    for name, full in hf.items():
        whole[name] = full.shape
    for i in range(L):
        p = f"model.layers.{i}."
        for fused, members in reshard.rules.FUSED.items():
            if all(p + m in whole for m in members):
                parts = [whole.pop(p + m) for m in members]
                whole[p + fused] = (sum(s[0] for s in parts),) + parts[0][1:]
    layouts = {}
    for name, shape in whole.items():
        if "norm" in name:
            layouts[name] = Layout.single(shape, dtype, owner)
            continue
        dim = 1 if ("o_proj" in name or "down_proj" in name) else 0
        split = Layout.tensor_parallel(shape, dtype, dim, tp, [(9, r) for r in range(tp)])
        start, size = split.shard_box((9, rank))
        layouts[name] = Layout.from_boxes(shape, dtype, {owner: (start, size)})
    return layouts


@pytest.mark.parametrize("cast", [None, "bfloat16"])
def test_tensor_parallel_ranks_with_fused_qkv_get_exactly_their_slices(cast):
    tp = 2
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("fsdp", "tp"))
    tree = flax_params(3)
    params = fsdp_tp_sharded(tree, mesh)
    rules = reshard.rules.hf_llama(L, tp=tp, fused_qkv=True, fused_gate_up=True, cast=cast)
    dtype = np.dtype(cast or np.float32)
    here = Owner(jax.process_index(), jax.devices("cpu")[0].id)  # where torch's CPU tensors live for JAX
    hf = numpy_hf(tree)
    for rank in range(tp):
        want = rank_slices(hf, tp, rank)
        plan = reshard.plan(params, rank_layouts(hf, tp, rank, here, dtype), rules)
        torch_dtype = getattr(torch, dtype.name)
        dst = {name: torch.full(w.shape, float("nan"), dtype=torch_dtype) for name, w in want.items()}
        report = jax_amem.swap(params, dst, plan=plan, verify=True)
        assert report.buffers == len(want)
        for name, w in want.items():
            got = dst[name].view(torch.int16 if dtype.itemsize == 2 else torch.int32).numpy()
            expected = np.ascontiguousarray(w.astype(dtype)).view(got.dtype)
            assert np.array_equal(got, expected), (rank, name)


@pytest.mark.gpu
def test_swap_into_a_cuda_llama_in_place():
    params = jax.device_put(flax_params(5), jax.devices("gpu")[0])
    model = nan_model("cuda")
    tensors = dict(model.named_parameters())
    pointers = {name: t.data_ptr() for name, t in tensors.items()}
    rules = reshard.rules.hf_llama(L)
    first = jax_amem.swap(params, tensors, rules=rules, verify=True)
    second = jax_amem.swap(params, tensors, rules=rules)  # the cached program, same addresses
    assert {name: t.data_ptr() for name, t in model.named_parameters()} == pointers
    for report in (first, second):
        assert report.route == "addresses" and report.transports["device-local"] == report.bytes
    with jax.default_matmul_precision("highest"):
        want = np.asarray(jax.jit(jax_llama_logits)(params, TOKENS))
    np.testing.assert_allclose(torch_logits(model, TOKENS), want, rtol=1e-4, atol=1e-4)
