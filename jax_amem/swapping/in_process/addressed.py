"""The address route of a swap into PyTorch tensors: each group's transfers run as a few
`segment_copy_to_addresses` calls that write straight into the tensors' memory, at the
addresses PyTorch gives (`data_ptr()`), on XLA's stream. Nothing is imported or donated, so a
call creates no JAX arrays besides one token per chunk, and XLA:CPU writes in place too.

The chunks are the batched path's (batched.chunk_steps: at most MAX_BUFFERS_PER_SIDE source
views and destinations per call); rows of at least jax_amem.copy.BULK_BYTES run as one driver
copy each. The addresses are attributes of the custom calls, so a program serves one set of
addresses: tensors that moved (a reloaded model) get a program of their own, cached like any
other. The swap holds the tensors, checks every address against its tensor before the call,
and blocks until the copy is done, so no address outlives its memory.
"""

from __future__ import annotations

import jax

from ...copy import segment_copy_to_addresses
from .batched import chunk_steps


def jitted(steps_per_buffer, views, prepare_view, targets):
    """One jitted call: sources in, one token per chunk out. `targets[position]` is the
    (address, bytes) of the group's destination buffer at that position."""
    chunks = chunk_steps(steps_per_buffer)

    def run(sources):
        prepared = {}
        tokens = []
        for chunk in chunks:
            for key in chunk.views:
                if key not in prepared:
                    prepared[key] = prepare_view(sources[key[0]], *views[key[1]][1:])
            tokens.append(segment_copy_to_addresses(
                [prepared[k] for k in chunk.views], [targets[b][0] for b in chunk.buffers],
                [targets[b][1] for b in chunk.buffers], chunk.rows))
        return tuple(tokens)

    return jax.jit(run), len(chunks)
