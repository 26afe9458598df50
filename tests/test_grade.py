"""The grader (common/tools/grade.py): full marks for the solution, 0 for the skeleton, on the CPU tasks.

The grader is run as an instructor runs it, once per session on each checkout, for tasks 1
and 3 (the tasks a CPU can grade). The scoring rules are checked on made-up test reports, so
task 4's performance tiers and the statuses are covered without a GPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from common.tools import grade, release

REPO_ROOT = grade.REPO_ROOT
HAS_SOLUTION = release.has_solution_regions()
needs_solution = pytest.mark.skipif(
    not HAS_SOLUTION, reason="this is the student repository: grading the solution and its "
    "release needs the reference solution")


def _grade(repo: Path, tasks: str, out: Path, *extra: str) -> dict:
    report = out / f"grade_{repo.name}_{tasks.replace(',', '_')}.json"
    proc = subprocess.run([sys.executable, "-m", "common.tools.grade", "--repo", str(repo), "--tasks",
                           tasks, "--json", str(report), *extra], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, f"the grader failed:\n{proc.stdout}\n{proc.stderr}"
    data = json.loads(report.read_text())
    data["stdout"] = proc.stdout
    return data


def _by_task(data: dict) -> dict[int, dict]:
    return {t["task"]: t for t in data["tasks"]}


@pytest.fixture(scope="session")
def skeleton(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("grade") / "student"
    release.release(out)
    return out


@pytest.fixture(scope="session")
def graded_solution(tmp_path_factory, task3_report) -> dict:
    """Tasks 1 and 3 graded; task 3 from the report its own test wrote (--reports), so its
    course shapes run once per session."""
    return _grade(REPO_ROOT, "1,3", tmp_path_factory.mktemp("grade_solution"), "--reports",
                  str(task3_report[0]))


@pytest.fixture(scope="session")
def graded_skeleton(skeleton, tmp_path_factory) -> dict:
    return _grade(skeleton, "1,3", tmp_path_factory.mktemp("grade_skeleton"))


@needs_solution
def test_the_solution_gets_full_marks_on_tasks_1_and_3(graded_solution):
    tasks = _by_task(graded_solution)
    for n, points in ((1, 2), (3, 3)):
        # The reason and the failing lines, in full, so that a failure here can be diagnosed.
        assert (tasks[n]["points"], tasks[n]["status"]) == (points, "pass"), (
            f"task {n}: {tasks[n]['status']}: {tasks[n]['reason']}\n" + "\n".join(tasks[n]["details"]))
    assert graded_solution["points"] == 5 == graded_solution["max_points"]
    assert "Total: 5/5" in graded_solution["stdout"]


@needs_solution
def test_the_skeleton_gets_zero_with_a_readable_reason(graded_skeleton):
    tasks = _by_task(graded_skeleton)
    for n, function in ((1, "CustomSelfAttention.forward"), (3, "flash_attention_forward")):
        assert tasks[n]["points"] == 0 and tasks[n]["status"] == "not implemented", tasks[n]
        assert f"Task {n}: {function} is not implemented yet" in tasks[n]["reason"]
    assert graded_skeleton["points"] == 0
    assert "Why points were lost:" in graded_skeleton["stdout"]


@needs_solution
@pytest.mark.gpu
@pytest.mark.gpu_turn_inside
@pytest.mark.slow
def test_the_skeleton_fails_every_gpu_task_as_not_implemented(skeleton, tmp_path, gpu_turn):
    """On a GPU the skeleton's tasks 2 and 4-7 build and run, and each fails as "not
    implemented" (not as wrong numbers, a crash or a build error): a student's first run of
    the grader says what to write, task 2's empty kernel bodies included. The builds (minutes
    of nvcc, no GPU work) come first, outside the test's turn at the GPU."""
    grade.build_side_by_side(skeleton, [2, 4, 5, 6, 7])
    with gpu_turn(exclusive=False):
        tasks = _by_task(_grade(skeleton, "2,4,5,6,7", tmp_path))
    for n in (2, 4, 5, 6, 7):
        assert tasks[n]["points"] == 0 and tasks[n]["status"] == "not implemented", tasks[n]
        assert "not implemented" in tasks[n]["reason"], tasks[n]


@needs_solution
def test_isolate_grades_the_students_files_with_our_tests(skeleton, tmp_path):
    """A skeleton whose task1/test.py was edited to pass everything: the plain grade believes
    it, --isolate (our tests, the student's attention.py) does not."""
    tampered = tmp_path / "tampered"
    release.release(tampered)
    (tampered / "task1" / "test.py").write_text(
        "import sys\n\nfrom common.checks import Check\nfrom common.harness import task_main\n\n"
        "GROUPS = {'attention': lambda args=None: ([Check('all good', True)], {})}\n\n"
        "if __name__ == '__main__':\n    sys.exit(task_main('task1', GROUPS))\n")
    assert _by_task(_grade(tampered, "1", tmp_path))[1]["points"] == 2
    isolated = _by_task(_grade(tampered, "1", tmp_path, "--isolate"))[1]
    assert isolated["points"] == 0 and isolated["status"] == "not implemented"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without a GPU")
def test_gpu_tasks_are_skipped_without_a_gpu(tmp_path):
    data = _grade(REPO_ROOT, "2,4,5,6,7", tmp_path)
    for task in data["tasks"]:
        if task["status"] != "missing":
            assert task["status"] == "skipped: needs a GPU" and task["points"] == 0, task
    assert "Not graded here (no CUDA GPU visible)" in data["stdout"]
    assert data["skipped_tasks"]
    # Each says why (its manifest's cpu_note); task 7 runs on a CPU, so it says why not here.
    task7 = _by_task(data)[7]
    assert "CUDA kernels" in task7["reason"] and "task7.test" in task7["reason"]


# --- the rubric and the scoring rules --------------------------------------------------------

def test_rubric_points_match_the_course():
    assert [(r.task, r.points) for r in grade.RUBRIC] == [(1, 2), (2, 3), (3, 3), (4, 4), (5, 4),
                                                          (6, 3), (7, 1)]
    assert grade.TOTAL_POINTS == 20
    for r in grade.RUBRIC:
        assert sum(p.points for p in r.parts) + sum(s.points for s in r.speed) == r.points, r.task


def test_readme_shows_the_graders_rubric():
    readme = (REPO_ROOT / "README.md").read_text()
    assert grade.rubric_markdown() in readme, (
        "README.md (For instructors) must show the rubric exactly as `python -m common.tools.grade "
        "--rubric` prints it")


def _rubric(task: int) -> grade.TaskRubric:
    return {r.task: r for r in grade.RUBRIC}[task]


def _run(status="pass", metrics=None, reason=""):
    return grade.Run((), status=status, reason=reason, metrics=metrics or {})


FAST = {"task4.speedup.noncausal.b64_s4096": 0.75, "task4.speedup.causal.b64_s4096": 0.55,
        "task4.speedup.noncausal.b4_s128": 1.1, "task4.speedup.causal.b4_s128": 1.3}


def test_task4_performance_tiers():
    r = _rubric(4)
    result = grade.score(r, list(r.parts), [_run(metrics=FAST)], [])
    assert result.points == 2 + 1 + 0.5 and result.status == "pass"
    assert "causal (64, 4096): speedup 0.55x < 0.7x (0.5 of 1 points)" in result.reason
    assert result.speedups["c 64x4096"] == "0.55x" and len(result.speedups) == 4
    slow = {**FAST, "task4.speedup.noncausal.b64_s4096": 0.3}
    assert grade.score(r, list(r.parts), [_run(metrics=slow)], []).points == 2 + 0 + 0.5


def test_a_wrong_kernel_earns_no_performance_points():
    r = _rubric(4)
    result = grade.score(r, list(r.parts), [_run("fail", FAST, "1 of 9 checks failed")], [])
    assert result.points == 0 and result.status == "fail"
    assert "no performance points without correctness" in result.reason


def test_task2_parts_score_separately():
    r = _rubric(2)
    runs = [_run(), _run("fail", reason="gemm is wrong"), _run()]
    result = grade.score(r, list(r.parts), runs, [])
    assert result.points == 2 and result.status == "fail" and "[gemm] gemm is wrong" in result.reason
    missing = [_run("not implemented", reason="Task 2: x is not implemented yet")] * 3
    assert grade.score(r, list(r.parts), missing, []).status == "not implemented"


def test_reports_are_classified():
    failing = {"exit_code": 1, "metrics": {}, "checks": [
        {"name": "a", "passed": True, "detail": ""},
        {"name": "b", "passed": False, "detail": "rel_err inf (tol 2e-05)"}]}
    run = grade.classify(grade.Run(()), 1, failing, "")
    assert run.status == "fail" and "b: rel_err inf" in run.reason
    crash = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
             "NotImplementedError: Task 3: flash_attention_forward is not implemented yet; see\n")
    run = grade.classify(grade.Run((), exit_code=1), 3, None, crash)
    assert run.status == "not implemented" and run.reason.startswith("NotImplementedError: Task 3")
    run = grade.classify(grade.Run((), exit_code=1), 3, None, "Traceback\nKeyError: 'x'\n")
    assert run.status == "crashed" and "KeyError: 'x'" in run.reason
    build = "[task2] Building extension 'custom_self_attention' failed (RuntimeError: x); ...\n"
    data = {"exit_code": 1, "checks": [{"name": "softmax", "passed": False,
                                        "detail": "the extension did not build (see above)"}]}
    run = grade.classify(grade.Run(()), 2, data, build)
    assert run.status == "build failed" and "Building extension" in run.reason
    # A check that tried several cases of one missing kernel says it once.
    said = "raised NotImplementedError: Task 5: update_kv_cache is not implemented yet"
    data = {"exit_code": 1, "checks": [{"name": "cache", "passed": False,
                                        "detail": "; ".join([said] * 3 + ["other"])}]}
    run = grade.classify(grade.Run(()), 5, data, "")
    assert run.status == "not implemented" and run.reason == f"{said}; other"


def test_grading_from_reports_needs_no_gpu_and_can_only_cost_points(tmp_path):
    """--reports DIR: a GPU run's `python -m taskN.test --json DIR/taskN.json` is graded as is."""
    checks = [{"name": "course", "passed": True, "detail": ""}]
    report = {"task": "task4", "groups": ["small", "shapes", "course"], "exit_code": 0,
              "metrics": FAST, "texts": {}, "checks": checks}
    (tmp_path / "task4.json").write_text(json.dumps(report))
    result = grade.grade_task(REPO_ROOT, _rubric(4), gpu=False, timeout=60, reports=tmp_path)
    assert (result.points, result.status) == (3.5, "pass"), result
    failing = {**report, "task": "task2", "groups": ["softmax", "gemm", "attention", "small"],
               "exit_code": 1, "checks": checks + [{"name": "tiny", "passed": False, "detail": "x"}]}
    (tmp_path / "task2.json").write_text(json.dumps(failing))
    result = grade.grade_task(REPO_ROOT, _rubric(2), gpu=False, timeout=60, reports=tmp_path)
    assert (result.points, result.status) == (0, "fail") and "tiny: x" in result.reason
    partial = {**report, "groups": ["small"]}       # does not cover the graded groups
    (tmp_path / "task4.json").write_text(json.dumps(partial))
    result = grade.grade_task(REPO_ROOT, _rubric(4), gpu=False, timeout=60, reports=tmp_path)
    assert result.status == "skipped: needs a GPU"


def test_a_hanging_test_times_out(tmp_path):
    (tmp_path / "task1").mkdir()
    (tmp_path / "task1" / "__init__.py").write_text("")
    (tmp_path / "task1" / "test.py").write_text("import time\ntime.sleep(60)\n")
    run = grade.run_test(tmp_path, 1, (), timeout=2)
    assert run.status == "timeout" and run.seconds < 30


def test_groups_are_read_without_importing_the_test():
    assert grade.test_groups(REPO_ROOT / "task1" / "test.py") == ["attention"]
    assert grade.test_groups(REPO_ROOT / "task3" / "test.py") == ["module", "tiles"]
    parts, notes = grade.plan_parts(_rubric(4), ["course", "kernel"])
    assert parts[0].groups == ("course",) and "no group shapes" in notes[0]
    parts, notes = grade.plan_parts(_rubric(7), ["cpu"])
    assert parts[0].groups == () and "default groups" in notes[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU message")
def test_record_as_needs_a_gpu(capsys):
    assert grade.record_points([], "main") is None
    assert "needs a GPU" in capsys.readouterr().out


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU message")
def test_a_gpu_task_report_written_without_a_gpu_reads_as_its_sentence(tmp_path):
    """`python -m task4.test --json` on a CPU writes one failed check; --reports reads it."""
    from task4 import test as task4_test

    report = tmp_path / "task4.json"
    assert task4_test.main(["--course", "--no-record", "--json", str(report)]) == 1
    run = grade.report_run(report, 4, grade.Part(("course",), 4))
    assert run.status == "fail" and "needs an NVIDIA GPU" in run.reason, run
