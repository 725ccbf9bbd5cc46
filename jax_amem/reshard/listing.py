"""Names listed in an error: a few, a tensor of every layer said once with its layer count."""

from __future__ import annotations

import re

# A layer number in a rollout's dotted names: model.layers.3.mlp... or GPT-2's transformer.h.3.attn...
_LAYER = re.compile(r"(\.(?:layers|h)\.)\d+(\.)")


def few(names, layers: dict[str, int] | None = None, most: int = 6) -> str:
    """Up to `most` names, a tensor of every layer said once with its layer count, so a kind of
    tensor is named once however many layers hold it: per-layer names (`model.layers.0.mlp.x`,
    `model.layers.1.mlp.x`) as `model.layers.*.mlp.x (2 layers)`; a stacked leaf (a trainer
    tree's `layers/attn/q/bias`, every layer in one array) with the count `layers` gives it."""
    counts = layers or {}
    by_pattern: dict[str, list[str]] = {}
    for name in names:
        by_pattern.setdefault(_LAYER.sub(r"\1*\2", name), []).append(name)
    said = []
    for pattern, same in by_pattern.items():
        count = sum(counts.get(name, 1) for name in same)
        said.append(f"{pattern if len(same) > 1 else same[0]} ({count} layers)" if count > 1 else same[0])
    return ", ".join(said[:most]) + (" ..." if len(said) > most else "")
