"""The fake NCCL libraries, built once per test module (import the fixtures you use)."""

import pytest

from nccl_support.harness import build_fake


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    """Like NCCL 2.28.9: no ncclCommSuspend."""
    return build_fake(tmp_path_factory.mktemp("fake"))


@pytest.fixture(scope="module")
def fake_with_suspend(tmp_path_factory):
    """With ncclCommSuspend/Resume/MemStats (set FAKE_NCCL_VERSION for the version it reports)."""
    return build_fake(tmp_path_factory.mktemp("fake_suspend"), with_suspend=True)
