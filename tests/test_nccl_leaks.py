"""The warning a pause gives once when the loaded NCCL is known to grow host memory under it."""

from __future__ import annotations

import warnings

import pytest

from jax_amem.nccl import _leaks


@pytest.fixture
def one_leak(monkeypatch):
    leak = _leaks.Leak(since=22703, fixed=23100, strategies=frozenset({"recreate"}),
                       what="ncclFoo keeps 7 MiB per call (NVIDIA/nccl#1)")
    monkeypatch.setattr(_leaks, "KNOWN", (leak,))
    monkeypatch.setattr(_leaks, "_warned", set())
    return leak


def test_warns_once_naming_the_call_the_issue_and_the_version_that_fixes_it(one_leak):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = _leaks.warn_once(22809, {"recreate", "suspend"})
        again = _leaks.warn_once(22809, {"recreate"})
    assert first == [
        "jax_amem.nccl: NCCL 2.28.9 grows this process's host memory under recreate: ncclFoo keeps 7 MiB per "
        'call (NVIDIA/nccl#1). To avoid it: install NCCL >= 2.31.0 (pip install -U "nvidia-nccl-cu13>=2.31.0") '
        "and point jax-amem at it (JAX_AMEM_NCCL_LIBRARY) if JAX's plugin pins another; see docs/nccl.md, "
        "'Host memory over the cycles'."]
    assert again == []
    assert [str(w.message) for w in caught] == first and caught[0].category is RuntimeWarning


@pytest.mark.parametrize("version, strategies", [
    (22702, {"recreate"}),   # before the leak
    (23100, {"recreate"}),   # fixed
    (22809, {"suspend"}),    # another strategy
    (22809, set()),          # nothing paused
])
def test_quiet_outside_the_versions_and_strategies_that_leak(one_leak, version, strategies):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _leaks.warn_once(version, strategies) == []


def test_a_leak_no_release_fixes_says_so(monkeypatch):
    monkeypatch.setattr(_leaks, "KNOWN", (_leaks.Leak(22703, None, frozenset({"recreate"}), "x"),))
    monkeypatch.setattr(_leaks, "_warned", set())
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        said = _leaks.warn_once(23203, {"recreate"})
    assert "NCCL 2.32.3" in said[0] and "no NCCL release measured so far is free of it" in said[0]


def test_a_leak_with_another_way_out_says_it_after_the_version(monkeypatch):
    monkeypatch.setattr(_leaks, "KNOWN", (_leaks.Leak(22809, None, frozenset({"recreate"}), "x",
                                                      avoid="set MALLOC_ARENA_MAX=2"),))
    monkeypatch.setattr(_leaks, "_warned", set())
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        said = _leaks.warn_once(22809, {"recreate"})
    assert "no NCCL release measured so far is free of it; set MALLOC_ARENA_MAX=2; see docs/nccl.md" in said[0]


def test_the_known_growth_of_grouped_initialisation_warns_under_recreate_only(monkeypatch):
    """The table as shipped: NCCL 2.28.9 to 2.32.6 under recreate (measured), never under suspend."""
    monkeypatch.setattr(_leaks, "_warned", set())
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        assert _leaks.warn_once(23206, {"suspend"}) == []
        said = _leaks.warn_once(22809, {"recreate"})
    assert len(said) == 1 and "grouped initialisation" in said[0] and "MALLOC_ARENA_MAX=2" in said[0]
