"""`python -m jax_amem bench` runs the repository's benchmarks/ scripts where it finds them, and
from an installed package outside a checkout says where they are instead of failing obscurely."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import jax_amem
from jax_amem import bench


def fake_benchmarks(folder: Path, names, log: Path) -> None:
    """Scripts that record their name in `log` when their main([]) runs."""
    folder.mkdir()
    for name in names:
        (folder / f"{name}.py").write_text(
            "def main(argv):\n"
            f"    assert argv == []\n"
            f"    open({str(log)!r}, 'a').write({name!r} + '\\n')\n")


def test_without_a_benchmarks_folder_it_says_where_they_are(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench, "_roots", lambda: [tmp_path / "here", tmp_path / "site"])
    assert bench.run_all() == 2
    out = capsys.readouterr().out
    assert "an installed package does not include them" in out
    assert "from the root of a checkout" in out and "make bench" in out
    assert f"{tmp_path / 'here' / 'benchmarks'}, {tmp_path / 'site' / 'benchmarks'}" in out
    assert all(name in out for name in bench.BENCHMARKS)


def test_it_runs_every_benchmark_in_order_from_the_first_folder_that_has_them(tmp_path, monkeypatch):
    log = tmp_path / "ran.txt"
    fake_benchmarks(tmp_path / "benchmarks", bench.BENCHMARKS, log)
    monkeypatch.setattr(bench, "_roots", lambda: [tmp_path / "empty", tmp_path])
    assert bench.benchmarks_folder() == tmp_path / "benchmarks"
    assert bench.run_all() == 0
    assert log.read_text().split() == bench.BENCHMARKS


def test_a_folder_missing_some_benchmarks_runs_the_rest_and_names_the_missing(tmp_path, monkeypatch, capsys):
    log = tmp_path / "ran.txt"
    fake_benchmarks(tmp_path / "benchmarks", ["swap", "plan_scale"], log)
    monkeypatch.setattr(bench, "_roots", lambda: [tmp_path])
    assert bench.run_all() == 1
    assert log.read_text().split() == ["plan_scale", "swap"]
    assert "missing from" in capsys.readouterr().out


def test_the_command_from_an_installed_package_outside_a_checkout(tmp_path):
    installed_beside = Path(jax_amem.__file__).resolve().parent.parent
    if (installed_beside / "benchmarks").is_dir():
        pytest.skip("jax_amem runs from a source tree that has benchmarks/ (it would run them all)")
    done = subprocess.run([sys.executable, "-P", "-m", "jax_amem", "bench"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "an installed package does not include them" in done.stdout
