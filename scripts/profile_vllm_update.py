"""Where a vLLM backend update's time goes, group by group (a development aid): the in-process
engine of benchmarks/vllm_ipc.py (a Qwen3-0.6B-shaped trainer tree, each rank's staging buffer in
this process, no transport), its update timed piece by piece.

    python -P scripts/profile_vllm_update.py [--layers 28] [--tp 2] [--repeats 5] [--tiny]
                                             [--staging-bytes N]

Per update, medians over --repeats (milliseconds): the whole update; the picks (each group's
jitted selection of its sources, `VllmEngine.picks`: arrays XLA makes); the swaps into staging
(each rank's `jax_amem.swap`), split into those that repeated the last swap of their program
(`in_process/repeat.py`) and those that took the full path; the rpc calls (`_rpc`: a thread per
call while the process watches its workers); and one device copy of the update's bytes as the
ceiling; and how many of the swaps' programs are launched directly (in_process/direct.py) or
run in XLA. --tiny shrinks the model's dimensions (a CPU check of the script itself).
--staging-bytes: each rank's staging budget (layer groups packed into batches, one commit per
batch; 0: one group per commit); the default is connect's.
"""
import argparse
import statistics
import sys
import time
from pathlib import Path

import jax_amem  # noqa: F401  (before JAX starts)
import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import vllm_ipc as shapes  # noqa: E402  (the benchmark's model, description and in-process ranks)


class Clock:
    """Seconds spent in wrapped calls, per label, for the update being timed."""

    def __init__(self):
        self.spent = {}

    def wrap(self, label, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.spent[label] = self.spent.get(label, 0.0) + time.perf_counter() - start
        return timed


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=28)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--staging-bytes", type=int, default=shapes.DEFAULT_STAGING_BYTES)
    args = parser.parse_args(argv)
    if args.tiny:
        shapes.D, shapes.H, shapes.KV, shapes.HD, shapes.F, shapes.V = 128, 4, 2, 64, 256, 512
    import torch

    from jax_amem.swapping.in_process import repeat, run
    from jax_amem.vllm import trainer

    device = jax.devices()[0]
    torch_device = "cuda" if device.platform == "gpu" else "cpu"
    notes = [dict(shapes.description(args.layers, args.tp, r, "bfloat16", args.staging_bytes), device=torch_device,
                  pid=0, tp_rank=r)
             for r in range(args.tp)]
    trees = [shapes.trainer_tree(args.layers, jnp.bfloat16, seed) for seed in (0, 1)]
    engine = trainer.VllmEngine(shapes.Ranks([]), [shapes.local_rank(n, torch_device) for n in notes], trees[0],
                                family="qwen3", source="flax", rules=None, cast=None, timeout=120)
    clock = Clock()
    trainer.Pick.__call__ = clock.wrap("picks", trainer.Pick.__call__)
    hits = {"repeated": 0}
    find = repeat.find

    def counted_find(*a, **k):
        found = find(*a, **k)
        hits["repeated"] += found[0] is not None
        return found
    repeat.find = counted_find
    trainer.swap = clock.wrap("swaps", trainer.swap)
    engine._rpc = clock.wrap("rpc calls", engine._rpc)
    for i in range(2):  # the first compiles each group's pick and program
        engine.update(trees[i % 2])
    rows, repeated = [], []
    for i in range(args.repeats):
        clock.spent, hits["repeated"] = {}, 0
        start = time.perf_counter()
        engine.update(trees[i % 2])
        if torch_device == "cuda":
            torch.cuda.synchronize()
        rows.append(dict(clock.spent, update=time.perf_counter() - start))
        repeated.append(hits["repeated"])
    copy_s = shapes.device_copy_seconds(engine.bytes, torch_device, args.repeats)
    swaps = len(engine.steps) * args.tp
    print(f"vLLM backend update on {device.platform} ({device.device_kind}): {args.layers} layers, tp {args.tp}, "
          f"{engine.bytes / 2**20:.1f} MiB in {len(notes[0]['groups'])} groups, {len(engine.batches)} commits, "
          f"{swaps} swaps; ms, medians of {args.repeats}")
    for label in ("update", "picks", "swaps", "rpc calls"):
        print(f"  {label:<34}{statistics.median(r.get(label, 0.0) for r in rows) * 1e3:10.2f}")
    print(f"  {'device copy of the bytes (ceiling)':<34}{copy_s * 1e3:10.2f}")
    print(f"  swaps that repeated the last one: {statistics.median(repeated):.0f} of {swaps}")
    programs = run._programs.values()
    routes = {}
    for program in programs:
        how = "direct launch" if program.direct else f"XLA ({program.route})"
        routes[how] = routes.get(how, 0) + 1
    print(f"  programs: {len(programs)}, " + ", ".join(f"{n} {how}" for how, n in sorted(routes.items())))


if __name__ == "__main__":
    main()
