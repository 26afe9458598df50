"""common.tools.run_all without a GPU: it says what it runs, runs only that, says what it
skipped and why, and exits 0 when all it ran passed (the steps themselves are stubbed)."""

from __future__ import annotations

import pytest
import torch

from common.tools import run_all


def test_a_cpu_plan_is_tasks_1_and_3_and_the_compile_check():
    plan, skipped = run_all.steps([1, 2, 3, 4, 5, 6, 7], bench=True, gpu=False, nvcc=True)
    assert [name for name, _ in plan] == ["task1.test", "task3.test", "common.tools.compile_check"]
    reasons = dict(skipped)
    assert set(reasons) >= {"task2", "task4", "task5", "task6", "task7", "common.tools.bench"}
    assert "CUDA kernels" in reasons["task7"] and "needs a CUDA GPU" in reasons["task2"]
    plan, skipped = run_all.steps([1, 3], bench=False, gpu=False, nvcc=False)
    assert [name for name, _ in plan] == ["task1.test", "task3.test"]
    assert "nvcc is not installed" in dict(skipped)["common.tools.compile_check"]


def test_a_gpu_plan_runs_everything():
    plan, skipped = run_all.steps([1, 2, 3, 4, 5, 6, 7], bench=True, gpu=True)
    names = [name for name, _ in plan]
    assert not skipped and names[-1] == "common.tools.report" and "common.tools.bench" in names
    assert {"task2.compile", "task4.test", "task7.inference"} <= set(names)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks what happens without a GPU")
@pytest.mark.parametrize("codes, exit_code", [((0, 0, 0), 0), ((0, 1, 0), 1)])
def test_without_a_gpu_it_says_so_first_and_exits_by_what_it_ran(monkeypatch, capsys, codes, exit_code):
    ran = []
    monkeypatch.setattr(run_all.subprocess, "call",
                        lambda cmd, cwd=None: ran.append(cmd[2]) or codes[len(ran) - 1])
    assert run_all.main(["--no-bench"]) == exit_code
    out = capsys.readouterr().out
    assert out.startswith("[run_all] No CUDA GPU is visible")
    assert ran[:2] == ["task1.test", "task3.test"] and len(ran) <= 3
    assert "skip  task4" in out and "needs a CUDA GPU" in out
