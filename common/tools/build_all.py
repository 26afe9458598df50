"""Build every CUDA extension side by side:  python -m common.tools.build_all

The extensions are independent (task 2's, task 4's, task 5's, and on an H100/H200 the sm_90a
Hopper kernel of task4/hopper.py), and each build spends most of its time in one nvcc process
per source file, so building them one after another leaves most of the machine idle. This runs
each `python -m <module>` build in its own process at once and prints each result as it
finishes; a failed build is reported with its compiler output and fails the command, the
others still finish. A cached build is reused, so a second run takes seconds. The two builds
whose longest source sets the whole build's length (LONG_BUILDS) keep the CPU's priority; the
others run niced, on the cores those leave.

`python -m common.tools.run_all` runs this as its first step, and the GPU test suite's
session start does too (tests/conftest.py), so that a cold machine pays for the builds once,
in parallel.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m common.tools.build_all")

import argparse
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from common.results import REPO_ROOT
from common.tools.manifests import task_folders

# Built only where their kernels run: the Hopper kernel is sm_90a code (task4/hopper.py).
HOPPER_BUILDS = ("task4.hopper",)
# The builds whose longest source sets the length of the whole build: task5/decode_linear.cu
# and the Hopper kernel's were the two longest compiles of the repository
# (results/logs/cpu_nvcc_longest_sources.txt); the Hopper kernel's 46 instantiations have since
# been split into flash_attention_hopper_fp16.cu and _bf16.cu, compiled side by side, each well
# under half of the one file (results/logs/cpu_nvcc_hopper_split.txt), then each of those into
# its dense and its general (_general.cu) instantiations, and task 5's kernels
# with many instantiations (decode_linear, decode_grouped, decode_gqa) the same way, one file
# per element type beside each host side (results/logs/cpu_nvcc_decode_split.txt), so no single
# source dominates either build any more. The other builds run at a lower CPU priority
# (nice), on the cores these leave: all ~20 nvcc processes at once on the GPU machine's 16
# cores had stretched the longest ones by half.
LONG_BUILDS = ("task5.compile", "task4.hopper")
LOW_PRIORITY = 10   # the niceness of the other builds


def build_modules(tasks: list[int] | None = None, hopper: bool | None = None) -> list[str]:
    """The build commands (modules run with `python -m`): every task's compile.py, among
    `tasks` if given, and the Hopper extension on a compute capability 9.0 GPU."""
    folders = [f for f in task_folders() if tasks is None or int(f[4:]) in tasks]
    modules = [f"{f}.compile" for f in folders if (REPO_ROOT / f / "compile.py").exists()]
    if hopper is None:
        hopper = _is_hopper()
    if hopper:
        modules += [m for m in HOPPER_BUILDS if tasks is None or _task_of(m) in tasks]
    return modules


def _task_of(module: str) -> int:
    return int(module.split(".")[0].removeprefix("task"))


def _is_hopper() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.get_device_capability() == (9, 0)


def build_command(module: str, niced: bool = False) -> list[str]:
    """The build's command line: `python -m module`, under `nice` when niced (the coreutils
    command rather than os.nice in a preexec_fn, which is unsafe in a process with threads,
    and the builds are started from a thread pool); where `nice` is missing, at full priority."""
    command = [sys.executable, "-m", module]
    nice = shutil.which("nice") if niced else None
    return [nice, "-n", str(LOW_PRIORITY), *command] if nice else command


def _build(module: str, niced: bool = False) -> tuple[str, int, float, str]:
    start = time.perf_counter()
    proc = subprocess.run(build_command(module, niced), cwd=REPO_ROOT, capture_output=True,
                          text=True)
    return module, proc.returncode, time.perf_counter() - start, proc.stdout + proc.stderr


def build_all(modules: list[str], quiet: bool = False) -> int:
    """Run the builds side by side; return how many failed (each failure's output is printed)."""
    failed = 0
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=max(1, len(modules))) as pool:
        # Niced only beside a long build: alone, a build has the machine to itself anyway.
        long_builds = any(m in LONG_BUILDS for m in modules)
        futures = [pool.submit(_build, m, long_builds and m not in LONG_BUILDS) for m in modules]
        for future in as_completed(futures):
            module, code, seconds, output = future.result()
            lines = output.strip().splitlines()
            if code == 0:
                if not quiet:
                    print(f"  ok    {module:<16} {seconds:6.1f} s  {lines[-1] if lines else ''}",
                          flush=True)
            else:
                failed += 1
                print(f"  FAIL  {module:<16} {seconds:6.1f} s\n" + "\n".join(lines[-40:]),
                      flush=True)
    if not quiet:
        print(f"[build_all] {len(modules) - failed}/{len(modules)} built in "
              f"{time.perf_counter() - start:.1f} s (side by side)", flush=True)
    return failed


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.tools.build_all", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=None,
                        help="comma-separated task numbers whose extensions to build (default: all)")
    args = parser.parse_args(argv)
    try:
        tasks = [int(t) for t in args.tasks.split(",") if t.strip()] if args.tasks else None
    except ValueError:
        parser.error(f"--tasks takes comma-separated numbers, e.g. 2,4, not {args.tasks!r}")
    from common.build import BuildError, _require_toolchain

    try:
        _require_toolchain()
    except BuildError as err:
        print(f"[build_all] {err}")
        return 1
    modules = build_modules(tasks)
    print(f"[build_all] building {', '.join(modules)} side by side", flush=True)
    return 1 if build_all(modules) else 0


if __name__ == "__main__":
    sys.exit(main())
