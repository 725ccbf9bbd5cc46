"""The opt-in batched path of a swap program: each group's transfers run as a few
`segment_copy_many` custom calls (one CUDA kernel launch each) instead of one
`segment_copy` per transfer.

A group's (source view, destination buffer) steps are packed, in the order the default
path runs them, into chunks of at most MAX_BUFFERS_PER_SIDE prepared source views and as
many destination buffers; a chunk is one call. The prepared views (transpose + cast) and
the donation of the destination buffers are those of the default path, so the bytes
written and the in-place check are the same; only the number of launches changes.

Selected when a program is built (so the choice is part of the program cache key):
JAX_AMEM_SWAP_BATCHED=1 turns it on, =0 off; unset, `DEFAULT` decides. DEFAULT is off
until the batched kernel is measured on a GPU:

    from jax_amem.swapping.in_process import batched
    batched.DEFAULT = True
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import jax
import numpy as np

from ...copy import MAX_BUFFERS_PER_SIDE, segment_copy_many
from ..errors import SwapError

ENV = "JAX_AMEM_SWAP_BATCHED"
DEFAULT = False
CHUNK_LIMIT = MAX_BUFFERS_PER_SIDE  # per side of one call; a module attribute so tests can shrink it


def enabled() -> bool:
    """Whether programs built now use the batched path: the environment, else DEFAULT."""
    value = os.environ.get(ENV, "").strip()
    if value == "":
        return bool(DEFAULT)
    if value in ("0", "1"):
        return value == "1"
    raise SwapError(f"{ENV}={value!r} is not understood: set it to 1 (batched segment_copy_many calls) or 0 "
                    f"(one segment_copy per transfer), or unset it for jax_amem.swapping.in_process.batched.DEFAULT "
                    f"({bool(DEFAULT)}); nothing was written")


@dataclass(frozen=True)
class Chunk:
    """One segment_copy_many call: its source operands (source slot, view) in order, its
    destination operands (buffer positions in the group) in order, and its rows
    (src operand, dst operand, src_offset, dst_offset, bytes)."""
    views: tuple
    buffers: tuple
    rows: np.ndarray


def chunk_steps(steps_per_buffer, limit: int | None = None) -> list[Chunk]:
    """Packs the steps greedily, buffer by buffer, into chunks of at most `limit` views and
    `limit` buffers. A buffer whose steps need more views than fit continues in the next
    chunk: the chunk's result is the next chunk's destination operand (their rows never
    write the same byte: the plan writes each byte once)."""
    limit = CHUNK_LIMIT if limit is None else limit
    chunks, views, buffers, rows = [], {}, {}, []

    def close():
        if rows:
            chunks.append(Chunk(tuple(views), tuple(buffers), np.concatenate(rows)))
        views.clear()
        buffers.clear()
        rows.clear()

    for position, steps in enumerate(steps_per_buffer):
        for step in steps:
            key = (step.source, step.view)
            if len(views) + (key not in views) > limit or len(buffers) + (position not in buffers) > limit:
                close()
            src = views.setdefault(key, len(views))
            dst = buffers.setdefault(position, len(buffers))
            table = np.asarray(step.segments, dtype=np.int64).reshape(-1, 3)
            rows.append(np.column_stack([np.full(len(table), src, np.int64),
                                         np.full(len(table), dst, np.int64), table]))
    close()
    return chunks


def jitted(chunks: list[Chunk], views, prepare_view):
    """One jitted call: sources in, destination buffers donated and returned written, one
    segment_copy_many per chunk. `views` and `prepare_view` as the default path's."""

    def run(sources, destinations):
        out = list(destinations)
        prepared = {}
        for chunk in chunks:
            for key in chunk.views:
                if key not in prepared:
                    prepared[key] = prepare_view(sources[key[0]], *views[key[1]][1:])
            written = segment_copy_many([prepared[k] for k in chunk.views], [out[b] for b in chunk.buffers],
                                        chunk.rows)
            for position, array in zip(chunk.buffers, written):
                out[position] = array
        return tuple(out)

    return jax.jit(run, donate_argnums=1)
