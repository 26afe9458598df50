"""Run every CUDA task's small checks under compute-sanitizer and keep the evidence.

    python -m common.tools.sanitize                         # tasks 2, 4, 5 x memcheck, racecheck
    python -m common.tools.sanitize --tasks 4 --tools memcheck,racecheck,synccheck

Each task's `small` group (tiny shapes, every dtype and mask, no timing), and for tasks 4
and 5 the small groups of the attention variants, run under each tool; on an H100/H200 also
the Hopper kernel's small launches of every rung and variant (task4.hopper_ladder
--sanitizer-cases, recorded as sanitizer.task4_hopper.<tool>.errors). memcheck runs with PyTorch's caching allocator off (PYTORCH_NO_CUDA_MEMORY_CACHING=1)
so an out-of-bounds access past a tensor's end lands outside any allocation and is caught.
The tools' summaries go to results/sanitizer_<gpu>.txt and the error counts into
results/<gpu>.json (sanitizer.taskN.<tool>.errors); exit 1 if any tool found an error or a
run failed.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m common.tools.sanitize")

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


# Beside each task's `small` group, the tiny cases of its attention-variant kernels (task 4's
# backward kernels too, and task 5's paged cache and fused decode kernels).
SMALL_VARIANT_GROUPS = {4: ("--variants-small", "--backward-small", "--backward-half-small"),
                        5: ("--gqa-small", "--paged-small", "--fused-small")}


def runs_of(task: int, hopper_gpu: bool) -> list[tuple[str, list[str]]]:
    """(label, `python -m` arguments) of each sanitizer run of a task: its --small checks with
    its small variant groups, and for task 4 on a compute capability 9.0 GPU also the Hopper
    kernel's small launches of every rung, its variants included (task4.hopper_ladder
    --sanitizer-cases; on other GPUs the kernel does not run)."""
    runs = [(f"task{task}", [f"task{task}.test", "--small", *SMALL_VARIANT_GROUPS.get(task, ()),
                             "--no-record"])]
    if task == 4 and hopper_gpu:
        runs.append(("task4_hopper", ["task4.hopper_ladder", "--sanitizer-cases", "1,2,3,4,5,6,7"]))
    return runs


def run_one(module_args: list[str], tool: str, timeout: float) -> tuple[int | None, str, float]:
    """(error count or None if the run itself failed, the tool's summary, seconds)."""
    env = dict(os.environ)
    if tool == "memcheck":
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "log.txt"
        cmd = ["compute-sanitizer", f"--tool={tool}", "--error-exitcode=99", f"--log-file={log}",
               sys.executable, "-m", *module_args]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return None, f"timed out after {timeout:.0f} s", time.perf_counter() - start
        seconds = time.perf_counter() - start
        text = log.read_text() if log.exists() else ""
    # memcheck/synccheck/initcheck end with "ERROR SUMMARY: N errors"; racecheck with
    # "RACECHECK SUMMARY: H hazards displayed (N errors, W warnings)".
    found = (re.search(r"ERROR SUMMARY: (\d+) error", text)
             or re.search(r"RACECHECK SUMMARY: .*?\((\d+) error", text))
    tail = "\n".join(text.strip().splitlines()[-15:])
    test_tail = "\n".join(proc.stdout.strip().splitlines()[-3:])
    if found is None:
        return None, f"no sanitizer summary (exit {proc.returncode})\n{tail}\n{proc.stderr[-800:]}", seconds
    errors = int(found.group(1))
    if proc.returncode not in (0, 99):  # the test itself failed under the tool
        return None, f"the test failed (exit {proc.returncode}):\n{test_tail}\n{tail}", seconds
    return errors, (tail if errors else found.group(0)) + "\n" + test_tail, seconds


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.tools.sanitize", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default="2,4,5")
    parser.add_argument("--tools", default="memcheck,racecheck")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args(argv)
    if shutil.which("compute-sanitizer") is None:
        print("[sanitize] compute-sanitizer is not on PATH; it ships with the CUDA toolkit "
              "(e.g. /usr/local/cuda/bin).")
        return 1
    from common.results import RESULTS_DIR, device_key, record, run_meta

    meta = run_meta()
    lines = [f"compute-sanitizer on {meta['device']}, torch {meta['torch']}, CUDA {meta['cuda']}, "
             f"{meta['date']}, commit {meta['commit']}", ""]
    import torch

    hopper_gpu = torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)
    metrics, ok = {}, True
    for task in [int(t) for t in args.tasks.split(",")]:
        for label, module_args in runs_of(task, hopper_gpu):
            for tool in args.tools.split(","):
                errors, summary, seconds = run_one(module_args, tool, args.timeout)
                status = "FAILED TO RUN" if errors is None else f"{errors} errors"
                print(f"[sanitize] {label} {tool:<10} {status:<14} ({seconds:.0f} s)", flush=True)
                lines += [f"## {' '.join(module_args)} under {tool}: {status} ({seconds:.0f} s)",
                          summary, ""]
                if errors is None or errors:
                    ok = False
                if errors is not None:
                    metrics[f"sanitizer.{label}.{tool}.errors"] = errors
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"sanitizer_{device_key()}.txt"
    path.write_text("\n".join(lines) + "\n")
    if metrics and not args.no_record:
        record(metrics)
    print(f"[sanitize] summaries in {path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
