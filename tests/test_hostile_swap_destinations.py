"""`jax_amem.swap` into destinations a rollout should not hand over: views of a larger tensor,
non-contiguous and expanded tensors, lazily conjugated or negated views, meta and sparse
tensors, zero-size tensors, NumPy arrays (read-only or not), and one tensor under two names
(the same storage, or overlapping views). Each is refused naming the destination and what to
give, with every byte of every destination kept; or, for one tensor under two names written
with the same values, written once."""

import numpy as np
import pytest

import jax.numpy as jnp

import jax_amem
from jax_amem.errors import SwapError
from jax_amem.reshard.rules import Rule

torch = pytest.importorskip("torch")

SRC = {"a": jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3),
       "b": 100 + jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)}


def _kept(storage_owner):
    """A function that checks `storage_owner` (the tensor whose storage the destinations view)
    still holds its bytes."""
    before = storage_owner.clone()
    return lambda: torch.equal(storage_owner, before)


@pytest.mark.parametrize("make,match", [
    (lambda base: base[:2, :3], r"destination 'a' is not contiguous \(strides \(6, 1\)\).*make the model's tensor "
                                r"contiguous"),
    (lambda base: base[:3, :2].T, r"destination 'a' is not contiguous \(strides \(1, 6\)\)"),
    (lambda base: base[:2, ::2], r"destination 'a' is not contiguous \(strides \(6, 2\)\)"),
    (lambda base: base[0, :3].expand(2, 3), r"destination 'a' is not contiguous \(strides \(0, 1\)\)"),
    (lambda base: base[:1, :3], r"destination 'a' of shape \(1, 3\)"),
])
def test_a_view_that_is_not_the_tensor_the_rule_writes_is_refused(make, match):
    base = torch.full((4, 6), -7.0)
    kept = _kept(base)
    with pytest.raises(SwapError, match=match):
        jax_amem.swap({"a": SRC["a"]}, {"a": make(base)})
    assert kept()


def test_a_contiguous_view_of_a_larger_tensor_is_written_in_place():
    base = torch.full((4, 3), -7.0)
    jax_amem.swap({"a": SRC["a"]}, {"a": base[1:3]})
    assert base[1:3].tolist() == np.asarray(SRC["a"]).tolist() and base[0].eq(-7).all() and base[3].eq(-7).all()


@pytest.mark.parametrize("make,match", [
    (lambda: torch.zeros(2, 3, dtype=torch.complex64).conj(), r"destination 'a' has its conjugate bit set"),
    (lambda: torch.zeros(2, 3)._neg_view(), r"destination 'a' has its negative bit set"),
    (lambda: torch.empty(2, 3, device="meta"), r"destination 'a' is on meta"),
    (lambda: torch.zeros(2, 3).to_sparse(), r"destination 'a' is a torch.sparse_coo tensor.*to_dense"),
    (lambda: torch.zeros(0, 3), r"destination 'a' of shape \(0, 3\): region \[0:2, 0:3\] \(from 'a'\) is outside"),
])
def test_tensors_the_swap_cannot_write_are_refused(make, match):
    with pytest.raises(SwapError, match=match):
        jax_amem.swap({"a": SRC["a"]}, {"a": make()})


def test_zero_size_sources_into_zero_size_tensors_is_nothing_to_do():
    dst = torch.zeros(0, 3)
    jax_amem.swap({"a": jnp.zeros((0, 3))}, {"a": dst})
    assert dst.shape == (0, 3)


@pytest.mark.parametrize("writable", [True, False])
def test_a_numpy_destination_is_refused_saying_what_to_give(writable):
    array = np.full((2, 3), -7.0, np.float32)
    array.setflags(write=writable)
    with pytest.raises(SwapError, match=r"destination 'a' is a ndarray, not a jax.Array: the swap writes jax.Arrays "
                                        r"\(donated\) or PyTorch tensors \(in place\); for a NumPy array give "
                                        r"torch.from_numpy\(array\) \(writable\)"):
        jax_amem.swap({"a": SRC["a"]}, {"a": array})
    assert (array == -7).all()


def test_a_numpy_source_is_refused_saying_what_to_give():
    with pytest.raises(SwapError, match=r"source 'a' is a ndarray, not a jax.Array: give jax.Arrays "
                                        r"\(jax.device_put\(x\) makes one\)"):
        jax_amem.swap({"a": np.asarray(SRC["a"])}, {"a": torch.zeros(2, 3)})


@pytest.mark.parametrize("second", [lambda t: t, lambda t: t.view(6).view(2, 3)])
def test_one_tensor_under_two_names_with_other_values_is_refused(second):
    shared = torch.full((2, 3), -7.0)
    with pytest.raises(SwapError, match=r"destinations 'a' and 'b' share memory: they are one tensor \(tied weights: "
                                        r"the same storage\), but the rules write different values into them"):
        jax_amem.swap(SRC, {"a": shared, "b": second(shared)})
    assert shared.eq(-7).all()


def test_overlapping_views_under_two_names_are_refused():
    base = torch.full((4, 3), -7.0)
    with pytest.raises(SwapError, match=r"destinations 'a' and 'b' share memory \(tied weights, or views of one "
                                        r"storage\?\)"):
        jax_amem.swap(SRC, {"a": base[:2], "b": base[1:3]}, rules=[Rule.copy("a"), Rule.copy("b", "a")])
    assert base.eq(-7).all()


def test_one_tensor_under_two_names_with_the_same_values_is_written_once():
    shared = torch.full((2, 3), -7.0)
    report = jax_amem.swap(SRC, {"a": shared, "b": shared}, rules=[Rule.copy("a"), Rule.copy("b", "a")])
    assert shared.tolist() == np.asarray(SRC["a"]).tolist() and report.buffers == 1
