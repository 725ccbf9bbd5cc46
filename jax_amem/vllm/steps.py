"""What one update runs, in order: its steps. A step swaps one layer group, or every group of a
batch at once, into each rank's staging buffer; each batch is then committed by one call into
the workers (`update_weights`).

Each worker packs consecutive layer groups into batches that fit its staging budget
(jax_amem_vllm/layout.py `pack`): the groups of one batch have disjoint places in its staging
buffer, groups of two batches share places. Ranks hold slices of different sizes where a
tensor does not split evenly, so their batches may differ; the trainer commits the batches of
every rank at once (`common_batches`).
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import VllmBackendError


@dataclass(frozen=True)
class Step:
    groups: tuple[int, ...]   # the layer groups it writes (one, or a batch's)
    pick: object              # trainer.Pick of the group's layer, None where the tree is read whole
    plans: list               # one plan per rank


def common_batches(notes: list[dict], groups: int) -> list[list[int]]:
    """The batches every rank's staging holds apart: consecutive runs of groups split wherever
    any rank's batches split. A note without batches (a worker that stages one group at a time)
    splits after every group."""
    cuts = set()
    for note in notes:
        batches = note.get("batches") or [[g] for g in range(groups)]
        if sorted(g for batch in batches for g in batch) != list(range(groups)) or \
                any(not batch or list(batch) != list(range(batch[0], batch[0] + len(batch))) for batch in batches):
            raise VllmBackendError(f"rank {note.get('tp_rank')}'s worker reports batches {str(batches)[:200]} that do "
                                   f"not cover its {groups} layer groups in order, each once")
        cuts.update(batch[0] for batch in batches)
    starts = sorted(cuts)
    return [list(range(a, b)) for a, b in zip(starts, starts[1:] + [groups])]
