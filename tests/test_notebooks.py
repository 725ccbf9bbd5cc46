"""The notebooks run from top to bottom without error and show their key outputs.

Each is executed with nbclient in a kernel that runs *this* interpreter (a kernelspec written
to a temporary folder), so it sees the same installed jax_amem as the tests, in CI's fresh
virtual environment too. The notebooks in the repository are not modified by the tests.

To re-run them and save their outputs (what the repository holds; each says its machine):
    python tests/test_notebooks.py --save [name ...]
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
KERNEL = "jax-amem-tests"
TIMEOUT_S = 300  # per cell


def kernel_manager(folder: Path):
    """A KernelManager whose kernel is this interpreter, with the test's environment."""
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    spec = folder / "kernels" / KERNEL
    spec.mkdir(parents=True)
    env = {"XLA_FLAGS": os.environ.get("XLA_FLAGS", "--xla_force_host_platform_device_count=8"),
           "MPLBACKEND": "module://matplotlib_inline.backend_inline"}
    if os.environ.get("PYTHONPATH"):  # a jax_amem overlaid on the installed one (a worktree's files)
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": f"jax-amem tests ({sys.executable})", "language": "python", "env": env}))
    return KernelManager(kernel_name=KERNEL, kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(spec.parent)]))


def execute(name: str):
    """Runs notebooks/<name>.ipynb; returns the executed notebook (the file is not changed)."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    with tempfile.TemporaryDirectory() as folder:
        client = NotebookClient(notebook, km=kernel_manager(Path(folder)), timeout=TIMEOUT_S,
                                resources={"metadata": {"path": str(NOTEBOOKS)}})
        client.execute()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return notebook


def text_of(notebook) -> str:
    parts = []
    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                parts.append(output["text"])
            elif "data" in output and "text/plain" in output["data"]:
                parts.append(output["data"]["text/plain"])
    return "\n".join(parts)


def images_in(notebook) -> int:
    return sum("image/png" in output.get("data", {}) for cell in notebook.cells for output in cell.get("outputs", []))


def errors_in(notebook) -> list:
    return [output for cell in notebook.cells for output in cell.get("outputs", [])
            if output.get("output_type") == "error"]


pytestmark = pytest.mark.slow  # each starts a kernel and imports JAX, PyTorch and transformers


def needs_notebook_tools():
    for module in ("nbclient", "nbformat", "ipykernel", "matplotlib", "flax", "torch", "transformers"):
        pytest.importorskip(module)


def test_pause_resume_notebook():
    needs_notebook_tools()
    notebook = execute("pause_resume")
    assert not errors_in(notebook)
    text = text_of(notebook)
    assert "machine:" in text and images_in(notebook) == 1
    assert ("host-side (no GPU here)" in text) or ("device memory (CUDA driver" in text)
    arrays = [line for line in text.splitlines() if line.startswith("JAX arrays")][0]
    without = float(arrays.split("without jax-amem")[1].split("MiB")[0])
    with_amem = float(arrays.split("with ")[1].split("MiB")[0])
    state = float(text.split("trainer state (parameters + Adam): ")[1].split(" MiB")[0])
    assert without >= state > 1 and with_amem < state / 100  # the trainer's arrays left during the rollout
    staging = [line for line in text.splitlines() if line.startswith("host staging")][0]
    assert float(staging.split("with ")[1].split("MiB")[0]) >= state  # ... into host staging


def test_weight_swap_notebook():
    needs_notebook_tools()
    notebook = execute("weight_swap")
    assert not errors_in(notebook)
    text = text_of(notebook)
    assert "machine:" in text and images_in(notebook) == 1  # the sweep: the saved H100 beside the live one
    table = [line for line in text.splitlines() if line.split()[:2] and all(w.isdigit() for w in line.split()[:2])]
    layouts = 3 if "cpu" in text.split("machine:")[1].splitlines()[0] else 1
    sizes = 2 if layouts == 3 else 3
    assert len(table) == sizes * layouts  # every size and layout, three methods each
    assert "x per-tensor" in text and "x device_put" in text
    saved, live = text.split("saved sweep, ")[1].split("live sweep, this machine")
    latest, earlier = saved.split("earlier sweep (0.1.0, before the direct launch), ")
    assert latest.startswith("NVIDIA H100") and earlier.startswith("NVIDIA H200")
    for run, share in ((latest, "96%"), (earlier, "97%")):                # each run's 4 x 2 GiB
        assert sum(" x " in line for line in run.splitlines()) == 11      # 2000 x 16 KiB .. 4 x 2 GiB
        assert share in run.split("4 x 2 GiB")[1].splitlines()[0]
    rows = int(text.split("live sweep: ")[1].split(" rows")[0])
    assert rows >= 5 and sum(" x " in line for line in live.splitlines()) == rows   # every live row shown


def test_rl_loop_notebook():
    needs_notebook_tools()
    notebook = execute("rl_loop")
    assert not errors_in(notebook)
    text = text_of(notebook)
    assert "machine:" in text and images_in(notebook) == 2  # the loop's; the saved H200 run's
    line = [x for x in text.splitlines() if x.startswith("reward: first")][0]
    first, last = float(line.split()[2]), float(line.split()[-1])
    assert last > first + 0.12
    assert "logits check: OK" in text and "swap (jax_amem.swap)" in text
    # At real size, on an H200: the saved run read back.
    assert "saved run: preset qwen3-1.7b on 1 x NVIDIA H200" in text and "checks OK" in text
    switch = [x for x in text.splitlines() if x.startswith("switch ")][0].split()
    assert switch[1:] == ["0.8080", "0.7488", "1.08x"]
    assert "4.58 GB with the pause, 25.29 GB without it" in text and "13.49 s" in text


def _save(names) -> None:
    import nbformat

    for name in names or [p.stem for p in sorted(NOTEBOOKS.glob("*.ipynb"))]:
        notebook = execute(name)
        problems = errors_in(notebook)
        nbformat.write(notebook, NOTEBOOKS / f"{name}.ipynb")
        print(f"{name}: saved{' WITH ERRORS' if problems else ''}")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--save"]:
        sys.exit("usage: python tests/test_notebooks.py --save [name ...]")
    _save(sys.argv[2:])
