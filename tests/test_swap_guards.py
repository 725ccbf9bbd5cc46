"""Bad and hostile destinations are refused before anything is
donated or written, and a swap into jax.Arrays that fails after it donated loses nothing.

JAX destinations: an array named twice (a tied weight), an array that is a source or shares a
source's buffers (`jax.device_put(params, shardings)`), a deleted shard, 1030 destinations with
one tied pair (1024 arrays were lost before), a zero-size array made by `jit` (a raw ValueError
after dispatch lost the other destinations), a later group failing after the first donated.
PyTorch destinations: conjugate / negative bits, autograd versions, views of JAX arrays,
sparse tensors, tensors as a list; the swap's own arguments; IPC descriptor fields.
"""

import os
import socket

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_amem
from jax_amem import reshard
from jax_amem.swapping import PartialSwapError, SwapError
from jax_amem.swapping.in_process import routes, schedule
from jax_amem.swapping.same_host.ipc import parse_descriptor

torch = pytest.importorskip("torch")

MESH = Mesh(np.array(jax.devices("cpu")[:8]).reshape(2, 4), ("a", "b"))


@pytest.fixture(autouse=True)
def on_the_cpu():
    """Every array on JAX's CPU devices, beside the torch CPU tensors, on GPU machines too."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


def sharded(value, spec):
    return jax.device_put(value, NamedSharding(MESH, spec))


def values(tree):
    return {k: np.asarray(v) for k, v in tree.items()}


def assert_alive_and_unchanged(dst, before):
    assert not [k for k, v in dst.items() if v.is_deleted()], "a destination was deleted"
    for name, old in before.items():
        np.testing.assert_array_equal(np.asarray(dst[name]), old, err_msg=name)


# ----------------------------------------------------------------------------- JAX destinations


def test_an_array_named_twice_is_refused_before_anything_is_donated():
    src = {"a": jnp.ones(4), "b": jnp.full(4, 2.0)}
    tied = jnp.zeros(4)
    with pytest.raises(SwapError, match=r"destinations 'a' and 'b' are the same jax.Array \(tied weights\?\)"):
        jax_amem.swap(src, {"a": tied, "b": tied})
    assert not tied.is_deleted() and float(tied.sum()) == 0


def test_1030_destinations_with_one_tied_pair_lose_nothing():
    """Two groups (1024 buffers each at most): the first used to be donated before the second
    failed inside XLA, and its 1024 arrays were gone."""
    n = 1030
    src = {f"p{i:04d}": jnp.full(2, float(i)) for i in range(n)}
    dst = {f"p{i:04d}": jnp.zeros(2) for i in range(n - 1)}
    dst[f"p{n - 1:04d}"] = dst["p0000"]
    before = values(dst)
    with pytest.raises(SwapError, match=r"'p0000' and 'p1029' are the same jax.Array"):
        jax_amem.swap(src, dst)
    assert_alive_and_unchanged(dst, before)


def test_a_destination_that_is_a_source_or_shares_its_buffers_is_refused():
    src = {"w": sharded(jnp.arange(32.0).reshape(4, 8), P("a", "b")), "b": sharded(jnp.arange(8.0), P())}
    with pytest.raises(SwapError, match=r"destination 'w' is source 'w' itself"):
        jax_amem.swap(src, {"w": src["w"], "b": jnp.zeros(8)})
    # device_put to an equivalent sharding on another mesh: a new jax.Array over the same buffers
    other = Mesh(MESH.devices, ("x", "y"))
    rollout = jax.device_put(src, {"w": NamedSharding(other, P("x", "y")), "b": NamedSharding(other, P())})
    assert rollout["w"] is not src["w"]
    with pytest.raises(SwapError, match=r"destination '(w|b)' shares a buffer with source '(w|b)'.*may_alias=False"):
        jax_amem.swap(src, rollout)
    assert not any(a.is_deleted() for a in [*src.values(), *rollout.values()])
    np.testing.assert_array_equal(np.asarray(src["w"]), np.arange(32.0).reshape(4, 8))
    # one replica of a replicated source, put on one device: the same buffer again
    single = {"w": jnp.zeros((4, 8)), "b": jax.device_put(src["b"], jax.devices("cpu")[0])}
    with pytest.raises(SwapError, match=r"destination 'b' shares a buffer with source 'b'"):
        jax_amem.swap(src, single)
    # and two destinations over one buffer, neither a source
    x = sharded(jnp.zeros(8), P("b"))
    y = jax.device_put(x, NamedSharding(other, P("y")))
    with pytest.raises(SwapError, match=r"destinations '(a|c)' and '(a|c)' share a buffer"):
        jax_amem.swap({"a": jnp.ones(8), "c": jnp.ones(8)}, {"a": x, "c": y})
    assert not x.is_deleted() and not y.is_deleted()


def test_a_destination_with_a_deleted_shard_is_refused():
    x = sharded(jnp.zeros(8), P("b"))
    x.addressable_shards[1].data.delete()
    with pytest.raises(SwapError, match=r"'x'.*(deleted|donated)"):
        jax_amem.swap({"x": jnp.ones(8)}, {"x": x})


def test_a_zero_size_destination_made_by_jit_keeps_every_other_destination():
    """jit gives a (0, 4) array sharded over its second axis per-device buffers of (0, 4), not
    (0, 1): assembling it raised after dispatch, and 18-19 of 20 destinations were lost."""
    src = {f"p{i:02d}": jnp.full((4, 4), float(i)) for i in range(19)}
    src["z"] = jnp.zeros((0, 4))
    dst = {f"p{i:02d}": sharded(jnp.zeros((4, 4)), P(None, "b")) for i in range(19)}
    dst["z"] = jax.jit(lambda: jnp.zeros((0, 4)), out_shardings=NamedSharding(MESH, P(None, "b")))()
    assert dst["z"].addressable_shards[0].data.shape == (0, 4)  # the premise
    new = jax_amem.swap(src, dst).dst
    for i in range(19):
        np.testing.assert_array_equal(np.asarray(new[f"p{i:02d}"]), np.full((4, 4), float(i)))
        assert new[f"p{i:02d}"].sharding == dst[f"p{i:02d}"].sharding
    assert new["z"].shape == (0, 4) and not new["z"].is_deleted()


def test_a_group_failing_after_the_first_was_donated_hands_every_array_back(monkeypatch):
    """The safety net behind the checks: whatever fails after a donation (a compile or device
    error in a later group), error.dst holds every destination, alive."""
    monkeypatch.setattr(schedule, "GROUP_BUFFERS", 4)
    jax_amem.swapping.forget()
    src = {f"p{i}": sharded(jnp.full(8, float(i + 1)), P("b")) for i in range(12)}
    # p0, p1 sharded over the 8 devices (one shard per device group), p2.. on device 0 (its groups)
    dst = {f"p{i}": sharded(jnp.zeros(8), P("a")) if i < 2 else jnp.zeros(8) for i in range(12)}
    real = routes._batched
    made = []

    def failing_third_group(chunks, views):
        fn = real(chunks, views)
        made.append(fn)
        if len(made) != 3:
            return fn

        def fail(*args):
            raise RuntimeError("injected: RESOURCE_EXHAUSTED while compiling the third group")
        return fail

    monkeypatch.setattr(routes, "_batched", failing_third_group)
    match = r"after 8 of 26 buffers were donated.*\(6 arrays in full\).*injected"
    with pytest.raises(PartialSwapError, match=match) as caught:
        jax_amem.swap(src, dst)
    error = caught.value
    assert isinstance(error.__cause__, RuntimeError)
    assert not any(a.is_deleted() for a in error.dst.values())
    got = values(error.dst)
    # device 0 ran 2 groups of 4 buffers: p0 and p1 (one shard each) in part, 6 arrays in full
    assert len(error.written) == 6 and not {"p0", "p1"} & set(error.written)
    for name, value in got.items():
        want = np.full(8, float(int(name[1:]) + 1)) if name in error.written else None
        if want is not None:
            np.testing.assert_array_equal(value, want)
        else:  # partly written (some devices' shards) or untouched: every byte old or new
            assert set(np.unique(value)) <= {0.0, float(int(name[1:]) + 1)}
    assert error.dst["p0"].sharding == dst["p0"].sharding and set(np.unique(got["p0"])) == {0.0, 1.0}
    jax_amem.swapping.forget()


# ----------------------------------------------------------------------------- PyTorch destinations


def torch_swap_fails(dst, match, src=None, **kwargs):
    before = {k: v.detach().clone() for k, v in dst.items() if torch.is_tensor(v) and v.layout == torch.strided}
    with pytest.raises(SwapError, match=match):
        jax_amem.swap(src or {"w": jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)}, dst, **kwargs)
    for name, old in before.items():
        assert torch.equal(dst[name].resolve_conj().resolve_neg(), old.resolve_conj().resolve_neg()), name


def test_conjugate_and_negative_views_are_refused():
    src = {"w": jnp.full((2, 3), 1 + 2j, jnp.complex64)}
    conj = torch.zeros(2, 3, dtype=torch.complex64).conj()
    torch_swap_fails({"w": conj}, r"destination 'w' has its conjugate bit set.*resolve_conj", src=src)
    torch_swap_fails({"w": torch._neg_view(torch.zeros(2, 3))}, r"destination 'w' has its negative bit set")
    # a plain tensor at the same address is fine afterwards (the program cache does not let a view through)
    plain = torch.zeros(2, 3)
    jax_amem.swap({"w": jnp.ones((2, 3))}, {"w": plain})
    with pytest.raises(SwapError, match="negative bit"):
        jax_amem.swap({"w": jnp.ones((2, 3))}, {"w": torch._neg_view(plain)})


def test_a_swap_bumps_autograd_versions_as_copy_does():
    w = torch.zeros(2, 3, requires_grad=True)
    x = torch.ones(3, requires_grad=True)
    loss = (w * x).sum()  # saves w for x's gradient
    version = w._version
    jax_amem.swap({"w": jnp.ones((2, 3))}, dict(w=w))
    assert w._version > version
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


def test_a_view_of_a_jax_array_is_refused_as_a_destination():
    target = jnp.zeros((2, 3))
    view = jax_amem.to_torch({"w": target})["w"][0].tensor
    torch_swap_fails({"w": view}, r"destination 'w' is memory of a live jax.Array.*read only")
    np.testing.assert_array_equal(np.asarray(target), np.zeros((2, 3)))


def test_sparse_tensors_and_tensors_as_a_list_are_refused():
    torch_swap_fails({"w": torch.zeros(2, 3).to_sparse()}, r"destination 'w' is a torch.sparse_coo tensor")
    with pytest.raises(SwapError, match=r"destination is a list of 1 torch tensors: give them by name"):
        jax_amem.swap({"w": jnp.ones((2, 3))}, [torch.zeros(2, 3)])


@pytest.mark.parametrize("kwargs, match", [
    ({"plan": "hello"}, r"plan= must be a jax_amem.reshard.Plan.*str 'hello'"),
    ({"rules": ["hello"]}, r"rules\[0\] is str 'hello', not a jax_amem.reshard Rule or Piece"),
    ({"rules": "hello"}, r"rules= must be a list of jax_amem.reshard rules.*str 'hello'"),
    ({"verify": "yes"}, r"verify= must be True or False, got str 'yes'"),
    ({"progress": 3}, r"progress= must be True or False or None \(auto\), got int 3"),
])
def test_the_swaps_arguments_are_named(kwargs, match):
    torch_swap_fails({"w": torch.zeros(2, 3)}, match, **kwargs)


def test_rules_given_as_a_generator_are_read_once():
    dst = {"w": torch.zeros(2, 3)}
    jax_amem.swap({"w": jnp.ones((2, 3))}, dst, rules=(r for r in [reshard.Rule.copy("w")]))
    assert torch.equal(dst["w"], torch.ones(2, 3))


# ----------------------------------------------------------------------------- IPC descriptors


def descriptor(**changes):
    entry = {"handle": os.urandom(64).hex(), "offset": 0, "nbytes": 24, "allocation_bytes": 512, "shape": [2, 3],
             "dtype": "float32", "device": 0, "pci_bus_id": "0000:00:00.0", **changes}
    return {"format": 1, "host": socket.gethostname(), "pid": os.getppid(), "tensors": {"w": entry}}


@pytest.mark.parametrize("changes, match", [
    ({"shape": None}, r"entry 'w': shape is NoneType None, not a list of ints"),
    ({"shape": [2, 3.5]}, r"entry 'w': shape\[1\] is float 3.5, not an int"),
    ({"allocation_bytes": "lots"}, r"entry 'w': allocation_bytes is str 'lots', not an int"),
    ({"offset": None}, r"entry 'w': offset is NoneType None, not an int"),
    ({"nbytes": 24.0}, r"entry 'w': nbytes is float 24.0, not an int"),
    ({"device": "0"}, r"entry 'w': device is str '0', not an int"),
    ({"dtype": None}, r"entry 'w' has dtype None, which JAX does not know"),
])
def test_descriptor_fields_of_the_wrong_kind_are_named(changes, match):
    parse_descriptor(descriptor())  # the unchanged one parses
    with pytest.raises(SwapError, match=match):
        parse_descriptor(descriptor(**changes))


def test_partial_swap_errors_do_not_share_their_fields_and_survive_pickling():
    """PartialSwapError is public: made by hand (as a user's own wrapper may), each error has its own
    `written` and `shards` (they were class-level [] and {}, shared by every error), and a pickled
    one keeps its message and fields (errors cross process pools)."""
    import pickle

    first, second = PartialSwapError("first"), PartialSwapError("second")
    first.written.append("w")
    first.shards["k"] = 1
    assert second.written == [] and second.shards == {} and second.dst is None
    assert isinstance(first, SwapError) and str(first) == "first"
    made = PartialSwapError("m", dst={"w": 1}, written=["w"], shards={("w", 0): 2})
    back = pickle.loads(pickle.dumps(made))
    assert (str(back), back.dst, back.written, back.shards) == ("m", {"w": 1}, ["w"], {("w", 0): 2})
