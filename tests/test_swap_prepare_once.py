"""One swap, followed from the public verb to the copy: every check runs once, the source tree
is flattened once, the path re-enters no module more than twice, and the number of hops
between the swap's modules does not grow with the number of tensors.

Counted with a profile hook (sys.setprofile) over a first swap into a PyTorch model with tied
weights, transposed rules and two sizes of model."""

import collections
import sys

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import jax_amem
from jax_amem import reshard
from jax_amem.reshard import Rule
from jax_amem.swapping import forget
from jax_amem.swapping.in_process import fused_views

torch = pytest.importorskip("torch")

SWAP = "jax_amem.swapping"
GENERATOR = 0x20  # inspect.CO_GENERATOR: a generator's frame is entered again at every item


def model(n: int):
    params = {f"layer{i}": {"w": jnp.asarray(np.random.default_rng(i).random((16, 8)), jnp.float32)}
              for i in range(n)}
    params["emb"] = jnp.arange(32.0).reshape(4, 8)
    dst = {f"layer{i}.weight": torch.zeros(8, 16) for i in range(n)}
    dst["emb.weight"] = torch.zeros(4, 8)
    dst["head.weight"] = dst["emb.weight"]  # tied weights: one storage under two names
    rules = [Rule.copy(f"layer{i}.weight", f"layer{i}/w", transpose=(1, 0)) for i in range(n)]
    rules += [Rule.copy("emb.weight", "emb"), Rule.copy("head.weight", "emb")]
    return params, dst, rules


class Trace:
    """Calls into the swap's modules during one swap: entries per module (a call whose caller
    is another module), calls per (module, function), and the stack at each copy call."""

    def __init__(self):
        self.entries = collections.Counter()
        self.calls = collections.Counter()
        self.copy_stacks = []

    def __call__(self, frame, event, arg):
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if module == "jax_amem.copy" and frame.f_code.co_name == "segment_copy_to_addresses":
            self.copy_stacks.append(_modules_on_stack(frame))
        if not module.startswith(SWAP) or frame.f_code.co_flags & GENERATOR:
            return
        self.calls[(module.removeprefix(SWAP + "."), frame.f_code.co_name)] += 1
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back is not None else ""
        if caller != module:
            self.entries[module.removeprefix(SWAP + ".")] += 1


def _modules_on_stack(frame) -> list[str]:
    """The modules from the outermost frame of jax_amem to `frame`, one per run of frames."""
    chain = []
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module.startswith("jax_amem") and (not chain or chain[-1] != module):
            chain.append(module)
        frame = frame.f_back
    return chain[::-1]


def traced_swap(n: int) -> Trace:
    """The swap through XLA's route, the path these tests follow (the transposed views would
    otherwise be read by the direct launch's fused copy: test_swap_transpose.py)."""
    forget()
    fused_views.ENABLED = False
    params, dst, rules = model(n)
    trace = Trace()
    flattened = []
    real_flatten = jax.tree_util.tree_flatten

    def counting_flatten(tree, *args, **kwargs):
        if tree is params:
            flattened.append(1)
        return real_flatten(tree, *args, **kwargs)

    jax.tree_util.tree_flatten = counting_flatten
    sys.setprofile(trace)
    try:
        jax_amem.swap(params, dst, rules=rules, progress=False)
    finally:
        sys.setprofile(None)
        jax.tree_util.tree_flatten = real_flatten
        fused_views.ENABLED = True
    trace.flattened = len(flattened)
    np.testing.assert_array_equal(dst["head.weight"].numpy(), np.asarray(params["emb"]))
    np.testing.assert_array_equal(dst["layer1.weight"].numpy(), np.asarray(params["layer1"]["w"]).T)
    return trace


def test_each_check_runs_once_and_the_tree_is_flattened_once():
    trace = traced_swap(6)
    once = {("destinations", "targets"),            # the destination's own checks (writable, not JAX memory)
            ("checks", "torch_not_jax_memory"),      # the scan of jax.live_arrays()
            ("checks", "swap_arguments"),            # rules and plan, not both; kinds of arguments
            ("names", "check"),                      # missing / extra / both twins
            ("tied", "fold"),                        # tied rules lowered and compared once
            ("by_address", "check"),                 # shards against the plan, one device each
            ("by_address", "check_disjoint"),
            ("in_process.run", "_check_sources"),
            ("in_process.schedule", "make")}
    assert {key: trace.calls[key] for key in once} == dict.fromkeys(once, 1)
    assert trace.flattened == 1


def test_the_path_to_the_copy_enters_no_module_more_than_twice():
    trace = traced_swap(6)
    assert trace.copy_stacks, "the swap made no copy call"
    for stack in trace.copy_stacks:
        counts = collections.Counter(stack)
        assert max(counts.values()) <= 2, stack


def test_hops_between_the_swap_modules_do_not_grow_with_the_model():
    """Per-tensor work stays inside one module's loop (checks, facts, layouts), so a model of
    ten times the tensors makes the same calls between modules; only tracing the jitted call
    makes one view per transformed source (sources.prepare_view, once per compiled program)."""
    small, large = traced_swap(4), traced_swap(40)
    views = ("sources", "prepare_view")
    assert large.calls[views] - small.calls[views] == 36
    for trace in (small, large):
        trace.entries["sources"] -= trace.calls[views]
    assert dict(small.entries) == dict(large.entries)


def test_the_plan_cache_is_the_planners():
    traced_swap(3)
    assert reshard.cache_info()["entries"] == 1
    forget()
    assert reshard.cache_info()["entries"] == 0
