"""The main job: build everything, run every task's test, render Results.md.

    python -m common.tools.run_all                 # the main job (on a GPU machine)
    python -m common.tools.run_all --everything    # also the benchmark sweep and its plots
    python -m common.tools.run_all --tasks 1,3     # some tasks only

The steps, each in its own process (a crash in one cannot take the others down), their
output streaming live (but for the steps beside the build):
  build     every CUDA extension at once, side by side (common.tools.build_all): the
            builds are independent, and one after another they took three times as long.
            The tasks that need no extension (those a CPU can run, with no compile.py: tasks
            1 and 3) run their tests meanwhile, their output printed when the build is done:
            they time nothing, and the build is bound by nvcc's CPU work;
  taskN     every task's test with all its check groups (the course protocol, the kernels
            against SDPA, the variants, the decode, the models), then GPT-2 generating
            (task7.inference --record);
  bench     only with --everything: the benchmark sweep that draws the plots of Results.md
            (common.tools.bench; minutes of timing, and it checks nothing the tests do not),
            the training run (task6.train), and the task tests' benchmark groups that the
            main job leaves out (each manifest's everything_groups: task 4's backward benches,
            task 6's grouped-query model);
  train     only with --everything: task 6's model and GPT-2 trained on our forward and
            backward kernels beside SDPA (task6.train: the loss gap, step times, the curves);
  report    renders Results.md from results/<gpu>.json, where every test recorded its figures.
`python -m pytest` on a GPU runs every check of these steps and more.

The exit code says whether the code is correct: 1 if a step failed (a build error, a wrong
result, a crash), else 0. A missed performance target prints MISS in its step and is recorded
but fails nothing; the summary shows each step's time and how many targets it missed. On a GPU
the job records its wall time and failed steps (`run_all.seconds`, `run_all.failed_steps`) in
results/<gpu>.json.

Without a CUDA GPU it says so first, runs what a CPU can run (the tests of the tasks whose
manifest does not need a GPU, tasks 1 and 3, and the nvcc compile check of every kernel
when nvcc is installed), lists what it skipped and why, and exits 0 when all of that passed.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m common.tools.run_all")

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from common.tools.manifests import manifests

REPO_ROOT = Path(__file__).resolve().parents[2]
# Each task test writes its checks here (--json), so the summary can count missed targets.
REPORTS_DIR = REPO_ROOT / "build" / "run_all"


def _gpu() -> bool:
    import torch

    return torch.cuda.is_available()


@dataclass
class Step:
    name: str
    module_args: list[str]
    report: Path | None = None      # the --json report of a task test
    beside_build: bool = False      # needs no extension: runs while the build compiles


def _test_step(n: int, skip: tuple[str, ...] = (), beside_build: bool = False) -> Step:
    report = REPORTS_DIR / f"task{n}.json"
    return Step(f"task{n}.test", [f"task{n}.test", "--json", str(report),
                                  *(["--skip", ",".join(skip)] if skip else [])], report,
                beside_build)


def steps(tasks: list[int], bench: bool, gpu: bool = True,
          nvcc: bool = False) -> tuple[list[Step], list[tuple[str, str]]]:
    """(the steps to run, the steps skipped as (name, why))."""
    by_task = {m.task: m for m in manifests()}
    plan, skipped = [], []
    if gpu and any((REPO_ROOT / f"task{n}" / "compile.py").exists() for n in tasks):
        plan.append(Step("build", ["common.tools.build_all", "--tasks", ",".join(map(str, tasks))]))
    for n in tasks:
        folder = REPO_ROOT / f"task{n}"
        manifest = by_task.get(n)
        if not gpu and (manifest is None or manifest.needs_gpu):
            if (folder / "test.py").exists():
                why = manifest.cpu_note if manifest and manifest.cpu_note else "CUDA code"
                skipped.append((f"task{n}", f"needs a CUDA GPU: {why}"))
            continue
        if (folder / "test.py").exists():
            plan.append(_test_step(
                n, () if bench or manifest is None else manifest.everything_groups,
                beside_build=(gpu and manifest is not None and not manifest.needs_gpu
                              and not (folder / "compile.py").exists())))
        if n == 7 and (folder / "inference.py").exists():
            plan.append(Step("task7.inference", ["task7.inference", "--record"]))
    if not gpu:
        if nvcc:
            plan.append(Step("common.tools.compile_check", ["common.tools.compile_check"]))
        else:
            skipped.append(("common.tools.compile_check", "nvcc is not installed"))
        if bench:
            skipped.append(("common.tools.bench", "times the kernels on a GPU"))
        skipped.append(("common.tools.report", "a CPU run records no figures for Results.md"))
        return plan, skipped
    if bench:
        if 6 in tasks and (REPO_ROOT / "task6" / "train.py").exists():
            plan.append(Step("task6.train", ["task6.train", "--quiet"]))
        plan.append(Step("common.tools.bench", ["common.tools.bench"]))
    plan.append(Step("common.tools.report", ["common.tools.report"]))
    return plan, skipped


def run_step(step: Step, capture: bool = False) -> tuple[int, float, str]:
    """(exit code, seconds, output): the step in its own process, its output streaming live
    unless captured."""
    if step.report is not None:
        step.report.unlink(missing_ok=True)
    start = time.perf_counter()
    command = [sys.executable, "-m", *step.module_args]
    if capture:   # unbuffered, so that stderr's lines stay in place among stdout's
        try:
            proc = subprocess.run(command, cwd=REPO_ROOT, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, errors="replace",
                                  env={**os.environ, "PYTHONUNBUFFERED": "1"})
        except OSError as err:   # the step failed, not the job
            return (1, time.perf_counter() - start,
                    f"[run_all] {step.name} could not start: {err}\n")
        return proc.returncode, time.perf_counter() - start, proc.stdout
    return subprocess.call(command, cwd=REPO_ROOT), time.perf_counter() - start, ""


def _report_checks(report: Path | None) -> list[dict]:
    """The checks of a task test's --json report ([] if there is none or it cannot be read)."""
    if report is None or not report.exists():
        return []
    try:
        return json.loads(report.read_text()).get("checks", [])
    except (OSError, ValueError):
        return []


def missed_targets(report: Path | None) -> int:
    """How many performance targets a task test's --json report says were missed (0 if none
    or no report)."""
    return sum(1 for c in _report_checks(report) if c.get("target") and not c.get("passed"))


def failed_checks(report: Path | None) -> list[str]:
    """The names of the checks (not performance targets) that a task test's --json report says
    failed ([] if none or no report)."""
    return [str(c.get("name")) for c in _report_checks(report)
            if not c.get("target") and not c.get("passed")]


def summary_lines(summary: list[tuple[str, int, float, int]],
                  skipped: list[tuple[str, str]], total_seconds: float,
                  beside_build: frozenset[str] = frozenset(),
                  failures: dict[str, list[str]] | None = None) -> list[str]:
    """One line per step (its time, checks failed, targets missed; the steps that ran beside
    the build say so: their time overlapped the build's, within the job's wall time), under a
    failed step the names of its failed checks (`failures`, by step: a missed target never
    fails a step, so a FAIL line must say what did), the skipped steps, then the count and the
    job's wall time."""
    lines = []
    failures = failures or {}
    for name, code, seconds, missed in summary:
        failed = failures.get(name, []) if code != 0 else []
        notes = [f"{len(failed)} check{'s' if len(failed) != 1 else ''} failed"] if failed else []
        if missed:
            notes.append(f"{missed} target{'s' if missed != 1 else ''} missed (MISS)")
        note = f"   {'; '.join(notes)}" if notes else ""
        if name in beside_build:
            note += "   (beside the build)"
        lines.append(f"  {'ok  ' if code == 0 else 'FAIL'}  {name:<28} {seconds:7.1f} s{note}")
        shown = 5
        lines += [f"          failed: {check}" for check in failed[:shown]]
        if len(failed) > shown:
            lines.append(f"          ... and {len(failed) - shown} more (the step's output above)")
    for name, why in skipped:
        lines.append(f"  skip  {name:<28} {why}")
    failed = sum(1 for _, code, _, _ in summary if code != 0)
    lines.append(f"  {len(summary) - failed}/{len(summary)} steps ok in {total_seconds:.1f} s"
                 + (f"; {failed} failed" if failed else ""))
    return lines


def _record(total_seconds: float, summary, lines: list[str]) -> None:
    """run_all.seconds and run_all.failed_steps (and the summary) in results/<gpu>.json, then
    Results.md rendered again so that it shows them."""
    from common.results import record
    from common.tools import report

    failed = sum(1 for _, code, _, _ in summary if code != 0)
    metrics = {"run_all.seconds": total_seconds, "run_all.failed_steps": failed,
               "run_all.targets_missed": sum(missed for *_, missed in summary)}
    for name, _, seconds, _ in summary:
        metrics[f"run_all.step.{name}.seconds"] = seconds
    path = record(metrics, {"run_all.summary": "\n".join(lines)})
    report.render()
    print(f"[run_all] recorded run_all.seconds {total_seconds:.1f} and run_all.failed_steps "
          f"{failed} in {path}, and rendered Results.md again")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.tools.run_all", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    default_tasks = ",".join(str(m.task) for m in manifests())
    parser.add_argument("--tasks", default=default_tasks,
                        help="comma-separated task numbers (default: all)")
    parser.add_argument("--everything", action="store_true",
                        help="also run the benchmark sweep (common.tools.bench) before the report")
    parser.add_argument("--no-record", action="store_true",
                        help="do not record run_all.seconds and run_all.failed_steps")
    args = parser.parse_args(argv)
    try:
        tasks = [int(t) for t in args.tasks.split(",") if t.strip()]
    except ValueError:
        parser.error(f"--tasks takes comma-separated numbers, e.g. 1,3, not {args.tasks!r}")

    from common.tools.compile_check import find_nvcc

    start = time.perf_counter()
    gpu = _gpu()
    plan, skipped = steps(tasks, bench=args.everything, gpu=gpu, nvcc=find_nvcc() is not None)
    if not gpu:
        print("[run_all] No CUDA GPU is visible to torch here, so this runs only what a CPU can: "
              + (", ".join(step.name for step in plan) or "nothing")
              + ". Skipped: " + "; ".join(f"{name} ({why})" for name, why in skipped) + ".",
              flush=True)
    REPORTS_DIR.mkdir(parents=True, exist_ok=True)

    results: dict[str, tuple[int, float]] = {}
    building = bool(plan) and plan[0].name == "build"
    beside = [step for step in plan if step.beside_build] if building else []
    with ThreadPoolExecutor(max_workers=1) as pool:
        # While the build compiles, the steps that need no extension run one after another.
        outputs = pool.submit(lambda: [(step, *run_step(step, capture=True)) for step in beside])
        for step in plan:
            if step in beside:
                continue
            print(f"\n######## {step.name} ########", flush=True)
            results[step.name] = run_step(step)[:2]
            if step.name == "build":
                for done, code, seconds, output in outputs.result():
                    print(f"\n######## {done.name} (ran beside the build) ########\n{output}",
                          end="", flush=True)
                    results[done.name] = code, seconds
    summary = [(step.name, *results[step.name], missed_targets(step.report)) for step in plan]
    total = time.perf_counter() - start

    lines = summary_lines(summary, skipped, total, frozenset(step.name for step in beside),
                          {step.name: failed_checks(step.report) for step in plan})
    print("\n######## summary ########")
    print("\n".join(lines), flush=True)
    # Only the main job itself (every task, no extras) sets the figures it is judged by.
    main_job = tasks == [int(t) for t in default_tasks.split(",")] and not args.everything
    if gpu and main_job and not args.no_record:
        _record(total, summary, lines)
    return 0 if all(code == 0 for _, code, _, _ in summary) else 1


if __name__ == "__main__":
    sys.exit(main())
