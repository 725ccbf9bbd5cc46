"""The swap across GPUs of one host (`multigpu`: skipped with fewer than two GPUs).

In process: JAX parameters sharded over 2+ GPUs written into a transformers Llama whose layers
are split over cuda:0 and cuda:1 (logits equal the JAX model's, pointers unchanged, bytes from
the other GPU counted as cross-device), into one tensor-parallel rank per GPU (byte for byte
against numpy), and JAX to JAX between meshes of GPUs (equal to jax.device_put bit for bit).
Across processes: CUDA IPC with the rollout on another GPU than the trainer's parameters, each
side with its own CUDA_VISIBLE_DEVICES (the PCI-bus-id mapping of jax_amem/swapping/same_host/ipc.py), and the
NCCL transport with each process on its own GPU (tests/gpu_workers/swap_multigpu_nccl.py).

The two-process tests come first: the in-process ones start JAX's GPU backend in the pytest
process, which takes most of each GPU's memory the worker processes need. Run this file alone
(`python3 -P -m pytest -q -m multigpu tests/test_swap_multigpu.py`).

Each in-process body also runs on the 8 XLA CPU devices (not `multigpu`), so the test code
itself is checked where there is no GPU.
"""

import os
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import jax
from jax.sharding import Mesh, NamedSharding

import jax_amem
from jax_amem import reshard
from jax_amem.reshard import Owner

import test_swap_llama as llama

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

WORKERS = Path(__file__).resolve().parent / "gpu_workers"
DTYPES = [np.float32, ml_dtypes.bfloat16, np.int8, np.uint16, ml_dtypes.float8_e4m3fn]


def visible_gpus() -> list[str]:
    """The GPUs this process may hand to its workers, as CUDA_VISIBLE_DEVICES entries."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [entry.strip() for entry in listed.split(",") if entry.strip()]
    return [str(i) for i in range(jax_amem.gpu_status().device_count)]


def usable_count(n: int) -> int:
    """The most devices (8, 4, 2 or 1) out of `n` that the test shapes divide evenly."""
    return max(k for k in (1, 2, 4, 8) if k <= n)


# ----------------------------------------------------------------------------- two processes: CUDA IPC

def _ipc_pair(case: str, rollout_visible: str | None, trainer_visible: str):
    """ipc_rollout.py and ipc_trainer.py (tests/test_swap_ipc.py's GPU test), each with its own
    CUDA_VISIBLE_DEVICES. Returns ({phase: trainer result}, {phase: rollout result})."""
    from torch.distributed import TCPStore

    from test_swap_ipc import _results, _run

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    env = {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.3", "PYTORCH_CUDA_ALLOC_CONF": ""}
    rollout_env = dict(env)
    if rollout_visible is not None:
        rollout_env["CUDA_VISIBLE_DEVICES"] = rollout_visible
    rollout = _run([WORKERS / "ipc_rollout.py", case, store.port], rollout_env)
    trainer = _run([WORKERS / "ipc_trainer.py", case, store.port], {**env, "CUDA_VISIBLE_DEVICES": trainer_visible})
    (t_results, t_log), (r_results, r_log) = _results(trainer), _results(rollout)
    assert trainer.returncode == 0 and rollout.returncode == 0, t_log[-4000:] + r_log[-4000:]
    return {r["phase"]: r for r in t_results}, {r["phase"]: r for r in r_results}


def ipc_settings():
    """(case, rollout's CUDA_VISIBLE_DEVICES or None for all, trainer's, the transport expected).
    The trainer's parameters are on its cuda:0; the rollout's tensors on its cuda:0."""
    a, b = (visible_gpus() + ["0", "1"])[:2]
    return [
        # rollout alone on GPU b; trainer sees a then b: the tensors map onto the trainer's cuda:1
        ("llama", b, f"{a},{b}", "cross-device"),
        ("many", b, f"{a},{b}", "cross-device"),
        # the same GPU b is the trainer's cuda:0: mapped where the parameters are
        ("llama", b, f"{b},{a}", "device-local"),
        # rollout sees every GPU (its cuda:0 is a); trainer's order reversed: a is its cuda:1
        ("llama", None, f"{b},{a}", "cross-device"),
    ]


@pytest.mark.multigpu
@pytest.mark.parametrize("case,rollout_visible,trainer_visible,transport", ipc_settings(),
                         ids=lambda v: "all" if v is None else str(v))
def test_cuda_ipc_into_a_rollout_on_another_gpu(case, rollout_visible, trainer_visible, transport):
    """The descriptor names the exporter's GPU by PCI bus id; the trainer maps it on its own
    ordinal of that GPU, whatever either side's CUDA_VISIBLE_DEVICES. The transport shows
    where it landed: on another GPU than the parameters, every byte is cross-device."""
    mine, theirs = _ipc_pair(case, rollout_visible, trainer_visible)
    swap = mine["swap"]
    assert swap["route"] == "addresses" and swap["verified"], swap
    assert swap["transports"] == {transport: swap["bytes"]}, swap
    assert theirs["done"]["pointers_unchanged"]
    if case == "llama":
        for version, oracle in ((1, "oracle"), (2, "oracle2")):
            np.testing.assert_allclose(np.asarray(theirs[f"v{version}"]["logits"]),
                                       np.asarray(mine[oracle]["logits"]), rtol=1e-4, atol=1e-4)
    else:
        assert theirs["v1"]["digests"] == mine["oracle"]["digests"]
        assert theirs["v2"]["digests"] == mine["oracle2"]["digests"]


# ----------------------------------------------------------------------------- two processes: NCCL

def _nccl_pair(args: list[str]):
    sys.path.insert(0, str(WORKERS))
    from run_pair import run_pair

    results, logs = run_pair("swap_multigpu_nccl.py", args, gpus=2, timeout=600)
    return results, "\n\n".join(log[-4000:] for log in logs)


@pytest.mark.multigpu
@pytest.mark.parametrize("order", ["own", "both-reversed"])
def test_nccl_swap_each_process_on_its_own_gpu_by_visible_devices(order):
    """nccl_swap_worker.py unchanged (three versions, pause/resume of the link between the
    second and third), the trainer and the rollout on different GPUs of one host."""
    a, b = visible_gpus()[:2]
    spec = f"{a}|{b}" if order == "own" else f"{a},{b}|{b},{a}"
    results, text = _nccl_pair(["visible", spec])
    rollout = [r for r in results if r.get("role") == "rollout" and r.get("phase") == "checked"]
    trainer = [r for r in results if r.get("role") == "trainer" and r.get("phase") == "sent"]
    assert len(rollout) == 3 and len(trainer) == 3, text
    assert [r["version"] for r in rollout] == [1, 2, 3], text
    for r in rollout:
        assert r["mismatched"] == [] and r["bytes"] > 0 and r["pointers_unchanged"], r
    paused = [r for r in results if r.get("phase") == "paused"]
    assert len(paused) == 2 and all(p["state"] == "paused" for p in paused), text
    assert [p for p in paused if p["role"] == "trainer"][0]["refused"].endswith("nothing was sent"), text


@pytest.mark.multigpu
@pytest.mark.parametrize("trainer_gpu,rollout_gpu", [(0, 1), (1, 0)])
def test_nccl_swap_with_every_gpu_visible_on_a_nonzero_ordinal(trainer_gpu, rollout_gpu):
    """Both processes see every GPU; one side's link and buffers are on cuda:1 (the sender's
    staging and gather, the receiver's tables and unpack on the link's device, not cuda:0)."""
    results, text = _nccl_pair(["devices", str(trainer_gpu), str(rollout_gpu)])
    linked = {r["role"]: r["device"] for r in results if r.get("phase") == "linked"}
    assert linked == {"trainer": trainer_gpu, "rollout": rollout_gpu}, text
    rollout = [r for r in results if r.get("role") == "rollout" and r.get("phase") == "checked"]
    trainer = [r for r in results if r.get("role") == "trainer" and r.get("phase") == "sent"]
    assert [r["version"] for r in rollout] == [1, 2] and len(trainer) == 2, text
    for r in rollout:
        assert r["mismatched"] == [] and r["pointers_unchanged"], r
        assert r["devices"] == [f"cuda:{rollout_gpu}"], r
        assert r["bytes"] == trainer[0]["bytes"] > 0, (r, trainer)


def test_nccl_worker_arguments_are_parsed_per_rank():
    """The worker's command line, without a GPU: each rank gets its side of the SPEC."""
    sys.path.insert(0, str(WORKERS))
    from swap_multigpu_nccl import parse

    assert parse(["0", "123", "visible", "0|1"])["visible"] == "0"
    assert parse(["1", "123", "visible", "0,1|1,0"])["visible"] == "1,0"
    devices = parse(["1", "123", "devices", "1", "0"])
    assert (devices["gpu"], devices["trainer_gpu"], devices["rollout_gpu"]) == (0, 1, 0)
    for bad in (["0", "1", "visible", "0"], ["0", "1", "visible", "|1"], ["2", "1", "devices", "0", "1"],
                ["0", "1", "devices", "0"], ["0", "1", "elsewhere", "0"]):
        with pytest.raises(SystemExit):
            parse(bad)


# ----------------------------------------------------------------------------- in process

def _move_inputs(device, value):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, (tuple, list)):
        return type(value)(_move_inputs(device, v) for v in value)
    if isinstance(value, dict):
        return {k: _move_inputs(device, v) for k, v in value.items()}
    return value


def split_layers(model, devices: list):
    """Pipeline split of a transformers Llama: the embedding on devices[0], layer i on
    devices[i * len(devices) // L], the final norm and head on the last; each of those modules
    moves its inputs to its own device first (what accelerate's hooks do)."""
    layers = model.model.layers
    placed = [(model.model.embed_tokens, devices[0]), (model.model.rotary_emb, devices[0]),
              *[(layer, devices[i * len(devices) // len(layers)]) for i, layer in enumerate(layers)],
              (model.model.norm, devices[-1]), (model.lm_head, devices[-1])]
    for module, device in placed:
        module.to(device)
        module.register_forward_pre_hook(
            lambda m, args, kwargs, device=device: (_move_inputs(device, args), _move_inputs(device, kwargs)),
            with_kwargs=True)
    return model


def split_logits(model, tokens) -> np.ndarray:
    first = model.model.embed_tokens.weight.device
    with torch.no_grad():
        out = model(torch.as_tensor(np.asarray(tokens), device=first), use_cache=False)
    return out.logits.float().cpu().numpy()


def torch_device(device) -> str:
    """The PyTorch device of a JAX device (cuda:i is the JAX GPU of local hardware id i)."""
    return f"cuda:{device.local_hardware_id}" if device.platform == "gpu" else "cpu"


def _split_llama_body(devices, tolerance):
    """JAX parameters FSDP x TP over `devices` into a Llama split over the first two's PyTorch
    devices: logits equal the JAX model's, two versions, pointers unchanged."""
    devices = devices[:usable_count(len(devices))]
    mesh = Mesh(np.array(devices).reshape(-1, 2), ("fsdp", "tp"))
    model = split_layers(llama.nan_model(torch_device(devices[0])), [torch_device(d) for d in devices[:2]])
    tensors = dict(model.named_parameters())
    pointers = {n: t.data_ptr() for n, t in tensors.items()}
    rules = reshard.rules.hf_llama(llama.L)
    for seed in (5, 6):
        params = llama.fsdp_tp_sharded(llama.flax_params(seed), mesh)
        report = jax_amem.swap(params, tensors, rules=rules, verify=seed == 5)
        assert report.route == "addresses" and report.bytes == sum(t.numel() * 4 for t in tensors.values())
        moved = report.transports
        assert set(moved) == {"device-local", "cross-device"}, moved  # shards on the other device(s) too
        assert moved["device-local"] + moved["cross-device"] == report.bytes and report.staging_bytes > 0, moved
        with jax.default_matmul_precision("highest"):
            want = np.asarray(jax.jit(llama.jax_llama_logits)(params, llama.TOKENS))
        np.testing.assert_allclose(split_logits(model, llama.TOKENS), want, rtol=tolerance, atol=tolerance)
    assert {n: t.data_ptr() for n, t in model.named_parameters()} == pointers
    return model


@pytest.mark.multigpu
def test_fsdp_tp_params_into_a_llama_split_over_two_gpus():
    model = _split_llama_body(jax.devices("gpu"), 1e-4)
    assert model.model.layers[0].self_attn.q_proj.weight.device != model.lm_head.weight.device  # really split


def test_split_llama_body_on_cpu_devices():
    """The same test code on the 8 XLA CPU devices (every PyTorch tensor on the CPU)."""
    _split_llama_body(jax.devices("cpu"), 2e-5)


def _tensor_parallel_body(devices, cast):
    """One tensor-parallel rank's tensors per device (vLLM's fused qkv / gate_up), each rank's
    own plan: byte for byte the numpy slices; some bytes come from another device's shard."""
    tp = 2
    devices = devices[:usable_count(len(devices))]
    mesh = Mesh(np.array(devices).reshape(2, -1), ("fsdp", "tp"))
    tree = llama.flax_params(3)
    params = llama.fsdp_tp_sharded(tree, mesh)
    rules = reshard.rules.hf_llama(llama.L, tp=tp, fused_qkv=True, fused_gate_up=True, cast=cast)
    dtype = np.dtype(cast or np.float32)
    hf = llama.numpy_hf(tree)
    cross = 0
    for rank in range(tp):
        device = devices[rank] if devices[0].platform == "gpu" else jax.devices("cpu")[0]
        want = llama.rank_slices(hf, tp, rank)
        plan = reshard.plan(params, llama.rank_layouts(hf, tp, rank, Owner(device.process_index, device.id), dtype),
                            rules)
        dst = {name: torch.full(w.shape, float("nan"), dtype=getattr(torch, dtype.name), device=torch_device(device))
               for name, w in want.items()}
        pointers = {n: t.data_ptr() for n, t in dst.items()}
        report = jax_amem.swap(params, dst, plan=plan, verify=True)
        assert report.buffers == len(want) and {n: t.data_ptr() for n, t in dst.items()} == pointers
        cross += report.transports.get("cross-device", 0)
        bits = torch.int16 if dtype.itemsize == 2 else torch.int32
        for name, w in want.items():
            got = dst[name].view(bits).cpu().numpy()
            assert np.array_equal(got, np.ascontiguousarray(w.astype(dtype)).view(got.dtype)), (rank, name)
    assert cross > 0


@pytest.mark.multigpu
@pytest.mark.parametrize("cast", [None, "bfloat16"])
def test_a_tensor_parallel_rank_per_gpu_gets_exactly_its_slices(cast):
    _tensor_parallel_body(jax.devices("gpu"), cast)


@pytest.mark.parametrize("cast", [None, "bfloat16"])
def test_tensor_parallel_body_on_cpu_devices(cast):
    _tensor_parallel_body(jax.devices("cpu"), cast)


MESH_SHAPES = {1: ((1, 1), (1, 1)), 2: ((1, 2), (2, 1)), 4: ((2, 2), (2, 2)), 8: ((2, 4), (4, 2))}


def _jax_to_jax_body(devices, dtype, disjoint):
    """test_swap_jax's trees from a (fsdp, tp) mesh to a (dp, tp) mesh of other devices (disjoint:
    the other half of them, so every byte crosses devices; else the same ones, reversed)."""
    import test_swap_jax as tj  # here, not at import: it asks JAX for its CPU devices

    devices = devices[:usable_count(len(devices))]
    if disjoint:
        half = len(devices) // 2
        train_devices, roll_devices = devices[:half], devices[half:]
    else:
        train_devices, roll_devices = devices, devices[::-1]
    train_shape, roll_shape = MESH_SHAPES[len(train_devices)]
    trainer = Mesh(np.array(train_devices).reshape(train_shape), ("fsdp", "tp"))
    rollout = Mesh(np.array(roll_devices).reshape(roll_shape), ("dp", "tp"))
    src, dst, want = {}, {}, {}
    for k, (name, (shape, s_spec, d_spec)) in enumerate(tj.TREE_SPECS.items()):
        src[name] = jax.device_put(tj.random_bits(shape, dtype, k), NamedSharding(trainer, s_spec))
        dst[name] = tj.zeros(shape, dtype, NamedSharding(rollout, d_spec))
        want[name] = jax.device_put(src[name], NamedSharding(rollout, d_spec))
    pointers = {n: [s.data.unsafe_buffer_pointer() for s in a.addressable_shards] for n, a in dst.items()}
    report = jax_amem.swap(src, dst, verify=True)
    assert "not-in-place" not in report.transports and all(a.is_deleted() for a in dst.values())
    if disjoint:
        assert report.transports == {"cross-device": report.bytes}, report.transports
    for name, new in report.dst.items():
        assert new.sharding == want[name].sharding
        for got, expected in zip(new.addressable_shards, want[name].addressable_shards):
            assert got.device == expected.device
            assert np.array_equal(tj.as_bytes(got.data), tj.as_bytes(expected.data)), name
        assert [s.data.unsafe_buffer_pointer() for s in new.addressable_shards] == pointers[name]
    assert report.bytes == sum(s.data.nbytes for a in want.values() for s in a.addressable_shards)


@pytest.mark.multigpu
@pytest.mark.parametrize("disjoint", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_jax_to_jax_between_meshes_of_gpus_equals_device_put(dtype, disjoint):
    _jax_to_jax_body(jax.devices("gpu"), dtype, disjoint)


@pytest.mark.parametrize("disjoint", [False, True])
def test_jax_to_jax_body_on_cpu_devices(disjoint):
    _jax_to_jax_body(jax.devices("cpu"), np.float32, disjoint)
