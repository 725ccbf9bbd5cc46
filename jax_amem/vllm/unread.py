"""The trainer's weights a preset leaves unread, said for the engine. `preset()` refuses a leaf at
a path the presets know as a weight (an attention or MLP bias, a head of its own, a router) that
its rules do not read (reshard.presets.check_all_read raises UnreadWeightsError). connect plans
the preset for the engine and checks the refused rules against the engine's tensors first; when
they write every one, a weight left unread is one the engine's model has no tensor for: its config
ties the head to the embedding (tie_word_embeddings, no lm_head.weight), or has no biases
(attention_bias, mlp_bias). The engine would then serve a model without them, not the trainer's.
Only for family=: rules of one's own may leave a leaf out on purpose (a value head the rollout
does not serve).
"""

from __future__ import annotations

from ..reshard.unread import UnreadWeightsError
from .errors import VllmPlanError

TIED = ("the engine's model ties its head to the embedding (it has no lm_head.weight: its config has "
        "tie_word_embeddings=True), so it would serve the embedding as the head, not the trainer's own: start the "
        "engine from an untied checkpoint (tie_word_embeddings=False), or tie the trainer's head and leave it out "
        "of the tree")
NO_BIASES = ("the engine's model has no tensor for these biases (its config has attention_bias / mlp_bias false, "
             "or its family has none there), so it would serve its layers without them: serve a checkpoint whose "
             "config has them (and write rules for it with reshard.rules.from_function where the preset writes no "
             "such bias), or leave them out of the tree if the trainer does not train them")


def refusal(error: UnreadWeightsError, family: str, engine_names: list[str]) -> VllmPlanError:
    """The preset's refusal of unread weights, said for the engine holding `engine_names`, once its
    rules (error.rules) write every engine tensor: a head left unread is then one the engine has
    no tensor for (no lm_head.weight), and so is a bias the preset writes none of."""
    why = [TIED] if "head" in error.advice else []
    others = [logical for logical in error.weights.values() if logical != "lm_head"]
    if any(logical.endswith("_bias") for logical in others) and not any(n.endswith(".bias") for n in engine_names):
        why.append(NO_BIASES)
    elif others:
        why.append(error.advice["weights"])
    return VllmPlanError(
        f"the trainer's tree holds {len(error.weights)} weight(s) that the {family!r} preset, planned for this "
        f"engine, does not read: {error.listed}; the engine would serve a model without them: "
        + "; ".join(why) + "; nothing was written")
