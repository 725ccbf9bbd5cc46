"""Tiny models for the preset tests, built independently of jax_amem's preset tables.

* `logical(family, rng)`: every weight of a tiny model in one canonical form (MaxText's:
  heads split, kernels (in, out), layers stacked on axis 0), as numpy.
* `source_tree(family, source, weights)`: the trainer tree in the 'flax' or 'maxtext' naming.
* `oracle(family, layout, weights, xp, tp)`: the rollout state dict, written out by hand with
  array operations only (so the same function runs under numpy, and under jax.numpy for
  `rules.from_function`).
* `hf_model(family, dtype)`: a transformers model of that family and these sizes;
  `vllm_module(state)`: plain torch modules with vLLM's names and shapes (vLLM itself is not
  installable here).
"""

import numpy as np

from jax_amem.reshard import names_tree

L, D, H, KV, HD, F, E, I, S, V = 2, 16, 4, 2, 4, 24, 4, 8, 8, 32
R, ROPE, NOPE, VHD = 8, 2, 2, 4          # DeepSeek MLA: kv rank, rope / nope / value head dims
GPT_F, POS = 64, 16
FAMILIES = ("llama", "qwen3", "qwen3_moe", "mixtral", "gemma", "gemma2", "gemma3", "deepseek", "gpt2", "qwen2",
            "phi3")


def _shapes(family, moe):
    if family == "gpt2":
        return {"q": (D, H, HD), "k": (D, H, HD), "v": (D, H, HD), "o": (H, HD, D), "q_bias": (H, HD),
                "k_bias": (H, HD), "v_bias": (H, HD), "o_bias": (D,), "attn_norm": (D,), "attn_norm_bias": (D,),
                "mlp_norm": (D,), "mlp_norm_bias": (D,), "fc": (D, GPT_F), "fc_bias": (GPT_F,),
                "down": (GPT_F, D), "down_bias": (D,)}
    if family == "deepseek":
        out = {"q": (D, H, NOPE + ROPE), "kv_a": (D, R + ROPE), "kv_norm": (R,), "kv_b": (R, H, NOPE + VHD),
               "o": (H, VHD, D)}
    else:
        out = {"q": (D, H, HD), "k": (D, KV, HD), "v": (D, KV, HD), "o": (H, HD, D)}
    out.update({"attn_norm": (D,), "mlp_norm": (D,)})
    if family in ("qwen3", "qwen3_moe", "gemma3"):
        out.update({"q_norm": (HD,), "k_norm": (HD,)})
    if family == "qwen2":
        out.update({"q_bias": (H, HD), "k_bias": (KV, HD), "v_bias": (KV, HD)})
    if family in ("gemma2", "gemma3"):
        out.update({"pre_ffw_norm": (D,), "post_ffw_norm": (D,)})
    if moe:
        out.update({"router": (D, E), "e_gate": (E, D, I), "e_up": (E, D, I), "e_down": (E, I, D)})
        if family == "deepseek":
            out.update({"router_bias": (E,), "s_gate": (D, S), "s_up": (D, S), "s_down": (S, D)})
    else:
        out.update({"gate": (D, F), "up": (D, F), "down": (F, D)})
    return out


def stacks(family):
    """(stack name, is MoE) per layer stack; DeepSeek: one dense layer then one MoE layer."""
    if family == "deepseek":
        return [("dense", False), ("moe", True)]
    return [("layers", family in ("qwen3_moe", "mixtral"))]


def logical(family, rng):
    def w(*shape):
        return (rng.standard_normal(shape) * 0.5).astype(np.float32)
    count = 1 if family == "deepseek" else L
    out = {stack: {k: w(count, *s) for k, s in _shapes(family, moe).items()} for stack, moe in stacks(family)}
    out["embed"] = w(V, D)
    out["final_norm"] = w(D)
    if family == "gpt2":
        out.update(pos_embed=w(POS, D), final_norm_bias=w(D))
    else:
        out["lm_head"] = w(D, V)
    return out


# The two source namings, written out here (not imported from presets.py).
FLAX = {"q": "attn/q/kernel", "k": "attn/k/kernel", "v": "attn/v/kernel", "o": "attn/o/kernel",
        "q_bias": "attn/q/bias", "k_bias": "attn/k/bias", "v_bias": "attn/v/bias", "o_bias": "attn/o/bias",
        "q_norm": "attn/q_norm/scale", "k_norm": "attn/k_norm/scale", "kv_a": "attn/kv_a/kernel",
        "kv_norm": "attn/kv_norm/scale", "kv_b": "attn/kv_b/kernel", "attn_norm": "input_norm/scale",
        "attn_norm_bias": "input_norm/bias", "mlp_norm": "post_attn_norm/scale",
        "mlp_norm_bias": "post_attn_norm/bias", "pre_ffw_norm": "pre_ffw_norm/scale",
        "post_ffw_norm": "post_ffw_norm/scale", "gate": "mlp/gate/kernel", "up": "mlp/up/kernel",
        "down": "mlp/down/kernel", "fc": "mlp/fc/kernel", "fc_bias": "mlp/fc/bias", "down_bias": "mlp/down/bias",
        "router": "moe/router/kernel", "router_bias": "moe/router/bias", "e_gate": "moe/experts/gate/kernel",
        "e_up": "moe/experts/up/kernel", "e_down": "moe/experts/down/kernel", "s_gate": "moe/shared/gate/kernel",
        "s_up": "moe/shared/up/kernel", "s_down": "moe/shared/down/kernel",
        "embed": "embed/embedding", "pos_embed": "pos_embed/embedding", "final_norm": "final_norm/scale",
        "final_norm_bias": "final_norm/bias", "lm_head": "lm_head/kernel"}
MAXTEXT = {"q": "self_attention/query/kernel", "k": "self_attention/key/kernel", "v": "self_attention/value/kernel",
           "o": "self_attention/out/kernel", "q_bias": "self_attention/query/bias",
           "k_bias": "self_attention/key/bias", "v_bias": "self_attention/value/bias",
           "o_bias": "self_attention/out/bias", "q_norm": "self_attention/query_norm/scale",
           "k_norm": "self_attention/key_norm/scale", "kv_a": "self_attention/wkv_a/kernel",
           "kv_norm": "self_attention/kv_norm/scale", "kv_b": "self_attention/wkv_b/kernel",
           "attn_norm": "pre_self_attention_layer_norm/scale", "attn_norm_bias": "pre_self_attention_layer_norm/bias",
           "mlp_norm": "post_self_attention_layer_norm/scale",
           "mlp_norm_bias": "post_self_attention_layer_norm/bias", "pre_ffw_norm": "pre_ffw_norm/scale",
           "post_ffw_norm": "post_ffw_norm/scale", "gate": "mlp/wi_0/kernel", "up": "mlp/wi_1/kernel",
           "down": "mlp/wo/kernel", "fc": "mlp/wi/kernel", "fc_bias": "mlp/wi/bias", "down_bias": "mlp/wo/bias",
           "router": "MoeBlock_0/gate/kernel", "router_bias": "MoeBlock_0/gate/bias", "e_gate": "MoeBlock_0/wi_0",
           "e_up": "MoeBlock_0/wi_1", "e_down": "MoeBlock_0/wo", "s_gate": "MoeBlock_0/shared_experts/wi_0/kernel",
           "s_up": "MoeBlock_0/shared_experts/wi_1/kernel", "s_down": "MoeBlock_0/shared_experts/wo/kernel",
           "embed": "token_embedder/embedding", "pos_embed": "decoder/position_embedder/embedding",
           "final_norm": "decoder/decoder_norm/scale", "final_norm_bias": "decoder/decoder_norm/bias",
           "lm_head": "decoder/logits_dense/kernel"}
# MaxText's MoE blocks are named per family (its Qwen3-MoE and DeepSeek modules).
MAXTEXT_MOE = {"qwen3_moe": {"router": "moe_block/gate/kernel", "e_gate": "moe_block/wi_0", "e_up": "moe_block/wi_1",
                             "e_down": "moe_block/wo"},
               "deepseek": {k: "DeepSeekMoeBlock_0/" + v for k, v in (
                   ("router", "MoeBlock_0/gate/kernel"), ("router_bias", "MoeBlock_0/gate/bias"),
                   ("e_gate", "MoeBlock_0/wi_0"), ("e_up", "MoeBlock_0/wi_1"), ("e_down", "MoeBlock_0/wo"),
                   ("s_gate", "shared_experts/wi_0/kernel"), ("s_up", "shared_experts/wi_1/kernel"),
                   ("s_down", "shared_experts/wo/kernel"))}}


def source_names(family, source):
    return FLAX if source == "flax" else {**MAXTEXT, **MAXTEXT_MOE.get(family, {})}


STACK_PATHS = {"flax": {"layers": "layers", "dense": "dense_layers", "moe": "moe_layers"},
               "maxtext": {"layers": "decoder/layers", "dense": "decoder/dense_layers", "moe": "decoder/moe_layers"}}
HEADS_SPLIT = {"q": 2, "k": 2, "v": 2, "kv_b": 2, "o": 1, "q_bias": 1, "k_bias": 1, "v_bias": 1}  # first head axis


def source_tree(family, source, weights):
    names = source_names(family, source)
    flat = {}
    for stack, _ in stacks(family):
        for key, value in weights[stack].items():
            if source == "flax" and key in HEADS_SPLIT:  # Flax keeps the head axes merged
                a = HEADS_SPLIT[key]
                value = value.reshape(value.shape[:a] + (-1,) + value.shape[a + 2:])
            flat[f"{STACK_PATHS[source][stack]}/{names[key]}"] = value
    for key in ("embed", "final_norm", "lm_head", "pos_embed", "final_norm_bias"):
        if key in weights:
            flat[names[key]] = weights[key]
    return names_tree(flat)


def oracle_from_source(family, layout, source, tree, xp, tp=2, tie=False):
    """The rollout's state dict computed from the *source tree* with array ops only (xp: numpy or
    jax.numpy); this is the conversion function a user would write."""
    names = source_names(family, source)
    get_tree = lambda path: _walk(tree, path)
    weights = {}
    for stack, moe in stacks(family):
        per = {}
        for key, shape in _shapes(family, moe).items():
            value = get_tree(f"{STACK_PATHS[source][stack]}/{names[key]}")
            if source == "flax" and key in HEADS_SPLIT:
                a = HEADS_SPLIT[key]
                value = value.reshape(value.shape[:a] + shape[a - 1:a + 1] + value.shape[a + 1:])
            per[key] = value
        weights[stack] = per
    for key in ("embed", "final_norm", "lm_head", "pos_embed", "final_norm_bias"):
        if key in names and _has(tree, names[key]):
            weights[key] = get_tree(names[key])
    return oracle(family, layout, weights, xp, tp, tie)


def _walk(tree, path):
    for p in path.split("/"):
        tree = tree[p]
    return tree


def _has(tree, path):
    try:
        _walk(tree, path)
        return True
    except KeyError:
        return False


def _fuse(xp, members, axis, tp):
    """vLLM per TP rank: rank r's slice of each member, in order."""
    chunks = [xp.split(m, tp, axis=axis) for m in members]
    return xp.concatenate([c[r] for r in range(tp) for c in chunks], axis=axis)


def oracle(family, layout, w, xp, tp=2, tie=False):
    """The rollout state dict from canonical weights `w` (see `logical`)."""
    T = lambda x: xp.transpose(x)
    heads_in = lambda x: T(x.reshape(x.shape[0], -1))                      # (in, N, hd) -> (N*hd, in)
    heads_out = lambda x: T(x.reshape(-1, x.shape[-1]))                    # (N, hd, out) -> (out, N*hd)
    vllm = layout == "vllm"
    out = {}
    if family == "gpt2":
        for i in range(L):
            l = {k: v[i] for k, v in w["layers"].items()}
            p = f"transformer.h.{i}."
            qkv = [l[n].reshape(D, -1) for n in "qkv"]                      # Conv1D (in, out)
            bias = [l[n + "_bias"].reshape(-1) for n in "qkv"]
            out.update({p + "ln_1.weight": l["attn_norm"], p + "ln_1.bias": l["attn_norm_bias"],
                        p + "attn.c_attn.weight": _fuse(xp, [T(x) for x in qkv], 0, tp) if vllm
                        else xp.concatenate(qkv, axis=1),
                        p + "attn.c_attn.bias": _fuse(xp, bias, 0, tp) if vllm else xp.concatenate(bias, axis=0),
                        p + "attn.c_proj.weight": heads_out(l["o"]) if vllm else l["o"].reshape(-1, D),
                        p + "attn.c_proj.bias": l["o_bias"], p + "ln_2.weight": l["mlp_norm"],
                        p + "ln_2.bias": l["mlp_norm_bias"], p + "mlp.c_fc.weight": T(l["fc"]) if vllm else l["fc"],
                        p + "mlp.c_fc.bias": l["fc_bias"], p + "mlp.c_proj.weight": T(l["down"]) if vllm else l["down"],
                        p + "mlp.c_proj.bias": l["down_bias"]})
        out.update({"transformer.wte.weight": w["embed"], "transformer.wpe.weight": w["pos_embed"],
                    "transformer.ln_f.weight": w["final_norm"], "transformer.ln_f.bias": w["final_norm_bias"]})
        return out
    index = 0
    for stack, moe in stacks(family):
        for i in range(w[stack]["attn_norm"].shape[0]):
            l = {k: v[i] for k, v in w[stack].items()}
            p = f"model.layers.{index}."
            index += 1
            if family == "deepseek":
                out.update({p + "self_attn.q_proj.weight": heads_in(l["q"]),
                            p + "self_attn.kv_a_proj_with_mqa.weight": T(l["kv_a"]),
                            p + "self_attn.kv_a_layernorm.weight": l["kv_norm"],
                            p + "self_attn.kv_b_proj.weight": heads_in(l["kv_b"])})
            else:
                q, k, v = heads_in(l["q"]), heads_in(l["k"]), heads_in(l["v"])
                if vllm:
                    out[p + "self_attn.qkv_proj.weight"] = _fuse(xp, [q, k, v], 0, tp)
                elif family == "phi3":   # Phi-3's checkpoint: whole q, k, v rows one after another
                    out[p + "self_attn.qkv_proj.weight"] = xp.concatenate([q, k, v], axis=0)
                else:
                    out.update({p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                                p + "self_attn.v_proj.weight": v})
                if "q_bias" in l:
                    bias = [l[n + "_bias"].reshape(-1) for n in "qkv"]
                    if vllm:
                        out[p + "self_attn.qkv_proj.bias"] = _fuse(xp, bias, 0, tp)
                    else:
                        out.update({p + f"self_attn.{n}_proj.bias": b for n, b in zip("qkv", bias)})
            out[p + "self_attn.o_proj.weight"] = heads_out(l["o"])
            out[p + "input_layernorm.weight"] = l["attn_norm"]
            out[p + "post_attention_layernorm.weight"] = l["mlp_norm"]
            if "q_norm" in l:
                out[p + "self_attn.q_norm.weight"] = l["q_norm"]
                out[p + "self_attn.k_norm.weight"] = l["k_norm"]
            if "pre_ffw_norm" in l:
                out[p + "pre_feedforward_layernorm.weight"] = l["pre_ffw_norm"]
                out[p + "post_feedforward_layernorm.weight"] = l["post_ffw_norm"]
            if moe:
                m = p + ("block_sparse_moe." if family == "mixtral" and vllm else "mlp.")
                gate, up = xp.transpose(l["e_gate"], (0, 2, 1)), xp.transpose(l["e_up"], (0, 2, 1))
                down = xp.transpose(l["e_down"], (0, 2, 1))
                out[m + "gate.weight"] = T(l["router"])
                if vllm:
                    out[m + "experts.w13_weight"] = _fuse(xp, [gate, up], 1, tp)
                    out[m + "experts.w2_weight"] = down
                else:
                    out[m + "experts.gate_up_proj"] = xp.concatenate([gate, up], axis=1)
                    out[m + "experts.down_proj"] = down
                if family == "deepseek":
                    out[m + "gate.e_score_correction_bias"] = l["router_bias"]
                    sg, su, sd = T(l["s_gate"]), T(l["s_up"]), T(l["s_down"])
                    if vllm:
                        out[m + "shared_experts.gate_up_proj.weight"] = _fuse(xp, [sg, su], 0, tp)
                    else:
                        out[m + "shared_experts.gate_proj.weight"] = sg
                        out[m + "shared_experts.up_proj.weight"] = su
                    out[m + "shared_experts.down_proj.weight"] = sd
            else:
                gate, up = T(l["gate"]), T(l["up"])
                if vllm:
                    out[p + "mlp.gate_up_proj.weight"] = _fuse(xp, [gate, up], 0, tp)
                elif family == "phi3":   # Phi-3's checkpoint: gate's rows, then up's
                    out[p + "mlp.gate_up_proj.weight"] = xp.concatenate([gate, up], axis=0)
                else:
                    out[p + "mlp.gate_proj.weight"] = gate
                    out[p + "mlp.up_proj.weight"] = up
                out[p + "mlp.down_proj.weight"] = T(l["down"])
    out["model.embed_tokens.weight"] = w["embed"]
    out["model.norm.weight"] = w["final_norm"]
    if not tie:
        out["lm_head.weight"] = T(w["lm_head"])
    return out


def hf_model(family):
    """A transformers model of `family` with the sizes above (None if transformers lacks it)."""
    import transformers as T
    base = dict(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=L, num_attention_heads=H,
                num_key_value_heads=KV, head_dim=HD, tie_word_embeddings=False)
    if family == "llama":
        config, cls = T.LlamaConfig(**base), T.LlamaForCausalLM
    elif family == "qwen3":
        config, cls = T.Qwen3Config(**base), T.Qwen3ForCausalLM
    elif family == "qwen2":
        config, cls = T.Qwen2Config(**base), T.Qwen2ForCausalLM
    elif family == "qwen3_moe":
        config, cls = T.Qwen3MoeConfig(**base, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=2,
                                       decoder_sparse_step=1, mlp_only_layers=[]), T.Qwen3MoeForCausalLM
    elif family == "mixtral":
        config = T.MixtralConfig(**{**base, "intermediate_size": I}, num_local_experts=E, num_experts_per_tok=2)
        cls = T.MixtralForCausalLM
    elif family == "gemma":
        config, cls = T.GemmaConfig(**base), T.GemmaForCausalLM
    elif family == "gemma2":
        config, cls = T.Gemma2Config(**base), T.Gemma2ForCausalLM
    elif family == "gemma3":
        config, cls = T.Gemma3TextConfig(**base), T.Gemma3ForCausalLM
    elif family == "phi3":   # pad_token_id: Phi-3's default (32000) is no row of this vocabulary; Llama's eps
        config, cls = T.Phi3Config(**base, pad_token_id=None, rms_norm_eps=1e-6), T.Phi3ForCausalLM
    elif family == "deepseek":
        config = T.DeepseekV3Config(vocab_size=V, hidden_size=D, intermediate_size=F, moe_intermediate_size=I,
                                    num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=H,
                                    n_routed_experts=E, n_shared_experts=1, num_experts_per_tok=2,
                                    first_k_dense_replace=1, q_lora_rank=None, kv_lora_rank=R,
                                    qk_rope_head_dim=ROPE, qk_nope_head_dim=NOPE, v_head_dim=VHD, n_group=1,
                                    topk_group=1, tie_word_embeddings=False)
        cls = T.DeepseekV3ForCausalLM
    else:
        config = T.GPT2Config(vocab_size=V, n_embd=D, n_layer=L, n_head=H, n_positions=POS, n_inner=GPT_F,
                              bos_token_id=0, eos_token_id=0)
        cls = T.GPT2LMHeadModel
    return cls(config).eval()


def vllm_module(state):
    """Plain torch modules holding parameters with vLLM's names and shapes."""
    import torch
    root = torch.nn.Module()
    for name, value in state.items():
        node = root
        *parents, leaf = name.split(".")
        for p in parents:
            if not hasattr(node, p):
                node.add_module(p, torch.nn.Module())
            node = getattr(node, p)
        node.register_parameter(leaf, torch.nn.Parameter(torch.empty(tuple(value.shape)), requires_grad=False))
    return root
