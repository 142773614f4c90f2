"""Where the test suite's CPU goes: CPU seconds and wall seconds per test file.

CI gives the suite 2 cores and 15 minutes, so what must fit is CPU seconds (under about
1,700 with two workers), not one test's wall time. A test's CPU is read machine-wide from
/proc/stat around it, so it counts what it starts outside pytest too (Chromium, JupyterLab,
notebook kernels, Ray's processes, subprocesses), which per-process accounting misses. That
makes it exact only on an otherwise idle machine, with one worker (``-n 1``): run it so.

    python benchmarks/suite_cpu.py                         # the suite as make test runs it
    python benchmarks/suite_cpu.py -- tests/test_sweep.py  # pytest arguments after --
    python benchmarks/suite_cpu.py --from /tmp/flnotes_suite_cpu.csv --top 20  # a run's table

Used as a pytest plugin (``-p suite_cpu`` with benchmarks/ on PYTHONPATH) it appends
``test id, wall s, CPU s`` to the file named by SUITE_CPU_CSV.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TICKS = os.sysconf("SC_CLK_TCK")
# make test's pytest line, one worker (a second would be counted into the first's tests)
SUITE = ["tests", "notebooks", "--nbval-lax", "--sanitize-with", "tests/nbval_sanitize.cfg",
         "-p", "no:cacheprovider", "-p", "no:benchmark", "-n", "1", "--dist", "loadfile", "-q"]


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (every state but idle and
    iowait of /proc/stat's first line)."""
    with open("/proc/stat") as stat:
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(
            int, stat.readline().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / TICKS


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """(plugin) One row per test: its setup, call and teardown together."""
    cpu, wall = busy_seconds(), time.monotonic()
    yield
    with open(os.environ["SUITE_CPU_CSV"], "a") as out:
        out.write(f"{item.nodeid}\t{time.monotonic() - wall:.2f}\t"
                  f"{busy_seconds() - cpu:.2f}\n")


def table(csv: Path, top: int) -> str:
    """A markdown table of the rows in ``csv`` by file, most CPU first."""
    wall, cpu, count = collections.Counter(), collections.Counter(), collections.Counter()
    for line in csv.read_text().splitlines():
        test, seconds, busy = line.split("\t")
        name = test.split("::")[0]
        wall[name] += float(seconds)
        cpu[name] += float(busy)
        count[name] += 1
    total = sum(cpu.values())
    shown = dict(cpu.most_common(top))
    lines = ["| file | tests | wall s | CPU s | share of CPU |", "|---|---:|---:|---:|---:|"]
    for name, busy in shown.items():
        lines.append(f"| {name} | {count[name]} | {wall[name]:.0f} | {busy:.0f} | "
                     f"{busy / total:.1%} |")
    rest = [n for n in cpu if n not in shown]
    if rest:
        lines.append(f"| {len(rest)} other files | {sum(count[n] for n in rest)} | "
                     f"{sum(wall[n] for n in rest):.0f} | {sum(cpu[n] for n in rest):.0f} | "
                     f"{sum(cpu[n] for n in rest) / total:.1%} |")
    lines.append(f"| all | {sum(count.values())} | {sum(wall.values()):.0f} | {total:.0f} | "
                 f"100% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    pytest_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    default = Path(tempfile.gettempdir()) / "flnotes_suite_cpu.csv"
    parser.add_argument("--csv", type=Path, default=default,
                        help=f"where the per-test rows go (default: {default})")
    parser.add_argument("--from", dest="source", type=Path,
                        help="print the table of an earlier run's rows; run nothing")
    parser.add_argument("--top", type=int, default=25, help="files listed (default 25)")
    args = parser.parse_args(own)
    if args.top < 1:
        parser.error(f"--top must be 1 or more, got {args.top}")
    if args.source is not None:
        if not args.source.is_file():
            parser.error(f"no such file: {args.source}")
        print(table(args.source, args.top))
        return 0
    args.csv.unlink(missing_ok=True)
    env = {**os.environ, "SUITE_CPU_CSV": str(args.csv.resolve()), "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "benchmarks"), str(ROOT),
                                                        os.environ.get("PYTHONPATH")]))}
    start = busy_seconds(), time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", *(pytest_args or SUITE),
                           "-p", "suite_cpu"], cwd=ROOT, env=env)
    cpu, wall = busy_seconds() - start[0], time.monotonic() - start[1]
    if not args.csv.is_file():
        print(f"pytest ran no test (exit {done.returncode})", file=sys.stderr)
        return 1
    print(table(args.csv, args.top))
    print(f"\npytest exit {done.returncode}; {wall:.0f} s wall, {cpu:.0f} CPU s machine-wide "
          f"({os.cpu_count()} cores; load average now {os.getloadavg()[0]:.2f})")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
