"""The vLLM backend's path into workers of other processes, without vLLM: each rank a process
that holds a Qwen3-0.6B-shaped model's tensors as vLLM's worker holds them at tensor-parallel
size 2 (vLLM's names, fused qkv_proj / gate_up_proj, each rank's slice), and a staging buffer
made and announced by the worker half's own code (jax_amem_vllm.staging). The trainer runs the
backend's trainer half (`jax_amem.vllm.trainer.VllmEngine`: per-rank plans, the update loop),
so the bytes travel as with a real engine:

* on a GPU: CUDA IPC into each rank's staging (transports.CudaIpc);
* on a GPU with `--transport nccl`: the NCCL transport for workers on other hosts, forced here
  (transports.Nccl): the rank processes get the trainer's store address, publish their notes
  there, join the trainer's link and receive each group with the worker half's own code
  (jax_amem_vllm.nccl). Every process sets its own NCCL_HOSTID, so NCCL sees three hosts on
  one GPU (its socket transport: the figure is a correctness run, not the speed of a network);
* on CPU: a shared file per rank (transports.SharedMemory).

    python -P benchmarks/vllm_ipc.py [--layers 28] [--repeats 5] [--tp 2] [--transport nccl]

vLLM itself is not installed where this runs: the commit (vLLM's processing) is stood in for by
the rank process copying each staged tensor into its parameter with the worker engine's own
batched copy (jax_amem_vllm/copies.py), which is what vLLM's commit of an unquantized GPU model
amounts to (docs/vllm.md). Figures: the swaps of one update (every
group, every rank) through the transport, and the whole update (the commit calls included); the
same swaps into staging buffers of this process (the in-process swap); the ceiling, one device
copy of the same bytes, measured in the same run. --staging-bytes is the workers' staging budget
(layer groups packed into batches, one commit call per batch; 0: one group per call).
What every rank holds after the last update is checked bit for bit (digests of its bytes)
against slices cut by hand from the trainer's arrays.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
import uuid

os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.4")   # the rank processes share the GPU

import numpy as np

from jax_amem_core import answers
from jax_amem_vllm.layout import DEFAULT_STAGING_BYTES, pack, staged_bytes

D, H, KV, HD, F, V = 1024, 16, 8, 128, 3072, 151936   # Qwen3-0.6B (tied head)


def groups(layers: int, tp: int) -> list[list[tuple[str, tuple[int, ...]]]]:
    """Each group's (vLLM name, the rank's loaded shape), as vLLM's layerwise_groups orders them."""
    out = [[("model.embed_tokens.weight", (V // tp, D))]]
    for i in range(layers):
        p = f"model.layers.{i}."
        out.append([(p + "input_layernorm.weight", (D,)),
                    (p + "mlp.down_proj.weight", (D, F // tp)),
                    (p + "mlp.gate_up_proj.weight", (2 * F // tp, D)),
                    (p + "post_attention_layernorm.weight", (D,)),
                    (p + "self_attn.k_norm.weight", (HD,)),
                    (p + "self_attn.o_proj.weight", (D, H * HD // tp)),
                    (p + "self_attn.q_norm.weight", (HD,)),
                    (p + "self_attn.qkv_proj.weight", ((H + 2 * KV) * HD // tp, D))])
    out.append([("model.norm.weight", (D,))])
    return out


def description(layers: int, tp: int, rank: int, dtype: str, staging_bytes: int = DEFAULT_STAGING_BYTES) -> dict:
    """What the worker half reports at init (layout.Describe.wire and engine.description): the
    groups packed into batches of at most `staging_bytes` as the worker packs them."""
    wire, sizes = [], []
    for group in groups(layers, tp):
        offset, tensors = 0, []
        for name, shape in group:
            tensors.append({"name": name, "shape": list(shape), "loaded": list(shape), "dtype": dtype,
                            "offset": offset, "processed": "norm" not in name})
            offset += staged_bytes(shape, dtype)
        wire.append(tensors)
        sizes.append(offset)
    batches, starts, largest = pack(sizes, staging_bytes)
    for tensors, start in zip(wire, starts):
        for t in tensors:
            t["offset"] += start
    return {"tp_size": tp, "tp_rank": rank, "groups": wire, "staging_bytes": largest, "batches": batches}


# ----------------------------------------------------------------------------- a rank's process

def rank_process(args) -> None:
    """Holds the rank's parameters and staging (no JAX here); commits a group on `commit g`."""
    import torch

    from jax_amem_vllm import staging as staging_buffer
    from jax_amem_vllm.copies import copy_all

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    note = description(args.layers, args.tp, args.rank, args.dtype, args.staging_bytes)
    buffer, note["staging"] = staging_buffer.allocate(note["staging_bytes"], device, args.directory,
                                                      args.session, args.rank)
    note["device"] = str(device)
    receiver = None
    if args.store:   # as the worker engine does when its init carries the trainer's store
        from jax_amem_core import wire
        from jax_amem_vllm import nccl

        host, _, port = args.store.rpartition(":")
        store = wire.TorchStore.connect(host, int(port))
        store.set(nccl.note_key(args.session, args.rank), json.dumps(staging_buffer.stamped(note)).encode())
        receiver = nccl.Receiver(store, args.session, args.rank, device)
    dtype = getattr(torch, args.dtype)
    params = {t["name"]: torch.zeros(t["loaded"], dtype=dtype, device=device) for g in note["groups"] for t in g}

    def staged(group):
        for t in group:
            n = int(np.prod(t["shape"])) * params[t["name"]].element_size()
            yield t["name"], buffer[t["offset"]:t["offset"] + n].view(dtype).view(t["shape"])
    if receiver is None:
        staging_buffer.write_note(staging_buffer.note_path(args.directory, args.session, args.rank), note)
    print("ready", flush=True)
    for line in sys.stdin:
        word, *rest = line.split()
        if word == "start":   # start_weight_update: the first joins the trainer's link
            if receiver is not None and receiver.transport(120) is not None:
                receiver.join()
            print("ok", flush=True)
        elif word == "commit":   # commit g[,g...]: a batch's groups, received first when over NCCL
            batch = [int(g) for g in rest[0].split(",")]
            if receiver is not None and receiver.active:
                for group in batch:
                    receiver.receive(group, dict(staged(note["groups"][group])))
            pairs = [(params[name], tensor) for group in batch for name, tensor in staged(note["groups"][group])]
            copy_all([p for p, _ in pairs], [t for _, t in pairs])   # as the worker engine's commit copies
            if device.type == "cuda":
                torch.cuda.synchronize()
            print("ok", flush=True)
        elif word == "digest":   # what the rank holds now, for the trainer's bit-exact check
            print(json.dumps({name: hashlib.md5(p.reshape(-1).view(torch.uint8).cpu().numpy()).hexdigest()
                              for name, p in params.items()}), flush=True)
        else:
            break
    if receiver is not None:
        receiver.close()


class Ranks:
    """The engine as the trainer's half drives it (`collective_rpc`, `reset_prefix_cache`): each
    update_weights is a commit in every rank process."""

    def __init__(self, procs):
        self.procs = procs

    def collective_rpc(self, method, timeout=None, kwargs=None):
        if method == answers.METHOD:   # a question vLLM's workers answer (jax_amem_core.answers): no engine here
            return [answers.answer(None, **kwargs) for _ in self.procs]
        words = {"update_weights": lambda: "commit " + ",".join(
            str(g) for g in kwargs["update_info"].get("groups", [kwargs["update_info"].get("group")])),
            "start_weight_update": lambda: "start"}
        if method in words:
            for proc in self.procs:
                proc.stdin.write(words[method]() + "\n")
                proc.stdin.flush()
            for proc in self.procs:
                assert proc.stdout.readline().strip() == "ok"
        return [None] * len(self.procs)

    def reset_prefix_cache(self):
        return True


# ----------------------------------------------------------------------------- the trainer

def trainer_tree(layers: int, dtype, seed: int):
    import jax
    import jax.numpy as jnp

    keys = iter(jax.random.split(jax.random.key(seed), 16))

    def w(*shape):
        return (jax.random.normal(next(keys), shape, jnp.float32) * 0.02).astype(dtype)
    attn = {"q": {"kernel": w(layers, D, H * HD)}, "k": {"kernel": w(layers, D, KV * HD)},
            "v": {"kernel": w(layers, D, KV * HD)}, "o": {"kernel": w(layers, H * HD, D)},
            "q_norm": {"scale": w(layers, HD)}, "k_norm": {"scale": w(layers, HD)}}
    return {"embed": {"embedding": w(V, D)}, "final_norm": {"scale": w(D)},
            "layers": {"attn": attn, "input_norm": {"scale": w(layers, D)}, "post_attn_norm": {"scale": w(layers, D)},
                       "mlp": {"gate": {"kernel": w(layers, D, F)}, "up": {"kernel": w(layers, D, F)},
                               "down": {"kernel": w(layers, F, D)}}}}


def expected(tree, name: str, rank: int, tp: int) -> np.ndarray:
    """Rank `rank`'s slice of vLLM's tensor `name`, cut by hand from the trainer's arrays."""
    def block(a, axis):
        n = a.shape[axis] // tp
        return np.take(a, range(rank * n, (rank + 1) * n), axis=axis)
    if name == "model.embed_tokens.weight":
        return block(np.asarray(tree["embed"]["embedding"]), 0)
    if name == "model.norm.weight":
        return np.asarray(tree["final_norm"]["scale"])
    i, leaf = int(name.split(".")[2]), name.split(".", 3)[3]
    lay = tree["layers"]
    t = lambda a: np.asarray(a[i]).T  # noqa: E731 - (in, out) kernels -> vLLM's (out, in)
    return {
        "input_layernorm.weight": lambda: np.asarray(lay["input_norm"]["scale"][i]),
        "post_attention_layernorm.weight": lambda: np.asarray(lay["post_attn_norm"]["scale"][i]),
        "self_attn.q_norm.weight": lambda: np.asarray(lay["attn"]["q_norm"]["scale"][i]),
        "self_attn.k_norm.weight": lambda: np.asarray(lay["attn"]["k_norm"]["scale"][i]),
        "self_attn.qkv_proj.weight": lambda: np.concatenate(
            [block(t(lay["attn"][x]["kernel"]), 0) for x in "qkv"], axis=0),
        "self_attn.o_proj.weight": lambda: block(t(lay["attn"]["o"]["kernel"]), 1),
        "mlp.gate_up_proj.weight": lambda: np.concatenate(
            [block(t(lay["mlp"][x]["kernel"]), 0) for x in ("gate", "up")], axis=0),
        "mlp.down_proj.weight": lambda: block(t(lay["mlp"]["down"]["kernel"]), 1),
    }[leaf]()


def local_rank(note, device):
    """A rank's staging buffer in this process (the in-process swap, for comparison)."""
    import torch

    from jax_amem.vllm.transports import _TorchStaging

    class LocalRank(_TorchStaging):
        kind = "local"

    return LocalRank(note, torch.zeros(note["staging_bytes"], dtype=torch.uint8, device=device))


def device_copy_seconds(nbytes: int, device: str, repeats: int) -> float:
    """The median of `repeats` copies of `nbytes` on the torch `device` ("cuda" or "cpu"), after
    one warm-up: the ceiling an update's bytes could move at."""
    import torch

    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    copies = []
    for _ in range(repeats + 1):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        dst.copy_(src)
        if device == "cuda":
            torch.cuda.synchronize()
        copies.append(time.perf_counter() - start)
    return statistics.median(copies[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--transport", default="auto", choices=("auto", "nccl"),
                        help="auto: CUDA IPC on a GPU, shared memory on CPU; nccl: the cross-host transport")
    parser.add_argument("--staging-bytes", type=int, default=DEFAULT_STAGING_BYTES,
                        help="each rank's staging budget: layer groups packed into batches of at most this "
                             "(0: one group per commit, as with connect(staging_bytes=0))")
    parser.add_argument("--store", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--session", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--directory", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        return rank_process(args)
    if args.transport == "nccl":
        os.environ["NCCL_HOSTID"] = "jax-amem-trainer"   # each process its own "host": one GPU, three ranks

    import jax_amem  # noqa: F401  (before JAX starts)
    import jax
    import jax.numpy as jnp
    import torch

    from jax_amem.vllm.trainer import VllmEngine, _notes
    from jax_amem.vllm.transports import alive, open_rank
    from jax_amem_core.staging_note import default_directory

    from jax_amem.vllm import nccl
    from jax_amem.vllm.transports import Nccl

    session, directory = uuid.uuid4().hex, default_directory()
    link, extra = None, []
    if args.transport == "nccl":
        store, address = nccl.serve_store("127.0.0.1:0")
        link, extra = nccl.TrainerLink(store, session, address, 120.0), ["--store", address]
    procs = [subprocess.Popen([sys.executable, "-P", __file__, "--rank", str(r), "--tp", str(args.tp), "--layers",
                               str(args.layers), "--staging-bytes", str(args.staging_bytes), "--dtype", args.dtype,
                               "--session", session, "--directory", directory,
                               *extra], env={**os.environ, "NCCL_HOSTID": f"jax-amem-rank{r}"},
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for r in range(args.tp)]
    try:
        for proc in procs:
            assert proc.stdout.readline().strip() == "ready"
        if link is not None:
            notes = nccl.read_notes(link.store, session, args.tp, 120.0)
            ranks = [Nccl(note, nccl.rank_owner(r, jax.process_count())) for r, note in enumerate(notes)]
        else:
            notes = _notes(directory, session, args.tp)
            ranks = [open_rank(note) for note in notes]
        for note in notes:
            if note["staging"].get("path"):
                os.unlink(note["staging"]["path"])
        assert all(alive(n) for n in notes)
        dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
        trees = [trainer_tree(args.layers, dtype, seed) for seed in (1, 2)]
        jax.block_until_ready(trees)
        t0 = time.perf_counter()
        engine = VllmEngine(Ranks(procs), ranks, trees[0], family="qwen3", source="flax", rules=None, cast=None,
                            timeout=120, link=link)
        connect_s = time.perf_counter() - t0
        device = "cuda" if notes[0]["device"].startswith("cuda") else "cpu"
        local = VllmEngine(Ranks([]), [local_rank(n, device) for n in notes], trees[0], family="qwen3", source="flax",
                           rules=None, cast=None, timeout=120)
        reports = {"transport": [], "in_process": []}
        for i in range(args.repeats + 1):   # the first compiles each group's program
            for key, eng in (("transport", engine), ("in_process", local)):
                report = eng.update(trees[i % 2])
                if i:
                    reports[key].append(report)

        # The ceiling: one device copy of the same bytes (both ranks' staged bytes), this run.
        copy_s = device_copy_seconds(engine.bytes, device, args.repeats)

        # Bit-exact: what each rank committed from the last update against slices cut by hand.
        last = trees[args.repeats % 2]
        checked = 0
        for rank, proc in zip(ranks, procs):
            proc.stdin.write("digest\n")
            proc.stdin.flush()
            held = json.loads(proc.stdout.readline())
            for group in rank.note["groups"]:
                for t in group:
                    want = np.ascontiguousarray(expected(last, t["name"], rank.note["tp_rank"], args.tp))
                    if held[t["name"]] != hashlib.md5(want.reshape(-1).view(np.uint8)).hexdigest():
                        raise SystemExit(f"MISMATCH rank {rank.note['tp_rank']} {t['name']}")
                    checked += want.nbytes
        swap = {k: statistics.median(r.swap_seconds for r in v) for k, v in reports.items()}
        commit = statistics.median(r.commit_seconds for r in reports["transport"])
        whole = statistics.median(r.seconds for r in reports["transport"])
        result = {
            "device": jax.devices()[0].device_kind, "transport": engine.transport, "tp": args.tp,
            "layers": args.layers, "dtype": args.dtype, "mib": engine.bytes / 2**20, "groups": len(notes[0]["groups"]),
            "commits": len(engine.batches), "staging_bytes": args.staging_bytes,
            "connect_s": connect_s, "swap_s": swap["transport"], "in_process_swap_s": swap["in_process"],
            "commit_s": commit, "update_s": whole, "device_copy_s": copy_s,
            "share_of_copy": copy_s / swap["transport"], "in_process_share_of_copy": copy_s / swap["in_process"],
            "transport_vs_in_process": swap["in_process"] / swap["transport"], "bit_exact_bytes": checked,
        }
        print(json.dumps(result))
        print(f"{'figure':48} {'value':>10} {'ceiling':>10} {'ratio':>7}")
        print(f"{'swaps of one update via ' + engine.transport + ' (s)':48} {swap['transport']:10.4f} "
              f"{copy_s:10.4f} {copy_s / swap['transport']:7.2f}")
        print(f"{'whole update via ' + engine.transport + ' (s)':48} {whole:10.4f} {copy_s:10.4f} {copy_s / whole:7.2f}")
        print(f"{'the same swaps in process (s)':48} {swap['in_process']:10.4f} {copy_s:10.4f} "
              f"{copy_s / swap['in_process']:7.2f}")
        print(f"{engine.transport + ' vs in process':48} {swap['transport']:10.4f} {swap['in_process']:10.4f} "
              f"{swap['in_process'] / swap['transport']:7.2f}")
        print(f"bit-exact: {checked / 2**20:.1f} MiB held by {args.tp} ranks against hand-cut slices; "
              f"{engine.bytes / 2**20:.1f} MiB per update in {len(notes[0]['groups'])} groups, {len(engine.batches)} "
              f"commits; commits (rank copies) "
              f"{commit:.4f} s; connect {connect_s:.1f} s")
        engine.close()
    finally:
        for proc in procs:
            try:
                proc.stdin.write("quit\n")
                proc.stdin.flush()
            except (BrokenPipeError, ValueError):
                pass
            proc.wait(timeout=60)


if __name__ == "__main__":
    main()
