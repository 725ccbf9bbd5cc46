"""Bad input: each a clear error naming the tensor, and nothing half-planned left in the cache."""

import numpy as np
import pytest

from jax_amem import reshard
from jax_amem.reshard import Layout, LayoutError, Owner, Part, Rule, RuleError, native

OWNERS = [Owner(0, i) for i in range(4)]


@pytest.fixture(autouse=True)
def empty_cache():
    reshard.clear_cache()
    yield
    reshard.clear_cache()


def fails_cleanly(error, match, *args, **kwargs):
    with pytest.raises(error, match=match):
        reshard.plan(*args, **kwargs)
    assert reshard.cache_info()["entries"] == 0


def test_shape_mismatch_names_the_tensor():
    src = {"w": Layout.replicated((4, 8), np.float32, OWNERS)}
    dst = {"w": Layout.replicated((8, 4), np.float32, OWNERS)}
    fails_cleanly(RuleError, r"destination 'w' of shape \(8, 4\): part 'w' gives shape \(4, 8\)", src, dst)


def test_dtype_mismatch_names_the_tensor_and_the_fix():
    src = {"w": Layout.replicated((4,), np.float32, OWNERS)}
    dst = {"w": Layout.replicated((4,), np.float16, OWNERS)}
    fails_cleanly(RuleError, r"'w': dtype mismatch.*float16.*float32.*cast=", src, dst)
    assert reshard.plan(src, dst, [Rule.copy("w", cast="float16")]).nbytes == 4 * 2 * 4


def test_destination_without_source_or_rule():
    src = {"a": Layout.replicated((4,), np.float32, OWNERS)}
    dst = {"b": Layout.replicated((4,), np.float32, OWNERS)}
    fails_cleanly(RuleError, "destination 'b' has no source of the same name", src, dst)
    fails_cleanly(RuleError, "writes destination 'zz'", src, dst, [Rule.copy("zz", "a")])


def test_overlapping_destination_regions():
    src = {"a": Layout.replicated((4, 2), np.float32, OWNERS)}
    dst = {"b": Layout.replicated((4, 2), np.float32, OWNERS)}
    pieces = [reshard.Piece("b", (0, 0), (3, 2), "a", (0, 0)), reshard.Piece("b", (2, 0), (2, 2), "a", (2, 0))]
    fails_cleanly(RuleError, r"'b': region \[2:3, 0:2\] is covered twice", src, dst, pieces)


def test_source_layout_that_does_not_tile():
    src = {"a": Layout.from_boxes((4,), np.float32, {OWNERS[0]: ((0,), (2,)), OWNERS[1]: ((1,), (3,))})}
    dst = {"a": Layout.replicated((4,), np.float32, OWNERS)}
    fails_cleanly(LayoutError, r"source tensor 'a'.*\[1:2\] is held by 2 different boxes", src, dst)


def test_an_owner_the_layouts_do_not_name():
    src = Layout.replicated((4,), np.float32, OWNERS[:2])
    dst = Layout.replicated((4,), np.float32, OWNERS[2:])
    fails_cleanly(LayoutError, r"owner \(3, 7\) holds no shard", src, dst, owner=(3, 7))
    plan = reshard.plan(src, dst)
    with pytest.raises(KeyError, match=r"owner \(0, 9\) holds no shard"):
        plan.for_owner((0, 9))
    with pytest.raises(reshard.PlanError, match=r"source 'tensor': no shard given for owner"):
        reshard.execute_numpy(plan, {})


def test_out_of_range_rule_index_and_bad_transpose():
    src = {"s": Layout.replicated((2, 4, 4), np.float32, OWNERS)}
    dst = {"d": Layout.replicated((4, 4), np.float32, OWNERS)}
    fails_cleanly(RuleError, r"'d': index \(2,\) is outside source 's'", src, dst, [Rule.copy("d", "s", index=(2,))])
    fails_cleanly(RuleError, r"'d': transpose \(0, 0\) is not a permutation", src, dst,
                  [Rule.copy("d", "s", index=(1,), transpose=(0, 0))])
    fails_cleanly(RuleError, "do not split into 3 groups", src, dst,
                  [Rule("d", (Part("s", (0,)),), axis=0, groups=3)])


def test_native_planner_rejects_inconsistent_arrays_without_crashing():
    src = Layout.replicated((4,), np.float32, OWNERS)
    planner = reshard.Planner(src, src)
    planner.problem.arrays["rep_owner"] = planner.problem.arrays["rep_owner"] + 100
    with pytest.raises(ValueError, match="rep_owner names a missing owner"):
        native.plan_native(planner.problem, None)


def test_a_failed_check_is_a_plan_error():
    src = Layout.tensor_parallel((8,), np.float32, 0, 2, OWNERS[:2])
    dst = Layout.single((8,), np.float32, OWNERS[3])
    plan = reshard.plan(src, dst, cache=False)
    broken = type(plan)(**{**plan.__dict__, "blocks": plan.blocks[:1], "transfers": plan.transfers[:1]})
    with pytest.raises(reshard.PlanError, match=r"destination 'tensor', shard of owner \(0, 3\): 16 bytes written"):
        broken.check()


def test_check_catches_overlapping_blocks_with_the_right_byte_count():
    src = Layout.tensor_parallel((8,), np.float32, 0, 2, OWNERS[:2])
    dst = Layout.single((8,), np.float32, OWNERS[3])
    plan = reshard.plan(src, dst, cache=False)
    blocks = plan.blocks.copy()
    blocks[1, 1] = 8  # the second half now lands on bytes 8:24, over the first block's 8:16
    broken = type(plan)(**{**plan.__dict__, "blocks": blocks})
    with pytest.raises(reshard.PlanError, match="write the same elements|overlap"):
        broken.check()
