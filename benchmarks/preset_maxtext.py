"""The cost of following MaxText's exporter: a Llama-8B preset from MaxText's tree (layers on
axis 1, its default; the RoPE reorder of q and k, one piece per rotary row, and the query scaling
as constant steps on the q pieces) against the same model
from the 'flax' naming (layers on axis 0, no reorder: whole-tensor rules), in one run.

    python -P benchmarks/preset_maxtext.py [--layers N]

Shapes only (ShapeDtypeStructs): no memory is used. Prints, per naming, the preset's CPU time,
its rules and pieces, and the CPU time of one rollout rank's plan (TP 8, bf16) and of a trainer
rank's; then the MaxText / flax ratios.
"""

from __future__ import annotations

import argparse
import time

import jax
import numpy as np

from jax_amem import reshard, rules
from jax_amem.reshard import Layout, Owner, Piece

D, H, KV, HD, F, V, TP = 4096, 32, 8, 128, 14336, 128256, 8


def tree(source: str, layers: int):
    def stacked(*shape):
        shape = list(shape)
        shape.insert(1 if source == "maxtext" else 0, layers)
        return jax.ShapeDtypeStruct(tuple(shape), np.float32)
    if source == "maxtext":
        a, m = "decoder/layers/self_attention/", "decoder/layers/mlp/"
        names = {a + "query/kernel": stacked(D, H, HD), a + "key/kernel": stacked(D, KV, HD),
                 a + "value/kernel": stacked(D, KV, HD), a + "out/kernel": stacked(H, HD, D),
                 "decoder/layers/pre_self_attention_layer_norm/scale": stacked(D),
                 "decoder/layers/post_self_attention_layer_norm/scale": stacked(D),
                 m + "wi_0/kernel": stacked(D, F), m + "wi_1/kernel": stacked(D, F), m + "wo/kernel": stacked(F, D),
                 "token_embedder/embedding": jax.ShapeDtypeStruct((V, D), np.float32),
                 "decoder/decoder_norm/scale": jax.ShapeDtypeStruct((D,), np.float32),
                 "decoder/logits_dense/kernel": jax.ShapeDtypeStruct((D, V), np.float32)}
    else:
        a, m = "layers/attn/", "layers/mlp/"
        names = {a + "q/kernel": stacked(D, H * HD), a + "k/kernel": stacked(D, KV * HD),
                 a + "v/kernel": stacked(D, KV * HD), a + "o/kernel": stacked(H * HD, D),
                 "layers/input_norm/scale": stacked(D), "layers/post_attn_norm/scale": stacked(D),
                 m + "gate/kernel": stacked(D, F), m + "up/kernel": stacked(D, F), m + "down/kernel": stacked(F, D),
                 "embed/embedding": jax.ShapeDtypeStruct((V, D), np.float32),
                 "final_norm/scale": jax.ShapeDtypeStruct((D,), np.float32),
                 "lm_head/kernel": jax.ShapeDtypeStruct((D, V), np.float32)}
    return reshard.names_tree(names)


def destinations(layers: int, owners):
    shapes = {"model.embed_tokens.weight": (V, D), "model.norm.weight": (D,), "lm_head.weight": (V, D)}
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (H * HD, D), p + "self_attn.k_proj.weight": (KV * HD, D),
                       p + "self_attn.v_proj.weight": (KV * HD, D), p + "self_attn.o_proj.weight": (D, H * HD),
                       p + "mlp.gate_proj.weight": (F, D), p + "mlp.up_proj.weight": (F, D),
                       p + "mlp.down_proj.weight": (D, F), p + "input_layernorm.weight": (D,),
                       p + "post_attention_layernorm.weight": (D,)})
    return {n: Layout.tensor_parallel(s, "bfloat16", 0, TP, owners) if s[0] % TP == 0 else
            Layout.replicated(s, "bfloat16", owners) for n, s in shapes.items()}


def measure(source: str, layers: int) -> dict:
    params = tree(source, layers)
    clock = time.process_time()
    made = rules.llama(params, source=source, cast="bfloat16")   # maxtext: with its query scaling
    preset_s = time.process_time() - clock
    trainer = Owner(0, 0)
    src = {n: Layout.single(tuple(x.shape), "float32", trainer) for n, x in reshard.tree_names(params).items()}
    owners = [Owner(1, 8 + i) for i in range(TP)]
    dst = destinations(layers, owners)
    clock = time.process_time()
    reshard.plan(src, dst, made, owner=owners[0], cache=False)
    receiver_s = time.process_time() - clock
    clock = time.process_time()
    reshard.plan(src, dst, made, owner=trainer, cache=False)
    sender_s = time.process_time() - clock
    pieces = sum(isinstance(r, Piece) for r in made)
    return {"preset (s)": preset_s, "rules": len(made) - pieces, "pieces": pieces,
            "per-rank plan, a receiver (s)": receiver_s, "per-rank plan, the sender (s)": sender_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    args = parser.parse_args()
    flax, maxtext = measure("flax", args.layers), measure("maxtext", args.layers)
    print(f"preset_maxtext: Llama-8B shapes, {args.layers} layers, rollout TP {TP} bf16, one trainer device; CPU time")
    print(f"{'figure':40s}{'flax (baseline)':>18s}{'maxtext, axis 1':>18s}{'ratio':>10s}")
    for key in flax:
        ratio = maxtext[key] / flax[key] if flax[key] else float("nan")
        fmt = (lambda v: f"{v:.3f}") if key.endswith("(s)") else str
        print(f"{key:40s}{fmt(flax[key]):>18s}{fmt(maxtext[key]):>18s}{ratio:>10.2f}")


if __name__ == "__main__":
    main()
