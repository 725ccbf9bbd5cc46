"""The task: sort a short list of digits. Its reward is computed by this script, not learned.

A prompt is `[BOS, d1, ..., dk, SEP]` with digits 0-9 as tokens 0-9; the policy
then emits exactly k tokens. The reward is the fraction of those k positions
holding the right digit of `sorted(d1..dk)`: partial credit, so a random policy
scores about 1/12 and gains show early (first the likely digit at each position,
then reading the prompt).
"""

from __future__ import annotations

import dataclasses

import numpy as np

BOS = 10
SEP = 11
VOCAB = 12


@dataclasses.dataclass(frozen=True)
class SortTask:
    digits: int = 4

    @property
    def prompt_length(self) -> int:
        return self.digits + 2

    @property
    def answer_length(self) -> int:
        return self.digits

    def prompts(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """(count, prompt_length) int32 prompts with random digits."""
        digits = rng.integers(0, 10, size=(count, self.digits))
        bos = np.full((count, 1), BOS)
        sep = np.full((count, 1), SEP)
        return np.concatenate([bos, digits, sep], axis=1).astype(np.int32)

    def targets(self, prompts: np.ndarray) -> np.ndarray:
        """The right answers: each prompt's digits, sorted."""
        return np.sort(np.asarray(prompts)[:, 1:1 + self.digits], axis=1)

    def rewards(self, prompts: np.ndarray, answers: np.ndarray) -> np.ndarray:
        """(B,) float32 in [0, 1]: the fraction of answer positions equal to the sorted prompt.

        prompts: (B, prompt_length); answers: (B, digits), the generated tokens only.
        """
        prompts, answers = np.asarray(prompts), np.asarray(answers)
        if prompts.ndim != 2 or prompts.shape[1] != self.prompt_length:
            raise ValueError(f"prompts must have shape (B, {self.prompt_length}), got {prompts.shape}")
        if answers.shape != (prompts.shape[0], self.digits):
            raise ValueError(f"answers must have shape ({prompts.shape[0]}, {self.digits}) (one row of "
                             f"{self.digits} generated tokens per prompt), got {answers.shape}")
        return (answers == self.targets(prompts)).mean(axis=1).astype(np.float32)
