"""The vLLM backend's per-rank plans without vLLM: the presets' whole-tensor rules, cut for each
tensor-parallel rank (jax_amem/vllm/ranks.py), write into each rank's staging exactly the slice
vLLM loads on that rank, checked against slices cut by hand from the trainer's arrays (fused
qkv weight and Qwen2's qkv bias, gate_up, MoE w13 and w2, row-parallel o/down,
vocabulary-parallel embedding and head, replicated norms and router). The engine's side is each rank's staging buffer in this process;
the update loop and plans are the backend's own (`VllmEngine`).
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the staging buffers are PyTorch tensors")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import jax_amem  # noqa: E402
from jax_amem.vllm import VllmPlanError  # noqa: E402
from jax_amem.vllm.ranks import whole_shapes  # noqa: E402
from jax_amem.vllm.trainer import VllmEngine  # noqa: E402
from jax_amem.vllm.transports import _TorchStaging  # noqa: E402
from jax_amem_core import answers  # noqa: E402
import vllm_models as vm  # noqa: E402

TP = 2


def split_axis(name: str):
    """The axis vLLM splits over tensor-parallel ranks (column-parallel rows, row-parallel
    columns, experts' intermediate axis, vocabulary rows), None when every rank holds it whole."""
    for suffix, axis in (("qkv_proj.weight", 0), ("qkv_proj.bias", 0), ("gate_up_proj.weight", 0),
                         ("o_proj.weight", 1), ("down_proj.weight", 1), ("w13_weight", 1), ("w2_weight", 2),
                         ("embed_tokens.weight", 0), ("lm_head.weight", 0)):
        if name.endswith(suffix):
            return axis
    return None


def expected(tree, name: str, rank: int, tp: int = TP) -> np.ndarray:
    """Rank `rank`'s slice of vLLM's tensor `name`, cut by hand from the Flax-style tree. Where
    tp exceeds the KV heads, each rank holds KV head rank // (tp // KV) (vLLM's
    QKVParallelLinear: num_kv_head_replicas)."""
    def block(a, axis, parts=tp, index=rank):
        n = a.shape[axis] // parts
        return np.take(a, range(index * n, (index + 1) * n), axis=axis)

    def kv_block(a):
        return block(a, 0, min(tp, vm.KV), rank // max(1, tp // vm.KV))
    if name == "model.embed_tokens.weight":
        return block(tree["embed"]["embedding"], 0)
    if name == "lm_head.weight":
        return block(tree["lm_head"]["kernel"].T, 0)
    if name == "model.norm.weight":
        return tree["final_norm"]["scale"]
    i, leaf = int(name.split(".")[2]), name.split(".", 3)[3]
    lay = tree["layers"]
    t = lambda a: a[i].T  # noqa: E731 - (in, out) kernels -> vLLM's (out, in)
    experts = lambda x: lay["moe"]["experts"][x]["kernel"][i].transpose(0, 2, 1)  # noqa: E731 - (E, out, in)
    return {
        "input_layernorm.weight": lambda: lay["input_norm"]["scale"][i],
        "post_attention_layernorm.weight": lambda: lay["post_attn_norm"]["scale"][i],
        "self_attn.q_norm.weight": lambda: lay["attn"]["q_norm"]["scale"][i],
        "self_attn.k_norm.weight": lambda: lay["attn"]["k_norm"]["scale"][i],
        "self_attn.qkv_proj.weight": lambda: np.concatenate([block(t(lay["attn"]["q"]["kernel"]), 0)]
                                                            + [kv_block(t(lay["attn"][x]["kernel"])) for x in "kv"]),
        "self_attn.qkv_proj.bias": lambda: np.concatenate([block(lay["attn"]["q"]["bias"][i], 0)]
                                                          + [kv_block(lay["attn"][x]["bias"][i]) for x in "kv"]),
        "self_attn.o_proj.weight": lambda: block(t(lay["attn"]["o"]["kernel"]), 1),
        "mlp.gate_up_proj.weight": lambda: np.concatenate([block(t(lay["mlp"][x]["kernel"]), 0) for x in ("gate", "up")]),
        "mlp.down_proj.weight": lambda: block(t(lay["mlp"]["down"]["kernel"]), 1),
        "mlp.gate.weight": lambda: t(lay["moe"]["router"]["kernel"]),
        "mlp.experts.w13_weight": lambda: np.concatenate([block(experts("gate"), 1), block(experts("up"), 1)], axis=1),
        "mlp.experts.w2_weight": lambda: block(experts("down"), 2),
    }[leaf]()


def notes(family: str, source: str, params, loaded=lambda name, shape: shape, tp: int = TP) -> list[dict]:
    """Each rank's note as the worker half writes it for the family's preset: vLLM's names grouped
    per layer, the rank's loaded shapes, places in one staging buffer."""
    rules = jax_amem.rules.preset(family, params, source=source, layout="vllm", tp=tp, tie_embeddings=vm.tied(family),
                                  head_dim=vm.HD)
    return notes_for(rules, jax_amem.reshard.layouts_of(params), tp, vm.HD, loaded)


def notes_for(rules, sources, tp: int, head_dim: int, loaded=lambda name, shape: shape) -> list[dict]:
    """Each rank's note for the tensors `rules` (Rules or Pieces) write."""
    out = []
    for rank in range(tp):
        groups: dict[str, list] = {}
        for name, whole in whole_shapes(rules, sources).items():
            axis = split_axis(name)
            shape = list(whole) if axis is None else [n // tp if a == axis else n for a, n in enumerate(whole)]
            shape = list(loaded(name, shape))
            key = name.split(".")[2] if ".layers." in name else name
            groups.setdefault(key, []).append({"name": name, "shape": shape, "loaded": shape,
                                               "dtype": "float32", "offset": 0})
        for group in groups.values():
            offset = 0
            for t in group:
                t["offset"] = offset
                offset += -(-int(np.prod(t["shape"])) * 4 // 64) * 64
        out.append({"tp_size": tp, "tp_rank": rank, "pid": 0, "head_dim": head_dim, "groups": list(groups.values()),
                    "staging_bytes": max(sum(-(-int(np.prod(t["shape"])) * 4 // 64) * 64 for t in g)
                                         for g in groups.values())})
    return out


class Rank(_TorchStaging):
    """A rank's staging buffer in this process; `held` is what the rank committed."""

    kind = "local"

    def __init__(self, note):
        super().__init__(note, torch.zeros(note["staging_bytes"], dtype=torch.uint8))
        self.held = {}


class Commits:
    """The engine's side of the protocol: update_weights copies each rank's staged groups."""

    def __init__(self, ranks):
        self.ranks = ranks

    def collective_rpc(self, method, timeout=None, kwargs=None):
        if not isinstance(method, str):   # as vLLM's encoder into an engine core of its own process
            raise TypeError(f"Object of type {type(method)} is not serializable")
        if method == answers.METHOD:   # a question vLLM's workers answer (jax_amem_core.answers): no engine here
            return [answers.answer(None, **kwargs) for _ in self.ranks]
        if method == "update_weights":
            info = kwargs["update_info"]
            groups = tuple(info["groups"]) if "groups" in info else (info["group"],)
            for rank in self.ranks:
                rank.held.update({n: t.clone() for n, t in rank.destination(groups).items()})

    def reset_prefix_cache(self):
        return True


@pytest.mark.parametrize("family, source", [("qwen3_moe", "flax"), ("llama", "flax"), ("qwen3", "maxtext"),
                                            ("qwen2", "flax")])
def test_each_rank_holds_its_own_slice(family, source):
    trees = [vm.flax_tree(family, seed) for seed in (3, 4)]
    shape_tree = (lambda t: t) if source == "flax" else vm.maxtext_tree
    params = [jax.tree.map(jnp.asarray, shape_tree(t)) for t in trees]
    ranks = [Rank(note) for note in notes(family, source, params[0])]
    engine = VllmEngine(Commits(ranks), ranks, params[0], family=family, source=source, rules=None, cast=None,
                        timeout=60)
    for version, tree in enumerate(trees):
        engine.update(params[version])
        for rank in ranks:
            assert rank.held.keys() == {t["name"] for g in rank.note["groups"] for t in g}
            for name, tensor in rank.held.items():
                assert np.array_equal(tensor.numpy(), expected(tree, name, rank.note["tp_rank"])), \
                    (version, rank.note["tp_rank"], name)


@pytest.mark.parametrize("family, source", [("llama", "flax"), ("qwen3", "maxtext")])
def test_ranks_beyond_the_kv_heads_each_hold_a_replicated_kv_head(family, source):
    """tp=4 over 2 KV heads: each rank's fused qkv holds its query head and KV head
    rank // 2, the engine's head size (the worker's note) splitting the flax naming's merged heads."""
    tp = 4
    tree = vm.flax_tree(family, 5)
    params = jax.tree.map(jnp.asarray, tree if source == "flax" else vm.maxtext_tree(tree))
    ranks = [Rank(note) for note in notes(family, source, params, tp=tp)]
    engine = VllmEngine(Commits(ranks), ranks, params, family=family, source=source, rules=None, cast=None,
                        timeout=60)
    engine.update(params)
    for rank in ranks:
        for name, tensor in rank.held.items():
            assert np.array_equal(tensor.numpy(), expected(tree, name, rank.note["tp_rank"], tp)), \
                (rank.note["tp_rank"], name)
    qkv = [r.held["model.layers.0.self_attn.qkv_proj.weight"].numpy() for r in ranks]
    q_rows = vm.H // tp * vm.HD
    assert np.array_equal(qkv[0][q_rows:], qkv[1][q_rows:]) and not np.array_equal(qkv[1][q_rows:], qkv[2][q_rows:])


def test_a_rank_shape_that_is_no_slice_is_refused_by_name():
    params = jax.tree.map(jnp.asarray, vm.flax_tree("llama", 3))
    third = lambda name, shape: [shape[0] // 3 * 2, *shape[1:]] if name.endswith("o_proj.weight") else shape  # noqa: E731
    ranks = [Rank(note) for note in notes("llama", "flax", params, third)]
    with pytest.raises(VllmPlanError, match=r"model.layers.0.self_attn.o_proj.weight.*rank 0 of 2 holds shape "
                                            r"\(84, 128\).*not a tensor-parallel slice"):
        VllmEngine(Commits(ranks), ranks, params, family="llama", source="flax", rules=None, cast=None, timeout=60)


def test_a_full_dev_shm_is_reported_to_a_trainer_in_another_process(tmp_path, monkeypatch):
    """The worker's staging file is reserved at init: with no room (injected ENOSPC) the worker
    keeps a private buffer (a trainer in its process still writes it) and no file; a trainer in
    another process gets VllmBackendError saying what to give the host."""
    import errno
    import os
    import socket

    from jax_amem.vllm import VllmBackendError
    from jax_amem.vllm.transports import open_rank
    from jax_amem_vllm import staging

    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(os, "posix_fallocate", full)
    buffer, place = staging.allocate(4096, torch.device("cpu"), str(tmp_path), "s", 0)
    assert buffer.numel() == 4096 and not buffer.any() and os.listdir(tmp_path) == []
    note = {"tp_rank": 0, "host": socket.gethostname(), "pid": os.getpid(), "staging": place,
            "staging_bytes": 4096, "groups": []}
    with pytest.raises(VllmBackendError, match=r"rank 0's worker could not share its staging buffer: .* has no room "
                                               r"for the 4096-byte staging buffer .*--shm-size"):
        open_rank(note)


def test_a_worker_this_trainer_cannot_reach_is_refused(tmp_path):
    """No note (a worker on another host, or without this host's /dev/shm), or a note from
    another host: VllmBackendError saying so, before anything is mapped."""
    from jax_amem.vllm import VllmBackendError
    from jax_amem.vllm.trainer import _notes
    from jax_amem.vllm.transports import open_rank

    with pytest.raises(VllmBackendError, match=r"rank 0's worker left no note at .*another host"):
        _notes(str(tmp_path), "nosuch", 1)
    note = {"tp_rank": 1, "host": "elsewhere", "pid": 1, "staging": {"kind": "cuda_ipc"}}
    with pytest.raises(VllmBackendError, match=r"rank 1's worker runs on host 'elsewhere'.*trainer's host only"):
        open_rank(note)
