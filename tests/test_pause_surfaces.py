"""The pause surfaces have one shape: `jax_amem` (the whole process, `jax_amem.process_pause`) and
`jax_amem.nccl` (its communicators) each have pause, resume, is_paused and `paused`, a context
manager of the same class family (jax_amem/pause_block.py): `with ... as p:` gives the block,
p.info what the pause returned, p.restored what the resume returned. The NCCL block's behaviour
with communicators is in tests/test_nccl_bad_input.py (a fake NCCL in a child process)."""

import inspect

import jax.numpy as jnp
import numpy as np
import pytest

import jax_amem
from jax_amem.pause_block import PausedBlock

SURFACES = [jax_amem, jax_amem.process_pause, jax_amem.nccl]


@pytest.mark.parametrize("surface", SURFACES, ids=lambda s: s.__name__)
def test_every_surface_has_the_same_four_verbs(surface):
    for verb in ("pause", "resume", "is_paused"):
        assert inspect.isfunction(getattr(surface, verb)), (surface.__name__, verb)
    assert inspect.isclass(surface.paused) and issubclass(surface.paused, PausedBlock)
    assert {"pause", "resume", "is_paused", "paused"} <= set(surface.__all__)


def test_the_top_level_verbs_are_the_process_pause_ones():
    for verb in ("pause", "resume", "is_paused", "paused"):
        assert getattr(jax_amem, verb) is getattr(jax_amem.process_pause, verb)


def test_nothing_paused_reads_the_same_on_both_surfaces():
    assert jax_amem.is_paused() is False and jax_amem.nccl.is_paused() is False


def test_a_block_holds_both_results_and_nothing_before_it_is_entered():
    block = jax_amem.paused(keep=[jnp.arange(3.0)], nccl=False)
    assert block.info is None and block.restored is None
    with block as p:
        assert p is block and p.info.arrays_kept == 1 and p.restored is None
    assert p.restored.bytes_reloaded == 12
    np.testing.assert_array_equal(np.asarray(p.keep[0]), np.arange(3.0))


def test_a_block_entered_twice_is_refused_and_nothing_is_paused():
    with jax_amem.paused(keep=[jnp.ones(2)], nccl=False) as p:
        pass
    with pytest.raises(jax_amem.PauseError, match="entered already: make a new one"):
        with p:
            pass
    assert not jax_amem.is_paused()
    block = jax_amem.nccl.paused()
    block._arguments = None   # as after a first entry: refused before any NCCL call
    with pytest.raises(jax_amem.PauseError, match=r"jax_amem\.nccl\.paused\(\.\.\.\)` block was entered already"):
        block.__enter__()
