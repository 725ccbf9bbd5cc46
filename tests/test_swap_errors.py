"""Bad input to the swap: a clear SwapError naming the tensor, and the destination untouched
(every check runs before any byte moves). Also: batching, progress bar, caches after errors."""

import numpy as np
import pytest

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import jax_amem
from jax_amem import reshard
from jax_amem.reshard import Layout, Owner
from jax_amem.swapping import SwapError
from jax_amem.swapping.in_process import schedule

torch = pytest.importorskip("torch")

MESH = Mesh(np.array(jax.devices("cpu")[:8]).reshape(2, 4), ("fsdp", "tp"))  # cpu: collected on GPU machines too
CPU0 = Owner(jax.process_index(), jax.devices("cpu")[0].id)  # where JAX sees torch's CPU tensors


def sources():
    return {"w": jax.device_put(jnp.arange(48, dtype=jnp.float32).reshape(8, 6), NamedSharding(MESH, P("fsdp"))),
            "b": jax.device_put(jnp.arange(8, dtype=jnp.float32), NamedSharding(MESH, P("tp")))}


def sentinel(*shape, dtype=torch.float32):
    return torch.full(shape, 7, dtype=dtype)


def good_destination():
    return {"w": sentinel(8, 6), "b": sentinel(8)}


def snapshot(dst):
    return {k: v.detach().clone() for k, v in dst.items() if torch.is_tensor(v) and v.untyped_storage().nbytes()}


def assert_untouched(dst, before):
    for name, old in before.items():
        assert torch.equal(dst[name], old), f"{name} changed"


def swap_fails(dst, match, **kwargs):
    before = snapshot(dst)
    with pytest.raises(SwapError, match=match):
        jax_amem.swap(kwargs.pop("src", None) or sources(), dst, **kwargs)
    assert_untouched(dst, before)


def test_wrong_shape_names_the_tensor():
    swap_fails({"w": sentinel(6, 8), "b": sentinel(8)}, r"destination 'w' of shape \(6, 8\).*does not fit")


def test_wrong_dtype_names_the_tensor():
    swap_fails({"w": sentinel(8, 6), "b": sentinel(8, dtype=torch.float16)}, r"'b'.*dtype mismatch.*float16")


def test_missing_and_extra_names_are_all_listed():
    swap_fails({"w": sentinel(8, 6)}, r"missing 1 destination\(s\).*'b'")
    swap_fails({**good_destination(), "z": sentinel(3), "y": sentinel(1)}, r"2 destination\(s\) that nothing writes .*: 'z', 'y'")
    rules = [reshard.Rule.copy("w"), reshard.Rule.copy("b"), reshard.Rule.copy("c", "b")]
    swap_fails(good_destination(), r"missing 1 destination\(s\) that the rules write: 'c'", rules=rules)


def test_a_destination_on_another_device_than_the_plan_says():
    src = sources()
    elsewhere = Owner(CPU0.process, jax.devices()[3].id)
    plan = reshard.plan(src, {"w": Layout.single((8, 6), np.float32, elsewhere),
                              "b": Layout.single((8,), np.float32, CPU0)})
    swap_fails(good_destination(), rf"destination 'w' is on cpu \(owner \(0, 0\)\), but the plan puts it on "
               rf"owner\(s\) \[\(0, {elsewhere.device}\)\]", src=src, plan=plan)
    # the same for a JAX destination on device 2 when the plan says device 3
    dst = {"w": jax.device_put(jnp.zeros((8, 6)), jax.devices()[2]), "b": jax.device_put(jnp.zeros(8), jax.devices()[0])}
    with pytest.raises(SwapError, match=r"destination 'w' is sharded over devices \[2\].*owners \[\(0, 3\)\]"):
        jax_amem.swap(src, dst, plan=plan)
    assert not any(a.is_deleted() for a in dst.values()) and float(dst["w"].sum()) == 0


def test_a_deleted_jax_destination_or_source():
    dst = {"w": jax.device_put(jnp.full((8, 6), 7.0), NamedSharding(MESH, P())),
           "b": jax.device_put(jnp.full(8, 7.0), NamedSharding(MESH, P()))}
    dst["b"].delete()
    with pytest.raises(SwapError, match=r"destination 'b' was deleted"):
        jax_amem.swap(sources(), dst)
    assert not dst["w"].is_deleted() and np.all(np.asarray(dst["w"]) == 7)
    src = sources()
    src["w"].delete()
    swap_fails(good_destination(), r"source 'w' was deleted", src=src)


def test_freed_non_contiguous_and_shared_torch_destinations():
    freed = good_destination()
    freed["b"].untyped_storage().resize_(0)  # what FSDP or an offload does to a parameter
    swap_fails(freed, r"destination 'b': its storage holds 0 bytes")
    swap_fails({"w": sentinel(6, 8).T, "b": sentinel(8)}, r"destination 'w' is not contiguous")
    shared = sentinel(8)  # one tensor under two names, written with different values: refused
    reversed_b = reshard.rules.from_function(lambda p: {"w": p["w"], "b": p["b"], "c": p["b"][::-1]}, sources())
    swap_fails({"w": sentinel(8, 6), "b": shared, "c": shared}, r"destinations 'b' and 'c' share memory: they are "
               r"one tensor \(tied weights.*write different values", rules=reversed_b)


def test_a_destination_freed_after_its_program_was_cached():
    dst = good_destination()
    jax_amem.swap(sources(), dst)  # plan and program cached for these signatures
    dst["w"].untyped_storage().resize_(0)
    swap_fails(dst, r"destination 'w': its storage holds 0 bytes")


def test_plans_that_do_not_fit_the_inputs():
    src = sources()
    other = {"w": jax.device_put(np.zeros((8, 6), np.float32), NamedSharding(MESH, P(None, "fsdp"))), "b": src["b"]}
    plan = reshard.plan(other, {k: Layout.single(v.shape, np.float32, CPU0) for k, v in src.items()})
    swap_fails(good_destination(), r"source 'w' .* is not laid out as the plan says", src=src, plan=plan)
    swap_fails(good_destination(), r"give rules or plan, not both", src=src, plan=plan, rules=[])
    # A destination also held by another process: swap() refuses and names the transports that do it.
    two = Layout.from_boxes((8,), np.float32, {CPU0: ((0,), (8,)), (1, 0): ((0,), (8,))})
    plan = reshard.plan(src, {"w": Layout.single((8, 6), np.float32, CPU0), "b": two})
    swap_fails(good_destination(), r"'b'.*from process 0 to process 1, which swap\(\) does not do in process: .*open_remote.*cross_host",
               src=src, plan=plan)
    swap_fails(good_destination(), r"version must be a non-negative int", version=-1)
    swap_fails({"w": sentinel(8, 6), "b": np.zeros(8, np.float32)}, r"destination 'b' is a ndarray")


def test_after_errors_a_good_swap_still_works_and_many_tensors_share_one_call(capsys):
    src = {f"t{i}": jax.device_put(jnp.full((3, 5), float(i)), jax.devices()[0]) for i in range(200)}
    dst = {name: sentinel(3, 5) for name in src}
    with pytest.raises(SwapError):
        jax_amem.swap(src, {**dst, "t0": sentinel(5, 3)})
    report = jax_amem.swap(src, dst, progress=False)
    assert report.calls == 1 and report.launches == 1 and report.buffers == 200  # one dispatch, one copy call
    assert all(torch.equal(t, torch.full((3, 5), float(i))) for i, t in enumerate(dst.values()))
    assert capsys.readouterr().err == ""


def test_progress_bar_on_request(monkeypatch, capsys):
    monkeypatch.setattr(schedule, "GROUP_BYTES", 64)  # one buffer per call: the bar has steps
    src = {f"p{i}": jax.device_put(jnp.full((4, 4), float(i)), jax.devices()[1]) for i in range(5)}
    dst = {name: sentinel(4, 4) for name in src}
    report = jax_amem.swap(src, dst, progress=True)
    assert report.calls == 5 and "swap" in capsys.readouterr().err
    assert str(report).startswith(f"swap v{report.version}: ")


def test_a_storage_shrunk_in_place_after_its_program_was_cached():
    """FSDP-style: the storage freed (resize_(0)) and re-allocated smaller, where the allocator
    hands back the same address. The cached program's key (address, shape, dtype, strides) still
    matches; without the storage's size in the key it wrote the old 64 KiB into 32 KiB."""
    dst = {"w": torch.zeros(16384)}
    src = {"w": jax.device_put(jnp.arange(16384, dtype=jnp.float32), jax.devices("cpu")[0])}
    jax_amem.swap(src, dst)
    storage = dst["w"].untyped_storage()
    storage.resize_(0)
    storage.resize_(32768)  # the same address on glibc's malloc (and on PyTorch's caching allocator)
    before = bytes(storage)
    with pytest.raises(SwapError, match=r"destination 'w': its storage holds 32768 bytes"):
        jax_amem.swap(src, dst)
    assert bytes(storage) == before


def test_views_that_overlap_part_of_each_other_are_refused():
    """Two destinations writing the same bytes race on the GPU; a partial overlap is refused
    like a tied weight, before anything moves."""
    base = torch.full((12,), 7.0)
    src = {"a": jnp.arange(8, dtype=jnp.float32), "b": jnp.arange(8, dtype=jnp.float32) + 100}
    with pytest.raises(SwapError, match=r"destinations 'a' and 'b' share memory"):
        jax_amem.swap(src, {"a": base[0:8], "b": base[4:12]})
    assert torch.equal(base, torch.full((12,), 7.0))
    jax_amem.swap(src, {"a": base[0:4].clone().resize_(8), "b": base[4:12]})  # adjacent views: fine
    assert base[4:12].tolist() == list(range(100, 108))


def test_an_error_after_the_first_group_waits_for_what_was_dispatched(monkeypatch):
    """A group that fails to dispatch (out of memory for its temporaries, say) must not let the
    error leave while the earlier groups still write the tensors: the caller frees or reads them
    next, and over IPC the rollout is told the swap is over."""
    from jax_amem.swapping.in_process import executor
    from jax_amem.swapping.in_process.run import Sources, _how, prepare
    from jax_amem.swapping.destinations import describe

    from jax_amem.swapping.in_process import direct
    monkeypatch.setattr(direct, "ENABLED", False)  # the XLA calls (test_swap_direct.py: the direct launch's)
    monkeypatch.setattr(schedule, "ADDRESS_GROUP_BUFFERS", 1)  # one buffer per group
    src = {f"p{i}": jnp.full((4, 4), float(i)) for i in range(3)}
    dst = {name: sentinel(4, 4) for name in src}
    jax_amem.swap(src, dst)
    compiled = prepare(Sources(src), describe(dst), None, None, _how(None, None))
    assert len(compiled.groups) == 3
    first = compiled.fns[0]
    dispatched, waited = [], []
    real_wait = jax.block_until_ready

    def fn_first(shards):
        dispatched.append(first(shards))
        return dispatched[-1]

    def fn_fails(shards):
        raise RuntimeError("RESOURCE_EXHAUSTED: out of memory (injected)")

    monkeypatch.setattr(compiled, "fns", [fn_first, fn_fails, *compiled.fns[2:]])
    monkeypatch.setattr(executor.jax, "block_until_ready", lambda x: waited.append(list(x)) or real_wait(x))
    with pytest.raises(RuntimeError, match="injected"):
        jax_amem.swap(src, dst)
    assert dispatched and waited and all(any(t is d for t in waited[0]) for d in dispatched[0])
