"""Layouts of JAX parameter trees: one Layout per leaf, named by its path.

A leaf's layout comes from its sharding (Layout.from_sharding, in layout.py, which this
module imports and which imports nothing back).
"""

from __future__ import annotations

from typing import Any

from .layout import Layout, LayoutError


def tree_names(tree) -> dict[str, Any]:
    """Flattens a pytree into `{"a/b/0": leaf}` with '/'-joined keys (dict keys,
    attribute names, sequence indices)."""
    import jax

    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
        parts = []
        for key in path:
            for attr in ("key", "name", "idx"):
                if hasattr(key, attr):
                    parts.append(str(getattr(key, attr)))
                    break
            else:
                parts.append(str(key))
        out["/".join(parts)] = leaf
    return out


def names_tree(flat: dict) -> dict:
    """The inverse of `tree_names` for nested dicts: `{"a/b": x}` -> `{"a": {"b": x}}`
    (e.g. a `{name: Layout}` mapping made a tree, for `rules.from_function`)."""
    tree: dict = {}
    for path, leaf in flat.items():
        node = tree
        *parents, last = path.split("/")
        for key in parents:
            node = node.setdefault(key, {})
        node[last] = leaf
    return tree


def layouts_of(tree) -> dict[str, Layout]:
    """`{name: Layout}` for a pytree of jax.Arrays (or ShapeDtypeStructs with a sharding)."""
    out = {}
    for name, leaf in tree_names(tree).items():
        if isinstance(leaf, Layout):
            out[name] = leaf
            continue
        sharding = getattr(leaf, "sharding", None)
        if sharding is None:
            raise LayoutError(f"tree leaf {name!r} has no sharding: give jax.Arrays, "
                              "ShapeDtypeStructs with a sharding, or Layouts")
        out[name] = Layout.from_sharding(sharding, leaf.shape, leaf.dtype)
    return out
