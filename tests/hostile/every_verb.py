"""Every public verb of docs/api.md called with bad arguments: whatever it raises is a member of
jax-amem's error family (JaxAmemError). Registered as a case of tests/hostile/cases.py, so it
runs in a child process where a crash is a failing test.

The verbs are read from the subpackages' `__all__` (the names docs/api.md lists): each function,
each context manager, and the constructors a user calls. Each has a call that is good (or as
good as this machine allows: a CUDA-only verb on CPU, a store nobody else writes to); then every
parameter in turn takes each of BAD. A verb added without a good call here fails the sweep, as
does a verb that raises a bare ValueError, TypeError or anything else outside the family.
"""

from __future__ import annotations

import importlib
import inspect
import math
import os
import sys

import numpy as np

# The subpackages whose __all__ docs/api.md lists (tests/test_public_api.py checks the page).
PACKAGES = ["", "process_pause", "memory", "nccl", "reshard", "reshard.rules", "swapping", "swapping.cross_host",
            "copy", "platform"]

HUGE = 2**70
BAD = [None, "garbage", -1, 2.5, math.nan, HUGE, True, object(), b"\0", [object()], {"x": object()}]

# Not yet in the family: (verb, parameter) pairs whose bad values still raise Python's own
# TypeError / ValueError / AttributeError (None: the verb's good call). The sweep fails when one of
# these is fixed without being struck off, as when a new one appears.
KNOWN_OUTSIDE: dict[str, set] = {}

# Classes in __all__ that are no verb: results the library returns, records, errors (tests/test_public_api.py).
NOT_VERBS = {
    "PauseInfo", "Restored", "Reservation", "MemoryReport", "DeviceMemory", "AllocatorStatus", "PoolStats",
    "Communicator", "NcclReport", "Plan", "Bandwidths", "Simulation", "SwapReport", "NcclSwapReport", "Mismatch",
    "TorchShard", "RemoteTensors", "GpuStatus", "Link", "Owner", "Piece",
    # a native object of the copy engine, sized from the environment; its own tests: test_memory_staging.py
    "StagingPool",
}


def _arrays():
    import jax.numpy as jnp

    return {"w": jnp.arange(6.0, dtype=jnp.float32).reshape(2, 3)}


def _layouts():
    from jax_amem.reshard import Layout, Owner

    return {"w": Layout.single((2, 3), "float32", Owner(0, 0))}


def _torch_dst():
    import torch

    return {"w": torch.zeros(2, 3)}


def _flax_llama():
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import preset_models

    return preset_models.source_tree("llama", "flax", preset_models.logical("llama", np.random.default_rng(0)))


def _store():
    import torch.distributed as dist
    from jax_amem.swapping import TorchStore

    return TorchStore(dist.HashStore())


class _Buffer:
    """Memory of this process to copy into by address (kept alive by the sweep)."""
    memory = np.zeros(64, np.uint8)


def _good_calls():
    """verb name (as in its package) -> a function returning (args, kwargs) of a good call."""
    import jax_amem
    from jax_amem import reshard

    plan = lambda: jax_amem.plan(_layouts(), _layouts())  # noqa: E731
    tree = {"w": np.zeros((2, 3), np.float32)}
    rows5 = [[0, 0, 0, 0, 8]]
    return {
        # pause / resume (nccl=False: the NCCL part has its verbs below)
        "pause": lambda: ((), {"keep": _arrays(), "drop": None, "nccl": False}),
        "resume": lambda: ((), {}),
        "paused": lambda: ((), {"keep": _arrays(), "drop": None, "nccl": False}),
        "is_paused": lambda: ((), {}),
        "reserve": lambda: ((), {"keep": _arrays(), "drop": None, "wait": True}),
        "memory_report": lambda: ((), {"keep": _arrays(), "drop": None, "measure_context": False}),
        "allocator_status": lambda: ((), {}),
        "configure_allocator": lambda: ((), {}),
        "pool_stats": lambda: ((), {}),
        "release_pinned_pool": lambda: ((), {}),
        # swap, plan, to_torch
        "swap": lambda: ((_arrays(), _torch_dst()), {"rules": None, "plan": None, "verify": True, "version": 1,
                                                     "progress": False}),
        "verify": lambda: ((_arrays(), _torch_dst()), {"rules": None, "plan": None}),
        "plan": lambda: ((_layouts(), _layouts(), None), {"owner": None, "split_bytes": 1 << 20,
                                                         "planner": "native", "check": True, "cache": False}),
        "to_torch": lambda: ((_arrays(),), {}),
        "forget": lambda: ((), {}),
        "gpu_status": lambda: ((), {}),
        "require_gpu": lambda: (("a feature",), {}),
        # NCCL
        "can_suspend": lambda: ((), {}),
        "communicators": lambda: ((), {"owner": None, "device": None, "state": "active"}),
        "cost_rates": lambda: ((), {"reset": False}),
        "install": lambda: ((), {}),
        "is_installed": lambda: ((), {}),
        "keep_suspendable": lambda: ((False,), {}),
        "nccl_version": lambda: ((), {}),
        "in_a_job": lambda: ((), {}),
        "paused_ids": lambda: ((), {}),
        "resume_owed": lambda: ((), {}),
        "status": lambda: ((), {}),
        "nccl.pause": lambda: (("auto",), {"owner": None, "device": None, "ids": None, "timeout": 5.0,
                                           "teardown": "parallel", "agree": False}),
        "nccl.paused": lambda: (("auto",), {"timeout": 5.0, "agree": False, "ids": None, "teardown": "destroy"}),
        "nccl.resume": lambda: ((), {"timeout": 5.0, "async_": False, "agree": False}),
        "nccl.is_paused": lambda: ((), {}),
        "recover": lambda: ((), {"timeout": 5.0}),
        # reshard
        "cache_info": lambda: ((), {}),
        "clear_cache": lambda: ((), {}),
        "execute_numpy": lambda: ((plan(), {("w", reshard.Owner(0, 0)): tree["w"]}), {"destinations": None}),
        "expand": lambda: ((np.zeros((0, 10), np.int64),), {}),
        "layouts_of": lambda: ((_arrays(),), {}),
        "tree_names": lambda: ((_arrays(),), {}),
        "names_tree": lambda: (({"a/b": 1},), {}),
        "simulate": lambda: ((plan(),), {"bandwidths": reshard.Bandwidths()}),
        "Layout": lambda: ((), {"shape": (2, 3), "dtype": np.dtype("float32"), "owners": (reshard.Owner(0, 0),),
                                "starts": np.zeros((1, 2), np.int64), "sizes": np.array([[2, 3]], np.int64),
                                "box_of_owner": np.zeros(1, np.int64)}),
        "Layout.single": lambda: (((2, 3), "float32", reshard.Owner(0, 0)), {}),
        "Layout.replicated": lambda: (((2, 3), "float32", [reshard.Owner(0, 0), reshard.Owner(0, 1)]), {}),
        "Layout.tensor_parallel": lambda: (((2, 4), "float32", 1, 2, [reshard.Owner(0, 0), reshard.Owner(0, 1)]),
                                           {}),
        "Layout.from_boxes": lambda: (((2, 3), "float32", {reshard.Owner(0, 0): ((0, 0), (2, 3))}), {}),
        "Planner": lambda: ((_layouts(), _layouts(), None), {"split_bytes": 1 << 20}),
        "Part": lambda: (("w",), {"index": (), "transpose": None, "cast": None, "shape": None, "scale": 2.0,
                                  "offset": None, "along": -1}),
        "Rule": lambda: (("w", (reshard.Part("w"),)), {"axis": 0, "groups": 1}),
        "Rule.copy": lambda: (("w", "w"), {"scale": 2.0, "offset": 1.0, "along": None}),
        # rules
        "preset": lambda: (("llama", _flax_llama()), {"source": "flax", "layout": "hf", "tp": 1, "cast": None,
                                                      "tie_embeddings": False}),
        **{family: (lambda: ((_flax_llama(),), {"source": "flax", "layout": "vllm", "tp": 1, "cast": None}))
           for family in ("llama", "qwen3", "qwen3_moe", "mixtral", "gemma", "gemma2", "gemma3", "deepseek", "gpt2",
                          "qwen2", "phi3")},
        "hf_llama": lambda: ((2,), {"tp": 1, "stacked": True, "fused_qkv": False, "fused_gate_up": False,
                                    "qkv_bias": False}),
        "hf_qwen2": lambda: ((2,), {"tp": 1}),
        "identity_rules": lambda: ((["w"],), {}),
        "lower": lambda: (([reshard.Rule.copy("w", "w")], _layouts(), _layouts()), {}),
        "check_coverage": lambda: (("w", _layouts()["w"], jax_amem.rules.lower([reshard.Rule.copy("w", "w")],
                                                                                _layouts(), _layouts())), {}),
        "clear_trace_cache": lambda: ((), {}),
        "trace_count": lambda: ((), {}),
        "from_function": lambda: ((lambda p: {"w": p["w"] * 2}, tree), {"cast": None}),
        "from_layer_function": lambda: ((lambda p: {"w": p["w"]}, {"layers": {"w": np.zeros((2, 3), np.float32)}},
                                         "layers", "layers"), {"cast": None}),
        # the same host and other hosts
        "export_tensors": lambda: ((_torch_dst(),), {}),
        "open_remote": lambda: (({"entries": {}},), {"mapper": None}),
        "TrainerIpc": lambda: ((_store(),), {"rank": 0, "group": "rollout", "timeout": 0.2, "mapper": None}),
        "RolloutIpc": lambda: ((_store(), _torch_dst()), {"rank": 0, "group": "rollout", "timeout": 0.2}),
        "TorchStore": lambda: ((_store().store,), {}),
        "JaxStore": lambda: ((), {"client": None}),
        "connect": lambda: ((_store(), "trainer", 0), {"trainers": 1, "rollouts": 1, "owner": reshard.Owner(0, 0),
                                                       "device": 0, "timeout": 0.2}),
        "destination_layouts": lambda: ((_torch_dst(), 0), {}),
        # No Link can be made on a machine without a GPU: these stop at the link
        "send": lambda: ((_arrays(), plan(), None, 1), {}),
        "receive": lambda: ((_torch_dst(), plan(), None, 1), {}),
        # the byte mover's primitives
        "prepare_segments": lambda: (([[0, 0, 8]], 24, 24), {"max_piece": 1 << 18}),
        "prepare_buffer_segments": lambda: ((rows5, [24], [24]), {"max_piece": 1 << 18}),
        "segment_copy": lambda: ((_arrays()["w"], _arrays()["w"] * 0, [[0, 0, 8]]), {}),
        "segment_copy_many": lambda: (([_arrays()["w"]], [_arrays()["w"] * 0], rows5), {}),
        "segment_copy_to_addresses": lambda: (([_arrays()["w"]], [_Buffer.memory.ctypes.data], [64], rows5),
                                              {"bulk_bytes": None, "alignment": None}),
    }


def _verbs():
    """(label, callable, key of its good call) for every verb in the packages' __all__."""
    verbs, seen = [], set()
    for package in PACKAGES:
        module = importlib.import_module("jax_amem" + (f".{package}" if package else ""))
        for name in module.__all__:
            value = getattr(module, name)
            label = f"jax_amem.{package + '.' if package else ''}{name}"
            if not callable(value) or inspect.ismodule(value) or (inspect.isclass(value)
                                                                   and issubclass(value, BaseException)):
                continue  # constants, subpackages (swept by their own names), errors
            if inspect.isclass(value) and name in NOT_VERBS:
                continue
            key = f"nccl.{name}" if package == "nccl" and name in ("pause", "paused", "resume", "is_paused") else name
            if id(value) in seen:
                continue  # the same function under two packages: once is enough
            seen.add(id(value))
            verbs.append((label, value, key))
            if name in ("Layout", "Rule"):
                methods = ("single", "replicated", "tensor_parallel", "from_boxes") if name == "Layout" else ("copy",)
                verbs += [(f"{label}.{m}", getattr(value, m), f"{name}.{m}") for m in methods]
    return verbs


def _parameters(function, kwargs) -> list[str]:
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return list(kwargs)
    names = [p.name for p in signature.parameters.values()
             if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name != "self"]
    return names + [k for k in kwargs if k not in names]  # **options the good call names


def _call(function, args, kwargs):
    """Calls it; a context manager is entered and left; a pause left standing is resumed."""
    import jax_amem

    try:
        result = function(*args, **kwargs)
        if hasattr(result, "__enter__") and hasattr(result, "__exit__"):
            with result:
                pass
        return None
    except Exception as error:  # noqa: BLE001 - judged by the caller
        return error
    finally:
        if jax_amem.is_paused():
            jax_amem.resume()
        if jax_amem.nccl.paused_ids():
            jax_amem.nccl.resume(agree=False)


def _theirs(error) -> bool:
    """The user's own function raised it (from_function's `convert`, traced on the bad tree): theirs
    to read, passed on with a note saying where it came from."""
    return any("while jax_amem.rules.from_function traced it" in note for note in getattr(error, "__notes__", ()))


def every_public_verb_raises_only_family_errors():
    """The sweep: returns None; raises AssertionError listing each call whose error left the family."""
    import jax_amem

    good, outside, known, calls = _good_calls(), [], set(), 0
    verbs = _verbs()
    missing = sorted(label for label, _, key in verbs if key not in good)
    assert not missing, f"no good call for {missing}: add one to tests/hostile/every_verb.py"
    for label, function, key in verbs:
        args, kwargs = good[key]()
        names = _parameters(function, kwargs)
        positional = len(args)
        trials = [(None, None)] + [(name, bad) for name in names for bad in BAD]
        for name, bad in trials:
            call_args, call_kwargs = good[key]() if name else (args, kwargs)
            call_args, call_kwargs = list(call_args), dict(call_kwargs)
            if name is not None:
                index = names.index(name)
                if index < positional:
                    call_args[index] = bad
                else:
                    call_kwargs[name] = bad
            if os.environ.get("HOSTILE_TRACE"):
                print(label, name, repr(bad)[:40], flush=True)
            error = _call(function, call_args, call_kwargs)
            calls += 1
            if error is not None and not isinstance(error, jax_amem.JaxAmemError) and not _theirs(error):
                if name in KNOWN_OUTSIDE.get(label.removeprefix("jax_amem."), ()):
                    known.add((label.removeprefix("jax_amem."), name))
                    if os.environ.get("HOSTILE_TRACE"):
                        print(f"KNOWN {label}({name}={bad!r:.40}): {type(error).__name__}: {str(error)[:200]}")
                    continue
                outside.append(f"{label}({name}={bad!r:.40}): {type(error).__module__}.{type(error).__qualname__}: "
                               f"{str(error)[:200]}")
    assert calls > 500, calls
    fixed = sorted(f"{verb}({name})" for verb, names in KNOWN_OUTSIDE.items() for name in names
                   if (verb, name) not in known)
    assert not fixed, f"now in the family: {fixed}; strike them off KNOWN_OUTSIDE in tests/hostile/every_verb.py"
    assert not outside, f"{len(outside)} call(s) raised outside the family:\n" + "\n".join(outside)
