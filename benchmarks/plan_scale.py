"""Resharding planner at trillion-parameter scale: plan time, plan size, link balance, predicted time.

    python -P benchmarks/plan_scale.py [--small] [--colocated] [--traced [--whole-trace]]

A synthetic mixture-of-experts model (60 layers, 384 experts, hidden 7168, expert
width 2048, GQA attention: ~1.0T parameters, ~70,000 destination tensors). The
trainer holds scanned-layer, expert-stacked Flax-style tensors on 256 GPUs
(mesh fsdp 4 x expert 16 x tensor 4, 8 GPUs per host); the rollout holds Hugging
Face per-expert tensors on 128 GPUs (tensor parallel 16 x 8 replicas), on other
hosts (or, with --colocated, on the trainer's first 128 GPUs). Kernels are
transposed on the sender. Prints one table: figure, goal or ceiling, ratio.
The ceiling of the predicted time is the busiest receiver's (or sender's) bytes
over its link bandwidth: no plan can beat it. --traced also plans from the same
mapping written as a conversion function (`rules.from_function` for the globals,
`rules.from_layer_function` for the layer stack), against the hand-written rules
(goal <= 1.2x), and a second call (cached: no tracing). --whole-trace adds the whole
model in one `from_function`, plain and with the layer converter under `jax.jit`,
each from cold caches, with its phases.
"""

from __future__ import annotations

import argparse
import functools
import time

import ml_dtypes
import numpy as np

from jax_amem import reshard
from jax_amem.reshard import Layout, Owner, Rule, simulate

FULL = dict(layers=60, experts=384, hidden=7168, expert_width=2048, heads=64, kv_heads=8, head_dim=128,
            vocab=163840, mesh=(4, 16, 4), tp=16, replicas=8)
SMALL = dict(layers=2, experts=16, hidden=256, expert_width=128, heads=4, kv_heads=2, head_dim=32,
             vocab=1024, mesh=(2, 4, 2), tp=4, replicas=2)
BF16 = ml_dtypes.bfloat16
PER_HOST = 8


def trainer_layouts(c) -> dict[str, Layout]:
    ids = np.arange(int(np.prod(c["mesh"]))).reshape(c["mesh"])
    axes = ("fsdp", "expert", "tensor")
    L, E, D, F = c["layers"], c["experts"], c["hidden"], c["expert_width"]
    Q, KV, V = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"], c["vocab"]
    experts = ("expert", "fsdp")
    table = {
        "layers/moe/wi_0": ((L, E, D, F), (None, experts, None, "tensor")),
        "layers/moe/wi_1": ((L, E, D, F), (None, experts, None, "tensor")),
        "layers/moe/wo": ((L, E, F, D), (None, experts, "tensor", None)),
        "layers/attn/q/kernel": ((L, D, Q), (None, "fsdp", "tensor")),
        "layers/attn/k/kernel": ((L, D, KV), (None, "fsdp", "tensor")),
        "layers/attn/v/kernel": ((L, D, KV), (None, "fsdp", "tensor")),
        "layers/attn/o/kernel": ((L, Q, D), (None, "tensor", "fsdp")),
        "layers/router/kernel": ((L, D, E), (None, "fsdp", None)),
        "layers/input_norm/scale": ((L, D), (None, None)),
        "layers/post_attn_norm/scale": ((L, D), (None, None)),
        "embed/embedding": ((V, D), ("tensor", "fsdp")),
        "lm_head/kernel": ((D, V), ("fsdp", "tensor")),
        "final_norm/scale": ((D,), (None,)),
    }
    return {name: Layout.from_mesh(ids, axes, spec, shape, BF16, devices_per_process=PER_HOST)
            for name, (shape, spec) in table.items()}


def destination_table(c):
    """(name, shape, split dim, source, index, transpose) per rollout tensor: Hugging Face
    per-expert names, each one layer (and expert) of a stacked trainer tensor, transposed."""
    L, E, D, F = c["layers"], c["experts"], c["hidden"], c["expert_width"]
    Q, KV, V = c["heads"] * c["head_dim"], c["kv_heads"] * c["head_dim"], c["vocab"]
    T = (1, 0)
    rows = []
    for i in range(L):
        p = f"model.layers.{i}."
        rows += [(p + "self_attn.q_proj.weight", (Q, D), 0, "layers/attn/q/kernel", (i,), T),
                 (p + "self_attn.k_proj.weight", (KV, D), 0, "layers/attn/k/kernel", (i,), T),
                 (p + "self_attn.v_proj.weight", (KV, D), 0, "layers/attn/v/kernel", (i,), T),
                 (p + "self_attn.o_proj.weight", (D, Q), 1, "layers/attn/o/kernel", (i,), T),
                 (p + "mlp.gate.weight", (E, D), None, "layers/router/kernel", (i,), T),
                 (p + "input_layernorm.weight", (D,), None, "layers/input_norm/scale", (i,), None),
                 (p + "post_attention_layernorm.weight", (D,), None, "layers/post_attn_norm/scale", (i,), None)]
        for j in range(E):
            q = f"{p}mlp.experts.{j}."
            rows += [(q + "gate_proj.weight", (F, D), 0, "layers/moe/wi_0", (i, j), T),
                     (q + "up_proj.weight", (F, D), 0, "layers/moe/wi_1", (i, j), T),
                     (q + "down_proj.weight", (D, F), 1, "layers/moe/wo", (i, j), T)]
    rows += [("model.embed_tokens.weight", (V, D), 0, "embed/embedding", (), None),
             ("lm_head.weight", (V, D), 0, "lm_head/kernel", (), T),
             ("model.norm.weight", (D,), None, "final_norm/scale", (), None)]
    return rows


def rollout(c, colocated: bool):
    """Destination layouts (shared objects per shape and split) and the hand-written rules."""
    n = c["tp"] * c["replicas"]
    first = 0 if colocated else int(np.prod(c["mesh"]))
    owners = [Owner((first + i) // PER_HOST, first + i) for i in range(n)]
    shared: dict = {}

    def layout(shape, dim):
        key = (shape, dim)
        if key not in shared:
            shared[key] = (Layout.replicated(shape, BF16, owners) if dim is None
                           else Layout.tensor_parallel(shape, BF16, dim, c["tp"], owners))
        return shared[key]

    table = destination_table(c)
    dst = {name: layout(shape, dim) for name, shape, dim, *_ in table}
    return dst, hand_rules(table), owners


def hand_rules(table):
    return [Rule.copy(name, src, index=index, transpose=transpose) for name, _, _, src, index, transpose in table]


# The same mapping as the user's exporter would write it (jnp), for rules.from_function.
def convert_layer(layer):
    """One layer of the stacked tree -> its Hugging Face tensors (names under model.layers.{i}.)."""
    out = {"self_attn.q_proj.weight": layer["attn"]["q"]["kernel"].T,
           "self_attn.k_proj.weight": layer["attn"]["k"]["kernel"].T,
           "self_attn.v_proj.weight": layer["attn"]["v"]["kernel"].T,
           "self_attn.o_proj.weight": layer["attn"]["o"]["kernel"].T,
           "mlp.gate.weight": layer["router"]["kernel"].T,
           "input_layernorm.weight": layer["input_norm"]["scale"],
           "post_attention_layernorm.weight": layer["post_attn_norm"]["scale"]}
    for j in range(layer["moe"]["wi_0"].shape[0]):
        out[f"mlp.experts.{j}.gate_proj.weight"] = layer["moe"]["wi_0"][j].T
        out[f"mlp.experts.{j}.up_proj.weight"] = layer["moe"]["wi_1"][j].T
        out[f"mlp.experts.{j}.down_proj.weight"] = layer["moe"]["wo"][j].T
    return out


def convert_globals(params):
    return {"model.embed_tokens.weight": params["embed"]["embedding"], "lm_head.weight": params["lm_head"]["kernel"].T,
            "model.norm.weight": params["final_norm"]["scale"]}


def convert_whole(params, layer_converter=convert_layer):
    """The whole model in one function (the plain from_function path)."""
    import jax
    out = convert_globals(params)
    stacked = params["layers"]
    for i in range(stacked["attn"]["q"]["kernel"].shape[0]):
        layer = jax.tree.map(lambda x: x[i], stacked)
        out.update({f"model.layers.{i}.{k}": v for k, v in layer_converter(layer).items()})
    return out


@functools.cache
def jitted_convert_layer():
    import jax
    return jax.jit(convert_layer)


def convert_whole_jitted(params):
    """The whole model with the layer converter under jax.jit: JAX traces it once, and
    from_function converts it once and reuses it for the other layers."""
    return convert_whole(params, jitted_convert_layer())


def cpu_timed(fn):
    """CPU seconds of this process: steadier than wall time on a machine shared with other jobs."""
    start = time.process_time()
    out = fn()
    return out, time.process_time() - start


def traced_rows(src, dst, table, whole: bool, repeat: int = 1) -> list[tuple]:
    """Planning from a traced conversion function against the hand-written rules (CPU seconds;
    with repeat > 1, the best of that many runs for the hand rules and each whole-model trace)."""
    import jax
    from jax_amem import rules
    from jax_amem.reshard.trace import last_trace_phases

    hand_seconds = min(cpu_timed(lambda: reshard.Planner(src, dst, hand_rules(table)))[1] for _ in range(repeat))
    timed = cpu_timed
    tree = reshard.names_tree(src)

    def once(convert):
        """One whole-model trace from cold caches (ours and JAX's), its phases, and Planner."""
        rules.clear_trace_cache()
        jax.clear_caches()
        pieces, t_traced = timed(lambda: rules.from_function(convert, tree))
        phases = last_trace_phases()
        _, t_prep = timed(lambda: reshard.Planner(src, dst, pieces))
        return t_traced + t_prep, t_prep, phases, pieces

    def whole_model(convert, label):
        total, t_prep, phases, pieces = min((once(convert) for _ in range(repeat)), key=lambda run: run[0])
        return pieces, [
            (f"from_function, {label}: traced + prepared (CPU s)", f"{total:.2f}",
             f"<= {1.2 * hand_seconds:.2f}", f"{total / hand_seconds:.2f}x"),
            (f"  make_jaxpr / walk / pieces / Planner (CPU s), calls reused",
             f"{phases['make_jaxpr']:.2f} / {phases['walk']:.2f} / {phases['pieces']:.2f} / {t_prep:.2f}, "
             f"{phases['calls reused']}", "", ""),
        ]

    if whole:
        pieces_jitted, jitted_rows = whole_model(convert_whole_jitted, "whole model, layer converter under jax.jit")
    rules.clear_trace_cache()
    jax.clear_caches()
    count = rules.trace_count()

    def traced():
        return rules.from_function(convert_globals, tree) + rules.from_layer_function(
            convert_layer, tree, "layers", "model.layers.{}.")
    pieces, t_trace = timed(traced)
    traces = rules.trace_count() - count
    _, t_prepare = timed(lambda: reshard.Planner(src, dst, pieces))
    again, t_again = timed(traced)
    total = t_trace + t_prepare
    rows = [
        ("hand-written rules: built + prepared (CPU s)", f"{hand_seconds:.2f}", "", ""),
        ("from_function, one layer traced: traced (CPU s) / traces", f"{t_trace:.2f} / {traces}", "", ""),
        ("from_function, one layer traced: traced + prepared (CPU s)", f"{total:.2f}",
         f"<= {1.2 * hand_seconds:.2f}", f"{total / hand_seconds:.2f}x"),
        ("second call (cached): traced (CPU s) / new traces", f"{t_again:.3f} / {rules.trace_count() - count - traces}",
         "0 traces", ""),
    ]
    if whole:
        pieces_whole, whole_rows = whole_model(convert_whole, "whole model, plain")
        fields = lambda ps: sorted((p.dst, p.dst_start, p.size, p.src, p.src_start, p.perm, p.dtype) for p in ps)
        same = fields(pieces_whole) == fields(pieces) == fields(pieces_jitted)
        rows += whole_rows + jitted_rows + [
            ("whole-model (plain, jitted layer) and one-layer traces give the same pieces", str(same), "True", "")]
    return rows


def human(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4f} {unit}"
    return f"{n:.0f} B"


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main(argv=None) -> list[tuple]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a CI-size model (seconds)")
    parser.add_argument("--colocated", action="store_true", help="rollout on the trainer's first GPUs")
    parser.add_argument("--no-global", action="store_true", help="skip the global plan (per-rank only)")
    parser.add_argument("--traced", action="store_true", help="also plan from a traced conversion function")
    parser.add_argument("--whole-trace", action="store_true", help="with --traced: also trace the whole model")
    parser.add_argument("--repeat", type=int, default=1, help="with --traced: best of this many runs (a shared machine)")
    args = parser.parse_args(argv)
    c = SMALL if args.small else FULL
    bandwidths = reshard.Bandwidths(device=2000e9, nvlink=450e9, network=50e9)

    (src, (dst, rules, owners)), t_layouts = timed(lambda: (trainer_layouts(c), rollout(c, args.colocated)))
    params = sum(int(np.prod(l.shape)) for l in src.values())
    table = destination_table(c)
    planner, t_prepare = timed(lambda: reshard.Planner(src, dst, rules))
    receiver = owners[0]
    sender = src["layers/moe/wi_0"].owners[0]
    recv_plan, t_recv = timed(lambda: planner.plan(owner=receiver, cache=False))
    send_plan, t_send = timed(lambda: planner.plan(owner=sender, cache=False))
    _, t_check_rank = timed(recv_plan.check)
    rows = [
        ("parameters", f"{params / 1e9:.1f} G", "", ""),
        ("destination tensors", f"{len(dst)}", "", ""),
        ("layouts + rules built (s)", f"{t_layouts:.2f}", "", ""),
        ("prepare: rules lowered, layouts indexed (s)", f"{t_prepare:.2f}", "", ""),
        ("per-rank plan, a receiver (s)", f"{t_recv:.3f}", "< 0.5", f"{t_recv / 0.5:.2f}"),
        ("per-rank plan, a sender (s)", f"{t_send:.3f}", "< 0.5", f"{t_send / 0.5:.2f}"),
        ("per-rank check() (s)", f"{t_check_rank:.2f}", "", ""),
    ]
    if args.traced:
        rows += traced_rows(src, dst, table, args.whole_trace, args.repeat)
    if not args.no_global:
        plan, t_global = timed(lambda: planner.plan(cache=False))
        same = plan.for_owner(receiver) == recv_plan and plan.for_owner(sender) == send_plan
        _, t_check = timed(plan.check)
        sim, t_sim = timed(lambda: simulate(plan, bandwidths))
        shard_bytes = {id(l): sum(int(np.prod(l.shard_box(o)[1])) for o in l.owners) * l.dtype.itemsize
                       for l in dst.values()}
        needed = sum(shard_bytes[id(l)] for l in dst.values())  # every destination shard, once
        runs = int((plan.blocks[:, 3] * plan.blocks[:, 6]).sum())
        size_mb = (plan.transfers.nbytes + plan.blocks.nbytes) / 1e6
        recv_in = max(v for (o, cls, way), v in sim.links.items() if way == "in" and cls == "network") \
            if sim.bytes_by_class["network"] else 0
        floor = max(recv_in / bandwidths.network,
                    sim.bytes_by_class["network"] / (len(src["layers/moe/wi_0"].owners) * bandwidths.network))
        rows += [
            ("global plan, one core (s)", f"{t_global:.2f}", "< 20", f"{t_global / 20:.2f}"),
            ("global check(): every destination byte written once (s)", f"{t_check:.2f}", "", ""),
            ("per-rank plans equal the global plan's slices", str(same), "True", ""),
            ("plan size: transfers / blocks", f"{len(plan.transfers)} / {len(plan.blocks)}", "", ""),
            ("plan size: MB (segment rows if expanded)", f"{size_mb:.0f} ({runs})", "", ""),
            ("bytes moved / bytes needed (redundant)", human(plan.nbytes), human(needed), f"{plan.nbytes / needed:.4f} ({plan.nbytes - needed})"),
        ]
        rows += [(f"bytes over {k}", human(v), "", "") for k, v in sim.bytes_by_class.items()]
        rows += [
            (f"most-loaded / mean {sim.egress_class} egress link", f"{sim.egress_max_over_mean:.4f}", "<= 1.05",
             f"{sim.egress_max_over_mean / 1.05:.2f}"),
            ("busiest link", f"{sim.busiest[1]} {sim.busiest[2]} {sim.busiest[0]}", "", ""),
            ("predicted transfer time (s), ceiling: busiest port", f"{sim.seconds:.3f}", f"{floor:.3f}",
             f"{floor / sim.seconds:.3f}" if sim.seconds else ""),
            ("simulate() (s)", f"{t_sim:.2f}", "", ""),
        ]
    title = (f"plan_scale: {'small' if args.small else 'full'} model, trainer {len(src['layers/moe/wi_0'].owners)} GPUs "
             f"{c['mesh']} -> rollout TP{c['tp']} x {c['replicas']} ({'colocated' if args.colocated else 'other hosts'}); "
             f"network {bandwidths.network / 1e9:.0f} GB/s, NVLink {bandwidths.nvlink / 1e9:.0f} GB/s per GPU")
    print(title)
    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'value':>24}  {'goal/ceiling':>14}  {'ratio':>10}")
    for name, value, goal, ratio in rows:
        print(f"{name:<{width}}  {value:>24}  {goal:>14}  {ratio:>10}")
    return rows


if __name__ == "__main__":
    main()
