"""jax-amem's uses of JAX's private APIs, each run on the JAX installed (CI runs this file at both
ends of the supported range), so that a JAX release that moves one fails here, by name, before
anything else does; and no module of jax_amem/ but jax_amem/_jax_compat.py touches them.

Each test checks the private path itself, not the public fallback some functions keep: a
fallback taken silently would make the library slower (or, for weak types, different) without
failing anything else."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding

import jax_amem
from jax_amem import _jax_compat as compat

PACKAGE = Path(jax_amem.__file__).resolve().parent
CPUS = jax.devices("cpu")


def sharded(values):
    """`values` split over every CPU device along its first axis."""
    mesh = Mesh(np.array(CPUS), ("x",))
    return jax.device_put(values, NamedSharding(mesh, P("x")))


def pointers(arrays):
    return [a.unsafe_buffer_pointer() for a in arrays]


# ----------------------------------------------------------------------------- each use


def test_shard_arrays_reads_the_arrays_list_in_the_order_of_addressable_shards():
    array = sharded(np.arange(len(CPUS) * 3, dtype=np.float32))
    arrays = compat.shard_arrays(array)
    assert arrays is not None, "ArrayImpl._arrays is gone: shard lookups fall back to Shard objects"
    assert pointers(arrays) == pointers([s.data for s in array.addressable_shards])
    replicated = jax.device_put(np.ones(4, np.float32), NamedSharding(Mesh(np.array(CPUS), ("x",)), P()))
    assert pointers(compat.shard_arrays(replicated)) == pointers([s.data for s in replicated.addressable_shards])
    assert compat.shard_arrays(np.ones(3)) is None


def test_sharding_attribute_names_the_stored_sharding_of_arrays():
    arrays = [sharded(np.zeros(len(CPUS), np.float32)), jnp.ones(3)]
    name = compat.sharding_attribute(arrays)
    assert name == "_sharding", "ArrayImpl._sharding is gone or no longer the sharding"
    assert [getattr(a, name) for a in arrays] == [a.sharding for a in arrays]

    class Other:  # anything else with a sharding: the public property
        sharding = arrays[0].sharding
    assert compat.sharding_attribute([Other()]) == "sharding"


def test_is_tracer_tells_abstract_values_from_arrays():
    seen = []
    jax.jit(lambda x: seen.append(compat.is_tracer(x)) or x)(jnp.ones(2))
    assert seen == [True]
    assert not compat.is_tracer(jnp.ones(2)) and not compat.is_tracer(np.ones(2))


def test_weak_typed_sets_the_weak_type_and_keeps_the_values():
    strong = jnp.asarray(np.float32(1.5))
    assert not strong.aval.weak_type
    weak = compat.weak_typed(strong, np.float32)
    assert weak.aval.weak_type and weak.dtype == np.float32 and float(weak) == 1.5
    # what the weak type is for: promotion with bf16 stays bf16 (a strong f32 makes f32)
    assert (weak * jnp.ones(2, jnp.bfloat16)).dtype == jnp.bfloat16
    assert (strong * jnp.ones(2, jnp.bfloat16)).dtype == jnp.float32


def test_device_assignment_is_the_shardings_own_order():
    backwards = CPUS[::-1]
    sharding = NamedSharding(Mesh(np.array(backwards), ("x",)), P("x"))
    assert compat.device_assignment(sharding) == tuple(backwards), "Sharding._device_assignment is gone"
    assert compat.device_assignment(SingleDeviceSharding(CPUS[2])) == (CPUS[2],)


def test_direct_call_runs_the_compiled_executable_and_hands_back_single_device_arrays():
    a, b = jnp.arange(4, dtype=jnp.float32), jnp.full(3, 7, jnp.int32)
    jitted = jax.jit(lambda xs: (xs[0] * 2, xs[1] + 1))
    run = compat.direct_call(jitted, (a, b))
    assert run is not None, "the compiled object's _executable / unsafe_call / execute_sharded changed"
    out = run([a, b])
    assert len(out) == 2 and all(len(per_device) == 1 for per_device in out)
    np.testing.assert_array_equal(out[0][0], np.arange(4, dtype=np.float32) * 2)
    np.testing.assert_array_equal(out[1][0], np.full(3, 8, np.int32))


def test_direct_call_declines_programs_that_jit_does_more_for():
    a, b = jnp.ones(2), jnp.ones(2)
    pruned = jax.jit(lambda xs: (xs[0] + 1,))  # jit drops the unused operand before the call
    assert compat.direct_call(pruned, (a, b)) is None
    printing = jax.jit(lambda xs: (jax.debug.print("{}", xs[0]), xs[0] + xs[1])[1])  # a host callback
    assert compat.direct_call(printing, (a, b)) is None
    assert compat.direct_call(object(), (a, b)) is None  # not a jitted function at all


def test_started_backends_names_the_platforms_started():
    jax.devices("cpu")
    assert "cpu" in compat.started_backends()


def test_distributed_state_outside_jax_distributed():
    module = importlib.import_module("jax._src.distributed")
    state = module.global_state  # the private names the two functions read
    assert all(hasattr(state, name) for name in ("client", "process_id", "num_processes"))
    assert compat.distributed_client() is None
    assert compat.distributed_processes() == (0, 1)


def test_user_line_names_the_users_line():
    def users_function(x):
        return x.T  # the line to find

    jaxpr = jax.make_jaxpr(users_function)(jnp.ones((2, 3)))
    line = inspect.getsourcelines(users_function)[1] + 1
    found = compat.user_line(jaxpr.jaxpr.eqns[0])
    assert found.startswith(f"{__file__}:{line} (") and found.endswith("users_function)"), found
    assert compat.user_line(object()) is None


def test_batched_wait_waits_for_a_list_of_arrays():
    arrays = [jnp.arange(4.0) + i for i in range(3)]
    wait = compat.batched_wait()
    wait(arrays)
    assert all(a.is_ready() for a in arrays)


def test_every_use_has_its_test_here():
    """A function added to _jax_compat without a test above fails here."""
    uses = {name for name, value in vars(compat).items()
            if inspect.isfunction(value) and value.__module__ == compat.__name__ and not name.startswith("_")}
    tested = {name for name in globals() if name.startswith("test_")}
    source = Path(__file__).read_text()
    untested = sorted(u for u in uses if f"compat.{u}(" not in source)
    assert uses and tested and untested == []


# ----------------------------------------------------------------------------- nobody else

PRIVATE_ATTRIBUTES = {
    "_arrays", "_sharding", "_executable", "_backends", "_device_assignment", "_convert_element_type",
    "_committed", "_npy_value", "_value", "_src", "unsafe_call", "xla_executable", "execute_sharded",
    "disassemble_into_single_device_arrays", "global_state", "source_info",
}
PRIVATE_MODULES = ("jax._src", "jaxlib", "jax.core", "jax.interpreters", "jax.lib")


def private_uses(source: str) -> list[str]:
    """Each place `source` reads JAX's private modules or attributes: imports of them, attribute
    chains through them, reads of the private attributes by name or by string (getattr,
    attrgetter)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [f"{line}: import {a.name}" for a in node.names if a.name.startswith(PRIVATE_MODULES)]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            found += [f"{line}: from {node.module} import ..." for m in modules[:1]
                      if any(x.startswith(PRIVATE_MODULES) for x in modules)]
        elif isinstance(node, ast.Attribute):
            if node.attr in PRIVATE_ATTRIBUTES:
                found.append(f"{line}: .{node.attr}")
            else:
                chain, inner = [node.attr], node.value
                while isinstance(inner, ast.Attribute):
                    chain.append(inner.attr)
                    inner = inner.value
                if isinstance(inner, ast.Name) and inner.id == "jax":
                    dotted = ".".join(["jax"] + chain[::-1])
                    if dotted.startswith(PRIVATE_MODULES):
                        found.append(f"{line}: {dotted}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in PRIVATE_ATTRIBUTES or node.value.startswith("jax._src"):
                found.append(f"{line}: {node.value!r}")
    return found


def test_the_finder_sees_each_way_a_private_use_was_written():
    """The oracle of the test below: each form the library used before _jax_compat is caught."""
    written = [
        "from jax._src import xla_bridge", "from jax._src.distributed import global_state",
        "from jax._src.lax import lax as lax_internal", "import jax._src.xla_bridge as xb",
        "from jax import _src", "x = array._arrays", "getattr(array, '_arrays', None)",
        "operator.attrgetter('_sharding')", "fn.lower(s).compile()._executable.unsafe_call",
        "out.disassemble_into_single_device_arrays()", "isinstance(x, jax.core.Tracer)",
        "getattr(sharding, '_device_assignment', None)", "eqn.source_info.traceback",
    ]
    for code in written:
        assert private_uses(code), code
    for code in ["import jax", "jax.tree_util.tree_flatten(x)", "x.sharding", "link._require_open()",
                 "from . import _jax_compat", "array.addressable_shards[0].data"]:
        assert private_uses(code) == [], code


def test_no_module_but_jax_compat_touches_jax_privates():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "_jax_compat.py":
            found += [f"{path.relative_to(PACKAGE.parent)}:{use}" for use in private_uses(path.read_text())]
    assert found == []
