"""The trainer's weights a set of rules leaves unread, and the refusal that names them.

A preset refuses a tree holding a leaf at a path the presets know as a weight that its rules do
not read (presets.check_all_read): the rollout would serve a model without it, not the trainer's.
The vLLM backend's connect words the same refusal for its engine (jax_amem/vllm/unread.py).
"""

from __future__ import annotations

from ..errors import RuleError
from .rule_types import Piece


class UnreadWeightsError(RuleError):
    """A preset's rules leave known weights of the tree unread. `weights`: {tree path: the logical
    weight the presets know it as}, in path order; `listed`: the paths as the message names them
    (a stacked layer tensor with its layer count); `advice`: what to do, per kind of weight
    ("head": a head of its own; "weights": every other one); `rules`: the rules refused, for a
    caller that checks them against its destination first (connect names an engine tensor no
    rule writes before a weight the engine has no tensor for)."""

    def __init__(self, message: str, weights: dict[str, str], listed: str, advice: dict[str, str], rules: list):
        super().__init__(message)
        self.weights, self.listed, self.advice, self.rules = weights, listed, advice, rules


def read_sources(rules) -> set[str]:
    """The tree paths `rules` (Rules and Pieces) read."""
    return {part.src for rule in rules for part in getattr(rule, "parts", ())} | {
        rule.src for rule in rules if isinstance(rule, Piece)}


def unread_weights(names, known: dict[str, str], rules) -> dict[str, str]:
    """{path: logical weight} of every tree path in `names` that `known` lists and `rules` do not read."""
    read = read_sources(rules)
    return {path: known[path] for path in sorted(names) if path in known and path not in read}
