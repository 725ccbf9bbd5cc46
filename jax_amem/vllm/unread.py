"""The trainer's weights a preset leaves unread. A leaf at a path the presets know as a weight (an
attention or MLP bias, a head of its own, a router) that the family's rules for this engine do
not read has no tensor in the engine's model: its config ties the head to the embedding
(tie_word_embeddings), has no biases (attention_bias, mlp_bias), or is another family's. The
engine would then serve a model without it, not the trainer's, with nothing to say so: connect
refuses by name. Only for family=: rules of one's own may leave a leaf out on purpose (a value
head the rollout does not serve).
"""

from __future__ import annotations

from .. import reshard
from ..reshard.presets import weight_paths
from .errors import VllmPlanError


def read_sources(rules) -> set[str]:
    """The tree paths `rules` (Rules and Pieces) read."""
    return {part.src for rule in rules for part in getattr(rule, "parts", ())} | {
        rule.src for rule in rules if isinstance(rule, reshard.Piece)}


def check_all_read(family: str, source: str, params, rules, engine_names: list[str]) -> None:
    """VllmPlanError naming every known weight of `params` that `rules` do not read."""
    known = weight_paths(family, source)
    read = read_sources(rules)
    unread = sorted(path for path in reshard.tree_names(params) if path in known and path not in read)
    if not unread:
        return
    why = []
    if any(known[p] == "lm_head" for p in unread) and "lm_head.weight" not in engine_names:
        why.append("the engine's model ties its head to the embedding (it has no lm_head.weight: its config has "
                   "tie_word_embeddings=True), so it would serve the embedding as the head, not the trainer's own: "
                   "start the engine from an untied checkpoint (tie_word_embeddings=False), or tie the trainer's "
                   "head and leave it out of the tree")
    if any(known[p].endswith("_bias") for p in unread):
        why.append("the engine's model has no tensor for these biases (its config has attention_bias / mlp_bias "
                   "false, or its family has none there), so it would serve its layers without them: serve a "
                   "checkpoint whose config has them (and write rules for it with reshard.rules.from_function where "
                   "the preset writes no such bias), or leave them out of the tree if the trainer does not train them")
    shown = ", ".join(unread[:6]) + (" ..." if len(unread) > 6 else "")
    raise VllmPlanError(
        f"the trainer's tree holds {len(unread)} weight(s) that the {family!r} preset, planned for this engine, does "
        f"not read: {shown}; the engine would serve a model without them. "
        + ("; ".join(why) if why else "check the family and the engine's checkpoint, or write the rules with "
                                       "reshard.rules.from_function")
        + "; nothing was written")
