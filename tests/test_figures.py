"""The saved GPU figures (docs/figures/) hold together, and jax_amem.demo.figures reads them.

The files are what the notebooks show beside their CPU runs: the real-size preset on one NVIDIA
H200 (`python -m jax_amem demo --preset qwen3-1.7b --json ...`) and the swap's tensor-size sweep
there (`python -P benchmarks/swap.py --sweep --repeats 10 --json ...`), each beside its printout.
No JAX device work: the files are plain JSON.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from jax_amem.demo import figures

FIGURES = Path(__file__).resolve().parent.parent / "docs" / "figures"
RUN_PATH = FIGURES / "h200_qwen3_1.7b.json"
SWEEP_PATH = FIGURES / "h200_swap_sweep.json"


@pytest.fixture(scope="module")
def run():
    return figures.load(RUN_PATH)


@pytest.fixture(scope="module")
def sweep():
    return figures.load(SWEEP_PATH)


def cpu_sweep() -> dict:
    """A sweep in benchmarks/swap.py's schema, as a CPU run writes it (two rows, made-up times)."""
    row = lambda case, tensors, size, swap, copy, loop: dict(  # noqa: E731
        case=case, tensors=tensors, bytes=tensors * size, first_s=0.1, swap_s=swap, new_s=swap, copy_s=copy,
        device_put_s=2 * swap, loop_s=loop, calls=1, launches=1, transports={"device-local": tensors * size})
    return dict(format=1, machine=dict(platform="cpu", device_kind="cpu", torch_device="cpu", jax="0.10.2",
                                       torch="2.13.0+cpu", bulk_bytes=64 << 20),
                rows=[row("4 x 8 MiB", 4, 8 << 20, 4e-3, 2e-3, 3e-3), row("200 x 16 KiB", 200, 16 << 10, 1e-3, 1e-4, 2e-3)])


# --- the real-size run ------------------------------------------------------------------------

def test_the_run_is_the_real_size_preset_on_an_h200(run):
    assert run["format"] == 1 and run["preset"] == "qwen3-1.7b"
    assert figures.machine(run) == "NVIDIA H200" and run["machine"]["platform"].startswith("gpu")
    assert run["checks"]["ok"] and all(c["ok"] for c in run["checks"]["exact"] + run["checks"]["logits"])
    assert run["parameters"] == 1720574976 and run["param_bytes"] == 4 * run["parameters"]


def test_the_switch_is_the_medians_of_the_iterations(run):
    its = run["iterations"]
    saved = {r["part"]: r["seconds"] for r in run["switch"]}
    assert list(saved) == ["pause", "swap", "resume", "switch"]
    assert saved["pause"] == statistics.median(i["pause"]["seconds"] for i in its)
    assert saved["swap"] == statistics.median(i["swap_seconds"] for i in its)
    assert saved["resume"] == statistics.median(i["resume_seconds"] for i in its)
    assert math.isclose(saved["switch"], saved["pause"] + saved["swap"] + saved["resume"], rel_tol=1e-12)
    assert figures.switch_seconds(run) == saved


def test_the_bounds_are_bytes_over_the_measured_ceilings_as_in_the_log(run):
    ceil, last = run["ceilings"], run["iterations"][-1]["pause"]
    bounds = {r["part"]: r["bound_seconds"] for r in run["switch"]}
    moved = last["bytes_offloaded"]
    assert bounds["pause"] == pytest.approx(moved / (ceil["pinned_down_gb_s"] * 1e9), rel=1e-9)
    assert bounds["resume"] == pytest.approx(moved / (ceil["pinned_up_gb_s"] * 1e9), rel=1e-9)
    swap_traffic = (run["param_bytes"] + run["rollout_bytes"]) / 2   # read and write, each byte once
    assert bounds["swap"] == pytest.approx(swap_traffic / (ceil["device_copy_gb_s"] * 1e9), rel=1e-9)
    assert bounds["switch"] == pytest.approx(bounds["pause"] + bounds["swap"] + bounds["resume"], rel=1e-12)
    # The log's table: x bound 1.07x, 3.75x, 1.07x, 1.08x; switch 0.8080 s.
    ratios = {r["part"]: round(r["x_bound"], 2) for r in figures.switch_rows(run)}
    assert ratios == {"pause": 1.07, "swap": 3.75, "resume": 1.07, "switch": 1.08}
    log = (FIGURES / "h200_qwen3_1.7b.log").read_text()
    for row in figures.switch_rows(run):
        line = [x for x in log.splitlines() if x.startswith(row["part"] + " ")][0]
        assert line.split()[1] == f"{row['seconds']:.4f}" and line.split()[-1] == f"{row['x_bound']:.2f}x"


def test_memory_and_baseline_as_in_the_log(run):
    m = figures.memory(run)
    assert m["freed_min"] >= m["trainer_state"] > 20e9    # every pause gave the trainer's state back
    assert round(m["rollout_with_pause"] / 1e9, 2) == 4.58 and round(m["rollout_without"] / 1e9, 2) == 25.29
    text = figures.memory_lines(run) + "\n" + figures.baseline_lines(run)
    assert "20.67 GB" in text and "4.58 GB with the pause, 25.29 GB without it" in text
    assert "13.49 s" in text and "0.808 s" in text
    log = (FIGURES / "h200_qwen3_1.7b.log").read_text()
    assert "= 13.492 s" in log and "4.58 GB" in log and "25.29 GB" in log


def test_plots_of_the_run_draw(run):
    plt = pytest.importorskip("matplotlib.pyplot")
    fig, axes = plt.subplots(1, 3)
    figures.plot_switch(axes[0], run)
    figures.plot_memory(axes[1], run)
    figures.plot_baseline(axes[2], run)
    assert len(axes[0].patches) == 6 and len(axes[1].patches) == 3 and len(axes[2].patches) == 3
    assert axes[2].patches[0].get_height() == pytest.approx(run["host_baseline"]["seconds"])
    plt.close(fig)


# --- the sweep ---------------------------------------------------------------------------------

def test_the_sweep_is_an_h200_with_every_key_the_notebook_reads(sweep):
    assert sweep["format"] == 1 and figures.machine(sweep) == "NVIDIA H200"
    rows = sweep["rows"]
    assert [r["case"] for r in rows][0] == "2000 x 16 KiB" and rows[-1]["case"] == "4 x 2 GiB" and len(rows) == 11
    for r in rows:
        assert set(figures.SWEEP_KEYS) <= set(r), r["case"]
        assert all(r[k] > 0 for k in ("swap_s", "copy_s", "loop_s")), r["case"]
    log = (FIGURES / "h200_swap_sweep.log").read_text()
    for r in rows:
        assert r["case"] in log


def test_sweep_points_and_what_the_notebook_says_of_them(sweep):
    p = figures.sweep_points(sweep)
    assert p["tensor_bytes"] == sorted(p["tensor_bytes"]) and p["tensor_bytes"][0] == 16 << 10
    of_copy = {case: s / c for case, s, c in zip(p["case"], p["swap"], p["copy"])}
    assert of_copy["4 x 2 GiB"] >= 0.95 and of_copy["4 x 256 MiB"] >= 0.9
    assert all(0.83 <= of_copy[c] < 0.9 for c in ("16 x 64 MiB", "8 x 128 MiB", "4 x 512 MiB"))
    assert 0.6 <= of_copy["256 x 4 MiB"] < 0.7 and 0.75 <= of_copy["64 x 16 MiB"] < 0.8
    assert all(of_copy[c] < 0.35 for c in p["case"][:4])                 # 16 KiB .. 1 MiB tensors
    small = sweep["rows"][0]
    assert small["swap_s"] == pytest.approx(1.63e-3, abs=0.05e-3) and 28 <= small["loop_s"] / small["swap_s"] <= 29


@pytest.mark.parametrize("which", ["h200", "cpu"])
def test_sweep_table_and_plot_on_both(which, sweep):
    data = sweep if which == "h200" else cpu_sweep()
    table = figures.sweep_table(data).splitlines()
    assert len(table) == 1 + len(data["rows"])
    p = figures.sweep_points(data)
    if which == "cpu":   # sorted by tensor size: 16 KiB first
        assert p["case"] == ["200 x 16 KiB", "4 x 8 MiB"]
        assert p["swap"] == pytest.approx([200 * (16 << 10) / 1e-3 / 1e9, 4 * (8 << 20) / 4e-3 / 1e9])
        assert "10%" in table[1] and "2.0x" in table[1]
    plt = pytest.importorskip("matplotlib.pyplot")
    fig, ax = plt.subplots()
    figures.plot_sweep(ax, data)
    assert len(ax.lines) == 3 and figures.machine(data) in ax.get_title()
    assert ax.get_xscale() == "log"
    plt.close(fig)
