"""Saved figures, read back for the notebooks: the real-size preset's `--json` (the switch, its
bounds, memory, baselines) and `benchmarks/swap.py --sweep --json`'s rows (GB/s by tensor size).

    from jax_amem.demo import figures
    run = figures.load("../docs/figures/h200_qwen3_1.7b.json")
    print(figures.switch_table(run)); figures.plot_switch(ax, run)
    sweep = figures.load("../docs/figures/h200_swap_sweep.json")
    figures.plot_sweep(ax, sweep)

Plain data in, text or a matplotlib Axes out: no JAX, no device (matplotlib is imported by the
caller's Axes only). docs/figures/ holds the files and the logs of the runs that wrote them.
"""

from __future__ import annotations

import json

SWITCH_PARTS = ("pause", "swap", "resume")
SWEEP_KEYS = ("case", "tensors", "bytes", "swap_s", "copy_s", "loop_s")  # what the sweep plot reads
SWEEP_SERIES = (("swap", "swap_s", "jax_amem.swap"), ("copy", "copy_s", "device copy (one torch copy_: the ceiling)"),
                ("loop", "loop_s", "per-tensor copy_ loop"))  # name, the row's seconds, label


def load(path) -> dict:
    with open(path) as f:
        return json.load(f)


def machine(figures: dict) -> str:
    """The device the figures were measured on, as JAX names it ("NVIDIA H200", "cpu")."""
    return figures["machine"]["device_kind"]


# --- the real-size run (jax_amem/demo/real_size/record.py's figures()) -------------------------

def switch_rows(run: dict) -> list[dict]:
    """The saved switch: part, seconds, bound_seconds and x_bound (seconds / bound)."""
    return [dict(row, x_bound=row["seconds"] / row["bound_seconds"]) for row in run["switch"]]


def switch_seconds(run: dict) -> dict:
    """pause, swap, resume and switch: the saved seconds (medians over the iterations, as the
    run's summary printed them)."""
    return {row["part"]: row["seconds"] for row in run["switch"]}


def switch_table(run: dict) -> str:
    lines = [f"{'part':<8}{'seconds':>10}{'bound s':>10}{'x bound':>9}"]
    for row in switch_rows(run):
        lines.append(f"{row['part']:<8}{row['seconds']:>10.4f}{row['bound_seconds']:>10.4f}{row['x_bound']:>8.2f}x")
    return "\n".join(lines)


def memory(run: dict) -> dict:
    """Bytes: freed by each pause (least, most); peak device memory in use during the rollout and
    over the whole iteration, with the pause (the most over the iterations) and without it."""
    its, resident = run["iterations"], run["resident_baseline"]
    freed = [i["pause"]["bytes_freed"] for i in its]
    return dict(freed_min=min(freed), freed_max=max(freed), trainer_state=run["param_bytes"] + run["opt_state_bytes"],
                rollout_with_pause=max(i["peak_rollout"] for i in its), rollout_without=resident["peak_rollout"],
                iteration_with_pause=max(i["peak_iteration"] for i in its), iteration_without=resident["peak_iteration"])


def memory_lines(run: dict) -> str:
    m = memory(run)
    gb = lambda n: "n/a" if n is None else f"{n / 1e9:.2f} GB"  # noqa: E731
    return "\n".join([
        f"each pause freed {gb(m['freed_min'])} to {gb(m['freed_max'])} of device memory "
        f"(trainer state {gb(m['trainer_state'])})",
        f"peak device memory in use during the rollout: {gb(m['rollout_with_pause'])} with the pause, "
        f"{gb(m['rollout_without'])} without it",
        f"peak over the whole iteration: {gb(m['iteration_with_pause'])} with the pause, "
        f"{gb(m['iteration_without'])} without it"])


def baseline_lines(run: dict) -> str:
    host, medians = run["host_baseline"], switch_seconds(run)
    return "\n".join([
        f"what users do today (jax.device_get + numpy + load_state_dict): {host['seconds']:.2f} s "
        f"= {host['get_seconds']:.2f} + {host['convert_seconds']:.2f} + {host['load_seconds']:.2f} s",
        f"jax_amem.swap: {medians['swap'] * 1e3:.1f} ms ({host['seconds'] / medians['swap']:.0f}x faster); "
        f"the whole switch, pause + swap + resume: {medians['switch']:.3f} s "
        f"({host['seconds'] / medians['switch']:.1f}x faster than the baseline's weight copy alone)"])


def plot_switch(ax, run: dict) -> None:
    """Bars: pause, swap, resume (median seconds) beside their bounds (bytes / measured ceiling)."""
    rows = [r for r in switch_rows(run) if r["part"] in SWITCH_PARTS]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [r["seconds"] for r in rows], width=0.4, label="measured (median)")
    ax.bar([i + 0.2 for i in x], [r["bound_seconds"] for r in rows], width=0.4, label="bound (bytes / ceiling)")
    for i, r in zip(x, rows):
        ax.annotate(f"{r['x_bound']:.2f}x", (i - 0.2, r["seconds"]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(list(x), [r["part"] for r in rows])
    ax.set_ylabel("seconds")
    ax.set_ylim(top=1.3 * max(max(r["seconds"], r["bound_seconds"]) for r in rows))
    ax.legend(fontsize=8, loc="upper center")


def plot_memory(ax, run: dict) -> None:
    """Bars, GB: the trainer state a pause frees, and the peak device memory in use during the
    rollout with the pause and without it (both models resident)."""
    m = memory(run)
    bars = {"freed by a pause": m["freed_min"], "peak in rollout\nwith pause": m["rollout_with_pause"],
            "peak in rollout\nwithout pause": m["rollout_without"]}
    ax.bar(list(bars), [(b or 0) / 1e9 for b in bars.values()], color=["tab:green", "tab:blue", "tab:gray"])
    for i, b in enumerate(bars.values()):
        ax.annotate("n/a" if b is None else f"{b / 1e9:.2f}", (i, (b or 0) / 1e9), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("GB (device memory)")


def plot_baseline(ax, run: dict) -> None:
    """Bars, seconds: the usual weight copy (device_get + numpy + load_state_dict) against the
    whole switch (pause + swap + resume) and the swap alone."""
    host, medians = run["host_baseline"], switch_seconds(run)
    bars = {"device_get +\nnumpy +\nload_state_dict": host["seconds"], "pause + swap\n+ resume": medians["switch"],
            "swap": medians["swap"]}
    ax.bar(list(bars), list(bars.values()), color=["tab:gray", "tab:blue", "tab:orange"])
    for i, b in enumerate(bars.values()):
        ax.annotate(f"{b:.3g} s", (i, b), ha="center", va="bottom", fontsize=8)
    ax.set_ylabel("seconds")


# --- the swap's tensor-size sweep (benchmarks/swap.py --sweep --json) -------------------------

def sweep_points(sweep: dict) -> dict:
    """Per row, sorted by tensor size: the case, bytes per tensor, and GB/s (1e9 bytes/s) of
    each series by its name (swap, copy, loop)."""
    rows = sorted(sweep["rows"], key=lambda r: r["bytes"] / r["tensors"])
    out = {"case": [r["case"] for r in rows], "tensor_bytes": [r["bytes"] / r["tensors"] for r in rows]}
    for name, key, _ in SWEEP_SERIES:
        out[name] = [r["bytes"] / r[key] / 1e9 for r in rows]
    return out


def sweep_table(sweep: dict) -> str:
    p = sweep_points(sweep)
    lines = [f"{'case':>16}{'swap GB/s':>11}{'copy GB/s':>11}{'loop GB/s':>11}{'of copy':>9}{'vs loop':>9}"]
    for i, case in enumerate(p["case"]):
        swap, copy, loop = p["swap"][i], p["copy"][i], p["loop"][i]
        lines.append(f"{case:>16}{swap:>11.1f}{copy:>11.1f}{loop:>11.1f}{swap / copy:>8.0%}{swap / loop:>8.1f}x")
    return "\n".join(lines)


def plot_sweep(ax, sweep: dict, title: str | None = None) -> None:
    """GB/s against bytes per tensor (log x, log y), one line per series."""
    p = sweep_points(sweep)
    for name, _, label in SWEEP_SERIES:
        ax.plot(p["tensor_bytes"], p[name], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(p["tensor_bytes"], [_size(b) for b in p["tensor_bytes"]], rotation=45, ha="right")
    ax.minorticks_off()
    ax.set_xlabel("bytes per tensor")
    ax.set_ylabel("GB/s")
    ax.grid(alpha=0.3, which="both")
    ax.set_title(title or f"swap on {machine(sweep)}")
    ax.legend(fontsize=8)


def _size(nbytes: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes:g} B"
