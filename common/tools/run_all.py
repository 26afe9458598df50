"""The main job: build everything, run every task's test, benchmark, render Results.md.

    python -m common.run_all                 # everything (on a GPU machine)
    python -m common.run_all --tasks 1,3     # some tasks only
    python -m common.run_all --no-bench      # skip the benchmark sweep

Each step runs in its own process (a crash in one task cannot take the others down) and
its output streams live. Every test records what it measured in results/<gpu>.json; the
last step renders Results.md from that file. Exit code 1 if any step failed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
TASKS = [1, 2, 3, 4, 5, 6, 7]


def steps(tasks: list[int], bench: bool) -> list[tuple[str, list[str]]]:
    plan = []
    for n in tasks:
        if (REPO_ROOT / f"task{n}" / "compile.py").exists():
            plan.append((f"task{n}.compile", [f"task{n}.compile"]))
        if (REPO_ROOT / f"task{n}" / "test.py").exists():
            plan.append((f"task{n}.test", [f"task{n}.test"]))
    if 7 in tasks and (REPO_ROOT / "task7" / "inference.py").exists():
        plan.append(("task7.inference", ["task7.inference", "--record"]))
    if bench and (REPO_ROOT / "common" / "bench.py").exists():
        plan.append(("common.bench", ["common.bench"]))
    plan.append(("common.results", ["common.results"]))
    return plan


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.run_all", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(map(str, TASKS)),
                        help="comma-separated task numbers (default: all)")
    parser.add_argument("--no-bench", action="store_true", help="skip the benchmark sweep")
    args = parser.parse_args(argv)
    tasks = [int(t) for t in args.tasks.split(",") if t.strip()]

    summary = []
    for name, module_args in steps(tasks, bench=not args.no_bench):
        print(f"\n######## {name} ########", flush=True)
        start = time.perf_counter()
        code = subprocess.call([sys.executable, "-m", *module_args], cwd=REPO_ROOT)
        summary.append((name, code, time.perf_counter() - start))

    print("\n######## summary ########")
    for name, code, seconds in summary:
        print(f"  {'ok  ' if code == 0 else 'FAIL'}  {name:<20} {seconds:7.1f} s")
    return 0 if all(code == 0 for _, code, _ in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
