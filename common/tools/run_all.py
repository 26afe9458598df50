"""The main job: build everything, run every task's test, benchmark, render Results.md.

    python -m common.tools.run_all                 # everything (on a GPU machine)
    python -m common.tools.run_all --tasks 1,3     # some tasks only
    python -m common.tools.run_all --no-bench      # skip the benchmark sweep

Each step runs in its own process (a crash in one task cannot take the others down) and
its output streams live. Every test records what it measured in results/<gpu>.json; the
last step renders Results.md from that file. Exit code 1 if any step failed.

Without a CUDA GPU it says so first, runs what a CPU can run (the tests of the tasks whose
manifest does not need a GPU, tasks 1 and 3, and the nvcc compile check of every kernel
when nvcc is installed), lists what it skipped and why, and exits 0 when all of that passed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from common.tools.manifests import manifests

REPO_ROOT = Path(__file__).resolve().parents[2]


def _gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def steps(tasks: list[int], bench: bool, gpu: bool = True,
          nvcc: bool = False) -> tuple[list[tuple[str, list[str]]], list[tuple[str, str]]]:
    """(the steps to run as (name, module args), the steps skipped as (name, why))."""
    by_task = {m.task: m for m in manifests()}
    plan, skipped = [], []
    for n in tasks:
        folder = REPO_ROOT / f"task{n}"
        manifest = by_task.get(n)
        if not gpu and (manifest is None or manifest.needs_gpu):
            if (folder / "test.py").exists():
                why = manifest.cpu_note if manifest and manifest.cpu_note else "CUDA code"
                skipped.append((f"task{n}", f"needs a CUDA GPU: {why}"))
            continue
        if (folder / "compile.py").exists():
            plan.append((f"task{n}.compile", [f"task{n}.compile"]))
        if (folder / "test.py").exists():
            plan.append((f"task{n}.test", [f"task{n}.test"]))
        if n == 7 and (folder / "inference.py").exists():
            plan.append(("task7.inference", ["task7.inference", "--record"]))
    if not gpu:
        if nvcc:
            plan.append(("common.tools.compile_check", ["common.tools.compile_check"]))
        else:
            skipped.append(("common.tools.compile_check", "nvcc is not installed"))
        if bench:
            skipped.append(("common.tools.bench", "times the kernels on a GPU"))
        skipped.append(("common.tools.report", "a CPU run records no figures for Results.md"))
        return plan, skipped
    if bench:
        plan.append(("common.tools.bench", ["common.tools.bench"]))
    plan.append(("common.tools.report", ["common.tools.report"]))
    return plan, skipped


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.tools.run_all", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(str(m.task) for m in manifests()),
                        help="comma-separated task numbers (default: all)")
    parser.add_argument("--no-bench", action="store_true", help="skip the benchmark sweep")
    args = parser.parse_args(argv)
    try:
        tasks = [int(t) for t in args.tasks.split(",") if t.strip()]
    except ValueError:
        parser.error(f"--tasks takes comma-separated numbers, e.g. 1,3, not {args.tasks!r}")

    from common.tools.compile_check import find_nvcc

    gpu = _gpu()
    plan, skipped = steps(tasks, bench=not args.no_bench, gpu=gpu, nvcc=find_nvcc() is not None)
    if not gpu:
        print("[run_all] No CUDA GPU is visible to torch here, so this runs only what a CPU can: "
              + (", ".join(name for name, _ in plan) or "nothing")
              + ". Skipped: " + "; ".join(f"{name} ({why})" for name, why in skipped) + ".",
              flush=True)

    summary = []
    for name, module_args in plan:
        print(f"\n######## {name} ########", flush=True)
        start = time.perf_counter()
        code = subprocess.call([sys.executable, "-m", *module_args], cwd=REPO_ROOT)
        summary.append((name, code, time.perf_counter() - start))

    print("\n######## summary ########")
    for name, code, seconds in summary:
        print(f"  {'ok  ' if code == 0 else 'FAIL'}  {name:<28} {seconds:7.1f} s")
    for name, why in skipped:
        print(f"  skip  {name:<28} {why}")
    return 0 if all(code == 0 for _, code, _ in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
