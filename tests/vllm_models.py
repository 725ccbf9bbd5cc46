"""Tiny models for the vLLM tests: a trainer tree (Flax or MaxText naming) and the same weights
as a transformers model, each written out by hand here (not through jax_amem's presets), so
transformers and vLLM's own loader are the oracles.

Sizes: CPU attention in vLLM needs head_dim 64 (it refuses 16). Mixtral, Qwen2 and GPT-2 have
D // HD query heads: MaxText's Mixtral exporter reshapes the out kernel (heads, head_dim, hidden)
as (hidden, -1), which is its transpose only where heads * head_dim == hidden (as in every
Mixtral), and vLLM's Qwen2 and GPT-2 take head_dim as hidden // heads (a config's head_dim is
not read).

Families: llama, qwen3 (tied), qwen3_moe, mixtral, qwen2 (q/k/v biases), gemma (tied; Llama's
tensors), gemma2 (tied; its pre/post feed-forward norms, soft-capping from transformers' defaults),
gemma3 (tied; Gemma2's norms and per-head q/k norms; its sliding window, 4096 by default, is wider
than the engines' max_model_len, so local and global layers attend alike), gpt2 (tied; biases,
LayerNorms, learned positions, a plain fc/down MLP, a padded vocabulary), deepseek (MLA, a
dense stack then an MoE stack with shared experts) and phi3 (Llama's tensors, its checkpoint
fusing q/k/v into qkv_proj and gate/up into gate_up_proj, which vLLM's loader splits per rank).

Variants (hf_variant, flax_of): a transformers Llama-style class with config options (tied, KV
heads, head_dim, rope_scaling, biases), its weights drawn here and its trainer tree read back.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

L, D, H, KV, HD, F, V = 2, 128, 4, 2, 64, 192, 256
E, I = 4, 64  # MoE: experts, expert width
MOE = ("qwen3_moe", "mixtral")
# DeepSeek's multi-head latent attention: vLLM-CPU's MLA kernel takes only a latent of 512 and
# 64 rotary features (its cache rows are 576 wide); query/key heads of NOPE + ROPE, values of HD.
# Layer 0 dense, the others MoE with a shared expert (first_k_dense_replace=1).
R, ROPE, NOPE = 512, 64, 64
P = 256  # positions (GPT-2's learned ones; every model's max_position_embeddings)
# GPT-2's vocabulary (50257) is no multiple of 64: vLLM pads its embedding to one (here 300 ->
# 320 rows, zeros in the padding), and at TP=2 the last rank holds the padding rows.
PADDED_V = {"gpt2": 300}


def vocab(family: str) -> int:
    return PADDED_V.get(family, V)


def embedding_scale(family: str) -> float:
    """A tied head's logits are the last hidden state against the embedding: with unit-scale
    embeddings the token's own row dominates the residual stream, and greedy decoding repeats
    the prompt's last token whatever the layers hold (no check against transformers could fail).
    Small tied embeddings leave the layers to choose the tokens."""
    return 0.05 if tied(family) else 1.0


def heads(family: str) -> int:
    return D // HD if family in ("mixtral", "qwen2", "gpt2", "deepseek") else H


def flax_tree(family: str, seed: int, kv: int = KV) -> dict:
    """Random weights in the Flax naming (kernels (in, out), heads merged, layers stacked), with
    `kv` KV heads."""
    rng = np.random.default_rng(seed)
    h = heads(family)

    def w(*shape, scale=None):
        return (rng.standard_normal(shape) * (scale or shape[-2] ** -0.5 if len(shape) > 1 else 1)).astype(np.float32)

    def norm(*shape):
        return (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)

    def bias(*shape):
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)

    if family == "deepseek":   # a dense stack of one layer, then the MoE stack
        return {"embed": {"embedding": w(V, D, scale=1.0)}, "dense_layers": _deepseek_layers(1, False, w, norm, bias),
                "moe_layers": _deepseek_layers(L - 1, True, w, norm, bias), "final_norm": {"scale": norm(D)},
                "lm_head": {"kernel": w(D, V)}}   # untied, as DeepSeek's
    attn = {"q": {"kernel": w(L, D, h * HD)}, "k": {"kernel": w(L, D, kv * HD)},
            "v": {"kernel": w(L, D, kv * HD)}, "o": {"kernel": w(L, h * HD, D)}}
    if family in ("qwen3", "qwen3_moe", "gemma3"):
        attn["q_norm"] = {"scale": norm(L, HD)}
        attn["k_norm"] = {"scale": norm(L, HD)}
    if family in ("qwen2", "gpt2"):
        for x, n in (("q", h), ("k", kv), ("v", kv)):
            attn[x]["bias"] = bias(L, n * HD)
    layers = {"attn": attn, "input_norm": {"scale": norm(L, D)}, "post_attn_norm": {"scale": norm(L, D)}}
    if family in ("gemma2", "gemma3"):
        layers["pre_ffw_norm"] = {"scale": norm(L, D)}
        layers["post_ffw_norm"] = {"scale": norm(L, D)}
    if family == "gpt2":   # LayerNorm biases, output biases, a fc/down MLP, learned positions
        attn["o"]["bias"] = bias(L, D)
        for n in ("input_norm", "post_attn_norm"):
            layers[n]["bias"] = bias(L, D)
        layers["mlp"] = {"fc": {"kernel": w(L, D, F), "bias": bias(L, F)},
                         "down": {"kernel": w(L, F, D), "bias": bias(L, D)}}
        return {"embed": {"embedding": w(vocab(family), D, scale=embedding_scale(family))},
                "pos_embed": {"embedding": w(P, D, scale=0.1)}, "layers": layers,
                "final_norm": {"scale": norm(D), "bias": bias(D)}}
    if family in MOE:
        layers["moe"] = {"router": {"kernel": w(L, D, E)},
                         "experts": {"gate": {"kernel": w(L, E, D, I)}, "up": {"kernel": w(L, E, D, I)},
                                     "down": {"kernel": w(L, E, I, D)}}}
    else:
        layers["mlp"] = {"gate": {"kernel": w(L, D, F)}, "up": {"kernel": w(L, D, F)},
                         "down": {"kernel": w(L, F, D)}}
    tree = {"embed": {"embedding": w(V, D, scale=embedding_scale(family))}, "layers": layers,
            "final_norm": {"scale": norm(D)}}
    if not tied(family):
        tree["lm_head"] = {"kernel": w(D, V)}
    return tree


def _deepseek_layers(n: int, moe: bool, w, norm, bias) -> dict:
    """n DeepSeek layers in the presets' Flax naming: MLA (q, kv_a, kv_norm, kv_b, o), and the
    router with its score-correction bias, routed experts and a shared expert, or a dense MLP."""
    h = heads("deepseek")
    attn = {"q": {"kernel": w(n, D, h * (NOPE + ROPE))}, "kv_a": {"kernel": w(n, D, R + ROPE)},
            "kv_norm": {"scale": norm(n, R)}, "kv_b": {"kernel": w(n, R, h * (NOPE + HD))},
            "o": {"kernel": w(n, h * HD, D)}}
    layers = {"attn": attn, "input_norm": {"scale": norm(n, D)}, "post_attn_norm": {"scale": norm(n, D)}}
    if not moe:
        layers["mlp"] = {x: {"kernel": w(n, *shape)}
                         for x, shape in (("gate", (D, F)), ("up", (D, F)), ("down", (F, D)))}
        return layers
    layers["moe"] = {"router": {"kernel": w(n, D, E), "bias": bias(n, E)},
                     "experts": {x: {"kernel": w(n, E, *shape)} for x, shape in (("gate", (D, I)), ("up", (D, I)),
                                                                                ("down", (I, D)))},
                     "shared": {x: {"kernel": w(n, *shape)} for x, shape in (("gate", (D, I)), ("up", (D, I)),
                                                                            ("down", (I, D)))}}
    return layers


def maxtext_tree(flax: dict, scan_axis: int = 0) -> dict:
    """The same weights in MaxText's naming (heads split, experts under Mixtral's MoeBlock_0), every
    layer tensor stacked on `scan_axis` (MaxText's param_scan_axis: 1 by default; experts then
    (E, L, D, I))."""
    tree = _maxtext_stacked(flax)
    tree["decoder"]["layers"] = _moved(tree["decoder"]["layers"], scan_axis)
    return tree


def _moved(tree: dict, scan_axis: int) -> dict:
    return {k: _moved(v, scan_axis) if isinstance(v, dict) else np.moveaxis(v, 0, scan_axis) for k, v in tree.items()}


def served(family: str, source: str, flax: dict) -> dict:
    """The Flax-style tree of the weights an engine serves after an update from `flax` in the
    `source` naming (maxtext_tree): for MaxText's Llama and Mixtral what MaxText's exporter writes
    (its hooks from maxtext_exporter.py: the query scaled by sqrt(head_dim); Llama's q and k's
    rotary halves reordered, evens then odds), otherwise `flax` itself."""
    import maxtext_exporter as X
    if source != "maxtext" or family not in X.SCALES_QUERIES:
        return flax
    hooks = X.hooks(family, head_dim=HD, hidden=D)
    out = {**flax, "layers": {**flax["layers"], "attn": dict(flax["layers"]["attn"])}}
    for x, name in (("q", "query"), ("k", "key")):
        kernel = flax["layers"]["attn"][x]["kernel"]                   # (L, D, heads * HD): MaxText's, heads merged
        chain = hooks[f"params-decoder-layers-self_attention-{name}-kernel"]
        target = (kernel.shape[-1], D)                                 # Hugging Face (out, in)
        layers = []
        for i in range(L):
            value = kernel[i].reshape(D, -1, HD)
            for hook in chain:
                value = hook(value, target)
            layers.append(np.ascontiguousarray(value.T))               # back to a kernel (in, out)
        out["layers"]["attn"][x] = {"kernel": np.stack(layers)}
    return out


def _maxtext_stacked(flax: dict) -> dict:
    lay = flax["layers"]
    a = lay["attn"]
    h, kv = (a[x]["kernel"].shape[-1] // HD for x in "qk")
    attn = {"query": {"kernel": a["q"]["kernel"].reshape(L, D, h, HD)},
            "key": {"kernel": a["k"]["kernel"].reshape(L, D, kv, HD)},
            "value": {"kernel": a["v"]["kernel"].reshape(L, D, kv, HD)},
            "out": {"kernel": a["o"]["kernel"].reshape(L, h, HD, D)}}
    if "q_norm" in a:
        attn["query_norm"] = {"scale": a["q_norm"]["scale"]}
        attn["key_norm"] = {"scale": a["k_norm"]["scale"]}
    layers = {"self_attention": attn, "pre_self_attention_layer_norm": {"scale": lay["input_norm"]["scale"]},
              "post_self_attention_layer_norm": {"scale": lay["post_attn_norm"]["scale"]}}
    if "moe" in lay:
        m = lay["moe"]
        layers["MoeBlock_0"] = {"gate": {"kernel": m["router"]["kernel"]}, "wi_0": m["experts"]["gate"]["kernel"],
                                "wi_1": m["experts"]["up"]["kernel"], "wo": m["experts"]["down"]["kernel"]}
    else:
        layers["mlp"] = {"wi_0": {"kernel": lay["mlp"]["gate"]["kernel"]}, "wi_1": {"kernel": lay["mlp"]["up"]["kernel"]},
                         "wo": {"kernel": lay["mlp"]["down"]["kernel"]}}
    decoder = {"layers": layers, "decoder_norm": {"scale": flax["final_norm"]["scale"]}}
    if "lm_head" in flax:
        decoder["logits_dense"] = {"kernel": flax["lm_head"]["kernel"]}
    return {"token_embedder": {"embedding": flax["embed"]["embedding"]}, "decoder": decoder}


def tied(family: str) -> bool:
    return family in ("qwen3", "gemma", "gemma2", "gemma3", "gpt2")   # Gemma's and GPT-2's are always tied


def hf_config(family: str, kv: int = KV):
    import transformers as T
    base = dict(vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=L,
                num_attention_heads=heads(family), num_key_value_heads=kv, head_dim=HD, max_position_embeddings=P,
                tie_word_embeddings=tied(family))
    if family == "llama":
        return T.LlamaConfig(**base), T.LlamaForCausalLM
    if family == "qwen2":
        return T.Qwen2Config(**base), T.Qwen2ForCausalLM
    if family == "gemma":
        return T.GemmaConfig(**base), T.GemmaForCausalLM
    if family == "phi3":   # pad_token_id: Phi-3's default (32000) is no row of this vocabulary
        return T.Phi3Config(**base, pad_token_id=None), T.Phi3ForCausalLM
    if family == "gemma3":   # Gemma3's attention scale reads query_pre_attn_scalar (256 by default), as Gemma2's
        return T.Gemma3TextConfig(**base, query_pre_attn_scalar=HD), T.Gemma3ForCausalLM
    if family == "gemma2":   # eager attention: transformers soft-caps the attention logits only there
        return T.Gemma2Config(**base, query_pre_attn_scalar=HD, attn_implementation="eager"), T.Gemma2ForCausalLM
    if family == "gpt2":
        return (T.GPT2Config(vocab_size=vocab(family), n_positions=P, n_embd=D, n_layer=L, n_head=heads(family),
                             n_inner=F, tie_word_embeddings=True), T.GPT2LMHeadModel)
    if family == "qwen3":
        return T.Qwen3Config(**base), T.Qwen3ForCausalLM
    if family == "mixtral":
        return (T.MixtralConfig(**{**base, "intermediate_size": I}, num_local_experts=E, num_experts_per_tok=2),
                T.MixtralForCausalLM)
    if family == "deepseek":
        return (T.DeepseekV3Config(**{**base, "head_dim": None}, moe_intermediate_size=I, n_shared_experts=1,
                                   n_routed_experts=E, routed_scaling_factor=1.0, kv_lora_rank=R, q_lora_rank=None,
                                   qk_rope_head_dim=ROPE, v_head_dim=HD, qk_nope_head_dim=NOPE, n_group=1,
                                   topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1,
                                   topk_method="noaux_tc", scoring_func="sigmoid"),   # as DeepSeek-V3's config.json
                T.DeepseekV3ForCausalLM)
    return (T.Qwen3MoeConfig(**base, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=2,
                             decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True),
            T.Qwen3MoeForCausalLM)


def hf_model(family: str, tree: dict):
    """A transformers model holding `tree`'s weights (float32, eval); its KV heads as many as the tree's."""
    import torch
    stacks = [tree["dense_layers"], tree["moe_layers"]] if family == "deepseek" else [tree["layers"]]
    kv = heads(family) if family == "deepseek" else tree["layers"]["attn"]["k"]["kernel"].shape[-1] // HD
    config, cls = hf_config(family, kv=kv)
    model = cls(config).eval()
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    if family == "gpt2":
        return _loaded(model, _gpt2_state(tree, t))
    state = {"model.embed_tokens.weight": t(tree["embed"]["embedding"]), "model.norm.weight": t(tree["final_norm"]["scale"])}
    state["lm_head.weight"] = t(tree["lm_head"]["kernel"].T if "lm_head" in tree else tree["embed"]["embedding"])
    # (stack, index in it) per layer number: DeepSeek's dense stack, then its MoE stack
    layers = [(lay, j) for lay in stacks for j in range(lay["input_norm"]["scale"].shape[0])]
    for n, (lay, i) in enumerate(layers):
        p = f"model.layers.{n}."
        mla = {"q": "q_proj", "kv_a": "kv_a_proj_with_mqa", "kv_b": "kv_b_proj", "o": "o_proj"}
        for x, name in (mla if "kv_a" in lay["attn"] else {x: f"{x}_proj" for x in "qkvo"}).items():
            state[p + f"self_attn.{name}.weight"] = t(lay["attn"][x]["kernel"][i].T)
            if "bias" in lay["attn"][x]:
                state[p + f"self_attn.{name}.bias"] = t(lay["attn"][x]["bias"][i])
        if "kv_norm" in lay["attn"]:
            state[p + "self_attn.kv_a_layernorm.weight"] = t(lay["attn"]["kv_norm"]["scale"][i])
        if "q_norm" in lay["attn"]:
            state[p + "self_attn.q_norm.weight"] = t(lay["attn"]["q_norm"]["scale"][i])
            state[p + "self_attn.k_norm.weight"] = t(lay["attn"]["k_norm"]["scale"][i])
        state[p + "input_layernorm.weight"] = t(lay["input_norm"]["scale"][i])
        state[p + "post_attention_layernorm.weight"] = t(lay["post_attn_norm"]["scale"][i])
        if "pre_ffw_norm" in lay:
            state[p + "pre_feedforward_layernorm.weight"] = t(lay["pre_ffw_norm"]["scale"][i])
            state[p + "post_feedforward_layernorm.weight"] = t(lay["post_ffw_norm"]["scale"][i])
        if "moe" in lay:
            m = lay["moe"]
            state[p + "mlp.gate.weight"] = t(m["router"]["kernel"][i].T)
            gate, up, down = (m["experts"][k]["kernel"][i] for k in ("gate", "up", "down"))
            state[p + "mlp.experts.gate_up_proj"] = t(np.concatenate([gate, up], axis=2).transpose(0, 2, 1))
            state[p + "mlp.experts.down_proj"] = t(down.transpose(0, 2, 1))
            if "bias" in m["router"]:
                state[p + "mlp.gate.e_score_correction_bias"] = t(m["router"]["bias"][i])
            for x in m.get("shared", ()):
                state[p + f"mlp.shared_experts.{x}_proj.weight"] = t(m["shared"][x]["kernel"][i].T)
        else:
            for x in ("gate", "up", "down"):
                state[p + f"mlp.{x}_proj.weight"] = t(lay["mlp"][x]["kernel"][i].T)
    return _loaded(model, _phi3_fused(state) if family == "phi3" else state)


def _phi3_fused(state: dict) -> dict:
    """Phi-3's checkpoint names for Llama's tensors: each layer's q, k and v rows one after
    another in qkv_proj, gate's then up's in gate_up_proj."""
    import torch
    out = dict(state)
    for i in range(L):
        p = f"model.layers.{i}."
        for fused, parts in (("self_attn.qkv_proj", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
                             ("mlp.gate_up_proj", ("mlp.gate_proj", "mlp.up_proj"))):
            out[f"{p}{fused}.weight"] = torch.cat([out.pop(f"{p}{x}.weight") for x in parts])
    return out


def _gpt2_state(tree: dict, t) -> dict:
    """GPT-2's checkpoint names for a Flax-style tree: Conv1D kernels stay (in, out), q/k/v fused
    side by side in c_attn."""
    lay = tree["layers"]
    state = {"transformer.wte.weight": t(tree["embed"]["embedding"]),
             "transformer.wpe.weight": t(tree["pos_embed"]["embedding"]),
             "transformer.ln_f.weight": t(tree["final_norm"]["scale"]),
             "transformer.ln_f.bias": t(tree["final_norm"]["bias"])}
    for i in range(L):
        p, a = f"transformer.h.{i}.", lay["attn"]
        for key, name in (("kernel", "weight"), ("bias", "bias")):
            state[p + f"attn.c_attn.{name}"] = t(np.concatenate([a[x][key][i] for x in "qkv"], axis=-1))
        for name, part in (("attn.c_proj", a["o"]), ("mlp.c_fc", lay["mlp"]["fc"]), ("mlp.c_proj", lay["mlp"]["down"]),
                           ("ln_1", lay["input_norm"]), ("ln_2", lay["post_attn_norm"])):
            for key, value in part.items():
                state[p + name + (".bias" if key == "bias" else ".weight")] = t(value[i])
    return state


def _loaded(model, state: dict):
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    return model


def checkpoint(model, directory) -> dict:
    """`model` saved with save_pretrained into `directory`; returns the checkpoint's tensors
    (the names and form vLLM's loader reads)."""
    import safetensors.torch
    model.save_pretrained(directory)
    return safetensors.torch.load_file(f"{directory}/model.safetensors")


def hf_greedy(model, prompt: list[int], new_tokens: int) -> list[int]:
    import torch
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                             do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


# ----------------------------------------------------------------------------- engines (need vLLM)

# Longer than vLLM's 16-token KV block, so a rerun of a prompt finds cached blocks.
PROMPTS = [[(7 * i + 3) % V for i in range(40)], [1, 5, 9, 33, 2]]
NEW_TOKENS = 8


def start(directory, backend: bool = True, tp: int = 1):
    """A vLLM engine on the checkpoint in `directory`, with the jax_amem backend or without.

    Engines no longer referenced are collected first: an engine's finalizer shuts its engine
    core down, which tears down vLLM's parallel groups (per process), so an engine collected
    at some later, arbitrary moment would take them from the one started here."""
    import gc

    import vllm

    gc.collect()
    kwargs = {"weight_transfer_config": {"backend": "jax_amem"}} if backend else {}
    if tp > 1:
        kwargs["tensor_parallel_size"] = tp
    if "kv_lora_rank" in json.loads((Path(directory) / "config.json").read_text()):
        # MLA (DeepSeek): on a CPU with AMX tiles vLLM-CPU prefers its AMX backend, which packs
        # the latent's weights as bfloat16 and refuses a float32 engine at load; its reference
        # MLA backend serves float32 on every CPU.
        kwargs["attention_config"] = {"backend": "CPU_MLA"}
    return vllm.LLM(model=str(directory), skip_tokenizer_init=True, dtype="float32", max_model_len=128,
                    enforce_eager=True, kv_cache_memory_bytes=64 << 20, **kwargs)


def shut(llm):
    """Shuts the engine's core down now (vLLM's own shutdown: once; its finalizer then does
    nothing). The tests shut every engine they start when done with it: vLLM keeps its parallel
    groups per process, an engine's shutdown tears them down, and a new engine in the same
    process reuses groups left standing (an MoE engine after a dense one then lacks its expert
    group)."""
    llm.llm_engine.engine_core.shutdown()


def greedy(llm, logprobs: int = 0):
    """The engine's greedy tokens for PROMPTS, and with `logprobs` its top ones at each step."""
    import vllm

    # ignore_eos: transformers' generate (hf_greedy) runs without an end token; a random model's
    # greedy path may pass through the config's eos_token_id (2 in Llama's), where vLLM would stop.
    params = vllm.SamplingParams(max_tokens=NEW_TOKENS, temperature=0, detokenize=False, logprobs=logprobs or None,
                                 ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    if not logprobs:
        return tokens
    return tokens, [[{k: v.logprob for k, v in step.items()} for step in o.outputs[0].logprobs] for o in outs]


# ----------------------------------------------------------------------------- variants from a config

# Checkpoint variants of the Llama-style families as users' checkpoints have them (tests/
# test_vllm_variants.py): each a transformers class and config options; the weights are drawn
# here (random_weights) and the trainer's Flax-style tree read back from the model (flax_of).
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32, "rope_theta": 500000.0}


def hf_variant(cls_name: str, seed: int, *, tied: bool, head_dim: int = HD, kv: int = KV, heads: int = H, **extra):
    """A transformers `cls_name` (e.g. "MistralForCausalLM") of this module's sizes with `extra`
    config options, its weights drawn from `seed` (random_weights)."""
    import transformers as T
    config = getattr(T, cls_name.replace("ForCausalLM", "Config"))(
        vocab_size=V, hidden_size=D, intermediate_size=F, num_hidden_layers=L, num_attention_heads=heads,
        num_key_value_heads=kv, head_dim=head_dim, max_position_embeddings=P, tie_word_embeddings=tied, **extra)
    return random_weights(getattr(T, cls_name)(config).eval(), seed)


def random_weights(model, seed: int):
    """`model` with weights of the scales flax_tree draws: kernels of unit-variance outputs, norms
    near 1, biases near 0, a tied embedding small (embedding_scale says why)."""
    import torch
    rng = np.random.default_rng(seed)
    tied_head = model.config.tie_word_embeddings
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                value = 1 + 0.1 * rng.standard_normal(p.shape)
            elif name.endswith("bias"):
                value = 0.1 * rng.standard_normal(p.shape)
            elif "embed_tokens" in name:
                value = rng.standard_normal(p.shape) * (0.05 if tied_head else 1.0)
            else:
                value = rng.standard_normal(p.shape) * p.shape[1] ** -0.5
            p.copy_(torch.from_numpy(value.astype(np.float32)))
    return model


def flax_of(model) -> dict:
    """The Flax-style tree (flax_tree's naming) of a transformers Llama-style model: kernels (in, out),
    layers stacked; its q/k/v/o and MLP biases and q/k norms where it has them, lm_head where untied."""
    state = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    layers = range(model.config.num_hidden_layers)

    def stack(name: str, kernel: bool):
        return np.stack([state[f"model.layers.{i}.{name}"].T if kernel else state[f"model.layers.{i}.{name}"]
                         for i in layers])

    def linear(module: str) -> dict:
        out = {"kernel": stack(f"{module}.weight", True)}
        if f"model.layers.0.{module}.bias" in state:
            out["bias"] = stack(f"{module}.bias", False)
        return out

    attn = {x: linear(f"self_attn.{x}_proj") for x in "qkvo"}
    attn.update({x: {"scale": stack(f"self_attn.{x}.weight", False)} for x in ("q_norm", "k_norm")
                 if f"model.layers.0.self_attn.{x}.weight" in state})
    tree = {"embed": {"embedding": state["model.embed_tokens.weight"]},
            "layers": {"attn": attn, "mlp": {x: linear(f"mlp.{x}_proj") for x in ("gate", "up", "down")},
                       "input_norm": {"scale": stack("input_layernorm.weight", False)},
                       "post_attn_norm": {"scale": stack("post_attention_layernorm.weight", False)}},
            "final_norm": {"scale": state["model.norm.weight"]}}
    if not model.config.tie_word_embeddings:
        tree["lm_head"] = {"kernel": state["lm_head.weight"].T}
    return tree
