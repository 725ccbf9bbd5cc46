"""benchmarks/vllm_colocated.py's parts that need no GPU nor vLLM: its arguments, the switch's
bound (jax_amem/demo/real_size/switch_bound.py) and the printed tables."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from jax_amem.demo.real_size import switch_bound
from jax_amem.vllm import SwitchReport

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "vllm_colocated.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("vllm_colocated", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_arguments(bench):
    args = bench.parse_args([])
    assert (args.levels, args.iterations, args.layers, args.json) == ((1, 2), 3, 28, None)
    assert bench.parse_args(["--level", "2", "--iterations", "5"]).levels == (2,)
    for bad in (["--level", "3"], ["--iterations", "0"], ["--layers", "-1"]):
        with pytest.raises(SystemExit):
            bench.parse_args(bad)


# 20 GB of trainer state at 25 GB/s down and 20 GB/s up, 4 GB of weights at 1000 GB/s
BOUND = switch_bound.SwitchBound(trainer_bytes=20 * 10**9, engine_bytes=4 * 10**9, pinned_down_gb_s=25.0,
                                 pinned_up_gb_s=20.0, device_copy_gb_s=1000.0)


def test_the_bound_is_the_copies_at_the_measured_speeds():
    assert BOUND.pause == pytest.approx(0.8) and BOUND.resume == pytest.approx(1.0)
    assert BOUND.update == pytest.approx(0.004)
    assert BOUND.to_rollout == pytest.approx(0.804) and BOUND.to_trainer == pytest.approx(1.0)
    assert BOUND.round_trip == pytest.approx(1.804)
    assert BOUND.of("pause trainer") == BOUND.pause and BOUND.of("wake weights") is None


@pytest.mark.parametrize("change", [dict(pinned_up_gb_s=0.0), dict(device_copy_gb_s=float("nan")),
                                    dict(engine_bytes=-1)])
def test_a_bound_without_a_measured_speed_is_refused(change):
    fields = {**BOUND.__dict__, **change}
    with pytest.raises(ValueError, match="SwitchBound"):
        switch_bound.SwitchBound(**fields)


def reports(direction, parts_per_round):
    return [SwitchReport(direction, sum(parts.values()), dict(parts)) for parts in parts_per_round]


UP = reports("rollout", [{"wake weights": 0.01, "update": 0.006, "pause trainer": 0.9, "wake kv cache": 0.001},
                         {"wake weights": 0.03, "update": 0.008, "pause trainer": 1.0, "wake kv cache": 0.001},
                         {"wake weights": 0.02, "update": 0.007, "pause trainer": 0.95, "wake kv cache": 0.003}])
DOWN = reports("trainer", [{"engine sleep": 0.02, "resume trainer": 1.1}, {"engine sleep": 0.01, "resume trainer": 1.2},
                           {"engine sleep": 0.03, "resume trainer": 1.15}])


def test_medians_and_rows_in_the_order_the_parts_ran():
    up, down = switch_bound.median_parts(UP), switch_bound.median_parts(DOWN)
    # "total": the median of the whole switches, not the sum of the parts' medians
    assert up == pytest.approx({"wake weights": 0.02, "update": 0.007, "pause trainer": 0.95,
                                "wake kv cache": 0.001, "total": 0.98})
    rows = switch_bound.rows(up, down, BOUND)
    assert [r[0] for r in rows] == ["wake weights", "update", "pause trainer", "wake kv cache", "= to rollout",
                                    "engine sleep", "resume trainer", "= to trainer", "round trip"]
    assert rows[-1][1] == pytest.approx(0.98 + 1.18) and rows[-1][2] == pytest.approx(1.804)
    with pytest.raises(ValueError, match="no switch reports"):
        switch_bound.median_parts([])


def test_the_table_prints_figure_bound_and_ratio(bench):
    up, down = switch_bound.median_parts(UP), switch_bound.median_parts(DOWN)
    fig = dict(device="H100", iterations=3, layers=28, bound=BOUND.__dict__,
               levels={1: dict(to_rollout=up, to_trainer=down, generate_seconds=0.2,
                               memory={"trainer phase": 22e9, "rollout phase": 5e9})},
               baseline_a={1: dict(wake=0.3, device_get=3.0, reload=4.0, sleep=0.3, total=7.6)},
               baseline_b=dict(update_seconds=0.007, memory_in_use=26e9))
    text = bench.report(fig)
    round_trip = next(line for line in text.splitlines() if "round trip" in line)
    assert round_trip.split()[2:6] == ["2.1600", "1.8040", "1.20x", "(goal"]
    assert "update" in text and "0.0040" in text and "1.75x" in text      # 0.007 s against 0.004 s
    assert "trainer phase 22.00 GB, rollout phase 5.00 GB" in text
    assert "= 7.600 s (3.5x the round trip)" in text
    assert "update 7.0 ms; 26.00 GB in use throughout (nothing freed)" in text
