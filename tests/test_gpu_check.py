"""benchmarks/gpu_check.sh and benchmarks/round_time.py at CPU scale (about a minute)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROUND_TIME = ROOT / "benchmarks" / "round_time.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def table_models(text: str) -> set[str]:
    """The first column of a markdown table's body rows."""
    return {line.split("|")[1].strip() for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| model")}


def test_quick_check_on_a_cpu_writes_every_table(tmp_path):
    out = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_check.sh"), "--device", "cpu",
                          "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    summary = (tmp_path / "summary.md").read_text()
    for step in ("a round_time.py", "b equality tests", "c evidence cell run", "d CPU vs cpu"):
        assert f"- {step}" in summary and "FAILED" not in summary, summary
    timings = (tmp_path / "a_round_time.md").read_text()
    assert table_models(timings) == {"lenet-cifar", "resnet20"}, timings
    assert "lenet-cifar: SGD lr 0.01, momentum 0.5" in timings  # preset fedmut-official
    for model in ("lenet-cifar", "resnet20"):
        for method in ("fedavg", "fedmut"):
            for backend in ("loop", "vmap"):
                assert f"| {model} | {method} | {backend} |" in timings, timings
    tests = (tmp_path / "b_equality_tests.md").read_text()
    assert "| passed |" in tests and "FAILED" not in tests, tests
    compare = (tmp_path / "d_compare.md").read_text()
    assert "| round | CPU (committed) acc | cpu acc |" in compare, compare
    assert "Max abs accuracy difference" in compare, compare
    assert (tmp_path / "c_cell_run" / "metrics.jsonl").read_text().count("\n") == 2


@pytest.mark.parametrize("flag, name", [("--models", "resnet21"), ("--backends", "graph")])
def test_unknown_model_or_backend_is_a_one_line_error(flag, name):
    out = subprocess.run([sys.executable, str(ROUND_TIME), "--device", "cpu", flag, name],
                         capture_output=True, text=True, env=ENV, timeout=120)
    assert out.returncode != 0
    assert out.stdout == ""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert repr(name) in lines[0], lines[0]
    valid = ("cnn", "resnet20", "lenet-cifar") if flag == "--models" else ("loop", "graphs")
    assert all(v in lines[0] for v in valid), lines[0]
