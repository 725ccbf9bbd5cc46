"""The worker's model as the trainer must see it: every parameter in the form vLLM loads it
(before any processing), grouped per decoder layer, with a place in one staging buffer.

vLLM may transform a weight after loading (vLLM-CPU repacks every linear layer and leaves the
parameter empty, shape (0,)); the form the trainer writes is the one vLLM recorded before that
(`record_metadata_for_reloading`, kept in the reload machinery's per-layer info). Groups are
vLLM's own `layerwise_groups` (the embeddings, one per decoder layer, the head and final norm).
Consecutive groups are packed into batches of at most a byte budget (`pack`): a batch is staged
and committed at once, so an update costs one call into the workers per batch, not per group,
and the staging buffer is the largest batch (the largest group when the budget is 0), not the
model.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

ALIGN = 64  # bytes: each staged tensor starts on a cache line
# The staging budget when the trainer names none: near what a model's embedding group takes
# alone already (vocabulary x hidden: 297 MiB for Qwen3-0.6B in bf16), so the buffer, allocated
# after vLLM sized its KV cache, grows little beyond the largest group, while a small model's
# update is one or two batches.
DEFAULT_STAGING_BYTES = 512 << 20


@dataclass(frozen=True)
class Tensor:
    name: str              # vLLM's parameter name (model.named_parameters())
    shape: tuple[int, ...]  # as loaded, before processing
    dtype: str             # torch dtype name without "torch.", e.g. "float32"
    offset: int            # bytes into the staging buffer
    processed: bool        # written through vLLM's processing (its quant_method may change what is served)
    rows: int | None = None  # the leading rows the trainer writes (a padded vocabulary), else all


@dataclass
class Describe:
    """What `describe(model)` found: the wire description and the live objects behind it."""
    groups: list[list[Tensor]]
    staging_bytes: int
    # consecutive groups staged side by side and committed at once (none given: each group alone)
    batches: list[list[int]] = field(default_factory=list)
    # name -> (module, attribute) owning the parameter; processed modules by group
    owners: dict[str, tuple[torch.nn.Module, str]] = field(default_factory=dict)
    group_modules: list[list[torch.nn.Module]] = field(default_factory=list)
    # processed modules that hold a parameter of the group under another module (a tied head:
    # lm_head shares embed_tokens' weight): reprocessed with the group, {attribute: name}
    followers: dict[int, list[tuple[torch.nn.Module, dict[str, str]]]] = field(default_factory=dict)
    # attention layers of the group whose parameters vLLM derives after loading (`derived`):
    # their own processing runs again once the group's modules are committed
    derivers: dict[int, list[torch.nn.Module]] = field(default_factory=dict)

    def wire(self) -> list[list[dict]]:
        return [[{"name": t.name, "shape": list(visible_shape(t)), "loaded": list(t.shape), "dtype": t.dtype,
                  "offset": t.offset, "processed": t.processed} for t in group] for group in self.groups]

    def __post_init__(self):
        self.batches = self.batches or [[g] for g in range(len(self.groups))]


def staged_bytes(shape, dtype) -> int:
    """The bytes a tensor of `shape` and `dtype` (a torch dtype or its name, e.g. "bfloat16")
    takes in the staging buffer: its own, rounded up to ALIGN."""
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    nbytes = torch.Size(shape).numel() * dtype.itemsize  # (no tensor made per parameter)
    return -(-nbytes // ALIGN) * ALIGN


def pack(sizes: list[int], budget: int) -> tuple[list[list[int]], list[int], int]:
    """Consecutive groups of `sizes` bytes packed into batches of at most `budget` bytes (a group
    larger than the budget is a batch alone): the batches, each group's start in the staging
    buffer (groups of one batch side by side, every batch from 0) and the buffer's size (the
    largest batch)."""
    batches, starts, filled = [], [], 0
    for group, size in enumerate(sizes):
        if batches and filled + size <= budget:
            batches[-1].append(group)
        else:
            batches.append([group])
            filled = 0
        starts.append(filled)
        filled += size
    largest = max((sum(sizes[g] for g in batch) for batch in batches), default=0)
    return batches, starts, largest


def visible_shape(t: Tensor) -> tuple[int, ...]:
    """What the trainer writes: vLLM pads a vocabulary to a multiple of 64 rows and loads zeros
    into the padding; the trainer writes only the real rows, and the commit zeroes the padding
    rows of the staging buffer (which other groups share) before it copies them in."""
    return t.shape if t.rows is None else (t.rows, *t.shape[1:])


def vocabulary_rows(module: torch.nn.Module, shape: tuple[int, ...]) -> int | None:
    """The real rows of this rank's slice of a vocabulary-parallel embedding or head with
    padding, else None. vLLM pads the vocabulary, then splits it into equal slices: rank r holds
    padded rows [r * n, (r + 1) * n), of which the first `rows` are real (the rest, and every
    row of a slice past the vocabulary, are padding)."""
    indices = getattr(module, "shard_indices", None)
    if indices is None or not shape:
        return None
    rows = indices.org_vocab_end_index - indices.org_vocab_start_index
    return None if rows == shape[0] else rows


def recorded(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters as vLLM recorded them at load, before processing (meta tensors)."""
    from vllm.model_executor.model_loader.reload.layerwise import get_layerwise_info

    return get_layerwise_info(module).restore_metadata[0]


def loaded_form(module: torch.nn.Module, attr: str, param: torch.Tensor) -> tuple[tuple[int, ...], torch.dtype]:
    """Shape and dtype of `module.attr` as vLLM loads it (its recorded metadata), else as it is."""
    meta = recorded(module).get(attr)
    if meta is not None:
        return tuple(meta.shape), meta.dtype
    return tuple(param.shape), param.dtype


def derived(module: torch.nn.Module, attr: str) -> bool:
    """A parameter vLLM makes after loading from other modules' weights, not loaded itself: MLA
    attention's W_UK_T and W_UV, cut from kv_b_proj by the attention layer's
    `process_weights_after_loading`. Nothing stages it; that processing makes it again (as at
    load, and as vLLM's own reload does) once the tensors it reads are committed."""
    from .versions import is_deferred_attention_layer

    return is_deferred_attention_layer(module) and attr not in recorded(module)


def processed_module(module: torch.nn.Module) -> bool:
    """vLLM runs `quant_method.process_weights_after_loading` on it, and that processing may
    change what is served (CPU repacking, quantized kernels): it is written through that
    processing. A module whose processing leaves its parameters as loaded is copied into them,
    as a norm is."""
    method = getattr(module, "quant_method", None)
    return method is not None and not processing_is_identity(method)


def processing_is_identity(method) -> bool:
    """The unquantized linear and embedding methods off CPU and XPU: vLLM 0.32's
    `process_weights_after_loading` of both returns at once there (on CPU it repacks, on XPU it
    may re-lay a weight out), so the kernels read the parameters as loaded. Exact types only: a
    subclass may process."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.platforms import current_platform

    if current_platform.is_cpu() or current_platform.is_xpu():
        return False
    return type(method) in (UnquantizedLinearMethod, UnquantizedEmbeddingMethod)


def describe(model: torch.nn.Module, budget: int = 0) -> Describe:
    """The model's groups, packed into batches of at most `budget` staging bytes."""
    from .versions import layer_groups

    params = dict(model.named_parameters())           # tied parameters appear once
    owner_of: dict[int, list[tuple[str, torch.nn.Module, str]]] = {}
    for module_name, module in model.named_modules():
        for attr, param in module.named_parameters(recurse=False):
            owner_of.setdefault(id(param), []).append((module_name, module, attr))

    groups, owners, group_modules, followers, derivers = [], {}, [], {}, {}
    sizes = []
    for index, names in enumerate(layer_groups(list(params))):
        offset, group, modules = 0, [], []
        for name in names:
            module_name, module, attr = next(o for o in owner_of[id(params[name])]
                                             if f"{o[0]}.{o[2]}".lstrip(".") == name)
            if derived(module, attr):
                if module not in derivers.setdefault(index, []):
                    derivers[index].append(module)
                continue
            shape, dtype = loaded_form(module, attr, params[name])
            processed = processed_module(module) and attr in recorded(module)
            group.append(Tensor(name, shape, str(dtype).removeprefix("torch."), offset, processed,
                                vocabulary_rows(module, shape)))
            owners[name] = (module, attr)
            if processed and module not in modules:
                modules.append(module)
            for _, other, other_attr in owner_of[id(params[name])]:
                if other is not module and processed_module(other) and other_attr in recorded(other):
                    followers.setdefault(index, []).append((other, {other_attr: name}))
            offset += staged_bytes(shape, dtype)
        groups.append(group)
        group_modules.append(modules)
        sizes.append(offset)
    groups, batches, staging_bytes = packed(groups, sizes, budget)
    return Describe(groups, staging_bytes, batches, owners, group_modules, followers, derivers)


def packed(groups: list[list[Tensor]], sizes: list[int], budget: int):
    """Groups whose tensors' offsets are from their group's start, `sizes` bytes each, packed into
    batches of at most `budget` (`pack`): the groups with each offset moved to its place in the
    staging buffer, the batches and the buffer's size."""
    batches, starts, largest = pack(sizes, budget)
    groups = [[dataclasses.replace(t, offset=t.offset + start) for t in group] for group, start in zip(groups, starts)]
    return groups, batches, largest


def repacked(layout: Describe, stages) -> Describe:
    """`layout` with only the tensors `stages(t)` holds for taking staging bytes (the others are
    written in place, in_place.py), its groups packed again into batches of at most the buffer
    it has (`layout.staging_bytes`: no group needs more than before, so the buffer still holds
    every batch). Written in place, a model's whole update is one batch, one swap and one call
    into the worker. A tensor that takes no bytes keeps an offset where it would start: it must
    never be staged (the worker checks, `staged`)."""
    groups, sizes = [], []
    for group in layout.groups:
        offset, out = 0, []
        for t in group:
            out.append(dataclasses.replace(t, offset=offset))
            if stages(t):
                offset += staged_bytes(t.shape, t.dtype)
        groups.append(out)
        sizes.append(offset)
    groups, batches, largest = packed(groups, sizes, layout.staging_bytes)
    return dataclasses.replace(layout, groups=groups, staging_bytes=largest, batches=batches)
