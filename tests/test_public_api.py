"""The public API fits on one page: `jax_amem.__all__` is the verbs and the names a user types;
primitives live in their modules (jax_amem.copy, jax_amem.platform)."""

import inspect

import jax_amem

VERBS = {"pause", "resume", "paused", "is_paused", "reserve", "memory_report", "swap", "plan", "to_torch",
         "nccl", "rules", "gpu_status"}
TYPES = {"Layout", "Owner", "PauseInfo", "Restored", "SwapReport"}
ERRORS = {"JaxAmemError", "GpuUnavailableError", "NativeCoreMissingError", "PauseError", "SwapError",
          "PartialSwapError"}


def test_all_is_the_verbs_types_and_errors_and_nothing_else():
    assert len(jax_amem.__all__) == len(set(jax_amem.__all__)), "a name is listed twice"
    assert set(jax_amem.__all__) == VERBS | TYPES | ERRORS


def test_every_public_name_resolves_to_what_it_claims_to_be():
    for name in VERBS - {"nccl", "rules"}:
        assert callable(getattr(jax_amem, name)), name
    for name in ("nccl", "rules"):
        assert inspect.ismodule(getattr(jax_amem, name)), name
    for name in TYPES:
        assert inspect.isclass(getattr(jax_amem, name)), name
    for name in ERRORS:
        assert issubclass(getattr(jax_amem, name), jax_amem.JaxAmemError), name
    # `jax_amem.swap` is the verb, not a package.
    assert inspect.isfunction(jax_amem.swap)


def test_star_import_gives_exactly_all():
    namespace = {}
    exec("from jax_amem import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(jax_amem.__all__)


def test_primitives_are_reachable_only_under_their_modules():
    from jax_amem.copy import prepare_segments, segment_copy
    from jax_amem.platform import require_gpu

    assert callable(segment_copy) and callable(prepare_segments) and callable(require_gpu)
    for name in ("segment_copy", "prepare_segments", "require_gpu"):
        assert not hasattr(jax_amem, name), f"jax_amem.{name} should live only in its module"
