"""common.tools.run_all: its plans on a GPU and a CPU; without a GPU it says what it runs, runs
only that, says what it skipped and why, and exits 0 when all it ran passed; a missed
performance target fails no step (the steps themselves are stubbed)."""

from __future__ import annotations

import json

import pytest
import torch

from common.tools import run_all


def test_a_cpu_plan_is_tasks_1_and_3_and_the_compile_check():
    plan, skipped = run_all.steps([1, 2, 3, 4, 5, 6, 7], bench=True, gpu=False, nvcc=True)
    assert [s.name for s in plan] == ["task1.test", "task3.test", "common.tools.compile_check"]
    reasons = dict(skipped)
    assert set(reasons) >= {"task2", "task4", "task5", "task6", "task7", "common.tools.bench"}
    assert "CUDA kernels" in reasons["task7"] and "needs a CUDA GPU" in reasons["task2"]
    plan, skipped = run_all.steps([1, 3], bench=False, gpu=False, nvcc=False)
    assert [s.name for s in plan] == ["task1.test", "task3.test"]
    assert "nvcc is not installed" in dict(skipped)["common.tools.compile_check"]


def test_a_gpu_plan_builds_side_by_side_first_and_benches_only_with_everything():
    plan, skipped = run_all.steps([1, 2, 3, 4, 5, 6, 7], bench=False, gpu=True)
    names = [s.name for s in plan]
    assert not skipped and names[0] == "build" and names[-1] == "common.tools.report"
    assert plan[0].module_args[:1] == ["common.tools.build_all"]
    assert not any(name.endswith(".compile") for name in names)   # the build step does them
    assert {"task4.test", "task7.inference"} <= set(names) and "common.tools.bench" not in names
    assert all(s.report is not None and "--json" in s.module_args
               for s in plan if s.name.endswith(".test"))
    # The main job leaves task 4's backward benchmarks to --everything (pytest runs them too).
    task4 = next(s for s in plan if s.name == "task4.test")
    assert task4.module_args[-2:] == ["--skip", "backward-bench,backward-half-bench"]
    task6 = next(s for s in plan if s.name == "task6.test")
    assert task6.module_args[-2:] == ["--skip", "gqa-course"]
    plan, _ = run_all.steps([1, 2, 3, 4, 5, 6, 7], bench=True, gpu=True)
    assert [s.name for s in plan][-2:] == ["common.tools.bench", "common.tools.report"]
    assert "--skip" not in next(s for s in plan if s.name == "task4.test").module_args


def test_skip_leaves_groups_out_of_a_run_of_every_group(capsys):
    """`--skip a,b` runs every group but those; a named group runs whatever --skip says; an
    unknown name is an argparse error naming the task's groups."""
    import pytest

    from common.harness import task_main

    ran = []
    groups = {name: (lambda args, name=name: ran.append(name) or ([], {})) for name in "abc"}
    task_main("taskX", groups, ["--skip", "b", "--no-record", "--device", "cpu"])
    assert ran == ["a", "c"]
    ran.clear()
    task_main("taskX", groups, ["--b", "--skip", "b", "--no-record", "--device", "cpu"])
    assert ran == ["b"]
    with pytest.raises(SystemExit):
        task_main("taskX", groups, ["--skip", "z", "--device", "cpu"])
    assert "does not have: z" in capsys.readouterr().err


def test_a_missed_target_is_counted_but_fails_no_step(tmp_path):
    report = tmp_path / "task4.json"
    report.write_text(json.dumps({"exit_code": 0, "checks": [
        {"name": "a", "passed": True, "target": False},
        {"name": "speed", "passed": False, "target": True},
        {"name": "speed2", "passed": False, "target": True}]}))
    assert run_all.missed_targets(report) == 2
    assert run_all.missed_targets(tmp_path / "absent.json") == 0
    lines = run_all.summary_lines([("task4.test", 0, 12.0, 2), ("task5.test", 1, 3.0, 0)], [], 15.0)
    assert lines[0].startswith("  ok    task4.test") and "2 targets missed" in lines[0]
    assert lines[1].startswith("  FAIL  task5.test")
    assert lines[-1] == "  1/2 steps ok in 15.0 s; 1 failed"


def test_a_failed_step_names_its_failed_checks_not_only_its_misses(tmp_path):
    report = tmp_path / "task4.json"
    report.write_text(json.dumps({"exit_code": 1, "checks": [
        {"name": "a", "passed": True, "target": False},
        {"name": "backward B2 bf16", "passed": False, "target": False},
        {"name": "speed", "passed": False, "target": True}]}))
    assert run_all.failed_checks(report) == ["backward B2 bf16"]
    assert run_all.failed_checks(tmp_path / "absent.json") == []
    lines = run_all.summary_lines([("task4.test", 1, 12.0, 1), ("task5.test", 0, 3.0, 0)], [], 15.0,
                                  failures={"task4.test": run_all.failed_checks(report)})
    assert lines[0].startswith("  FAIL  task4.test")
    assert "1 check failed; 1 target missed (MISS)" in lines[0]
    assert lines[1] == "          failed: backward B2 bf16"
    assert lines[2].startswith("  ok    task5.test")


def test_report_exits_0_on_a_missed_target_and_1_on_a_failed_check(capsys):
    from common.checks import Check, report

    assert report("t", [Check("right", True), Check("fast", False, target=True)]) == 0
    out = capsys.readouterr().out
    assert "MISS  fast" in out and "1 target missed" in out
    assert report("t", [Check("wrong", False), Check("fast", False, target=True)]) == 1
    assert report("t", []) == 1


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without a GPU")
@pytest.mark.parametrize("codes, exit_code", [((0, 0, 0), 0), ((0, 1, 0), 1)])
def test_without_a_gpu_it_says_so_first_and_exits_by_what_it_ran(monkeypatch, capsys, tmp_path,
                                                                   codes, exit_code):
    ran = []
    monkeypatch.setattr(run_all.subprocess, "call",
                        lambda cmd, cwd=None: ran.append(cmd[2]) or codes[len(ran) - 1])
    monkeypatch.setattr(run_all, "REPORTS_DIR", tmp_path)
    assert run_all.main([]) == exit_code
    out = capsys.readouterr().out
    assert out.startswith("[run_all] No CUDA GPU is visible")
    assert ran[:2] == ["task1.test", "task3.test"] and len(ran) <= 3
    assert "skip  task4" in out and "needs a CUDA GPU" in out


def test_on_a_gpu_the_tasks_that_need_no_extension_run_beside_the_build(monkeypatch, capsys,
                                                                         tmp_path):
    """Tasks 1 and 3 (no extension, no timing) run while the build compiles, their output
    printed after the build's; the summary keeps the plan's order and their exit codes."""
    import subprocess
    import threading

    plan, _ = run_all.steps([1, 2, 3], bench=False, gpu=True)
    assert [s.name for s in plan if s.beside_build] == ["task1.test", "task3.test"]
    build_started, build_may_end = threading.Event(), threading.Event()
    live = []

    def call(cmd, cwd=None):   # the live steps: the build waits until task 3 has run beside it
        live.append(cmd[2])
        if cmd[2] == "common.tools.build_all":
            build_started.set()
            assert build_may_end.wait(10), "the steps beside the build did not run meanwhile"
        return 0

    def run(cmd, cwd=None, **kwargs):
        assert build_started.wait(10)
        if cmd[2] == "task3.test":
            build_may_end.set()
        return subprocess.CompletedProcess(cmd, 1 if cmd[2] == "task3.test" else 0,
                                           stdout=f"output of {cmd[2]}\n")

    monkeypatch.setattr(run_all, "_gpu", lambda: True)
    monkeypatch.setattr(run_all, "REPORTS_DIR", tmp_path)
    monkeypatch.setattr(run_all.subprocess, "call", call)
    monkeypatch.setattr(run_all.subprocess, "run", run)
    assert run_all.main(["--tasks", "1,2,3", "--no-record"]) == 1
    out = capsys.readouterr().out
    assert live == ["common.tools.build_all", "task2.test", "common.tools.report"]
    assert out.index("######## build") < out.index("task1.test (ran beside the build)") \
        < out.index("output of task1.test") < out.index("######## task2.test")
    summary = out[out.index("######## summary"):].splitlines()[1:5]
    assert [line.split()[1] for line in summary] == ["build", "task1.test", "task2.test",
                                                     "task3.test"]
    assert summary[3].startswith("  FAIL  task3.test")
    assert [line.endswith("(beside the build)") for line in summary] == [False, True, False, True]


def test_build_all_nices_the_short_builds_beside_the_long_ones(monkeypatch):
    """The builds whose longest source sets the build's length keep the CPU's priority; the
    others run niced beside them (and not niced when they build alone)."""
    from common.tools import build_all

    niced = {}

    def fake(module, niced_flag=False):
        niced[module] = niced_flag
        return module, 0, 0.0, "built"

    monkeypatch.setattr(build_all, "_build", fake)
    assert build_all.build_all(["task2.compile", "task4.compile", "task5.compile", "task4.hopper"],
                               quiet=True) == 0
    assert niced == {"task2.compile": True, "task4.compile": True, "task5.compile": False,
                     "task4.hopper": False}
    assert set(build_all.LONG_BUILDS) <= {*build_all.build_modules(hopper=True)}
    niced.clear()
    build_all.build_all(["task2.compile"], quiet=True)
    assert niced == {"task2.compile": False}
    # niced through the `nice` command (no preexec_fn: the builds start from threads)
    import shutil
    import sys

    plain = [sys.executable, "-m", "task2.compile"]
    assert build_all.build_command("task2.compile") == plain
    if shutil.which("nice"):
        assert build_all.build_command("task2.compile", niced=True) == \
            [shutil.which("nice"), "-n", str(build_all.LOW_PRIORITY), *plain]
