"""Bad and hostile input to the swap, the three copy targets, plan, pause/resume, nccl and IPC
descriptors, each case in a child process (tests/hostile/cases.py), so that a crash
is a failing test, not a dead test run.

Cases that cannot crash each other share a child (one JSON line per case); those that could
kill the process (raw addresses, the NCCL interposer, pause with JAX on CPU on a GPU host) run
alone. A case passes when its child exited 0, the case's own checks held (nothing lost or
written), and the library raised the expected error class with the expected message (or
nothing, for cases meant to succeed).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CASES_FILE = Path(__file__).resolve().parent / "hostile" / "cases.py"
sys.path.insert(0, str(Path(__file__).resolve().parent))

# name: (error class expected among the raised error's classes, or None for success; message regex)
EXPECTED = {
    # swap into PyTorch tensors
    "torch_conj_view": ("SwapError", r"destination 'w' has its conjugate bit set"),
    "torch_neg_view": ("SwapError", r"destination 'w' has its negative bit set"),
    "torch_requires_grad_in_a_graph": ("RuntimeError", r"modified by an inplace operation"),
    "torch_view_of_a_jax_array": ("SwapError", r"destination 'w' is memory of a live jax.Array"),
    "torch_sparse": ("SwapError", r"destination 'w' is a torch.sparse_coo tensor"),
    "torch_tensors_as_a_list": ("SwapError", r"list of 1 torch tensors: give them by name"),
    "torch_plan_is_a_string": ("SwapError", r"plan= must be a jax_amem.reshard.Plan"),
    "torch_rules_are_strings": ("SwapError", r"rules\[0\] is str 'hello'"),
    "torch_two_names_one_storage": ("SwapError", r"destinations '(w|v)' and '(w|v)' share memory"),
    "torch_freed_storage": ("SwapError", r"destination 'w': its storage holds 0 bytes"),
    "torch_tensor_metadata_generated": (None, ""),
    "torch_source_names_collide": ("SwapError", r"two tree leaves are both named 'a/b'"),
    # swap into jax.Arrays
    "jax_destination_names_collide": ("SwapError", r"two tree leaves are both named 'a/b'"),
    "jax_same_array_twice": ("SwapError", r"destinations 'a' and 'b' are the same jax.Array"),
    "jax_1030_destinations_one_tied_pair": ("SwapError", r"'p0000' and 'p1029' are the same jax.Array"),
    "jax_destination_is_a_source": ("SwapError", r"destination 'a' is source 'a' itself"),
    "jax_rollout_made_by_device_put_shares_source_buffers": ("SwapError", r"'w' shares a buffer with source 'w'"),
    "jax_deleted_destination": ("SwapError", r"destination 'x' was deleted"),
    "jax_wrong_shape_and_dtype": ("SwapError", r"'x'"),
    "jax_zero_size_destination_made_by_jit": (None, ""),
    # jax_amem.copy: segment_copy, segment_copy_many, segment_copy_to_addresses
    "copy_segment_out_of_bounds": ("ValueError", r"."),
    "copy_segment_negative_and_overflowing": ("ValueError", r"overlap"),
    "copy_segment_float_rows": ("ValueError", r"integers"),
    "copy_segment_five_columns": ("ValueError", r"columns"),
    "copy_segment_tables_generated": (None, ""),
    "copy_many_out_of_bounds": ("ValueError", r"."),
    "copy_many_buffer_index_out_of_range": ("ValueError", r"."),
    "copy_many_float_rows": ("ValueError", r"integers"),
    "copy_to_address_0x1000": ("ValueError", r"cannot be memory of this process"),
    "copy_to_address_negative": ("ValueError", r"cannot be memory of this process"),
    "copy_to_address_rows_past_the_size": ("ValueError", r"."),
    "copy_to_address_float_address": ("ValueError", r"give integers"),
    "copy_to_address_past_the_allocation_cuda": ("ValueError", r"allocation ends"),
    # plan
    "plan_rules_not_rules": ("RuleError", r"rules hold str .hello., not a Rule or Piece"),
    "plan_bytes_overflow_int64": ("LayoutError", r"more bytes than int64"),
    "plan_shape_mismatch": ("ValueError", r"'w'"),
    # pause / resume
    "pause_resume_without_pause": ("PauseError", r"."),
    "pause_twice": ("PauseError", r"."),
    "pause_keep_not_arrays": ("JaxAmemError|TypeError|ValueError", r"."),
    "pause_with_jax_on_cpu": (None, ""),
    "pause_nccl_flag_is_a_string": ("PauseError", r"jax_amem.pause\(nccl='no'\): nccl is True or False, not str"),
    # nccl (the interposer over a fake NCCL)
    "nccl_ids_twice": ("ValueError", r"given twice"),
    "nccl_ids_negative": ("ValueError", r"out of range"),
    "nccl_ids_past_2_to_the_64": ("ValueError", r"out of range"),
    "nccl_paused_with_no_communicators": (None, ""),
    # CUDA IPC descriptors
    "ipc_shape_none": ("SwapError", r"entry 'w': shape is NoneType None, not a list of ints"),
    "ipc_allocation_bytes_lots": ("SwapError", r"entry 'w': allocation_bytes is str 'lots', not an int"),
    "ipc_bytes_outside_the_allocation": ("SwapError", r"outside its allocation"),
    "ipc_not_a_descriptor": ("SwapError", r"must be the dict export_tensors returned"),
    # the newer surfaces (rules, presets, reserve, recover, to_torch, tied weights, the command line), one error family
    "to_torch_writes_are_refused_before_any_byte": ("ReadOnlyViewError", r"add_ would write into to_torch's view of "
                                                                          r"'w'.*Nothing was written.*clone\(\)"),
    "to_torch_inference_mode_alone_writes_then_refuses": (None, ""),
    "to_torch_names_collide": ("SwapError", r"to_torch: two tree leaves are both named 'a/b'"),
    "swap_source_keys_0_and_str_0": ("SwapError", r"the source tree's dict at its root has keys of types int and "
                                                  r"str side by side \(0, '0'\).*same type"),
    "swap_source_keys_0_and_str_0_after_a_swap": ("SwapError", r"the source tree's dict at its root has keys"),
    "plan_keys_0_and_str_0": ("LayoutError", r"sources: .*keys of types int and str side by side"),
    "pause_keep_keys_0_and_str_0": ("PauseError", r"the keep= tree's dict at its root has keys of types int and str.*"
                                                  r"nothing was paused"),
    "to_torch_keys_0_and_str_0": ("SwapError", r"to_torch: the tree's dict at its root has keys of types int and str"),
    "plan_sources_not_a_tree_of_arrays": ("LayoutError", r"sources: give a Layout"),
    "plan_split_bytes_a_string": ("PlanError", r"split_bytes must be an int >= 1, got '1MB'"),
    "plan_owner_not_a_pair": ("PlanError", r"owner must be a \(process, device\) pair, got 3"),
    "errors_one_family": (None, ""),
    "old_layout_segment_copy": ("AttributeError", r"jax_amem.segment_copy moved to jax_amem.copy.segment_copy"),
    "old_layout_swap_package": ("ModuleNotFoundError", r"jax_amem.swap was the package of earlier versions: it is now "
                                                       r"jax_amem.swapping"),
    "demo_json_empty_path": ("SystemExit", r"--json '': the path is empty \(an unset shell variable\?\)"),
    "demo_json_a_directory": ("SystemExit", r"--json .*: that is a folder; give a file path in it"),
    "demo_rollout_where_jax_can_write": (None, ""),
    "gpu_demo_qwen3_tiny_with_jax_on_cpu": (None, ""),
    "nccl_pause_whose_destroy_fails": ("NcclPauseError", r"ncclCommDestroy failed.*broken now: id \d+ \(other, "
                                                         r"device .*jax_amem\.nccl\.recover\(\)"),
    "nccl_process_pause_whose_destroy_fails": ("PauseError", r"broken now: id \d+ .*jax_amem\.nccl\.recover\(\)"),
    # generated (tests/hostile/generated.py): every outcome an oracle's values or a family error
    "generated_swap_into_torch": (None, ""),
    "generated_plan": (None, ""),
    "generated_to_torch": (None, ""),
    "generated_pause_arguments": (None, ""),
    "generated_scale_rule": (None, ""),
    "generated_scale_function": (None, ""),
    "generated_vllm_layout": (None, ""),
    "vllm_connect_bad_arguments": ("VllmPlanError", r"connect needs exactly one of family= \(a preset\) and rules="),
    # every verb of docs/api.md with bad arguments (tests/hostile/every_verb.py): only family errors
    "every_public_verb_raises_only_family_errors": (None, ""),
}

# Children: a batch runs its cases in one process; a solo case gets a process of its own.
BATCHES = {
    "torch": [n for n in EXPECTED if n.startswith("torch_")],
    "jax": [n for n in EXPECTED if n.startswith("jax_")],
    "copy": ["copy_segment_out_of_bounds", "copy_segment_negative_and_overflowing", "copy_segment_float_rows",
             "copy_segment_five_columns", "copy_segment_tables_generated", "copy_many_out_of_bounds",
             "copy_many_buffer_index_out_of_range", "copy_many_float_rows", "copy_to_address_rows_past_the_size"],
    "plan": ["plan_rules_not_rules", "plan_bytes_overflow_int64", "plan_shape_mismatch"],
    "pause": ["pause_resume_without_pause", "pause_twice", "pause_keep_not_arrays", "pause_with_jax_on_cpu",
              "pause_nccl_flag_is_a_string"],
    "ipc": [n for n in EXPECTED if n.startswith("ipc_")],
    "newer_surfaces": [n for n in EXPECTED if n.startswith(("to_torch_", "swap_", "errors_", "old_layout_"))]
    + ["plan_keys_0_and_str_0", "pause_keep_keys_0_and_str_0", "plan_sources_not_a_tree_of_arrays",
       "plan_split_bytes_a_string", "plan_owner_not_a_pair"],
    "vllm": ["vllm_connect_bad_arguments"],
    "demo": ["demo_json_empty_path", "demo_json_a_directory", "demo_rollout_where_jax_can_write"],
    # one child per verb: a crash in one fails that verb's test alone
    **{name: [name] for name in EXPECTED if name.startswith("generated_")},
}
SOLO_CPU = ["copy_to_address_0x1000", "copy_to_address_negative", "copy_to_address_float_address"]
# The sweep runs over the fake NCCL too, so that jax_amem.nccl's verbs reach their argument checks.
SOLO_NCCL = [n for n in EXPECTED if n.startswith("nccl_")] + ["every_public_verb_raises_only_family_errors"]
# Cases that need a fake NCCL without ncclCommSuspend (2.27): pause()'s "auto" then recreates, which
# destroys the communicators.
NCCL_WITHOUT_SUSPEND = {"nccl_process_pause_whose_destroy_fails"}
SOLO_GPU = ["copy_to_address_past_the_allocation_cuda", "gpu_pause_with_jax_on_cpu",
            "gpu_demo_qwen3_tiny_with_jax_on_cpu", "gpu_to_torch_writes_are_refused_before_any_byte"]
JAX_ON_GPU = {"copy_to_address_past_the_allocation_cuda", "to_torch_writes_are_refused_before_any_byte"}

# --- presets and from_function (issues 23, 24): refused at preset() / from_function, each naming the
# preset, the parameter and the axis
PRESET_EXPECTED = {
    "preset_tp_3_for_4_query_heads": ("RuleError", r"preset 'llama' \(source='maxtext', layout='vllm'\): tp=3 does "
                                                   r"not divide the 4 heads of 'q' \(axis 2 of source "
                                                   r"'decoder/layers/self_attention/query/kernel'"),
    "preset_tp_zero": ("RuleError", r"preset 'llama' .*: tp=0 is not a tensor-parallel size"),
    "preset_tp_negative": ("RuleError", r"preset 'llama' .*: tp=-2 is not a tensor-parallel size"),
    "preset_tp_a_string": ("RuleError", r"preset 'llama' .*: tp='2' is not a tensor-parallel size"),
    "preset_tp_with_the_hf_layout": ("RuleError", r"layout='hf'\): tp=3 applies to the 'vllm' layout"),
    "preset_qwen3_layers_on_axis_1": (None, ""),
    "preset_layer_axis_not_found": ("RuleError", r"preset 'qwen3' .*the layer stack 'decoder/layers' has no layer "
                                                 r"axis"),
    "preset_llama_maxtext_query_scaling": (None, ""),
    "preset_llama_maxtext_integer_queries": ("RuleError", r"preset 'llama' .*scale_query_layer.* query kernel "
                                                          r"'decoder/layers/self_attention/query/kernel' .*it is "
                                                          r"int32.*unscaled_queries=True"),
    "preset_gemma2_maxtext_norm_offsets": ("RuleError", r"preset 'gemma2' .*refused: .*scale_rmsnorm_layer"),
    "from_function_returns_a_bare_array": ("TraceError", r"returned \w+, not a mapping of destination names"),
    "from_function_returns_a_list": ("TraceError", r"returned list, not a mapping of destination names"),
}
EXPECTED.update(PRESET_EXPECTED)
BATCHES["preset"] = list(PRESET_EXPECTED)



def _run_child(names, env=None, timeout=600) -> tuple[dict, subprocess.CompletedProcess]:
    environment = dict(os.environ, JAX_PLATFORMS="cpu")
    environment.update(env or {})
    environment = {k: v for k, v in environment.items() if v is not None}
    done = subprocess.run([sys.executable, "-P", str(CASES_FILE), *names], capture_output=True, text=True,
                          env=environment, timeout=timeout)
    lines = {}
    for line in done.stdout.splitlines():
        if line.startswith("CASE "):
            entry = json.loads(line[5:])
            lines[entry["case"]] = entry
    return lines, done


def _judge(name: str, expected_name: str, lines: dict, done) -> None:
    entry = lines.get(name)
    if entry is None:
        pytest.fail(f"case {name}: its child exited with {done.returncode} (-11 is SIGSEGV) before reporting it:\n"
                    f"{done.stderr[-3000:]}")
    if "failed" in entry:
        pytest.fail(f"case {name}: {entry['failed']}")
    assert done.returncode == 0, f"child exited with {done.returncode}:\n{done.stderr[-3000:]}"
    classes, pattern = EXPECTED[expected_name]
    if classes is None:
        assert entry["error"] is None, f"case {name} raised {entry['error']}: {entry['message']}"
        return
    assert entry["error"] is not None, f"case {name}: nothing was raised"
    assert set(classes.split("|")) & set(entry["classes"]), (
        f"case {name} raised {entry['error']} ({entry['classes']}), expected {classes}: {entry['message']}")
    import re

    assert re.search(pattern, entry["message"]), f"case {name}: message {entry['message']!r} !~ {pattern!r}"


_NO_TORCH = importlib.util.find_spec("torch") is None
TORCH_DESTINATIONS = {"preset_llama_maxtext_query_scaling", "every_public_verb_raises_only_family_errors"}  # cases that swap into PyTorch tensors


def _marks(name: str, *extra) -> list:
    marks = list(extra)
    needs_torch = (name.startswith(("torch_", "to_torch_", "swap_", "demo_", "gpu_demo_", "gpu_to_torch_", "generated_"))
                   or name in TORCH_DESTINATIONS)
    if needs_torch and _NO_TORCH:  # CI's Python 3.12 leg has no torch build
        marks.append(pytest.mark.skip(reason="the case needs torch, which is not installed here"))
    return marks


_batch_results: dict = {}


def _batch(batch: str):
    if batch not in _batch_results:
        _batch_results[batch] = _run_child(BATCHES[batch])
    return _batch_results[batch]


@pytest.mark.parametrize("batch, name", [pytest.param(b, n, marks=_marks(n), id=n)
                                         for b, names in BATCHES.items() for n in names])
def test_batched_case(batch, name):
    lines, done = _batch(batch)
    _judge(name, name, lines, done)


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n), id=n) for n in SOLO_CPU])
def test_case_alone(name):
    lines, done = _run_child([name])
    _judge(name, name, lines, done)


@pytest.fixture(scope="module")
def fake_nccls(tmp_path_factory):
    """{with_suspend: the fake NCCL library}, each built when first asked for."""
    from nccl_support.harness import build_fake

    folder, built = tmp_path_factory.mktemp("hostile_nccl"), {}

    def fake(with_suspend: bool):
        if with_suspend not in built:
            try:
                built[with_suspend] = build_fake(folder, with_suspend=with_suspend)
            except (RuntimeError, subprocess.CalledProcessError) as error:
                pytest.skip(f"cannot build the fake NCCL: {error}")
        return built[with_suspend]
    return fake


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n), id=n) for n in SOLO_NCCL])
def test_nccl_case(name, fake_nccls):
    suspend = name not in NCCL_WITHOUT_SUSPEND
    lines, done = _run_child([name], env={"JAX_AMEM_NCCL_LIBRARY": str(fake_nccls(suspend)),
                                          "JAX_AMEM_NCCL_HOST_EXCHANGE": "1",
                                          "FAKE_NCCL_VERSION": "23007" if suspend else "22703"})
    _judge(name, name, lines, done)


@pytest.mark.parametrize("name", [pytest.param(n, marks=_marks(n, pytest.mark.gpu), id=n) for n in SOLO_GPU])
def test_gpu_case(name):
    """On a GPU host: raw addresses bounded by their CUDA allocation and writes into to_torch's
    views of CUDA arrays refused (JAX on its GPU); pause and the qwen3-tiny demo with JAX on its
    CPU platform while a driver is present."""
    case = name if name in EXPECTED else name.removeprefix("gpu_")
    env = {"JAX_PLATFORMS": None if case in JAX_ON_GPU else "cpu", "XLA_FLAGS": None}
    lines, done = _run_child([case], env=env)
    _judge(case, case, lines, done)
