"""Task 3: FlashAttention-2 in PyTorch (runs on the CPU, and on the GPU when present).

Its groups (the course shapes, tiles and odd lengths) run once per session as
`python -m task3.test --json` (conftest.task3_report); the grader's test reads the same report."""

from task3 import test as task3_test


def test_task3_every_group_passes(task3_report):
    _, report = task3_report
    assert set(report["groups"]) == set(task3_test.GROUPS), report["groups"]
    assert report["checks"], "no checks ran"
    failed = [f"{c['name']}: {c.get('detail', '')}" for c in report["checks"] if not c["passed"]]
    assert not failed and report["exit_code"] == 0, "\n".join(failed)
