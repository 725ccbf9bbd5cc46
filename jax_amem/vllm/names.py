"""Rule destinations matched to the engine's parameter names.

The presets name vLLM's fused tensors the way vLLM's checkpoint loaders do; a vLLM release may
hold a tensor one module deeper (vLLM 0.32 keeps MoE experts under `experts.routed_experts.`).
A rule whose name the engine lacks is moved to the one engine name that differs from it only
by such inserted path segments; anything else left over is reported, both ways, by name.
"""

from __future__ import annotations

import dataclasses

from ..reshard.listing import few
from .errors import VllmPlanError


def _segments(name: str) -> list[str]:
    return name.split(".")


def _is_deeper(engine_name: str, rule_name: str) -> bool:
    """engine_name is rule_name with extra segments inserted (order kept, same last segment)."""
    want, have = _segments(rule_name), _segments(engine_name)
    if len(have) <= len(want) or want[-1] != have[-1]:
        return False
    it = iter(have)
    return all(segment in it for segment in want)


def match(rules: list, engine_names: list[str], from_preset: bool = True) -> list:
    """`rules` (Rules or Pieces) with destinations renamed to the engine's names; VllmPlanError
    listing every engine tensor no rule writes and every rule the engine has no tensor for, with
    advice for a preset's rules (`from_preset`) or for the user's own (connect's rules=)."""
    names = set(engine_names)
    spare = sorted(names - {r.dst for r in rules})
    rename, unknown = {}, []
    for dst in dict.fromkeys(r.dst for r in rules):
        if dst in names:
            continue
        candidates = [n for n in spare if _is_deeper(n, dst)]
        if len(candidates) == 1:
            rename[dst] = candidates[0]
            spare.remove(candidates[0])
        else:
            unknown.append(dst)
    renamed = [dataclasses.replace(r, dst=rename[r.dst]) if r.dst in rename else r for r in rules]
    unwritten = sorted(names - {r.dst for r in renamed})
    if unknown or unwritten:
        raise VllmPlanError(
            "the rules do not match the engine's model: "
            + (f"{len(unwritten)} engine tensor(s) no rule writes: {few(unwritten)}; " if unwritten else "")
            + (f"{len(unknown)} rule(s) for tensors the engine does not have: {few(unknown)}; " if unknown else "")
            + (_advice_preset(unwritten) if from_preset else _advice_own(unwritten)) + "; nothing was written")
    return renamed


def _advice_preset(unwritten: list[str]) -> str:
    return (("the preset writes no such bias (family='qwen2' writes q/k/v biases; a config with attention_bias or "
             "mlp_bias has biases no preset writes): write the rules for this model with "
             "reshard.rules.from_function, or serve a checkpoint without them; "
             if any(n.endswith(".bias") for n in unwritten) else "")
            + "check the family, the source naming and tie_embeddings (a tied model has no lm_head.weight), "
              "or write the rules for this model with reshard.rules.from_function")


def _advice_own(unwritten: list[str]) -> str:
    """For rules= (the user's own): what vLLM's names are, not what a preset does."""
    return (("your rules write none of these biases: return them from your function too, in vLLM's fused names "
             "(a q/k/v bias goes into self_attn.qkv_proj.bias, laid out as the weight's rows); "
             if any(n.endswith(".bias") for n in unwritten) else "")
            + "rules= must name the engine's own tensors: vLLM's fused self_attn.qkv_proj and mlp.gate_up_proj, "
              "the ranks' slices side by side along the split axis, and no lm_head.weight where the engine ties "
              "its head (docs/reshard.md, 'Into vLLM with your own rules')")
