"""Layouts of JAX parameter trees: one Layout per leaf, named by its path.

A leaf's layout comes from its sharding (Layout.from_sharding, in layout.py, which this
module imports and which imports nothing back).
"""

from __future__ import annotations

from typing import Any

from .layout import Layout, LayoutError


def tree_names(tree) -> dict[str, Any]:
    """Flattens a pytree into `{"a/b/0": leaf}` with '/'-joined keys (dict keys,
    attribute names, sequence indices). LayoutError where two leaves get one name (a key
    holding '/': `{"a/b": x, "a": {"b": y}}`): a name would stand for two tensors and the
    names would no longer line up with the leaves."""
    flat = flatten_with_path(tree)
    out = {_path_name(path): leaf for path, leaf in flat}
    if len(out) != len(flat):
        _refuse_collision(flat)
    return out


def flatten_with_path(tree, what: str = "tree") -> list:
    """`jax.tree_util.tree_flatten_with_path(tree)[0]`, with a LayoutError naming `what` and the
    keys where JAX cannot flatten it: a dict whose keys do not sort (0 and '0' side by side)."""
    import jax

    try:
        return jax.tree_util.tree_flatten_with_path(tree)[0]
    except (TypeError, ValueError) as error:
        raise LayoutError(unflattenable(tree, what, error)) from None


def unflattenable(tree, what: str, error: Exception) -> str:
    """Why JAX could not flatten `tree`: the first dict (by path) whose keys do not sort, else
    JAX's own words."""
    stack = [("", tree)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            try:
                sorted(node)
            except TypeError:
                kinds = sorted({type(k).__name__ for k in node})
                shown = ", ".join(repr(k) for k in list(node)[:6])
                return (f"the {what}'s dict at {path or 'its root'} has keys of types {' and '.join(kinds)} side by "
                        f"side ({shown}), which JAX cannot sort to flatten it: give every key of one dict the same "
                        "type (e.g. str(key) for each)")
            stack.extend((f"{path}[{k!r}]", v) for k, v in reversed(list(node.items())))
        elif isinstance(node, (list, tuple)):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(node))))
    return f"the {what} cannot be flattened as a pytree: {error}"


def _path_name(path) -> str:
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def _refuse_collision(flat) -> None:
    import jax

    seen = {}
    for path, _ in flat:
        name = _path_name(path)
        if name in seen:
            raise LayoutError(f"two tree leaves are both named {name!r} (paths {jax.tree_util.keystr(seen[name])} "
                              f"and {jax.tree_util.keystr(path)}): leaves are named by their keys joined with "
                              "'/', so a key must not hold '/' nor repeat another's text; rename one")
        seen[name] = path


def names_tree(flat: dict) -> dict:
    """The inverse of `tree_names` for nested dicts: `{"a/b": x}` -> `{"a": {"b": x}}`
    (e.g. a `{name: Layout}` mapping made a tree, for `rules.from_function`)."""
    if not hasattr(flat, "items"):
        raise LayoutError(f"names_tree: flat is {type(flat).__name__}: give a mapping of 'a/b' names to leaves")
    tree: dict = {}
    for path, leaf in flat.items():
        if not isinstance(path, str):
            raise LayoutError(f"names_tree: name {path!r} is {type(path).__name__}, not a str like 'a/b'")
        node = tree
        *parents, last = path.split("/")
        for key in parents:
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                raise LayoutError(f"names_tree: {path!r} lies under {key!r}, which is a leaf itself")
        if isinstance(node.get(last), dict):
            raise LayoutError(f"names_tree: {path!r} is a leaf and the parent of other names")
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


def nested_names_hint(missing, given) -> str:
    """A hint where the rules' names are a state dict's with '/' for '.': the conversion
    function returned a nested tree (a dict of dicts), whose leaves `tree_names` names by path."""
    present = set(given)
    slashed = [n for n in missing if "/" in n and n.replace("/", ".") in present]
    if not slashed:
        return ""
    return (f" The rules name {slashed[0]!r} where the destination is {slashed[0].replace('/', '.')!r}: the "
            "conversion function returned a nested tree (a dict of dicts), whose leaves are named by their path "
            "with '/'. Return a flat dict of state-dict names instead, e.g. "
            "{name.replace('/', '.'): x for name, x in jax_amem.reshard.tree_names(out).items()}")
