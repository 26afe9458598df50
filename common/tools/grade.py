"""Grade a checkout:  python -m common.tools.grade [--tasks 1,2,...] [--json FILE] [--repo DIR]

Each task's own test (`python -m taskN.test --no-record --json ...` with the graded groups)
runs in its own process, with the graded checkout as working directory and a time limit, so
a crash or a hang costs that task only. The points come from the checks the test reports,
scored by RUBRIC, the tasks' manifests (taskN/manifest.py; README.md, For instructors, shows
them as one table):

  * correctness: a part earns its points when every check of its groups passes (task 2's
    three parts, softmax, gemm and attention, score separately; every other task is one
    part: all or nothing, as the course grades);
  * performance (task 4 only, as the course makes its score depend on speed): only a
    correct kernel earns these; per mask at (B, S) = (64, 4096), the module-level speedup
    over nn.MultiheadAttention earns the points of the first tier it reaches.

Status per task: pass, fail, not implemented, build failed, timeout, crashed, missing, or
skipped: needs a GPU (without a CUDA GPU, tasks 2 and 4-7 score 0 and say so). The table
also shows the measured speedups (task 4's four, task 5's two, task 6's TTFT/TBT).

    python -m common.tools.grade                               # grade this checkout
    python -m common.tools.grade --repo ../attention-student   # grade another checkout
    python -m common.tools.grade --record-as main              # also record grade.main.* (GPU)
    python -m common.tools.grade --repo DIR --isolate          # the student's files, our tests

With --reports DIR, a task whose `python -m taskN.test --json DIR/taskN.json` report (from a
GPU run) covers its graded groups is scored from that report instead of being run again; any
failing check in it fails the part. With --isolate, only the files a student edits (those with solution regions here) are taken
from --repo, into a fresh copy of this repository, so edited tests or checks cannot change
the grade.
"""

from __future__ import annotations

if not __package__:  # run as a file, where `common` cannot be imported
    raise SystemExit("Run this from the repository root as a module: python -m common.tools.grade")

import argparse
import ast
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from common.manifest import Part, TaskManifest
from common.tools.manifests import manifests

REPO_ROOT = Path(__file__).resolve().parents[2]


# --- the rubric: each task's manifest ---------------------------------------------------------

# Part, SpeedRule and the points of every task are declared in taskN/manifest.py (MANIFEST);
# RUBRIC is them, in task order. README.md shows it as `rubric_markdown()` prints it.
TaskRubric = TaskManifest
RUBRIC: tuple[TaskManifest, ...] = manifests()
TOTAL_POINTS = sum(r.points for r in RUBRIC)


def rubric_markdown() -> str:
    """The rubric as the Markdown table README.md shows (a test keeps the two identical)."""
    rows = ["| task | points | runs on | graded groups | how the points are earned |",
            "|---|---|---|---|---|"]
    for r in RUBRIC:
        flags = [" ".join([*(f"`--{g}`" for g in p.groups)]
                          + ([f"`{' '.join(p.options)}`"] if p.options else [])) for p in r.parts]
        if len(r.parts) == 1:
            how = [f"{r.parts[0].points:g} when every check passes"]
        else:
            how = [f"{r.parts[0].points:g} per group whose checks all pass"
                   if len({q.points for q in r.parts}) == 1 else
                   "; ".join(f"{f}: {p.points:g}" for f, p in zip(flags, r.parts, strict=True))]
        for tiers in dict.fromkeys(rule.tiers for rule in r.speed):
            labels = " and ".join(rule.label for rule in r.speed if rule.tiers == tiers)
            how.append(f"then, only if correct, for each module speedup over "
                       f"nn.MultiheadAttention ({labels}): "
                       + ", ".join(f"{p:g} at >= {t:g}x" for t, p in tiers))
        rows.append(f"| {r.task} | {r.points:g} | {'GPU' if r.needs_gpu else 'CPU or GPU'} | "
                    f"{', '.join(flags)} | {'; '.join(how)} |")
    rows.append(f"| all | {TOTAL_POINTS:g} | | | |")
    return "\n".join(rows)


# --- running one task ------------------------------------------------------------------------

@dataclass
class Run:
    """One `python -m taskN.test` process."""
    groups: tuple[str, ...]
    status: str = "pass"        # pass, fail, not implemented, build failed, timeout, crashed
    reason: str = ""
    details: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    exit_code: int | None = None


@dataclass
class TaskGrade:
    task: int
    points: float
    max_points: float
    status: str
    reason: str = ""
    details: list[str] = field(default_factory=list)
    speedups: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    runs: list[dict] = field(default_factory=list)
    seconds: float = 0.0


_NOT_IMPLEMENTED = re.compile(r"(NotImplementedError: .*|.*not implemented( yet)?\b.*)", re.I)


def test_groups(test_py: Path) -> list[str] | None:
    """The groups of a test.py (`GROUPS = {"name": fn, ...}` read without importing it)."""
    try:
        tree = ast.parse(test_py.read_text())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else (
            node.target if isinstance(node, ast.AnnAssign) else None)
        if isinstance(target, ast.Name) and target.id == "GROUPS" and isinstance(node.value, ast.Dict):
            keys = [k.value for k in node.value.keys if isinstance(k, ast.Constant)]
            if keys and all(isinstance(k, str) for k in keys):
                return keys
    return None


def plan_parts(rubric: TaskRubric, available: list[str] | None) -> tuple[list[Part], list[str]]:
    """The parts to run, restricted to the groups the test has; and notes on what is missing."""
    if available is None:
        return [Part((), sum(p.points for p in rubric.parts))], [
            "test.py has no literal GROUPS table: its default groups were run"]
    parts, notes = [], []
    for part in rubric.parts:
        present = tuple(g for g in part.groups if g in available)
        missing = [g for g in part.groups if g not in available]
        if missing:
            notes.append(f"test.py has no group {', '.join(missing)}")
        parts.append(Part(present, part.points, part.options if present else ()))
    if not any(p.groups for p in parts):   # none of the rubric's groups exist: run them all
        return [Part((), sum(p.points for p in rubric.parts))], notes + [
            "none of the graded groups exist: its default groups were run"]
    return parts, notes


def _output_tail(text: str, lines: int = 6) -> list[str]:
    return [ln.rstrip() for ln in text.strip().splitlines()[-lines:]]


def classify(run: Run, task: int, data: dict | None, output: str) -> Run:
    """Fill status/reason/details of a finished run from its JSON report and its output."""
    build = next((ln.strip() for ln in output.splitlines()
                  if ln.startswith(f"[task{task}] ") and "extension" in ln and "fail" in ln.lower()),
                 None)
    if data is None:
        found = [m.group(0).strip() for ln in output.splitlines()
                 if (m := _NOT_IMPLEMENTED.search(ln)) and "Traceback" not in ln]
        if found:
            run.status, run.reason = "not implemented", found[-1]
        elif build:
            run.status, run.reason = "build failed", build
        else:
            run.status = "crashed"
            tail = _output_tail(output)
            run.reason = (f"exit code {run.exit_code}: " + (tail[-1] if tail else "no output"))
            run.details = tail
        return run
    run.metrics = {k: float(v) for k, v in (data.get("metrics") or {}).items()
                   if isinstance(v, (int, float))}
    checks = data.get("checks") or []
    # A missed performance target ("target" checks) is reported, but points are for correctness.
    missed = [c for c in checks if not c.get("passed") and c.get("target")]
    failed = [c for c in checks if not c.get("passed") and not c.get("target")]
    run.details = [f"FAIL  {c.get('name', '')}  {c.get('detail', '')}".rstrip() for c in failed[:5]]
    run.details += [f"MISS  {c.get('name', '')}  {c.get('detail', '')}".rstrip() for c in missed[:3]]
    if checks and not failed and (data.get("exit_code", 1) == 0 or missed):
        run.status = "pass"
        return run
    if not checks:
        run.status, run.reason = "fail", "no checks ran"
        return run
    missing = [c for c in failed if _NOT_IMPLEMENTED.search(f"{c.get('name')} {c.get('detail')}")]
    if missing:
        run.status = "not implemented"
        # A check that tried several cases joins their messages with "; ": say each one once.
        pieces = str(missing[0].get('detail') or missing[0].get('name')).split("; ")
        run.reason = "; ".join(dict.fromkeys(pieces))
    elif build and any("did not build" in str(c.get("detail")) for c in failed):
        run.status, run.reason = "build failed", build
    else:
        run.status = "fail"
        run.reason = (f"{len(failed)} of {len(checks)} checks failed; first: "
                      f"{failed[0].get('name')}: {failed[0].get('detail')}")
    return run


def run_test(repo: Path, task: int, groups: tuple[str, ...], timeout: float,
             verbose: bool = False, options: tuple[str, ...] = ()) -> Run:
    """Run `python -m taskN.test` on `repo` in its own process group, with a time limit."""
    run = Run(groups)
    with tempfile.TemporaryDirectory(prefix="grade_") as tmp:
        report = Path(tmp) / "report.json"
        cmd = [sys.executable, "-m", f"task{task}.test", "--no-record", "--json", str(report),
               *[f"--{g}" for g in groups], *options]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            output, _ = proc.communicate(timeout=max(1.0, timeout))
        except (subprocess.TimeoutExpired, KeyboardInterrupt) as err:
            # Kill the whole group: the test may have started a compiler or workers.
            os.killpg(proc.pid, signal.SIGKILL)
            if isinstance(err, KeyboardInterrupt):
                raise
            output, _ = proc.communicate()
            run.seconds = time.perf_counter() - start
            run.status = "timeout"
            run.reason = f"did not finish within {timeout:.0f} s (raise it with --timeout)"
            run.details = _output_tail(output or "")
            return run
        run.seconds = time.perf_counter() - start
        run.exit_code = proc.returncode
        if verbose:
            print(output)
        try:
            data = json.loads(report.read_text())
        except (OSError, ValueError):
            data = None
        return classify(run, task, data, output or "")


def score(rubric: TaskRubric, parts: list[Part], runs: list[Run], notes: list[str]) -> TaskGrade:
    """Points, status and reasons of one task from its runs (one run per part)."""
    grade = TaskGrade(rubric.task, 0.0, rubric.points, "pass", runs=[asdict(r) for r in runs])
    reasons, details = [], list(notes)
    metrics: dict[str, float] = {}
    for part, run in zip(parts, runs, strict=True):
        metrics.update(run.metrics)
        grade.seconds += run.seconds
        if run.status == "pass":
            grade.points += part.points
        else:
            label = ", ".join(part.groups) or "all groups"
            reasons.append(f"[{label}] {run.reason}" if len(parts) > 1 else run.reason)
            details += run.details
    correct = all(r.status == "pass" for r in runs)
    for rule in rubric.speed:
        value = metrics.get(rule.metric)
        earned = 0.0
        if not correct:
            reasons.append(f"{rule.label}: no performance points without correctness")
        elif value is None:
            reasons.append(f"{rule.label}: speedup not measured ({rule.metric} missing)")
        else:
            earned = next((p for threshold, p in rule.tiers if value >= threshold), 0.0)
            if earned < rule.points:
                best = rule.tiers[0][0]
                reasons.append(f"{rule.label}: speedup {value:.2f}x < {best:g}x "
                               f"({earned:g} of {rule.points:g} points)")
        grade.points += earned
    statuses = [r.status for r in runs]
    for worst in ("timeout", "crashed", "build failed"):
        if worst in statuses:
            grade.status = worst
            break
    else:
        failing = [s for s in statuses if s != "pass"]
        if not failing:
            grade.status = "pass"
        elif all(s == "not implemented" for s in failing) and len(failing) == len(statuses):
            grade.status = "not implemented"
        else:
            grade.status = "fail"
    grade.reason = "; ".join(reasons)
    grade.details = details
    grade.metrics = metrics
    grade.speedups = {m.label: m.format(metrics[m.name]) for m in rubric.shown if m.name in metrics}
    return grade


def report_run(path: Path, task: int, part: Part) -> Run | None:
    """A part's result from a report `python -m taskN.test --json FILE` already wrote, if that
    run covered the part's groups. Every check of the report counts (a failure in a group
    the rubric does not grade fails the part too): a report can only cost points."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not set(part.groups) <= set(data.get("groups") or ()):
        return None
    run = classify(Run(part.groups, exit_code=data.get("exit_code")), task, data, "")
    if run.reason:
        run.reason += f" (from {path})"
    return run


def grade_task(repo: Path, rubric: TaskRubric, *, gpu: bool, timeout: float,
               verbose: bool = False, reports: Path | None = None) -> TaskGrade:
    test_py = repo / f"task{rubric.task}" / "test.py"
    if not test_py.exists():
        return TaskGrade(rubric.task, 0.0, rubric.points, "missing",
                         f"task{rubric.task}/test.py not found in {repo}")
    parts, notes = plan_parts(rubric, test_groups(test_py))
    report = reports / f"task{rubric.task}.json" if reports is not None else None
    from_reports = [report_run(report, rubric.task, part) if report else None for part in parts]
    if rubric.needs_gpu and not gpu and None in from_reports:
        why = f" ({rubric.cpu_note})" if rubric.cpu_note else ""
        return TaskGrade(rubric.task, 0.0, rubric.points, "skipped: needs a GPU",
                         f"graded on a GPU only{why}; no CUDA GPU is visible to torch here, "
                         "so grade on a GPU machine")
    runs, deadline = [], time.perf_counter() + timeout
    for part, found in zip(parts, from_reports, strict=True):
        label = ", ".join(part.groups) or "default groups"
        if found is not None:
            print(f"[grade] task {rubric.task} ({label}): from {report}", flush=True)
            runs.append(found)
            continue
        if not part.groups and len(parts) > 1:
            runs.append(Run(part.groups, "fail", "the test has none of this part's groups"))
            continue
        left = deadline - time.perf_counter()
        if left <= 0:
            runs.append(Run(part.groups, "timeout", f"no time left of the {timeout:.0f} s limit"))
            continue
        print(f"[grade] task {rubric.task} ({label}) ...", flush=True)
        runs.append(run_test(repo, rubric.task, part.groups, left, verbose, part.options))
    return score(rubric, parts, runs, notes)


# --- the table -------------------------------------------------------------------------------

def _fmt_points(x: float) -> str:
    return f"{x:g}"


def format_table(grades: list[TaskGrade], width: int = 72) -> str:
    rows = [["task", "points", "status", "speedups", "reason for lost points"]]
    for g in grades:
        reason = g.reason if len(g.reason) <= width else g.reason[:width - 3] + "..."
        rows.append([str(g.task), f"{_fmt_points(g.points)}/{_fmt_points(g.max_points)}", g.status,
                     ", ".join(f"{k} {v}" for k, v in g.speedups.items()) or "-", reason or "-"])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def summarise(grades: list[TaskGrade]) -> dict:
    earned = sum(g.points for g in grades)
    graded = sum(g.max_points for g in grades)
    skipped = [g.task for g in grades if g.status.startswith("skipped")]
    return {"points": earned, "max_points": graded, "course_points": TOTAL_POINTS,
            "skipped_tasks": skipped}


def print_report(grades: list[TaskGrade], repo: Path) -> None:
    total = summarise(grades)
    print(f"\n== grade: {repo} ==")
    print(format_table(grades))
    lost = [g for g in grades if g.points < g.max_points and (g.reason or g.details)]
    if lost:
        print("\nWhy points were lost:")
        for g in lost:
            print(f"  task {g.task} ({g.status}): {g.reason}")
            for line in g.details[:6]:
                print(f"      {line}")
    print(f"\nTotal: {_fmt_points(total['points'])}/{_fmt_points(total['max_points'])} "
          f"for tasks {', '.join(str(g.task) for g in grades)} "
          f"(the course: {_fmt_points(TOTAL_POINTS)} points in all)")
    if total["skipped_tasks"]:
        print(f"Not graded here (no CUDA GPU visible): tasks "
              f"{', '.join(map(str, total['skipped_tasks']))}; they count 0. Grade on a GPU "
              "machine for those points.")


def points_metric(who: str, task: int | None = None) -> str:
    """grade.<who>.points (the total) or grade.<who>.taskN.points, as --record-as records them."""
    return f"grade.{who}.task{task}.points" if task is not None else f"grade.{who}.points"


def record_points(grades: list[TaskGrade], who: str) -> Path | None:
    """Record grade.<who>.taskN.points and grade.<who>.points (summed over every task on file,
    so grading in several runs, e.g. --tasks 1,2,3 then --tasks 4,5,6,7, adds up)."""
    import torch

    from common import results

    if not torch.cuda.is_available():
        print("[grade] --record-as needs a GPU (results are kept per GPU); nothing recorded")
        return None
    path = results.results_path()
    results.record({points_metric(who, g.task): g.points for g in grades}, path=path)
    on_file = results.load(path)["metrics"]
    total = sum(on_file.get(points_metric(who, r.task), 0.0) for r in RUBRIC)
    results.record({points_metric(who): total}, path=path)
    print(f"[grade] recorded grade.{who}.points = {total:g} in {path}")
    return path


def isolated_copy(student: Path, into: Path) -> Path:
    """A fresh copy of this repository with the student's versions of the files they edit."""
    from common.tools import release

    edited = release.find_solution_files(REPO_ROOT)
    if not edited:
        raise SystemExit("[grade] --isolate needs the reference repository (this checkout has "
                         "no solution regions to know which files students edit).")
    for rel in release.list_files(REPO_ROOT, exclude=into):
        (into / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / rel, into / rel)
    for rel in edited:
        if (student / rel).is_file():
            shutil.copy2(student / rel, into / rel)
        else:
            (into / rel).unlink()
    return into


def build_side_by_side(repo: Path, tasks: list[int]) -> None:
    """Build the checkout's extensions for `tasks` at once (common.tools.build_all) before the
    tests run, instead of one after another as each test first asks for its own. A failed
    build is graded by the tests (status "build failed"), so only its output is shown here."""
    if not tasks or not (repo / "common" / "tools" / "build_all.py").exists():
        return
    print(f"[grade] building the extensions of tasks {', '.join(map(str, tasks))} side by side",
          flush=True)
    subprocess.run([sys.executable, "-m", "common.tools.build_all", "--tasks",
                    ",".join(map(str, tasks))], cwd=repo)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m common.tools.grade", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", default=",".join(str(r.task) for r in RUBRIC),
                        help="comma-separated task numbers (default: all)")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help="the checkout to grade")
    parser.add_argument("--json", type=Path, default=None, help="write the grades to this JSON file")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds allowed per task (default 900)")
    parser.add_argument("--record-as", choices=("main", "skeleton"), default=None,
                        help="record grade.<name>.points in results/<gpu>.json (GPU runs)")
    parser.add_argument("--isolate", action="store_true",
                        help="grade the student's edited files inside a copy of this repository")
    parser.add_argument("--reports", type=Path, default=None, metavar="DIR",
                        help="use DIR/taskN.json, written by `python -m taskN.test --json "
                             "DIR/taskN.json`, instead of running a test again when it covers "
                             "the graded groups")
    parser.add_argument("--verbose", action="store_true", help="print each test's output")
    parser.add_argument("--rubric", action="store_true", help="print the rubric table and exit")
    args = parser.parse_args(argv)
    if args.rubric:
        print(rubric_markdown())
        return 0
    try:
        wanted = sorted({int(t) for t in args.tasks.split(",") if t.strip()})
    except ValueError:
        parser.error(f"--tasks takes comma-separated numbers, e.g. 1,3, not {args.tasks!r}")
    rubrics = {r.task: r for r in RUBRIC}
    unknown = [t for t in wanted if t not in rubrics]
    if unknown:
        parser.error(f"no task {unknown[0]}; the tasks are {', '.join(map(str, rubrics))}")
    repo = args.repo.resolve()
    if not repo.is_dir():
        parser.error(f"--repo {repo} is not a folder")

    import torch

    gpu = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if gpu else "cpu (no CUDA GPU visible)"
    print(f"[grade] grading {repo} on {device}")
    with tempfile.TemporaryDirectory(prefix="grade_isolated_") as tmp:
        where = isolated_copy(repo, Path(tmp)) if args.isolate else repo
        if gpu:
            build_side_by_side(where, [t for t in wanted if rubrics[t].needs_gpu])
        grades = [grade_task(where, rubrics[t], gpu=gpu, timeout=args.timeout,
                             verbose=args.verbose, reports=args.reports) for t in wanted]
    print_report(grades, repo)
    if args.json:
        args.json.write_text(json.dumps({"repo": str(repo), "device": device, "gpu": gpu,
                                         "isolated": args.isolate,
                                         "reports": str(args.reports) if args.reports else None,
                                         **summarise(grades),
                                         "tasks": [asdict(g) for g in grades]}, indent=1) + "\n")
        print(f"[grade] wrote {args.json}")
    if args.record_as:
        record_points(grades, args.record_as)
    return 0


if __name__ == "__main__":
    sys.exit(main())
