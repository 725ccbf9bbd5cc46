"""The real-size vLLM demo's engine check (jax_amem/demo/real_size/vllm_engine.py) against a
stand-in engine: the trainer's tensors in vLLM's fused layout, cast by numpy, compared bit for
bit; a changed bit, a missing parameter and vLLM-CPU's emptied linear weights each reported."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the demo needs the demo extra")
pytest.importorskip("flax", reason="the demo needs the demo extra")

from jax_amem.demo.real_size import presets, vllm_engine  # noqa: E402
from jax_amem.demo.policy import init_params  # noqa: E402

POLICY = presets.QWEN3_TINY.policy


class StandIn:
    """collective_rpc(read_parameters) over a dict of torch tensors, as an engine's worker answers."""

    def __init__(self, tensors):
        self.tensors = tensors

    def collective_rpc(self, method, args=()):
        worker = type("Worker", (), {})()
        model = torch.nn.Module()
        for i, (name, value) in enumerate(self.tensors.items()):
            model.register_parameter(f"p{i}", torch.nn.Parameter(value, requires_grad=False))
        names = {f"p{i}": name for i, name in enumerate(self.tensors)}
        model.named_parameters = lambda: ((names[n], p) for n, p in torch.nn.Module.named_parameters(model))
        worker.model_runner = type("Runner", (), {"get_model": lambda self: model})()
        return [method(worker, *args)]


@pytest.fixture(scope="module")
def expected():
    params = init_params(POLICY, 0, None)
    return vllm_engine.expected_tensors(params, POLICY)


def engine_tensors(expected, padded_rows=32):
    out = {name: torch.from_numpy(value.copy()).to(torch.bfloat16) for name, value in expected.items()}
    embed = out["model.embed_tokens.weight"]   # vLLM pads the vocabulary to a multiple of 64
    out["model.embed_tokens.weight"] = torch.cat([embed, torch.zeros(padded_rows, embed.shape[1], dtype=embed.dtype)])
    return out


def test_the_expected_tensors_are_vllms_fused_layout(expected):
    d, hd = POLICY.hidden_size, POLICY.head_dim
    qkv = expected["model.layers.1.self_attn.qkv_proj.weight"]
    assert qkv.shape == ((POLICY.num_heads + 2 * POLICY.num_kv_heads) * hd, d)
    assert expected["model.layers.0.mlp.gate_up_proj.weight"].shape == (2 * POLICY.intermediate_size, d)
    assert sorted({name.split(".")[2] for name in expected if name.startswith("model.layers.")}) == ["0", "1"]


def test_an_engine_holding_the_cast_weights_passes(expected):
    check = vllm_engine.check(StandIn(engine_tensors(expected)), expected, 0)
    assert check.ok and len(check.compared) == len(expected) and check.dtype == "bfloat16"


def test_a_changed_bit_a_missing_parameter_and_emptied_linears_are_reported(expected):
    tensors = engine_tensors(expected)
    flipped = tensors["model.layers.0.self_attn.k_norm.weight"]
    flipped.view(torch.int16)[3] ^= 1
    del tensors["model.norm.weight"]
    tensors["model.layers.1.mlp.down_proj.weight"] = torch.empty(0, dtype=torch.bfloat16)
    check = vllm_engine.check(StandIn(tensors), expected, 0)
    assert not check.ok
    assert check.mismatched == ("model.norm.weight (not a parameter of the engine)",
                                "model.layers.0.self_attn.k_norm.weight")
    assert check.packed == ("model.layers.1.mlp.down_proj.weight",)
