"""The views `to_torch` returns: PyTorch tensors over JAX's own memory that refuse in-place writes.

A jax.Array is immutable, and XLA may share its buffer with others (a cached constant, a donated
input): a write through a DLPack view changes values JAX believes fixed. PyTorch has no read-only
tensor, and `torch.inference_mode()` tensors are not one: PyTorch checks them after the kernel ran,
so `add_` on one writes the bytes and only then raises (tests/hostile/cases.py,
to_torch_inference_mode_alone_writes_then_refuses, shows it).
A `__torch_function__` subclass sees each call before it runs, so the write is refused with
nothing written. Results that alias the view (views, slices, `.detach()`, `.numpy()`) stay read
only; results in new memory (`.clone()`, `v + 1`, `copy.deepcopy`, a pickled or `torch.save`d view
loaded back) are ordinary tensors.

What it cannot stop: writes that bypass PyTorch's functions (the storage object's own methods, a
raw pointer, `torch.from_dlpack(view)` made into a new tensor).
"""

from __future__ import annotations

import functools

import numpy as np

from ..errors import ReadOnlyViewError

# Python's in-place operators, which PyTorch dispatches under their own names.
_INPLACE_OPERATORS = frozenset(f"__i{op}__" for op in (
    "add", "sub", "mul", "matmul", "truediv", "floordiv", "mod", "pow", "lshift", "rshift", "and", "or", "xor"))
# Trailing-underscore methods that change only the tensor object (its autograd flag), not memory.
_METADATA_ONLY = frozenset({"requires_grad_", "retain_grad", "share_memory_"})


def _written(func, args, kwargs) -> list:
    """The tensors `func(*args, **kwargs)` would write: `self` of an in-place method or operator
    (add_, __setitem__, __iadd__, F.relu(x, inplace=True)), and `out=`."""
    name = getattr(func, "__name__", "")
    targets = []
    in_place = (name == "__setitem__" or name in _INPLACE_OPERATORS or kwargs.get("inplace") is True
                or (name.endswith("_") and not name.endswith("__") and name not in _METADATA_ONLY))
    if in_place and args:
        targets.append(args[0])
    out = kwargs.get("out")
    if out is not None:
        targets.extend(out if isinstance(out, (tuple, list)) else [out])
    return targets


@functools.cache
def view_class():
    """The ReadOnlyView class, made on first use: PyTorch is imported only where to_torch runs."""
    import torch
    from torch._C import DisableTorchFunctionSubclass

    def _storage(tensor) -> tuple[int, int] | None:
        """(first address, bytes) of `tensor`'s storage; None where it has no plain storage (sparse, meta)."""
        try:
            with DisableTorchFunctionSubclass():
                storage = tensor.untyped_storage()
                return storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError):
            return None

    class ReadOnlyView(torch.Tensor):
        """A PyTorch view of a jax.Array's shard that refuses writes (ReadOnlyViewError)."""

        _jax_amem_name = "?"

        def __reduce_ex__(self, protocol):
            # A saved or pickled view is a copy of the values: it loads as an ordinary tensor.
            with DisableTorchFunctionSubclass():
                return self.as_subclass(torch.Tensor).__reduce_ex__(protocol)

        def __deepcopy__(self, memo):
            # A copy is memory of its own: an ordinary tensor.
            with DisableTorchFunctionSubclass():
                copied = memo[id(self)] = self.as_subclass(torch.Tensor).clone()
            return copied

        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            for target in _written(func, args, kwargs):
                if isinstance(target, ReadOnlyView):
                    raise ReadOnlyViewError(
                        f"{getattr(func, '__name__', func)} would write into to_torch's view of "
                        f"{target._jax_amem_name!r}: it is a jax.Array's own memory, and jax.Arrays are immutable. "
                        "Nothing was written. Write into a copy (view.clone()), or change the array in JAX "
                        "(x.at[...].set(...)).")
            with DisableTorchFunctionSubclass():
                result = func(*args, **kwargs)
            sources = [a for a in (*args, *kwargs.values()) if isinstance(a, ReadOnlyView)]
            return _keep_read_only(result, sources) if sources else result

    def _keep_read_only(result, sources):
        """Results that alias one of `sources` become read only again (views as ReadOnlyView, numpy
        arrays unwriteable); results in new memory are left as they are."""
        if isinstance(result, (tuple, list)) and not isinstance(result, torch.Size):
            items = [_keep_read_only(item, sources) for item in result]
            try:
                return type(result)(items)
            except TypeError:  # a NamedTuple takes its fields one by one
                return type(result)(*items)
        if isinstance(result, torch.Tensor) and not isinstance(result, ReadOnlyView):
            where = _storage(result)
            for source in sources:
                if where is not None and where[0] == (_storage(source) or (None,))[0]:
                    return mark(result, source._jax_amem_name)
        if isinstance(result, np.ndarray) and result.size:
            address = result.__array_interface__["data"][0]
            for source in sources:
                storage = _storage(source)
                if storage is not None and storage[0] <= address < storage[0] + storage[1]:
                    result.flags.writeable = False
        return result

    ReadOnlyView.__qualname__ = "ReadOnlyView"  # pickles by name: module __getattr__ below finds it
    return ReadOnlyView


def __getattr__(name: str):
    if name == "ReadOnlyView":
        return view_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def mark(tensor, name: str):
    """`tensor` (the same memory) as a ReadOnlyView of the array named `name`."""
    view = tensor.as_subclass(view_class())
    view._jax_amem_name = name
    return view
