"""benchmarks/suite_cpu.py: the table against a hand count, and its plugin's rows."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a script of benchmarks/, not a package: loaded from its file, sys.path left alone
_SPEC = importlib.util.spec_from_file_location("suite_cpu", ROOT / "benchmarks" / "suite_cpu.py")
suite_cpu = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(suite_cpu)


def test_the_table_sums_each_file_and_sorts_by_cpu(tmp_path):
    csv = tmp_path / "rows.csv"
    csv.write_text("tests/test_a.py::one\t1.00\t3.00\n"
                   "tests/test_b.py::two\t4.00\t1.00\n"
                   "tests/test_a.py::three[x]\t2.00\t5.00\n"
                   "notebooks/n.ipynb::Cell 1\t0.50\t1.00\n")
    rows = suite_cpu.table(csv, top=2).splitlines()
    # a: 2 tests, wall 3, CPU 8 of 10; then b and the notebook tie at 1: the first seen
    assert rows[2] == "| tests/test_a.py | 2 | 3 | 8 | 80.0% |"
    assert rows[3] == "| tests/test_b.py | 1 | 4 | 1 | 10.0% |"
    assert rows[4] == "| 1 other files | 1 | 0 | 1 | 10.0% |"
    assert rows[5] == "| all | 4 | 8 | 10 | 100% |"


def test_the_plugin_writes_a_row_per_test(tmp_path):
    (tmp_path / "test_tiny.py").write_text("def test_one():\n    pass\n\n"
                                           "def test_two():\n    sum(range(10**6))\n")
    csv = tmp_path / "rows.csv"
    env = {**os.environ, "SUITE_CPU_CSV": str(csv),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT)])}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "suite_cpu", "-p",
                           "no:cacheprovider", "test_tiny.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:]
    rows = [line.split("\t") for line in csv.read_text().splitlines()]
    assert [r[0] for r in rows] == ["test_tiny.py::test_one", "test_tiny.py::test_two"]
    assert all(float(wall) >= 0 and float(cpu) >= 0 for _, wall, cpu in rows)
